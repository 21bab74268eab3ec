// Whole-file reads, atomic writes (temporary file, fsync, rename: a crash never leaves a
// half-written output) and directory helpers.
#ifndef CORE_FILEIO_H
#define CORE_FILEIO_H

#include <stddef.h>
#include <stdio.h>

// Reads the whole file into a NUL-terminated buffer (free with er_free). Files larger than
// max_bytes are refused.
int file_read_all(const char *path, size_t max_bytes, char **out, size_t *out_len);

// Where an output goes, by what is at its path (lstat; a symbolic link counts as what it points to):
//   absent or a regular file   written to <path>.tmp.<pid>, fsynced and renamed over it (atomic); a link's
//                              target is replaced, the link kept
//   "-"                        standard output (file descriptor 1, through a stream of its own: a caller that
//                              also prints to stdout flushes it first)
//   a fifo or a char device    written in place (/dev/null, a pipe read by another program)
//   anything else              refused: a directory, a socket, a block device, a link to nothing
// so an output never renames over a device node or a directory, and never replaces a link by a file.
typedef struct {
    FILE *fp;        // write through this
    char *path;      // the path as given ("stdout" for "-"), for messages
    char *target;    // the file renamed over at commit (a link's target); NULL when written in place
    char *tmp_path;  // <target>.tmp.<pid>; NULL when written in place
} AtomicFile;

// ER_OK when atomic_open(path) would be allowed (the checks of the table above, and a writable
// directory for a new file), without creating anything: commands check their outputs before any work.
int file_output_check(const char *path);
// ER_OK when an output dir could be made at path: absent with a directory as its nearest existing
// ancestor, a directory, or a link to one; a link to nothing or a file in the way is refused.
int dir_output_check(const char *path);
// An output that is the same file as an input (st_dev and st_ino, through any spelling or link) is
// refused before any work: it would be overwritten while (or before) it is read. With `in` a directory
// (a model or adapter dir) the output may not be one of its *.json or *.safetensors files. "-" and NULL
// (stdin / stdout, or no such flag) never collide. `flag` names the input's flag in the message.
int file_output_not_input(const char *out, const char *in, const char *flag);
// The same for an output dir: it may not be an input (file or dir), nor hold one below it.
int dir_output_not_input(const char *out_dir, const char *in, const char *flag);
// 1 when both paths exist and are the same file (st_dev, st_ino after following links).
int path_same_file(const char *a, const char *b);

int atomic_open(AtomicFile *af, const char *path);
int atomic_commit(AtomicFile *af); // flush, fsync, rename (in place: flush); closes in all cases
void atomic_abort(AtomicFile *af); // close and remove the temporary file (in place: what was written stays)
int file_write_atomic(const char *path, const void *data, size_t len);

// A whole output dir written at once: its files go into a staging dir <dir>.tmp-<pid> beside it (a
// link's target), which dir_stage_commit renames onto dir (absent or empty), so a run that fails or is
// killed leaves no half-written dir behind. dir_stage_abort removes the staging dir and all in it.
int dir_stage_open(const char *dir, char **stage);
int dir_stage_commit(char *stage, const char *dir); // frees stage in all cases
void dir_stage_abort(char *stage);                  // frees stage; NULL is a no-op
// Moves every entry of stage into dir (made when missing; an entry of the same name is replaced), then
// removes stage: the final outputs of a run dir appear together once all are written. Frees stage.
int dir_stage_move_into(char *stage, const char *dir);
// Removes path and, for a directory, everything below it (no links followed). ER_OK when absent.
int path_remove_tree(const char *path);

int dir_make(const char *path); // mkdir -p
int path_is_dir(const char *path);
int path_exists(const char *path);
// FNV-1a 64 over the file's bytes, as "<bytes>:<16 hex digits>" into out (40 chars at least): a file
// changed at the same path reads differently (the whole file is read: one pass, about 1 GB/s).
int file_fingerprint(const char *path, char *out, size_t out_n);
// dir + "/" + name into a new string (free with er_free); NULL on ENOMEM. Slashes at the end of dir and at
// the start of name are not doubled ("runs/" + "x" is "runs/x").
char *path_join(const char *dir, const char *name);
// strlen(dir) less the slashes at its end: messages print dir/name as "%.*s/name", path_dir_len(dir), dir,
// so "runs/" + "x" reads "runs/x", not "runs//x".
int path_dir_len(const char *dir);
// The absolute path with symlinks resolved (realpath), or a copy of path when it does not resolve
// (free with er_free); NULL on ENOMEM. Two spellings of one file ("../m", "m", "/abs/m") agree.
char *path_resolve(const char *path);

#endif
