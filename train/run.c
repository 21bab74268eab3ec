#include "train/run.h"

#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/gguf.h"
#include "core/json.h"
#include "data/tokenizer.h"
#include "train/dist.h"

static int dir_is_empty(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    struct dirent *e;
    int empty = 1;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            empty = 0;
            break;
        }
    closedir(d);
    return empty;
}

// The entries a run writes before its first checkpoint (and the temporary files of a write cut short): a
// dir holding nothing else and no checkpoint is a run stopped before that checkpoint, and starts afresh.
static int is_stopped_run_entry(const char *name) {
    return strcmp(name, "run.json") == 0 || strcmp(name, "metrics.jsonl") == 0 || strcmp(name, "checkpoint") == 0 ||
           strcmp(name, "completions.jsonl") == 0 || strcmp(name, "best") == 0 ||
           strstr(name, ".tmp.") || strstr(name, ".tmp-");
}

// The first entry of dir that a stopped run does not leave (copied into other), or "" when there is none.
static void first_foreign_entry(const char *dir, char *other, size_t cap) {
    other[0] = 0;
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 && !is_stopped_run_entry(e->d_name)) {
            snprintf(other, cap, "%s", e->d_name);
            break;
        }
    closedir(d);
}

static int has_checkpoint(const char *dir) {
    char *ck = path_join(dir, "checkpoint/state.json");
    int ok = ck && path_exists(ck);
    er_free(ck);
    return ok;
}

// What run_dir_check found: go on, or clear a stopped run's files first (and say so).
typedef enum { DIR_GO, DIR_CLEAR } DirAction;

static int run_dir_check_here(const char *dir, RunMode mode, DirAction *action) {
    *action = DIR_GO;
    ER_TRY(dir_output_check(dir)); // a link to nothing, a file in the way, a dir that cannot be made
    if (!path_is_dir(dir) || dir_is_empty(dir))
        return ER_OK;
    int ck = has_checkpoint(dir);
    if (mode == RUN_RESUME && ck)
        return ER_OK;
    if (mode == RUN_ONCE)
        return er_error(ER_EINVAL, "%s already exists and is not empty: choose another --out (or remove it)", dir);
    if (ck)
        return er_error(ER_EINVAL, "%s already exists and is not empty: it holds a run with a checkpoint; pass "
                        "--resume to continue that run, or choose another --out", dir);
    char other[256];
    first_foreign_entry(dir, other, sizeof other);
    if (other[0])
        return er_error(ER_EINVAL, "%s already exists and is not empty (%s is not a file a stopped run leaves)%s: "
                        "choose another --out (or remove it)", dir, other,
                        mode == RUN_RESUME ? " and it holds no checkpoint to resume" : "");
    *action = DIR_CLEAR;
    return ER_OK;
}

// Removes a stopped run's entries (is_stopped_run_entry: all there is in dir) for the new run.
static int clear_stopped_run(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return er_error(ER_EIO, "%s: cannot read: %s", dir, strerror(errno));
    struct dirent *e;
    int rc = ER_OK;
    while (rc == ER_OK && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 || !is_stopped_run_entry(e->d_name))
            continue;
        char *p = path_join(dir, e->d_name);
        rc = p ? path_remove_tree(p) : ER_ENOMEM;
        er_free(p);
    }
    closedir(d);
    return rc;
}

