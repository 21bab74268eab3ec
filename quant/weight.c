#include "quant/weight.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/gemm.h"
#include "quant/quant.h"

const char *weight_format_name(WeightFormat f) {
    switch (f) {
    case WF_F32: return "f32";
    case WF_BF16: return "bf16";
    case WF_F16: return "f16";
    case WF_Q8: return "q8";
    case WF_Q4: return "q4";
    case WF_Q4G: return "q4g";
    case WF_Q2LUT: return "q2lut";
    case WF_Q4LUT: return "q4lut";
    }
    return "?";
}

int weight_is_quantized(WeightFormat f) {
    return f == WF_Q8 || f == WF_Q4 || f == WF_Q4G || f == WF_Q2LUT || f == WF_Q4LUT;
}

size_t weight_bytes(const Weight *w) {
    size_t R = (size_t)w->rows, n = R * quant_row_bytes(w->fmt, w->cols);
    switch (w->fmt) {
    case WF_Q8:
    case WF_Q4: n += R * sizeof(float); break;
    case WF_Q4G: n += 2 * R * (size_t)(w->cols / w->group) * 2; break;
    case WF_Q2LUT: n += R * 4 * 2; break;
    case WF_Q4LUT: n += R * 16 * 2; break;
    default: break;
    }
    return n;
}

double weight_bits_per_weight(const Weight *w) {
    double n = (double)w->rows * (double)w->cols;
    return n > 0 ? (double)weight_bytes(w) * 8.0 / n : 0.0;
}

void weight_free(Weight *w) {
    if (!w->owned)
        return;
    er_free(w->owned);
    w->owned = NULL;
    w->data = NULL;
    w->scale = NULL;
    w->gscale = w->gzero = w->lut = NULL;
}

// Rows of a non-fp32 weight are widened to fp32 in tiles of this many rows, then multiplied with sgemm:
// the tile (TILE_ROWS x cols x 4 bytes) stays cache-friendly and memory stays O(tile).
#define TILE_ROWS 256

void weight_row_f32(float *dst, const Weight *w, int r) { quant_dequant_row(dst, w, r); }

static void add_bias(float *out, const float *bias, int N, int rows) {
    if (!bias)
        return;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int r = 0; r < rows; r++)
            out[(size_t)n * rows + r] += bias[r];
}

int weight_matmul_forward(float *out, const float *inp, const Weight *w, const float *bias, int N) {
    int R = w->rows, K = w->cols;
    if (N <= QUANT_DECODE_MAX_N) {
        ER_TRY(quant_matmul_decode(out, inp, w, N));
    } else if (w->fmt == WF_F32) {
        gemm_f32(0, 1, N, R, K, 1.0f, inp, K, (const float *)w->data, K, 0.0f, out, R);
    } else {
        int tile = R < TILE_ROWS ? R : TILE_ROWS;
        float *buf = er_alloc((size_t)tile * K * sizeof(float));
        if (!buf)
            return ER_ENOMEM;
        for (int r0 = 0; r0 < R; r0 += tile) {
            int nr = R - r0 < tile ? R - r0 : tile;
            quant_dequant_rows(buf, w, r0, nr);
            gemm_f32(0, 1, N, nr, K, 1.0f, inp, K, buf, K, 0.0f, out + r0, R);
        }
        er_free(buf);
    }
    add_bias(out, bias, N, R);
    return ER_OK;
}

// Through a frozen weight of any format (a LoRA adapter training on a quantized base): tiles of rows
// are dequantized and their share dout[:, tile] · W[tile, :] accumulated.
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
        quant_dequant_rows(buf, w, r0, nr);
        gemm_f32(0, 0, N, K, nr, 1.0f, dout + r0, R, buf, K, 1.0f, dinp, K);
    }
    er_free(buf);
    return ER_OK;
}
