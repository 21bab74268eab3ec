// Decode kernels of the GGUF block formats (layouts in quant/blocks.h) on int8 inputs: x86 AVX2 (vpmaddubsw +
// vpmaddwd) or AVX512-VNNI (vpdpbusd) where the compiler targets it, aarch64 NEON (SDOT where the CPU has
// dotprod, else SMULL + pairwise adds: the same integers; SMMLA where it also has i8mm, two weight rows by two
// input rows per instruction, at every N: the same integers, two lanes' at a time). Every format is cut into
// sub-blocks of 32 elements whose codes unpack into one register of 32 unsigned bytes u (q8_0: on AVX2 the signed
// codes, their signs moved onto the inputs; with VNNI q + 128, the offset -128 s), with a scale s and an offset o
// per half of 16 (q6_K's two sub-blocks; equal halves elsewhere): W = s * u + o. Against input row n's codes xq (one
// scale dx per 32, qk_quant_block, as for q8):
//   Σ_k W_k x_k ≈ Σ_h dx * s_h * Σ_{k in h} u_k xq_k + o_h * Σ_{k in h} x_k
// the integer sums in int32 lanes 0-3 (half 0) and 4-7 (half 1), one conversion and two FMAs per sub-block,
// the fp32 sums of the inputs exact. The error is the int8 rounding of the inputs, as for q8 / q4. Those are the
// kernels on the file's rows; with AVX512-VNNI the runtime tiles the rows at load (quant_tile) and the tiled kernels
// below (qtile_blocks, for decode and, through quant/qkernel.c's qk_prefill_tiles, prefill) take them instead.
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/threads.h"
#include "quant/blocks.h"
#include "quant/qkernel.h"

#if QK_AVX2 || defined(__aarch64__)
// The N input rows, quantized once per product by the portable qk_quant_block (the codes of q8's kernels on both
// CPUs), in element order: codes (N, K), the scale of each block of 32 (N, K / 32) and the same in 8 lanes
// (N, K / 32, 8), and the fp32 sum of each half of 16 over 4, in lanes 0-3 and 4-7 of 8 (N, K / 32, 8) (summed
// over the lanes it is the half's sum). 120 KB: one per thread, not on its stack.
typedef struct {
    int8_t q[QK_ACT_BYTES];
    float d[QK_ACT_BYTES / 32];
    float dv[QK_ACT_BYTES / 4];
    float hs[QK_ACT_BYTES / 4];
} QbActs;

static void qb_acts_fill(QbActs *a, const float *inp, int K, int N) {
    static const int at[4] = {0, 8, 16, 24};
    for (int n = 0; n < N; n++)
        for (int b = 0; b < K / 32; b++) {
            const float *x = inp + (size_t)n * K + 32 * b;
            float xs, h0 = 0, h1 = 0;
            size_t i = (size_t)n * (K / 32) + b;
            qk_quant_block(a->q + 32 * i, at, &a->d[i], &xs, x);
            for (int k = 0; k < 16; k++) {
                h0 += x[k];
                h1 += x[16 + k];
            }
            for (int l = 0; l < 4; l++) {
                a->hs[8 * i + l] = h0 * 0.25f;
                a->hs[8 * i + 4 + l] = h1 * 0.25f;
            }
            for (int l = 0; l < 8; l++)
                a->dv[8 * i + l] = a->d[i];
        }
}

// Elements and bytes per block: the format table's (blocks_elems / blocks_bytes), where the compiler sees them, so
// that each kernel is specialised on its format's (one that disagreed would fail every product against the
// portable path in tests/quant/test_kernels.c).
static inline int qb_elems(const WeightFormat fmt) {
    return fmt == WF_Q4_K || fmt == WF_Q5_K || fmt == WF_Q6_K ? 256 : 32;
}
static inline int qb_bytes(const WeightFormat fmt) {
    switch (fmt) {
    case WF_Q8_0: return 34;
    case WF_Q4_0: return 18;
    case WF_Q4_1: return 20;
    case WF_Q5_0: return 22;
    case WF_Q5_1: return 24;
    case WF_Q4_K: return 144;
    case WF_Q5_K: return 176;
    default: return 210;
    }
}
#endif

#if QK_AVX2

// One sub-block of 32: codes, and scale and offset per half (lanes 0-3, 4-7).
typedef struct {
    __m256i u;
    __m256 s, o;
} QbSub;

static inline float qb_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static inline __m256 qb_halves(float a, float b) { return _mm256_setr_ps(a, a, a, a, b, b, b, b); }

// 16 bytes of nibbles: low nibbles elements 0-15, high nibbles 16-31.
static inline __m256i qb_nibbles(const uint8_t *qs) {
    __m128i q = _mm_loadu_si128((const __m128i *)qs), m = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

// 16 in byte k where bit k of the 32 bits at qh is set.
static inline __m256i qb_bit4(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i index = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                                           3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)h), index), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(16));
}

// Sub-block j of the block at b (the row's sub-block j of 32 elements, counted from the block's start).
static inline __attribute__((always_inline)) QbSub qb_sub(const uint8_t *b, int j, const WeightFormat fmt) {
    QbSub s;
    const __m256i m4 = _mm256_set1_epi8(15);
    switch (fmt) {
    case WF_Q8_0:
        s.u = _mm256_loadu_si256((const __m256i *)(b + 2));
        s.s = _mm256_set1_ps(qb_half(b));
        s.o = _mm256_setzero_ps();
        break;
    case WF_Q4_0: {
        float d = qb_half(b);
        s.u = qb_nibbles(b + 2);
        s.s = _mm256_set1_ps(d);
        s.o = _mm256_set1_ps(-8.0f * d);
        break;
    }
    case WF_Q4_1:
        s.u = qb_nibbles(b + 4);
        s.s = _mm256_set1_ps(qb_half(b));
        s.o = _mm256_set1_ps(qb_half(b + 2));
        break;
    case WF_Q5_0: {
        float d = qb_half(b);
        s.u = _mm256_or_si256(qb_nibbles(b + 6), qb_bit4(b + 2));
        s.s = _mm256_set1_ps(d);
        s.o = _mm256_set1_ps(-16.0f * d);
        break;
    }
    case WF_Q5_1:
        s.u = _mm256_or_si256(qb_nibbles(b + 8), qb_bit4(b + 4));
        s.s = _mm256_set1_ps(qb_half(b));
        s.o = _mm256_set1_ps(qb_half(b + 2));
        break;
    case WF_Q4_K:
    case WF_Q5_K: {
        int five = fmt == WF_Q5_K, sc, m;
        __m256i q = _mm256_loadu_si256((const __m256i *)(b + (five ? 48 : 16) + 32 * (j / 2)));
        s.u = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(q, 4) : q, m4);
        if (five) {
            __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
            __m256i hb = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j)), _mm256_set1_epi8(1));
            s.u = _mm256_or_si256(s.u, _mm256_slli_epi16(hb, 4));
        }
        blocks_k_scale_min(j, b + 4, &sc, &m);
        s.s = _mm256_set1_ps(qb_half(b) * (float)sc);
        s.o = _mm256_set1_ps(-(qb_half(b + 2) * (float)m));
        break;
    }
    case WF_Q6_K: { // sub-block j: chunk c = j / 4 of 128, quarter t = j % 4 of it
        int c = j / 4, t = j % 4;
        __m256i ql = _mm256_loadu_si256((const __m256i *)(b + 64 * c + 32 * (t & 1)));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * c));
        __m256i lo = _mm256_and_si256(t >= 2 ? _mm256_srli_epi16(ql, 4) : ql, m4);
        __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * t)), _mm256_set1_epi8(3));
        s.u = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
        const int8_t *sc = (const int8_t *)(b + 192) + 8 * c + 2 * t;
        float d = qb_half(b + 208), s0 = d * (float)sc[0], s1 = d * (float)sc[1];
        s.s = qb_halves(s0, s1);
        s.o = qb_halves(-32.0f * s0, -32.0f * s1);
        break;
    }
    default: s.u = _mm256_setzero_si256(), s.s = s.o = _mm256_setzero_ps(); break;
    }
    return s;
}

