// NEON decode kernels (aarch64, ARMv8.0: every AArch64 core has Advanced SIMD): the decode entries of
// qk_kernels (quant/qkernel.h) on ARM, the same entries quant/qkernel.c fills with AVX2 / AVX512-VNNI on x86,
// tested against the same portable reference. A weight row is read once and multiplied into all N <= 8 input rows, with
// two q registers (8 lanes) per accumulator chain and input row; packed codes are widened in registers:
//   - q8: int8 -> int16 -> int32 (SXTL) -> fp32 (SCVTF);
//   - q4, q4g: a 16-byte load is two 16-element blocks (quant/weight.h); AND 15 / USHR 4 give 8
//     consecutive codes each, then UXTL, UCVTF (q4g adds one FMLA for u * scale + zero);
//   - q4lut, q2lut: the codes index the row's fp16 codebook with TBL (vqtbl1q_u8): the codebook is
//     split into a table of low bytes and one of high bytes, one lookup each gives 16 halves' bytes,
//     ZIP1/ZIP2 put them back together and FCVTL widens them to fp32; no code ever goes through memory;
//   - bf16: a shift left by 16 (SHLL) is the fp32; f16: FCVTL.
// q8, q4 and q4g (groups of 32, 64, 128) with cols a multiple of 64 (qk_i8_takes) round their inputs to int8 and
// compute exactly what the AVX2 kernels of quant/qkernel.c compute (section "int8 activations" below; SDOT where the CPU
// has dotprod), so that x86 and aarch64 decode the same tokens. For the other widths, where the CPU has
// the dot-product extension (dotprod, SDOT; getauxval HWCAP_ASIMDDP), q8 and q4 run on SDOT against the
// exact fp32 inputs: SDOT multiplies int8 by int8, so each input row is split exactly into four int8 limbs
// first, x = S * (a + b/2^7 + c/2^14 + d/2^21) with S = max|x| / 127 (each limb is what the previous one
// left, times 2^7, rounded), which leaves at most 2^-22 * S of each element out: the products match the
// fp32 kernels to about the last bit of max|x|, not to int8 precision. The integer sums are exact; the
// limbs are combined in double. Where the CPU also has i8mm (SMMLA; HWCAP2_I8MM) and N >= 2, those q8 and
// q4 products run on SMMLA: one instruction multiplies a 2x8 int8 tile (8 elements of one limb of two
// input rows) by an 8x2 one (the same 8 elements of two weight rows) into a 2x2 int32 tile, so every weight
// load and every limb load serves two products, and the sums are the same exact integers SDOT makes:
// SMMLA's outputs equal SDOT's bit for bit. The other q4 groups and the codebook formats have per-group or
// per-code floats, and stay on fp32 FMLA. The GGUF block formats' kernels (quant/qkernel_blocks.c) take SDOT where
// the CPU has dotprod and SMMLA where it also has i8mm, at every N: their SMMLA sums the fp32 terms in another order
// than their SDOT, so N = 1 takes it too and an input's outputs are the same bits at every N. qk_neon_features says
// what the CPU has and what runs.
#if defined(__aarch64__)
#include <arm_neon.h>
#include <math.h>
#include <string.h>
#include <sys/auxv.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/threads.h"
#include "quant/qkernel.h"
#include "quant/quant.h"

#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1 << 13)
#endif

static int has_dotprod(void) { return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0; }
static int has_i8mm(void) { return (getauxval(AT_HWCAP2) & HWCAP2_I8MM) != 0; }

const char *qk_neon_features(void) {
    int dp = has_dotprod(), mm = has_i8mm();
    return dp && mm ? "NEON + dotprod for q8, q4, q4g, the block formats, i8mm for q8, q4, the block formats "
                      "(CPU: dotprod, i8mm)"
           : dp     ? "NEON + dotprod for q8, q4, q4g, the block formats (CPU: dotprod)"
           : mm     ? "NEON (CPU: i8mm without dotprod)"
                    : "NEON";
}

// Eight consecutive weights of a row as fp32.
typedef struct {
    float32x4_t lo, hi;
} W8;

// Independent chains per input row: an FMLA takes 4 cycles on two pipes of a Cortex-A7x, so with one or
// two input rows a single chain, not the loads, would set the pace.
#define NCH(N) ((N) <= 2 ? 4 : (N) <= 4 ? 2 : 1)

// acc (N * NCH(N) * 2): chain `chain` of each input row n += w * inp[n, k..k+7].
static inline __attribute__((always_inline)) void fma8(float32x4_t *acc, W8 w, const float *inp, int K, int k,
                                                       const int N, int chain) {
    const int A = NCH(N);
#pragma GCC unroll 8
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * K + k;
        float32x4_t *a = acc + 2 * (n * A + chain);
        a[0] = vfmaq_f32(a[0], w.lo, vld1q_f32(x));
        a[1] = vfmaq_f32(a[1], w.hi, vld1q_f32(x + 4));
    }
}

static inline W8 w8_u8(uint8x8_t c) {
    uint16x8_t h = vmovl_u8(c);
    return (W8){vcvtq_f32_u32(vmovl_u16(vget_low_u16(h))), vcvtq_f32_u32(vmovl_high_u16(h))};
}

static inline W8 w8_i8(const int8_t *q) {
    int16x8_t h = vmovl_s8(vld1_s8(q));
    return (W8){vcvtq_f32_s32(vmovl_s16(vget_low_s16(h))), vcvtq_f32_s32(vmovl_high_s16(h))};
}

static inline W8 w8_f16(uint16x8_t h) {
    float16x8_t f = vreinterpretq_f16_u16(h);
    return (W8){vcvt_f32_f16(vget_low_f16(f)), vcvt_high_f32_f16(f)};
}

