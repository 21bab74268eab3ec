// The KV cache: the inference keeper of keys and values for THE forward. Positions live in fixed
// blocks of KV_BLOCK positions; a sequence is a table of block ids. Blocks are reference-counted,
// so N samples forked from one prompt share the prompt's blocks (stored once, never recomputed);
// a block is copied only when a sequence writes into a block it shares (the prompt's last,
// partly filled block). Entries are fp32, or int8 with one scale per position per KV head (KV8).
// The entries live on a backend (kv_cache_alloc_on: the model's, a GPU's memory for a model placed there);
// the block tables and reference counts stay on the host, and each pass gives the backend's ops a
// table of its rows' blocks (kv_block_table).
#ifndef MODEL_KVCACHE_H
#define MODEL_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

#define KV_BLOCK 32 // positions per block

typedef enum { KV_F32, KV_INT8 } KvType;

typedef struct Backend Backend; // model/backend.h

typedef struct {
    int active;
    int len;      // positions stored
    int n_blocks; // blocks in the table
    int *blocks;  // (max_blocks_per_seq) block ids
} KvSeq;

typedef struct {
    int L, NKV, HS;
    KvType type;
    int n_blocks, max_seqs, max_blocks_per_seq;
    Backend *be;       // where k, v, ks and vs live; everything below them is host memory
    void *k, *v;       // (L, n_blocks, KV_BLOCK, NKV, HS) of float or int8
    float *ks, *vs;    // (L, n_blocks, KV_BLOCK, NKV) int8 scales; NULL for fp32
    int *ref;          // (n_blocks) sequences holding each block
    int *free_ids;     // stack of unused block ids
    int n_free;
    KvSeq *seqs;       // (max_seqs)
    size_t bytes;      // allocated for entries and scales
    long copied_blocks; // copy-on-write events (tests: a fork must not copy the prefix)
} KVCache;

// Bytes of entries (and scales) for `positions` positions of one sequence.
size_t kv_bytes_per_position(const ModelConfig *c, KvType type);
// Bytes kv_cache_alloc reserves for these sizes (SIZE_MAX when that does not fit in a size_t).
size_t kv_cache_bytes(const ModelConfig *c, KvType type, int max_seqs, size_t max_positions);
// Room for `max_positions` positions in all (shared blocks count once), `max_seqs` sequences of at
// most `max_seq_len` positions, the entries on backend be (kv_cache_alloc: the CPU's). Refused up front,
// with the estimate, above max_bytes (0 = no limit).
int kv_cache_alloc_on(KVCache *kv, Backend *be, const ModelConfig *c, KvType type, int max_seqs, int max_seq_len,
                      size_t max_positions, size_t max_bytes);
int kv_cache_alloc(KVCache *kv, const ModelConfig *c, KvType type, int max_seqs, int max_seq_len,
                   size_t max_positions, size_t max_bytes);
void kv_cache_free(KVCache *kv);

int kv_seq_open(KVCache *kv, int *slot);
// A new sequence holding the same positions as `src`, sharing its blocks.
int kv_seq_fork(KVCache *kv, int src, int *slot);
void kv_seq_close(KVCache *kv, int slot);
// Keeps the first `len` positions (prefix reuse across turns).
int kv_seq_truncate(KVCache *kv, int slot, int len);
// Grows the sequence to new_len positions, writable by it alone: allocates blocks and copies a
// shared block before it is written. The forward calls it, then stores keys and values there.
int kv_seq_extend(KVCache *kv, int slot, int new_len);
size_t kv_cache_bytes_in_use(const KVCache *kv); // blocks held by at least one sequence
int kv_cache_blocks_in_use(const KVCache *kv);

// The cache row of position pos of sequence `slot` in every layer: its block id * KV_BLOCK + pos % KV_BLOCK
// (the sequence holds pos).
int kv_row(const KVCache *kv, int slot, int pos);
// table (B, max_blocks_per_seq) = the block ids of sequences slots[b] (what the attention reads).
void kv_block_table(const KVCache *kv, const int *slots, int B, int *table);

// The CPU's kernels of the backend ops kv_store and kv_attention_forward (model/backend.h), for a cache
// on the CPU backend; every argument is host memory.
// Layer l's cache rows dst[n] (kv_row; < 0: skipped) := the keys and values k, v (N, NKV*HS), quantised
// for an int8 cache.
void kv_store_rows(KVCache *kv, int l, const float *k, const float *v, const int *dst, int N);
// Causal grouped-query attention of new queries over the cached keys and values, forward only.
// q, out (B,T,NH,HS); row b's queries are at positions pos0[b] + t for t < len[b] (out's other positions
// are left as they are) and see the cached positions 0..pos0[b]+t, whose blocks are row b of
// blocks (B, max_blocks_per_seq). Same arithmetic order as attention_forward.
// scores (nthreads, NH / NKV, keys): the caller's scratch, a row per thread and query head of a KV head's
// group, keys at least the longest sequence's positions; the op runs on nthreads threads.
int kv_attention_forward(float *out, const float *q, const KVCache *kv, int l, const int *blocks, const int *pos0,
                         const int *len, int B, int T, int NH, float *scores, int nthreads, int keys);

#endif
