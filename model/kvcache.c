#include "model/kvcache.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/gemm.h"
#include "model/backend.h"
#include "model/kv_kernel.h"
#include "model/ops.h"

static size_t entry_size(KvType t) { return t == KV_F32 ? sizeof(float) : 1; }

size_t kv_bytes_per_position(const ModelConfig *c, KvType type) {
    size_t row = (size_t)c->NKV * c->HS;
    size_t per_layer = 2 * row * entry_size(type) + (type == KV_INT8 ? 2 * (size_t)c->NKV * sizeof(float) : 0);
    return per_layer * (size_t)c->L;
}

// Blocks for max_positions shared positions, plus one partly filled block of its own per sequence.
static size_t kv_blocks(size_t max_positions, int max_seqs) {
    return max_positions / KV_BLOCK + (max_positions % KV_BLOCK != 0) + (size_t)max_seqs;
}

size_t kv_cache_bytes(const ModelConfig *c, KvType type, int max_seqs, size_t max_positions) {
    size_t blocks = kv_blocks(max_positions, max_seqs);
    size_t per_block = kv_bytes_per_position(c, type) * KV_BLOCK;
    return blocks > SIZE_MAX / per_block ? SIZE_MAX : per_block * blocks;
}

int kv_cache_alloc(KVCache *kv, const ModelConfig *c, KvType type, int max_seqs, int max_seq_len, size_t max_positions,
                   size_t max_bytes) {
    return kv_cache_alloc_on(kv, backend_cpu(), c, type, max_seqs, max_seq_len, max_positions, max_bytes);
}

int kv_cache_alloc_on(KVCache *kv, Backend *be, const ModelConfig *c, KvType type, int max_seqs, int max_seq_len,
                      size_t max_positions, size_t max_bytes) {
    memset(kv, 0, sizeof *kv);
    if (max_seqs <= 0 || max_seq_len <= 0 || max_positions == 0)
        return er_error(ER_EINVAL, "KV cache: sizes must be positive");
    // Block ids are ints: refuse what they cannot number (far beyond any memory).
    size_t n_blocks = kv_blocks(max_positions, max_seqs);
    if (max_positions > (size_t)INT_MAX || n_blocks > (size_t)INT_MAX)
        return er_error(ER_ERANGE, "KV cache: %zu positions in %d sequences is more than this cache can address",
                        max_positions, max_seqs);
    kv->be = be;
    kv->L = c->L;
    kv->NKV = c->NKV;
    kv->HS = c->HS;
    kv->type = type;
    kv->max_seqs = max_seqs;
    kv->max_blocks_per_seq = (max_seq_len + KV_BLOCK - 1) / KV_BLOCK;
    kv->n_blocks = (int)n_blocks;
    size_t per_block = kv_bytes_per_position(c, type) * KV_BLOCK;
    kv->bytes = kv_cache_bytes(c, type, max_seqs, max_positions);
    if (max_bytes && kv->bytes > max_bytes)
        return er_error(ER_ENOMEM, "KV cache for %zu positions (%d sequences) needs %.1f MiB, more than the %.1f MiB "
                        "allowed", max_positions, max_seqs, kv->bytes / 1048576.0, max_bytes / 1048576.0);
    size_t entries = (size_t)c->L * kv->n_blocks * KV_BLOCK * c->NKV * c->HS;
    kv->k = be->ops->alloc(be, entries * entry_size(type));
    kv->v = kv->k ? be->ops->alloc(be, entries * entry_size(type)) : NULL;
    if (type == KV_INT8 && kv->v) { // zeroed: a copied block may carry a scale no store wrote
        size_t scales = (size_t)c->L * kv->n_blocks * KV_BLOCK * c->NKV * sizeof(float);
        kv->ks = be->ops->alloc(be, scales);
        kv->vs = kv->ks ? be->ops->alloc(be, scales) : NULL;
        int rc = kv->vs ? be->ops->zero(be, kv->ks, scales) : ER_OK;
        if (rc == ER_OK && kv->vs)
            rc = be->ops->zero(be, kv->vs, scales);
        if (rc < 0) {
            kv_cache_free(kv);
            return rc;
        }
    }
    kv->ref = er_calloc((size_t)kv->n_blocks, sizeof(int));
    kv->free_ids = er_calloc((size_t)kv->n_blocks, sizeof(int));
    kv->seqs = er_calloc((size_t)max_seqs, sizeof(KvSeq));
    int ok = kv->k && kv->v && kv->ref && kv->free_ids && kv->seqs && (type == KV_F32 || (kv->ks && kv->vs));
    for (int s = 0; ok && s < max_seqs; s++)
        ok = (kv->seqs[s].blocks = er_calloc((size_t)kv->max_blocks_per_seq, sizeof(int))) != NULL;
    if (!ok) {
        kv_cache_free(kv);
        return er_error(ER_ENOMEM, "KV cache: cannot allocate %.1f MiB", (double)per_block * kv->n_blocks / 1048576.0);
    }
    for (int b = 0; b < kv->n_blocks; b++)
        kv->free_ids[b] = kv->n_blocks - 1 - b;
    kv->n_free = kv->n_blocks;
    return ER_OK;
}