static inline W8 w8_bf16(uint16x8_t h) {
    return (W8){vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)), vreinterpretq_f32_u32(vshll_high_n_u16(h, 16))};
}

static inline W8 w8_affine(W8 u, float32x4_t s, float32x4_t z) {
    return (W8){vfmaq_f32(z, u.lo, s), vfmaq_f32(z, u.hi, s)};
}

// A row's fp16 codebook (levels <= 16 entries) as two byte tables for TBL: low bytes, high bytes.
typedef struct {
    uint8x16_t lo, hi;
} Lut16;

static inline Lut16 lut_load(const uint16_t *cb, int levels) {
    uint16_t t[16] = {0};
    for (int i = 0; i < levels; i++)
        t[i] = cb[i];
    uint8x16x2_t b = vld2q_u8((const uint8_t *)t); // little-endian: even bytes low, odd bytes high
    return (Lut16){b.val[0], b.val[1]};
}

// 16 codes (each < 16) -> their 16 codebook entries as fp32: the first 8 codes' in a, the last 8's in b.
static inline void lut_lookup(W8 *a, W8 *b, Lut16 t, uint8x16_t idx) {
    uint8x16_t lo = vqtbl1q_u8(t.lo, idx), hi = vqtbl1q_u8(t.hi, idx);
    *a = w8_f16(vreinterpretq_u16_u8(vzip1q_u8(lo, hi)));
    *b = w8_f16(vreinterpretq_u16_u8(vzip2q_u8(lo, hi)));
}

// The 16 bytes at p, or the 8 at p with 8 zero bytes after them (the last block of a row).
static inline uint8x16_t load_blocks(const uint8_t *p, int two) {
    return two ? vld1q_u8(p) : vcombine_u8(vld1_u8(p), vdup_n_u8(0));
}

// ---- one row of each format against N inputs: vector part into acc, scalar tail into tail (N) ----

static inline __attribute__((always_inline)) void row_q8(float32x4_t *acc, float *tail, const uint8_t *row,
                                                         const float *inp, int K, const int N) {
    const int A = NCH(N);
    const int8_t *q = (const int8_t *)row;
    int k = 0;
    for (; k + 32 <= K; k += 32)
#pragma GCC unroll 4
        for (int s = 0; s < 4; s++)
            fma8(acc, w8_i8(q + k + 8 * s), inp, K, k + 8 * s, N, s % A);
    for (; k + 8 <= K; k += 8)
        fma8(acc, w8_i8(q + k), inp, K, k, N, 0);
    for (; k < K; k++)
        for (int n = 0; n < N; n++)
            tail[n] += (float)q[k] * inp[(size_t)n * K + k];
}

// 4-bit codes, 16 elements per 8-byte block: one or two blocks from k on (32 elements per step). With
// a group (q4g) each 8 codes become u * s + z first; q4lut looks them up in t instead.
static inline __attribute__((always_inline)) void blocks_q4(float32x4_t *acc, const uint8_t *row, const float *inp,
                                                            int K, int k, int two, const int N, WeightFormat fmt,
                                                            float32x4_t s, float32x4_t z, Lut16 t) {
    const int A = NCH(N);
    uint8x16_t v = load_blocks(row + k / 2, two), lo = vandq_u8(v, vdupq_n_u8(15)), hi = vshrq_n_u8(v, 4);
    W8 w0, w1, w2, w3; // elements k, k+8, k+16, k+24
    if (fmt == WF_Q4LUT) {
        lut_lookup(&w0, &w2, t, lo);
        lut_lookup(&w1, &w3, t, hi);
    } else {
        w0 = w8_u8(vget_low_u8(lo)), w1 = w8_u8(vget_low_u8(hi));
        w2 = w8_u8(vget_high_u8(lo)), w3 = w8_u8(vget_high_u8(hi));
        if (fmt == WF_Q4G)
            w0 = w8_affine(w0, s, z), w1 = w8_affine(w1, s, z), w2 = w8_affine(w2, s, z), w3 = w8_affine(w3, s, z);
    }
    fma8(acc, w0, inp, K, k, N, 0);
    fma8(acc, w1, inp, K, k + 8, N, 1 % A);
    if (two) {
        fma8(acc, w2, inp, K, k + 16, N, 2 % A);
        fma8(acc, w3, inp, K, k + 24, N, 3 % A);
    }
}

// q4 (codes u; the caller subtracts 8 * xsum and scales), q4g (group by group, G % 16 == 0) and q4lut.
static inline __attribute__((always_inline)) void row_q4(float32x4_t *acc, float *tail, const uint8_t *row,
                                                         const float *inp, int K, const int N, const Weight *w, int r,
                                                         WeightFormat fmt) {
    float32x4_t s = vdupq_n_f32(1.0f), z = vdupq_n_f32(0.0f);
    Lut16 t = {vdupq_n_u8(0), vdupq_n_u8(0)};
    float cb[16] = {0};
    if (fmt == WF_Q4LUT) {
        t = lut_load(w->lut + (size_t)r * 16, 16);
        for (int i = 0; i < 16; i++)
            cb[i] = f16_to_f32(w->lut[(size_t)r * 16 + i]);
    }
    int G = fmt == WF_Q4G ? w->group : K & ~15, full = K & ~15;
    for (int g0 = 0; g0 < full; g0 += G) {
        if (fmt == WF_Q4G) {
            size_t gi = (size_t)r * (K / G) + g0 / G;
            s = vdupq_n_f32(f16_to_f32(w->gscale[gi]));
            z = vdupq_n_f32(f16_to_f32(w->gzero[gi]));
        }
        int end = g0 + G, k = g0;
        for (; k + 32 <= end; k += 32)
            blocks_q4(acc, row, inp, K, k, 1, N, fmt, s, z, t);
        if (k < end)
            blocks_q4(acc, row, inp, K, k, 0, N, fmt, s, z, t);
    }
    for (int k = full; k < K; k++) { // q4 and q4lut only: a q4g group is a multiple of 16
        unsigned u = quant_code4(row, K, k);
        float v = fmt == WF_Q4LUT ? cb[u] : (float)u;
        for (int n = 0; n < N; n++)
            tail[n] += v * inp[(size_t)n * K + k];
    }
}

