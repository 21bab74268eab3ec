// The int8 KV cache's attention inner loops as a kernel table (like quant/'s QkKernels, but chosen at compile time): the portable
// kernels are always there and are the reference; on aarch64 the table holds NEON ones (model/kv_neon.c), on
// x86-64 built with AVX2 + FMA AVX2 ones (model/kv_avx2.c), and with AVX-512 too the same kernels 16 lanes wide.
// Both run over n consecutive positions of one KV block, one KV head and the G query heads that share it
// (grouped-query attention), so that each int8 entry is widened once for the G heads: a position's keys or
// values are HS int8 at k + j * row (row = NKV * HS, the cache's stride) with their scale at ks[j * NKV];
// query head g's HS values at q + g * HS (its output at o + g * HS) and its scores or weights at
// sc + g * ld (w + g * ld). Each head's arithmetic does not depend on G.
#ifndef MODEL_KV_KERNEL_H
#define MODEL_KV_KERNEL_H

#include <stddef.h>
#include <stdint.h>

#include "model/kvcache.h"

typedef struct {
    const char *name;
    // sc[g * ld + j] = (Σ_i q[g * HS + i] k[j * row + i]) * ks[j * NKV] * scale, j < n, g < G. Every table
    // sums in the same order, so the scores are the same bits on every CPU: the first HS & ~7 products fused
    // into 8 lanes (element i into lane i % 8, in order), the lanes added as AVX2's vhaddps does (positions in
    // whole groups of 4 from j = 0: ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)); the last n % 4:
    // ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7))), then kv_i8_scores_tail's sum added, then (d * ks) * scale.
    void (*scores)(float *sc, size_t ld, const float *q, int G, const int8_t *k, const float *ks, size_t row, int NKV,
                   int n, int HS, float scale);
    // o[g * HS + i] += (w[g * ld + j] * vs[j * NKV]) * v[j * row + i] for j = 0 .. n-1 in order, i < HS, g < G:
    // fused for i < (HS & ~7), kv_i8_values_tail's unfused add past it, the same bits on every CPU.
    void (*values)(float *o, const float *w, size_t ld, int G, const int8_t *v, const float *vs, size_t row, int NKV,
                   int n, int HS);
} KvI8Kernels;

extern const KvI8Kernels kv_i8_portable;
#if defined(__aarch64__)
extern const KvI8Kernels kv_i8_neon;
#elif defined(__AVX2__) && defined(__FMA__)
#define KV_I8_AVX2 1
extern const KvI8Kernels kv_i8_avx2;
#if defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
// The AVX2 kernels' arithmetic, 16 lanes per register: the same output bits.
#define KV_I8_AVX512 1
extern const KvI8Kernels kv_i8_avx512;
#endif
#endif
// The scalar tail of the scores: Σ q[i] k[i] for i0 <= i < HS, in order from 0, each product rounded.
static inline float kv_i8_scores_tail(const float *q, const int8_t *k, int i0, int HS) {
    float d = 0.0f;
    for (int i = i0; i < HS; i++)
        d += q[i] * (float)k[i];
    return d;
}

// The scalar tail of the SIMD values kernels: o[i] += Σ_j wj[j] * v[j * row + i] for i0 <= i < HS, the
// positions in order (wj: the weights times the positions' scales).
static inline void kv_i8_values_tail(float *o, const float *wj, const int8_t *v, size_t row, int n, int i0, int HS) {
    for (int i = i0; i < HS; i++) {
        float t = o[i];
        for (int j = 0; j < n; j++)
            t += wj[j] * (float)v[(size_t)j * row + i];
        o[i] = t;
    }
}

// wj[h][j] = w[h * ld + j] * vs[j * NKV] for h < H, j < n: the weights of a SIMD values pass's H heads times
// the positions' scales.
static inline void kv_i8_head_weights(float wj[][KV_BLOCK], const float *w, size_t ld, const float *vs, int NKV, int H,
                                      int n) {
    for (int h = 0; h < H; h++)
        for (int j = 0; j < n; j++)
            wj[h][j] = w[h * ld + j] * vs[(size_t)j * NKV];
}

// The table kv_attention_forward uses: NEON on aarch64, AVX-512 or AVX2 where built for it, the portable kernels
// elsewhere.
const KvI8Kernels *kv_i8_kernels(void);

// kv_attention_forward with the given int8 kernels (tests run it with both).
int kv_attention_forward_kernels(const KvI8Kernels *kk, float *out, const float *q, const KVCache *kv, int l,
                                 const int *blocks, const int *pos0, const int *len, int B, int T, int NH,
                                 float *scores, int nthreads, int keys);

#endif
