// THE format table and what follows from it alone: names, sizes, companions, the reference dequantizers.
#include "quant/weight.h"

#include <stddef.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "quant/blocks.h"

// ---- the reference dequantizers (layouts in weight.h) ----

static void row_f32(float *dst, const Weight *w, int r) {
    memcpy(dst, (const float *)w->data + (size_t)r * w->cols, sizeof(float) * (size_t)w->cols);
}

static void row_bf16(float *dst, const Weight *w, int r) {
    dtype_to_f32(dst, (const uint16_t *)w->data + (size_t)r * w->cols, DT_BF16, (size_t)w->cols);
}

static void row_f16(float *dst, const Weight *w, int r) {
    dtype_to_f32(dst, (const uint16_t *)w->data + (size_t)r * w->cols, DT_F16, (size_t)w->cols);
}

// Row r of an untiled weight, in place (the formats quant_tile never tiles read their rows so).
static const uint8_t *packed_row(const Weight *w, int r) {
    return (const uint8_t *)w->data + (size_t)r * weight_row_bytes(w->fmt, w->cols);
}

const uint8_t *weight_packed_row(const Weight *w, int r, uint8_t *buf) {
    if (!w->tiled)
        return packed_row(w, r);
    if (blocks_format(w->fmt)) { // block g of the row from tile r / 16's block g (quant/blocks.h)
        size_t bb = (size_t)blocks_bytes(w->fmt), nb = (size_t)(w->cols / blocks_elems(w->fmt));
        const uint8_t *tile = (const uint8_t *)w->data + (size_t)(r - r % QUANT_TILE) * nb * bb;
        for (size_t g = 0; g < nb; g++)
            blocks_untile(buf + bb * g, tile + QUANT_TILE * bb * g, r % QUANT_TILE, w->fmt);
        return buf;
    }
    size_t rb = weight_row_bytes(w->fmt, w->cols), cb = w->fmt == WF_Q8 ? 64 : 32; // bytes per chunk of 64 columns
    const uint8_t *tile = (const uint8_t *)w->data + (size_t)(r - r % QUANT_TILE) * rb;
    for (size_t c = 0; c < rb / cb; c++)
        for (size_t j = 0; j < cb / 4; j++)
            memcpy(buf + cb * c + 4 * j, tile + QUANT_TILE * cb * c + 64 * j + 4 * (r % QUANT_TILE), 4);
    if (w->fmt == WF_Q8)
        for (size_t i = 0; i < rb; i++)
            buf[i] ^= 0x80;
    return buf;
}

static void row_q8(float *dst, const Weight *w, int r) {
    uint8_t buf[QUANT_PACKED_ROW_MAX];
    const int8_t *q = (const int8_t *)weight_packed_row(w, r, buf);
    float s = w->scale[r];
    for (int k = 0; k < w->cols; k++)
        dst[k] = (float)q[k] * s;
}

// 4-bit codes of a row as floats (block by block, then the tail).
static void codes4_f32(float *dst, const uint8_t *row, int K) {
    int full = K & ~15;
    for (int b = 0; b < full; b += 16) {
        const uint8_t *p = row + b / 2;
        for (int i = 0; i < 8; i++) {
            dst[b + i] = (float)(p[i] & 15);
            dst[b + 8 + i] = (float)(p[i] >> 4);
        }
    }
    for (int k = full; k < K; k++)
        dst[k] = (float)quant_code4(row, K, k);
}

static void row_q4(float *dst, const Weight *w, int r) {
    float s = w->scale[r];
    uint8_t buf[QUANT_PACKED_ROW_MAX];
    codes4_f32(dst, weight_packed_row(w, r, buf), w->cols);
    for (int k = 0; k < w->cols; k++)
        dst[k] = (dst[k] - 8.0f) * s;
}