// 2-bit codes, 32 elements per 8-byte block: one or two blocks from k on, looked up in the row's
// 4-entry codebook; the codes at bits 2j of byte i are elements k + 8j + i (block 2: k + 32 + 8j + i).
static inline __attribute__((always_inline)) void blocks_q2(float32x4_t *acc, const uint8_t *row, const float *inp,
                                                            int K, int k, const int two, const int N, Lut16 t) {
    const int A = NCH(N);
    uint8x16_t v = load_blocks(row + k / 4, two), m3 = vdupq_n_u8(3);
    uint8x16_t c[4] = {vandq_u8(v, m3), vandq_u8(vshrq_n_u8(v, 2), m3), vandq_u8(vshrq_n_u8(v, 4), m3), vshrq_n_u8(v, 6)};
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        W8 a, b;
        lut_lookup(&a, &b, t, c[j]);
        fma8(acc, a, inp, K, k + 8 * j, N, j % A);
        if (two)
            fma8(acc, b, inp, K, k + 32 + 8 * j, N, j % A);
    }
}

static inline __attribute__((always_inline)) void row_q2lut(float32x4_t *acc, float *tail, const uint8_t *row,
                                                            const float *inp, int K, const int N, const Weight *w,
                                                            int r) {
    const uint16_t *cbh = w->lut + (size_t)r * 4;
    Lut16 t = lut_load(cbh, 4);
    int full = K & ~31, k = 0;
    for (; k + 64 <= full; k += 64)
        blocks_q2(acc, row, inp, K, k, 1, N, t);
    if (k < full)
        blocks_q2(acc, row, inp, K, k, 0, N, t);
    for (k = full; k < K; k++) {
        float v = f16_to_f32(cbh[quant_code2(row, K, k)]);
        for (int n = 0; n < N; n++)
            tail[n] += v * inp[(size_t)n * K + k];
    }
}

static inline __attribute__((always_inline)) void row_half(float32x4_t *acc, float *tail, const uint8_t *row,
                                                           const float *inp, int K, const int N, WeightFormat fmt) {
    const int A = NCH(N);
    const uint16_t *h = (const uint16_t *)row;
    int k = 0;
    for (; k + 32 <= K; k += 32)
#pragma GCC unroll 4
        for (int s = 0; s < 4; s++) {
            uint16x8_t v = vld1q_u16(h + k + 8 * s);
            fma8(acc, fmt == WF_BF16 ? w8_bf16(v) : w8_f16(v), inp, K, k + 8 * s, N, s % A);
        }
    for (; k + 8 <= K; k += 8) {
        uint16x8_t v = vld1q_u16(h + k);
        fma8(acc, fmt == WF_BF16 ? w8_bf16(v) : w8_f16(v), inp, K, k, N, 0);
    }
    for (; k < K; k++) {
        float v = fmt == WF_BF16 ? bf16_to_f32(h[k]) : f16_to_f32(h[k]);
        for (int n = 0; n < N; n++)
            tail[n] += v * inp[(size_t)n * K + k];
    }
}

// out[n, r] for n < N: row r of w against the N input rows (format and N constants after inlining).
static inline __attribute__((always_inline)) void neon_row(float *out, int R, int r, const Weight *w,
                                                           const float *inp, const float *xsum, const int N,
                                                           const WeightFormat fmt) {
    const int A = NCH(N), K = w->cols;
    float32x4_t acc[QUANT_DECODE_MAX_N * 2];
#pragma GCC unroll 16
    for (int i = 0; i < 2 * N * A; i++)
        acc[i] = vdupq_n_f32(0.0f);
    float tail[QUANT_DECODE_MAX_N] = {0};
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * weight_row_bytes(fmt, K);
    if (fmt == WF_Q8)
        row_q8(acc, tail, row, inp, K, N);
    else if (fmt == WF_Q4 || fmt == WF_Q4G || fmt == WF_Q4LUT)
        row_q4(acc, tail, row, inp, K, N, w, r, fmt);
    else if (fmt == WF_Q2LUT)
        row_q2lut(acc, tail, row, inp, K, N, w, r);
    else
        row_half(acc, tail, row, inp, K, N, fmt);
    float post = fmt == WF_Q8 || fmt == WF_Q4 ? w->scale[r] : 1.0f; // the row scale, once at the end
    for (int n = 0; n < N; n++) {
        float32x4_t a = vaddq_f32(acc[2 * n * A], acc[2 * n * A + 1]);
        for (int i = 1; i < A; i++)
            a = vaddq_f32(a, vaddq_f32(acc[2 * (n * A + i)], acc[2 * (n * A + i) + 1]));
        float t = fmt == WF_Q4 ? tail[n] - 8.0f * xsum[n] : tail[n];
        out[(size_t)n * R + r] = (vaddvq_f32(a) + t) * post;
    }
}

typedef void (*NeonRowFn)(float *out, int R, int r, const Weight *w, const float *inp, const float *xsum);

