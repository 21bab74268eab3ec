// safetensors: a reader (of a mapped file or bytes in memory) that enforces every rule of the reference
// implementation, and an atomic writer. Format: 8-byte little-endian header length N, N bytes of UTF-8 JSON, then the
// data buffer. The JSON maps tensor names to {"dtype","shape","data_offsets":[begin,end]}
// (offsets relative to the buffer) plus an optional "__metadata__" string->string map.
#ifndef CORE_SAFETENSORS_H
#define CORE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/bytes.h"
#include "core/dtype.h"

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER (100u * 1000u * 1000u) // the reference limit: 100 MB

typedef struct {
    char *name;
    ErDType dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t nbytes;
    const void *data;   // into the mapping; not necessarily aligned
} StTensor;

typedef struct {
    char *path;         // the file's path, or what names the bytes in messages ("<buffer>", "fd 7")
    const void *map;    // the whole file, read-only: bytes.data
    size_t map_size;
    ByteRange bytes;    // what holds them (a mapping, a block of ours or a caller's borrowed buffer)
    StTensor *tensors;  // in file order (sorted by offset)
    int n_tensors;
    char **meta_keys;   // __metadata__
    char **meta_vals;
    int n_meta;
} StFile;

// Opens and validates. On error nothing is left open and a message naming the file and the
// broken rule is recorded.
// Rules (those of the Rust `safetensors` crate): file >= 8 bytes; N <= ST_MAX_HEADER; 8 + N <=
// file size; header is valid UTF-8 and JSON (parsed by cJSON) starting with '{', trailing
// whitespace allowed; "__metadata__" is null or a string -> string object;
// every other key is a tensor {"dtype","shape","data_offsets"} (other fields ignored) with a
// known dtype, a shape of at most ST_MAX_DIMS non-negative integers and [begin, end] offsets,
// begin <= end; numel * dtype size == end - begin without overflow; sorted by offset the
// tensors cover the data buffer exactly, from 0 with no gap or overlap; no duplicate names.
// Integers must be exact and below 2^53 (cJSON reads numbers as doubles; no real file comes
// near). Refused on purpose: \u0000 and malformed \u escapes, and raw NUL bytes in the header.
int safetensors_open(StFile *f, const char *path);
// The same rules on bytes in memory (a buffer, an fd's range: core/bytes.h), which f takes over (*bytes is
// zeroed; on error they are freed). Messages name the file by bytes->name. safetensors_open is this on the
// mapped file.
int safetensors_open_bytes(StFile *f, ByteRange *bytes);
void safetensors_close(StFile *f);
const StTensor *safetensors_find(const StFile *f, const char *name); // NULL if absent
const char *safetensors_meta(const StFile *f, const char *key);      // NULL if absent
int64_t st_numel(const StTensor *t);

// Copies tensor `name` into dst (numel * dtype size bytes) after checking that it is there with dtype dt
// and exactly the shape shape[0..ndim-1]; otherwise records a message naming the file, the tensor,
// what it holds and what was expected. For fixed-layout files (heads, checkpoints) read into owned buffers.
int safetensors_read_tensor(const StFile *f, const char *name, ErDType dt, int ndim, const int64_t *shape,
                            void *dst);

typedef struct {
    const char *name;
    ErDType dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;   // numel * dtype_size bytes
} StWriteTensor;

// Writes tensors in the given order, header padded with spaces to a multiple of 8, atomically.
// meta_kv holds n_meta key/value pairs: {k0, v0, k1, v1, ...}.
int safetensors_write(const char *path, const StWriteTensor *tensors, int n,
                      const char *const *meta_kv, int n_meta);

#endif
