#include "core/json.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/utf8.h"

// Offset of the first non-whitespace byte after `end` within text[0, len), or -1 if none.
long json_nesting(const char *s, size_t len, size_t at, int *in_string, long *depth) {
    int in = 0, in_at = 0;
    long d = 0, d_at = 0, max = 0;
    for (size_t i = 0; i < len; i++) {
        if (i <= at)
            in_at = in, d_at = d;
        char c = s[i];
        if (in) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in = 0;
        } else if (c == '"') {
            in = 1;
        } else if (c == '[' || c == '{') {
            if (++d > max)
                max = d;
        } else if (c == ']' || c == '}') {
            d--;
        }
    }
    if (at >= len)
        in_at = in, d_at = d;
    if (in_string)
        *in_string = in_at;
    if (depth)
        *depth = d_at;
    return max;
}

long json_trailing_at(const char *text, size_t len, const char *end) {
    if (!end)
        return -1;
    for (const char *c = end; c < text + len; c++)
        if (*c != ' ' && *c != '\t' && *c != '\n' && *c != '\r')
            return (long)(c - text);
    return -1;
}

int json_parse_file(const char *path, size_t max_bytes, cJSON **out) {
    *out = NULL;
    char *text;
    size_t len;
    ER_TRY(file_read_all(path, max_bytes, &text, &len));
    JsonText t = {path, text, len};
    int rc = json_parse_text(&t, max_bytes, out);
    er_free(text);
    return rc;
}

int json_parse_text(const JsonText *t, size_t max_bytes, cJSON **out) {
    *out = NULL;
    const char *path = t->name, *text = t->text, *end = NULL;
    size_t len = t->len;
    if (len > max_bytes)
        return er_error(ER_ERANGE, "%s: %zu bytes, more than the %zu allowed", path, len, max_bytes);
    size_t bad = utf8_invalid_at(text, len);
    if (bad < len)
        return er_error(ER_EFORMAT, "%s: not valid UTF-8 (byte %zu)", path, bad);
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!j)
        return er_error(ER_EFORMAT, "%s: not valid JSON (near byte %ld)", path, end ? (long)(end - text) : 0L);
    // cJSON stops after the first value; anything but whitespace after it is malformed input.
    long trail = json_trailing_at(text, len, end);
    if (trail >= 0) {
        cJSON_Delete(j);
        return er_error(ER_EFORMAT, "%s: not valid JSON: unexpected data after the value (near byte %ld)", path,
                        trail);
    }
    *out = j;
    return ER_OK;
}

const char *json_type_name(const cJSON *v) {
    if (!v)
        return "nothing";
    switch (v->type & 0xFF) {
    case cJSON_NULL: return "null";
    case cJSON_False: case cJSON_True: return "a boolean";
    case cJSON_Number: return "a number";
    case cJSON_String: return "a string";
    case cJSON_Array: return "an array";
    case cJSON_Object: return "an object";
    default: return "not a value";
    }
}

int json_field_error(const char *ctx, const char *field, const char *want, const cJSON *got) {
    return er_error(ER_EFORMAT, "%s: field \"%s\" must be %s (got %s)", ctx, field, want, json_type_name(got));
}

// Member `key` of obj; NULL when absent or null.
static const cJSON *member(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return (v && !cJSON_IsNull(v)) ? v : NULL;
}

static int get_number(const cJSON *v, const char *key, double *out, const char *ctx) {
    if (!cJSON_IsNumber(v))
        return json_field_error(ctx, key, "a number", v);
    if (!isfinite(v->valuedouble))
        return er_error(ER_EFORMAT, "%s: field \"%s\" is not finite", ctx, key);
    *out = v->valuedouble;
    return ER_OK;
}

static int get_int(const cJSON *v, const char *key, int64_t *out, const char *ctx) {
    double d;
    ER_TRY(get_number(v, key, &d, ctx));
    if (d != floor(d) || fabs(d) > 9007199254740992.0)
        return er_error(ER_EFORMAT, "%s: field \"%s\" must be an integer (got %g)", ctx, key, d);
    *out = (int64_t)d;
    return ER_OK;
}

static int missing(const char *key, const char *ctx) {
    return er_error(ER_EFORMAT, "%s: missing field \"%s\"", ctx, key);
}

int json_get_int(const cJSON *obj, const char *key, int64_t *out, const char *ctx) {
    const cJSON *v = member(obj, key);
    return v ? get_int(v, key, out, ctx) : missing(key, ctx);
}

int json_get_double(const cJSON *obj, const char *key, double *out, const char *ctx) {
    const cJSON *v = member(obj, key);
    return v ? get_number(v, key, out, ctx) : missing(key, ctx);
}