// ---- int8 activations: q8, q4 and q4g as the AVX2 kernels compute them (quant/qkernel.c) ----
// Where qk_i8_takes says so, the inputs are quantized by the same portable qk_acts_fill as on x86 (same
// codes, same scales, same order of each chunk of 64), and each chunk's integer products land in the same
// eight int32 lanes (block 2c in lanes 0-3, 2c+1 in 4-7, each lane the sum of the same eight products), are
// converted, scaled and accumulated with the same fused multiply-adds and summed across lanes in the same
// order as there: the two CPUs compute the same numbers, so a model decodes the same tokens on both. The
// integer lanes come from SDOT where the CPU has dotprod, else from SMULL + SADDLP + ADDP: the same exact
// integers either way.

typedef int32x4_t (*Dot16Fn)(int32x4_t acc, int8x16_t a, int8x16_t b);

// acc lane j += a[4j..4j+3] · b[4j..4j+3] on ARMv8.0 (what SDOT computes): an int8 product fits int16.
static inline int32x4_t dot16_base(int32x4_t acc, int8x16_t a, int8x16_t b) {
    int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b)), hi = vmull_high_s8(a, b);
    return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)));
}

// The sum of 8 lanes (lo, hi) in the order of the AVX2 kernels' hsum256: ((0+4)+(2+6)) + ((1+5)+(3+7)).
static inline float hsum8(float32x4_t lo, float32x4_t hi) {
    float32x4_t s = vaddq_f32(lo, hi);
    float32x2_t t = vadd_f32(vget_low_f32(s), vget_high_f32(s));
    return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
}

// q4g: y + Σ_g zero_g * (sum of group g's inputs: xs, qk_group_sums), 8 groups per step, as the AVX2 kernel.
static inline float i8_zeros(float y, const uint16_t *gz, const float *xs, int ng) {
    float32x4_t z0 = vdupq_n_f32(0.0f), z1 = vdupq_n_f32(0.0f);
    int g = 0;
    for (; g + 8 <= ng; g += 8) {
        z0 = vfmaq_f32(z0, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(gz + g))), vld1q_f32(xs + g));
        z1 = vfmaq_f32(z1, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(gz + g + 4))), vld1q_f32(xs + g + 4));
    }
    y += hsum8(z0, z1);
    for (; g < ng; g++)
        y += f16_to_f32(gz[g]) * xs[g];
    return y;
}

// Row r of a q8 / q4 / q4g weight against the N quantized inputs. A chunk's four 16-byte weight vectors
// wv[0..3] meet input bytes 0-15, 32-47 (lanes 0-3) and 16-31, 48-63 (lanes 4-7) of the chunk as stored:
// q8: weights 0-15, 16-31, 32-47, 48-63 of the chunk (QK_ORDER_Q8); 4-bit: the low and high nibbles of
// bytes 0-15, then of 16-31 (QK_ORDER_Q4), unsigned codes (q4 subtracts 8 * the row's input sum at the end).
static inline __attribute__((always_inline)) void i8_row(float *out, int R, int r, const Weight *w, const QkActs *a,
                                                         const int N, const WeightFormat fmt, Dot16Fn dot) {
    const int K = w->cols, A = N <= 2 ? 2 : 1; // independent chains, as the AVX2 kernel
    float32x4_t acc[QUANT_DECODE_MAX_N * 2][2];
#pragma GCC unroll 16
    for (int i = 0; i < N * A; i++)
        acc[i][0] = acc[i][1] = vdupq_n_f32(0.0f);
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * weight_row_bytes(fmt, K);
    const int G = fmt == WF_Q4G ? w->group : 32;
    const uint16_t *gs = fmt == WF_Q4G ? w->gscale + (size_t)r * (K / G) : NULL;
    for (int c = 0; c < K / 64; c++) {
        int8x16_t wv[4];
        if (fmt == WF_Q8) {
            for (int i = 0; i < 4; i++)
                wv[i] = vld1q_s8((const int8_t *)row + 64 * c + 16 * i);
        } else {
            uint8x16_t v0 = vld1q_u8(row + 32 * c), v1 = vld1q_u8(row + 32 * c + 16), m15 = vdupq_n_u8(15);
            wv[0] = vreinterpretq_s8_u8(vandq_u8(v0, m15)), wv[1] = vreinterpretq_s8_u8(vshrq_n_u8(v0, 4));
            wv[2] = vreinterpretq_s8_u8(vandq_u8(v1, m15)), wv[3] = vreinterpretq_s8_u8(vshrq_n_u8(v1, 4));
        }
        float32x4_t s0 = vdupq_n_f32(1.0f), s1 = s0;
        if (fmt == WF_Q4G)
            s0 = vdupq_n_f32(f16_to_f32(gs[64 * c / G])), s1 = vdupq_n_f32(f16_to_f32(gs[(64 * c + 32) / G]));
#pragma GCC unroll 8
        for (int n = 0; n < N; n++) {
            const int8_t *xq = a->q + (size_t)n * K + 64 * c;
            const int32x4_t z = vdupq_n_s32(0);
            int32x4_t lo = dot(dot(z, wv[0], vld1q_s8(xq)), wv[1], vld1q_s8(xq + 32));
            int32x4_t hi = dot(dot(z, wv[2], vld1q_s8(xq + 16)), wv[3], vld1q_s8(xq + 48));
            const float *dv = a->dv + (size_t)n * (K / 8) + 8 * c;
            float32x4_t d0 = vld1q_f32(dv), d1 = vld1q_f32(dv + 4);
            if (fmt == WF_Q4G)
                d0 = vmulq_f32(d0, s0), d1 = vmulq_f32(d1, s1);
            float32x4_t *ac = acc[n * A + c % A];
            ac[0] = vfmaq_f32(ac[0], vcvtq_f32_s32(lo), d0);
            ac[1] = vfmaq_f32(ac[1], vcvtq_f32_s32(hi), d1);
        }
    }
    for (int n = 0; n < N; n++) {
        float32x4_t s0 = acc[n * A][0], s1 = acc[n * A][1];
        for (int i = 1; i < A; i++)
            s0 = vaddq_f32(s0, acc[n * A + i][0]), s1 = vaddq_f32(s1, acc[n * A + i][1]);
        float y = hsum8(s0, s1);
        if (fmt == WF_Q4G)
            y = i8_zeros(y, w->gzero + (size_t)r * (K / G), a->xs + (size_t)n * (K / 32), K / G);
        else if (fmt == WF_Q4)
            y = (y - 8.0f * a->xsum[n]) * w->scale[r];
        else
            y = y * w->scale[r];
        out[(size_t)n * R + r] = y;
    }
}

