// Quantized formats: sizes, packing, dequantization and quantization_config (layouts in weight.h).
#include "quant/quant.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/json.h"
#include "quant/transform.h"

size_t quant_row_bytes(WeightFormat f, int cols) {
    size_t c = (size_t)cols;
    switch (f) {
    case WF_F32: return c * 4;
    case WF_BF16:
    case WF_F16: return c * 2;
    case WF_Q8: return c;
    case WF_Q4:
    case WF_Q4G:
    case WF_Q4LUT: return (c + 1) / 2;
    case WF_Q2LUT: return (c + 3) / 4;
    }
    return 0;
}

int quant_check_shape(WeightFormat f, int rows, int cols, int group, const char *ctx) {
    if (rows <= 0 || cols <= 0)
        return er_error(ER_EINVAL, "%s: %s matrix must have positive dimensions (got [%d, %d])", ctx,
                        weight_format_name(f), rows, cols);
    if (f == WF_Q4G) {
        if (group < 2 || group % 2)
            return er_error(ER_EINVAL, "%s: q4g group size must be even and >= 2 (got %d)", ctx, group);
        if (cols % group)
            return er_error(ER_EINVAL, "%s: group size %d does not divide the %d columns", ctx, group, cols);
    }
    return ER_OK;
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

int quant_weight_alloc(Weight *w, WeightFormat f, int rows, int cols, int group) {
    memset(w, 0, sizeof *w);
    ER_TRY(quant_check_shape(f, rows, cols, group, "quant_weight_alloc"));
    size_t R = (size_t)rows, data = align64(R * quant_row_bytes(f, cols)), aux = 0;
    size_t ng = f == WF_Q4G ? (size_t)(cols / group) : 0;
    if (f == WF_Q8 || f == WF_Q4)
        aux = align64(R * sizeof(float));
    else if (f == WF_Q4G)
        aux = 2 * align64(R * ng * 2);
    else if (f == WF_Q2LUT || f == WF_Q4LUT)
        aux = align64(R * (f == WF_Q2LUT ? 4 : 16) * 2);
    uint8_t *mem = er_calloc(data + aux, 1);
    if (!mem)
        return er_error(ER_ENOMEM, "quant: cannot allocate %zu bytes for a %s [%d, %d] matrix", data + aux,
                        weight_format_name(f), rows, cols);
    w->fmt = f;
    w->rows = rows;
    w->cols = cols;
    w->data = mem;
    w->owned = mem;
    if (f == WF_Q8 || f == WF_Q4)
        w->scale = (const float *)(mem + data);
    if (f == WF_Q4G) {
        w->group = group;
        w->gscale = (const uint16_t *)(mem + data);
        w->gzero = (const uint16_t *)(mem + data + aux / 2);
    }
    if (f == WF_Q2LUT || f == WF_Q4LUT)
        w->lut = (const uint16_t *)(mem + data);
    return ER_OK;
}

void quant_pack4(uint8_t *dst, const uint8_t *codes, int n) {
    memset(dst, 0, (size_t)(n + 1) / 2);
    int full = n & ~15;
    for (int k = 0; k < full; k++)
        dst[(k >> 4) * 8 + (k & 7)] |= (uint8_t)((codes[k] & 15) << ((k & 8) >> 1));
    for (int t = 0; t < n - full; t++)
        dst[full / 2 + (t >> 1)] |= (uint8_t)((codes[full + t] & 15) << ((t & 1) * 4));
}

void quant_unpack4(uint8_t *codes, const uint8_t *src, int n) {
    for (int k = 0; k < n; k++)
        codes[k] = (uint8_t)quant_code4(src, n, k);
}

void quant_pack2(uint8_t *dst, const uint8_t *codes, int n) {
    memset(dst, 0, (size_t)(n + 3) / 4);
    int full = n & ~31;
    for (int k = 0; k < full; k++)
        dst[(k >> 5) * 8 + (k & 7)] |= (uint8_t)((codes[k] & 3) << (((k >> 3) & 3) * 2));
    for (int t = 0; t < n - full; t++)
        dst[full / 4 + (t >> 2)] |= (uint8_t)((codes[full + t] & 3) << ((t & 3) * 2));
}

void quant_unpack2(uint8_t *codes, const uint8_t *src, int n) {
    for (int k = 0; k < n; k++)
        codes[k] = (uint8_t)quant_code2(src, n, k);
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

void quant_dequant_row(float *dst, const Weight *w, int r) {
    int K = w->cols;
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * quant_row_bytes(w->fmt, K);
    switch (w->fmt) {
    case WF_F32: memcpy(dst, row, sizeof(float) * (size_t)K); break;
    case WF_BF16: dtype_to_f32(dst, row, DT_BF16, (size_t)K); break;
    case WF_F16: dtype_to_f32(dst, row, DT_F16, (size_t)K); break;
    case WF_Q8: {
        const int8_t *q = (const int8_t *)row;
        float s = w->scale[r];
        for (int k = 0; k < K; k++)
            dst[k] = (float)q[k] * s;
        break;
    }
    case WF_Q4: {
        float s = w->scale[r];
        codes4_f32(dst, row, K);
        for (int k = 0; k < K; k++)
            dst[k] = (dst[k] - 8.0f) * s;
        break;
    }
    case WF_Q4G: {
        int G = w->group, ng = K / G;
        codes4_f32(dst, row, K);
        for (int g = 0; g < ng; g++) {
            float s = f16_to_f32(w->gscale[(size_t)r * ng + g]), z = f16_to_f32(w->gzero[(size_t)r * ng + g]);
            for (int k = g * G; k < (g + 1) * G; k++)
                dst[k] = dst[k] * s + z;
        }
        break;
    }
    case WF_Q4LUT: {
        float c[16];
        for (int i = 0; i < 16; i++)
            c[i] = f16_to_f32(w->lut[(size_t)r * 16 + i]);
        codes4_f32(dst, row, K);
        for (int k = 0; k < K; k++)
            dst[k] = c[(int)dst[k]];
        break;
    }
    case WF_Q2LUT: {
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
        break;
    }
    }
}

void quant_dequant_rows(float *dst, const Weight *w, int r0, int nr) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < nr; i++)
        quant_dequant_row(dst + (size_t)i * w->cols, w, r0 + i);
}

