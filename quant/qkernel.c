// Decode kernels (N <= 8 input rows): memory-bound, so each weight row is read once and multiplied
// into all N input rows at once, with one vector accumulator per input row held in registers; rows
// are split across threads. sgemm's packing costs more than the product at this size.
//
// Two paths:
//   - portable (the reference): a row in a float format is used in place, any other row is widened
//     to fp32 into a per-thread buffer (quant_dequant_row), then dotted 8 columns at a time with GCC's
//     generic vector type (AVX2 here, whatever the target offers elsewhere);
//   - AVX2 + FMA (built with -march=native on such a machine): the packed row is expanded 8 weights
//     at a time straight into a register (int8 sign-extend; nibbles / 2-bit codes by a variable shift
//     of a broadcast 32/16-bit load; the 2-bit codebook through a permute), never touching memory.
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "quant/quant.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define QK_SIMD 1
#else
#define QK_SIMD 0
#endif

static int force_portable;

int quant_force_portable(int on) {
    int old = force_portable;
    force_portable = on;
    return old;
}

int quant_has_simd(void) { return QK_SIMD; }

typedef float v8f __attribute__((vector_size(32)));

static inline v8f load8(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float hsum8(v8f v) { return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7])); }

// out[n * R + r] = dot(w, x_n) for n < N (N a compile-time constant after inlining).
static inline __attribute__((always_inline)) void dot_rows(float *out, int R, int r, const float *w, const float *inp,
                                                           int K, const int N) {
    v8f acc[QUANT_DECODE_MAX_N];
#pragma GCC unroll 8
    for (int n = 0; n < N; n++)
        acc[n] = (v8f){0};
    int k = 0;
    for (; k + 8 <= K; k += 8) {
        v8f wv = load8(w + k);
#pragma GCC unroll 8
        for (int n = 0; n < N; n++)
            acc[n] += wv * load8(inp + (size_t)n * K + k);
    }
    for (int n = 0; n < N; n++) {
        float s = hsum8(acc[n]);
        for (int j = k; j < K; j++)
            s += w[j] * inp[(size_t)n * K + j];
        out[(size_t)n * R + r] = s;
    }
}

static void decode_portable(float *out, const float *inp, const Weight *w, int N) {
    int R = w->rows, K = w->cols;
#pragma omp parallel
    {
        float *row = w->fmt == WF_F32 ? NULL : malloc(sizeof(float) * (size_t)K);
#pragma omp for schedule(static)
        for (int r = 0; r < R; r++) {
            const float *wr;
            if (w->fmt == WF_F32) {
                wr = (const float *)w->data + (size_t)r * K;
            } else {
                quant_dequant_row(row, w, r);
                wr = row;
            }
            switch (N) {
            case 1: dot_rows(out, R, r, wr, inp, K, 1); break;
            case 2: dot_rows(out, R, r, wr, inp, K, 2); break;
            case 3: dot_rows(out, R, r, wr, inp, K, 3); break;
            case 4: dot_rows(out, R, r, wr, inp, K, 4); break;
            case 5: dot_rows(out, R, r, wr, inp, K, 5); break;
            case 6: dot_rows(out, R, r, wr, inp, K, 6); break;
            case 7: dot_rows(out, R, r, wr, inp, K, 7); break;
            default: dot_rows(out, R, r, wr, inp, K, 8); break;
            }
        }
        free(row);
    }
}

#if QK_SIMD

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Weights k..k+7 of a packed row as fp32 codes (before scale / offset / codebook).
static inline __m256 codes8_i8(const int8_t *q, int k) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + k))));
}

static inline __m256i nib8(const uint8_t *p, int k) {
    uint32_t u;
    memcpy(&u, p + k / 2, 4);
    __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32((int)u), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    return _mm256_and_si256(v, _mm256_set1_epi32(15));
}

static inline __m256i idx2_8(const uint8_t *p, int k) {
    uint16_t u;
    memcpy(&u, p + k / 4, 2);
    __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32((int)u), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
    return _mm256_and_si256(v, _mm256_set1_epi32(3));
}