void kv_cache_free(KVCache *kv) {
    if (kv->seqs)
        for (int s = 0; s < kv->max_seqs; s++)
            er_free(kv->seqs[s].blocks);
    er_free(kv->seqs);
    if (kv->be) {
        kv->be->ops->free(kv->be, kv->k);
        kv->be->ops->free(kv->be, kv->v);
        kv->be->ops->free(kv->be, kv->ks);
        kv->be->ops->free(kv->be, kv->vs);
    }
    er_free(kv->ref);
    er_free(kv->free_ids);
    memset(kv, 0, sizeof *kv);
}

int kv_seq_open(KVCache *kv, int *slot) {
    for (int s = 0; s < kv->max_seqs; s++)
        if (!kv->seqs[s].active) {
            kv->seqs[s].active = 1;
            kv->seqs[s].len = 0;
            kv->seqs[s].n_blocks = 0;
            *slot = s;
            return ER_OK;
        }
    return er_error(ER_ENOMEM, "KV cache: all %d sequence slots are in use", kv->max_seqs);
}

int kv_seq_fork(KVCache *kv, int src, int *slot) {
    ER_TRY(kv_seq_open(kv, slot));
    KvSeq *d = &kv->seqs[*slot], *s = &kv->seqs[src];
    memcpy(d->blocks, s->blocks, sizeof(int) * (size_t)s->n_blocks);
    d->n_blocks = s->n_blocks;
    d->len = s->len;
    for (int i = 0; i < s->n_blocks; i++)
        kv->ref[s->blocks[i]]++;
    return ER_OK;
}

static void release_block(KVCache *kv, int b) {
    if (--kv->ref[b] == 0)
        kv->free_ids[kv->n_free++] = b;
}

void kv_seq_close(KVCache *kv, int slot) {
    KvSeq *s = &kv->seqs[slot];
    if (!s->active)
        return;
    for (int i = 0; i < s->n_blocks; i++)
        release_block(kv, s->blocks[i]);
    s->active = 0;
    s->n_blocks = s->len = 0;
}

int kv_seq_truncate(KVCache *kv, int slot, int len) {
    KvSeq *s = &kv->seqs[slot];
    if (len < 0 || len > s->len)
        return er_error(ER_EINVAL, "KV cache: cannot truncate %d positions to %d", s->len, len);
    int keep = (len + KV_BLOCK - 1) / KV_BLOCK;
    while (s->n_blocks > keep)
        release_block(kv, s->blocks[--s->n_blocks]);
    s->len = len;
    return ER_OK;
}

static size_t block_offset(const KVCache *kv, int l, int block) {
    return ((size_t)l * kv->n_blocks + block) * KV_BLOCK;
}