typedef void (*I8RowsFn)(float *out, const Weight *w, const QkActs *a, int N);

// All rows of w for one format and one way to the integer lanes (DOT), N a constant inside.
#define QK_I8_ROWS(FMT, name, DOT)                                                                                \
    static void i8_##name##_##DOT(float *out, const Weight *w, const QkActs *a, int N) {                          \
        _Pragma("omp parallel for schedule(static) if ((long)w->rows * w->cols * N >= THREADS_MIN_WORK)")        \
        for (int r = 0; r < w->rows; r++) {                                                                       \
            switch (N) {                                                                                          \
            case 1: i8_row(out, w->rows, r, w, a, 1, FMT, DOT); break;                                            \
            case 2: i8_row(out, w->rows, r, w, a, 2, FMT, DOT); break;                                            \
            case 3: i8_row(out, w->rows, r, w, a, 3, FMT, DOT); break;                                            \
            case 4: i8_row(out, w->rows, r, w, a, 4, FMT, DOT); break;                                            \
            case 5: i8_row(out, w->rows, r, w, a, 5, FMT, DOT); break;                                            \
            case 6: i8_row(out, w->rows, r, w, a, 6, FMT, DOT); break;                                            \
            case 7: i8_row(out, w->rows, r, w, a, 7, FMT, DOT); break;                                            \
            default: i8_row(out, w->rows, r, w, a, 8, FMT, DOT); break;                                           \
            }                                                                                                     \
        }                                                                                                         \
    }

QK_I8_ROWS(WF_Q8, q8, dot16_base)
QK_I8_ROWS(WF_Q4, q4, dot16_base)
QK_I8_ROWS(WF_Q4G, q4g, dot16_base)

// ---- dotprod: q8 and q4 on SDOT against the input rows split into int8 limbs ----

#define QK_LIMBS 4
static const double limb_weight[QK_LIMBS] = {1.0, 0x1p-7, 0x1p-14, 0x1p-21}; // limb j counts 2^(-7 j)
typedef struct {
    int8_t *limb; // (N, QK_LIMBS, K): limb j of input row n at limb + (n * QK_LIMBS + j) * K
    float *scale; // (N): S of each row (0 for an all-zero row)
} Limbs;

// inp (N, K) -> limbs: t = x / S, then a = rint(t), b = rint((t - a) * 2^7), ... Each subtraction and
// each scaling by 2^7 is exact in fp32, so the limbs carry t to 2^-22 (t itself is x / S rounded once).
static int limbs_make(Limbs *L, const float *inp, int N, int K) {
    L->limb = er_alloc((size_t)N * QK_LIMBS * (size_t)K);
    L->scale = er_alloc(sizeof(float) * (size_t)N);
    if (!L->limb || !L->scale) {
        er_free(L->limb);
        er_free(L->scale);
        return er_error(ER_ENOMEM, "quant_matmul_decode: no memory for %d x %d input limbs", N, K);
    }
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * K;
        float mx = 0.0f;
        for (int k = 0; k < K; k++)
            mx = fmaxf(mx, fabsf(x[k]));
        float S = mx / 127.0f;
        L->scale[n] = S;
        int8_t *lb = L->limb + (size_t)n * QK_LIMBS * K;
        for (int k = 0; k < K; k++) {
            float t = S > 0 ? x[k] / S : 0.0f;
            for (int j = 0; j < QK_LIMBS; j++) {
                float a = rintf(t);
                lb[(size_t)j * K + k] = (int8_t)a;
                t = (t - a) * 128.0f;
            }
        }
    }
    return ER_OK;
}

#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")

// 16 consecutive weights from k as int8: q8's bytes, or q4's codes - 8 (a 16-element block is 8 bytes:
// low nibbles k..k+7, high nibbles k+8..k+15).
static inline int8x16_t sdot_w16(const uint8_t *row, int k, const WeightFormat fmt) {
    if (fmt == WF_Q8)
        return vld1q_s8((const int8_t *)row + k);
    uint8x8_t v = vld1_u8(row + k / 2);
    uint8x16_t c = vcombine_u8(vand_u8(v, vdup_n_u8(15)), vshr_n_u8(v, 4));
    return vsubq_s8(vreinterpretq_s8_u8(c), vdupq_n_s8(8));
}