#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
// Row r against the N inputs, out[n * R + r]: with AVX512-VNNI two sub-blocks per register (q8_0 as unsigned codes
// q + 128, the offset -128 s on the input sums, as in the prefill below), the last one alone where K / 32 is odd.
static inline __attribute__((always_inline)) void qb_row512(float *out, const Weight *w, const QbActs *a, int r, int R,
                                                            const int N, const WeightFormat fmt) {
    int K = w->cols, E = qb_elems(fmt), nsub = K / 32;
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * weight_row_bytes(fmt, K);
    __m512 acc[QUANT_DECODE_MAX_N];
#pragma GCC unroll 8
    for (int n = 0; n < N; n++)
        acc[n] = _mm512_setzero_ps();
    for (int sb = 0; sb < nsub; sb += 2) {
        int two = sb + 1 < nsub;
        QbSub s0 = qb_sub(row + (size_t)(32 * sb / E) * qb_bytes(fmt), sb % (E / 32), fmt), s1 = s0;
        if (two)
            s1 = qb_sub(row + (size_t)(32 * (sb + 1) / E) * qb_bytes(fmt), (sb + 1) % (E / 32), fmt);
        __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(s0.u), s1.u, 1);
        __m512 sv = _mm512_insertf32x8(_mm512_castps256_ps512(s0.s), s1.s, 1);
        __m512 ov = _mm512_insertf32x8(_mm512_castps256_ps512(s0.o), s1.o, 1);
        if (fmt == WF_Q8_0) {
            u = _mm512_xor_si512(u, _mm512_set1_epi8((char)0x80));
            ov = _mm512_mul_ps(sv, _mm512_set1_ps(-128.0f));
        }
        __mmask16 m = two ? 0xffff : 0x00ff;
#pragma GCC unroll 8
        for (int n = 0; n < N; n++) {
            size_t i = (size_t)n * nsub + sb;
            __m512i x = _mm512_maskz_loadu_epi32(m, a->q + 32 * i);
            __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, x));
            acc[n] = _mm512_fmadd_ps(dot, _mm512_mul_ps(sv, _mm512_maskz_loadu_ps(m, a->dv + 8 * i)), acc[n]);
            acc[n] = _mm512_fmadd_ps(ov, _mm512_maskz_loadu_ps(m, a->hs + 8 * i), acc[n]);
        }
    }
#pragma GCC unroll 8
    for (int n = 0; n < N; n++)
        out[(size_t)n * R + r] = _mm512_reduce_add_ps(acc[n]);
}
#define QB_ROW qb_row512
#else
static inline float qb_hsum(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
}

// Row r against the N inputs: out[n * R + r].
static inline __attribute__((always_inline)) void qb_row(float *out, const Weight *w, const QbActs *a, int r, int R,
                                                         const int N, const WeightFormat fmt) {
    int K = w->cols, E = qb_elems(fmt), nsub = K / 32;
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * weight_row_bytes(fmt, K);
    __m256 acc[QUANT_DECODE_MAX_N];
    #pragma GCC unroll 8
    for (int n = 0; n < N; n++)
        acc[n] = _mm256_setzero_ps();
    for (int sb = 0; sb < nsub; sb++) {
        QbSub s = qb_sub(row + (size_t)(32 * sb / E) * qb_bytes(fmt), sb % (E / 32), fmt);
        __m256i u = fmt == WF_Q8_0 ? _mm256_abs_epi8(s.u) : s.u;
        #pragma GCC unroll 8
        for (int n = 0; n < N; n++) {
            size_t i = (size_t)n * nsub + sb;
            __m256i x = _mm256_loadu_si256((const __m256i *)(a->q + 32 * i));
            if (fmt == WF_Q8_0)
                x = _mm256_sign_epi8(x, s.u);
            __m256 dot = _mm256_cvtepi32_ps(qk_dot_u8(_mm256_setzero_si256(), u, x));
            acc[n] = _mm256_fmadd_ps(dot, _mm256_mul_ps(s.s, _mm256_set1_ps(a->d[i])), acc[n]);
            if (fmt != WF_Q8_0)
                acc[n] = _mm256_fmadd_ps(s.o, _mm256_loadu_ps(a->hs + 8 * i), acc[n]);
        }
    }
    #pragma GCC unroll 8
    for (int n = 0; n < N; n++)
        out[(size_t)n * R + r] = qb_hsum(acc[n]);
}
#define QB_ROW qb_row
#endif

#define QB_SWITCH_N(FMT)                                                                                   \
    switch (N) {                                                                                           \
    case 1: QB_ROW(out, w, a, r, R, 1, FMT); break;                                                         \
    case 2: QB_ROW(out, w, a, r, R, 2, FMT); break;                                                         \
    case 3: QB_ROW(out, w, a, r, R, 3, FMT); break;                                                         \
    case 4: QB_ROW(out, w, a, r, R, 4, FMT); break;                                                         \
    case 5: QB_ROW(out, w, a, r, R, 5, FMT); break;                                                         \
    case 6: QB_ROW(out, w, a, r, R, 6, FMT); break;                                                         \
    case 7: QB_ROW(out, w, a, r, R, 7, FMT); break;                                                         \
    default: QB_ROW(out, w, a, r, R, 8, FMT); break;                                                        \
    }

#ifdef QK_TILES // AVX512-VNNI (make TILES=0 keeps the kernels and tiles nothing)
// ---- tiled blocks (quant_tile; layout in quant/blocks.h) ----
// As the tiled q8 and q4 kernels (quant/qkernel.c): one 64-byte load gives 4 codes of each of 16 rows, one row per
// int32 lane, so a sub-block of 32 inputs is 8 vpdpbusd against input codes broadcast from memory
// (QK_ORDER_Q8_TILES), then per input row one conversion and one FMA with the rows' scales times the input's, and
// (the formats with an offset) one FMA of the rows' offsets with the sub-block's fp32 input sum: W = s * u + o, o = m,
// -8 d (q4_0), -16 d (q5_0) or -dmin * m (k-quants). q8_0's codes are stored plus 128 and q6_K's are u = q + 32: their
// integer sums start from -128 (-32) times the sum of the input codes they meet (z: per 32 inputs for q8_0, per 16 for
// q6_K, whose two halves of a sub-block have scales of their own). The k-quants' sub-block scales and offsets of the 16
// rows are unpacked once per block of 256 into sv / ov.

// Sub-block g of the 16 rows of a tile, unpacked: u[t] holds elements 4t .. 4t + 3 of each row (one row per int32
// lane), d the rows' scales (q6_K: of the first half, d1 of the second), o their offsets.
typedef struct {
    __m512i u[8];
    __m512 d, d1, o;
} QbTileSub;

