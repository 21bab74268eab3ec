// AVX2 int8 KV attention kernels (x86-64 built with AVX2 + FMA), the model/kv_kernel.h table there, tested
// against the portable ones. The keys and values are int8 and the queries and weights fp32, so the int8
// entries are widened in registers (vpmovsxbd, vcvtdq2ps) and multiplied in fp32 (FMA), each widened
// register serving several query heads of the KV head's group (with one head the widening is 3 of the 4
// instructions per 8 products):
//   - scores: four positions at a time, one accumulator each per head over HS, reduced together by two
//     rounds of vhaddps into one 4-lane vector, so the horizontal sums cost a quarter of one per position;
//     KV_SCORE_HEADS heads per pass over the block (their 4 accumulators each, the 4 keys and a query: 29 of
//     AVX-512's 32 registers at 6 heads; 3 heads in AVX2's 16 leave one to spill);
//   - values: each head's output stays in registers, 8 elements at a time (more for one or two heads),
//     while every position of the block adds its scaled values to it, so o is loaded and stored once per
//     block instead of once per position (the portable kernel's order per element, fused); up to 8 heads
//     per pass.
// Both are memory-light: a position's int8 keys are a quarter of the fp32 cache's bytes. Built with AVX-512, a
// second table (kv_i8_avx512, the one kv_attention_forward takes) does the same arithmetic 16 lanes wide: two
// positions' keys per register in the scores, 16 output elements per register in the values; its outputs are
// the AVX2 table's bits (tests/model compares them byte for byte).
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "model/kv_kernel.h"

// 16 ymm registers with AVX2, 32 where AVX-512 is there too (its VL encodings).
#if KV_I8_AVX512
#define KV_SCORE_HEADS 6
#else
#define KV_SCORE_HEADS 3
#endif
#define KV_VALUE_HEADS 8

// 8 int8 as 8 fp32 lanes.
static inline __m256 widen8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

// Positions j .. j + 3 (keys at k0) for the H heads at q (H a constant after inlining).
static inline __attribute__((always_inline)) void scores4(float *sc, size_t ld, const float *q, const int H,
                                                          const int8_t *k0, const float *ks, size_t row, int NKV,
                                                          int HS, float scale) {
    int H8 = HS & ~7;
    __m256 a[KV_SCORE_HEADS][4];
#pragma GCC unroll 8
    for (int h = 0; h < H; h++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            a[h][c] = _mm256_setzero_ps();
    for (int i = 0; i < H8; i += 8) {
        __m256 kf[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            kf[c] = widen8(k0 + (size_t)c * row + i);
#pragma GCC unroll 8
        for (int h = 0; h < H; h++) {
            __m256 qv = _mm256_loadu_ps(q + (size_t)h * HS + i);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                a[h][c] = _mm256_fmadd_ps(qv, kf[c], a[h][c]);
        }
    }
    const __m128 kv = _mm_setr_ps(ks[0], ks[NKV], ks[2 * (size_t)NKV], ks[3 * (size_t)NKV]), sv = _mm_set1_ps(scale);
#pragma GCC unroll 8
    for (int h = 0; h < H; h++) {
        // (a0 a1 a2 a3) -> lanes (Σa0, Σa1, Σa2, Σa3)
        __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a[h][0], a[h][1]), _mm256_hadd_ps(a[h][2], a[h][3]));
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
        if (H8 < HS) {
            const float *qh = q + (size_t)h * HS;
            s = _mm_add_ps(s, _mm_setr_ps(kv_i8_scores_tail(qh, k0, H8, HS), kv_i8_scores_tail(qh, k0 + row, H8, HS),
                                          kv_i8_scores_tail(qh, k0 + 2 * row, H8, HS), kv_i8_scores_tail(qh, k0 + 3 * row, H8, HS)));
        }
        _mm_storeu_ps(sc + h * ld, _mm_mul_ps(_mm_mul_ps(s, kv), sv)); // (d * ks) * scale, as the portable kernel
    }
}

#if KV_I8_AVX512
// With AVX-512, positions j and j + 1 share a register (lanes 0-7 and 8-15) against the head's 8 query values
// broadcast to both halves: each half accumulates what scores4's 8-lane accumulator for its position does,
// and the halves are split out before the same two rounds of vhaddps, so the scores are scores4's bits
// (tests/model checks them byte for byte). Up to KV_SCORE_HEADS16 heads per pass.
#define KV_SCORE_HEADS16 8

// The int8 keys of positions at p and p + row, 8 each, as 16 fp32 lanes.
static inline __m512 widen8x2(const int8_t *p, size_t row) {
    __m128i k = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)p), _mm_loadl_epi64((const __m128i *)(p + row)));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(k));
}