static void row_q4g(float *dst, const Weight *w, int r) {
    int G = w->group, ng = w->cols / G;
    uint8_t buf[QUANT_PACKED_ROW_MAX];
    codes4_f32(dst, weight_packed_row(w, r, buf), w->cols);
    for (int g = 0; g < ng; g++) {
        size_t at = weight_group_index(w, r, g);
        float s = f16_to_f32(w->gscale[at]), z = f16_to_f32(w->gzero[at]);
        for (int k = g * G; k < (g + 1) * G; k++)
            dst[k] = dst[k] * s + z;
    }
}

static void row_q4lut(float *dst, const Weight *w, int r) {
    float c[16];
    for (int i = 0; i < 16; i++)
        c[i] = f16_to_f32(w->lut[(size_t)r * 16 + i]);
    codes4_f32(dst, packed_row(w, r), w->cols);
    for (int k = 0; k < w->cols; k++)
        dst[k] = c[(int)dst[k]];
}

static void row_q2lut(float *dst, const Weight *w, int r) {
    const uint8_t *row = packed_row(w, r);
    int K = w->cols;
    float c[4];
    for (int i = 0; i < 4; i++)
        c[i] = f16_to_f32(w->lut[(size_t)r * 4 + i]);
    int full = K & ~31;
    for (int b = 0; b < full; b += 32) {
        const uint8_t *p = row + b / 4;
        for (int j = 0; j < 4; j++)
            for (int i = 0; i < 8; i++)
                dst[b + 8 * j + i] = c[(p[i] >> (2 * j)) & 3];
    }
    for (int k = full; k < K; k++)
        dst[k] = c[quant_code2(row, K, k)];
}

static void row_blocks(float *dst, const Weight *w, int r) {
    uint8_t buf[QUANT_PACKED_ROW_MAX];
    blocks_dequant_row(w->fmt, dst, weight_packed_row(w, r, buf), w->cols);
}

// ---- the table ----

#define ROW_SCALE {"_scale", "scales", DT_F32, WC_ROWS, offsetof(Weight, scale), 1}
#define CODEBOOK {"_codebook", "codebooks", DT_F16, WC_LEVELS, offsetof(Weight, lut), 0}
#define SPARSE_COLS {"_sparse_cols", "sparse columns", DT_U16, WC_SPARSE, offsetof(Weight, sp_cols), 0}
#define SPARSE_VALUES {"_sparse_values", "sparse values", DT_F16, WC_SPARSE, offsetof(Weight, sp_vals), 0}

static const WeightFormatInfo FORMATS[WF_COUNT] = {
    [WF_F32] = {"f32", 32, 0, 0, DT_F32, 0, {{0}}, row_f32, 1, {0}, 0, 0},
    [WF_BF16] = {"bf16", 16, 0, 0, DT_BF16, 0, {{0}}, row_bf16, 0, {0}, 0, 0},
    [WF_F16] = {"f16", 16, 0, 0, DT_F16, 0, {{0}}, row_f16, 0, {0}, 0, 0},
    [WF_Q8] = {"q8", 8, 1, 0, DT_I8, 1, {ROW_SCALE}, row_q8, 0, {0}, 0, 0},
    [WF_Q4] = {"q4", 4, 1, 0, DT_U8, 1, {ROW_SCALE}, row_q4, 0, {0}, 0, 0},
    [WF_Q4G] = {"q4g", 4, 1, 0, DT_U8, 2,
                {{"_scale", "group scales", DT_F16, WC_GROUPS, offsetof(Weight, gscale), 1},
                 {"_zero", "group zeros", DT_F16, WC_GROUPS, offsetof(Weight, gzero), 0}},
                row_q4g, 0, {32, 64, 128}, 0, 0},
    [WF_Q4LUT] = {"q4lut", 4, 1, 16, DT_U8, 3, {CODEBOOK, SPARSE_COLS, SPARSE_VALUES}, row_q4lut, 0,
                  {0}, 0, 0},
    [WF_Q2LUT] = {"q2lut", 2, 1, 4, DT_U8, 3, {CODEBOOK, SPARSE_COLS, SPARSE_VALUES}, row_q2lut, 0,
                  {0}, 0, 0},
#define BLOCK_FORMAT(name, elems, bytes) {#name, 0, 1, 0, DT_U8, 0, {{0}}, row_blocks, 0, {0}, elems, bytes}
    [WF_Q8_0] = BLOCK_FORMAT(q8_0, 32, 34),
    [WF_Q4_0] = BLOCK_FORMAT(q4_0, 32, 18),
    [WF_Q4_1] = BLOCK_FORMAT(q4_1, 32, 20),
    [WF_Q5_0] = BLOCK_FORMAT(q5_0, 32, 22),
    [WF_Q5_1] = BLOCK_FORMAT(q5_1, 32, 24),
    [WF_Q4_K] = BLOCK_FORMAT(q4_k, 256, 144),
    [WF_Q5_K] = BLOCK_FORMAT(q5_k, 256, 176),
    [WF_Q6_K] = BLOCK_FORMAT(q6_k, 256, 210),
#undef BLOCK_FORMAT
};

