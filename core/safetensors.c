#include "core/safetensors.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/utf8.h"

// The header is parsed by cJSON. Where cJSON is looser than the reference (Rust `safetensors` +
// serde_json) in ways that would change what a file means, this reader closes the gap itself:
// duplicate keys (cJSON keeps them as siblings), numbers (cJSON keeps doubles, so only exact
// integers below 2^53 pass), NUL bytes and \u0000 or malformed \u escapes (cJSON cuts the string
// there), leading whitespace. Spellings serde refuses but that cJSON reads as the same value (01,
// 1.0, 1e2, raw control characters) are accepted.

#define ST_INT_LIMIT 9007199254740992.0 // 2^53: every integer below it is exact in a double

// Records a message like er_error, with control characters (from tensor names, metadata keys or
// the path) shown as '?' so that the message stays one line.
static int st_error(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int st_error(int status, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (char *c = msg; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            *c = '?';
    return er_error(status, "%s", msg);
}

#define st_fail(path, fmt, ...) st_error(ER_EFORMAT, "%s: " fmt, path, ##__VA_ARGS__)
#define st_oom(path) st_error(ER_ENOMEM, "%s: out of memory reading the header", path)

static int is_hex(unsigned c) { return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); }

// cJSON decodes \u0000 to a NUL that silently cuts the string ("w\u0000x" would name tensor "w"),
// and decodes a \u with bad hex digits the same way. So a simple scan of the raw header bytes,
// before parsing, refuses both: outside strings a backslash is a syntax error anyway, and inside
// them every backslash starts an escape, so stepping over pairs finds each \u exactly.
static int check_escapes(const char *path, const unsigned char *s, size_t len) {
    for (size_t i = 0; i < len; i++) {
        if (s[i] != '\\')
            continue;
        if (i + 1 < len && s[i + 1] == 'u') {
            int zero = 1;
            for (size_t k = 2; k < 6; k++) {
                if (i + k >= len || !is_hex(s[i + k]))
                    return st_fail(path, "header is not valid JSON: bad \\u escape at header byte %zu", i);
                zero &= s[i + k] == '0';
            }
            if (zero)
                return st_fail(path, "header holds \\u0000 at header byte %zu, which C strings cannot hold", i);
        }
        i++; // the escaped character
    }
    return ER_OK;
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// The first key of a JSON object that occurs twice (cJSON keeps both), or NULL. Compared byte
// for byte, after cJSON decoded the escapes.
static const char *duplicate_key(const cJSON *obj, int *oom) {
    int n = cJSON_GetArraySize(obj), i = 0;
    *oom = 0;
    if (n < 2)
        return NULL;
    const char **keys = er_realloc_array(NULL, (size_t)n, sizeof *keys);
    if (!keys) {
        *oom = 1;
        return NULL;
    }
    for (const cJSON *c = obj->child; c; c = c->next)
        keys[i++] = c->string;
    qsort(keys, (size_t)n, sizeof *keys, cmp_str_ptr);
    const char *dup = NULL;
    for (i = 1; i < n && !dup; i++)
        if (strcmp(keys[i - 1], keys[i]) == 0)
            dup = keys[i];
    free(keys);
    return dup;
}

// ---------------------------------------------------------------------------------------------
// Reader

// A non-negative integer held exactly by cJSON's double. On failure `why` says what was found.
static int json_uint(const cJSON *v, uint64_t *out, char *why, size_t cap) {
    double d = v->valuedouble;
    if (!cJSON_IsNumber(v))
        snprintf(why, cap, "found %s", cJSON_IsString(v)  ? "a string"
                                       : cJSON_IsArray(v) ? "a list"
                                                          : cJSON_IsObject(v) ? "an object" : "null, true or false");
    else if (d >= ST_INT_LIMIT) // inf too
        snprintf(why, cap, "%g is out of range, too large: integers must be below 2^53", d);
    else if (!(d >= 0) || signbit(d) || d != floor(d)) // -0 too, as serde refuses it
        snprintf(why, cap, "found %.16g", d);
    else {
        *out = (uint64_t)d;
        return ER_OK;
    }
    return -1;
}

static int read_metadata(const char *path, const cJSON *m, StFile *f) {
    if (cJSON_IsNull(m)) // serde reads null as "no metadata"
        return ER_OK;
    if (!cJSON_IsObject(m))
        return st_fail(path, "__metadata__ must be an object mapping strings to strings");
    int oom = 0;
    const char *dup = duplicate_key(m, &oom);
    if (oom)
        return st_oom(path);
    if (dup)
        return st_fail(path, "duplicate __metadata__ key \"%.200s\"", dup);
    size_t n = (size_t)cJSON_GetArraySize(m) + 1; // + 1: calloc(0) may return NULL
    f->meta_keys = calloc(n, sizeof *f->meta_keys);
    f->meta_vals = calloc(n, sizeof *f->meta_vals);
    if (!f->meta_keys || !f->meta_vals)
        return st_oom(path);
    for (const cJSON *c = m->child; c; c = c->next) {
        if (!cJSON_IsString(c))
            return st_fail(path, "__metadata__ value for \"%.200s\" must be a string", c->string);
        int i = f->n_meta++; // counted first: safetensors_close frees whatever was copied
        f->meta_keys[i] = strdup(c->string);
        f->meta_vals[i] = strdup(c->valuestring);
        if (!f->meta_keys[i] || !f->meta_vals[i])
            return st_oom(path);
    }
    return ER_OK;
}

// One tensor entry into t (whose name is set) and off. Other fields are ignored, as serde does.
static int read_entry(const char *path, const cJSON *e, StTensor *t, uint64_t off[2]) {
    const char *name = t->name;
    if (!cJSON_IsObject(e))
        return st_fail(path, "tensor \"%.200s\": entry must be an object with dtype, shape and data_offsets", name);
    const cJSON *dtype = NULL, *shape = NULL, *offs = NULL;
    for (const cJSON *c = e->child; c; c = c->next) {
        const cJSON **field = strcmp(c->string, "dtype") == 0          ? &dtype
                              : strcmp(c->string, "shape") == 0        ? &shape
                              : strcmp(c->string, "data_offsets") == 0 ? &offs
                                                                       : NULL;
        if (field && *field)
            return st_fail(path, "tensor \"%.200s\": duplicate field \"%s\"", name, c->string);
        if (field)
            *field = c;
    }
    const char *missing = !dtype ? "dtype" : !shape ? "shape" : !offs ? "data_offsets" : NULL;
    if (missing)
        return st_fail(path, "tensor \"%.200s\": missing field \"%s\"", name, missing);

    if (!cJSON_IsString(dtype))
        return st_fail(path, "tensor \"%.200s\": dtype must be a string", name);
    if (dtype_from_name(dtype->valuestring, &t->dtype) < 0)
        return st_fail(path, "tensor \"%.200s\": unknown dtype \"%.32s\" (known: BOOL U8 I8 F8_E5M2 F8_E4M3 "
                       "I16 U16 F16 BF16 I32 U32 F32 F64 I64 U64)", name, dtype->valuestring);

    char why[96];
    if (!cJSON_IsArray(shape))
        return st_fail(path, "tensor \"%.200s\": shape must be a list of non-negative integers", name);
    t->ndim = 0;
    for (const cJSON *c = shape->child; c; c = c->next) {
        uint64_t d;
        if (json_uint(c, &d, why, sizeof why) < 0)
            return st_fail(path, "tensor \"%.200s\": shape must be a list of non-negative integers (%s)", name, why);
        if (t->ndim == ST_MAX_DIMS)
            return st_fail(path, "tensor \"%.200s\": shape has more than %d dimensions", name, ST_MAX_DIMS);
        t->shape[t->ndim++] = (int64_t)d;
    }

    const cJSON *b = cJSON_IsArray(offs) ? offs->child : NULL, *end = b ? b->next : NULL;
    if (!end || end->next)
        return st_fail(path, "tensor \"%.200s\": data_offsets must be [begin, end], two non-negative integers", name);
    if (json_uint(b, &off[0], why, sizeof why) < 0 || json_uint(end, &off[1], why, sizeof why) < 0)
        return st_fail(path, "tensor \"%.200s\": data_offsets must be [begin, end], two non-negative integers (%s)",
                       name, why);
    return ER_OK;
}

// "[2,3]" into buf of ST_SHAPE_CHARS (ndim <= ST_MAX_DIMS): 20 digits and a comma per dimension.
#define ST_SHAPE_CHARS (ST_MAX_DIMS * 21 + 3)
static void format_shape(char *buf, size_t cap, const int64_t *shape, int ndim) {
    int k = snprintf(buf, cap, "[");
    for (int d = 0; d < ndim; d++)
        k += snprintf(buf + k, cap - (size_t)k, "%s%lld", d ? "," : "", (long long)shape[d]);
    snprintf(buf + k, cap - (size_t)k, "]");
}

typedef struct {
    uint64_t begin, end;
    int index; // header order, a deterministic tie-break for empty tensors
} OffsetKey;

static int cmp_offset_key(const void *a, const void *b) {
    const OffsetKey *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

// Checks every rule that involves sizes and offsets, then puts f->tensors in offset order with
// data pointers into the buffer. `keys` (one per tensor, header order) is sorted in place.
static int check_layout(const char *path, StFile *f, OffsetKey *keys, const unsigned char *buffer,
                        uint64_t buffer_size) {
    int n = f->n_tensors;
    for (int i = 0; i < n; i++) {
        StTensor *t = &f->tensors[i];
        uint64_t b = keys[i].begin, e = keys[i].end;
        if (b > e)
            return st_fail(path, "tensor \"%.200s\": data_offsets [%llu,%llu] have begin > end", t->name,
                           (unsigned long long)b, (unsigned long long)e);
        char shp[ST_SHAPE_CHARS];
        format_shape(shp, sizeof shp, t->shape, t->ndim);
        // Folded left to right like the reference, so [huge, huge, 0] is an overflow too.
        size_t numel = 1, nbytes;
        for (int d = 0; d < t->ndim; d++)
            if (er_mul_size(numel, (size_t)t->shape[d], &numel) < 0)
                return st_fail(path, "tensor \"%.200s\": shape %s: element count overflows", t->name, shp);
        if (er_mul_size(numel, dtype_size(t->dtype), &nbytes) < 0)
            return st_fail(path, "tensor \"%.200s\": shape %s %s: byte size overflows", t->name, shp,
                           dtype_name(t->dtype));
        if ((uint64_t)nbytes != e - b)
            return st_fail(path, "tensor \"%.200s\": shape %s %s needs %zu bytes but data_offsets span %llu",
                           t->name, shp, dtype_name(t->dtype), nbytes, (unsigned long long)(e - b));
        t->nbytes = nbytes;
    }

    if (n)
        qsort(keys, (size_t)n, sizeof *keys, cmp_offset_key);
    uint64_t at = 0;
    for (int k = 0; k < n; k++) {
        const OffsetKey *c = &keys[k];
        const char *name = f->tensors[c->index].name;
        if (c->begin == at) {
            at = c->end;
            continue;
        }
        if (k == 0)
            return st_fail(path, "tensor \"%.200s\": data_offsets begin at %llu, but the first tensor must start at 0",
                           name, (unsigned long long)c->begin);
        const char *prev = f->tensors[keys[k - 1].index].name;
        if (c->begin > at)
            return st_fail(path, "gap of %llu bytes between tensor \"%.200s\" (ends at %llu) and tensor \"%.200s\" "
                           "(begins at %llu)", (unsigned long long)(c->begin - at), prev, (unsigned long long)at,
                           name, (unsigned long long)c->begin);
        return st_fail(path, "tensor \"%.200s\" (data_offsets [%llu,%llu]) overlaps tensor \"%.200s\" (ends at %llu)",
                       name, (unsigned long long)c->begin, (unsigned long long)c->end, prev, (unsigned long long)at);
    }
    if (at < buffer_size)
        return st_fail(path, "data buffer not fully covered: tensors end at byte %llu but the buffer holds %llu "
                       "(%llu trailing bytes)", (unsigned long long)at, (unsigned long long)buffer_size,
                       (unsigned long long)(buffer_size - at));
    if (at > buffer_size)
        return st_fail(path, "tensor \"%.200s\": data_offsets end %llu is past the end of the data buffer "
                       "(%llu bytes; file truncated?)", f->tensors[keys[n - 1].index].name,
                       (unsigned long long)at, (unsigned long long)buffer_size);

    StTensor *sorted = er_realloc_array(NULL, n ? (size_t)n : 1, sizeof *sorted);
    if (!sorted)
        return st_oom(path);
    for (int k = 0; k < n; k++) {
        sorted[k] = f->tensors[keys[k].index];
        sorted[k].data = buffer + keys[k].begin;
    }
    free(f->tensors); // the names moved to `sorted`
    f->tensors = sorted;
    return ER_OK;
}

// Everything that can be decided from the parsed header: fills f (tensors, metadata).
static int read_table(const char *path, const cJSON *root, StFile *f, const unsigned char *buffer,
                      uint64_t buffer_size) {
    int oom = 0;
    const char *dup = duplicate_key(root, &oom);
    if (oom)
        return st_oom(path);
    if (dup)
        return strcmp(dup, "__metadata__") == 0 ? st_fail(path, "duplicate key \"__metadata__\"")
                                                : st_fail(path, "duplicate tensor name \"%.200s\"", dup);

    int n = cJSON_GetArraySize(root);
    f->tensors = calloc(n ? (size_t)n : 1, sizeof *f->tensors);
    OffsetKey *keys = calloc(n ? (size_t)n : 1, sizeof *keys);
    int rc = ER_OK;
    if (!f->tensors || !keys) {
        rc = st_oom(path);
        goto done;
    }
    for (const cJSON *c = root->child; c; c = c->next) {
        if (strcmp(c->string, "__metadata__") == 0) {
            ER_CHECK(read_metadata(path, c, f));
            continue;
        }
        int i = f->n_tensors;
        StTensor *t = &f->tensors[i];
        if (!(t->name = strdup(c->string))) {
            rc = st_oom(path);
            goto done;
        }
        f->n_tensors++;
        uint64_t off[2] = {0, 0};
        ER_CHECK(read_entry(path, c, t, off));
        keys[i] = (OffsetKey){off[0], off[1], i};
    }
    rc = check_layout(path, f, keys, buffer, buffer_size);
done:
    free(keys);
    return rc;
}

// The header rules (see safetensors.h); on success f holds the table. `bytes` is the whole file.
static int read_header(const char *path, const unsigned char *bytes, uint64_t size, StFile *f) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | bytes[i];
    if (n > ST_MAX_HEADER)
        return st_fail(path, "header length %llu exceeds the limit of %u bytes (header too large)",
                       (unsigned long long)n, ST_MAX_HEADER);
    if (8 + n > size)
        return st_fail(path, "header length %llu runs past the end of the file (%llu bytes)", (unsigned long long)n,
                       (unsigned long long)size);
    const unsigned char *h = bytes + 8;
    size_t bad = utf8_invalid_at(h, (size_t)n);
    if (bad != n)
        return st_fail(path, "header is not valid UTF-8 (bad byte 0x%02x at header byte %zu)", h[bad], bad);
    if (n == 0 || h[0] != '{') // cJSON would skip leading whitespace and a BOM; serde does not
        return st_fail(path, "header is not a JSON object (it must start with '{')");
    ER_TRY(check_escapes(path, h, (size_t)n));

    const char *text = (const char *)h, *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, (size_t)n, &end, 0);
    if (!root)
        return st_fail(path, "header is not valid JSON (error near header byte %zu)", end ? (size_t)(end - text) : 0);
    int rc = ER_OK;
    const char *nul;
    // cJSON stops after the object; serde allows only whitespace after it (writers pad with spaces).
    long trail = json_trailing_at(text, (size_t)n, end);
    if (trail >= 0)
        ER_CHECK(st_fail(path, "header is not valid JSON: unexpected data after the closing '}' at header byte %ld",
                         trail));
    // cJSON takes a NUL byte for whitespace between tokens and copies it into strings (cutting them).
    if ((nul = memchr(text, 0, (size_t)(end - text))) != NULL) {
        rc = st_fail(path, "header is not valid JSON: NUL byte at header byte %zu", (size_t)(nul - text));
        goto done;
    }
    rc = read_table(path, root, f, h + n, size - 8 - n);
done:
    cJSON_Delete(root);
    return rc;
}

int safetensors_open(StFile *f, const char *path) {
    memset(f, 0, sizeof *f);
    if (!path)
        return st_error(ER_EINVAL, "safetensors_open: path is NULL");
    ByteRange r;
    int rc = bytes_map_file(&r, path);
    if (rc < 0)
        return st_error(rc, "%s", er_last_error()); // the path on one line
    return safetensors_open_bytes(f, &r);
}

int safetensors_open_bytes(StFile *f, ByteRange *bytes) {
    memset(f, 0, sizeof *f);
    bytes_move(&f->bytes, bytes);
    f->map = f->bytes.data;
    f->map_size = f->bytes.size;
    int rc = ER_OK;
    const char *name = f->bytes.name;
    if (f->map_size < 8)
        ER_CHECK(st_error(ER_EFORMAT, "%s: %zu bytes, too small for the 8-byte header length", name, f->map_size));
    ER_CHECK(read_header(name, f->map, f->map_size, f));
    if (!(f->path = strdup(name)))
        rc = st_error(ER_ENOMEM, "%s: out of memory", name);
done:
    if (rc < 0)
        safetensors_close(f); // unmaps and frees; the recorded message stays
    return rc;
}

void safetensors_close(StFile *f) {
    if (!f)
        return;
    bytes_free(&f->bytes);
    for (int i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_vals[i]);
    }
    free(f->meta_keys);
    free(f->meta_vals);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const StTensor *safetensors_find(const StFile *f, const char *name) {
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0)
            return &f->tensors[i];
    return NULL;
}