// One row r of a quantized weight against N inputs; the format is a compile-time constant after inlining.
static inline __attribute__((always_inline)) void qrow_simd(float *out, int R, int r, const Weight *w,
                                                            const float *inp, int K, const int N,
                                                            const WeightFormat fmt) {
    __m256 acc[QUANT_DECODE_MAX_N];
#pragma GCC unroll 8
    for (int n = 0; n < N; n++)
        acc[n] = _mm256_setzero_ps();
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * quant_row_bytes(fmt, K);
    int k = 0;
    float tail[QUANT_DECODE_MAX_N] = {0};
    float post = 1.0f; // Q8 / Q4: the row scale, applied once at the end
    if (fmt == WF_Q8 || fmt == WF_Q4) {
        post = w->scale[r];
        const __m256i eight = _mm256_set1_epi32(8);
        for (; k + 8 <= K; k += 8) {
            __m256 wv = fmt == WF_Q8 ? codes8_i8((const int8_t *)row, k)
                                     : _mm256_cvtepi32_ps(_mm256_sub_epi32(nib8(row, k), eight));
#pragma GCC unroll 8
            for (int n = 0; n < N; n++)
                acc[n] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(inp + (size_t)n * K + k), acc[n]);
        }
        for (int j = k; j < K; j++) {
            float c = fmt == WF_Q8 ? (float)((const int8_t *)row)[j] : (float)((int)((row[j >> 1] >> ((j & 1) * 4)) & 15) - 8);
            for (int n = 0; n < N; n++)
                tail[n] += c * inp[(size_t)n * K + j];
        }
    } else if (fmt == WF_Q4G) {
        int G = w->group, ng = K / G;
        for (int g = 0; g < ng; g++) {
            float sf = f16_to_f32(w->gscale[(size_t)r * ng + g]), zf = f16_to_f32(w->gzero[(size_t)r * ng + g]);
            __m256 s = _mm256_set1_ps(sf), z = _mm256_set1_ps(zf);
            for (k = g * G; k < (g + 1) * G; k += 8) {
                __m256 wv = _mm256_fmadd_ps(_mm256_cvtepi32_ps(nib8(row, k)), s, z);
#pragma GCC unroll 8
                for (int n = 0; n < N; n++)
                    acc[n] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(inp + (size_t)n * K + k), acc[n]);
            }
        }
    } else { // WF_Q2LUT
        float c[4];
        for (int i = 0; i < 4; i++)
            c[i] = f16_to_f32(w->lut[(size_t)r * 4 + i]);
        __m256 lut = _mm256_setr_ps(c[0], c[1], c[2], c[3], c[0], c[1], c[2], c[3]);
        for (; k + 8 <= K; k += 8) {
            __m256 wv = _mm256_permutevar8x32_ps(lut, idx2_8(row, k));
#pragma GCC unroll 8
            for (int n = 0; n < N; n++)
                acc[n] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(inp + (size_t)n * K + k), acc[n]);
        }
        for (int j = k; j < K; j++) {
            float v = c[(row[j >> 2] >> (2 * (j & 3))) & 3];
            for (int n = 0; n < N; n++)
                tail[n] += v * inp[(size_t)n * K + j];
        }
    }
    for (int n = 0; n < N; n++)
        out[(size_t)n * R + r] = (hsum256(acc[n]) + tail[n]) * post;
}

#define QK_ROWS(FMT)                                                                                        \
    static void decode_simd_##FMT(float *out, const float *inp, const Weight *w, int N) {                 \
        int R = w->rows, K = w->cols;                                                                      \
        _Pragma("omp parallel for schedule(static)") for (int r = 0; r < R; r++) {                         \
            switch (N) {                                                                                   \
            case 1: qrow_simd(out, R, r, w, inp, K, 1, FMT); break;                                        \
            case 2: qrow_simd(out, R, r, w, inp, K, 2, FMT); break;                                        \
            case 3: qrow_simd(out, R, r, w, inp, K, 3, FMT); break;                                        \
            case 4: qrow_simd(out, R, r, w, inp, K, 4, FMT); break;                                        \
            case 5: qrow_simd(out, R, r, w, inp, K, 5, FMT); break;                                        \
            case 6: qrow_simd(out, R, r, w, inp, K, 6, FMT); break;                                        \
            case 7: qrow_simd(out, R, r, w, inp, K, 7, FMT); break;                                        \
            default: qrow_simd(out, R, r, w, inp, K, 8, FMT); break;                                       \
            }                                                                                              \
        }                                                                                                  \
    }

QK_ROWS(WF_Q8)
QK_ROWS(WF_Q4)
QK_ROWS(WF_Q4G)
QK_ROWS(WF_Q2LUT)

#endif

int quant_matmul_decode(float *out, const float *inp, const Weight *w, int N) {
    if (N < 1 || N > QUANT_DECODE_MAX_N)
        return er_error(ER_EINVAL, "quant_matmul_decode: N = %d outside 1..%d", N, QUANT_DECODE_MAX_N);
#if QK_SIMD
    if (!force_portable) {
        switch (w->fmt) {
        case WF_Q8: decode_simd_WF_Q8(out, inp, w, N); return ER_OK;
        case WF_Q4: decode_simd_WF_Q4(out, inp, w, N); return ER_OK;
        case WF_Q4G:
            if (w->group % 8 == 0) {
                decode_simd_WF_Q4G(out, inp, w, N);
                return ER_OK;
            }
            break;
        case WF_Q2LUT: decode_simd_WF_Q2LUT(out, inp, w, N); return ER_OK;
        default: break;
        }
    }
#endif
    decode_portable(out, inp, w, N);
    return ER_OK;
}
