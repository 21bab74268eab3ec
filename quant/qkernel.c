// Decode kernels (N <= 8 input rows): each weight row is read once and multiplied into all N input
// rows at once, with vector accumulators per input row held in registers; rows are split across
// threads. sgemm's packing costs more than the product at this size. fp32 weights are memory-bound
// here; packed ones move 4-16x fewer bytes and are bound by the unpacking instead. fp32 weights take up to
// QUANT_BATCH_MAX_N rows: a block of weight rows passes over the inputs 8 at a time while it is in cache,
// each output summed as for one row alone (past 8 rows the product is bound by the multiply-adds, which
// this kernel does faster than sgemm here).
//
// On x86 with AVX2 + FMA + F16C (quant/qkernel.h: this file is compiled once for that and once for AVX512-VNNI): the
// packed row is expanded 8 weights at a time straight into a register, never touching memory: bf16 shifted into
// the top half of an fp32 lane, f16 converted by F16C (half the bytes of fp32); int8 sign-extended; an 8-byte
// block widened to 8 lanes, then a mask / shift gives 8 consecutive 4-bit codes (the layout in quant/weight.h is
// made for this) or the 2-bit codes index the row's codebook with vpermilps, which reads only the low 2 bits of
// each lane. 32 weights per step feed independent accumulator chains so that FMA latency does not set the pace at
// N = 1. q8, q4 and q4g (groups of 32, 64, 128; cols a multiple of 64) instead quantize the inputs to int8 once per
// product and use integer dot products (section "int8 activations" below): W8A8 / W4A8, like llama.cpp's CPU path.
// With AVX-512, fp32 and bf16 (from N = 2) and, with VNNI, q4, q4g and q8 (from N = 2) put two weight rows in one
// 16-lane register (qpairs_i8_q4, qpairs_i8_q8, section "fp32 and bf16 weights on AVX-512"), each half summing as
// the one-row kernel sums; and q4, q4g32 and q8 rows that the runtime re-laid 16 at a time at load (quant_tile) run
// with one row per int32 lane (qtile_i8_q4, qtile_i8_q8). The portable path they are tested against, and the
// products that choose between the kernels and the GEMM, are quant/matmul.c's; qk_kernels, at the end, is what
// this copy of the kernels offers it.
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/gemm.h"
#include "core/threads.h"
#include "quant/blocks.h"
#include "quant/qkernel.h"
#include "quant/quant.h"

#if QK_AVX2
#include <immintrin.h>
#endif

typedef gemm_v8f v8f;
#define LOAD8 GEMM_LOAD8

#if QK_AVX2

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Codes of weights k..k+7 of an int8 row as fp32.
static inline __m256 codes8_i8(const int8_t *q, int k) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + k))));
}

// The 8 bytes of the block starting at element k, one per 32-bit lane: lane i holds elements
// k+i, k+8+i (4-bit) or k+i, k+8+i, k+16+i, k+24+i (2-bit) (layout in quant/weight.h).
static inline __m256i block8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }

// Independent accumulators per input row: an FMA's latency is several cycles, so with one or two
// input rows a single accumulator chain, not the loads, would set the pace.
#define CHAINS(N) ((N) <= 2 ? 4 : (N) <= 4 ? 2 : 1)

static inline __attribute__((always_inline)) void fma_rows(__m256 *acc, __m256 wv, const float *inp, int K, int k,
                                                           const int N, int chain) {
    const int A = CHAINS(N);
#pragma GCC unroll 8
    for (int n = 0; n < N; n++)
        acc[n * A + chain] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(inp + (size_t)n * K + k), acc[n * A + chain]);
}

static inline float half_to_f32(uint16_t h) { return _cvtsh_ss(h); }

// 8 bf16 or f16 weights as floats: a bf16 is the top half of an fp32.
static inline __m256 halves8(const uint16_t *p, WeightFormat fmt) {
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    if (fmt == WF_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
    return _mm256_cvtph_ps(v);
}

// The per-format halves of qrow_simd: each adds row r's products with the N input rows into acc
// (N * CHAINS(N) vectors) and the scalar tail's into tail (N). Inlined, so the format stays a constant.
static inline __attribute__((always_inline)) void qrow_q8(__m256 *acc, float *tail, const uint8_t *row,
                                                          const float *inp, int K, const int N) {
    const int A = CHAINS(N);
    const int8_t *q = (const int8_t *)row;
    int k = 0;
    for (; k + 32 <= K; k += 32)
#pragma GCC unroll 4
        for (int s = 0; s < 4; s++)
            fma_rows(acc, codes8_i8(q, k + 8 * s), inp, K, k + 8 * s, N, s % A);
    for (; k + 8 <= K; k += 8)
        fma_rows(acc, codes8_i8(q, k), inp, K, k, N, 0);
    for (int j = k; j < K; j++)
        for (int n = 0; n < N; n++)
            tail[n] += (float)q[j] * inp[(size_t)n * K + j];
}

static inline __attribute__((always_inline)) void qrow_q4(__m256 *acc, float *tail, const uint8_t *row,
                                                          const float *inp, int K, const int N, const float *xsum) {
    const int A = CHAINS(N);
    const __m256i m15 = _mm256_set1_epi32(15);
    int k = 0;
    int full = K & ~15;
    for (; k + 32 <= full; k += 32) {
        __m256i v0 = block8(row + k / 2), v1 = block8(row + k / 2 + 8);
        fma_rows(acc, _mm256_cvtepi32_ps(_mm256_and_si256(v0, m15)), inp, K, k, N, 0 % A);
        fma_rows(acc, _mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4)), inp, K, k + 8, N, 1 % A);
        fma_rows(acc, _mm256_cvtepi32_ps(_mm256_and_si256(v1, m15)), inp, K, k + 16, N, 2 % A);
        fma_rows(acc, _mm256_cvtepi32_ps(_mm256_srli_epi32(v1, 4)), inp, K, k + 24, N, 3 % A);
    }
    for (; k < full; k += 16) {
        __m256i v0 = block8(row + k / 2);
        fma_rows(acc, _mm256_cvtepi32_ps(_mm256_and_si256(v0, m15)), inp, K, k, N, 0);
        fma_rows(acc, _mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4)), inp, K, k + 8, N, 0);
    }
    for (int j = k; j < K; j++) {
        float c = (float)quant_code4(row, K, j);
        for (int n = 0; n < N; n++)
            tail[n] += c * inp[(size_t)n * K + j];
    }
    for (int n = 0; n < N; n++)
        tail[n] -= 8.0f * xsum[n];
}

static inline __attribute__((always_inline)) void qrow_q4g(__m256 *acc, float *tail, const uint8_t *row,
                                                           const float *inp, int K, const int N, const Weight *w, int r) {
    const int A = CHAINS(N);
    const __m256i m15 = _mm256_set1_epi32(15);
    int k;
    // Dequantize 8 codes with one FMA (u * s + z), then into the accumulators. (Summing u·x per group
    // and scaling once per group is no faster at N = 1 and slower at N = 8.)
    int G = w->group, ng = K / G; // G % 16 == 0 here
    const uint16_t *gs = w->gscale + (size_t)r * ng, *gz = w->gzero + (size_t)r * ng;
    for (int g = 0; g < ng; g++) {
        __m256 s = _mm256_set1_ps(half_to_f32(gs[g])), z = _mm256_set1_ps(half_to_f32(gz[g]));
        int end = (g + 1) * G;
        for (k = g * G; k + 32 <= end; k += 32) {
            __m256i v0 = block8(row + k / 2), v1 = block8(row + k / 2 + 8);
            fma_rows(acc, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v0, m15)), s, z), inp, K, k, N, 0 % A);
            fma_rows(acc, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4)), s, z), inp, K, k + 8, N,
                     1 % A);
            fma_rows(acc, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v1, m15)), s, z), inp, K, k + 16, N,
                     2 % A);
            fma_rows(acc, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v1, 4)), s, z), inp, K, k + 24, N,
                     3 % A);
        }
        for (; k < end; k += 16) {
            __m256i v0 = block8(row + k / 2);
            fma_rows(acc, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v0, m15)), s, z), inp, K, k, N, 0);
            fma_rows(acc, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4)), s, z), inp, K, k + 8, N, 0);
        }
    }
}

static inline __attribute__((always_inline)) void qrow_q4lut(__m256 *acc, float *tail, const uint8_t *row,
                                                             const float *inp, int K, const int N, const Weight *w, int r) {
    const int A = CHAINS(N);
    int k = 0;
    // The 16-entry codebook as two 8-entry tables: vpermps picks by bits 0-2 of the code, then a
    // blend on bit 3 (moved to the sign bit) chooses the table.
    const uint16_t *cb = w->lut + (size_t)r * 16;
    __m256 t0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)cb));
    __m256 t1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(cb + 8)));
    int full = K & ~15;