// ---- quantization_config ----

int quant_parse_spec(const char *s, WeightFormat *f, int *group) {
    *group = 0;
    if (!s)
        return ER_EINVAL;
    if (strcmp(s, "q8") == 0)
        *f = WF_Q8;
    else if (strcmp(s, "q4") == 0)
        *f = WF_Q4;
    else if (strcmp(s, "q2lut") == 0)
        *f = WF_Q2LUT;
    else if (strcmp(s, "q4lut") == 0)
        *f = WF_Q4LUT;
    else if (strcmp(s, "q4g32") == 0 || strcmp(s, "q4g64") == 0 || strcmp(s, "q4g128") == 0) {
        *f = WF_Q4G;
        *group = s[3] == '3' ? 32 : s[3] == '6' ? 64 : 128;
    } else
        return ER_EINVAL;
    return ER_OK;
}

const char *quant_spec_name(WeightFormat f, int group, char *buf) {
    if (f == WF_Q4G)
        snprintf(buf, 16, "q4g%d", group);
    else
        snprintf(buf, 16, "%s", weight_is_quantized(f) ? weight_format_name(f) : "fp");
    return buf;
}

#define SPECS "q8, q4, q4g32, q4g64, q4g128, q4lut or q2lut"

int quant_config_from_json(QuantConfig *q, const cJSON *j, const char *ctx) {
    memset(q, 0, sizeof *q);
    if (!cJSON_IsObject(j))
        return er_error(ER_EFORMAT, "%s: \"quantization_config\" must be an object", ctx);
    // Another tool's quantized model (GPTQ, AWQ, bitsandbytes, ...) packs its weights its own way.
    const char *qm = NULL;
    ER_TRY(json_opt_string(j, "quant_method", &qm, ctx));
    if (!qm || strcmp(qm, "ertrain") != 0)
        return er_error(ER_EUNSUPPORTED, "%s: quantization_config.quant_method \"%.64s\" is not supported (only models "
                        "packed by ertrain quantize, \"ertrain\"; load the float model instead)", ctx, qm ? qm : "");
    const char *s = NULL;
    ER_TRY(json_get_string(j, "weights", &s, ctx));
    if (quant_parse_spec(s, &q->linear, &q->group) < 0)
        return er_error(ER_EFORMAT, "%s: quantization_config.weights \"%s\" is not a known format (" SPECS ")", ctx, s);
    int64_t g = q->group;
    ER_TRY(json_opt_int(j, "group_size", &g, ctx));
    if (q->linear == WF_Q4G && g != q->group)
        return er_error(ER_EFORMAT, "%s: quantization_config.group_size %lld disagrees with weights \"%s\"", ctx,
                        (long long)g, s);
    const char *e = "fp";
    ER_TRY(json_opt_string(j, "embeddings", &e, ctx));
    if (strcmp(e, "int8") != 0 && strcmp(e, "fp") != 0)
        return er_error(ER_EFORMAT, "%s: quantization_config.embeddings \"%s\" must be \"int8\" or \"fp\"", ctx, e);
    q->embed_int8 = strcmp(e, "int8") == 0;
    const char *h = s;
    ER_TRY(json_opt_string(j, "lm_head", &h, ctx));
    int hg = 0;
    if (strcmp(h, "fp") == 0)
        q->lm_head = WF_F32;
    else if (quant_parse_spec(h, &q->lm_head, &hg) < 0)
        return er_error(ER_EFORMAT, "%s: quantization_config.lm_head \"%s\" is not a known format (fp, " SPECS ")", ctx,
                        h);
    if (q->lm_head == WF_Q4G && hg != q->group && q->linear == WF_Q4G)
        return er_error(ER_EFORMAT, "%s: quantization_config.lm_head \"%s\" must use the weights' group size %d", ctx, h,
                        q->group);
    if (q->lm_head == WF_Q4G)
        q->group = hg;
    const char *m = "", *t = "none";
    ER_TRY(json_opt_string(j, "method", &m, ctx));
    ER_TRY(json_opt_string(j, "transforms", &t, ctx));
    // The transforms are baked into the weights, but one this runtime does not know might need work
    // at run time that it would not do.
    unsigned tflags;
    if (transform_parse_mode(t, &tflags) < 0 || strlen(t) >= sizeof q->transforms)
        return er_error(ER_EUNSUPPORTED, "%s: quantization_config.transforms \"%.64s\" is not known (none, rotate, "
                        "fpt or a list of r, u, v, k)", ctx, t);
    snprintf(q->method, sizeof q->method, "%s", m);
    snprintf(q->transforms, sizeof q->transforms, "%s", t);
    ER_TRY(json_opt_double(j, "bits_per_weight", &q->bits_per_weight, ctx));
    q->enabled = 1;
    return ER_OK;
}

cJSON *quant_config_to_json(const QuantConfig *q) {
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return NULL;
    char buf[16];
    cJSON_AddStringToObject(j, "quant_method", "ertrain");
    cJSON_AddStringToObject(j, "method", q->method);
    cJSON_AddStringToObject(j, "weights", quant_spec_name(q->linear, q->group, buf));
    cJSON_AddNumberToObject(j, "group_size", q->linear == WF_Q4G ? q->group : 0);
    cJSON_AddStringToObject(j, "embeddings", q->embed_int8 ? "int8" : "fp");
    cJSON_AddStringToObject(j, "lm_head", quant_spec_name(q->lm_head, q->group, buf));
    cJSON_AddStringToObject(j, "transforms", q->transforms[0] ? q->transforms : "none");
    cJSON_AddNumberToObject(j, "bits_per_weight", q->bits_per_weight);
    return j;
}
