// GGUF v3 reader (over a mapped file or any byte range; every count checked against the bytes left) and atomic writer.
#include "core/gguf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"

// ggml's type table (ggml.h, ggml.c type_traits): name, elements per block, bytes per block. Ids that
// ggml retired have no entry.
static const struct {
    uint32_t id;
    const char *name;
    size_t block, bytes;
} GGML_TYPES[] = {
    {0, "f32", 1, 4},         {1, "f16", 1, 2},          {2, "q4_0", 32, 18},     {3, "q4_1", 32, 20},
    {6, "q5_0", 32, 22},      {7, "q5_1", 32, 24},       {8, "q8_0", 32, 34},     {9, "q8_1", 32, 36},
    {10, "q2_K", 256, 84},    {11, "q3_K", 256, 110},    {12, "q4_K", 256, 144},  {13, "q5_K", 256, 176},
    {14, "q6_K", 256, 210},   {15, "q8_K", 256, 292},    {16, "iq2_xxs", 256, 66}, {17, "iq2_xs", 256, 74},
    {18, "iq3_xxs", 256, 98}, {19, "iq1_s", 256, 50},    {20, "iq4_nl", 32, 18},  {21, "iq3_s", 256, 110},
    {22, "iq2_s", 256, 82},   {23, "iq4_xs", 256, 136},  {24, "i8", 1, 1},        {25, "i16", 1, 2},
    {26, "i32", 1, 4},        {27, "i64", 1, 8},         {28, "f64", 1, 8},       {29, "iq1_m", 256, 56},
    {30, "bf16", 1, 2},       {34, "tq1_0", 256, 54},    {35, "tq2_0", 256, 66},  {39, "mxfp4", 32, 17},
};

static int type_index(uint32_t type) {
    for (size_t i = 0; i < sizeof GGML_TYPES / sizeof GGML_TYPES[0]; i++)
        if (GGML_TYPES[i].id == type)
            return (int)i;
    return -1;
}

int gguf_is_path(const char *path) {
    size_t n = path ? strlen(path) : 0;
    return n > 5 && strcmp(path + n - 5, ".gguf") == 0;
}

const char *ggml_type_name(uint32_t type) {
    int i = type_index(type);
    return i < 0 ? NULL : GGML_TYPES[i].name;
}
size_t ggml_type_block(uint32_t type) {
    int i = type_index(type);
    return i < 0 ? 0 : GGML_TYPES[i].block;
}
size_t ggml_type_block_bytes(uint32_t type) {
    int i = type_index(type);
    return i < 0 ? 0 : GGML_TYPES[i].bytes;
}