#define LUT16(v, h, wl, wh)                                                                                      \
__m256 wl = _mm256_blendv_ps(_mm256_permutevar8x32_ps(t0, v), _mm256_permutevar8x32_ps(t1, v),             \
                             _mm256_castsi256_ps(_mm256_slli_epi32(v, 28)));                                \
__m256 wh = _mm256_blendv_ps(_mm256_permutevar8x32_ps(t0, h), _mm256_permutevar8x32_ps(t1, h),             \
                             _mm256_castsi256_ps(_mm256_slli_epi32(v, 24)))
    for (; k + 32 <= full; k += 32) {
        __m256i v0 = block8(row + k / 2), h0 = _mm256_srli_epi32(v0, 4);
        __m256i v1 = block8(row + k / 2 + 8), h1 = _mm256_srli_epi32(v1, 4);
        LUT16(v0, h0, w0, w1);
        LUT16(v1, h1, w2, w3);
        fma_rows(acc, w0, inp, K, k, N, 0);
        fma_rows(acc, w1, inp, K, k + 8, N, 1 % A);
        fma_rows(acc, w2, inp, K, k + 16, N, 2 % A);
        fma_rows(acc, w3, inp, K, k + 24, N, 3 % A);
    }
    for (; k + 16 <= full; k += 16) {
        __m256i v0 = block8(row + k / 2), h0 = _mm256_srli_epi32(v0, 4);
        LUT16(v0, h0, w0, w1);
        fma_rows(acc, w0, inp, K, k, N, 0);
        fma_rows(acc, w1, inp, K, k + 8, N, 1 % A);
    }
#undef LUT16
    for (int j = k; j < K; j++) {
        float v = half_to_f32(cb[quant_code4(row, K, j)]);
        for (int n = 0; n < N; n++)
            tail[n] += v * inp[(size_t)n * K + j];
    }
}

static inline __attribute__((always_inline)) void qrow_half(__m256 *acc, float *tail, const uint8_t *row,
                                                            const float *inp, int K, const int N, const WeightFormat fmt) {
    const int A = CHAINS(N);
    int k = 0;
    const uint16_t *h = (const uint16_t *)row;
    for (; k + 32 <= K; k += 32)
#pragma GCC unroll 4
        for (int s = 0; s < 4; s++)
            fma_rows(acc, halves8(h + k + 8 * s, fmt), inp, K, k + 8 * s, N, s % A);
    for (; k + 8 <= K; k += 8)
        fma_rows(acc, halves8(h + k, fmt), inp, K, k, N, 0);
    for (int j = k; j < K; j++) {
        float v = fmt == WF_BF16 ? bf16_to_f32(h[j]) : half_to_f32(h[j]);
        for (int n = 0; n < N; n++)
            tail[n] += v * inp[(size_t)n * K + j];
    }
}

static inline __attribute__((always_inline)) void qrow_q2lut(__m256 *acc, float *tail, const uint8_t *row,
                                                             const float *inp, int K, const int N, const Weight *w, int r) {
    const int A = CHAINS(N);
    int k = 0;
    float c[4];
    for (int i = 0; i < 4; i++)
        c[i] = half_to_f32(w->lut[(size_t)r * 4 + i]);
    __m256 lut = _mm256_setr_ps(c[0], c[1], c[2], c[3], c[0], c[1], c[2], c[3]);
    int full = K & ~31;
    for (; k < full; k += 32) {
        __m256i v = block8(row + k / 4);
        fma_rows(acc, _mm256_permutevar_ps(lut, v), inp, K, k, N, 0 % A);
        fma_rows(acc, _mm256_permutevar_ps(lut, _mm256_srli_epi32(v, 2)), inp, K, k + 8, N, 1 % A);
        fma_rows(acc, _mm256_permutevar_ps(lut, _mm256_srli_epi32(v, 4)), inp, K, k + 16, N, 2 % A);
        fma_rows(acc, _mm256_permutevar_ps(lut, _mm256_srli_epi32(v, 6)), inp, K, k + 24, N, 3 % A);
    }
    for (int j = k; j < K; j++) {
        float v = c[quant_code2(row, K, j)];
        for (int n = 0; n < N; n++)
            tail[n] += v * inp[(size_t)n * K + j];
    }
}

// One row r of a quantized weight against N inputs; the format is a compile-time constant after
// inlining. 32 weights per step, then a scalar tail. xsum (N): the sums of the input rows (q4 adds
// -8 * xsum once instead of subtracting 8 from every code).
static inline __attribute__((always_inline)) void qrow_simd(float *out, int R, int r, const Weight *w,
                                                            const float *inp, const float *xsum, int K, const int N,
                                                            const WeightFormat fmt) {
    const int A = CHAINS(N);
    __m256 acc[QUANT_DECODE_MAX_N * 4];
#pragma GCC unroll 16
    for (int i = 0; i < N * A; i++)
        acc[i] = _mm256_setzero_ps();
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * weight_row_bytes(fmt, K);
    float tail[QUANT_DECODE_MAX_N] = {0};
    float post = fmt == WF_Q8 || fmt == WF_Q4 ? w->scale[r] : 1.0f; // the row scale, applied once at the end
    if (fmt == WF_Q8)
        qrow_q8(acc, tail, row, inp, K, N);
    else if (fmt == WF_Q4)
        qrow_q4(acc, tail, row, inp, K, N, xsum);
    else if (fmt == WF_Q4G)
        qrow_q4g(acc, tail, row, inp, K, N, w, r);
    else if (fmt == WF_Q4LUT)
        qrow_q4lut(acc, tail, row, inp, K, N, w, r);
    else if (fmt == WF_BF16 || fmt == WF_F16)
        qrow_half(acc, tail, row, inp, K, N, fmt);
    else // WF_Q2LUT
        qrow_q2lut(acc, tail, row, inp, K, N, w, r);
    for (int n = 0; n < N; n++) {
        __m256 a = acc[n * A];
        for (int i = 1; i < A; i++)
            a = _mm256_add_ps(a, acc[n * A + i]);
        out[(size_t)n * R + r] = (hsum256(a) + tail[n]) * post;
    }
}

// q4 subtracts 8 * the sum of each input row once per output (xsum) instead of 8 from every code.
#define QK_ROWS(FMT, fname)                                                                                 \
    int fname(float *out, const float *inp, const Weight *w, int N) {                                     \
        int R = w->rows, K = w->cols;                                                                      \
        if (FMT == WF_Q4G && w->group % 16)                                                                \
            return WEIGHT_DECODE_DECLINED;                                                                 \
        float xsum[QUANT_DECODE_MAX_N] = {0};                                                              \
        for (int n = 0; FMT == WF_Q4 && n < N; n++) {                                                      \
            double t = 0;                                                                                  \
            for (int k = 0; k < K; k++)                                                                    \
                t += inp[(size_t)n * K + k];                                                               \
            xsum[n] = (float)t;                                                                            \
        }                                                                                                  \
        _Pragma("omp parallel for schedule(static) if ((long)R * K * N >= THREADS_MIN_WORK)")               \
        for (int r = 0; r < R; r++) {                                                                      \
            switch (N) {                                                                                   \
            case 1: qrow_simd(out, R, r, w, inp, xsum, K, 1, FMT); break;                                  \
            case 2: qrow_simd(out, R, r, w, inp, xsum, K, 2, FMT); break;                                  \
            case 3: qrow_simd(out, R, r, w, inp, xsum, K, 3, FMT); break;                                  \
            case 4: qrow_simd(out, R, r, w, inp, xsum, K, 4, FMT); break;                                  \
            case 5: qrow_simd(out, R, r, w, inp, xsum, K, 5, FMT); break;                                  \
            case 6: qrow_simd(out, R, r, w, inp, xsum, K, 6, FMT); break;                                  \
            case 7: qrow_simd(out, R, r, w, inp, xsum, K, 7, FMT); break;                                  \
            default: qrow_simd(out, R, r, w, inp, xsum, K, 8, FMT); break;                                 \
            }                                                                                              \
        }                                                                                                  \
        return ER_OK;                                                                                      \
    }

static QK_ROWS(WF_Q8, qk_float_q8)
static QK_ROWS(WF_Q4, qk_float_q4)
static QK_ROWS(WF_Q4G, qk_float_q4g)
QK_ROWS(WF_Q2LUT, qk_decode_simd_q2lut)
QK_ROWS(WF_Q4LUT, qk_decode_simd_q4lut)
static QK_ROWS(WF_BF16, qk_float_bf16)
QK_ROWS(WF_F16, qk_decode_simd_f16)