// Limbs j0 .. j0+J-1 of the N input rows against row r: their exact integer dot products into d (N, J).
static inline __attribute__((always_inline)) void sdot_pass(int32_t *d, const uint8_t *row, const Limbs *L, int K,
                                                            int full, const int N, const int J, int j0,
                                                            const WeightFormat fmt) {
    int32x4_t acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < N * J; i++)
        acc[i] = vdupq_n_s32(0);
    for (int k = 0; k < full; k += 16) {
        int8x16_t w = sdot_w16(row, k, fmt);
#pragma GCC unroll 8
        for (int n = 0; n < N; n++)
#pragma GCC unroll 4
            for (int j = 0; j < J; j++)
                acc[n * J + j] = vdotq_s32(acc[n * J + j], w, vld1q_s8(L->limb + ((size_t)n * QK_LIMBS + j0 + j) * K + k));
    }
    for (int i = 0; i < N * J; i++)
        d[i] = vaddvq_s32(acc[i]);
}

// out[n, r] from the limbs' exact sums dot (combined in double, limb 0 first) and the last K % 16 elements
// against the fp32 input row n; the SDOT and the SMMLA kernels both end here, so their numbers are the same.
static inline void limbs_out(float *out, int R, int r, const Weight *w, const float *inp, const Limbs *L, int n,
                             double dot, const uint8_t *row, int full, const WeightFormat fmt) {
    const int K = w->cols;
    double t = 0;
    for (int k = full; k < K; k++) {
        float c = fmt == WF_Q8 ? (float)((const int8_t *)row)[k] : (float)quant_code4(row, K, k) - 8.0f;
        t += c * inp[(size_t)n * K + k];
    }
    out[(size_t)n * R + r] = (float)(w->scale[r] * ((double)L->scale[n] * dot + t));
}

static inline __attribute__((always_inline)) void sdot_row(float *out, int R, int r, const Weight *w,
                                                           const float *inp, const Limbs *L, const int N,
                                                           const WeightFormat fmt) {
    const int K = w->cols, full = K & ~15, J = N <= 4 ? 4 : 2; // N * J <= 16 accumulators
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * weight_row_bytes(fmt, K);
    double dot[QUANT_DECODE_MAX_N] = {0};
    for (int j0 = 0; j0 < QK_LIMBS; j0 += J) {
        int32_t d[16];
        sdot_pass(d, row, L, K, full, N, J, j0, fmt);
        for (int n = 0; n < N; n++)
            for (int j = 0; j < J; j++)
                dot[n] += (double)d[n * J + j] * limb_weight[j0 + j];
    }
    for (int n = 0; n < N; n++)
        limbs_out(out, R, r, w, inp, L, n, dot[n], row, full, fmt);
}

typedef void (*SdotRowFn)(float *out, int R, int r, const Weight *w, const float *inp, const Limbs *L);

#define QK_SDOT_ROW(FMT, name, N)                                                                                 \
    static void sdot_##name##_##N(float *out, int R, int r, const Weight *w, const float *inp, const Limbs *L) {    \
        sdot_row(out, R, r, w, inp, L, N, FMT);                                                                   \
    }
#define QK_SDOT_FORMAT(FMT, name)                                                                                 \
    QK_SDOT_ROW(FMT, name, 1) QK_SDOT_ROW(FMT, name, 2) QK_SDOT_ROW(FMT, name, 3) QK_SDOT_ROW(FMT, name, 4)      \
    QK_SDOT_ROW(FMT, name, 5) QK_SDOT_ROW(FMT, name, 6) QK_SDOT_ROW(FMT, name, 7) QK_SDOT_ROW(FMT, name, 8)      \
    static const SdotRowFn sdot_##name[QUANT_DECODE_MAX_N] = {sdot_##name##_1, sdot_##name##_2, sdot_##name##_3,  \
                                                              sdot_##name##_4, sdot_##name##_5, sdot_##name##_6,  \
                                                              sdot_##name##_7, sdot_##name##_8};

QK_SDOT_FORMAT(WF_Q8, q8)
QK_SDOT_FORMAT(WF_Q4, q4)

// SDOT: the lanes dot16_base makes, in one instruction.
static inline int32x4_t dot16_dp(int32x4_t acc, int8x16_t a, int8x16_t b) { return vdotq_s32(acc, a, b); }

QK_I8_ROWS(WF_Q8, q8, dot16_dp)
QK_I8_ROWS(WF_Q4, q4, dot16_dp)
QK_I8_ROWS(WF_Q4G, q4g, dot16_dp)

#pragma GCC pop_options

// ---- i8mm: q8 and q4 on SMMLA, two input rows against two weight rows per instruction ----

#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod+i8mm")

// SMMLA's left operands for every pair of input rows: limb j of rows 2p and 2p+1, 8 elements at a time side
// by side, in the order the kernel reads them: (full / 16 steps, P, QK_LIMBS, 2 halves, 16 bytes) with
// P = (N + 1) / 2, so one step's tiles are contiguous; the row after an odd N's last is zeros.
static int8_t *limbs_pair(const Limbs *L, int N, int K, int full) {
    int P = (N + 1) / 2;
    int8_t *m = er_calloc((size_t)P * QK_LIMBS * full * 2 + 16, 1);
    for (int n = 0; m && n < N; n++)
        for (int j = 0; j < QK_LIMBS; j++)
            for (int c = 0; c < full / 8; c++)
                memcpy(m + (((size_t)(c / 2) * P + n / 2) * QK_LIMBS + j) * 32 + (c % 2) * 16 + (n % 2) * 8,
                       L->limb + ((size_t)n * QK_LIMBS + j) * K + 8 * c, 8);
    return m;
}