// The tile's sub-block g (tile: the tile's first byte); the k-quants' scales and offsets of the block's sub-blocks
// are unpacked into sv / ov at its first sub-block (so g must go up from there).
static inline __attribute__((always_inline)) QbTileSub qb_tile_sub(const uint8_t *tile, int g, float sv[16][16],
                                                                   float ov[8][16], const WeightFormat fmt,
                                                                   const int prefetch) {
    const int bb = qb_bytes(fmt), nsub = qb_elems(fmt) / 32;
    const int has_m = fmt == WF_Q4_1 || fmt == WF_Q5_1, five = fmt == WF_Q5_0 || fmt == WF_Q5_1;
    const int kq = fmt == WF_Q4_K || fmt == WF_Q5_K;
    const __m512i m15 = _mm512_set1_epi8(15), m16 = _mm512_set1_epi8(16), m48 = _mm512_set1_epi8(48);
    const int j = g % nsub;                                         // the sub-block of 32 in its block
    const uint8_t *p = tile + (size_t)QUANT_TILE * bb * (g / nsub); // the 16 rows' block
    QbTileSub t;
    if (prefetch && j == 0) { // every line of the block QK_TILE_PREFETCH ahead: 16 blocks are rarely whole lines
        uintptr_t a = ((uintptr_t)p + QK_TILE_PREFETCH) & ~(uintptr_t)63, end = (uintptr_t)p + QK_TILE_PREFETCH + 16 * bb;
        for (; a < end; a += 64)
            qk_prefetch(a);
    }
    if (kq && j == 0) { // 16 * 4: the 12 scale bytes, byte s of the 16 rows at 64 + 16 s
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)));
        __m128i q[12];
        for (int b = 0; b < 12; b++)
            q[b] = _mm_loadu_si128((const __m128i *)(p + 64 + 16 * b));
        const __m128i m63 = _mm_set1_epi8(63), m15x = _mm_set1_epi8(15), m48x = _mm_set1_epi8(48);
        for (int i = 0; i < 8; i++) { // blocks_k_scale_min on 16 rows
            __m128i sc, mn;
            if (i < 4) {
                sc = _mm_and_si128(q[i], m63);
                mn = _mm_and_si128(q[i + 4], m63);
            } else {
                sc = _mm_or_si128(_mm_and_si128(q[i + 4], m15x), _mm_and_si128(_mm_srli_epi16(q[i - 4], 2), m48x));
                mn = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(q[i + 4], 4), m15x),
                                  _mm_and_si128(_mm_srli_epi16(q[i], 2), m48x));
            }
            _mm512_storeu_ps(sv[i], _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sc))));
            _mm512_storeu_ps(ov[i], _mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), dmin),
                                                  _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(mn))));
        }
    }
    if (fmt == WF_Q6_K && j == 0) { // 16 * 208: d; 16 * 192: the 16 int8 scales, scale s of the 16 rows at 16 s
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 16 * 208)));
        for (int i = 0; i < 16; i++) {
            __m128i sc = _mm_loadu_si128((const __m128i *)(p + 16 * 192 + 16 * i));
            _mm512_storeu_ps(sv[i], _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc))));
        }
    }
    t.d = t.d1 = t.o = _mm512_setzero_ps();
    if (kq) {
        t.d = _mm512_loadu_ps(sv[j]);
        t.o = _mm512_loadu_ps(ov[j]);
    } else if (fmt == WF_Q6_K) {
        t.d = _mm512_loadu_ps(sv[2 * j]);
        t.d1 = _mm512_loadu_ps(sv[2 * j + 1]);
    } else {
        t.d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        if (has_m)
            t.o = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)));
        else if (fmt == WF_Q5_0)
            t.o = _mm512_mul_ps(t.d, _mm512_set1_ps(-16.0f));
        else if (fmt == WF_Q4_0)
            t.o = _mm512_mul_ps(t.d, _mm512_set1_ps(-8.0f));
    }
    if (fmt == WF_Q8_0) {
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
            t.u[i] = _mm512_loadu_si512(p + 32 + 64 * i);
    } else if (!kq && fmt != WF_Q6_K) { // qs: elements 4i .. in the low nibbles of dword i, 16 + 4i .. high
        const uint8_t *qs = p + 16 * (2 + 2 * has_m + 4 * five);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            __m512i v = _mm512_loadu_si512(qs + 64 * i);
            t.u[i] = _mm512_and_si512(v, m15);
            t.u[i + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m15);
        }
        if (five) { // bit 8b + i of a row's h to bit 4 of byte b of u[i]
            __m512i h = _mm512_loadu_si512(p + 32 + 32 * has_m);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                __m512i hb = i < 4 ? _mm512_slli_epi32(h, 4 - i) : _mm512_srli_epi32(h, i - 4);
                t.u[i] = _mm512_or_si512(t.u[i], _mm512_and_si512(hb, m16));
            }
        }
    } else if (kq) { // qs at 16 * 16 (q5_K: 16 * 48): sub-block j in the low (j even) or high nibbles of 64 .. of
                     // dwords 8 (j / 2) + i; q5_K's high bit: bit j of the bytes of qh's dword i (16 * 16)
        const uint8_t *qs = p + 16 * (fmt == WF_Q5_K ? 48 : 16) + 512 * (j / 2);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            __m512i v = _mm512_loadu_si512(qs + 64 * i);
            t.u[i] = _mm512_and_si512(j % 2 ? _mm512_srli_epi16(v, 4) : v, m15);
            if (fmt == WF_Q5_K) {
                __m512i h = _mm512_loadu_si512(p + 16 * 16 + 64 * i);
                __m512i hb = j < 4 ? _mm512_sll_epi32(h, _mm_cvtsi32_si128(4 - j))
                                   : _mm512_srl_epi32(h, _mm_cvtsi32_si128(j - 4));
                t.u[i] = _mm512_or_si512(t.u[i], _mm512_and_si512(hb, m16));
            }
        }
    } else { // q6_K: sub-block j = quarter k of chunk c; 4 bits from ql's dwords 16c + 8 (k % 2) + i (k >= 2: the
             // high nibbles), 2 from bits 2k, 2k + 1 of qh's (16 * 128) dwords 8c + i
        const int c = j / 4, k = j % 4;
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            __m512i v = _mm512_loadu_si512(p + 64 * (16 * c + 8 * (k % 2) + i));
            __m512i h = _mm512_loadu_si512(p + 16 * 128 + 64 * (8 * c + i));
            __m512i hb = k < 2 ? _mm512_sll_epi32(h, _mm_cvtsi32_si128(4 - 2 * k))
                               : _mm512_srl_epi32(h, _mm_cvtsi32_si128(2 * k - 4));
            t.u[i] = _mm512_or_si512(_mm512_and_si512(k >= 2 ? _mm512_srli_epi16(v, 4) : v, m15),
                                     _mm512_and_si512(hb, m48));
        }
    }
    return t;
}

// acc + one input row's sub-block against the unpacked t: x its 8 dwords of codes, dx their scale, xs their fp32 sum,
// z the offset sums (q8_0: z[0]; q6_K: z[0], z[1], per half).
static inline __attribute__((always_inline)) __m512 qb_tile_dot(__m512 acc, const QbTileSub *t, const int32_t *x,
                                                               float dx, float xs, const int32_t *z,
                                                               const WeightFormat fmt) {
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    if (fmt == WF_Q8_0)
        s0 = _mm512_set1_epi32(z[0]);
    if (fmt == WF_Q6_K) { // the halves apart: elements 0-15, 16-31
        s0 = _mm512_set1_epi32(z[0]);
        s1 = _mm512_set1_epi32(z[1]);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            s0 = qk_dpbusd_bcst(s0, t->u[i], x + i);
            s1 = qk_dpbusd_bcst(s1, t->u[i + 4], x + i + 4);
        }
        __m512 dxv = _mm512_set1_ps(dx);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(t->d, dxv), acc);
        return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(t->d1, dxv), acc);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 8; i += 2) {
        s0 = qk_dpbusd_bcst(s0, t->u[i], x + i);
        s1 = qk_dpbusd_bcst(s1, t->u[i + 1], x + i + 1);
    }
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), _mm512_mul_ps(t->d, _mm512_set1_ps(dx)), acc);
    if (fmt != WF_Q8_0)
        acc = _mm512_fmadd_ps(t->o, _mm512_set1_ps(xs), acc);
    return acc;
}

