// NEON decode kernels (aarch64, ARMv8.0: every AArch64 core has Advanced SIMD): the `decode` column of
// the format table on ARM, the same entries quant/qkernel.c fills with AVX2 on x86, tested against the
// same portable reference. A weight row is read once and multiplied into all N <= 8 input rows, with
// two q registers (8 lanes) per accumulator chain and input row; packed codes are widened in registers:
//   - q8: int8 -> int16 -> int32 (SXTL) -> fp32 (SCVTF);
//   - q4, q4g: a 16-byte load is two 16-element blocks (quant/weight.h); AND 15 / USHR 4 give 8
//     consecutive codes each, then UXTL, UCVTF (q4g adds one FMLA for u * scale + zero);
//   - q4lut, q2lut: the codes index the row's fp16 codebook with TBL (vqtbl1q_u8): the codebook is
//     split into a table of low bytes and one of high bytes, one lookup each gives 16 halves' bytes,
//     ZIP1/ZIP2 put them back together and FCVTL widens them to fp32; no code ever goes through memory;
//   - bf16: a shift left by 16 (SHLL) is the fp32; f16: FCVTL.
// The dot-product extensions (SDOT: dotprod, SMMLA: i8mm) multiply int8 by int8; the activations here
// are fp32 and the runtime keeps them so (the same numbers as on x86, up to the order of sums), so the
// kernels use fp32 FMLA on every core. qk_neon_features reports what the CPU has (getauxval), for the
// record in erinfer bench.
#if defined(__aarch64__)
#include <arm_neon.h>
#include <sys/auxv.h>

#include "core/dtype.h"
#include "core/error.h"
#include "quant/qkernel.h"
#include "quant/quant.h"

#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1 << 13)
#endif

const char *qk_neon_features(void) {
    unsigned long h = getauxval(AT_HWCAP), h2 = getauxval(AT_HWCAP2);
    int dp = (h & HWCAP_ASIMDDP) != 0, mm = (h2 & HWCAP2_I8MM) != 0;
    return dp && mm ? "NEON (CPU: dotprod, i8mm)" : dp ? "NEON (CPU: dotprod)" : mm ? "NEON (CPU: i8mm)" : "NEON";
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

// 2-bit codes, 32 elements per 8-byte block, looked up in the row's 4-entry codebook.
static inline __attribute__((always_inline)) void row_q2lut(float32x4_t *acc, float *tail, const uint8_t *row,
                                                            const float *inp, int K, const int N, const Weight *w,
                                                            int r) {
    const int A = NCH(N);
    const uint16_t *cbh = w->lut + (size_t)r * 4;
    Lut16 t = lut_load(cbh, 4);
    int full = K & ~31;
    for (int k = 0; k < full; k += 64) {
        int two = k + 64 <= full;
        uint8x16_t v = load_blocks(row + k / 4, two);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) { // codes at bits 2j: elements k + 8j (block 1: k + 32 + 8j)
            W8 a, b;
            uint8x16_t c = vandq_u8(j ? vshlq_u8(v, vdupq_n_s8((int8_t)(-2 * j))) : v, vdupq_n_u8(3));
            lut_lookup(&a, &b, t, c);
            fma8(acc, a, inp, K, k + 8 * j, N, j % A);
            if (two)
                fma8(acc, b, inp, K, k + 32 + 8 * j, N, j % A);
        }
    }
    for (int k = full; k < K; k++) {
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

// One function per (format, N), so that both are constants inside; QK_NEON_FORMAT makes the eight of a
// format, a table indexed by N - 1, and the table entry qk_decode_neon_<name>.
#define QK_NEON_ROW(FMT, name, N)                                                                                 \
    static void rows_##name##_##N(float *out, int R, int r, const Weight *w, const float *inp, const float *xsum) { \
        neon_row(out, R, r, w, inp, xsum, N, FMT);                                                                \
    }
#define QK_NEON_FORMAT(FMT, name)                                                                                 \
    QK_NEON_ROW(FMT, name, 1) QK_NEON_ROW(FMT, name, 2) QK_NEON_ROW(FMT, name, 3) QK_NEON_ROW(FMT, name, 4)      \
    QK_NEON_ROW(FMT, name, 5) QK_NEON_ROW(FMT, name, 6) QK_NEON_ROW(FMT, name, 7) QK_NEON_ROW(FMT, name, 8)      \
    static const NeonRowFn rows_##name[QUANT_DECODE_MAX_N] = {rows_##name##_1, rows_##name##_2, rows_##name##_3,  \
                                                              rows_##name##_4, rows_##name##_5, rows_##name##_6,  \
                                                              rows_##name##_7, rows_##name##_8};                 \
    int qk_decode_neon_##name(float *out, const float *inp, const Weight *w, int N) {                            \
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
#pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++)
        fn(out, R, r, w, inp, xsum);
    return ER_OK;
}

QK_NEON_FORMAT(WF_Q8, q8)
QK_NEON_FORMAT(WF_Q4, q4)
QK_NEON_FORMAT(WF_Q4G, q4g)
QK_NEON_FORMAT(WF_Q4LUT, q4lut)
QK_NEON_FORMAT(WF_Q2LUT, q2lut)
QK_NEON_FORMAT(WF_BF16, bf16)
QK_NEON_FORMAT(WF_F16, f16)

#endif