static inline __attribute__((always_inline)) void scores4x16(float *sc, size_t ld, const float *q, const int H,
                                                             const int8_t *k0, const float *ks, size_t row, int NKV,
                                                             int HS, float scale) {
    int H8 = HS & ~7;
    __m512 a[KV_SCORE_HEADS16][2]; // head h: positions (0 | 1) and (2 | 3)
#pragma GCC unroll 8
    for (int h = 0; h < H; h++) {
        a[h][0] = _mm512_setzero_ps();
        a[h][1] = _mm512_setzero_ps();
    }
    for (int i = 0; i < H8; i += 8) {
        __m512 k01 = widen8x2(k0 + i, row), k23 = widen8x2(k0 + 2 * row + i, row);
#pragma GCC unroll 8
        for (int h = 0; h < H; h++) {
            __m512 qv = _mm512_broadcast_f32x8(_mm256_loadu_ps(q + (size_t)h * HS + i));
            a[h][0] = _mm512_fmadd_ps(qv, k01, a[h][0]);
            a[h][1] = _mm512_fmadd_ps(qv, k23, a[h][1]);
        }
    }
    const __m128 kv = _mm_setr_ps(ks[0], ks[NKV], ks[2 * (size_t)NKV], ks[3 * (size_t)NKV]), sv = _mm_set1_ps(scale);
#pragma GCC unroll 8
    for (int h = 0; h < H; h++) {
        __m256 a0 = _mm512_castps512_ps256(a[h][0]), a1 = _mm512_extractf32x8_ps(a[h][0], 1);
        __m256 a2 = _mm512_castps512_ps256(a[h][1]), a3 = _mm512_extractf32x8_ps(a[h][1], 1);
        __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
        if (H8 < HS) {
            const float *qh = q + (size_t)h * HS;
            s = _mm_add_ps(s, _mm_setr_ps(kv_i8_scores_tail(qh, k0, H8, HS), kv_i8_scores_tail(qh, k0 + row, H8, HS),
                                          kv_i8_scores_tail(qh, k0 + 2 * row, H8, HS), kv_i8_scores_tail(qh, k0 + 3 * row, H8, HS)));
        }
        _mm_storeu_ps(sc + h * ld, _mm_mul_ps(_mm_mul_ps(s, kv), sv));
    }
}
#endif

// WIDE: positions in fours through scores4x16 (AVX-512), else scores4; the last n % 4 the same in both.
static inline __attribute__((always_inline)) void scores_body(float *sc, size_t ld, const float *q, int G,
                                                              const int8_t *k, const float *ks, size_t row, int NKV,
                                                              int n, int HS, float scale, const int WIDE) {
    int H8 = HS & ~7, j = 0;
#if KV_I8_AVX512
    for (; WIDE && j + 4 <= n; j += 4)
        for (int g = 0; g < G; g += KV_SCORE_HEADS16) {
            float *s = sc + g * ld + j;
            const float *qg = q + (size_t)g * HS;
            const int8_t *k0 = k + (size_t)j * row;
            const float *ks0 = ks + (size_t)j * NKV;
            switch (G - g < KV_SCORE_HEADS16 ? G - g : KV_SCORE_HEADS16) {
            case 1: scores4x16(s, ld, qg, 1, k0, ks0, row, NKV, HS, scale); break;
            case 2: scores4x16(s, ld, qg, 2, k0, ks0, row, NKV, HS, scale); break;
            case 3: scores4x16(s, ld, qg, 3, k0, ks0, row, NKV, HS, scale); break;
            case 4: scores4x16(s, ld, qg, 4, k0, ks0, row, NKV, HS, scale); break;
            case 5: scores4x16(s, ld, qg, 5, k0, ks0, row, NKV, HS, scale); break;
            case 6: scores4x16(s, ld, qg, 6, k0, ks0, row, NKV, HS, scale); break;
            case 7: scores4x16(s, ld, qg, 7, k0, ks0, row, NKV, HS, scale); break;
            default: scores4x16(s, ld, qg, KV_SCORE_HEADS16, k0, ks0, row, NKV, HS, scale); break;
            }
        }
#endif
    for (; j + 4 <= n; j += 4)
        for (int g = 0; g < G; g += KV_SCORE_HEADS) {
            float *s = sc + g * ld + j;
            const float *qg = q + (size_t)g * HS;
            const int8_t *k0 = k + (size_t)j * row;
            const float *ks0 = ks + (size_t)j * NKV;
            switch (G - g < KV_SCORE_HEADS ? G - g : KV_SCORE_HEADS) {
            case 1: scores4(s, ld, qg, 1, k0, ks0, row, NKV, HS, scale); break;
            case 2: scores4(s, ld, qg, 2, k0, ks0, row, NKV, HS, scale); break;
#if KV_SCORE_HEADS > 3
            case 3: scores4(s, ld, qg, 3, k0, ks0, row, NKV, HS, scale); break;
            case 4: scores4(s, ld, qg, 4, k0, ks0, row, NKV, HS, scale); break;
            case 5: scores4(s, ld, qg, 5, k0, ks0, row, NKV, HS, scale); break;
#endif
            default: scores4(s, ld, qg, KV_SCORE_HEADS, k0, ks0, row, NKV, HS, scale); break;
            }
        }
    for (; j < n; j++) { // the last n % 4 positions, a head at a time
        const int8_t *kr = k + (size_t)j * row;
        for (int g = 0; g < G; g++) {
            const float *qg = q + (size_t)g * HS;
            __m256 a = _mm256_setzero_ps();
            for (int i = 0; i < H8; i += 8)
                a = _mm256_fmadd_ps(_mm256_loadu_ps(qg + i), widen8(kr + i), a);
            __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
            s = _mm_hadd_ps(s, s);
            s = _mm_hadd_ps(s, s);
            sc[g * ld + j] = (_mm_cvtss_f32(s) + kv_i8_scores_tail(qg, kr, H8, HS)) * ks[(size_t)j * NKV] * scale;
        }
    }
}

