// Shared by the tests in tests/train/: path joining that fails the test instead of returning NULL, and
// the one-line error contract of library calls.
#ifndef TESTS_TRAIN_HELPERS_H
#define TESTS_TRAIN_HELPERS_H

#include <criterion/criterion.h>
#include <string.h>

#include "core/error.h"
#include "core/fileio.h"

static inline char *join(const char *dir, const char *name) {
    char *p = path_join(dir, name);
    cr_assert(p);
    return p;
}

// The last error is one line mentioning must_contain.
static inline void assert_one_line_error(const char *must_contain) {
    const char *e = er_last_error();
    cr_assert(e && e[0], "no error message recorded");
    cr_assert_null(strchr(e, '\n'), "error is not one line: %s", e);
    cr_assert(strstr(e, must_contain), "error \"%s\" does not mention \"%s\"", e, must_contain);
}

#endif
