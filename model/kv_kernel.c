// The portable int8 KV attention kernels (model/kv_kernel.h) and the table's choice per architecture.
#include "model/kv_kernel.h"

static void scores_portable(float *sc, size_t ld, const float *q, int G, const int8_t *k, const float *ks, size_t row,
                            int NKV, int n, int HS, float scale) {
    for (int g = 0; g < G; g++)
        for (int j = 0; j < n; j++) {
            const int8_t *kr = k + (size_t)j * row;
            const float *qg = q + (size_t)g * HS;
            float d = 0.0f;
#pragma omp simd reduction(+ : d)
            for (int i = 0; i < HS; i++)
                d += qg[i] * (float)kr[i];
            d *= ks[(size_t)j * NKV];
            sc[g * ld + j] = d * scale;
        }
}

static void values_portable(float *o, const float *w, size_t ld, int G, const int8_t *v, const float *vs, size_t row,
                            int NKV, int n, int HS) {
    for (int g = 0; g < G; g++)
        for (int j = 0; j < n; j++) {
            const int8_t *vr = v + (size_t)j * row;
            float *og = o + (size_t)g * HS, wj = w[g * ld + j] * vs[(size_t)j * NKV];
#pragma omp simd
            for (int i = 0; i < HS; i++)
                og[i] += wj * (float)vr[i];
        }
}

const KvI8Kernels kv_i8_portable = {"portable", scores_portable, values_portable};

const KvI8Kernels *kv_i8_kernels(void) {
#if defined(__aarch64__)
    return &kv_i8_neon;
#elif KV_I8_AVX512
    return &kv_i8_avx512;
#elif KV_I8_AVX2
    return &kv_i8_avx2;
#else
    return &kv_i8_portable;
#endif
}