// Columns i .. i + 8 * CC - 1 of the H heads' outputs at o (H, CC constants after inlining); wj (H, KV_BLOCK).
static inline __attribute__((always_inline)) void values_cols(float *o, const float wj[][KV_BLOCK], const int H,
                                                              const int CC, const int8_t *v, size_t row, int n,
                                                              int HS, int i) {
    __m256 a[KV_VALUE_HEADS][4];
#pragma GCC unroll 8
    for (int h = 0; h < H; h++)
#pragma GCC unroll 4
        for (int c = 0; c < CC; c++)
            a[h][c] = _mm256_loadu_ps(o + (size_t)h * HS + i + 8 * c);
    for (int j = 0; j < n; j++) {
        __m256 vf[4];
#pragma GCC unroll 4
        for (int c = 0; c < CC; c++)
            vf[c] = widen8(v + (size_t)j * row + i + 8 * c);
#pragma GCC unroll 8
        for (int h = 0; h < H; h++) {
            __m256 s = _mm256_set1_ps(wj[h][j]);
#pragma GCC unroll 4
            for (int c = 0; c < CC; c++)
                a[h][c] = _mm256_fmadd_ps(s, vf[c], a[h][c]);
        }
    }
#pragma GCC unroll 8
    for (int h = 0; h < H; h++)
#pragma GCC unroll 4
        for (int c = 0; c < CC; c++)
            _mm256_storeu_ps(o + (size_t)h * HS + i + 8 * c, a[h][c]);
}

// The H heads at o over all columns: 8 * CC at a time (CC * H <= 8 accumulator chains), then 8, then the tail.
static inline __attribute__((always_inline)) void values_heads(float *o, const float wj[][KV_BLOCK], const int H,
                                                               const int8_t *v, size_t row, int n, int HS) {
    const int CC = H == 1 ? 4 : H == 2 ? 2 : 1;
    int i = 0;
    for (; i + 8 * CC <= HS; i += 8 * CC)
        values_cols(o, wj, H, CC, v, row, n, HS, i);
    for (; i + 8 <= HS; i += 8)
        values_cols(o, wj, H, 1, v, row, n, HS, i);
    for (int h = 0; h < H; h++)
        kv_i8_values_tail(o + (size_t)h * HS, wj[h], v, row, n, i, HS);
}

static void scores_avx2(float *sc, size_t ld, const float *q, int G, const int8_t *k, const float *ks, size_t row,
                        int NKV, int n, int HS, float scale) {
    scores_body(sc, ld, q, G, k, ks, row, NKV, n, HS, scale, 0);
}

