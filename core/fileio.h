// Whole-file reads, atomic writes (temporary file, fsync, rename: a crash never leaves a
// half-written output) and directory helpers.
#ifndef CORE_FILEIO_H
#define CORE_FILEIO_H

#include <stddef.h>
#include <stdio.h>

// Reads the whole file into a NUL-terminated buffer (free with er_free). Files larger than
// max_bytes are refused.
int file_read_all(const char *path, size_t max_bytes, char **out, size_t *out_len);

typedef struct {
    FILE *fp;        // write through this
    char *path;      // final path
    char *tmp_path;  // <path>.tmp.<pid>
} AtomicFile;

int atomic_open(AtomicFile *af, const char *path);
int atomic_commit(AtomicFile *af); // flush, fsync, rename; closes in all cases
void atomic_abort(AtomicFile *af); // close and remove the temporary file
int file_write_atomic(const char *path, const void *data, size_t len);

int dir_make(const char *path); // mkdir -p
int path_is_dir(const char *path);
int path_exists(const char *path);
// dir + "/" + name into a new string (free with er_free); NULL on ENOMEM.
char *path_join(const char *dir, const char *name);
// The absolute path with symlinks resolved (realpath), or a copy of path when it does not resolve
// (free with er_free); NULL on ENOMEM. Two spellings of one file ("../m", "m", "/abs/m") agree.
char *path_resolve(const char *path);

#endif