static int copy_block(KVCache *kv, int dst, int src) {
    Backend *be = kv->be;
    size_t row = (size_t)kv->NKV * kv->HS, es = entry_size(kv->type);
    for (int l = 0; l < kv->L; l++) {
        size_t od = block_offset(kv, l, dst), os = block_offset(kv, l, src);
        ER_TRY(be->ops->copy(be, (char *)kv->k + od * row * es, (char *)kv->k + os * row * es, KV_BLOCK * row * es));
        ER_TRY(be->ops->copy(be, (char *)kv->v + od * row * es, (char *)kv->v + os * row * es, KV_BLOCK * row * es));
        if (kv->type == KV_INT8) {
            ER_TRY(be->ops->copy(be, kv->ks + od * kv->NKV, kv->ks + os * kv->NKV, KV_BLOCK * kv->NKV * sizeof(float)));
            ER_TRY(be->ops->copy(be, kv->vs + od * kv->NKV, kv->vs + os * kv->NKV, KV_BLOCK * kv->NKV * sizeof(float)));
        }
    }
    kv->copied_blocks++;
    return ER_OK;
}

int kv_seq_extend(KVCache *kv, int slot, int new_len) {
    KvSeq *s = &kv->seqs[slot];
    if (new_len <= s->len)
        return ER_OK;
    int need = (new_len + KV_BLOCK - 1) / KV_BLOCK;
    if (need > kv->max_blocks_per_seq)
        return er_error(ER_ENOMEM, "KV cache: %d positions exceed the %d allowed per sequence", new_len,
                        kv->max_blocks_per_seq * KV_BLOCK);
    // The block holding position `len` may be shared (a forked prompt's last block): copy it first.
    int first = s->len / KV_BLOCK;
    if (first < s->n_blocks && kv->ref[s->blocks[first]] > 1) {
        if (kv->n_free == 0)
            return er_error(ER_ENOMEM, "KV cache is full (%d blocks of %d positions)", kv->n_blocks, KV_BLOCK);
        int b = kv->free_ids[kv->n_free - 1];
        ER_TRY(copy_block(kv, b, s->blocks[first]));
        kv->n_free--;
        kv->ref[b] = 1;
        kv->ref[s->blocks[first]]--;
        s->blocks[first] = b;
    }
    while (s->n_blocks < need) {
        if (kv->n_free == 0)
            return er_error(ER_ENOMEM, "KV cache is full (%d blocks of %d positions)", kv->n_blocks, KV_BLOCK);
        int b = kv->free_ids[--kv->n_free];
        kv->ref[b] = 1;
        s->blocks[s->n_blocks++] = b;
    }
    s->len = new_len;
    return ER_OK;
}

int kv_cache_blocks_in_use(const KVCache *kv) { return kv->n_blocks - kv->n_free; }

size_t kv_cache_bytes_in_use(const KVCache *kv) {
    return kv->n_blocks ? kv->bytes / (size_t)kv->n_blocks * (size_t)kv_cache_blocks_in_use(kv) : 0;
}

// Symmetric int8 with one scale per KV head: x ≈ q * scale, scale = max|x| / 127.
static void quantize_row(int8_t *q, float *scale, const float *x, int HS) {
    float mx = 0.0f;
    for (int i = 0; i < HS; i++)
        mx = fmaxf(mx, fabsf(x[i]));
    float s = mx / 127.0f, inv = s > 0 ? 1.0f / s : 0.0f;
    for (int i = 0; i < HS; i++)
        q[i] = (int8_t)lrintf(x[i] * inv);
    *scale = s;
}

int kv_row(const KVCache *kv, int slot, int pos) {
    return kv->seqs[slot].blocks[pos / KV_BLOCK] * KV_BLOCK + pos % KV_BLOCK;
}

void kv_block_table(const KVCache *kv, const int *slots, int B, int *table) {
    for (int b = 0; b < B; b++) {
        const KvSeq *s = &kv->seqs[slots[b]];
        int *t = table + (size_t)b * kv->max_blocks_per_seq;
        memcpy(t, s->blocks, sizeof(int) * (size_t)s->n_blocks);
        for (int i = s->n_blocks; i < kv->max_blocks_per_seq; i++)
            t[i] = -1;
    }
}

