// Inside the memory store (erinfer/memory.c, erinfer/memory_search.c): the handle and the helpers both files use.
#ifndef ERINFER_MEMORY_IMPL_H
#define ERINFER_MEMORY_IMPL_H

#include <sqlite3.h>

#include "core/strbuf.h"
#include "erinfer/memory.h"

// PRAGMA application_id of a store: "ERM1", so a SQLite file of another program is told apart before any table.
#define MEM_APP_ID 0x45524d31

struct MemStore {
    sqlite3 *db;
    char *path;
    int dim; // 0: not fixed yet
    MemVecType type;
    // The stored vectors in memory for the scan, loaded at the first vector search and kept in step with this
    // handle's writes; another connection's commit (PRAGMA data_version) loads them again.
    int cache_ok;
    int64_t data_version;
    int n, cap, dpad;  // rows, rows allocated, dim padded to MEM_SCAN_ALIGN
    int64_t *ids;      // (n) ascending
    void *rows;        // (n, dpad) int8 codes or fp16 bits, 64-byte aligned
    float *scales;     // (n) int8's per-row scale
};

// The vector blob of one entry: int8: the fp32 scale (little-endian) then dim codes; f16: dim fp16 values.
static inline size_t mem_blob_bytes(MemVecType t, int dim) {
    return t == MEM_VEC_INT8 ? 4 + (size_t)dim : 2 * (size_t)dim;
}

// The one error line of a failed SQLite call: "<path>: <what>: <sqlite's message>".
int mem_sql_fail(MemStore *s, int src, const char *what);
int mem_prepare(MemStore *s, const char *sql, sqlite3_stmt **st);
// mem_meta's format, version, vector type and dimension into s (another connection may have fixed the dimension).
int mem_read_meta(MemStore *s);
// The filter as " AND ..." conditions on entries aliased e, and their parameters bound from index first on
// (returns the next free index).
void mem_filter_sql(const MemFilter *f, StrBuf *sql);
int mem_filter_bind(const MemFilter *f, sqlite3_stmt *st, int first);
// The store's blob of x (s->dim floats): normalised (mem_vec_normalize), then encoded.
int mem_vec_encode(const MemStore *s, const float *x, void *blob);

void mem_cache_free(MemStore *s);
int mem_cache_append(MemStore *s, int64_t id, const void *blob);
void mem_cache_remove(MemStore *s, int64_t id);

#endif