// ---- int8 activations: q8, q4 and q4g with integer dot products ----
// Weighed against the fp32 kernels above, which widen every weight to fp32 and spend one FMA per 8 weights
// per input row (compute-bound at N = 8), these quantize the N input rows to int8 once per product (one
// scale per 32 inputs, as llama.cpp's Q8_0 activations) and multiply 32 codes per instruction against
// them: vpmaddubsw + vpmaddwd (AVX2) or vpdpbusd (AVX512-VNNI, where the compiler targets it), int32 per
// block of 32, scaled once per block in fp32. The error this adds is bounded by the int8 rounding of the
// inputs (half a step, max|x| / 254 per block), what tests/quant check against the portable path.
// Both work on chunks of 64 inputs (two blocks) whose products land with block 2c in int32 lanes 0-3 and
// block 2c+1 in lanes 4-7, so one conversion and one FMA with the two blocks' scales (dv) serve 64 weights;
// the inputs are stored in the order that makes this so (QK_ORDER_Q4, QK_ORDER_Q8 in quant/qkernel.h).
// Taken where qk_i8_takes says; elsewhere the fp32 kernels run. The inputs are quantized by qk_acts_fill
// (portable C, below), which the NEON kernels share, so that both CPUs round every input to the same code.

// Group scales of blocks 2c and 2c+1 (q4g, groups of G = 32 or a multiple of 64, a row's scales at gs), four times
// each.
static inline __m256 qk_gscale_pair(const uint16_t *gs, int c, int G) {
    if (G > 32) // both blocks in one group
        return _mm256_set1_ps(_cvtsh_ss(gs[64 * c / G]));
    uint32_t two;
    memcpy(&two, gs + 2 * c, 4);
    __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)two));
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(f), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
}

// Output (r, n) of a q4 / q4g product from the scaled block sums in the lanes of sum: q4 subtracts 8 * Σ x and
// applies the row scale; q4g adds Σ_g zero_g * Σ_{k in g} x_k, with the exact group sums (qk_group_sums).
static inline float q4_finish(__m256 sum, const Weight *w, const QkActs *a, int r, int n, int K,
                              const WeightFormat fmt) {
    float y = hsum256(sum);
    if (fmt == WF_Q4)
        return (y - 8.0f * a->xsum[n]) * w->scale[r];
    int ng = K / w->group, g = 0;
    const uint16_t *gz = w->gzero + (size_t)r * ng;
    const float *xs = a->xs + (size_t)n * (K / 32);
    __m256 z = _mm256_setzero_ps();
    for (; g + 8 <= ng; g += 8)
        z = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gz + g))), _mm256_loadu_ps(xs + g), z);
    y += hsum256(z);
    for (; g < ng; g++)
        y += half_to_f32(gz[g]) * xs[g];
    return y;
}

// Rows r .. r + RW - 1 (RW = 1 or 2) of a q4 / q4g weight against the N quantized inputs: two rows share
// each load of the inputs, which pays where they come from L2 (QK_I8_PAIR_COLS) and the registers hold
// two rows' accumulators (AVX-512's 32).
static inline __attribute__((always_inline)) void qrow_i8_q4(float *out, int R, int r, const Weight *w,
                                                             const QkActs *a, int K, const int N,
                                                             const WeightFormat fmt, const int RW) {
    const int A = N <= 2 ? 2 : 1; // independent chains: at N = 1 the FMA latency would set the pace
    __m256 acc[2][QUANT_DECODE_MAX_N * 2];
#pragma GCC unroll 2
    for (int j = 0; j < RW; j++)
#pragma GCC unroll 16
        for (int i = 0; i < N * A; i++)
            acc[j][i] = _mm256_setzero_ps();
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * (K / 2);
    const uint16_t *gs = fmt == WF_Q4G ? w->gscale + (size_t)r * (K / w->group) : NULL;
    const __m256i m15 = _mm256_set1_epi8(15);
    for (int c = 0; c < K / 64; c++) {
        __m256i lo[2], hi[2];
        __m256 sv[2];
#pragma GCC unroll 2
        for (int j = 0; j < RW; j++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(row + (size_t)j * (K / 2) + 32 * c));
            lo[j] = _mm256_and_si256(v, m15);
            hi[j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m15);
            sv[j] = fmt == WF_Q4G ? qk_gscale_pair(gs + (size_t)j * (K / w->group), c, w->group) : _mm256_set1_ps(1.0f);
        }
#pragma GCC unroll 8
        for (int n = 0; n < N; n++) {
            const int8_t *xq = a->q + (size_t)n * K + 64 * c;
            __m256i x0 = _mm256_loadu_si256((const __m256i *)xq), x1 = _mm256_loadu_si256((const __m256i *)(xq + 32));
            __m256 dv = _mm256_loadu_ps(a->dv + (size_t)n * (K / 8) + 8 * c);
#pragma GCC unroll 2
            for (int j = 0; j < RW; j++) {
                __m256i i32 = qk_dot_u8(qk_dot_u8(_mm256_setzero_si256(), lo[j], x0), hi[j], x1);
                __m256 d = fmt == WF_Q4G ? _mm256_mul_ps(dv, sv[j]) : dv;
                acc[j][n * A + c % A] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32), d, acc[j][n * A + c % A]);
            }
        }
    }
    for (int j = 0; j < RW; j++)
        for (int n = 0; n < N; n++) {
            __m256 sum = acc[j][n * A];
            for (int i = 1; i < A; i++)
                sum = _mm256_add_ps(sum, acc[j][n * A + i]);
            out[(size_t)n * R + r + j] = q4_finish(sum, w, a, r + j, n, K, fmt);
        }
}

// Row r of a q8 weight against the N quantized inputs: |w| * (x with w's sign) keeps vpmaddubsw's
// first operand unsigned.
static inline __attribute__((always_inline)) void qrow_i8_q8(float *out, int R, int r, const Weight *w,
                                                             const QkActs *a, int K, const int N) {
    const int A = N <= 2 ? 2 : 1;
    __m256 acc[QUANT_DECODE_MAX_N * 2];
#pragma GCC unroll 16
    for (int i = 0; i < N * A; i++)
        acc[i] = _mm256_setzero_ps();
    const int8_t *row = (const int8_t *)w->data + (size_t)r * K;
    for (int c = 0; c < K / 64; c++) {
        if (N > 1) // two rows ahead: it pays at N = 8, not at N = 1
            qk_prefetch((uintptr_t)row + 2 * (size_t)K + 64 * c);
        const int8_t *p = row + 64 * c;
        __m256i v0 = _mm256_loadu2_m128i((const __m128i *)(p + 32), (const __m128i *)p);
        __m256i v1 = _mm256_loadu2_m128i((const __m128i *)(p + 48), (const __m128i *)(p + 16));
        __m256i u0 = _mm256_abs_epi8(v0), u1 = _mm256_abs_epi8(v1);
#pragma GCC unroll 8
        for (int n = 0; n < N; n++) {
            const int8_t *xq = a->q + (size_t)n * K + 64 * c;
            __m256i x0 = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)xq), v0);
            __m256i x1 = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(xq + 32)), v1);
            __m256i i32 = qk_dot_u8(qk_dot_u8(_mm256_setzero_si256(), u0, x0), u1, x1);
            __m256 dv = _mm256_loadu_ps(a->dv + (size_t)n * (K / 8) + 8 * c);
            acc[n * A + c % A] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32), dv, acc[n * A + c % A]);
        }
    }
    for (int n = 0; n < N; n++) {
        __m256 s = acc[n * A];
        for (int i = 1; i < A; i++)
            s = _mm256_add_ps(s, acc[n * A + i]);
        out[(size_t)n * R + r] = hsum256(s) * w->scale[r];
    }
}

// Rows r .. r + RW - 1 (RW = 2 only for q4 / q4g).
static inline __attribute__((always_inline)) void qrow_i8(float *out, int R, int r, const Weight *w,
                                                          const QkActs *a, int K, const int N, const WeightFormat fmt,
                                                          const int RW) {
    if (fmt == WF_Q8)
        qrow_i8_q8(out, R, r, w, a, K, N);
    else
        qrow_i8_q4(out, R, r, w, a, K, N, fmt, RW);
}

// The q4 / q4g rows go in pairs where the inputs (N * K codes and N * K / 2 bytes of scales) no longer
// fit in L1 and past QK_I8_PAIR_COLS columns: there (the 4864-wide down projection) pairs pay, on 896-wide
// products they cost. Pairs need AVX-512's registers (16 accumulators at N = 8).
#if defined(__AVX512VL__)
#define QK_I8_PAIR_COLS 2048
#else
#define QK_I8_PAIR_COLS (1 << 30)
#endif

