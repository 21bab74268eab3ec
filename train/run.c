#include "train/run.h"

#include <dirent.h>
#include <string.h>

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

static int run_dir_check_here(const char *dir, RunMode mode) {
    if (mode == RUN_RESUME) {
        if (!path_is_dir(dir))
            return er_error(ER_EINVAL, "%s: no run to resume (the directory does not exist)", dir);
        return ER_OK;
    }
    if (path_exists(dir) && !path_is_dir(dir))
        return er_error(ER_EINVAL, "%s exists and is not a directory", dir);
    if (path_is_dir(dir) && !dir_is_empty(dir))
        return er_error(ER_EINVAL, mode == RUN_ONCE ? "%s already exists and is not empty: choose another --out (or "
                                                      "remove it)"
                                                    : "%s already exists and is not empty: pass --resume to continue "
                                                      "that run, or choose another --out",
                        dir);
    return ER_OK;
}

// Under mpirun every rank checks before any goes on (rank 0 makes the dir once its inputs load, and a
// slower rank would then find it).
int run_dir_check(const char *dir, RunMode mode) {
    int rc = run_dir_check_here(dir, mode);
    double failed = rc < 0;
    ER_TRY(dist_sum_doubles(&failed, 1));
    if (rc == ER_OK && failed > 0)
        return er_error(ER_EINVAL, "%s: another rank refused this run dir (see its line)", dir);
    return rc;
}

void run_add_path(cJSON *j, const char *key, const char *path) {
    char *r = path ? path_resolve(path) : NULL;
    cJSON_AddStringToObject(j, key, r ? r : path ? path : "");
    er_free(r);
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

// Keeps the lines of `path` whose "step" is <= keep_step (rewritten atomically).
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
            int ok = cJSON_IsNumber(s), keep = ok && (long)s->valuedouble <= keep_step;
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

int metrics_open(MetricsLog *ml, const char *dir, int resume, long keep_step) {
    memset(ml, 0, sizeof *ml);
    ml->path = path_join(dir, "metrics.jsonl");
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