// Under mpirun every rank checks before any goes on (rank 0 makes the dir once its inputs load, and a
// slower rank would then find it); rank 0 alone clears a stopped run's files, once every rank has looked.
int run_dir_check(const char *dir, RunMode mode, FILE *log) {
    DirAction action;
    int rc = run_dir_check_here(dir, mode, &action);
    double failed = rc < 0;
    ER_TRY(dist_sum_doubles(&failed, 1));
    if (rc == ER_OK && failed > 0)
        return er_error(ER_EINVAL, "%s: another rank refused this run dir (see its line)", dir);
    ER_TRY(rc);
    int no_dir = !path_is_dir(dir), empty = !no_dir && dir_is_empty(dir);
    if (mode == RUN_RESUME && (no_dir || empty) && log)
        fprintf(log, "%s: nothing to resume (%s): starting from step 0\n", dir,
                no_dir ? "no such directory" : "an empty directory");
    if (action != DIR_CLEAR)
        return ER_OK;
    if (log)
        fprintf(log, mode == RUN_RESUME
                         ? "%s: nothing to resume (no checkpoint: the run stopped before its first one); starting "
                           "from step 0\n"
                         : "%s holds no checkpoint and no finished output (a run stopped before its first "
                           "checkpoint): starting afresh\n", dir);
    return dist_rank() == 0 ? clear_stopped_run(dir) : ER_OK;
}

int run_write_outputs(const char *out_dir, int (*save)(void *ctx, const char *dir), void *ctx) {
    char name[64];
    snprintf(name, sizeof name, "output.tmp.%ld", (long)getpid());
    char *stage = path_join(out_dir, name);
    if (!stage)
        return ER_ENOMEM;
    int rc = path_remove_tree(stage);
    if (rc == ER_OK)
        rc = dir_make(stage);
    if (rc == ER_OK)
        rc = save(ctx, stage);
    if (rc < 0) {
        dir_stage_abort(stage);
        return rc;
    }
    return dir_stage_move_into(stage, out_dir);
}

void run_add_path(cJSON *j, const char *key, const char *path) {
    char *r = path ? path_resolve(path) : NULL;
    cJSON_AddStringToObject(j, key, r ? r : path ? path : "");
    er_free(r);
}

int run_is_fingerprint_key(const char *key) {
    size_t n = strlen(key), k = strlen("_fingerprint");
    return n > k && strcmp(key + n - k, "_fingerprint") == 0;
}

int run_check_fingerprint(const cJSON *saved, const cJSON *item, const cJSON *now, const char *ckpt_dir) {
    if (cJSON_Compare(saved, item, 1))
        return ER_OK;
    char key[128];
    snprintf(key, sizeof key, "%.*s", (int)(strlen(item->string) - strlen("_fingerprint")), item->string);
    const cJSON *path = cJSON_GetObjectItemCaseSensitive(now, key);
    return er_error(ER_EINVAL, "%s: the file changed since the checkpoint in %s was made (bytes:FNV-1a %s then, %s "
                    "now): resume with the data the run started with, or start a new run in another --out",
                    cJSON_IsString(path) ? path->valuestring : key, ckpt_dir,
                    cJSON_IsString(saved) ? saved->valuestring : "?", cJSON_IsString(item) ? item->valuestring : "?");
}

void run_add_numbers(cJSON *j, const RunNumber *n, size_t count) {
    for (size_t i = 0; i < count; i++)
        cJSON_AddNumberToObject(j, n[i].key, n[i].value);
}

void run_tokenizer_dir(const char *path, char *dir, size_t cap) {
    snprintf(dir, cap, "%s", path);
    if (path_is_dir(dir))
        return;
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(dir, cap, ".");
}

int run_write_json(const char *dir, const cJSON *run) {
    char *p = path_join(dir, "run.json");
    if (!p)
        return ER_ENOMEM;
    int rc = json_write_file(p, run);
    er_free(p);
    return rc;
}