void kv_store_rows(KVCache *kv, int l, const float *k, const float *v, const int *dst, int N) {
    size_t row = (size_t)kv->NKV * kv->HS;
    for (int n = 0; n < N; n++) {
        if (dst[n] < 0)
            continue;
        size_t p = block_offset(kv, l, 0) + (size_t)dst[n];
        const float *kn = k + (size_t)n * row, *vn = v + (size_t)n * row;
        if (kv->type == KV_F32) {
            memcpy((float *)kv->k + p * row, kn, row * sizeof(float));
            memcpy((float *)kv->v + p * row, vn, row * sizeof(float));
            continue;
        }
        for (int h = 0; h < kv->NKV; h++) {
            size_t o = (size_t)h * kv->HS;
            quantize_row((int8_t *)kv->k + p * row + o, &kv->ks[p * kv->NKV + h], kn + o, kv->HS);
            quantize_row((int8_t *)kv->v + p * row + o, &kv->vs[p * kv->NKV + h], vn + o, kv->HS);
        }
    }
}

// The fp32 cache's kernels over n consecutive positions of one KV block and one KV head (a position's HS
// values at k + j * row), portable with GCC's vectors (16 lanes: one AVX-512 register, two AVX2 ones, four NEON
// ones on aarch64), each lane a multiply and then an add, so every CPU computes the same bits.
// scores: sc[j] = (q . k_j) * scale, four positions at a time in two registers (positions j, j + 1 in lanes 0-7
// and 8-15 against the query's 8 values in both halves, likewise j + 2, j + 3), each 8-lane half summed as
// gemm_dot_f32 (core/gemm.h) sums a dot, which takes the last n % 4 positions.
typedef float kv_v16f __attribute__((vector_size(64)));

// lo in lanes 0-7, hi in 8-15 (a macro: a function returning a 64-byte vector changes the ABI without AVX-512, which
// GCC warns about in a portable build).
#define kv_join8(lo, hi) __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)

static void scores_f32(float *sc, const float *q, const float *k, size_t row, int n, int HS, float scale) {
    int H8 = HS & ~7, j = 0;
    gemm_v8f qv, k0, k1, k2, k3;
    for (; j + 4 <= n; j += 4) {
        const float *kj = k + (size_t)j * row;
        kv_v16f a01 = {0}, a23 = {0};
        for (int i = 0; i < H8; i += 8) {
            GEMM_LOAD8(qv, q + i);
            GEMM_LOAD8(k0, kj + i);
            GEMM_LOAD8(k1, kj + row + i);
            GEMM_LOAD8(k2, kj + 2 * row + i);
            GEMM_LOAD8(k3, kj + 3 * row + i);
            kv_v16f q2 = kv_join8(qv, qv);
            a01 += q2 * kv_join8(k0, k1);
            a23 += q2 * kv_join8(k2, k3);
        }
        gemm_v8f a[4] = {__builtin_shufflevector(a01, a01, 0, 1, 2, 3, 4, 5, 6, 7),
                         __builtin_shufflevector(a01, a01, 8, 9, 10, 11, 12, 13, 14, 15),
                         __builtin_shufflevector(a23, a23, 0, 1, 2, 3, 4, 5, 6, 7),
                         __builtin_shufflevector(a23, a23, 8, 9, 10, 11, 12, 13, 14, 15)};
        float d[4];
        gemm_lanes_sum4(a, d);
        for (int c = 0; c < 4; c++) {
            const float *kr = kj + (size_t)c * row;
            for (int i = H8; i < HS; i++)
                d[c] += q[i] * kr[i];
            sc[j + c] = d[c] * scale;
        }
    }
    for (; j < n; j++)
        sc[j] = gemm_dot_f32(q, k + (size_t)j * row, HS) * scale;
}