// Tile r0 / 16 against the N <= 8 inputs of a (chunk-major, QkIn): out[n * R + r0 + i]; the decode kernel.
static inline __attribute__((always_inline)) void qtile_blocks(float *out, int R, int r0, const Weight *w,
                                                               const QkIn *a, int K, const WeightFormat fmt,
                                                               const int N) {
    const int ng = K / 32, zs = fmt == WF_Q6_K ? 2 : 1; // z per 32 inputs
    const uint8_t *tile = (const uint8_t *)w->data + (size_t)r0 * (K / qb_elems(fmt)) * qb_bytes(fmt);
    __m512 acc[QUANT_DECODE_MAX_N];
#pragma GCC unroll 8
    for (int n = 0; n < N; n++)
        acc[n] = _mm512_setzero_ps();
    float sv[16][16], ov[8][16];
    for (int g = 0; g < ng; g++) {
        QbTileSub t = qb_tile_sub(tile, g, sv, ov, fmt, 1);
        const int c = g / 2, b = g % 2;
#pragma GCC unroll 8
        for (int n = 0; n < N; n++) {
            size_t i = 2 * ((size_t)c * N + n) + b; // input n's sub-block g among a->q's blocks of 32
            acc[n] = qb_tile_dot(acc[n], &t, (const int32_t *)(a->q + 32 * i), a->dv[4 * i], a->xs[(size_t)n * ng + g],
                                 a->z + zs * i, fmt);
        }
    }
    for (int n = 0; n < N; n++)
        _mm512_storeu_ps(out + (size_t)n * R + r0, acc[n]);
}

// The prefill's tile: tile r0 / 16 against np input rows, quantized in groups of 8 (group k's codes at q + 8 k K, its
// scales, sums and offset sums at dv + k K, xs + k K / 4, z + k K / 2, chunk-major as QkIn within the group), each
// sub-block unpacked once for all of them: the rows' sums in acc (np, 16) floats (L1) between sub-blocks.
static inline __attribute__((always_inline)) void qtile_blocks_rows(float *out, int R, int r0, const Weight *w,
                                                                    const QkIn *a, int np, float *acc,
                                                                    const WeightFormat fmt) {
    const int K = w->cols, ng = K / 32, zs = fmt == WF_Q6_K ? 2 : 1;
    const uint8_t *tile = (const uint8_t *)w->data + (size_t)r0 * (K / qb_elems(fmt)) * qb_bytes(fmt);
    memset(acc, 0, sizeof(float) * 16 * (size_t)np);
    float sv[16][16], ov[8][16];
    for (int g = 0; g < ng; g++) {
        QbTileSub t = qb_tile_sub(tile, g, sv, ov, fmt, 0);
        const int c = g / 2, b = g % 2;
        for (int n0 = 0; n0 < np; n0 += 8) {
            const int N = np - n0 < 8 ? np - n0 : 8; // the group's rows
            const int8_t *q = a->q + (size_t)n0 * K;
            const float *dv = a->dv + (size_t)n0 * K / 8, *xs = a->xs + (size_t)n0 * ng;
            const int32_t *z = a->z + (size_t)n0 * K / 16;
            for (int n = 0; n < N; n++) {
                size_t i = 2 * ((size_t)c * N + n) + b;
                float *o = acc + 16 * (size_t)(n0 + n);
                _mm512_storeu_ps(o, qb_tile_dot(_mm512_loadu_ps(o), &t, (const int32_t *)(q + 32 * i), dv[4 * i],
                                                 xs[(size_t)n * ng + g], z + zs * i, fmt));
            }
        }
    }
    for (int n = 0; n < np; n++)
        _mm512_storeu_ps(out + (size_t)n * R + r0, _mm512_loadu_ps(acc + 16 * (size_t)n));
}

#define QB_TILE_SWITCH_N(FMT)                                                                              \
    switch (N) {                                                                                           \
    case 1: qtile_blocks(out, R, r0, w, in, K, FMT, 1); break;                                              \
    case 2: qtile_blocks(out, R, r0, w, in, K, FMT, 2); break;                                              \
    case 3: qtile_blocks(out, R, r0, w, in, K, FMT, 3); break;                                              \
    case 4: qtile_blocks(out, R, r0, w, in, K, FMT, 4); break;                                              \
    case 5: qtile_blocks(out, R, r0, w, in, K, FMT, 5); break;                                              \
    case 6: qtile_blocks(out, R, r0, w, in, K, FMT, 6); break;                                              \
    case 7: qtile_blocks(out, R, r0, w, in, K, FMT, 7); break;                                              \
    default: qtile_blocks(out, R, r0, w, in, K, FMT, 8); break;                                             \
    }

void qk_tile_blocks(float *out, int R, int r0, const Weight *w, const QkIn *in, int N) {
    int K = w->cols;
    switch (w->fmt) {
    case WF_Q8_0: QB_TILE_SWITCH_N(WF_Q8_0) break;
    case WF_Q4_0: QB_TILE_SWITCH_N(WF_Q4_0) break;
    case WF_Q4_1: QB_TILE_SWITCH_N(WF_Q4_1) break;
    case WF_Q5_0: QB_TILE_SWITCH_N(WF_Q5_0) break;
    case WF_Q5_1: QB_TILE_SWITCH_N(WF_Q5_1) break;
    case WF_Q4_K: QB_TILE_SWITCH_N(WF_Q4_K) break;
    case WF_Q5_K: QB_TILE_SWITCH_N(WF_Q5_K) break;
    default: QB_TILE_SWITCH_N(WF_Q6_K) break;
    }
}
void qk_tile_blocks_rows(float *out, int R, int r0, const Weight *w, const QkIn *in, int np, float *acc) {
    switch (w->fmt) {
    case WF_Q8_0: qtile_blocks_rows(out, R, r0, w, in, np, acc, WF_Q8_0); break;
    case WF_Q4_0: qtile_blocks_rows(out, R, r0, w, in, np, acc, WF_Q4_0); break;
    case WF_Q4_1: qtile_blocks_rows(out, R, r0, w, in, np, acc, WF_Q4_1); break;
    case WF_Q5_0: qtile_blocks_rows(out, R, r0, w, in, np, acc, WF_Q5_0); break;
    case WF_Q5_1: qtile_blocks_rows(out, R, r0, w, in, np, acc, WF_Q5_1); break;
    case WF_Q4_K: qtile_blocks_rows(out, R, r0, w, in, np, acc, WF_Q4_K); break;
    case WF_Q5_K: qtile_blocks_rows(out, R, r0, w, in, np, acc, WF_Q5_K); break;
    default: qtile_blocks_rows(out, R, r0, w, in, np, acc, WF_Q6_K); break;
    }
}
#define QB_TAKE_TILES                                                                                      \
    if (w->tiled)                                                                                          \
        return qk_decode_tiles(out, inp, w, N);
#else
#define QB_TAKE_TILES
#endif

// The caller's inputs, quantized, for whichever format it multiplies (one buffer a thread for all of them: static TLS
// is set up for every thread the process starts); the region's threads read it.
static _Thread_local QbActs qb_acts;

// Rows in parallel; the inputs quantized once for all of them (on this thread, before the region).
#define QB_DECODE(FMT, name, TAKE_TILES)                                                                   \
    int qk_decode_simd_##name(float *out, const float *inp, const Weight *w, int N) {                     \
        int R = w->rows, K = w->cols;                                                                      \
        if ((size_t)N * (size_t)K > QK_ACT_BYTES)                                                          \
            return WEIGHT_DECODE_DECLINED;                                                                 \
        TAKE_TILES                                                                                         \
        QbActs *a = &qb_acts;                                                                              \
        qb_acts_fill(a, inp, K, N);                                                                        \
        _Pragma("omp parallel for schedule(static) if ((long)R * K * N >= THREADS_MIN_WORK)")               \
        for (int r = 0; r < R; r++)                                                                        \
            QB_SWITCH_N(FMT)                                                                               \
        return ER_OK;                                                                                      \
    }

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
// ---- prefill: many input rows, one input row per int32 lane ----
// Past the decode sizes each unpacked sub-block of a weight row meets QB_LANES input rows at once: its 32 codes are
// broadcast 4 at a time against 16 input rows' codes laid lane by lane (QbLanes), so one vpdpbusd does 64 of the
// products and the float work (a conversion and two FMAs) is per 16 input rows per sub-block, not per input row. The
// same sub-blocks (qb_sub), input codes (qk_quant_block) and formula as the decode kernels above, so the two agree
// to the order of the fp32 sums.
#define QB_LANES 16    // input rows per register
#define QB_GROUPS 4    // registers of input rows per pass over a weight row (64 input rows)
#define QB_CHUNK 64    // input rows quantized per pass over the matrix
#define QB_ROWS 2      // weight rows per pass

