// GGUF v3 (ggml's docs/gguf.md): a reader over a mapped file or bytes in memory that checks every count, length
// and offset against the bytes before trusting it, and an atomic writer. Layout, little-endian:
//   "GGUF", u32 version (3), u64 n_tensors, u64 n_kv,
//   n_kv x { string key, u32 value type, value }       string = u64 length + bytes (no NUL)
//   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset }
//   padding to general.alignment (u32, default 32), then the tensor data; each offset (relative to the
//   start of the data) is a multiple of the alignment.
// ne[0] is the innermost dimension: an HF matrix [rows, cols] is ne = {cols, rows}, same bytes.
#ifndef CORE_GGUF_H
#define CORE_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "core/bytes.h"

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

typedef enum {
    GGUF_U8 = 0, GGUF_I8 = 1, GGUF_U16 = 2, GGUF_I16 = 3, GGUF_U32 = 4, GGUF_I32 = 5, GGUF_F32 = 6,
    GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_U64 = 10, GGUF_I64 = 11, GGUF_F64 = 12,
    GGUF_TYPE_COUNT
} GgufType;

// The ggml tensor types this code converts (the others are known by name and size only, so files
// holding them open and a loader can refuse them by name).
enum {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7, GGML_Q8_0 = 8,
    GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14, GGML_BF16 = 30
};
#define GGML_QK_K 256 // elements per Q4_K / Q5_K / Q6_K super-block

// 1 when path names a GGUF file (ends in ".gguf"): where a model dir is taken, such a path is a model file.
int gguf_is_path(const char *path);

// Name ("q4_0"), elements per block and bytes per block of a ggml type; 0 / NULL when unknown.
const char *ggml_type_name(uint32_t type);
size_t ggml_type_block(uint32_t type);
size_t ggml_type_block_bytes(uint32_t type);

typedef struct {
    char *key;
    GgufType type;
    GgufType arr_type; // GGUF_ARRAY: the element type (arrays of arrays are refused)
    uint64_t n;        // GGUF_ARRAY: element count; GGUF_STRING: length in bytes
    const void *raw;   // numbers (scalars and arrays): the little-endian bytes in the mapping, unaligned
    char *str;         // GGUF_STRING: a NUL-terminated copy
    char **strs;       // GGUF_ARRAY of strings: n NUL-terminated copies
} GgufKV;

typedef struct {
    char *name;
    uint32_t type;     // ggml type
    int ndim;
    uint64_t ne[GGUF_MAX_DIMS]; // unused dims are 1
    uint64_t offset;   // relative to the data start
    size_t nbytes;
    const void *data;  // into the mapping, aligned to the file's alignment
} GgufTensor;

typedef struct {
    char *path;        // the file's path, or what names the bytes in messages ("<buffer>", "fd 7")
    const void *map;   // the whole file, read-only: bytes.data
    size_t map_size;
    ByteRange bytes;   // what holds them (a mapping, a block of ours or a caller's borrowed buffer)
    uint32_t version, alignment;
    GgufKV *kv;
    int n_kv;
    GgufTensor *tensors;
    int n_tensors;
    char *arena;       // every string copy
} GgufFile;

// Opens and validates: magic, version 3, counts that the file can hold, strings and arrays inside the
// file, known value and tensor types, no duplicate keys or tensor names, at most GGUF_MAX_DIMS dims with
// a size that does not overflow, whole blocks per row, offsets aligned and data inside the file.
// Strings holding a NUL byte are refused. On error nothing stays open; the message names the file.
int gguf_open(GgufFile *f, const char *path);
// The same checks on bytes in memory (a buffer, an fd's range: core/bytes.h), which f takes over (*bytes is
// zeroed; on error they are freed). Messages name the file by bytes->name. gguf_open is this on the mapped
// file.
int gguf_open_bytes(GgufFile *f, ByteRange *bytes);
void gguf_close(GgufFile *f); // safe on a zeroed GgufFile
const GgufKV *gguf_find(const GgufFile *f, const char *key);
const GgufTensor *gguf_find_tensor(const GgufFile *f, const char *name);
// Typed getters: ER_EFORMAT naming the file and key when the key is absent (unless optional, where
// *out is left as it was and ER_OK returned) or holds another type. Integers of any width convert
// when the value fits; floats accept F32 and F64.
int gguf_get_int(const GgufFile *f, const char *key, int optional, int64_t lo, int64_t hi, int64_t *out);
int gguf_get_float(const GgufFile *f, const char *key, int optional, double *out);
int gguf_get_str(const GgufFile *f, const char *key, int optional, const char **out);
int gguf_get_bool(const GgufFile *f, const char *key, int optional, int *out);
// An array of type t with exactly n elements (n = -1: any count, returned in *count).
int gguf_get_array(const GgufFile *f, const char *key, GgufType t, int64_t n, const GgufKV **out);
// Element i of a numeric array as int64 / double.
int64_t gguf_array_int(const GgufKV *kv, uint64_t i);

// ---- writing ----

typedef struct {
    char *key;
    GgufType type, arr_type;
    uint64_t n;
    void *data;        // owned: the value bytes as written (strings: u64 length + bytes each)
    size_t bytes;
} GgufWriteKV;

typedef struct {
    char *name;
    uint32_t type;
    int ndim;
    uint64_t ne[GGUF_MAX_DIMS];
    const void *data;  // nbytes, kept by the caller until gguf_write
    size_t nbytes;
    void *owned;       // data the writer owns (gguf_writer_add_tensor_owned)
} GgufWriteTensor;

typedef struct {
    GgufWriteKV *kv;
    int n_kv, cap_kv;
    GgufWriteTensor *tensors;
    int n_tensors, cap_tensors;
} GgufWriter;

// Values are copied; a key set twice is an error. Keys and tensors are written in the order added.
int gguf_set_str(GgufWriter *w, const char *key, const char *s);
int gguf_set_u32(GgufWriter *w, const char *key, uint32_t v);
int gguf_set_i32(GgufWriter *w, const char *key, int32_t v);
int gguf_set_f32(GgufWriter *w, const char *key, float v);
int gguf_set_bool(GgufWriter *w, const char *key, int v);
int gguf_set_str_array(GgufWriter *w, const char *key, const char *const *s, size_t n);
int gguf_set_i32_array(GgufWriter *w, const char *key, const int32_t *v, size_t n);
// A tensor of ggml type `type`, ne[0..ndim-1]; data must hold exactly its bytes. _owned takes over an
// er_alloc block.
int gguf_add_tensor(GgufWriter *w, const char *name, uint32_t type, int ndim, const uint64_t *ne, const void *data,
                    size_t nbytes);
int gguf_add_tensor_owned(GgufWriter *w, const char *name, uint32_t type, int ndim, const uint64_t *ne, void *data,
                          size_t nbytes);
// Writes GGUF v3 with alignment 32, atomically.
int gguf_write(const GgufWriter *w, const char *path);
void gguf_writer_free(GgufWriter *w); // safe on a zeroed writer

#endif