#if KV_I8_AVX512
// With AVX-512 the values go 16 columns per register: each output element still gets one FMA per position, the
// positions in order, so the outputs are the 8-lane kernel's bits (tests/model checks them byte for byte).
static inline __m512 widen16(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

// Columns i .. i + 16 * CC - 1 of the H heads' outputs at o (H, CC constants after inlining).
static inline __attribute__((always_inline)) void values_cols16(float *o, const float wj[][KV_BLOCK], const int H,
                                                                const int CC, const int8_t *v, size_t row, int n,
                                                                int HS, int i) {
    __m512 a[KV_VALUE_HEADS][4];
#pragma GCC unroll 8
    for (int h = 0; h < H; h++)
#pragma GCC unroll 4
        for (int c = 0; c < CC; c++)
            a[h][c] = _mm512_loadu_ps(o + (size_t)h * HS + i + 16 * c);
    for (int j = 0; j < n; j++) {
        __m512 vf[4];
#pragma GCC unroll 4
        for (int c = 0; c < CC; c++)
            vf[c] = widen16(v + (size_t)j * row + i + 16 * c);
#pragma GCC unroll 8
        for (int h = 0; h < H; h++) {
            __m512 s = _mm512_set1_ps(wj[h][j]);
#pragma GCC unroll 4
            for (int c = 0; c < CC; c++)
                a[h][c] = _mm512_fmadd_ps(s, vf[c], a[h][c]);
        }
    }
#pragma GCC unroll 8
    for (int h = 0; h < H; h++)
#pragma GCC unroll 4
        for (int c = 0; c < CC; c++)
            _mm512_storeu_ps(o + (size_t)h * HS + i + 16 * c, a[h][c]);
}

// The H heads at o over all columns: 16 * CC at a time (CC * H <= 16 accumulators), then 16, then 8, then the tail.
static inline __attribute__((always_inline)) void values_heads16(float *o, const float wj[][KV_BLOCK], const int H,
                                                                 const int8_t *v, size_t row, int n, int HS) {
    const int CC = H <= 4 ? 4 : 2;
    int i = 0;
    for (; i + 16 * CC <= HS; i += 16 * CC)
        values_cols16(o, wj, H, CC, v, row, n, HS, i);
    for (; i + 16 <= HS; i += 16)
        values_cols16(o, wj, H, 1, v, row, n, HS, i);
    for (; i + 8 <= HS; i += 8)
        values_cols(o, wj, H, 1, v, row, n, HS, i);
    for (int h = 0; h < H; h++)
        kv_i8_values_tail(o + (size_t)h * HS, wj[h], v, row, n, i, HS);
}
#endif

// n <= KV_BLOCK (one block). WIDE: 16 columns per register (AVX-512), else 8.
static inline __attribute__((always_inline)) void values_body(float *o, const float *w, size_t ld, int G,
                                                              const int8_t *v, const float *vs, size_t row, int NKV,
                                                              int n, int HS, const int WIDE) {
    float wj[KV_VALUE_HEADS][KV_BLOCK];
    for (int g = 0; g < G; g += KV_VALUE_HEADS) {
        int H = G - g < KV_VALUE_HEADS ? G - g : KV_VALUE_HEADS;
        kv_i8_head_weights(wj, w + g * ld, ld, vs, NKV, H, n);
        float *og = o + (size_t)g * HS;
#if KV_I8_AVX512
#define VALUES_H(H)                                                                                        \
    (WIDE ? values_heads16(og, wj, H, v, row, n, HS) : values_heads(og, wj, H, v, row, n, HS))
#else
#define VALUES_H(H) values_heads(og, wj, H, v, row, n, HS)
#endif
        switch (H) {
        case 1: VALUES_H(1); break;
        case 2: VALUES_H(2); break;
        case 3: VALUES_H(3); break;
        case 4: VALUES_H(4); break;
        case 5: VALUES_H(5); break;
        case 6: VALUES_H(6); break;
        case 7: VALUES_H(7); break;
        default: VALUES_H(KV_VALUE_HEADS); break;
        }
#undef VALUES_H
    }
}

static void values_avx2(float *o, const float *w, size_t ld, int G, const int8_t *v, const float *vs, size_t row,
                        int NKV, int n, int HS) {
    values_body(o, w, ld, G, v, vs, row, NKV, n, HS, 0);
}

const KvI8Kernels kv_i8_avx2 = {"AVX2", scores_avx2, values_avx2};

#if KV_I8_AVX512
static void scores_avx512(float *sc, size_t ld, const float *q, int G, const int8_t *k, const float *ks, size_t row,
                          int NKV, int n, int HS, float scale) {
    scores_body(sc, ld, q, G, k, ks, row, NKV, n, HS, scale, 1);
}

static void values_avx512(float *o, const float *w, size_t ld, int G, const int8_t *v, const float *vs, size_t row,
                          int NKV, int n, int HS) {
    values_body(o, w, ld, G, v, vs, row, NKV, n, HS, 1);
}

const KvI8Kernels kv_i8_avx512 = {"AVX-512", scores_avx512, values_avx512};
#endif

#endif