// Block b of 32 inputs of 16 input rows: q[j][l] holds elements 4j .. 4j + 3 of row l's codes; its scale and the
// fp32 sums of its halves and of the whole block per row. Rows past the input are zero.
typedef struct {
    int8_t q[8][QB_LANES][4];
    float dx[QB_LANES], h0[QB_LANES], h1[QB_LANES], hs[QB_LANES];
} QbLanes;

// The scratch: QB_CHUNK / QB_LANES QbLanes per block of 32 columns, within quant_scratch_floats(cols) floats.
_Static_assert((QB_CHUNK / QB_LANES) * sizeof(QbLanes) <= 32 * QUANT_TILE_ROWS * sizeof(float),
               "qk_gemm_blocks' inputs outgrow quant_scratch_floats");

static void qb_lanes_fill(QbLanes *lb, const float *inp, int K, int nc) {
    static const int at[4] = {0, 8, 16, 24};
    int nb = K / 32, G = (nc + QB_LANES * QB_GROUPS - 1) / (QB_LANES * QB_GROUPS) * QB_GROUPS; // whole passes
    memset(lb, 0, (size_t)G * nb * sizeof *lb);
#pragma omp parallel for schedule(static) if ((long)nc * K >= THREADS_MIN_WORK)
    for (int n = 0; n < nc; n++) {
        int g = n / QB_LANES, l = n % QB_LANES;
        for (int b = 0; b < nb; b++) {
            const float *x = inp + (size_t)n * K + 32 * b;
            QbLanes *p = lb + (size_t)g * nb + b;
            int8_t q[32];
            float xs, h0 = 0, h1 = 0;
            qk_quant_block(q, at, &p->dx[l], &xs, x);
            for (int j = 0; j < 8; j++)
                memcpy(p->q[j][l], q + 4 * j, 4);
            for (int k = 0; k < 16; k++) {
                h0 += x[k];
                h1 += x[16 + k];
            }
            p->h0[l] = h0;
            p->h1[l] = h1;
            p->hs[l] = h0 + h1;
        }
    }
}

// Rows r0 .. r0 + RB - 1 against the G <= QB_GROUPS registers of input rows from group g0: out[n * R + r].
static inline __attribute__((always_inline)) void qb_gemm_rows(float *out, const Weight *w, const QbLanes *lb,
                                                                int r0, int g0, int nc, int R, const int RB,
                                                                const WeightFormat fmt) {
    int K = w->cols, E = qb_elems(fmt), nb = K / 32, halves = fmt == WF_Q6_K;
    size_t rb = weight_row_bytes(fmt, K);
    __m512 acc[QB_ROWS][QB_GROUPS];
    #pragma GCC unroll 8
    for (int r = 0; r < RB; r++)
        #pragma GCC unroll 8
        for (int v = 0; v < QB_GROUPS; v++)
            acc[r][v] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        uint8_t codes[QB_ROWS][32];
        float s0[QB_ROWS], s1[QB_ROWS], o0[QB_ROWS], o1[QB_ROWS];
        #pragma GCC unroll 8
        for (int r = 0; r < RB; r++) {
            const uint8_t *row = (const uint8_t *)w->data + (size_t)(r0 + r) * rb;
            QbSub sub = qb_sub(row + (size_t)(32 * b / E) * qb_bytes(fmt), b % (E / 32), fmt);
            __m256i u = sub.u;
            if (fmt == WF_Q8_0) { // unsigned codes q + 128, whose offset -128 s the input sums carry
                u = _mm256_xor_si256(u, _mm256_set1_epi8((char)0x80));
                sub.o = _mm256_mul_ps(sub.s, _mm256_set1_ps(-128.0f));
            }
            _mm256_storeu_si256((__m256i *)codes[r], u);
            s0[r] = _mm256_cvtss_f32(sub.s);
            o0[r] = _mm256_cvtss_f32(sub.o);
            s1[r] = _mm256_cvtss_f32(_mm256_permutevar8x32_ps(sub.s, _mm256_set1_epi32(4)));
            o1[r] = _mm256_cvtss_f32(_mm256_permutevar8x32_ps(sub.o, _mm256_set1_epi32(4)));
        }
        #pragma GCC unroll 8
        for (int v = 0; v < QB_GROUPS; v++) {
            const QbLanes *p = lb + (size_t)(g0 + v) * nb + b;
            __m512i i0[QB_ROWS], i1[QB_ROWS];
            #pragma GCC unroll 8
            for (int r = 0; r < RB; r++)
                i0[r] = i1[r] = _mm512_setzero_si512();
            #pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                __m512i x = _mm512_loadu_si512((const void *)p->q[j]);
                #pragma GCC unroll 8
                for (int r = 0; r < RB; r++) {
                    int32_t c;
                    memcpy(&c, codes[r] + 4 * j, 4);
                    if (halves && j >= 4)
                        i1[r] = _mm512_dpbusd_epi32(i1[r], _mm512_set1_epi32(c), x);
                    else
                        i0[r] = _mm512_dpbusd_epi32(i0[r], _mm512_set1_epi32(c), x);
                }
            }
            __m512 dx = _mm512_loadu_ps(p->dx);
            #pragma GCC unroll 8
            for (int r = 0; r < RB; r++) {
                acc[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0[r]), _mm512_mul_ps(_mm512_set1_ps(s0[r]), dx), acc[r][v]);
                if (halves) {
                    acc[r][v] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1[r]), _mm512_mul_ps(_mm512_set1_ps(s1[r]), dx), acc[r][v]);
                    acc[r][v] = _mm512_fmadd_ps(_mm512_set1_ps(o0[r]), _mm512_loadu_ps(p->h0), acc[r][v]);
                    acc[r][v] = _mm512_fmadd_ps(_mm512_set1_ps(o1[r]), _mm512_loadu_ps(p->h1), acc[r][v]);
                } else {
                    acc[r][v] = _mm512_fmadd_ps(_mm512_set1_ps(o0[r]), _mm512_loadu_ps(p->hs), acc[r][v]);
                }
            }
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < RB; r++)
        #pragma GCC unroll 8
        for (int v = 0; v < QB_GROUPS; v++) {
            float t[QB_LANES];
            _mm512_storeu_ps(t, acc[r][v]);
            for (int l = 0; l < QB_LANES && (g0 + v) * QB_LANES + l < nc; l++)
                out[(size_t)((g0 + v) * QB_LANES + l) * R + r0 + r] = t[l];
        }
}

#define QB_GEMM(FMT, name)                                                                                 \
    static void qb_gemm_##name(float *out, const Weight *w, const QbLanes *lb, int nc) {                  \
        int R = w->rows, G = (nc + QB_LANES - 1) / QB_LANES, nrb = R / QB_ROWS;                          \
        _Pragma("omp parallel for schedule(static) collapse(2)")                                           \
        for (int i = 0; i < nrb + R % QB_ROWS; i++)                                                        \
            for (int g0 = 0; g0 < G; g0 += QB_GROUPS) {                                                    \
                if (i < nrb)                                                                               \
                    qb_gemm_rows(out, w, lb, QB_ROWS * i, g0, nc, R, QB_ROWS, FMT);                        \
                else                                                                                       \
                    qb_gemm_rows(out, w, lb, QB_ROWS * nrb + (i - nrb), g0, nc, R, 1, FMT);                \
            }                                                                                              \
    }
