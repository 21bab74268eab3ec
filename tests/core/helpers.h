// Shared by the tests in tests/core/.
#ifndef TESTS_CORE_HELPERS_H
#define TESTS_CORE_HELPERS_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <string.h>

// Entries of dir besides "." and "..": what a failed atomic write must not leave behind.
static inline int dir_entries(const char *dir) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

#endif