const char *safetensors_meta(const StFile *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0)
            return f->meta_vals[i];
    return NULL;
}

int64_t st_numel(const StTensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    return n;
}

int safetensors_read_tensor(const StFile *f, const char *name, ErDType dt, int ndim, const int64_t *shape,
                            void *dst) {
    assert(ndim >= 0 && ndim <= ST_MAX_DIMS);
    const StTensor *t = safetensors_find(f, name);
    if (!t)
        return st_fail(f->path, "tensor \"%s\" is missing", name);
    int same = t->dtype == dt && t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++)
        same = t->shape[d] == shape[d];
    if (!same) {
        char got[ST_SHAPE_CHARS], want[ST_SHAPE_CHARS];
        format_shape(got, sizeof got, t->shape, t->ndim);
        format_shape(want, sizeof want, shape, ndim);
        return st_fail(f->path, "tensor \"%s\" is %s of shape %s, expected %s of shape %s", name,
                       dtype_name(t->dtype), got, dtype_name(dt), want);
    }
    memcpy(dst, t->data, t->nbytes);
    return ER_OK;
}

// ---------------------------------------------------------------------------------------------
// Writer

// The header as a cJSON tree, keys in the given order (cJSON keeps insertion order). Shapes and
// offsets go in as raw text: cJSON prints numbers as doubles and would write 10^15 as "1e+15",
// which the reference refuses as an integer. NULL when out of memory.
static cJSON *header_build(const StWriteTensor *t, int n, const size_t *nbytes, const char *const *meta_kv,
                           int n_meta) {
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL;
    if (ok && n_meta > 0) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        ok = m != NULL;
        for (int i = 0; i < n_meta && ok; i++)
            ok = cJSON_AddStringToObject(m, meta_kv[2 * i], meta_kv[2 * i + 1]) != NULL;
    }
    size_t at = 0;
    for (int i = 0; i < n && ok; i++) {
        char shape[ST_SHAPE_CHARS], offs[48];
        format_shape(shape, sizeof shape, t[i].shape, t[i].ndim);
        snprintf(offs, sizeof offs, "[%zu,%zu]", at, at + nbytes[i]);
        at += nbytes[i];
        cJSON *e = cJSON_AddObjectToObject(root, t[i].name);
        ok = e && cJSON_AddStringToObject(e, "dtype", dtype_name(t[i].dtype)) &&
             cJSON_AddRawToObject(e, "shape", shape) && cJSON_AddRawToObject(e, "data_offsets", offs);
    }
    if (!ok)
        cJSON_Delete(root);
    return ok ? root : NULL;
}

