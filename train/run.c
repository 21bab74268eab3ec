#include "train/run.h"

#include <dirent.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"

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

int run_dir_check(const char *dir, RunMode mode) {
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

void run_add_path(cJSON *j, const char *key, const char *path) {
    char *r = path ? path_resolve(path) : NULL;
    cJSON_AddStringToObject(j, key, r ? r : path ? path : "");
    er_free(r);
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
    char *text;
    size_t n;
    ER_TRY(file_read_all(path, (size_t)1 << 34, &text, &n));
    char *out = er_alloc(n + 1);
    if (!out) {
        er_free(text);
        return ER_ENOMEM;
    }
    size_t k = 0;
    long lineno = 0;
    int rc = ER_OK;
    for (char *line = text; rc == ER_OK && *line;) {
        char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        lineno++;
        if (len > 0) {
            cJSON *j = cJSON_ParseWithLength(line, len);
            const cJSON *s = j ? cJSON_GetObjectItemCaseSensitive(j, "step") : NULL;
            if (!cJSON_IsNumber(s)) {
                rc = er_error(ER_EFORMAT, "%s:%ld: not a metrics line with a \"step\"", path, lineno);
            } else if ((long)s->valuedouble <= keep_step) {
                memcpy(out + k, line, len);
                k += len;
                out[k++] = '\n';
            }
            cJSON_Delete(j);
        }
        line += len + (end != NULL);
    }
    if (rc == ER_OK)
        rc = file_write_atomic(path, out, k);
    er_free(out);
    er_free(text);
    return rc;
}

int metrics_open(MetricsLog *ml, const char *dir, int resume, long keep_step) {
    memset(ml, 0, sizeof *ml);
    ml->path = path_join(dir, "metrics.jsonl");
    if (!ml->path)
        return ER_ENOMEM;
    int rc = ER_OK;
    if (resume && path_exists(ml->path))
        rc = metrics_keep(ml->path, keep_step);
    if (rc == ER_OK) {
        ml->fp = fopen(ml->path, resume ? "a" : "w");
        if (!ml->fp)
            rc = er_error(ER_EIO, "%s: cannot open for writing", ml->path);
    }
    if (rc < 0) {
        er_free(ml->path);
        ml->path = NULL;
    }
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

int run_copy_tokenizer(const char *src, const char *dst) {
    static const char *files[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json"};
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", src);
    if (!path_is_dir(dir)) {
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(dir, sizeof dir, ".");
    }
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char *from = path_join(dir, files[i]), *to = path_join(dst, files[i]);
        int rc = ER_OK;
        if (!from || !to) {
            rc = ER_ENOMEM;
        } else if (path_exists(from)) {
            char *buf;
            size_t n;
            rc = file_read_all(from, (size_t)1 << 30, &buf, &n);
            if (rc == ER_OK) {
                rc = file_write_atomic(to, buf, n);
                er_free(buf);
            }
        } else if (i == 0) {
            rc = er_error(ER_EIO, "%s: no tokenizer.json found", src);
        }
        er_free(from);
        er_free(to);
        ER_TRY(rc);
    }
    return ER_OK;
}
