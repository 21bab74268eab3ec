// The memory store of `erinfer memory` (docs/memory.md): one SQLite file of entries (text, metadata JSON, created
// time, an optional vector stored as int8 with one fp32 scale or as fp16) with an FTS5 index of the text, searched
// by BM25, by an exact vector scan, or both fused by reciprocal rank. Part of the erinfer program (like erinfer
// serve), never of liberinfer: it links libsqlite3. It never prints; errors are one er_error line naming the file.
#ifndef ERINFER_MEMORY_H
#define ERINFER_MEMORY_H

#include <stddef.h>
#include <stdint.h>

#define MEM_FORMAT "erinfer-memory"
#define MEM_VERSION 1
// Reciprocal rank fusion: an entry at rank r (1-based) of a list adds 1 / (MEM_RRF_K + r) to its fused score
// (Cormack, Clarke & Buettcher 2009; 60 is their constant, which damps the weight of the very first ranks).
#define MEM_RRF_K 60
#define MEM_MAX_DIM 65536
#define MEM_MAX_TEXT (16u << 20) // bytes of one entry's text
#define MEM_MAX_K 10000

typedef enum { MEM_VEC_INT8 = 0, MEM_VEC_F16 = 1 } MemVecType;

typedef struct MemStore MemStore;

// Opens the store at path. create 0: the file must exist and be a store; 1: a missing or empty file becomes a new
// store. dim 0: any (a new store's dimension is then fixed by its first vector); dim > 0: the store's must be dim
// (a new store gets it). type is a new store's vector type (an existing store keeps its own). A file that is not
// SQLite, a SQLite file that is not a store, a store of a newer version, a corrupt file (PRAGMA quick_check), or a
// libsqlite3 without FTS5 is refused with one line naming the file.
int mem_open(MemStore **out, const char *path, int create, int dim, MemVecType type);
void mem_close(MemStore *s); // NULL is a no-op

const char *mem_path(const MemStore *s);
int mem_dim(const MemStore *s); // 0: no vector stored yet (and no dimension asked for)
MemVecType mem_vec_type(const MemStore *s);
const char *mem_vec_type_name(MemVecType t); // "int8", "f16"
int mem_vec_type_parse(const char *name, MemVecType *out);
int mem_count(MemStore *s, int64_t *n);

// One entry as stored. text and metadata (a JSON object, "{}" when none was given) are owned: mem_entry_free.
typedef struct {
    int64_t id;
    char *text, *metadata;
    double created; // unix seconds
    int has_vec;
} MemEntry;
void mem_entry_free(MemEntry *e);

// An entry to add. metadata: a JSON object or NULL; vec: dim floats (L2-normalised before storing) or NULL for an
// entry found by BM25 only; created: unix seconds, or < 0 for now.
typedef struct {
    const char *text, *metadata;
    const float *vec;
    int dim;
    double created;
} MemItem;

// Adds one entry (one transaction) with a vector of the store's dimension (or none); *id (may be NULL) gets its id.
// Empty text, metadata that is not a JSON object, a vector with a NaN or infinity, all zeros, or of another
// dimension than the store's: one error each.
int mem_add(MemStore *s, const char *text, const char *metadata_json, const float *vec, int64_t *id);
// Adds n entries in one transaction (all or none); ids (may be NULL) gets n ids.
int mem_add_items(MemStore *s, const MemItem *items, int n, int64_t *ids);
int mem_delete(MemStore *s, int64_t id); // ER_ERANGE when there is no such entry
int mem_get(MemStore *s, int64_t id, MemEntry *out); // ER_ERANGE when there is no such entry

// Filters: every metadata match (top-level key = JSON scalar, compared as SQLite's json_extract gives them) and
// since <= created <= until.
typedef struct {
    char **keys, **values; // values: JSON scalar text ("\"work\"", "3", "true", "null")
    int n;
    double since, until; // -INFINITY / INFINITY: open
} MemFilter;
void mem_filter_init(MemFilter *f);
void mem_filter_free(MemFilter *f);
// Adds key = value, value a JSON scalar (a string quoted: tag="work"); a bad key or value is ER_EINVAL.
int mem_filter_add(MemFilter *f, const char *key, const char *json_value);
// The same from "key=VALUE" (the --where flag), split at the first '='.
int mem_filter_parse(MemFilter *f, const char *spec);

