// Helpers shared by the libFuzzer targets in this folder: a per-process scratch dir (tmpfs when
// there is one, removed at exit), writing the input or a part of it there as a named file, and
// splitting one input into several files at a fixed separator. Header-only so that every target
// stays one .c file that links against nothing but the library.
#ifndef TESTS_FUZZ_FUZZ_COMMON_H
#define TESTS_FUZZ_FUZZ_COMMON_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE // memmem, nftw
#endif
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

// Separates the files packed into one input ("a.json" FUZZ_SEP "b.safetensors" ...): 8 bytes that
// neither JSON nor a safetensors header of the seeds contain, and that the dictionaries name so
// mutations can insert it.
#define FUZZ_SEP "\n--ST--\n"
#define FUZZ_SEP_LEN 8

static char fuzz_root[256];

static inline int fuzz_rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    remove(path); // best effort: keep walking
    return 0;
}

static inline void fuzz_root_remove(void) {
    if (fuzz_root[0])
        nftw(fuzz_root, fuzz_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

// Scratch dirs of processes that died without running atexit (a crash, or the many crashing children
// of -minimize_crash) would pile up in /dev/shm: remove those of this target whose pid is gone.
static inline void fuzz_remove_stale(const char *base, const char *name) {
    char prefix[128];
    int np = snprintf(prefix, sizeof prefix, "erfuzz-%s-", name);
    DIR *d = opendir(base);
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, (size_t)np) != 0)
            continue;
        char *end;
        long pid = strtol(e->d_name + np, &end, 10);
        if (pid <= 0 || *end != '-')
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) // alive (or not ours to judge)
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", base, e->d_name);
        nftw(path, fuzz_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    }
    closedir(d);
}

// Creates /dev/shm/erfuzz-<name>-<pid>-XXXXXX (or under $TMPDIR / /tmp without /dev/shm) once per
// process. A fuzzing process must not share its files with another one, hence mkdtemp.
static inline const char *fuzz_root_dir(const char *name) {
    if (fuzz_root[0])
        return fuzz_root;
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    fuzz_remove_stale(base, name);
    snprintf(fuzz_root, sizeof fuzz_root, "%s/erfuzz-%s-%ld-XXXXXX", base, name, (long)getpid());
    if (!mkdtemp(fuzz_root)) {
        perror("fuzz: mkdtemp");
        abort();
    }
    atexit(fuzz_root_remove);
    return fuzz_root;
}

// fuzz_root/rel in a caller buffer of FUZZ_PATH_MAX bytes.
#define FUZZ_PATH_MAX 512
static inline char *fuzz_path(char *buf, const char *rel) {
    snprintf(buf, FUZZ_PATH_MAX, "%s/%s", fuzz_root, rel);
    return buf;
}

static inline void fuzz_mkdir(const char *rel) {
    char p[FUZZ_PATH_MAX];
    if (mkdir(fuzz_path(p, rel), 0700) < 0 && access(p, F_OK) != 0) {
        perror("fuzz: mkdir");
        abort();
    }
}

// Writes n bytes to fuzz_root/rel, replacing what the previous input left there. The harness aborts
// on an I/O error: a full tmpfs must not look like a parser refusing the input.
static inline void fuzz_write(const char *rel, const void *data, size_t n) {
    char p[FUZZ_PATH_MAX];
    FILE *f = fopen(fuzz_path(p, rel), "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
        perror("fuzz: write");
        abort();
    }
}

static inline void fuzz_unlink(const char *rel) {
    char p[FUZZ_PATH_MAX];
    unlink(fuzz_path(p, rel));
}

// Cuts data at the first `max_parts - 1` separators: part k is parts[k], lens[k]. Returns the number of
// parts found (1 when there is no separator); parts beyond that are NULL with length 0.
static inline int fuzz_split(const uint8_t *data, size_t size, const uint8_t **parts, size_t *lens, int max_parts) {
    int n = 0;
    const uint8_t *p = data, *end = data + size;
    for (int k = 0; k < max_parts; k++)
        parts[k] = NULL, lens[k] = 0;
    while (n < max_parts - 1) {
        const uint8_t *s = memmem(p, (size_t)(end - p), FUZZ_SEP, FUZZ_SEP_LEN);
        if (!s)
            break;
        parts[n] = p;
        lens[n++] = (size_t)(s - p);
        p = s + FUZZ_SEP_LEN;
    }
    parts[n] = p;
    lens[n++] = (size_t)(end - p);
    return n;
}

// fuzz_split into n parts, part k written to fuzz_root/names[k]; the files of the parts the input lacks
// are removed, so files of the previous input do not leak into this one. Returns the number of parts found.
static inline int fuzz_write_parts(const uint8_t *data, size_t size, const char *const *names, int n,
                                   const uint8_t **parts, size_t *lens) {
    int found = fuzz_split(data, size, parts, lens, n);
    for (int k = 0; k < n; k++)
        if (k < found)
            fuzz_write(names[k], parts[k], lens[k]);
        else
            fuzz_unlink(names[k]);
    return found;
}

// A NUL-terminated copy (inputs are not NUL-terminated); free with free().
static inline char *fuzz_strndup(const uint8_t *data, size_t n) {
    char *s = malloc(n + 1);
    if (!s)
        abort();
    if (n)
        memcpy(s, data, n);
    s[n] = 0;
    return s;
}

// FUZZ_VERBOSE=1 prints why each input was refused: the way to check that seeds reach deep code.
static inline int fuzz_verbose(void) {
    static int v = -1;
    if (v < 0)
        v = getenv("FUZZ_VERBOSE") && getenv("FUZZ_VERBOSE")[0] == '1';
    return v;
}

// An input the library refused: says why under FUZZ_VERBOSE=1 ("<what>: <error>"). Returns 0, the
// fuzz target's return for an input it is done with.
static inline int fuzz_refused(const char *what) {
    if (fuzz_verbose())
        fprintf(stderr, "%s: %s\n", what, er_last_error());
    return 0;
}

// A property the library promises did not hold: print and abort so libFuzzer keeps the input.
#define FUZZ_CHECK(cond, ...)                                                  \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "fuzz check failed at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                      \
            fputc('\n', stderr);                                               \
            abort();                                                           \
        }                                                                      \
    } while (0)

// Saving what was just loaded may fail only for want of memory or disk; what names the save.
static inline void fuzz_check_save_failure(const char *what) {
    FUZZ_CHECK(er_last_status() == ER_ENOMEM || er_last_status() == ER_EIO, "%s: %s", what, er_last_error());
}

#endif