// Bytes of one scalar of a value type; 0 for strings, arrays and invalid types.
static size_t value_size(uint32_t t) {
    static const size_t sz[GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < GGUF_TYPE_COUNT ? sz[t] : 0;
}

static const char *value_type_name(uint32_t t) {
    static const char *names[GGUF_TYPE_COUNT] = {"u8",     "i8",    "u16", "i16", "u32", "i32", "f32",
                                                 "bool",   "string", "array", "u64", "i64", "f64"};
    return t < GGUF_TYPE_COUNT ? names[t] : "?";
}

// ---- reading ----

// A cursor over the header; every read checks what is left, so no count from the file is trusted
// before the bytes behind it are known to exist.
typedef struct {
    const GgufFile *f;
    const unsigned char *p, *end;
    char *arena;  // string copies go here (sized by the first pass)
    size_t arena_used;
    int counting; // first pass: only measure the arena
} Cursor;

static int cur_fail(const Cursor *c, const char *what) {
    return er_error(ER_EFORMAT, "%s: truncated or malformed GGUF at byte %zu: %s", c->f->path,
                    (size_t)(c->p - (const unsigned char *)c->f->map), what);
}

static int cur_bytes(Cursor *c, size_t n, const void **out, const char *what) {
    if ((size_t)(c->end - c->p) < n)
        return cur_fail(c, what);
    *out = c->p;
    c->p += n;
    return ER_OK;
}

static int cur_u32(Cursor *c, uint32_t *v, const char *what) {
    const void *b = NULL;
    ER_TRY(cur_bytes(c, 4, &b, what));
    memcpy(v, b, 4);
    return ER_OK;
}

static int cur_u64(Cursor *c, uint64_t *v, const char *what) {
    const void *b = NULL;
    ER_TRY(cur_bytes(c, 8, &b, what));
    memcpy(v, b, 8);
    return ER_OK;
}

// A string: its bytes must lie in the file and hold no NUL; a copy goes to the arena.
static int cur_str(Cursor *c, char **out, const char *what) {
    uint64_t n;
    const void *b = NULL;
    ER_TRY(cur_u64(c, &n, what));
    if (n > (uint64_t)(c->end - c->p))
        return er_error(ER_EFORMAT, "%s: %s is %llu bytes long but only %zu bytes follow", c->f->path, what,
                        (unsigned long long)n, (size_t)(c->end - c->p));
    ER_TRY(cur_bytes(c, (size_t)n, &b, what));
    if (memchr(b, 0, (size_t)n))
        return er_error(ER_EFORMAT, "%s: %s holds a NUL byte", c->f->path, what);
    if (!c->counting) {
        *out = c->arena + c->arena_used;
        memcpy(*out, b, (size_t)n);
        (*out)[n] = 0;
    }
    c->arena_used += (size_t)n + 1;
    return ER_OK;
}

static int read_value(Cursor *c, GgufKV *kv) {
    uint32_t t;
    ER_TRY(cur_u32(c, &t, "value type"));
    if (t >= GGUF_TYPE_COUNT)
        return er_error(ER_EFORMAT, "%s: key \"%s\" has the unknown value type %u", c->f->path, kv->key, t);
    kv->type = (GgufType)t;
    if (t == GGUF_STRING)
        return cur_str(c, &kv->str, "a string value");
    if (t != GGUF_ARRAY) {
        kv->n = 1;
        return cur_bytes(c, value_size(t), &kv->raw, "a value");
    }
    uint32_t at;
    ER_TRY(cur_u32(c, &at, "array type"));
    ER_TRY(cur_u64(c, &kv->n, "array length"));
    if (at >= GGUF_TYPE_COUNT || at == GGUF_ARRAY)
        return er_error(ER_EFORMAT, "%s: key \"%s\" is an array of %s (expected numbers, bools or strings)",
                        c->f->path, kv->key, at == GGUF_ARRAY ? "arrays" : "an unknown type");
    kv->arr_type = (GgufType)at;
    size_t left = (size_t)(c->end - c->p);
    // Each element takes at least one byte (a string its 8-byte length), so a longer array cannot fit.
    size_t min_size = at == GGUF_STRING ? 8 : value_size(at);
    if (kv->n > left / min_size)
        return er_error(ER_EFORMAT, "%s: key \"%s\" claims %llu elements but only %zu bytes follow", c->f->path,
                        kv->key, (unsigned long long)kv->n, left);
    if (at != GGUF_STRING)
        return cur_bytes(c, (size_t)kv->n * min_size, &kv->raw, "array data");
    if (!c->counting && !(kv->strs = er_calloc((size_t)kv->n ? (size_t)kv->n : 1, sizeof(char *))))
        return ER_ENOMEM;
    for (uint64_t i = 0; i < kv->n; i++)
        ER_TRY(cur_str(c, kv->strs ? &kv->strs[i] : NULL, "an array string"));
    return ER_OK;
}

static int read_tensor_info(Cursor *c, GgufTensor *t) {
    uint32_t nd;
    char *name = NULL;
    ER_TRY(cur_str(c, c->counting ? NULL : &name, "tensor name"));
    t->name = name;
    ER_TRY(cur_u32(c, &nd, "tensor dims"));
    const char *tn = c->counting ? "a tensor" : name;
    if (nd < 1 || nd > GGUF_MAX_DIMS)
        return er_error(ER_EFORMAT, "%s: tensor \"%s\" has %u dimensions (expected 1 to %d)", c->f->path, tn, nd,
                        GGUF_MAX_DIMS);
    t->ndim = (int)nd;
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < nd; d++)
        ER_TRY(cur_u64(c, &t->ne[d], "tensor shape"));
    ER_TRY(cur_u32(c, &t->type, "tensor type"));
    ER_TRY(cur_u64(c, &t->offset, "tensor offset"));
    if (c->counting)
        return ER_OK;
    size_t block = ggml_type_block(t->type), numel = 1;
    if (!block)
        return er_error(ER_EFORMAT, "%s: tensor \"%s\" has the unknown ggml type %u", c->f->path, tn, t->type);
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        if (t->ne[d] > SIZE_MAX || er_mul_size(numel, (size_t)t->ne[d], &numel) < 0)
            return er_error(ER_EFORMAT, "%s: tensor \"%s\" has a shape whose size overflows", c->f->path, tn);
    if (t->ne[0] % block)
        return er_error(ER_EFORMAT, "%s: tensor \"%s\" of type %s has rows of %llu elements (not a multiple of %zu)",
                        c->f->path, tn, ggml_type_name(t->type), (unsigned long long)t->ne[0], block);
    if (er_mul_size(numel / block, ggml_type_block_bytes(t->type), &t->nbytes) < 0)
        return er_error(ER_EFORMAT, "%s: tensor \"%s\" is too large", c->f->path, tn);
    return ER_OK;
}