// The row loop of the two-rows-per-register kernels (qpairs_i8_q4 and qpairs_i8_q8 below, pairs_block in the
// fp32 section): blocks of 2 * PAIRS rows on the threads, then the last R % (2 * PAIRS) rows a pair at a time,
// each block as BLOCK(args..., P, FMT, N) with N switched into a constant. R, K and N are the caller's; args
// name r0.
#define QK_PAIRS_N(BLOCK, P, FMT, ...) QK_SWITCH_N(BLOCK, __VA_ARGS__, P, FMT)
#define QK_PAIRS_ROWS(BLOCK, PAIRS, FMT, ...)                                                              \
    int full = R - R % (2 * PAIRS);                                                                        \
    _Pragma("omp parallel for schedule(static) if ((long)R * K * N >= THREADS_MIN_WORK)")                  \
    for (int r0 = 0; r0 < full; r0 += 2 * PAIRS) {                                                         \
        QK_PAIRS_N(BLOCK, PAIRS, FMT, __VA_ARGS__);                                                        \
    }                                                                                                      \
    for (int r0 = full; r0 < R; r0 += 2) {                                                                 \
        QK_PAIRS_N(BLOCK, 1, FMT, __VA_ARGS__);                                                            \
    }

// With AVX512-VNNI, q4 and q4g (q8 below) take two weight rows per 16-lane register as the fp32 kernel
// does (row r in lanes 0-7, row r + 1 in 8-15, the inputs broadcast to both halves): one vpdpbusd, conversion
// and FMA serve both rows, which halves the instructions per weight that bound these products at N = 8. Each half
// computes what qrow_i8_q4 computes for its row, in the same order (the NEON kernels' order too).
// QK_I8_PAIRS pairs per pass (at N = 8, 16 accumulators, 4 code registers and an input's 3 in the 32
// registers). At every N: with the next block prefetched, pairs are no slower than the one-row kernel even at
// N = 1 (without the prefetch they would be).
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#define QK_I8_PAIRS 2

// Row 2p + h's 8 lanes (h = 0, 1) of a pair's A accumulator chains at acc, the chains added in order.
static inline __m256 pair_half(const __m512 *acc, int A, int h) {
    __m512 s = acc[0];
    for (int i = 1; i < A; i++)
        s = _mm512_add_ps(s, acc[i]);
    return h ? _mm512_extractf32x8_ps(s, 1) : _mm512_castps512_ps256(s);
}

static inline __attribute__((always_inline)) void qpairs_i8_q4(float *out, int R, int r0, const Weight *w,
                                                               const QkActs *a, int K, const int P,
                                                               const WeightFormat fmt, const int N) {
    const uint8_t *row[2 * QK_I8_PAIRS];
    const uint16_t *gs[2 * QK_I8_PAIRS];
    for (int i = 0; i < 2 * P; i++) { // the last row again where the block runs past R
        int r = r0 + i < R ? r0 + i : R - 1;
        row[i] = (const uint8_t *)w->data + (size_t)r * (K / 2);
        gs[i] = fmt == WF_Q4G ? w->gscale + (size_t)r * (K / w->group) : NULL;
    }
    const int A = N <= 2 ? 2 : 1; // qrow_i8_q4's chains
    __m512 acc[QK_I8_PAIRS * QUANT_DECODE_MAX_N];
#pragma GCC unroll 16
    for (int i = 0; i < P * N * A; i++)
        acc[i] = _mm512_setzero_ps();
    const __m512i m15 = _mm512_set1_epi8(15);
    for (int c = 0; c < K / 64; c++) {
        if (P == QK_I8_PAIRS) { // the next block, as pairs_block does
            uintptr_t nx = (uintptr_t)row[0] + (size_t)2 * P * (K / 2) + 128 * (size_t)c;
            qk_prefetch(nx);
            qk_prefetch(nx + 64);
        }
        __m512i lo[QK_I8_PAIRS], hi[QK_I8_PAIRS];
        __m512 sv[QK_I8_PAIRS];
#pragma GCC unroll 2
        for (int p = 0; p < P; p++) {
            __m256i v0 = _mm256_loadu_si256((const __m256i *)(row[2 * p] + 32 * c));
            __m256i v1 = _mm256_loadu_si256((const __m256i *)(row[2 * p + 1] + 32 * c));
            __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(v0), v1, 1);
            lo[p] = _mm512_and_si512(v, m15);
            hi[p] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m15);
            sv[p] = fmt == WF_Q4G ? _mm512_insertf32x8(_mm512_castps256_ps512(qk_gscale_pair(gs[2 * p], c, w->group)),
                                                       qk_gscale_pair(gs[2 * p + 1], c, w->group), 1)
                                  : _mm512_set1_ps(1.0f);
        }
#pragma GCC unroll 8
        for (int n = 0; n < N; n++) {
            const int8_t *xq = a->q + (size_t)n * K + 64 * c;
            __m512i x0 = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)xq));
            __m512i x1 = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xq + 32)));
            __m512 dv = _mm512_broadcast_f32x8(_mm256_loadu_ps(a->dv + (size_t)n * (K / 8) + 8 * c));
#pragma GCC unroll 2
            for (int p = 0; p < P; p++) {
                __m512i i32 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[p], x0), hi[p], x1);
                __m512 d = fmt == WF_Q4G ? _mm512_mul_ps(dv, sv[p]) : dv;
                __m512 *ac = &acc[(p * N + n) * A + c % A];
                *ac = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i32), d, *ac);
            }
        }
    }
    for (int p = 0; p < P; p++)
        for (int n = 0; n < N; n++)
            for (int h = 0; h < 2 && r0 + 2 * p + h < R; h++) {
                __m256 sum = pair_half(acc + (p * N + n) * A, A, h);
                out[(size_t)n * R + r0 + 2 * p + h] = q4_finish(sum, w, a, r0 + 2 * p + h, n, K, fmt);
            }
}

// One function per format, so that the format is a constant inside the parallel loop.
#define QK_I8_PAIRS_FN(FMT, name)                                                                          \
    static void name(float *out, const Weight *w, const QkActs *a, int N) {                                \
        int R = w->rows, K = w->cols;                                                                      \
        QK_PAIRS_ROWS(qpairs_i8_q4, QK_I8_PAIRS, FMT, out, R, r0, w, a, K)                                 \
    }

QK_I8_PAIRS_FN(WF_Q4, qk_i8_pairs_q4)
QK_I8_PAIRS_FN(WF_Q4G, qk_i8_pairs_q4g)

// Tiled q4 and q8 (quant_tile; layout in quant/weight.h). q4: one 64-byte load gives 4 bytes (8 codes) of each of 16
// rows, one row per int32 lane, so one vpdpbusd multiplies 4 codes of all 16 rows by 4 input codes broadcast
// from memory, and a block of 32 inputs (4 such loads, low and high nibbles) sums in int32 per row before one
// conversion and one FMA with the block's input scale: 8 vpdpbusd per conversion where the pairs above have
// 2, and no loads of the inputs but the broadcasts. The 16 rows stream from one contiguous run of bytes.
// Each row's block sums are exact integers, scaled and added block by block: the pairs' products up to the
// order of the fp32 sums (and bit for bit the same at every N for one input, which tests/quant checks).
// Tile r0 / 16 against the N inputs (QK_ORDER_Q4_TILES): out[n * R + r0 + i] for the 16 rows i. q4g32 scales
// each block's sums by the rows' group scales too and adds each group's zero times the block's input sum.
static inline __attribute__((always_inline)) void qtile_i8_q4(float *out, int R, int r0, const Weight *w,
                                                              const QkIn *a, int K, const WeightFormat fmt,
                                                              const int N) {
    const uint8_t *tile = (const uint8_t *)w->data + (size_t)r0 * (K / 2);
    const int ng = K / 32;
    const uint16_t *gs = fmt == WF_Q4G ? w->gscale + (size_t)r0 * ng : NULL; // tile r0 / 16's groups
    const uint16_t *gz = fmt == WF_Q4G ? w->gzero + (size_t)r0 * ng : NULL;
    __m512 acc[QUANT_DECODE_MAX_N];
#pragma GCC unroll 8
    for (int n = 0; n < N; n++)
        acc[n] = _mm512_setzero_ps();
    const __m512i m15 = _mm512_set1_epi8(15);
    for (int c = 0; c < K / 64; c++) {
        const uint8_t *p = tile + 512 * (size_t)c;
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
            qk_prefetch((uintptr_t)p + QK_TILE_PREFETCH + 64 * i);
        const int32_t *x = (const int32_t *)(a->q + (size_t)64 * N * c); // chunk c of input n at x + 16 n
        const float *d = a->dv + (size_t)8 * N * c;
#pragma GCC unroll 2
        for (int b = 0; b < 2; b++) { // blocks 2c, 2c + 1: dwords 4b .. 4b + 3 of each row's chunk
            __m512i lo[4], hi[4];
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                __m512i v = _mm512_loadu_si512(p + 64 * (4 * b + j));
                lo[j] = _mm512_and_si512(v, m15);
                hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m15);
            }
            const int g = 2 * c + b;
            __m512 gsv = _mm512_setzero_ps(), gzv = _mm512_setzero_ps(); // q4g: the 16 rows' scales and zeros of group g
            if (fmt == WF_Q4G) {
                gsv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gs + (size_t)16 * g)));
                gzv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gz + (size_t)16 * g)));
            }