// values: o[i] += w[j] * v_j[i] for j = 0 .. n-1 in order, 64 (then 16) elements of o held in registers across the
// block (loaded and stored once per block, not once per position).
static void values_f32(float *o, const float *w, const float *v, size_t row, int n, int HS) {
    int i = 0;
    for (; i + 64 <= HS; i += 64) {
        kv_v16f a[4], vv;
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            memcpy(&a[c], o + i + 16 * c, sizeof a[c]);
        for (int j = 0; j < n; j++) {
            kv_v16f wv = {w[j], w[j], w[j], w[j], w[j], w[j], w[j], w[j],
                          w[j], w[j], w[j], w[j], w[j], w[j], w[j], w[j]};
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                memcpy(&vv, v + (size_t)j * row + i + 16 * c, sizeof vv);
                a[c] += wv * vv;
            }
        }
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            memcpy(o + i + 16 * c, &a[c], sizeof a[c]);
    }
    for (; i + 16 <= HS; i += 16) {
        kv_v16f a, vv;
        memcpy(&a, o + i, sizeof a);
        for (int j = 0; j < n; j++) {
            kv_v16f wv = {w[j], w[j], w[j], w[j], w[j], w[j], w[j], w[j],
                          w[j], w[j], w[j], w[j], w[j], w[j], w[j], w[j]};
            memcpy(&vv, v + (size_t)j * row + i, sizeof vv);
            a += wv * vv;
        }
        memcpy(o + i, &a, sizeof a);
    }
    for (; i < HS; i++)
        for (int j = 0; j < n; j++)
            o[i] += w[j] * v[(size_t)j * row + i];
}

// The softmax's max over n scores in 8 lanes (GCC's vectors; a NaN is skipped as by `a > m ? a : m`): exact in
// any order. The sum that follows stays in position order: with the int8 cache, whose kernels round
// differently on x86 and aarch64, a changed order moved a near-tie token of make test-aarch64.
static float softmax_max(const float *x, int n) {
    gemm_v8f m = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY}, v;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        GEMM_LOAD8(v, x + i);
        gemm_v8i gt = v > m;
        m = (gemm_v8f)(((gemm_v8i)v & gt) | ((gemm_v8i)m & ~gt));
    }
    float mx = -INFINITY;
    for (int l = 0; l < 8; l++)
        mx = m[l] > mx ? m[l] : mx;
    for (; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    return mx;
}

// sum[g] = Σ_s x[g * ld + s] for g < G <= KV_SUM_HEADS_MAX, s < n, each head's sum in position order (see
// softmax_max); four heads' chains of dependent adds run side by side, then two, then one (one at a time, the
// adds' latency set the pace).
#define KV_SUM_HEADS_MAX 8
static void softmax_sums(float *sum, const float *x, size_t ld, int G, int n) {
    int g = 0;
    for (; g + 4 <= G; g += 4) {
        const float *x0 = x + g * ld, *x1 = x0 + ld, *x2 = x1 + ld, *x3 = x2 + ld;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (int s = 0; s < n; s++) {
            s0 += x0[s];
            s1 += x1[s];
            s2 += x2[s];
            s3 += x3[s];
        }
        sum[g] = s0;
        sum[g + 1] = s1;
        sum[g + 2] = s2;
        sum[g + 3] = s3;
    }
    for (; g + 2 <= G; g += 2) {
        const float *x0 = x + g * ld, *x1 = x0 + ld;
        float s0 = 0.0f, s1 = 0.0f;
        for (int s = 0; s < n; s++) {
            s0 += x0[s];
            s1 += x1[s];
        }
        sum[g] = s0;
        sum[g + 1] = s1;
    }
    for (; g < G; g++) {
        const float *x0 = x + g * ld;
        float s0 = 0.0f;
        for (int s = 0; s < n; s++)
            s0 += x0[s];
        sum[g] = s0;
    }
}