int json_get_string(const cJSON *obj, const char *key, const char **out, const char *ctx) {
    if (!member(obj, key))
        return missing(key, ctx);
    return json_opt_string(obj, key, out, ctx);
}

int json_opt_int(const cJSON *obj, const char *key, int64_t *out, const char *ctx) {
    const cJSON *v = member(obj, key);
    return v ? get_int(v, key, out, ctx) : ER_OK;
}

int json_opt_double(const cJSON *obj, const char *key, double *out, const char *ctx) {
    const cJSON *v = member(obj, key);
    return v ? get_number(v, key, out, ctx) : ER_OK;
}

int json_opt_bool_named(const cJSON *obj, const char *key, const char *field, int *out, const char *ctx) {
    const cJSON *v = member(obj, key);
    if (v && !cJSON_IsBool(v))
        return json_field_error(ctx, field, "true or false", v);
    if (v)
        *out = cJSON_IsTrue(v);
    return ER_OK;
}

int json_opt_string_named(const cJSON *obj, const char *key, const char *field, const char **out, const char *ctx) {
    const cJSON *v = member(obj, key);
    if (v && !cJSON_IsString(v))
        return json_field_error(ctx, field, "a string", v);
    if (v)
        *out = v->valuestring;
    return ER_OK;
}

int json_opt_bool(const cJSON *obj, const char *key, int *out, const char *ctx) {
    return json_opt_bool_named(obj, key, key, out, ctx);
}

int json_opt_string(const cJSON *obj, const char *key, const char **out, const char *ctx) {
    return json_opt_string_named(obj, key, key, out, ctx);
}

int jsonl_open(JsonlReader *r, const char *path) {
    memset(r, 0, sizeof *r);
    r->fp = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!r->fp)
        return er_error(ER_EIO, "%s: cannot open: %s", path, strerror(errno));
    r->path = er_strdup(path);
    if (!r->path) {
        jsonl_close(r);
        return ER_ENOMEM;
    }
    return ER_OK;
}

int jsonl_next(JsonlReader *r, cJSON **obj) {
    *obj = NULL;
    for (;;) {
        ssize_t n = getline(&r->line, &r->cap, r->fp);
        if (n < 0) {
            if (ferror(r->fp))
                return er_error(ER_EIO, "%s:%ld: read failed", r->path, r->lineno + 1);
            return 0;
        }
        r->lineno++;
        size_t len = (size_t)n;
        while (len && (r->line[len - 1] == '\n' || r->line[len - 1] == '\r' || r->line[len - 1] == ' ' ||
                       r->line[len - 1] == '\t'))
            len--;
        if (len == 0)
            continue;
        if (memchr(r->line, 0, len))
            return er_error(ER_EFORMAT, "%s:%ld: line contains a NUL byte", r->path, r->lineno);
        size_t bad = utf8_invalid_at(r->line, len);
        if (bad < len)
            return er_error(ER_EFORMAT, "%s:%ld: not valid UTF-8 (column %zu)", r->path, r->lineno, bad + 1);
        const char *end = NULL;
        cJSON *j = cJSON_ParseWithLengthOpts(r->line, len, &end, 0);
        if (!j)
            return er_error(ER_EFORMAT, "%s:%ld: not valid JSON (near column %ld)", r->path, r->lineno,
                            end ? (long)(end - r->line) + 1 : 0L);
        long trail = json_trailing_at(r->line, len, end);
        if (trail >= 0 || !cJSON_IsObject(j)) {
            cJSON_Delete(j);
            if (trail >= 0)
                return er_error(ER_EFORMAT, "%s:%ld: not valid JSON: unexpected data after the value (column %ld)",
                                r->path, r->lineno, trail + 1);
            return er_error(ER_EFORMAT, "%s:%ld: each line must be a JSON object", r->path, r->lineno);
        }
        *obj = j;
        return 1;
    }
}

void jsonl_close(JsonlReader *r) {
    if (r->fp && r->fp != stdin)
        fclose(r->fp);
    free(r->line);
    free(r->path);
    memset(r, 0, sizeof *r);
}

int json_write_file(const char *path, const cJSON *obj) {
    char *s = cJSON_Print(obj);
    if (!s)
        return er_error(ER_ENOMEM, "%s: out of memory formatting JSON", path);
    size_t n = strlen(s);
    AtomicFile af;
    int rc = ER_OK;
    ER_CHECK(atomic_open(&af, path));
    if (fwrite(s, 1, n, af.fp) != n || fputc('\n', af.fp) == EOF) {
        atomic_abort(&af);
        rc = er_error(ER_EIO, "%s: write failed", path);
        goto done;
    }
    rc = atomic_commit(&af);
done:
    cJSON_free(s);
    return rc;
}