static int write_check_name(const char *path, const char *what, const char *s) {
    if (!s)
        return st_error(ER_EINVAL, "%s: %s is NULL", path, what);
    if (utf8_invalid_at((const unsigned char *)s, strlen(s)) != strlen(s))
        return st_error(ER_EINVAL, "%s: %s \"%.200s\" is not valid UTF-8", path, what, s);
    return ER_OK;
}

// One tensor to write: name, dtype, shape and data checked; *bytes its size, added to *total.
static int write_check_tensor(const char *path, const StWriteTensor *t, size_t *bytes, size_t *total) {
    ER_TRY(write_check_name(path, "tensor name", t->name));
    if (strcmp(t->name, "__metadata__") == 0)
        return st_error(ER_EINVAL, "%s: \"__metadata__\" cannot name a tensor", path);
    if ((unsigned)t->dtype >= DT_COUNT)
        return st_error(ER_EINVAL, "%s: tensor \"%.200s\": invalid dtype %d", path, t->name, (int)t->dtype);
    if (t->ndim < 0 || t->ndim > ST_MAX_DIMS)
        return st_error(ER_EINVAL, "%s: tensor \"%.200s\": ndim %d is outside [0, %d]", path, t->name, t->ndim,
                        ST_MAX_DIMS);
    *bytes = dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0)
            return st_error(ER_EINVAL, "%s: tensor \"%.200s\": negative dimension %lld", path, t->name,
                            (long long)t->shape[d]);
        if ((uint64_t)t->shape[d] > SIZE_MAX || er_mul_size(*bytes, (size_t)t->shape[d], bytes) < 0)
            return st_error(ER_EINVAL, "%s: tensor \"%.200s\": size overflows", path, t->name);
        if ((double)t->shape[d] >= ST_INT_LIMIT) // an empty tensor: the reader would refuse it
            return st_error(ER_EINVAL, "%s: tensor \"%.200s\": dimension %lld is out of range (must be "
                            "below 2^53)", path, t->name, (long long)t->shape[d]);
    }
    if (er_add_size(*total, *bytes, total) < 0)
        return st_error(ER_EINVAL, "%s: total size overflows", path);
    if (*bytes && !t->data)
        return st_error(ER_EINVAL, "%s: tensor \"%.200s\": data is NULL", path, t->name);
    return ER_OK;
}