#pragma GCC unroll 8
            for (int n = 0; n < N; n++) {
                __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) {
                    s0 = qk_dpbusd_bcst(s0, lo[j], x + 16 * n + 4 * b + j);
                    s1 = qk_dpbusd_bcst(s1, hi[j], x + 16 * n + 8 + 4 * b + j);
                }
                __m512 dx = _mm512_set1_ps(d[8 * n + 4 * b]);
                if (fmt == WF_Q4G) {
                    acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), _mm512_mul_ps(dx, gsv), acc[n]);
                    acc[n] = _mm512_fmadd_ps(gzv, _mm512_set1_ps(a->xs[(size_t)n * ng + g]), acc[n]);
                } else {
                    acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), dx, acc[n]);
                }
            }
        }
    }
    if (fmt == WF_Q4G) {
        for (int n = 0; n < N; n++)
            _mm512_storeu_ps(out + (size_t)n * R + r0, acc[n]);
        return;
    }
    __m512 sc = _mm512_loadu_ps(w->scale + r0);
    for (int n = 0; n < N; n++)
        _mm512_storeu_ps(out + (size_t)n * R + r0,
                         _mm512_mul_ps(_mm512_sub_ps(acc[n], _mm512_set1_ps(8.0f * a->xsum[n])), sc));
}

// Tiled q8: the codes stored plus 128 (unsigned for vpdpbusd), so each block's int32 sum starts from -128 *
// the sum of the input codes it meets (a->z: (K / 64, N, 2), chunk-major); 8 vpdpbusd per block of 32 inputs
// in two chains (the dwords of a block alternate between them). Each block's integer sum is qrow_i8_q8's.
static inline __attribute__((always_inline)) void qtile_i8_q8(float *out, int R, int r0, const Weight *w,
                                                              const QkIn *a, int K, const int N) {
    const uint8_t *tile = (const uint8_t *)w->data + (size_t)r0 * K;
    __m512 acc[QUANT_DECODE_MAX_N];
#pragma GCC unroll 8
    for (int n = 0; n < N; n++)
        acc[n] = _mm512_setzero_ps();
    for (int c = 0; c < K / 64; c++) {
        const uint8_t *p = tile + 1024 * (size_t)c;
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++)
            qk_prefetch((uintptr_t)p + QK_TILE_PREFETCH + 64 * i);
        const int32_t *x = (const int32_t *)(a->q + (size_t)64 * N * c), *z = a->z + (size_t)2 * N * c;
        const float *d = a->dv + (size_t)8 * N * c;
#pragma GCC unroll 2
        for (int b = 0; b < 2; b++) { // block 2c + b: dwords 8b .. 8b + 7 of each row's chunk
            __m512i u[8];
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++)
                u[j] = _mm512_loadu_si512(p + 64 * (8 * b + j));
#pragma GCC unroll 8
            for (int n = 0; n < N; n++) {
                __m512i s0 = _mm512_set1_epi32(z[2 * n + b]), s1 = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int j = 0; j < 8; j += 2) {
                    s0 = qk_dpbusd_bcst(s0, u[j], x + 16 * n + 8 * b + j);
                    s1 = qk_dpbusd_bcst(s1, u[j + 1], x + 16 * n + 8 * b + j + 1);
                }
                acc[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), _mm512_set1_ps(d[8 * n + 4 * b]),
                                         acc[n]);
            }
        }
    }
    __m512 sc = _mm512_loadu_ps(w->scale + r0);
    for (int n = 0; n < N; n++)
        _mm512_storeu_ps(out + (size_t)n * R + r0, _mm512_mul_ps(acc[n], sc));
}

// Every tiled weight takes the int8 inputs (qk_i8_takes) at every N.
_Static_assert(QUANT_TILE_MAX_COLS * QUANT_DECODE_MAX_N <= QK_ACT_BYTES, "tiled rows wider than the int8 inputs");

// Tile r0 / 16 of w (tiled) against the N <= 8 inputs of `in`: out[n * R + r0 + i].
static void qk_tile(float *out, int R, int r0, const Weight *w, const QkIn *in, int N) {
    int K = w->cols;
    if (w->fmt == WF_Q8) {
        QK_SWITCH_N(qtile_i8_q8, out, R, r0, w, in, K)
    } else if (w->fmt == WF_Q4) {
        QK_SWITCH_N(qtile_i8_q4, out, R, r0, w, in, K, WF_Q4)
    } else if (w->fmt == WF_Q4G) {
        QK_SWITCH_N(qtile_i8_q4, out, R, r0, w, in, K, WF_Q4G)
    } else {
        qk_tile_blocks(out, R, r0, w, in, N);
    }
}

// The N <= 8 input rows (N, K) quantized for w's tiles into q, dv, xs, xsum (QkActs's layout; q4 and q4g32 in
// QK_ORDER_Q4_TILES, the others in the row's order) and z: q8 and q8_0 -128 times the sum of each 32 codes, q6_K -32
// times each 16's, in q's order (their codes are stored offset, QkIn).
static void qk_in_fill(int8_t *q, float *dv, float *xs, float *xsum, int32_t *z, const float *inp, int K, int N,
                       WeightFormat fmt) {
    qk_acts_fill_at(q, dv, xs, xsum, inp, K, N, fmt == WF_Q4 || fmt == WF_Q4G ? QK_ORDER_Q4_TILES : QK_ORDER_Q8_TILES);
    if (fmt != WF_Q8 && fmt != WF_Q8_0 && fmt != WF_Q6_K)
        return;
    const int zn = fmt == WF_Q6_K ? 16 : 32, zm = fmt == WF_Q6_K ? -32 : -128;
    for (int i = 0; i < N * K / zn; i++) {
        int32_t t = 0;
        for (int k = 0; k < zn; k++)
            t += q[(size_t)zn * i + k];
        z[i] = zm * t;
    }
}

int qk_decode_tiles(float *out, const float *inp, const Weight *w, int N) {
    int R = w->rows, K = w->cols;
    QkActs a;
    int32_t z[QK_ACT_BYTES / 16];
    qk_in_fill(a.q, a.dv, a.xs, a.xsum, z, inp, K, N, w->fmt);
    const QkIn in = {a.q, a.dv, a.xs, a.xsum, z};
#pragma omp parallel for schedule(static) if ((size_t)R * weight_row_bytes(w->fmt, K) >= QK_TILES_PARALLEL_BYTES)
    for (int r0 = 0; r0 < R; r0 += QUANT_TILE)
        qk_tile(out, R, r0, w, &in, N);
    return ER_OK;
}

// Prefill: the input rows quantized QK_PREFILL_ROWS at most at a time into the caller's scratch (about 1.9 bytes an
// input, kept in L2), then each tile of 16 weight rows meets them all, 8 at a time, while it is in L1 / L2: the
// decode kernels' order would pass over the whole matrix once per 8 input rows, more than the L3 feeds. The threads
// split the inputs' quantization, then the tiles, in one region.
#define QK_PREFILL_ACT_BYTES (768 << 10)
#define QK_PREFILL_ROWS 256
_Static_assert((size_t)QK_PREFILL_ROWS * (64 * 15 / 8 + 4) <= QUANT_TILE_ROWS * 64 * sizeof(float),
               "the prefill's inputs outgrow quant_scratch_floats");

static int qk_prefill_tiles(float *out, const float *inp, const Weight *w, int N, void *scratch) {
    int R = w->rows, K = w->cols;
    size_t row_bytes = (size_t)K * 15 / 8 + sizeof(float); // an input row's codes, scales, sums, xsum and z
    int P = (int)(QK_PREFILL_ACT_BYTES / row_bytes) / 8 * 8;
    P = P < 8 ? 8 : P > QK_PREFILL_ROWS ? QK_PREFILL_ROWS : P;
    int8_t *q = scratch;
    float *dv = (float *)(q + (size_t)P * K), *xs = dv + (size_t)P * K / 8, *xsum = xs + (size_t)P * K / 32;
    int32_t *z = (int32_t *)(xsum + P);
    for (int n0 = 0; n0 < N; n0 += P) {
        int np = N - n0 < P ? N - n0 : P, groups = (np + 7) / 8;
#pragma omp parallel if ((long)R * K * np >= THREADS_MIN_WORK)
        {
#pragma omp for schedule(static)
            for (int gi = 0; gi < groups; gi++) {
                size_t e = (size_t)8 * gi * K; // the group's first code
                int ng = np - 8 * gi < 8 ? np - 8 * gi : 8;
                qk_in_fill(q + e, dv + e / 8, xs + e / 32, xsum + 8 * gi, z + e / 16, inp + (size_t)(n0 + 8 * gi) * K,
                           K, ng, w->fmt);
            }
            float acc[QK_PREFILL_ROWS * QUANT_TILE]; // the block formats' sums of a tile
#pragma omp for schedule(static)
            for (int r0 = 0; r0 < R; r0 += QUANT_TILE) {
                if (blocks_format(w->fmt)) {
                    const QkIn in = {q, dv, xs, xsum, z};
                    qk_tile_blocks_rows(out + (size_t)n0 * R, R, r0, w, &in, np, acc);
                    continue;
                }
                for (int gi = 0; gi < groups; gi++) {
                    size_t e = (size_t)8 * gi * K;
                    int ng = np - 8 * gi < 8 ? np - 8 * gi : 8;
                    const QkIn in = {q + e, dv + e / 8, xs + e / 32, xsum + 8 * gi, z + e / 16};
                    qk_tile(out + (size_t)(n0 + 8 * gi) * R, R, r0, w, &in, ng);
                }
            }
        }
    }
    return ER_OK;
}