// Calls fn for each entry passing the filter (NULL: all) in id order from offset (skipped entries), at most limit
// (< 0: all); a negative status from fn stops the walk and is returned.
typedef int (*MemListFn)(void *ctx, const MemEntry *e);
int mem_list(MemStore *s, int64_t offset, int64_t limit, const MemFilter *f, MemListFn fn, void *ctx);

// A search: text (NULL or "": no BM25 list), vec (NULL: no vector list; else dim floats, normalised here), or both,
// fused by reciprocal rank. depth: how many of each list's best take part in the fusion (0: max(4 k, 50)).
typedef struct {
    const char *text;
    const float *vec;
    int dim;
    const MemFilter *filter;
    int depth;
} MemQuery;

// One result. Ranks are 1-based, 0 where the entry is not in that list (bm25 / vec_score are then NaN).
typedef struct {
    int64_t id;
    char *text, *metadata;
    double created;
    double bm25;      // FTS5's bm25(): lower is better
    double vec_score; // cosine similarity of the stored (rounded) vector and the query
    int bm25_rank, vec_rank;
    double fused;     // sum over the lists of 1 / (MEM_RRF_K + rank)
} MemHit;

// The best k (<= MEM_MAX_K) hits into hits (k of them), best first; *n gets how many there are. Free the hits'
// strings with mem_hits_free.
int mem_search(MemStore *s, const MemQuery *q, MemHit *hits, int k, int *n);
void mem_hits_free(MemHit *hits, int n);

// The FTS5 MATCH expression a search uses for text: each whitespace-separated word as a quoted string, joined by
// OR, so no user text is FTS5 syntax. NULL out (no word) when text has none. Owned: er_free.
int mem_fts_query(const char *text, char **out);

// Import: one JSON object per line {"text", "metadata"?, "created"?}, all lines in one transaction (a bad line:
// nothing is added, the error names path:line). embed (NULL: entries without vectors) gives each line's vector.
typedef int (*MemEmbedFn)(void *ctx, const char *text, float **vec, int *dim);
int mem_import(MemStore *s, const char *path, MemEmbedFn embed, void *ctx, int64_t *n_added);

// ---- the vector scan (erinfer/memory_scan.c) ----

// y = x / |x| (dim floats; x and y may be the same): what the store keeps and searches with (cosine similarity).
// A NaN, an infinity or all zeros is ER_EINVAL.
int mem_vec_normalize(const float *x, int dim, float *y);

// Symmetric absmax int8: scale = max |x| / 127, codes = round(x / scale) in [-127, 127]; all zeros: scale 0.
void mem_quantize_i8(const float *x, int dim, int8_t *codes, float *scale);

// out[i] = Σ_j rows[i * dim + j] * q[j] (exact int32) for n rows; dim a multiple of MEM_SCAN_ALIGN, codes in
// [-127, 127], rows 64-byte aligned.
#define MEM_SCAN_ALIGN 64
typedef void (*MemDotI8Fn)(const int8_t *rows, int n, int dim, const int8_t *q, int32_t *out);
// The kernel for name ("portable", "avx2", "avx512"), NULL when this CPU or build has none by that name; name NULL:
// the best this CPU has, or the one ER_SIMD names (as quant/matmul.c reads it).
MemDotI8Fn mem_scan_kernel(const char *name, const char **picked);
// fp16 rows against an fp32 query: out[i] = Σ_j f32(rows[i * dim + j]) * q[j] (float sums; dim as above).
typedef void (*MemDotF16Fn)(const uint16_t *rows, int n, int dim, const float *q, float *out);
MemDotF16Fn mem_scan_kernel_f16(const char *name, const char **picked);

#endif