// The header text of checked tensors and metadata (*out for cJSON_free); refuses duplicate names.
static int write_header_text(const char *path, const StWriteTensor *tensors, int n, const size_t *nbytes,
                             const char *const *meta_kv, int n_meta, char **out) {
    *out = NULL;
    cJSON *root = header_build(tensors, n, nbytes, meta_kv, n_meta);
    int rc = ER_OK, oom = !root;
    const char *dup;
    if (!oom && (dup = duplicate_key(root, &oom)) != NULL) {
        rc = st_error(ER_EINVAL, "%s: duplicate tensor name \"%.200s\"", path, dup);
        goto done;
    }
    if (!oom && n_meta > 1 &&
        (dup = duplicate_key(cJSON_GetObjectItemCaseSensitive(root, "__metadata__"), &oom)) != NULL) {
        rc = st_error(ER_EINVAL, "%s: duplicate metadata key \"%.200s\"", path, dup);
        goto done;
    }
    if (!oom)
        *out = cJSON_PrintUnformatted(root);
    if (!*out)
        rc = st_error(ER_ENOMEM, "%s: out of memory building the header", path);
done:
    cJSON_Delete(root);
    return rc;
}

// The file: the header length (8 bytes, little-endian), the header padded with spaces to
// `padded` bytes, then the tensors' data.
static int write_file(const char *path, const char *h, size_t len, size_t padded, const StWriteTensor *tensors,
                      int n, const size_t *nbytes) {
    AtomicFile af;
    ER_TRY(atomic_open(&af, path));
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    int ok = fwrite(len8, 1, 8, af.fp) == 8 && fwrite(h, 1, len, af.fp) == len;
    for (size_t i = len; i < padded && ok; i++)
        ok = fputc(' ', af.fp) != EOF;
    for (int i = 0; i < n && ok; i++)
        ok = nbytes[i] == 0 || fwrite(tensors[i].data, 1, nbytes[i], af.fp) == nbytes[i];
    if (!ok) {
        int rc = st_error(ER_EIO, "%s: write failed: %s", path, strerror(errno));
        atomic_abort(&af);
        return rc;
    }
    return atomic_commit(&af);
}