const WeightFormatInfo *weight_format_info(WeightFormat f) {
    return (unsigned)f < WF_COUNT ? &FORMATS[f] : NULL;
}

const char *weight_format_name(WeightFormat f) { return (unsigned)f < WF_COUNT ? FORMATS[f].name : "?"; }

int weight_is_quantized(WeightFormat f) { return (unsigned)f < WF_COUNT && FORMATS[f].quantized; }

int weight_format_grouped(WeightFormat f) {
    for (int i = 0; (unsigned)f < WF_COUNT && i < FORMATS[f].n_comp; i++)
        if (FORMATS[f].comp[i].shape == WC_GROUPS)
            return 1;
    return 0;
}

size_t weight_row_bytes(WeightFormat f, int cols) {
    if ((unsigned)f >= WF_COUNT)
        return 0;
    if (FORMATS[f].block)
        return (size_t)cols / (size_t)FORMATS[f].block * (size_t)FORMATS[f].block_bytes;
    return ((size_t)cols * (size_t)FORMATS[f].bits + 7) / 8;
}

size_t weight_companion_numel(const WeightFormatInfo *fi, const WeightCompanion *c, int rows, int cols, int group,
                              int sparse) {
    size_t per_row = c->shape == WC_ROWS     ? 1
                     : c->shape == WC_LEVELS ? (size_t)fi->levels
                     : c->shape == WC_SPARSE ? (size_t)sparse
                                             : (size_t)(cols / group);
    return (size_t)rows * per_row;
}

size_t weight_bytes(const Weight *w) {
    const WeightFormatInfo *fi = weight_format_info(w->fmt);
    size_t n = (size_t)w->rows * weight_row_bytes(w->fmt, w->cols);
    for (int i = 0; fi && i < fi->n_comp; i++)
        n += weight_companion_numel(fi, &fi->comp[i], w->rows, w->cols, w->group, w->sparse) *
             dtype_size(fi->comp[i].dtype);
    return n;
}

double weight_bits_per_weight(const Weight *w) {
    double n = (double)w->rows * (double)w->cols;
    return n > 0 ? (double)weight_bytes(w) * 8.0 / n : 0.0;
}

void weight_row_f32(float *dst, const Weight *w, int r) {
    FORMATS[w->fmt].dequant_row(dst, w, r);
    weight_sparse_add_row(dst, w, r);
}

void weight_sparse_add_row(float *dst, const Weight *w, int r) {
    if (!w->sparse)
        return;
    const uint16_t *c = w->sp_cols + (size_t)r * w->sparse, *v = w->sp_vals + (size_t)r * w->sparse;
    for (int j = 0; j < w->sparse; j++)
        dst[c[j]] += f16_to_f32(v[j]);
}


void weight_free(Weight *w) {
    if (!w->owned)
        return;
    er_free(w->owned);
    w->owned = NULL;
    w->data = NULL;
    w->scale = NULL;
    w->gscale = w->gzero = w->lut = w->sp_cols = w->sp_vals = NULL;
    w->tiled = 0;
}