QB_GEMM(WF_Q8_0, q8_0)
QB_GEMM(WF_Q4_0, q4_0)
QB_GEMM(WF_Q4_1, q4_1)
QB_GEMM(WF_Q5_0, q5_0)
QB_GEMM(WF_Q5_1, q5_1)
QB_GEMM(WF_Q4_K, q4_k)
QB_GEMM(WF_Q5_K, q5_k)
QB_GEMM(WF_Q6_K, q6_k)

int qk_gemm_blocks(float *out, const float *inp, const Weight *w, int N, void *scratch) {
    int K = w->cols;
    QbLanes *lb = scratch;
    for (int n0 = 0; n0 < N; n0 += QB_CHUNK) {
        int nc = N - n0 < QB_CHUNK ? N - n0 : QB_CHUNK;
        qb_lanes_fill(lb, inp + (size_t)n0 * K, K, nc);
        float *o = out + (size_t)n0 * w->rows;
        switch (w->fmt) {
        case WF_Q8_0: qb_gemm_q8_0(o, w, lb, nc); break;
        case WF_Q4_0: qb_gemm_q4_0(o, w, lb, nc); break;
        case WF_Q4_1: qb_gemm_q4_1(o, w, lb, nc); break;
        case WF_Q5_0: qb_gemm_q5_0(o, w, lb, nc); break;
        case WF_Q5_1: qb_gemm_q5_1(o, w, lb, nc); break;
        case WF_Q4_K: qb_gemm_q4_k(o, w, lb, nc); break;
        case WF_Q5_K: qb_gemm_q5_k(o, w, lb, nc); break;
        case WF_Q6_K: qb_gemm_q6_k(o, w, lb, nc); break;
        default: return WEIGHT_DECODE_DECLINED;
        }
    }
    return ER_OK;
}
#endif

QB_DECODE(WF_Q8_0, q8_0, QB_TAKE_TILES)
QB_DECODE(WF_Q4_0, q4_0, QB_TAKE_TILES)
QB_DECODE(WF_Q4_1, q4_1, QB_TAKE_TILES)
QB_DECODE(WF_Q5_0, q5_0, QB_TAKE_TILES)
QB_DECODE(WF_Q5_1, q5_1, QB_TAKE_TILES)
QB_DECODE(WF_Q4_K, q4_k, QB_TAKE_TILES)
QB_DECODE(WF_Q5_K, q5_k, QB_TAKE_TILES)
QB_DECODE(WF_Q6_K, q6_k, QB_TAKE_TILES)

#endif

#if defined(__aarch64__)
#include <arm_neon.h>
#include <sys/auxv.h>

#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1 << 13)
#endif

// One sub-block of 32 on NEON: codes of elements 0-15 and 16-31 as int8 (every code < 128, q8_0's signed as
// they are, so SDOT takes them and q8_0 needs no offset), scale and offset per half.
typedef struct {
    int8x16_t lo, hi;
    float s0, s1, o0, o1;
} QbSubN;

static inline float qbn_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32(h);
}

// 16 in byte k where bit k of the 16 bits at bits is set.
static inline uint8x16_t qbn_bit4(uint16_t bits) {
    static const uint8_t mask[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    uint8x16_t v = vcombine_u8(vdup_n_u8((uint8_t)bits), vdup_n_u8((uint8_t)(bits >> 8)));
    return vandq_u8(vtstq_u8(v, vld1q_u8(mask)), vdupq_n_u8(16));
}

static inline __attribute__((always_inline)) QbSubN qbn_sub(const uint8_t *b, int j, const WeightFormat fmt) {
    QbSubN s;
    const uint8x16_t m4 = vdupq_n_u8(15);
    uint8x16_t lo, hi;
    switch (fmt) {
    case WF_Q8_0:
        s.lo = vld1q_s8((const int8_t *)b + 2);
        s.hi = vld1q_s8((const int8_t *)b + 18);
        s.s0 = s.s1 = qbn_half(b);
        s.o0 = s.o1 = 0.0f;
        return s;
    case WF_Q4_0: {
        uint8x16_t q = vld1q_u8(b + 2);
        lo = vandq_u8(q, m4);
        hi = vshrq_n_u8(q, 4);
        s.s0 = s.s1 = qbn_half(b);
        s.o0 = s.o1 = -8.0f * s.s0;
        break;
    }
    case WF_Q4_1:
    case WF_Q5_0:
    case WF_Q5_1: {
        int at = fmt == WF_Q4_1 ? 4 : fmt == WF_Q5_0 ? 6 : 8;
        uint8x16_t q = vld1q_u8(b + at);
        lo = vandq_u8(q, m4);
        hi = vshrq_n_u8(q, 4);
        if (fmt != WF_Q4_1) {
            uint32_t h;
            memcpy(&h, b + (fmt == WF_Q5_0 ? 2 : 4), 4);
            lo = vorrq_u8(lo, qbn_bit4((uint16_t)h));
            hi = vorrq_u8(hi, qbn_bit4((uint16_t)(h >> 16)));
        }
        float d = qbn_half(b);
        s.s0 = s.s1 = d;
        s.o0 = s.o1 = fmt == WF_Q5_0 ? -16.0f * d : qbn_half(b + 2);
        break;
    }
    case WF_Q4_K:
    case WF_Q5_K: {
        int five = fmt == WF_Q5_K, sc, m;
        const uint8_t *q = b + (five ? 48 : 16) + 32 * (j / 2);
        uint8x16_t q0 = vld1q_u8(q), q1 = vld1q_u8(q + 16);
        lo = j % 2 ? vshrq_n_u8(q0, 4) : vandq_u8(q0, m4);
        hi = j % 2 ? vshrq_n_u8(q1, 4) : vandq_u8(q1, m4);
        if (five) {
            int8x16_t sh = vdupq_n_s8((int8_t)-j);
            uint8x16_t one = vdupq_n_u8(1);
            lo = vorrq_u8(lo, vshlq_n_u8(vandq_u8(vshlq_u8(vld1q_u8(b + 16), sh), one), 4));
            hi = vorrq_u8(hi, vshlq_n_u8(vandq_u8(vshlq_u8(vld1q_u8(b + 32), sh), one), 4));
        }
        blocks_k_scale_min(j, b + 4, &sc, &m);
        s.s0 = s.s1 = qbn_half(b) * (float)sc;
        s.o0 = s.o1 = -(qbn_half(b + 2) * (float)m);
        break;
    }
    default: { // q6_K: sub-block j is quarter t of chunk c
        int c = j / 4, t = j % 4;
        const uint8_t *ql = b + 64 * c + 32 * (t & 1), *qh = b + 128 + 32 * c;
        uint8x16_t l0 = vld1q_u8(ql), l1 = vld1q_u8(ql + 16);
        int8x16_t sh = vdupq_n_s8((int8_t)(-2 * t));
        uint8x16_t three = vdupq_n_u8(3);
        lo = vorrq_u8(t >= 2 ? vshrq_n_u8(l0, 4) : vandq_u8(l0, m4),
                      vshlq_n_u8(vandq_u8(vshlq_u8(vld1q_u8(qh), sh), three), 4));
        hi = vorrq_u8(t >= 2 ? vshrq_n_u8(l1, 4) : vandq_u8(l1, m4),
                      vshlq_n_u8(vandq_u8(vshlq_u8(vld1q_u8(qh + 16), sh), three), 4));
        const int8_t *sc = (const int8_t *)(b + 192) + 8 * c + 2 * t;
        float d = qbn_half(b + 208);
        s.s0 = d * (float)sc[0];
        s.s1 = d * (float)sc[1];
        s.o0 = -32.0f * s.s0;
        s.o1 = -32.0f * s.s1;
        break;
    }
    }
    s.lo = vreinterpretq_s8_u8(lo);
    s.hi = vreinterpretq_s8_u8(hi);
    return s;
}

typedef int32x4_t (*QbDotFn)(int32x4_t acc, int8x16_t a, int8x16_t b);

// acc lane j += a[4j..4j+3] · b[4j..4j+3] on ARMv8.0 (what SDOT computes).
static inline int32x4_t qbn_dot_base(int32x4_t acc, int8x16_t a, int8x16_t b) {
    int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b)), hi = vmull_high_s8(a, b);
    return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)));
}

