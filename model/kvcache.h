// The KV cache: the inference keeper of keys and values for THE forward. Positions live in fixed
// blocks of KV_BLOCK positions; a sequence is a table of block ids. Blocks are reference-counted,
// so N samples forked from one prompt share the prompt's blocks (stored once, never recomputed);
// a block is copied only when a sequence writes into a block it shares (the prompt's last,
// partly filled block). Entries are fp32, or int8 with one scale per position per KV head (KV8).
#ifndef MODEL_KVCACHE_H
#define MODEL_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

#define KV_BLOCK 32 // positions per block

typedef enum { KV_F32, KV_INT8 } KvType;

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
// most `max_seq_len` positions. Refused up front, with the estimate, above max_bytes (0 = no limit).
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

// Stores one position's keys and values (NKV*HS floats each) for layer l (quantising for int8).
void kv_store(KVCache *kv, int l, int slot, int pos, const float *k, const float *v);

// Causal grouped-query attention of new queries over a sequence's cached keys and values, forward
// only. q, out (B,T,NH,HS); row b's queries are at positions pos0[b] + t for t < len[b] and see the
// cached positions 0..pos0[b]+t of sequence slots[b]. Same arithmetic order as attention_forward.
// scores (nthreads, NH / NKV, keys): the caller's scratch, a row per thread and query head of a KV head's
// group, keys at least the longest sequence's positions; the op runs on nthreads threads.
int kv_attention_forward(float *out, const float *q, const KVCache *kv, int l, const int *slots, const int *pos0,
                         const int *len, int B, int T, int NH, float *scores, int nthreads, int keys);

#endif