// q8 in pairs: vpdpbusd multiplies an unsigned operand, so the weights go in offset by 128 (w ^ 0x80 = w + 128)
// and each int32 lane starts from -128 * the sum of the input codes it will meet (xl, per input and chunk):
// the lane's integer sum is then exactly qrow_i8_q8's (which keeps the codes signed with its abs / sign
// trick, a 256-bit form only), and so is the output. The registers hold what qrow_i8_q8's do, two rows
// each: chunk c's bytes 0-15 and 32-47 of rows r and r + 1 in one, 16-31 and 48-63 in the other.
static inline __attribute__((always_inline)) void qpairs_i8_q8(float *out, int R, int r0, const Weight *w,
                                                               const QkActs *a, const int32_t *xl, int K,
                                                               const int P, const WeightFormat fmt, const int N) {
    (void)fmt;
    const int8_t *row[2 * QK_I8_PAIRS];
    for (int i = 0; i < 2 * P; i++) // the last row again where the block runs past R
        row[i] = (const int8_t *)w->data + (size_t)(r0 + i < R ? r0 + i : R - 1) * K;
    const int A = N <= 2 ? 2 : 1; // qrow_i8_q8's chains
    __m512 acc[QK_I8_PAIRS * QUANT_DECODE_MAX_N];
#pragma GCC unroll 16
    for (int i = 0; i < P * N * A; i++)
        acc[i] = _mm512_setzero_ps();
    const __m512i off = _mm512_set1_epi8((char)0x80);
    const __m512i lo = _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13), hi = _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15);
    for (int c = 0; c < K / 64; c++) {
        if (P == QK_I8_PAIRS) { // the next block's 2 * P * K contiguous bytes, 2 * P lines per chunk
            uintptr_t nx = (uintptr_t)row[0] + (size_t)2 * P * K + 2 * P * 64 * (size_t)c;
#pragma GCC unroll 4
            for (int i = 0; i < 2 * P; i++)
                qk_prefetch(nx + 64 * i);
        }
        __m512i u0[QK_I8_PAIRS], u1[QK_I8_PAIRS];
#pragma GCC unroll 2
        for (int p = 0; p < P; p++) {
            __m512i v0 = _mm512_loadu_si512(row[2 * p] + 64 * c), v1 = _mm512_loadu_si512(row[2 * p + 1] + 64 * c);
            u0[p] = _mm512_xor_si512(_mm512_permutex2var_epi64(v0, lo, v1), off);
            u1[p] = _mm512_xor_si512(_mm512_permutex2var_epi64(v0, hi, v1), off);
        }
#pragma GCC unroll 8
        for (int n = 0; n < N; n++) {
            const int8_t *xq = a->q + (size_t)n * K + 64 * c;
            __m512i x0 = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)xq));
            __m512i x1 = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xq + 32)));
            __m512i z = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xl + (size_t)n * (K / 8) + 8 * c)));
            __m512 dv = _mm512_broadcast_f32x8(_mm256_loadu_ps(a->dv + (size_t)n * (K / 8) + 8 * c));
#pragma GCC unroll 2
            for (int p = 0; p < P; p++) {
                __m512i i32 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, u0[p], x0), u1[p], x1);
                __m512 *ac = &acc[(p * N + n) * A + c % A];
                *ac = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i32), dv, *ac);
            }
        }
    }
    for (int p = 0; p < P; p++)
        for (int n = 0; n < N; n++)
            for (int h = 0; h < 2 && r0 + 2 * p + h < R; h++) {
                __m256 sum = pair_half(acc + (p * N + n) * A, A, h);
                out[(size_t)n * R + r0 + 2 * p + h] = hsum256(sum) * w->scale[r0 + 2 * p + h];
            }
}

static void qk_i8_pairs_q8(float *out, const Weight *w, const QkActs *a, int N) {
    int R = w->rows, K = w->cols;
    int32_t xl[QK_ACT_BYTES / 8]; // (N, K / 64, 8): -128 * the codes each int32 lane of a chunk's product meets
    const __m256i ones = _mm256_set1_epi8(1);
    for (int i = 0; i < N * K / 64; i++) {
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(a->q + 64 * (size_t)i));
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(a->q + 64 * (size_t)i + 32));
        __m256i t = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, x0), ones, x1);
        _mm256_storeu_si256((__m256i *)(xl + 8 * (size_t)i), _mm256_mullo_epi32(t, _mm256_set1_epi32(-128)));
    }
    QK_PAIRS_ROWS(qpairs_i8_q8, QK_I8_PAIRS, WF_Q8, out, R, r0, w, a, xl, K)
}

// q8 at N = 1 keeps qrow_i8_q8, one row streamed at a time, which beats the pairs there (the lm_head); from
// N = 2 the pairs win.
#define QK_I8_TAKE_PAIRS(FMT)                                                                               \
    if (FMT != WF_Q8 || N > 1) {                                                                            \
        (FMT == WF_Q8 ? qk_i8_pairs_q8 : FMT == WF_Q4 ? qk_i8_pairs_q4 : qk_i8_pairs_q4g)(out, w, &a, N);   \
        return ER_OK;                                                                                       \
    }
#define QK_I8_TAKE_TILES(FMT)                                                                               \
    if (w->tiled)                                                                                          \
        return qk_decode_tiles(out, inp, w, N);
#else
#define QK_I8_TAKE_PAIRS(FMT)
#define QK_I8_TAKE_TILES(FMT)
#endif

// Row r (RW rows from r) at the N of the product, N a constant in each case.
#define QK_I8_ROW(FMT, RW)                                                                                  \
    switch (N) {                                                                                           \
    case 1: qrow_i8(out, R, r, w, &a, K, 1, FMT, RW); break;                                               \
    case 2: qrow_i8(out, R, r, w, &a, K, 2, FMT, RW); break;                                               \
    case 3: qrow_i8(out, R, r, w, &a, K, 3, FMT, RW); break;                                               \
    case 4: qrow_i8(out, R, r, w, &a, K, 4, FMT, RW); break;                                               \
    case 5: qrow_i8(out, R, r, w, &a, K, 5, FMT, RW); break;                                               \
    case 6: qrow_i8(out, R, r, w, &a, K, 6, FMT, RW); break;                                               \
    case 7: qrow_i8(out, R, r, w, &a, K, 7, FMT, RW); break;                                               \
    default: qrow_i8(out, R, r, w, &a, K, 8, FMT, RW); break;                                              \
    }

#define QK_I8(FMT, name)                                                                                    \
    int qk_decode_simd_##name(float *out, const float *inp, const Weight *w, int N) {                     \
        if (!qk_i8_takes(w, N))                                                                            \
            return qk_float_##name(out, inp, w, N);                                                        \
        int R = w->rows, K = w->cols;                                                                      \
        QkActs a;                                                                                          \
        QK_I8_TAKE_TILES(FMT)                                                                              \
        qk_acts_fill(&a, inp, K, N, FMT == WF_Q8 ? QK_ORDER_Q8 : QK_ORDER_Q4);                             \
        if (FMT == WF_Q4G)                                                                                 \
            qk_group_sums(a.xs, K, N, w->group);                                                           \
        QK_I8_TAKE_PAIRS(FMT)                                                                              \
        int RW = FMT != WF_Q8 && K > QK_I8_PAIR_COLS && (size_t)N * K * 3 / 2 > QK_L1_INPUTS ? 2 : 1;     \
        _Pragma("omp parallel for schedule(static) if ((long)R * K * N >= THREADS_MIN_WORK)")               \
        for (int r = 0; r < R - RW + 1; r += RW) {                                                         \
            if (RW == 2) {                                                                                 \
                QK_I8_ROW(FMT, 2);                                                                         \
            } else {                                                                                       \
                QK_I8_ROW(FMT, 1);                                                                         \
            }                                                                                              \
        }                                                                                                  \
        if (RW == 2 && R % 2) {                                                                            \
            int r = R - 1;                                                                                 \
            QK_I8_ROW(FMT, 1);                                                                             \
        }                                                                                                  \
        return ER_OK;                                                                                      \
    }