// Row r against the N inputs: out[n * R + r], as the x86 kernels' formula.
static inline __attribute__((always_inline)) void qbn_row(float *out, const Weight *w, const QbActs *a, int r, int R,
                                                          const int N, const WeightFormat fmt, QbDotFn dot) {
    int K = w->cols, E = qb_elems(fmt), nsub = K / 32;
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * weight_row_bytes(fmt, K);
    float32x4_t acc[QUANT_DECODE_MAX_N];
#pragma GCC unroll 8
    for (int n = 0; n < N; n++)
        acc[n] = vdupq_n_f32(0.0f);
    for (int sb = 0; sb < nsub; sb++) {
        QbSubN s = qbn_sub(row + (size_t)(32 * sb / E) * qb_bytes(fmt), sb % (E / 32), fmt);
#pragma GCC unroll 8
        for (int n = 0; n < N; n++) {
            size_t i = (size_t)n * nsub + sb;
            const int8_t *x = a->q + 32 * i;
            int32x4_t i0 = dot(vdupq_n_s32(0), s.lo, vld1q_s8(x)), i1 = dot(vdupq_n_s32(0), s.hi, vld1q_s8(x + 16));
            float d = a->d[i];
            acc[n] = vfmaq_n_f32(acc[n], vcvtq_f32_s32(i0), s.s0 * d);
            acc[n] = vfmaq_n_f32(acc[n], vcvtq_f32_s32(i1), s.s1 * d);
            if (fmt != WF_Q8_0) {
                acc[n] = vfmaq_n_f32(acc[n], vld1q_f32(a->hs + 8 * i), s.o0);
                acc[n] = vfmaq_n_f32(acc[n], vld1q_f32(a->hs + 8 * i + 4), s.o1);
            }
        }
    }
#pragma GCC unroll 8
    for (int n = 0; n < N; n++)
        out[(size_t)n * R + r] = vaddvq_f32(acc[n]);
}

#define QBN_SWITCH_N(FMT, DOT)                                                                             \
    switch (N) {                                                                                           \
    case 1: qbn_row(out, w, a, r, R, 1, FMT, DOT); break;                                                   \
    case 2: qbn_row(out, w, a, r, R, 2, FMT, DOT); break;                                                   \
    case 3: qbn_row(out, w, a, r, R, 3, FMT, DOT); break;                                                   \
    case 4: qbn_row(out, w, a, r, R, 4, FMT, DOT); break;                                                   \
    case 5: qbn_row(out, w, a, r, R, 5, FMT, DOT); break;                                                   \
    case 6: qbn_row(out, w, a, r, R, 6, FMT, DOT); break;                                                   \
    case 7: qbn_row(out, w, a, r, R, 7, FMT, DOT); break;                                                   \
    default: qbn_row(out, w, a, r, R, 8, FMT, DOT); break;                                                  \
    }

#define QBN_ROWS(FMT, name, DOT, suffix)                                                                   \
    static void qbn_rows_##name##_##suffix(float *out, const Weight *w, const QbActs *a, int N) {         \
        int R = w->rows, K = w->cols;                                                                      \
        _Pragma("omp parallel for schedule(static) if ((long)R * K * N >= THREADS_MIN_WORK)")               \
        for (int r = 0; r < R; r++)                                                                        \
            QBN_SWITCH_N(FMT, DOT)                                                                         \
    }

#define QBN_ALL(DOT, suffix)                                                                               \
    QBN_ROWS(WF_Q8_0, q8_0, DOT, suffix)                                                                   \
    QBN_ROWS(WF_Q4_0, q4_0, DOT, suffix)                                                                   \
    QBN_ROWS(WF_Q4_1, q4_1, DOT, suffix)                                                                   \
    QBN_ROWS(WF_Q5_0, q5_0, DOT, suffix)                                                                   \
    QBN_ROWS(WF_Q5_1, q5_1, DOT, suffix)                                                                   \
    QBN_ROWS(WF_Q4_K, q4_k, DOT, suffix)                                                                   \
    QBN_ROWS(WF_Q5_K, q5_k, DOT, suffix)                                                                   \
    QBN_ROWS(WF_Q6_K, q6_k, DOT, suffix)

QBN_ALL(qbn_dot_base, base)

#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
static inline int32x4_t qbn_dot_dp(int32x4_t acc, int8x16_t a, int8x16_t b) { return vdotq_s32(acc, a, b); }
QBN_ALL(qbn_dot_dp, dp)
#pragma GCC pop_options

// ---- i8mm: two weight rows x two input rows per SMMLA ----
// One SMMLA multiplies a 2x8 int8 tile (8 codes of input rows 2p and 2p + 1) by an 8x2 one (the same 8 elements of
// weight rows r and r + 1) into a 2x2 int32 tile [x_2p · w_r, x_2p · w_r+1, x_2p+1 · w_r, x_2p+1 · w_r+1]: a
// sub-block of 32 is 4 SMMLA for those 4 products, where the SDOT kernel above takes 8 SDOT. The weight codes are
// qbn_sub's and the input codes qk_quant_block's, both signed int8 (the unsigned codes are < 128), so a lane holds
// the exact sum of the SDOT kernel's lanes of the same half; per half (q6_K, whose halves have scales of their own)
// or per sub-block (the others: one scale and offset for both halves, the halves' integers added), each lane then
// takes the SDOT kernel's fp32 terms s * dx * Σ u x + o * Σ x: the products are the SDOT kernel's up to the order
// of the fp32 sums. An odd N's last pair has a row of zeros; an odd R's last row is its own partner. Each lane sums
// its own input row and weight row in the same order whatever the other rows are, so an input row's outputs are
// the same bits at every N, N = 1 included (its partner zeros), which batched decoding relies on (a request's tokens
// the same decoded alone or beside others): N = 1 runs here too where the CPU has i8mm, not on the SDOT kernel,
// whose fp32 sums of 4-lane products would differ from these in the last bits.

// Sub-block b of input rows 2p and 2p + 1: q + 16c holds elements 8c .. 8c + 7 of row 2p, then of row 2p + 1
// (SMMLA's left operand, c < 4); dx, h0, h1 and hs the rows' scale and fp32 sums of half 0, half 1 and the
// sub-block in the tile's lanes (row 2p in lanes 0-1, row 2p + 1 in lanes 2-3).
typedef struct {
    int8_t q[64];
    float dx[4], h0[4], h1[4], hs[4];
} QbPair;

// P * K / 32 pairs for N input rows of K, P = (N + 1) / 2 <= N: at most N * K / 32 <= QK_ACT_BYTES / 32 (N = 1: one
// pair per sub-block, half of it zeros).
#define QBM_PAIRS (QK_ACT_BYTES / 32)

// The N input rows as (K / 32, P) QbPair (one sub-block's pairs side by side), the row after an odd N's last
// zeros (qk_quant_block makes codes, scale and sums 0 of it): qb_acts_fill's codes, scales and sums.
static void qbm_pairs_fill(QbPair *x, const float *inp, int K, int N) {
    static const float zeros[32];
    static const int at[2][4] = {{0, 16, 32, 48}, {8, 24, 40, 56}}; // where row 2p (2p + 1) puts elements 8j ..
    int P = (N + 1) / 2;
    for (int n = 0; n < 2 * P; n++)
        for (int b = 0; b < K / 32; b++) {
            const float *v = n < N ? inp + (size_t)n * K + 32 * b : zeros;
            QbPair *p = x + (size_t)b * P + n / 2;
            float d, xs, h0 = 0, h1 = 0;
            qk_quant_block(p->q, at[n % 2], &d, &xs, v);
            for (int k = 0; k < 16; k++) {
                h0 += v[k];
                h1 += v[16 + k];
            }
            for (int l = 2 * (n % 2); l < 2 * (n % 2) + 2; l++) {
                p->dx[l] = d;
                p->h0[l] = h0;
                p->h1[l] = h1;
                p->hs[l] = h0 + h1;
            }
        }
}

