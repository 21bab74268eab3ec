// The portable int8 KV attention kernels (model/kv_kernel.h) and the table's choice per architecture.
#include "model/kv_kernel.h"

#include <math.h>

// One position's dot product over the first H8 = HS & ~7 elements in 8 fused lanes, reduced in the order of
// the SIMD kernels (kv_kernel.h): grouped, as AVX2 sums 4 positions at once; else as it sums one.
static float dot8(const float *q, const int8_t *k, int H8, int grouped) {
    float l[8] = {0};
    for (int i = 0; i < H8; i += 8)
        for (int c = 0; c < 8; c++)
            l[c] = fmaf(q[i + c], (float)k[i + c], l[c]);
    if (grouped)
        return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

static void scores_portable(float *sc, size_t ld, const float *q, int G, const int8_t *k, const float *ks, size_t row,
                            int NKV, int n, int HS, float scale) {
    int H8 = HS & ~7, n4 = n & ~3;
    for (int g = 0; g < G; g++)
        for (int j = 0; j < n; j++) {
            const int8_t *kr = k + (size_t)j * row;
            const float *qg = q + (size_t)g * HS;
            float d = dot8(qg, kr, H8, j < n4);
            if (j >= n4 || H8 < HS) // AVX2 adds a lone position's tail sum even when it is empty
                d = d + kv_i8_scores_tail(qg, kr, H8, HS);
            sc[g * ld + j] = d * ks[(size_t)j * NKV] * scale;
        }
}

static void values_portable(float *o, const float *w, size_t ld, int G, const int8_t *v, const float *vs, size_t row,
                            int NKV, int n, int HS) {
    int H8 = HS & ~7;
    for (int g = 0; g < G; g++) {
        float *og = o + (size_t)g * HS, wj[KV_BLOCK];
        for (int j = 0; j < n; j++)
            wj[j] = w[g * ld + j] * vs[(size_t)j * NKV];
        for (int i = 0; i < H8; i++) {
            float t = og[i];
            for (int j = 0; j < n; j++)
                t = fmaf(wj[j], (float)v[(size_t)j * row + i], t);
            og[i] = t;
        }
        kv_i8_values_tail(og, wj, v, row, n, H8, HS);
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