QK_I8(WF_Q8, q8)
QK_I8(WF_Q4, q4)
QK_I8(WF_Q4G, q4g)

#if QK_AVX512
// ---- fp32 and bf16 weights on AVX-512: two weight rows per register ----
// Past a few input rows the fp32 products are bound by the multiply-adds, 8 lanes at a time in the portable
// path. Here a 16-lane register holds 8 columns of two weight rows (row r in lanes 0-7, row r + 1 in lanes
// 8-15) and each input row's 8 columns are broadcast to both halves, so one multiply and one add serve two
// weight rows while each half keeps gemm_dot_f32's lanes and order: the products are bit for bit the
// portable path's, at every N (a multiply, then an add: fused, they would round otherwise). QK_PAIRS pairs
// per pass: at N = 8, 3 * 8 accumulators, 3 weight pairs and one input in the 32 registers.
#define QK_PAIRS 3

// Columns k .. k + 7 of rows w0 and w1 (fp32 or bf16, as element offsets) as one register.
static inline __m512 pair8(const void *w0, const void *w1, int k, const WeightFormat fmt) {
    if (fmt == WF_F32)
        return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps((const float *)w0 + k)),
                                  _mm256_loadu_ps((const float *)w1 + k), 1);
    __m128i h0 = _mm_loadu_si128((const __m128i *)((const uint16_t *)w0 + k));
    __m128i h1 = _mm_loadu_si128((const __m128i *)((const uint16_t *)w1 + k));
    __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(h0), h1, 1);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); // a bf16 is an fp32's top half
}

static inline float elem_f32(const void *row, int j, const WeightFormat fmt) {
    return fmt == WF_F32 ? ((const float *)row)[j] : bf16_to_f32(((const uint16_t *)row)[j]);
}

// gemm_lanes_sum of each half of the P accumulators acc[0], acc[N], acc[2N] (P <= 3): lane i holds row i's
// sum (row 2p in half 0 of acc[pN], 2p + 1 in half 1), each in gemm_lanes_sum's order, ((l0 + l1) + (l2 + l3)) +
// ((l4 + l5) + (l6 + l7)), by shuffles of all the halves at once (summed lane by lane, a block's 48 sums at
// N = 8 would be a large share of a short-K product's time).
static inline __m512 pairs_sums(const __m512 *acc, int N, const int P) {
    __m512 a0 = acc[0], a1 = P > 1 ? acc[N] : a0, a2 = P > 2 ? acc[2 * N] : a0;
    // per 128-bit quarter: (x0 + x1, x2 + x3, y0 + y1, y2 + y3) of x = a0, y = a1; then of a2, a2
    __m512 p01 = _mm512_add_ps(_mm512_shuffle_ps(a0, a1, 0x88), _mm512_shuffle_ps(a0, a1, 0xdd));
    __m512 p22 = _mm512_add_ps(_mm512_shuffle_ps(a2, a2, 0x88), _mm512_shuffle_ps(a2, a2, 0xdd));
    // per quarter: (l0 + l1) + (l2 + l3) of that quarter of a0, a1, a2, a2
    __m512 q = _mm512_add_ps(_mm512_shuffle_ps(p01, p22, 0x88), _mm512_shuffle_ps(p01, p22, 0xdd));
    // quarters 0 + 1 (the halves 0 of a0, a1, a2 in lanes 0-2) and 2 + 3 (the halves 1, lanes 8-10)
    __m512 h = _mm512_add_ps(q, _mm512_shuffle_f32x4(q, q, 0xb1));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15), h);
}

// Rows r0 .. r0 + 2P - 1 (the last one repeated where it runs past R) against the N inputs.
static inline __attribute__((always_inline)) void pairs_block(float *out, int R, int r0, const Weight *w,
                                                              const float *inp, int K, const int P,
                                                              const WeightFormat fmt, const int N) {
    const void *row[2 * QK_PAIRS];
    size_t rb = weight_row_bytes(fmt, K);
    for (int i = 0; i < 2 * P; i++)
        row[i] = (const uint8_t *)w->data + (size_t)(r0 + i < R ? r0 + i : R - 1) * rb;
    __m512 acc[QK_PAIRS * QUANT_DECODE_MAX_N];
#pragma GCC unroll 24
    for (int i = 0; i < P * N; i++)
        acc[i] = _mm512_setzero_ps();
    int K8 = K & ~7;
    // fp32: the next block is prefetched at the pace this one is read (the hardware prefetcher does not keep
    // 6 row streams ahead). Not bf16, which is slower with it.
    uintptr_t next = (uintptr_t)row[0] + 2 * P * rb;
    for (int k = 0; k < K8; k += 8) {
        if (fmt == WF_F32)
#pragma GCC unroll 3
            for (int o = 0; o < 2 * P * 8 * 4; o += 64)
                qk_prefetch(next + (size_t)k * 2 * P * 4 + o);
        __m512 wv[QK_PAIRS];
#pragma GCC unroll 3
        for (int p = 0; p < P; p++)
            wv[p] = pair8(row[2 * p], row[2 * p + 1], k, fmt);
#pragma GCC unroll 8
        for (int n = 0; n < N; n++) {
            __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(inp + (size_t)n * K + k));
#pragma GCC unroll 3
            for (int p = 0; p < P; p++)
                acc[p * N + n] = _mm512_add_ps(acc[p * N + n], _mm512_mul_ps(wv[p], xv));
        }
    }
    const int nv = R - r0 < 2 * P ? R - r0 : 2 * P; // the block's rows inside R
    for (int n = 0; n < N; n++) {
        __m512 sums = pairs_sums(acc + n, N, P);
        if (K8 == K) {
            _mm512_mask_storeu_ps(out + (size_t)n * R + r0, (__mmask16)((1u << nv) - 1), sums);
            continue;
        }
        float s[16];
        _mm512_storeu_ps(s, sums);
        for (int i = 0; i < nv; i++) {
            for (int j = K8; j < K; j++)
                s[i] += elem_f32(row[i], j, fmt) * inp[(size_t)n * K + j];
            out[(size_t)n * R + r0 + i] = s[i];
        }
    }
}

// Rows r0 .. r0 + 2P - 1 against all `rows` inputs, at most QUANT_DECODE_MAX_N per pass while the block's
// weights stay in cache (fp32 takes up to QUANT_BATCH_MAX_N rows): each output summed as at N = 1.
static inline __attribute__((always_inline)) void pairs_groups(float *out, int R, int r0, const Weight *w,
                                                               const float *inp, int K, const int P,
                                                               const WeightFormat fmt, int rows) {
    for (int n0 = 0; n0 < rows; n0 += QUANT_DECODE_MAX_N) {
        int N = rows - n0 < QUANT_DECODE_MAX_N ? rows - n0 : QUANT_DECODE_MAX_N;
        QK_SWITCH_N(pairs_block, out + (size_t)n0 * R, R, r0, w, inp + (size_t)n0 * K, K, P, fmt);
    }
}

#define QK_PAIRS_KERNEL(FMT, name)                                                                         \
    int name(float *out, const float *inp, const Weight *w, int N) {                                       \
        int R = w->rows, K = w->cols, full = R - R % (2 * QK_PAIRS);                                       \
        _Pragma("omp parallel for schedule(static) if ((long)R * K * N >= THREADS_MIN_WORK)")              \
        for (int r0 = 0; r0 < full; r0 += 2 * QK_PAIRS)                                                    \
            pairs_groups(out, R, r0, w, inp, K, QK_PAIRS, FMT, N);                                         \
        for (int r0 = full; r0 < R; r0 += 2)                                                               \
            pairs_groups(out, R, r0, w, inp, K, 1, FMT, N);                                                \
        return ER_OK;                                                                                      \
    }

static QK_PAIRS_KERNEL(WF_F32, qk_pairs_f32)
static QK_PAIRS_KERNEL(WF_BF16, qk_pairs_bf16)

// One input row is bound by the weight stream, which one row at a time reads best (the portable fp32
// product, the bf16 kernel above); the pairs from N = 2 on.
int qk_decode_simd_f32(float *out, const float *inp, const Weight *w, int N) {
    return N == 1 ? WEIGHT_DECODE_DECLINED : qk_pairs_f32(out, inp, w, N);
}
#endif

int qk_decode_simd_bf16(float *out, const float *inp, const Weight *w, int N) {
#if QK_AVX512
    if (N > 1)
        return qk_pairs_bf16(out, inp, w, N);
#endif
    return qk_float_bf16(out, inp, w, N);
}

// ---- dequantizing tiles for the GEMM path (prefill, backward) ----

