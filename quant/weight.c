#include "quant/weight.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/gemm.h"

const char *weight_format_name(WeightFormat f) {
    switch (f) {
    case WF_F32: return "f32";
    case WF_BF16: return "bf16";
    case WF_F16: return "f16";
    }
    return "?";
}

size_t weight_bytes(const Weight *w) {
    size_t n = (size_t)w->rows * (size_t)w->cols;
    return n * (w->fmt == WF_F32 ? 4 : 2);
}

// Rows of a 16-bit weight are widened to fp32 in tiles of this many rows, then multiplied with sgemm:
// the tile (TILE_ROWS x cols x 4 bytes) stays cache-friendly and memory stays O(tile).
#define TILE_ROWS 256

static void widen_rows(float *dst, const Weight *w, int r0, int nr) {
    const uint16_t *src = (const uint16_t *)w->data + (size_t)r0 * w->cols;
    size_t n = (size_t)nr * w->cols;
    if (w->fmt == WF_BF16) {
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++)
            dst[i] = bf16_to_f32(src[i]);
    } else {
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++)
            dst[i] = f16_to_f32(src[i]);
    }
}

void weight_row_f32(float *dst, const Weight *w, int r) {
    if (w->fmt == WF_F32) {
        const float *src = (const float *)w->data + (size_t)r * w->cols;
        for (int i = 0; i < w->cols; i++)
            dst[i] = src[i];
    } else {
        dtype_to_f32(dst, (const uint16_t *)w->data + (size_t)r * w->cols, w->fmt == WF_BF16 ? DT_BF16 : DT_F16,
                     (size_t)w->cols);
    }
}

static void add_bias(float *out, const float *bias, int N, int rows) {
    if (!bias)
        return;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int r = 0; r < rows; r++)
            out[(size_t)n * rows + r] += bias[r];
}

// Decode-sized products (a few input rows): memory-bound, so each weight row is read once and
// multiplied into all N input rows at once, 8 columns at a time, with one vector accumulator per input
// row held in registers; rows are split across threads. sgemm's packing costs more than the product
// at this size. The vector type is GCC's generic one: AVX2 here, whatever the target offers elsewhere.
#define SMALL_N 8

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
    v8f acc[SMALL_N];
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

static void matmul_small_n(float *out, const float *inp, const Weight *w, int N) {
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
                const uint16_t *src = (const uint16_t *)w->data + (size_t)r * K;
                if (w->fmt == WF_BF16)
                    for (int k = 0; k < K; k++)
                        row[k] = bf16_to_f32(src[k]);
                else
                    for (int k = 0; k < K; k++)
                        row[k] = f16_to_f32(src[k]);
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

int weight_matmul_forward(float *out, const float *inp, const Weight *w, const float *bias, int N) {
    int R = w->rows, K = w->cols;
    if (N <= SMALL_N) {
        matmul_small_n(out, inp, w, N);
    } else if (w->fmt == WF_F32) {
        gemm_f32(0, 1, N, R, K, 1.0f, inp, K, (const float *)w->data, K, 0.0f, out, R);
    } else {
        int tile = R < TILE_ROWS ? R : TILE_ROWS;
        float *buf = er_alloc((size_t)tile * K * sizeof(float));
        if (!buf)
            return ER_ENOMEM;
        for (int r0 = 0; r0 < R; r0 += tile) {
            int nr = R - r0 < tile ? R - r0 : tile;
            widen_rows(buf, w, r0, nr);
            gemm_f32(0, 1, N, nr, K, 1.0f, inp, K, buf, K, 0.0f, out + r0, R);
        }
        er_free(buf);
    }
    add_bias(out, bias, N, R);
    return ER_OK;
}

int weight_matmul_backward_input(float *dinp, const float *dout, const Weight *w, int N) {
    int R = w->rows, K = w->cols;
    if (w->fmt == WF_F32) {
        gemm_f32(0, 0, N, K, R, 1.0f, dout, R, (const float *)w->data, K, 1.0f, dinp, K);
        return ER_OK;
    }
    int tile = R < TILE_ROWS ? R : TILE_ROWS;
    float *buf = er_alloc((size_t)tile * K * sizeof(float));
    if (!buf)
        return ER_ENOMEM;
    for (int r0 = 0; r0 < R; r0 += tile) {
        int nr = R - r0 < tile ? R - r0 : tile;
        widen_rows(buf, w, r0, nr);
        gemm_f32(0, 0, N, K, nr, 1.0f, dout + r0, R, buf, K, 1.0f, dinp, K);
    }
    er_free(buf);
    return ER_OK;
}