// Both caches go a block of positions at a time: the int8 one through kk's kernels (model/kv_kernel.h),
// the fp32 one through the two above.
int kv_attention_forward_kernels(const KvI8Kernels *kk, float *out, const float *q, const KVCache *kv, int l,
                                 const int *blocks, const int *pos0, const int *len, int B, int T, int NH,
                                 float *scores, int nthreads, int keys) {
    int NKV = kv->NKV, HS = kv->HS, G = NH / NKV;
    for (int b = 0; b < B; b++)
        if (pos0[b] + len[b] > keys)
            return er_error(ER_EINVAL, "attention: row %d reaches position %d, the scratch holds %d keys", b,
                            pos0[b] + len[b], keys);
    if (!scores || nthreads < 1)
        return er_error(ER_EINVAL, "attention: no scratch for the scores (%d threads)", nthreads);
    size_t row = (size_t)NKV * HS;
    float scale = 1.0f / sqrtf((float)HS);
    int i8 = kv->type == KV_INT8;
    // An item is a (row, KV head, query) with GP of the KV head's G query heads, which share the int8 kernels'
    // widened entries; one thread takes it whole, its GP score rows in its part of the scratch. The group is
    // split into parts where the items would be fewer than two per thread (one sequence, 2 KV heads).
    int items = B * NKV * T, parts = items > 0 && items < 2 * nthreads ? (2 * nthreads + items - 1) / items : 1;
    if (parts > G)
        parts = G;
    int GP = (G + parts - 1) / parts; // heads per part, the last part the rest
    parts = (G + GP - 1) / GP;
#pragma omp parallel for collapse(3) schedule(dynamic, 1) num_threads(nthreads) if (items * parts > 1)
    for (int b = 0; b < B; b++)
        for (int u = 0; u < NKV * parts; u++)
            for (int t = 0; t < T; t++) {
                if (t >= len[b])
                    continue;
                int kh = u / parts, g0 = u % parts * GP, gn = g0 + GP <= G ? GP : G - g0;
                float *sc = scores + (size_t)omp_get_thread_num() * GP * keys;
                const int *seq = blocks + (size_t)b * kv->max_blocks_per_seq;
                int last = pos0[b] + t;
                const float *qv = q + (((size_t)b * T + t) * NH + (size_t)kh * G + g0) * HS;
                for (int s = 0; s <= last; s += KV_BLOCK) {
                    size_t p = block_offset(kv, l, seq[s / KV_BLOCK]) * row + (size_t)kh * HS;
                    int n = last + 1 - s < KV_BLOCK ? last + 1 - s : KV_BLOCK;
                    if (i8)
                        kk->scores(sc + s, keys, qv, gn, (const int8_t *)kv->k + p, kv->ks + p / HS, row, NKV, n, HS,
                                   scale);
                    else
                        for (int g = 0; g < gn; g++)
                            scores_f32(sc + (size_t)g * keys + s, qv + (size_t)g * HS, (const float *)kv->k + p, row,
                                       n, HS, scale);
                }
                for (int g = 0; g < gn; g++) {
                    float *sg = sc + (size_t)g * keys, mx = softmax_max(sg, last + 1);
#pragma omp simd
                    for (int s = 0; s <= last; s++)
                        sg[s] = ops_expf(sg[s] - mx);
                }
                float sum[KV_SUM_HEADS_MAX];
                for (int g0 = 0; g0 < gn; g0 += KV_SUM_HEADS_MAX) {
                    softmax_sums(sum, sc + (size_t)g0 * keys, keys, gn - g0 < KV_SUM_HEADS_MAX ? gn - g0 : KV_SUM_HEADS_MAX,
                                 last + 1);
                    for (int g = g0; g < gn && g < g0 + KV_SUM_HEADS_MAX; g++) {
                        float *sg = sc + (size_t)g * keys, inv = 1.0f / sum[g - g0];
#pragma omp simd
                        for (int s = 0; s <= last; s++)
                            sg[s] *= inv;
                    }
                }
                float *o = out + (((size_t)b * T + t) * NH + (size_t)kh * G + g0) * HS;
                for (size_t i = 0; i < (size_t)gn * HS; i++)
                    o[i] = 0.0f;
                for (int s = 0; s <= last; s += KV_BLOCK) {
                    size_t p = block_offset(kv, l, seq[s / KV_BLOCK]) * row + (size_t)kh * HS;
                    int n = last + 1 - s < KV_BLOCK ? last + 1 - s : KV_BLOCK;
                    if (i8)
                        kk->values(o, sc + s, keys, gn, (const int8_t *)kv->v + p, kv->vs + p / HS, row, NKV, n, HS);
                    else
                        for (int g = 0; g < gn; g++)
                            values_f32(o + (size_t)g * HS, sc + (size_t)g * keys + s, (const float *)kv->v + p, row,
                                       n, HS);
                }
            }
    return ER_OK;
}

int kv_attention_forward(float *out, const float *q, const KVCache *kv, int l, const int *blocks, const int *pos0,
                         const int *len, int B, int T, int NH, float *scores, int nthreads, int keys) {
    return kv_attention_forward_kernels(kv_i8_kernels(), out, q, kv, l, blocks, pos0, len, B, T, NH, scores, nthreads,
                                        keys);
}