// Weights k..k+15 of rows r0 and r1 as SMMLA's right operands: b[h] holds elements k + 8h .. k + 8h + 7 of
// r0, then the same of r1. q4: the two rows' 8-byte blocks side by side; their low nibbles are b[0], their
// high nibbles b[1] (quant/weight.h's block layout), minus 8.
static inline void mmla_w16(int8x16_t b[2], const uint8_t *r0, const uint8_t *r1, int k, const WeightFormat fmt) {
    if (fmt == WF_Q8) {
        int64x2_t a = vreinterpretq_s64_u8(vld1q_u8(r0 + k)), c = vreinterpretq_s64_u8(vld1q_u8(r1 + k));
        b[0] = vreinterpretq_s8_s64(vzip1q_s64(a, c));
        b[1] = vreinterpretq_s8_s64(vzip2q_s64(a, c));
        return;
    }
    uint8x16_t v = vcombine_u8(vld1_u8(r0 + k / 2), vld1_u8(r1 + k / 2));
    b[0] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(15))), vdupq_n_s8(8));
    b[1] = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8(8));
}

// Weight rows r and r + 1 against the N input rows: P * QK_LIMBS <= 16 accumulators of 2x2 int32 tiles
// [x_2p · w_r, x_2p · w_r+1, x_2p+1 · w_r, x_2p+1 · w_r+1], exact like SDOT's sums and combined the same way.
static inline __attribute__((always_inline)) void mmla_rows(float *out, int R, int r, const Weight *w,
                                                            const float *inp, const Limbs *L, const int8_t *m,
                                                            const int N, const WeightFormat fmt) {
    const int K = w->cols, full = K & ~15, P = (N + 1) / 2;
    const size_t rb = weight_row_bytes(fmt, K);
    const uint8_t *r0 = (const uint8_t *)w->data + (size_t)r * rb, *r1 = r0 + rb;
    int32x4_t acc[4 * QK_LIMBS];
#pragma GCC unroll 16
    for (int i = 0; i < P * QK_LIMBS; i++)
        acc[i] = vdupq_n_s32(0);
    const int8_t *x = m;
    for (int k = 0; k < full; k += 16, x += P * QK_LIMBS * 32) {
        int8x16_t b[2];
        mmla_w16(b, r0, r1, k, fmt);
#pragma GCC unroll 4
        for (int p = 0; p < P; p++)
#pragma GCC unroll 4
            for (int j = 0; j < QK_LIMBS; j++) {
                const int8_t *xp = x + (p * QK_LIMBS + j) * 32;
                acc[p * QK_LIMBS + j] = vmmlaq_s32(acc[p * QK_LIMBS + j], vld1q_s8(xp), b[0]);
                acc[p * QK_LIMBS + j] = vmmlaq_s32(acc[p * QK_LIMBS + j], vld1q_s8(xp + 16), b[1]);
            }
    }
    int32_t d[4 * QK_LIMBS][4];
    for (int i = 0; i < P * QK_LIMBS; i++)
        vst1q_s32(d[i], acc[i]);
    for (int n = 0; n < N; n++)
        for (int h = 0; h < 2; h++) {
            double dot = 0;
            for (int j = 0; j < QK_LIMBS; j++)
                dot += (double)d[(n / 2) * QK_LIMBS + j][(n % 2) * 2 + h] * limb_weight[j];
            limbs_out(out, R, r + h, w, inp, L, n, dot, h ? r1 : r0, full, fmt);
        }
}

typedef void (*MmlaRowsFn)(float *out, int R, int r, const Weight *w, const float *inp, const Limbs *L,
                           const int8_t *m);

// N >= 2 only (one input row would fill half of each tile: SDOT does it): the table is indexed by N - 2.
#define QK_MMLA_ROWS(FMT, name, N)                                                                                \
    static void mmla_##name##_##N(float *out, int R, int r, const Weight *w, const float *inp, const Limbs *L,    \
                                  const int8_t *m) {                                                              \
        mmla_rows(out, R, r, w, inp, L, m, N, FMT);                                                               \
    }
#define QK_MMLA_FORMAT(FMT, name)                                                                                 \
    QK_MMLA_ROWS(FMT, name, 2) QK_MMLA_ROWS(FMT, name, 3) QK_MMLA_ROWS(FMT, name, 4) QK_MMLA_ROWS(FMT, name, 5)   \
    QK_MMLA_ROWS(FMT, name, 6) QK_MMLA_ROWS(FMT, name, 7) QK_MMLA_ROWS(FMT, name, 8)                             \
    static const MmlaRowsFn mmla_##name[QUANT_DECODE_MAX_N - 1] = {mmla_##name##_2, mmla_##name##_3,               \
                                                                   mmla_##name##_4, mmla_##name##_5,               \
                                                                   mmla_##name##_6, mmla_##name##_7,               \
                                                                   mmla_##name##_8};

QK_MMLA_FORMAT(WF_Q8, q8)
QK_MMLA_FORMAT(WF_Q4, q4)

#pragma GCC pop_options

static int sdot_decode(float *out, const float *inp, const Weight *w, int N, const SdotRowFn *rows) {
    Limbs L;
    ER_TRY(limbs_make(&L, inp, N, w->cols));
    SdotRowFn fn = rows[N - 1];
#pragma omp parallel for schedule(static) if ((long)w->rows * w->cols * N >= THREADS_MIN_WORK)
    for (int r = 0; r < w->rows; r++)
        fn(out, w->rows, r, w, inp, &L);
    er_free(L.limb);
    er_free(L.scale);
    return ER_OK;
}

