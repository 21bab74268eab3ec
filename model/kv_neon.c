// NEON int8 KV attention kernels (aarch64, ARMv8.0), the model/kv_kernel.h table on ARM, tested against the
// portable ones. The keys and values are int8 and the queries and weights fp32, so the int8 entries are
// widened in registers (SXTL, SXTL2, SCVTF) and multiplied in fp32 (FMLA):
//   - scores: one position's dot product over HS in four chains of 4 lanes (16 keys per step), the
//     query re-read from L1 for each position;
//   - values: the output row stays in registers, 16 elements at a time, while every position of the
//     block adds its scaled values to it (FMLA by a scalar), so o is loaded and stored once per block
//     instead of once per position. Each element sums the positions in the portable kernel's order, but
//     fused: the portable loops (-std=c11, no contraction) round each product before the add.
#if defined(__aarch64__)
#include <arm_neon.h>

#include "model/kv_kernel.h"

// 16 int8 as four fp32 vectors, and 8 as two.
static inline void widen16(float32x4_t f[4], int8x16_t b) {
    int16x8_t lo = vmovl_s8(vget_low_s8(b)), hi = vmovl_high_s8(b);
    f[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)));
    f[1] = vcvtq_f32_s32(vmovl_high_s16(lo));
    f[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)));
    f[3] = vcvtq_f32_s32(vmovl_high_s16(hi));
}

static inline void widen8(float32x4_t f[2], int8x8_t b) {
    int16x8_t h = vmovl_s8(b);
    f[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(h)));
    f[1] = vcvtq_f32_s32(vmovl_high_s16(h));
}

// One query head's scores.
static void scores_head(float *sc, const float *q, const int8_t *k, const float *ks, size_t row, int NKV, int n,
                        int HS, float scale) {
    for (int j = 0; j < n; j++) {
        const int8_t *kr = k + (size_t)j * row;
        float32x4_t a[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}, f[4];
        int i = 0;
        for (; i + 16 <= HS; i += 16) {
            widen16(f, vld1q_s8(kr + i));
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                a[c] = vfmaq_f32(a[c], vld1q_f32(q + i + 4 * c), f[c]);
        }
        if (i + 8 <= HS) {
            widen8(f, vld1_s8(kr + i));
            a[0] = vfmaq_f32(a[0], vld1q_f32(q + i), f[0]);
            a[1] = vfmaq_f32(a[1], vld1q_f32(q + i + 4), f[1]);
            i += 8;
        }
        float d = vaddvq_f32(vaddq_f32(vaddq_f32(a[0], a[1]), vaddq_f32(a[2], a[3])));
        for (; i < HS; i++)
            d += q[i] * (float)kr[i];
        d *= ks[(size_t)j * NKV];
        sc[j] = d * scale;
    }
}

// One query head's values, n <= KV_BLOCK (one block).
static void values_head(float *o, const float *w, const int8_t *v, const float *vs, size_t row, int NKV, int n,
                        int HS) {
    float wj[KV_BLOCK];
    for (int j = 0; j < n; j++)
        wj[j] = w[j] * vs[(size_t)j * NKV];
    int i = 0;
    for (; i + 16 <= HS; i += 16) {
        float32x4_t a[4] = {vld1q_f32(o + i), vld1q_f32(o + i + 4), vld1q_f32(o + i + 8), vld1q_f32(o + i + 12)}, f[4];
        for (int j = 0; j < n; j++) {
            widen16(f, vld1q_s8(v + (size_t)j * row + i));
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                a[c] = vfmaq_n_f32(a[c], f[c], wj[j]);
        }
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            vst1q_f32(o + i + 4 * c, a[c]);
    }
    for (; i + 8 <= HS; i += 8) {
        float32x4_t a[2] = {vld1q_f32(o + i), vld1q_f32(o + i + 4)}, f[2];
        for (int j = 0; j < n; j++) {
            widen8(f, vld1_s8(v + (size_t)j * row + i));
            a[0] = vfmaq_n_f32(a[0], f[0], wj[j]);
            a[1] = vfmaq_n_f32(a[1], f[1], wj[j]);
        }
        vst1q_f32(o + i, a[0]);
        vst1q_f32(o + i + 4, a[1]);
    }
    kv_i8_values_tail(o, wj, v, row, n, i, HS);
}

// The G query heads of the KV head one after the other (each re-widens the entries).
static void scores_neon(float *sc, size_t ld, const float *q, int G, const int8_t *k, const float *ks, size_t row,
                        int NKV, int n, int HS, float scale) {
    for (int g = 0; g < G; g++)
        scores_head(sc + g * ld, q + (size_t)g * HS, k, ks, row, NKV, n, HS, scale);
}

static void values_neon(float *o, const float *w, size_t ld, int G, const int8_t *v, const float *vs, size_t row,
                        int NKV, int n, int HS) {
    for (int g = 0; g < G; g++)
        values_head(o + (size_t)g * HS, w + g * ld, v, vs, row, NKV, n, HS);
}

const KvI8Kernels kv_i8_neon = {"NEON", scores_neon, values_neon};

#endif