// Row r of a q8, q4 or q4g (group a multiple of 16) weight as fp32, 16 codes per step, bit for bit what
// weight_row_f32 gives (the same products and sums, unfused): the scalar rows cost prefill as much as a
// good part of the GEMM. 0 for a weight it does not take.
int qk_dequant_row_simd(float *dst, const Weight *w, int r) {
    int K = w->cols, k = 0;
    uint8_t buf[QUANT_PACKED_ROW_MAX];
    const uint8_t *row = weight_packed_row(w, r, buf);
    if (w->fmt == WF_Q8) {
        __m256 s = _mm256_set1_ps(w->scale[r]);
        for (; k + 8 <= K; k += 8)
            _mm256_storeu_ps(dst + k, _mm256_mul_ps(codes8_i8((const int8_t *)row, k), s));
        for (; k < K; k++)
            dst[k] = (float)((const int8_t *)row)[k] * w->scale[r];
        return 1;
    }
    if (w->fmt != WF_Q4 && (w->fmt != WF_Q4G || w->group % 16))
        return 0;
    const __m256i m15 = _mm256_set1_epi32(15);
    const __m256 eight = _mm256_set1_ps(8.0f);
    int full = K & ~15;
    for (; k < full; k += 16) {
        __m256i v = block8(row + k / 2);
        __m256 c0 = _mm256_cvtepi32_ps(_mm256_and_si256(v, m15)), c1 = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
        if (w->fmt == WF_Q4) {
            __m256 s = _mm256_set1_ps(w->scale[r]);
            c0 = _mm256_mul_ps(_mm256_sub_ps(c0, eight), s);
            c1 = _mm256_mul_ps(_mm256_sub_ps(c1, eight), s);
        } else { // the 16 codes share one group
            size_t g = weight_group_index(w, r, k / w->group);
            __m256 s = _mm256_set1_ps(half_to_f32(w->gscale[g])), z = _mm256_set1_ps(half_to_f32(w->gzero[g]));
            c0 = _mm256_add_ps(_mm256_mul_ps(c0, s), z);
            c1 = _mm256_add_ps(_mm256_mul_ps(c1, s), z);
        }
        _mm256_storeu_ps(dst + k, c0);
        _mm256_storeu_ps(dst + k + 8, c1);
    }
    for (; k < K; k++) // q4 only: a q4g row whose group is a multiple of 16 has no tail
        dst[k] = ((float)quant_code4(row, K, k) - 8.0f) * w->scale[r];
    return 1;
}

#endif

#if QK_SIMD
// ---- int8 activations, shared by the AVX2 and the NEON kernels (portable C, one rounding) ----

// 32 inputs as int8 codes (elements 8j .. 8j + 7 at q + at[j]) with scale *d = max|x| / 127, and their fp32 sum *xs
// added as 8 lanes of 4 (lane i: x[i] + x[8+i] + x[16+i] + x[24+i]), the lanes as ((0+4)+(2+6))+((1+5)+(3+7)): the
// order the AVX2 kernels were measured with. Codes round to nearest even (x * (127 / max|x|) plus and minus 1.5 *
// 2^23, what cvtps2dq does under the default MXCSR); an out-of-range value saturates to +-127 and a NaN (also what a
// block under 127 / FLT_MAX makes of its zeros) becomes -127: never -128, whose negation the x86 one-row q8 kernel's
// sign trick cannot hold, so that every kernel sums the same integers. In GCC's vectors (8 lanes, compares as lane
// masks) so that it vectorises on both CPUs: it runs on one thread before each int8 product, three times per layer
// on the same input.
typedef int32_t qk_v8i __attribute__((vector_size(32)));
typedef int8_t qk_v8b __attribute__((vector_size(8)));

static inline v8f qk_select(qk_v8i mask, v8f a, v8f b) { // mask ? a : b, lane by lane
    return (v8f)(((qk_v8i)a & mask) | ((qk_v8i)b & ~mask));
}

void qk_quant_block(int8_t *q, const int at[4], float *d, float *xs, const float *x) {
    v8f v[4], t = {0}, m = {0};
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        LOAD8(v[j], x + 8 * j);
        v8f a = (v8f)((qk_v8i)v[j] & 0x7fffffff);
        m = qk_select(a > m, a, m);
        t += v[j];
    }
    // the largest lane in every lane (exact in any order; m holds no NaN)
    v8f s = __builtin_shufflevector(m, m, 4, 5, 6, 7, 0, 1, 2, 3);
    m = qk_select(s > m, s, m);
    s = __builtin_shufflevector(m, m, 2, 3, 0, 1, 6, 7, 4, 5);
    m = qk_select(s > m, s, m);
    s = __builtin_shufflevector(m, m, 1, 0, 3, 2, 5, 4, 7, 6);
    m = qk_select(s > m, s, m);
    float amax = m[0];
    *d = amax / 127.0f;
    *xs = ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
    float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const v8f hi = {127, 127, 127, 127, 127, 127, 127, 127}, lo = {-127, -127, -127, -127, -127, -127, -127, -127};
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        v8f r = (v[j] * id + 12582912.0f) - 12582912.0f;
        r = qk_select(r >= hi, hi, qk_select(r >= lo, r, lo)); // NaN: both false, -127
        qk_v8b c = __builtin_convertvector(__builtin_convertvector(r, qk_v8i), qk_v8b);
        memcpy(q + at[j], &c, sizeof c);
    }
}

void qk_acts_fill(QkActs *a, const float *inp, int K, int N, QkOrder order) {
    qk_acts_fill_at(a->q, a->dv, a->xs, a->xsum, inp, K, N, order);
}

void qk_acts_fill_at(int8_t *codes, float *scales, float *sums, float *xsum, const float *inp, int K, int N,
                     QkOrder order) {
    int nb = K / 32, chunked = order == QK_ORDER_Q4_TILES || order == QK_ORDER_Q8_TILES;
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * K;
        // chunk c of input n at q + 64 * cs * c, its scales at dv + 8 * cs * c
        size_t first = chunked ? (size_t)n : (size_t)n * (K / 64), cs = chunked ? (size_t)N : 1;
        int8_t *q = codes + 64 * first;
        float *xs = sums + (size_t)n * nb, *dv = scales + 8 * first, d;
        double t = 0;
        for (int b = 0; b < nb; b++) {
            // Elements 8j .. 8j + 7 of block b go to bytes at[j] .. at[j] + 7 of its chunk (from c): element e
            // to 32 * ((e / 8) % 2) + 16 * (b % 2) + 8 * (e / 16) + e % 8 (Q4) or 32 * (e / 16) + 16 * (b % 2)
            // + e % 16 (Q8), or in order (Q8_TILES).
            static const int at_q4[4] = {0, 32, 8, 40}, at_q8[4] = {0, 8, 32, 40}, at_row[4] = {0, 8, 16, 24};
            const int *at = order == QK_ORDER_Q8 ? at_q8 : order == QK_ORDER_Q8_TILES ? at_row : at_q4;
            int8_t *c = q + 64 * cs * (b / 2) + (order == QK_ORDER_Q8_TILES ? 32 : 16) * (b % 2);
            qk_quant_block(c, at, &d, &xs[b], x + 32 * b);
            t += xs[b];
            for (int i = 0; i < 4; i++)
                dv[8 * cs * (b / 2) + 4 * (b % 2) + i] = d;
        }
        xsum[n] = (float)t;
    }
}
#endif

#if QK_SIMD
#if QK_GEMM_BLOCKS
static const char *qk_name(void) { return "AVX-512 VNNI"; }
#elif QK_AVX2
static const char *qk_name(void) { return "AVX2"; }
#else
#define qk_name qk_neon_features
#endif

const QkKernels qk_kernels = {
    .name = qk_name,
    .decode =
        {
            [WF_F32] = QK_DECODE_F32,
            [WF_BF16] = QK_DECODE(bf16),
            [WF_F16] = QK_DECODE(f16),
            [WF_Q8] = QK_DECODE(q8),
            [WF_Q4] = QK_DECODE(q4),
            [WF_Q4G] = QK_DECODE(q4g),
            [WF_Q4LUT] = QK_DECODE(q4lut),
            [WF_Q2LUT] = QK_DECODE(q2lut),
            [WF_Q8_0] = QK_DECODE(q8_0),
            [WF_Q4_0] = QK_DECODE(q4_0),
            [WF_Q4_1] = QK_DECODE(q4_1),
            [WF_Q5_0] = QK_DECODE(q5_0),
            [WF_Q5_1] = QK_DECODE(q5_1),
            [WF_Q4_K] = QK_DECODE(q4_k),
            [WF_Q5_K] = QK_DECODE(q5_k),
            [WF_Q6_K] = QK_DECODE(q6_k),
        },
#if QK_GEMM_BLOCKS
    .tiles = QK_TILES,
    .prefill_tiles = qk_prefill_tiles,
    .prefill_blocks = qk_gemm_blocks,
#endif
#if QK_AVX2
    .dequant_row = qk_dequant_row_simd,
#endif
};
#endif