// The header (both passes): key/values, then tensor infos.
static int read_header(Cursor *c, GgufFile *f, uint64_t n_tensors, uint64_t n_kv) {
    for (uint64_t i = 0; i < n_kv; i++) {
        GgufKV tmp = {0}, *kv = c->counting ? &tmp : &f->kv[i];
        ER_TRY(cur_str(c, c->counting ? NULL : &kv->key, "key"));
        if (c->counting)
            kv->key = "?";
        ER_TRY(read_value(c, kv));
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        GgufTensor tmp = {0};
        ER_TRY(read_tensor_info(c, c->counting ? &tmp : &f->tensors[i]));
    }
    return ER_OK;
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// The first name given twice among n (sorted copies of the pointers: a file may hold millions), or NULL.
static const char *find_duplicate(char **names, size_t n) {
    qsort(names, n, sizeof *names, cmp_name);
    for (size_t i = 1; i < n; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            return names[i];
    return NULL;
}

static int check_duplicates(const GgufFile *f) {
    size_t n = (size_t)(f->n_kv > f->n_tensors ? f->n_kv : f->n_tensors);
    char **names = er_alloc((n ? n : 1) * sizeof *names);
    if (!names)
        return ER_ENOMEM;
    for (int i = 0; i < f->n_kv; i++)
        names[i] = f->kv[i].key;
    const char *dup = find_duplicate(names, (size_t)f->n_kv);
    int rc = dup ? er_error(ER_EFORMAT, "%s: key \"%s\" appears twice", f->path, dup) : ER_OK;
    for (int i = 0; rc == ER_OK && i < f->n_tensors; i++)
        names[i] = f->tensors[i].name;
    if (rc == ER_OK && (dup = find_duplicate(names, (size_t)f->n_tensors)))
        rc = er_error(ER_EFORMAT, "%s: tensor \"%s\" appears twice", f->path, dup);
    er_free(names);
    return rc;
}

// Alignment, duplicates, and each tensor's data inside the file.
static int check_layout(GgufFile *f, size_t header_end) {
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const GgufKV *al = gguf_find(f, "general.alignment");
    if (al) {
        uint32_t a = 0;
        if (al->type != GGUF_U32 || (memcpy(&a, al->raw, 4), a == 0) || (a & (a - 1)))
            return er_error(ER_EFORMAT, "%s: general.alignment must be a u32 power of two", f->path);
        f->alignment = a;
    }
    ER_TRY(check_duplicates(f));
    size_t data_start = (header_end + f->alignment - 1) / f->alignment * f->alignment;
    if (data_start > f->map_size && f->n_tensors > 0)
        return er_error(ER_EFORMAT, "%s: the file ends before its tensor data starts", f->path);
    for (int i = 0; i < f->n_tensors; i++) {
        GgufTensor *t = &f->tensors[i];
        if (t->offset % f->alignment)
            return er_error(ER_EFORMAT, "%s: tensor \"%s\" has offset %llu, not a multiple of the alignment %u",
                            f->path, t->name, (unsigned long long)t->offset, f->alignment);
        if (t->offset > f->map_size - data_start || t->nbytes > f->map_size - data_start - t->offset)
            return er_error(ER_EFORMAT, "%s: tensor \"%s\" (%zu bytes at offset %llu) lies outside the file", f->path,
                            t->name, t->nbytes, (unsigned long long)t->offset);
        t->data = (const char *)f->map + data_start + t->offset;
    }
    return ER_OK;
}

static int parse(GgufFile *f) {
    Cursor c = {f, f->map, (const unsigned char *)f->map + f->map_size, NULL, 0, 1};
    const void *magic = NULL;
    uint64_t n_tensors, n_kv;
    ER_TRY(cur_bytes(&c, 4, &magic, "magic"));
    if (memcmp(magic, "GGUF", 4) != 0)
        return er_error(ER_EFORMAT, "%s: not a GGUF file (no \"GGUF\" magic)", f->path);
    ER_TRY(cur_u32(&c, &f->version, "version"));
    if (f->version != 3)
        return er_error(ER_EUNSUPPORTED, "%s: GGUF version %u (expected 3)", f->path, f->version);
    ER_TRY(cur_u64(&c, &n_tensors, "tensor count"));
    ER_TRY(cur_u64(&c, &n_kv, "key count"));
    // A key takes at least 8 + 4 + 1 bytes, a tensor info 8 + 4 + 8 + 4 + 8.
    size_t left = (size_t)(c.end - c.p);
    if (n_kv > left / 13 || n_tensors > left / 32 || n_kv > INT32_MAX || n_tensors > INT32_MAX)
        return er_error(ER_EFORMAT, "%s: claims %llu keys and %llu tensors, more than its %zu bytes can hold", f->path,
                        (unsigned long long)n_kv, (unsigned long long)n_tensors, f->map_size);
    const unsigned char *start = c.p;
    ER_TRY(read_header(&c, f, n_tensors, n_kv)); // pass 1: sizes only
    f->kv = er_calloc((size_t)n_kv + 1, sizeof(GgufKV));
    f->tensors = er_calloc((size_t)n_tensors + 1, sizeof(GgufTensor));
    f->arena = er_alloc(c.arena_used + 1);
    if (!f->kv || !f->tensors || !f->arena)
        return er_error(ER_ENOMEM, "%s: out of memory for the header", f->path);
    c = (Cursor){f, start, c.end, f->arena, 0, 0};
    f->n_kv = (int)n_kv;
    f->n_tensors = (int)n_tensors;
    ER_TRY(read_header(&c, f, n_tensors, n_kv)); // pass 2: the copies
    return check_layout(f, (size_t)(c.p - (const unsigned char *)f->map));
}

int gguf_open(GgufFile *f, const char *path) {
    memset(f, 0, sizeof *f);
    if (!path)
        return er_error(ER_EINVAL, "gguf_open: path is NULL");
    ByteRange r;
    ER_TRY(bytes_map_file(&r, path));
    return gguf_open_bytes(f, &r);
}

int gguf_open_bytes(GgufFile *f, ByteRange *bytes) {
    memset(f, 0, sizeof *f);
    bytes_move(&f->bytes, bytes);
    f->map = f->bytes.data;
    f->map_size = f->bytes.size;
    int rc = ER_OK;
    if (f->map_size < 24)
        ER_CHECK(er_error(ER_EFORMAT, "%s: %zu bytes, too small for a GGUF header", f->bytes.name, f->map_size));
    if (!(f->path = er_strdup(f->bytes.name)))
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(parse(f));
done:
    if (rc < 0)
        gguf_close(f);
    return rc;
}

void gguf_close(GgufFile *f) {
    if (!f)
        return;
    bytes_free(&f->bytes);
    for (int i = 0; f->kv && i < f->n_kv; i++)
        er_free(f->kv[i].strs);
    er_free(f->kv);
    er_free(f->tensors);
    er_free(f->arena);
    er_free(f->path);
    memset(f, 0, sizeof *f);
}

const GgufKV *gguf_find(const GgufFile *f, const char *key) {
    for (int i = 0; i < f->n_kv; i++)
        if (strcmp(f->kv[i].key, key) == 0)
            return &f->kv[i];
    return NULL;
}

const GgufTensor *gguf_find_tensor(const GgufFile *f, const char *name) {
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0)
            return &f->tensors[i];
    return NULL;
}

// Element i of a numeric value of type t at raw, widened.
static int64_t raw_int(const void *raw, GgufType t, uint64_t i) {
    const unsigned char *p = (const unsigned char *)raw + i * value_size(t);
    uint64_t u = 0;
    memcpy(&u, p, value_size(t));
    switch (t) {
    case GGUF_I8: return (int8_t)u;
    case GGUF_I16: return (int16_t)u;
    case GGUF_I32: return (int32_t)u;
    default: return (int64_t)u; // unsigned types and i64 (u64 above 2^63 wraps negative: refused by ranges)
    }
}

static int is_int_type(GgufType t) {
    return t == GGUF_U8 || t == GGUF_I8 || t == GGUF_U16 || t == GGUF_I16 || t == GGUF_U32 || t == GGUF_I32 ||
           t == GGUF_U64 || t == GGUF_I64;
}

int64_t gguf_array_int(const GgufKV *kv, uint64_t i) { return raw_int(kv->raw, kv->arr_type, i); }

static int get_kv(const GgufFile *f, const char *key, int optional, const GgufKV **out) {
    *out = gguf_find(f, key);
    if (!*out && !optional)
        return er_error(ER_EFORMAT, "%s: key \"%s\" is missing", f->path, key);
    return ER_OK;
}

static int wrong_type(const GgufFile *f, const GgufKV *kv, const char *want) {
    return er_error(ER_EFORMAT, "%s: key \"%s\" is %s (expected %s)", f->path, kv->key, value_type_name(kv->type),
                    want);
}

int gguf_get_int(const GgufFile *f, const char *key, int optional, int64_t lo, int64_t hi, int64_t *out) {
    const GgufKV *kv;
    ER_TRY(get_kv(f, key, optional, &kv));
    if (!kv)
        return ER_OK;
    if (!is_int_type(kv->type))
        return wrong_type(f, kv, "an integer");
    int64_t v = raw_int(kv->raw, kv->type, 0);
    if (v < lo || v > hi || (kv->type == GGUF_U64 && v < 0))
        return er_error(ER_EFORMAT, "%s: key \"%s\" is %lld (expected %lld to %lld)", f->path, key, (long long)v,
                        (long long)lo, (long long)hi);
    *out = v;
    return ER_OK;
}

int gguf_get_float(const GgufFile *f, const char *key, int optional, double *out) {
    const GgufKV *kv;
    ER_TRY(get_kv(f, key, optional, &kv));
    if (!kv)
        return ER_OK;
    if (kv->type == GGUF_F32) {
        float v;
        memcpy(&v, kv->raw, 4);
        *out = v;
    } else if (kv->type == GGUF_F64) {
        memcpy(out, kv->raw, 8);
    } else {
        return wrong_type(f, kv, "a float");
    }
    return ER_OK;
}

int gguf_get_str(const GgufFile *f, const char *key, int optional, const char **out) {
    const GgufKV *kv;
    ER_TRY(get_kv(f, key, optional, &kv));
    if (!kv)
        return ER_OK;
    if (kv->type != GGUF_STRING)
        return wrong_type(f, kv, "a string");
    *out = kv->str;
    return ER_OK;
}

int gguf_get_bool(const GgufFile *f, const char *key, int optional, int *out) {
    const GgufKV *kv;
    ER_TRY(get_kv(f, key, optional, &kv));
    if (!kv)
        return ER_OK;
    if (kv->type != GGUF_BOOL)
        return wrong_type(f, kv, "a bool");
    *out = *(const unsigned char *)kv->raw != 0;
    return ER_OK;
}

int gguf_get_array(const GgufFile *f, const char *key, GgufType t, int64_t n, const GgufKV **out) {
    ER_TRY(get_kv(f, key, 0, out));
    const GgufKV *kv = *out;
    int ok = kv->type == GGUF_ARRAY && (kv->arr_type == t || (t == GGUF_I32 && is_int_type(kv->arr_type)));
    if (!ok)
        return er_error(ER_EFORMAT, "%s: key \"%s\" is not an array of %s", f->path, key, value_type_name(t));
    if (n >= 0 && kv->n != (uint64_t)n)
        return er_error(ER_EFORMAT, "%s: key \"%s\" has %llu elements (expected %lld)", f->path, key,
                        (unsigned long long)kv->n, (long long)n);
    return ER_OK;
}

// ---- writing ----

static int add_kv(GgufWriter *w, const char *key, GgufType type, GgufType arr_type, uint64_t n, const void *data,
                  size_t bytes) {
    for (int i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0)
            return er_error(ER_EINVAL, "gguf: key \"%s\" set twice", key);
    if (w->n_kv == w->cap_kv) {
        int cap = w->cap_kv ? 2 * w->cap_kv : 32;
        GgufWriteKV *kv = er_realloc_array(w->kv, (size_t)cap, sizeof *kv);
        if (!kv)
            return ER_ENOMEM;
        w->kv = kv;
        w->cap_kv = cap;
    }
    GgufWriteKV *e = &w->kv[w->n_kv];
    *e = (GgufWriteKV){er_strdup(key), type, arr_type, n, er_alloc(bytes ? bytes : 1), bytes};
    if (!e->key || !e->data) {
        er_free(e->key);
        er_free(e->data);
        return ER_ENOMEM;
    }
    memcpy(e->data, data, bytes);
    w->n_kv++;
    return ER_OK;
}

int gguf_set_str(GgufWriter *w, const char *key, const char *s) {
    uint64_t n = strlen(s);
    char *buf = er_alloc(8 + n);
    if (!buf)
        return ER_ENOMEM;
    memcpy(buf, &n, 8);
    memcpy(buf + 8, s, n);
    int rc = add_kv(w, key, GGUF_STRING, 0, 1, buf, 8 + n);
    er_free(buf);
    return rc;
}

int gguf_set_u32(GgufWriter *w, const char *key, uint32_t v) { return add_kv(w, key, GGUF_U32, 0, 1, &v, 4); }
int gguf_set_i32(GgufWriter *w, const char *key, int32_t v) { return add_kv(w, key, GGUF_I32, 0, 1, &v, 4); }
int gguf_set_f32(GgufWriter *w, const char *key, float v) { return add_kv(w, key, GGUF_F32, 0, 1, &v, 4); }
int gguf_set_bool(GgufWriter *w, const char *key, int v) {
    unsigned char b = v != 0;
    return add_kv(w, key, GGUF_BOOL, 0, 1, &b, 1);
}

int gguf_set_i32_array(GgufWriter *w, const char *key, const int32_t *v, size_t n) {
    return add_kv(w, key, GGUF_ARRAY, GGUF_I32, n, v, n * 4);
}

int gguf_set_str_array(GgufWriter *w, const char *key, const char *const *s, size_t n) {
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += 8 + strlen(s[i]);
    char *buf = er_alloc(bytes ? bytes : 1), *p = buf;
    if (!buf)
        return ER_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        uint64_t len = strlen(s[i]);
        memcpy(p, &len, 8);
        memcpy(p + 8, s[i], len);
        p += 8 + len;
    }
    int rc = add_kv(w, key, GGUF_ARRAY, GGUF_STRING, n, buf, bytes);
    er_free(buf);
    return rc;
}