// Keeps the lines of `path` whose "step" is <= keep_step, but for an end-of-run line ("stage": "eval") of
// keep_step itself (rewritten atomically).
static int metrics_keep(const char *path, long keep_step) {
    char *text = NULL, *out = NULL;
    size_t n, k = 0;
    long lineno = 0;
    int rc = ER_OK;
    ER_CHECK(file_read_all(path, (size_t)1 << 34, &text, &n));
    out = er_alloc(n + 1);
    if (!out)
        ER_CHECK(ER_ENOMEM);
    for (char *line = text; *line;) {
        char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        lineno++;
        if (len > 0) {
            cJSON *j = cJSON_ParseWithLength(line, len);
            const cJSON *s = j ? cJSON_GetObjectItemCaseSensitive(j, "step") : NULL;
            const cJSON *stage = j ? cJSON_GetObjectItemCaseSensitive(j, "stage") : NULL;
            int ok = cJSON_IsNumber(s), keep = ok && (long)s->valuedouble <= keep_step;
            // An end-of-run line comes after the last checkpoint: a resume from there writes it again.
            if (keep && cJSON_IsString(stage) && strcmp(stage->valuestring, "eval") == 0 &&
                (long)s->valuedouble >= keep_step)
                keep = 0;
            cJSON_Delete(j);
            if (!ok)
                ER_CHECK(er_error(ER_EFORMAT, "%s:%ld: not a metrics line with a \"step\"", path, lineno));
            if (keep) {
                memcpy(out + k, line, len);
                k += len;
                out[k++] = '\n';
            }
        }
        line += len + (end != NULL);
    }
    ER_CHECK(file_write_atomic(path, out, k));
done:
    er_free(out);
    er_free(text);
    return rc;
}

int metrics_open(MetricsLog *ml, const char *dir, const char *name, int resume, long keep_step) {
    memset(ml, 0, sizeof *ml);
    ml->path = path_join(dir, name);
    int rc = ER_OK;
    if (!ml->path)
        ER_CHECK(ER_ENOMEM);
    if (resume && path_exists(ml->path))
        ER_CHECK(metrics_keep(ml->path, keep_step));
    ml->fp = fopen(ml->path, resume ? "a" : "w");
    if (!ml->fp)
        ER_CHECK(er_error(ER_EIO, "%s: cannot open for writing", ml->path));
done:
    if (rc < 0)
        metrics_close(ml);
    return rc;
}

int metrics_write(MetricsLog *ml, const cJSON *line) {
    char *s = cJSON_PrintUnformatted(line);
    if (!s)
        return er_error(ER_ENOMEM, "%s: cannot format a metrics line", ml->path);
    int ok = fputs(s, ml->fp) >= 0 && fputc('\n', ml->fp) != EOF && fflush(ml->fp) == 0;
    cJSON_free(s);
    return ok ? ER_OK : er_error(ER_EIO, "%s: write failed", ml->path);
}

void metrics_close(MetricsLog *ml) {
    if (ml->fp)
        fclose(ml->fp);
    er_free(ml->path);
    memset(ml, 0, sizeof *ml);
}

// Copies dir/name to dst/name (atomically) when it exists; a missing required file is an error naming src.
static int copy_tokenizer_file(const char *dir, const char *name, const char *dst, int required, const char *src) {
    char *from = path_join(dir, name), *to = path_join(dst, name), *buf = NULL;
    size_t n;
    int rc = ER_OK;
    if (!from || !to)
        ER_CHECK(ER_ENOMEM);
    if (!path_exists(from)) {
        if (required)
            ER_CHECK(er_error(ER_EIO, "%s: no %s found", src, name));
        goto done;
    }
    ER_CHECK(file_read_all(from, (size_t)1 << 30, &buf, &n));
    ER_CHECK(file_write_atomic(to, buf, n));
done:
    er_free(buf);
    er_free(from);
    er_free(to);
    return rc;
}

int run_copy_tokenizer(const char *src, const char *dst) {
    if (gguf_is_path(src)) // a GGUF model file: its tokenizer written out as tokenizer.json
        return tok_gguf_write_json(src, dst);
    static const char *files[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json"};
    char dir[4096];
    run_tokenizer_dir(src, dir, sizeof dir);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        ER_TRY(copy_tokenizer_file(dir, files[i], dst, i == 0, src));
    return ER_OK;
}
