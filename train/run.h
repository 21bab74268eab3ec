// The run directory the ertrain commands write: run.json (resolved configuration, version, seed,
// data, counts) and, for the commands that take steps, metrics.jsonl (one JSON object per step).
#ifndef TRAIN_RUN_H
#define TRAIN_RUN_H

#include <stdio.h>

#include <cjson/cJSON.h>

#include "infer/erinfer.h"

#define ERTRAIN_VERSION ER_VERSION_STRING // one version for the runtime and the training tier

// What a command does with its output dir: start a run (and say --resume continues one), continue
// one (--resume), or write it once (ertrain quantize and merge, which have no --resume).
typedef enum { RUN_NEW, RUN_RESUME, RUN_ONCE } RunMode;

// Checks an output dir before any work (dir_output_check: a link to nothing or a file in the way is
// refused). RUN_ONCE needs it absent or empty. A dir with a checkpoint (checkpoint/state.json) is
// continued with RUN_RESUME and refused otherwise. A dir holding nothing but what a run stopped before its
// first checkpoint leaves (run.json, metrics.jsonl, checkpoint/ without state.json, temporary files) is
// cleared and the run starts afresh, with or without --resume, saying so in one line on log; so does
// RUN_RESUME on an absent or empty dir. Anything else in the dir (a finished output, other files) is refused.
// The caller resumes exactly when checkpoint_exists(dir/checkpoint) after this.
int run_dir_check(const char *dir, RunMode mode, FILE *log);

// A run's final outputs (its model or adapter files), written by save(ctx, stage) into a staging dir
// inside out_dir and moved into out_dir once all are written: a failed save() leaves none of them, so the
// dir never holds half a model next to its run files (a rename failing mid-move could, and is reported).
int run_write_outputs(const char *out_dir, int (*save)(void *ctx, const char *dir), void *ctx);

// Writes dir/run.json atomically.
int run_write_json(const char *dir, const cJSON *run);

// Adds j[key] = path resolved to an absolute path (path_resolve): the configuration a resumed run
// is checked against then names the same files however the path was spelled.
void run_add_path(cJSON *j, const char *key, const char *path);

// Input data files are fingerprinted (file_fingerprint: the byte count and FNV-1a 64 over every byte) into
// the run's configuration under "<key>_fingerprint" beside "<key>" (its resolved path), so a resume notices
// a file changed at the same path. 1 when key names such a fingerprint.
int run_is_fingerprint_key(const char *key);
// ER_OK when the saved fingerprint equals now's (both `key_fingerprint` items of the configs); else one
// line naming the file (now's "<key>" entry) and the checkpoint.
int run_check_fingerprint(const cJSON *saved, const cJSON *item, const cJSON *now, const char *ckpt_dir);

// Adds j[key] = value for each entry, in order (run.json and metrics lines read as tables).
typedef struct {
    const char *key;
    double value;
} RunNumber;
void run_add_numbers(cJSON *j, const RunNumber *n, size_t count);

// The dir a tokenizer path names: the path itself when it is a dir, else the dir of the file (a
// tokenizer.json) in it; "." for a bare file name.
void run_tokenizer_dir(const char *path, char *dir, size_t cap);

typedef struct {
    FILE *fp;
    char *path;
} MetricsLog;

// Opens dir/name (metrics.jsonl, or another per-step log such as completions.jsonl). A resumed run keeps the lines of steps <= keep_step (those a run killed
// after its checkpoint wrote past it are dropped, so the file reads as if never interrupted), less an
// end-of-run line ("stage": "eval") at keep_step, which a finished run writes after its last checkpoint and
// its resume writes again; a new run starts it empty.
int metrics_open(MetricsLog *ml, const char *dir, const char *name, int resume, long keep_step);
// Appends `line` (one JSON object, printed unformatted) and flushes.
int metrics_write(MetricsLog *ml, const cJSON *line);
void metrics_close(MetricsLog *ml);

// Copies tokenizer.json, tokenizer_config.json and generation_config.json found at `src` (a dir, or a
// tokenizer.json whose dir is used) into `dst`; tokenizer.json is required.
int run_copy_tokenizer(const char *src, const char *dst);

#endif