int gguf_add_tensor_owned(GgufWriter *w, const char *name, uint32_t type, int ndim, const uint64_t *ne, void *data,
                          size_t nbytes) {
    size_t block = ggml_type_block(type), numel = 1, want = 0;
    int rc = ER_OK;
    if (!block || ndim < 1 || ndim > GGUF_MAX_DIMS || ne[0] % block)
        ER_CHECK(er_error(ER_EINVAL, "gguf: tensor \"%s\": bad type or shape", name));
    for (int d = 0; d < ndim; d++)
        numel *= (size_t)ne[d];
    want = numel / block * ggml_type_block_bytes(type);
    if (want != nbytes)
        ER_CHECK(er_error(ER_EINVAL, "gguf: tensor \"%s\" has %zu bytes, its shape needs %zu", name, nbytes, want));
    for (int i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            ER_CHECK(er_error(ER_EINVAL, "gguf: tensor \"%s\" added twice", name));
    if (w->n_tensors == w->cap_tensors) {
        int cap = w->cap_tensors ? 2 * w->cap_tensors : 64;
        GgufWriteTensor *t = er_realloc_array(w->tensors, (size_t)cap, sizeof *t);
        if (!t)
            ER_CHECK(ER_ENOMEM);
        w->tensors = t;
        w->cap_tensors = cap;
    }
    GgufWriteTensor *t = &w->tensors[w->n_tensors];
    *t = (GgufWriteTensor){er_strdup(name), type, ndim, {1, 1, 1, 1}, data, nbytes, data};
    if (!t->name)
        ER_CHECK(ER_ENOMEM);
    memcpy(t->ne, ne, (size_t)ndim * sizeof *ne);
    w->n_tensors++;
    return ER_OK;
done:
    er_free(data);
    return rc;
}

int gguf_add_tensor(GgufWriter *w, const char *name, uint32_t type, int ndim, const uint64_t *ne, const void *data,
                    size_t nbytes) {
    ER_TRY(gguf_add_tensor_owned(w, name, type, ndim, ne, NULL, nbytes));
    w->tensors[w->n_tensors - 1].data = data;
    return ER_OK;
}

static int put(FILE *fp, const void *p, size_t n) { return fwrite(p, 1, n, fp) == n ? 0 : -1; }

static int put_str(FILE *fp, const char *s) {
    uint64_t n = strlen(s);
    return put(fp, &n, 8) || put(fp, s, n);
}

static int put_pad(FILE *fp, uint64_t *pos) {
    static const char zeros[GGUF_DEFAULT_ALIGNMENT];
    size_t pad = (GGUF_DEFAULT_ALIGNMENT - *pos % GGUF_DEFAULT_ALIGNMENT) % GGUF_DEFAULT_ALIGNMENT;
    *pos += pad;
    return put(fp, zeros, pad);
}

static int write_body(FILE *fp, const GgufWriter *w) {
    uint32_t version = 3;
    uint64_t nt = (uint64_t)w->n_tensors, nkv = (uint64_t)w->n_kv;
    int bad = put(fp, "GGUF", 4) || put(fp, &version, 4) || put(fp, &nt, 8) || put(fp, &nkv, 8);
    uint64_t pos = 24;
    for (int i = 0; i < w->n_kv && !bad; i++) {
        const GgufWriteKV *kv = &w->kv[i];
        uint32_t t = kv->type, at = kv->arr_type;
        bad = put_str(fp, kv->key) || put(fp, &t, 4) ||
              (t == GGUF_ARRAY && (put(fp, &at, 4) || put(fp, &kv->n, 8))) || put(fp, kv->data, kv->bytes);
        pos += 8 + strlen(kv->key) + 4 + (t == GGUF_ARRAY ? 12 : 0) + kv->bytes;
    }
    uint64_t off = 0;
    for (int i = 0; i < w->n_tensors && !bad; i++) {
        const GgufWriteTensor *t = &w->tensors[i];
        uint32_t nd = (uint32_t)t->ndim;
        bad = put_str(fp, t->name) || put(fp, &nd, 4) || put(fp, t->ne, 8 * nd) || put(fp, &t->type, 4) ||
              put(fp, &off, 8);
        pos += 8 + strlen(t->name) + 4 + 8 * nd + 4 + 8;
        off += (t->nbytes + GGUF_DEFAULT_ALIGNMENT - 1) / GGUF_DEFAULT_ALIGNMENT * GGUF_DEFAULT_ALIGNMENT;
    }
    bad = bad || put_pad(fp, &pos);
    for (int i = 0; i < w->n_tensors && !bad; i++) {
        pos = w->tensors[i].nbytes;
        bad = put(fp, w->tensors[i].data, w->tensors[i].nbytes) || put_pad(fp, &pos);
    }
    return bad ? -1 : 0;
}

int gguf_write(const GgufWriter *w, const char *path) {
    AtomicFile af;
    ER_TRY(atomic_open(&af, path));
    if (write_body(af.fp, w) < 0) {
        atomic_abort(&af);
        return er_error(ER_EIO, "%s: write failed: %s", path, strerror(errno));
    }
    return atomic_commit(&af);
}

void gguf_writer_free(GgufWriter *w) {
    if (!w)
        return;
    for (int i = 0; i < w->n_kv; i++) {
        er_free(w->kv[i].key);
        er_free(w->kv[i].data);
    }
    for (int i = 0; i < w->n_tensors; i++) {
        er_free(w->tensors[i].name);
        er_free(w->tensors[i].owned);
    }
    er_free(w->kv);
    er_free(w->tensors);
    memset(w, 0, sizeof *w);
}