// Row pairs on SMMLA; an odd R's last row on SDOT.
static int mmla_decode(float *out, const float *inp, const Weight *w, int N, const MmlaRowsFn *pairs,
                       const SdotRowFn *rows) {
    int R = w->rows, K = w->cols;
    Limbs L;
    ER_TRY(limbs_make(&L, inp, N, K));
    int8_t *m = limbs_pair(&L, N, K, K & ~15);
    if (!m) {
        er_free(L.limb);
        er_free(L.scale);
        return er_error(ER_ENOMEM, "quant_matmul_decode: no memory for %d x %d paired input limbs", N, K);
    }
    MmlaRowsFn fn = pairs[N - 2];
#pragma omp parallel for schedule(static) if ((long)R * K * N >= THREADS_MIN_WORK)
    for (int p = 0; p < R / 2; p++)
        fn(out, R, 2 * p, w, inp, &L, m);
    if (R % 2)
        rows[N - 1](out, R, R - 1, w, inp, &L);
    er_free(m);
    er_free(L.limb);
    er_free(L.scale);
    return ER_OK;
}

// The int8-activation product: the inputs quantized once (QkActs is 66 KB, on this thread's stack as on
// x86), then every row on SDOT where the CPU has it (fns[1]), else on the ARMv8.0 lanes (fns[0]).
static int i8_decode(float *out, const float *inp, const Weight *w, int N, const I8RowsFn fns[2]) {
    QkActs a;
    qk_acts_fill(&a, inp, w->cols, N, w->fmt == WF_Q8 ? QK_ORDER_Q8 : QK_ORDER_Q4);
    if (w->fmt == WF_Q4G)
        qk_group_sums(a.xs, w->cols, N, w->group);
    fns[has_dotprod()](out, w, &a, N);
    return ER_OK;
}

static const I8RowsFn i8_q8[2] = {i8_q8_dot16_base, i8_q8_dot16_dp};
static const I8RowsFn i8_q4[2] = {i8_q4_dot16_base, i8_q4_dot16_dp};
static const I8RowsFn i8_q4g[2] = {i8_q4g_dot16_base, i8_q4g_dot16_dp};

// One function per (format, N), so that both are constants inside; QK_NEON_FORMAT makes the eight of a
// format, a table indexed by N - 1, and the table entry qk_decode_neon_<name> (q8 and q4: on SDOT where
// the CPU has it).
#define QK_NEON_ROW(FMT, name, N)                                                                                 \
    static void rows_##name##_##N(float *out, int R, int r, const Weight *w, const float *inp, const float *xsum) { \
        neon_row(out, R, r, w, inp, xsum, N, FMT);                                                                \
    }
#define QK_NEON_FORMAT(FMT, name, I8, SDOT, MMLA)                                                                  \
    QK_NEON_ROW(FMT, name, 1) QK_NEON_ROW(FMT, name, 2) QK_NEON_ROW(FMT, name, 3) QK_NEON_ROW(FMT, name, 4)      \
    QK_NEON_ROW(FMT, name, 5) QK_NEON_ROW(FMT, name, 6) QK_NEON_ROW(FMT, name, 7) QK_NEON_ROW(FMT, name, 8)      \
    static const NeonRowFn rows_##name[QUANT_DECODE_MAX_N] = {rows_##name##_1, rows_##name##_2, rows_##name##_3,  \
                                                              rows_##name##_4, rows_##name##_5, rows_##name##_6,  \
                                                              rows_##name##_7, rows_##name##_8};                 \
    int qk_decode_neon_##name(float *out, const float *inp, const Weight *w, int N) {                            \
        const I8RowsFn *i8 = I8;                                                                                  \
        const SdotRowFn *sdot = SDOT;                                                                             \
        const MmlaRowsFn *mmla = MMLA;                                                                            \
        if (i8 && qk_i8_takes(w, N))                                                                              \
            return i8_decode(out, inp, w, N, i8);                                                                 \
        if (mmla && N >= 2 && has_dotprod() && has_i8mm())                                                        \
            return mmla_decode(out, inp, w, N, mmla, sdot);                                                       \
        if (sdot && has_dotprod())                                                                                \
            return sdot_decode(out, inp, w, N, sdot);                                                             \
        return neon_decode(out, inp, w, N, rows_##name);                                                          \
    }

// q4 subtracts 8 * the sum of each input row once per output (xsum) instead of 8 from every code.
static int neon_decode(float *out, const float *inp, const Weight *w, int N, const NeonRowFn *rows) {
    int R = w->rows, K = w->cols;
    if (w->fmt == WF_Q4G && w->group % 16)
        return WEIGHT_DECODE_DECLINED;
    float xsum[QUANT_DECODE_MAX_N] = {0};
    for (int n = 0; w->fmt == WF_Q4 && n < N; n++) {
        double t = 0;
        for (int k = 0; k < K; k++)
            t += inp[(size_t)n * K + k];
        xsum[n] = (float)t;
    }
    NeonRowFn fn = rows[N - 1];
#pragma omp parallel for schedule(static) if ((long)R * K * N >= THREADS_MIN_WORK)
    for (int r = 0; r < R; r++)
        fn(out, R, r, w, inp, xsum);
    return ER_OK;
}

QK_NEON_FORMAT(WF_Q8, q8, i8_q8, sdot_q8, mmla_q8)
QK_NEON_FORMAT(WF_Q4, q4, i8_q4, sdot_q4, mmla_q4)
QK_NEON_FORMAT(WF_Q4G, q4g, i8_q4g, NULL, NULL)
QK_NEON_FORMAT(WF_Q4LUT, q4lut, NULL, NULL, NULL)
QK_NEON_FORMAT(WF_Q2LUT, q2lut, NULL, NULL, NULL)
QK_NEON_FORMAT(WF_BF16, bf16, NULL, NULL, NULL)
QK_NEON_FORMAT(WF_F16, f16, NULL, NULL, NULL)

#endif
