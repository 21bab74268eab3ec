// AVX2 int8 KV attention kernels (x86-64 built with AVX2 + FMA), the model/kv_kernel.h table there, tested
// against the portable ones. The keys and values are int8 and the queries and weights fp32, so the int8
// entries are widened in registers (vpmovsxbd, vcvtdq2ps) and multiplied in fp32 (FMA):
//   - scores: four positions at a time, one accumulator each over HS, reduced together by two rounds of
//     vhaddps into one 4-lane vector, so the horizontal sums cost a quarter of one per position;
//   - values: the output row stays in registers, 32 elements at a time, while every position of the
//     block adds its scaled values to it, so o is loaded and stored once per block instead of once per
//     position (the portable kernel's order per element, fused).
// Both are memory-light: a position's int8 keys are a quarter of the fp32 cache's bytes.
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "model/kv_kernel.h"

// 8 int8 as 8 fp32 lanes.
static inline __m256 widen8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

static inline float dot_tail(const float *q, const int8_t *k, int i, int HS) {
    float d = 0.0f;
    for (; i < HS; i++)
        d += q[i] * (float)k[i];
    return d;
}

static void scores_avx2(float *sc, const float *q, const int8_t *k, const float *ks, size_t row, int NKV, int n,
                        int HS, float scale) {
    int H8 = HS & ~7, j = 0;
    for (; j + 4 <= n; j += 4) {
        const int8_t *k0 = k + (size_t)j * row;
        __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int i = 0; i < H8; i += 8) {
            __m256 qv = _mm256_loadu_ps(q + i);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                a[c] = _mm256_fmadd_ps(qv, widen8(k0 + (size_t)c * row + i), a[c]);
        }
        // (a0 a1 a2 a3) -> lanes (Σa0, Σa1, Σa2, Σa3)
        __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        float d[4];
        _mm_storeu_ps(d, s);
        for (int c = 0; c < 4; c++)
            sc[j + c] = (d[c] + dot_tail(q, k0 + (size_t)c * row, H8, HS)) * ks[(size_t)(j + c) * NKV] * scale;
    }
    for (; j < n; j++) {
        const int8_t *kr = k + (size_t)j * row;
        __m256 a = _mm256_setzero_ps();
        for (int i = 0; i < H8; i += 8)
            a = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), widen8(kr + i), a);
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        s = _mm_hadd_ps(s, s);
        s = _mm_hadd_ps(s, s);
        sc[j] = (_mm_cvtss_f32(s) + dot_tail(q, kr, H8, HS)) * ks[(size_t)j * NKV] * scale;
    }
}

// n <= KV_BLOCK (one block).
static void values_avx2(float *o, const float *w, const int8_t *v, const float *vs, size_t row, int NKV, int n,
                        int HS) {
    float wj[KV_BLOCK];
    for (int j = 0; j < n; j++)
        wj[j] = w[j] * vs[(size_t)j * NKV];
    int i = 0;
    for (; i + 32 <= HS; i += 32) {
        __m256 a[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            a[c] = _mm256_loadu_ps(o + i + 8 * c);
        for (int j = 0; j < n; j++) {
            __m256 s = _mm256_set1_ps(wj[j]);
            const int8_t *vr = v + (size_t)j * row + i;
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                a[c] = _mm256_fmadd_ps(s, widen8(vr + 8 * c), a[c]);
        }
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            _mm256_storeu_ps(o + i + 8 * c, a[c]);
    }
    for (; i + 8 <= HS; i += 8) {
        __m256 a = _mm256_loadu_ps(o + i);
        for (int j = 0; j < n; j++)
            a = _mm256_fmadd_ps(_mm256_set1_ps(wj[j]), widen8(v + (size_t)j * row + i), a);
        _mm256_storeu_ps(o + i, a);
    }
    kv_i8_values_tail(o, wj, v, row, n, i, HS);
}

const KvI8Kernels kv_i8_avx2 = {"AVX2", scores_avx2, values_avx2};

#endif