int safetensors_write(const char *path, const StWriteTensor *tensors, int n, const char *const *meta_kv,
                      int n_meta) {
    if (!path)
        return st_error(ER_EINVAL, "safetensors_write: path is NULL");
    if (n < 0 || (n > 0 && !tensors))
        return st_error(ER_EINVAL, "%s: bad tensor list (n = %d)", path, n);
    if (n_meta < 0 || n_meta > INT_MAX / 2 || (n_meta > 0 && !meta_kv))
        return st_error(ER_EINVAL, "%s: bad metadata list (n_meta = %d)", path, n_meta);

    size_t *nbytes = er_realloc_array(NULL, n ? (size_t)n : 1, sizeof *nbytes);
    if (!nbytes)
        return st_error(ER_ENOMEM, "%s: out of memory", path);
    char *h = NULL;
    size_t total = 0, len, padded;
    int rc = ER_OK;
    // Validate everything before anything touches the disk.
    for (int i = 0; i < n; i++)
        ER_CHECK(write_check_tensor(path, &tensors[i], &nbytes[i], &total));
    for (int i = 0; i < n_meta; i++) {
        ER_CHECK(write_check_name(path, "metadata key", meta_kv[2 * i]));
        ER_CHECK(write_check_name(path, "metadata value", meta_kv[2 * i + 1]));
    }
    ER_CHECK(write_header_text(path, tensors, n, nbytes, meta_kv, n_meta, &h));
    len = strlen(h);
    padded = (len + 7) / 8 * 8; // the data buffer then starts 8-aligned
    if (padded > ST_MAX_HEADER) {
        rc = st_error(ER_ERANGE, "%s: header would be %zu bytes, more than the %u-byte limit", path, padded,
                      ST_MAX_HEADER);
        goto done;
    }
    rc = write_file(path, h, len, padded, tensors, n, nbytes);
done:
    cJSON_free(h);
    free(nbytes);
    return rc;
}
