// NEON int8 KV attention kernels (aarch64, ARMv8.0), the model/kv_kernel.h table on ARM, tested against the
// portable ones. The keys and values are int8 and the queries and weights fp32, so the int8 entries are
// widened in registers (SXTL, SXTL2, SCVTF) and multiplied in fp32 (FMLA), each widened register serving up
// to KV_HEADS query heads of the KV head's group:
//   - scores: one position's dot product over HS in two chains of 4 lanes per head (8 keys per step), summed
//     in x86's order (model/kv_kernel.h) so the scores are the same bits as there, the queries re-read from
//     L1 for each position;
//   - values: the heads' output rows stay in registers, 16 elements at a time, while every position of the
//     block adds its scaled values to them (FMLA by a scalar), so o is loaded and stored once per block
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

// Query heads per pass: their accumulators (2 each) and a position's 8 widened keys (2) fit the registers.
#define KV_HEADS 6

// One position (keys at kr) for the H heads at q (H a constant after inlining), the widened keys shared.
// Each head's dot product is x86's bits (kv_kernel.h's order): the first H8 = HS & ~7 products fused into 8
// lanes (lo: elements 0-3 mod 8, hi: 4-7), then grouped (the position is in a whole group of 4, as AVX2
// sums them) ((l0 + l1) + (l2 + l3)) + ((h0 + h1) + (h2 + h3)), else ((l0 + h0) + (l1 + h1)) + ((l2 + h2) +
// (l3 + h3)), then the tail's sum, then (d * ks) * scale.
static inline __attribute__((always_inline)) void scores_pos(float *sc, size_t ld, const float *q, const int H,
                                                             const int8_t *kr, float ks, int HS, float scale,
                                                             int grouped) {
    float32x4_t lo[KV_HEADS], hi[KV_HEADS], f[2];
    int H8 = HS & ~7;
#pragma GCC unroll 8
    for (int h = 0; h < H; h++)
        lo[h] = hi[h] = vdupq_n_f32(0.0f);
    for (int i = 0; i < H8; i += 8) {
        widen8(f, vld1_s8(kr + i));
#pragma GCC unroll 8
        for (int h = 0; h < H; h++) {
            lo[h] = vfmaq_f32(lo[h], vld1q_f32(q + (size_t)h * HS + i), f[0]);
            hi[h] = vfmaq_f32(hi[h], vld1q_f32(q + (size_t)h * HS + i + 4), f[1]);
        }
    }
#pragma GCC unroll 8
    for (int h = 0; h < H; h++) {
        const float *qh = q + (size_t)h * HS;
        float32x4_t p = grouped ? vpaddq_f32(lo[h], hi[h]) : vaddq_f32(lo[h], hi[h]);
        p = vpaddq_f32(p, p);
        float d = vgetq_lane_f32(p, 0) + vgetq_lane_f32(p, 1);
        if (!grouped || H8 < HS)
            d = d + kv_i8_scores_tail(qh, kr, H8, HS);
        sc[h * ld] = d * ks * scale;
    }
}

static void scores_neon(float *sc, size_t ld, const float *q, int G, const int8_t *k, const float *ks, size_t row,
                        int NKV, int n, int HS, float scale) {
    int n4 = n & ~3;
    for (int j = 0; j < n; j++)
        for (int g = 0; g < G; g += KV_HEADS) {
            float *s = sc + g * ld + j;
            const float *qg = q + (size_t)g * HS;
            const int8_t *kr = k + (size_t)j * row;
            float kj = ks[(size_t)j * NKV];
            int gr = j < n4;
            switch (G - g < KV_HEADS ? G - g : KV_HEADS) {
            case 1: scores_pos(s, ld, qg, 1, kr, kj, HS, scale, gr); break;
            case 2: scores_pos(s, ld, qg, 2, kr, kj, HS, scale, gr); break;
            case 3: scores_pos(s, ld, qg, 3, kr, kj, HS, scale, gr); break;
            case 4: scores_pos(s, ld, qg, 4, kr, kj, HS, scale, gr); break;
            case 5: scores_pos(s, ld, qg, 5, kr, kj, HS, scale, gr); break;
            default: scores_pos(s, ld, qg, KV_HEADS, kr, kj, HS, scale, gr); break;
            }
        }
}

// Columns i .. i + 4 * CC - 1 (CC = 4 or 2) of the H heads' outputs at o over the n positions; wj (H, KV_BLOCK).
static inline __attribute__((always_inline)) void values_cols(float *o, const float wj[][KV_BLOCK], const int H,
                                                              const int CC, const int8_t *v, size_t row, int n,
                                                              int HS, int i) {
    float32x4_t a[KV_HEADS][4], f[4];
#pragma GCC unroll 8
    for (int h = 0; h < H; h++)
#pragma GCC unroll 4
        for (int c = 0; c < CC; c++)
            a[h][c] = vld1q_f32(o + (size_t)h * HS + i + 4 * c);
    for (int j = 0; j < n; j++) {
        if (CC == 4)
            widen16(f, vld1q_s8(v + (size_t)j * row + i));
        else
            widen8(f, vld1_s8(v + (size_t)j * row + i));
#pragma GCC unroll 8
        for (int h = 0; h < H; h++)
#pragma GCC unroll 4
            for (int c = 0; c < CC; c++)
                a[h][c] = vfmaq_n_f32(a[h][c], f[c], wj[h][j]);
    }
#pragma GCC unroll 8
    for (int h = 0; h < H; h++)
#pragma GCC unroll 4
        for (int c = 0; c < CC; c++)
            vst1q_f32(o + (size_t)h * HS + i + 4 * c, a[h][c]);
}

static inline __attribute__((always_inline)) void values_heads(float *o, const float wj[][KV_BLOCK], const int H,
                                                               const int8_t *v, size_t row, int n, int HS) {
    int i = 0;
    for (; i + 16 <= HS; i += 16)
        values_cols(o, wj, H, 4, v, row, n, HS, i);
    for (; i + 8 <= HS; i += 8)
        values_cols(o, wj, H, 2, v, row, n, HS, i);
    for (int h = 0; h < H; h++)
        kv_i8_values_tail(o + (size_t)h * HS, wj[h], v, row, n, i, HS);
}

// n <= KV_BLOCK (one block).
static void values_neon(float *o, const float *w, size_t ld, int G, const int8_t *v, const float *vs, size_t row,
                        int NKV, int n, int HS) {
    float wj[KV_HEADS][KV_BLOCK];
    for (int g = 0; g < G; g += KV_HEADS) {
        int H = G - g < KV_HEADS ? G - g : KV_HEADS;
        kv_i8_head_weights(wj, w + g * ld, ld, vs, NKV, H, n);
        float *og = o + (size_t)g * HS;
        switch (H) {
        case 1: values_heads(og, wj, 1, v, row, n, HS); break;
        case 2: values_heads(og, wj, 2, v, row, n, HS); break;
        case 3: values_heads(og, wj, 3, v, row, n, HS); break;
        case 4: values_heads(og, wj, 4, v, row, n, HS); break;
        case 5: values_heads(og, wj, 5, v, row, n, HS); break;
        default: values_heads(og, wj, KV_HEADS, v, row, n, HS); break;
        }
    }
}

const KvI8Kernels kv_i8_neon = {"NEON", scores_neon, values_neon};

#endif