#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod+i8mm")

// [a, b, a, b]: a value of weight rows r and r + 1 in the lanes of a tile.
static inline float32x4_t qbm_rows2(float a, float b) {
    float32x2_t t = vset_lane_f32(b, vdup_n_f32(a), 1);
    return vcombine_f32(t, t);
}

// Rows r and r + 1 (where r + 1 == R, row r twice and the second column dropped) against the N input rows in pairs
// x: out[n * R + r], out[n * R + r + 1].
static inline __attribute__((always_inline)) void qbm_rows(float *out, const Weight *w, const QbPair *x, int r, int R,
                                                           const WeightFormat fmt, const int N) {
    int K = w->cols, E = qb_elems(fmt), nsub = K / 32;
    const int P = (N + 1) / 2;
    size_t rb = weight_row_bytes(fmt, K);
    const uint8_t *row0 = (const uint8_t *)w->data + (size_t)r * rb, *row1 = r + 1 < R ? row0 + rb : row0;
    float32x4_t acc[QUANT_DECODE_MAX_N / 2]; // pair p's tile of fp32 sums, lanes as SMMLA's
#pragma GCC unroll 4
    for (int p = 0; p < P; p++)
        acc[p] = vdupq_n_f32(0.0f);
    for (int sb = 0; sb < nsub; sb++) {
        size_t at = (size_t)(32 * sb / E) * qb_bytes(fmt);
        QbSubN a = qbn_sub(row0 + at, sb % (E / 32), fmt), b = qbn_sub(row1 + at, sb % (E / 32), fmt);
        int64x2_t a0 = vreinterpretq_s64_s8(a.lo), a1 = vreinterpretq_s64_s8(a.hi);
        int64x2_t b0 = vreinterpretq_s64_s8(b.lo), b1 = vreinterpretq_s64_s8(b.hi);
        // wb[c]: elements 8c .. 8c + 7 of row r, then of row r + 1 (SMMLA's right operand, c < 4)
        int8x16_t wb[4] = {vreinterpretq_s8_s64(vzip1q_s64(a0, b0)), vreinterpretq_s8_s64(vzip2q_s64(a0, b0)),
                           vreinterpretq_s8_s64(vzip1q_s64(a1, b1)), vreinterpretq_s8_s64(vzip2q_s64(a1, b1))};
        // the rows' scales and offsets of half 0 and half 1
        float32x4_t s0 = qbm_rows2(a.s0, b.s0), s1 = qbm_rows2(a.s1, b.s1);
        float32x4_t o0 = qbm_rows2(a.o0, b.o0), o1 = qbm_rows2(a.o1, b.o1);
        const QbPair *xb = x + (size_t)sb * P;
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) {
            const int8_t *q = xb[p].q;
            const int32x4_t z = vdupq_n_s32(0);
            int32x4_t i0 = vmmlaq_s32(vmmlaq_s32(z, vld1q_s8(q), wb[0]), vld1q_s8(q + 16), wb[1]);      // half 0
            int32x4_t i1 = vmmlaq_s32(vmmlaq_s32(z, vld1q_s8(q + 32), wb[2]), vld1q_s8(q + 48), wb[3]); // half 1
            float32x4_t dx = vld1q_f32(xb[p].dx);
            if (fmt == WF_Q6_K) {
                acc[p] = vfmaq_f32(acc[p], vcvtq_f32_s32(i0), vmulq_f32(s0, dx));
                acc[p] = vfmaq_f32(acc[p], vcvtq_f32_s32(i1), vmulq_f32(s1, dx));
                acc[p] = vfmaq_f32(acc[p], o0, vld1q_f32(xb[p].h0));
                acc[p] = vfmaq_f32(acc[p], o1, vld1q_f32(xb[p].h1));
            } else {
                acc[p] = vfmaq_f32(acc[p], vcvtq_f32_s32(vaddq_s32(i0, i1)), vmulq_f32(s0, dx));
                if (fmt != WF_Q8_0)
                    acc[p] = vfmaq_f32(acc[p], o0, vld1q_f32(xb[p].hs));
            }
        }
    }
#pragma GCC unroll 4
    for (int p = 0; p < P; p++) {
        float t[4];
        vst1q_f32(t, acc[p]);
        for (int l = 0; l < 4; l++) // lane l: input row 2p + l / 2, weight row r + l % 2
            if (2 * p + l / 2 < N && r + l % 2 < R)
                out[(size_t)(2 * p + l / 2) * R + r + l % 2] = t[l];
    }
}

// All rows of one format, two at a time, N (1..8) a constant inside.
#define QBM_ROWS(FMT, name)                                                                                \
    static void qbm_rows_##name(float *out, const Weight *w, const QbPair *x, int N) {                     \
        int R = w->rows, K = w->cols;                                                                      \
        _Pragma("omp parallel for schedule(static) if ((long)R * K * N >= THREADS_MIN_WORK)")               \
        for (int r = 0; r < R; r += 2)                                                                     \
            QK_SWITCH_N(qbm_rows, out, w, x, r, R, FMT)                                                    \
    }

QBM_ROWS(WF_Q8_0, q8_0)
QBM_ROWS(WF_Q4_0, q4_0)
QBM_ROWS(WF_Q4_1, q4_1)
QBM_ROWS(WF_Q5_0, q5_0)
QBM_ROWS(WF_Q5_1, q5_1)
QBM_ROWS(WF_Q4_K, q4_k)
QBM_ROWS(WF_Q5_K, q5_k)
QBM_ROWS(WF_Q6_K, q6_k)
#pragma GCC pop_options

// The caller's inputs, quantized in the layout of the kernel that runs, for whichever format it multiplies (one
// buffer a thread for all of them); the region's threads read it.
static _Thread_local union {
    QbActs acts;
    QbPair pairs[QBM_PAIRS];
} qbn_buf;

// The inputs quantized once per product, on this thread: in pairs for SMMLA where the CPU has dotprod and i8mm, at
// every N (N = 1 too, so that an input's outputs are the same bits at every N: above), else for SDOT where it has
// dotprod, else for the ARMv8.0 lanes.
#define QBN_DECODE(name)                                                                                   \
    int qk_decode_neon_##name(float *out, const float *inp, const Weight *w, int N) {                     \
        if ((size_t)N * (size_t)w->cols > QK_ACT_BYTES)                                                    \
            return WEIGHT_DECODE_DECLINED;                                                                 \
        int dp = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;                                               \
        if (dp && (getauxval(AT_HWCAP2) & HWCAP2_I8MM)) {                                                  \
            qbm_pairs_fill(qbn_buf.pairs, inp, w->cols, N);                                                \
            qbm_rows_##name(out, w, qbn_buf.pairs, N);                                                     \
            return ER_OK;                                                                                  \
        }                                                                                                  \
        qb_acts_fill(&qbn_buf.acts, inp, w->cols, N);                                                      \
        if (dp)                                                                                            \
            qbn_rows_##name##_dp(out, w, &qbn_buf.acts, N);                                                \
        else                                                                                               \
            qbn_rows_##name##_base(out, w, &qbn_buf.acts, N);                                              \
        return ER_OK;                                                                                      \
    }

QBN_DECODE(q8_0)
QBN_DECODE(q4_0)
QBN_DECODE(q4_1)
QBN_DECODE(q5_0)
QBN_DECODE(q5_1)
QBN_DECODE(q4_k)
QBN_DECODE(q5_k)
QBN_DECODE(q6_k)
#endif
