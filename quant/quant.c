// Quantized formats: shapes, allocation, packing, dequantization and quantization_config (the format
// table and layouts in weight.h).
#include "quant/quant.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/json.h"
#include "quant/transform.h"

int quant_check_shape(WeightFormat f, int rows, int cols, int group, int sparse, const char *ctx) {
    if (rows <= 0 || cols <= 0)
        return er_error(ER_EINVAL, "%s: %s matrix must have positive dimensions (got [%d, %d])", ctx,
                        weight_format_name(f), rows, cols);
    if (weight_format_grouped(f)) {
        if (group < 2 || group % 2)
            return er_error(ER_EINVAL, "%s: q4g group size must be even and >= 2 (got %d)", ctx, group);
        if (cols % group)
            return er_error(ER_EINVAL, "%s: group size %d does not divide the %d columns", ctx, group, cols);
    }
    int block = weight_format_info(f)->block;
    if (block && cols % block)
        return er_error(ER_EINVAL, "%s: %s holds rows in blocks of %d, which do not divide the %d columns", ctx,
                        weight_format_name(f), block, cols);
    if (sparse && !weight_format_info(f)->levels)
        return er_error(ER_EINVAL, "%s: sparse corrections need a codebook format (q2lut, q4lut), not %s", ctx,
                        weight_format_name(f));
    if (sparse < 0 || sparse > cols || (sparse && cols > 65536))
        return er_error(ER_EINVAL, "%s: %d sparse corrections per row do not fit %d columns (at most all of them, "
                        "and at most 65536 columns)", ctx, sparse, cols);
    return ER_OK;
}

WeightFormat quant_mix_format(const QuantConfig *q, int layer, int L, int is_v_or_down) {
    int more = layer < L / 8 || layer >= 7 * L / 8 || (layer - L / 8) % 3 == 2; // llama.cpp's use_more_bits
    return q->mix == QUANT_MIX_K_M && is_v_or_down && more ? WF_Q6_K : q->linear;
}

int quant_parse_mix(const char *s, WeightFormat *f) {
    if (s && (strcmp(s, "q4_k_m") == 0 || strcmp(s, "q5_k_m") == 0)) {
        *f = s[1] == '4' ? WF_Q4_K : WF_Q5_K;
        return 1;
    }
    return 0;
}

int quant_parse_embeddings(const char *s, WeightFormat *f) {
    *f = strcmp(s, "int8") == 0 ? WF_Q8 : strcmp(s, "q8_0") == 0 ? WF_Q8_0 : WF_F32;
    return *f != WF_F32 || strcmp(s, "fp") == 0 ? ER_OK : ER_EINVAL;
}

WeightFormat quant_block_fallback(WeightFormat f, int cols) {
    const WeightFormatInfo *fi = weight_format_info(f);
    if (!fi || !fi->block || cols % fi->block == 0)
        return f;
    return f == WF_Q4_K ? WF_Q5_0 : f == WF_Q5_K ? WF_Q5_1 : f == WF_Q6_K ? WF_Q8_0 : f;
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

int quant_weight_alloc(Weight *w, WeightFormat f, int rows, int cols, int group, int sparse) {
    memset(w, 0, sizeof *w);
    ER_TRY(quant_check_shape(f, rows, cols, group, sparse, "quant_weight_alloc"));
    const WeightFormatInfo *fi = weight_format_info(f);
    // data, then each companion, every one 64-byte aligned
    size_t off[1 + WEIGHT_MAX_COMPANIONS], total = align64((size_t)rows * weight_row_bytes(f, cols));
    for (int i = 0; i < fi->n_comp; i++) {
        off[1 + i] = total;
        total += align64(weight_companion_numel(fi, &fi->comp[i], rows, cols, group, sparse) *
                         dtype_size(fi->comp[i].dtype));
    }
    uint8_t *mem = er_calloc(total, 1);
    if (!mem)
        return er_error(ER_ENOMEM, "quant: cannot allocate %zu bytes for a %s [%d, %d] matrix", total, fi->name, rows,
                        cols);
    w->fmt = f;
    w->rows = rows;
    w->cols = cols;
    w->group = weight_format_grouped(f) ? group : 0;
    w->sparse = sparse;
    w->data = mem;
    w->owned = mem;
    for (int i = 0; i < fi->n_comp; i++)
        if (weight_companion_stored(&fi->comp[i], sparse))
            *(const void **)((char *)w + fi->comp[i].field) = mem + off[1 + i];
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

void quant_dequant_rows(float *dst, const Weight *w, int r0, int nr) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < nr; i++) {
        if (quant_dequant_row_simd(dst + (size_t)i * w->cols, w, r0 + i)) {
            weight_sparse_add_row(dst + (size_t)i * w->cols, w, r0 + i);
            continue;
        }
        weight_row_f32(dst + (size_t)i * w->cols, w, r0 + i);
    }
}

// ---- quantization_config ----

// Spec i of the format table (the quantized formats in table order, a grouped one once per group size):
// its format, group and name (16 bytes). 0 when i is past the last.
static int spec_at(int i, WeightFormat *f, int *group, char *name) {
    for (int k = 0; k < WF_COUNT; k++) {
        const WeightFormatInfo *fi = weight_format_info((WeightFormat)k);
        int grouped = weight_format_grouped((WeightFormat)k), n = grouped ? 0 : 1;
        if (!fi->quantized)
            continue;
        while (grouped && n < WEIGHT_MAX_GROUPS && fi->groups[n])
            n++;
        if (i < n) {
            *f = (WeightFormat)k;
            *group = grouped ? fi->groups[i] : 0;
            quant_spec_name(*f, *group, name);
            return 1;
        }
        i -= n;
    }
    return 0;
}

int quant_parse_spec(const char *s, WeightFormat *f, int *group) {
    *group = 0;
    if (!s)
        return ER_EINVAL;
    char name[16];
    WeightFormat sf;
    int sg;
    for (int i = 0; spec_at(i, &sf, &sg, name); i++)
        if (strcmp(s, name) == 0) {
            *f = sf;
            *group = sg;
            return ER_OK;
        }
    return ER_EINVAL;
}

const char *quant_spec_name(WeightFormat f, int group, char *buf) {
    if (weight_format_grouped(f))
        snprintf(buf, 16, "%s%d", weight_format_name(f), group);
    else
        snprintf(buf, 16, "%s", weight_is_quantized(f) ? weight_format_name(f) : "fp");
    return buf;
}

const char *quant_spec_list(char *buf, size_t n, const char *sep, const char *last) {
    char name[16];
    WeightFormat f;
    int g, count = 0;
    size_t len = 0;
    while (spec_at(count, &f, &g, name))
        count++;
    buf[0] = 0;
    for (int i = 0; i < count && len < n; i++) {
        spec_at(i, &f, &g, name);
        int w = snprintf(buf + len, n - len, "%s%s", i == 0 ? "" : i == count - 1 ? last : sep, name);
        len += w > 0 ? (size_t)w : 0;
    }
    return buf;
}

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
    char specs[256];
    quant_spec_list(specs, sizeof specs, ", ", " or ");
    if (quant_parse_mix(s, &q->linear))
        q->mix = QUANT_MIX_K_M;
    else if (quant_parse_spec(s, &q->linear, &q->group) < 0)
        return er_error(ER_EFORMAT, "%s: quantization_config.weights \"%s\" is not a known format (%s, q4_k_m or "
                        "q5_k_m)", ctx, s, specs);
    int64_t g = q->group;
    ER_TRY(json_opt_int(j, "group_size", &g, ctx));
    if (q->linear == WF_Q4G && g != q->group)
        return er_error(ER_EFORMAT, "%s: quantization_config.group_size %lld disagrees with weights \"%s\"", ctx,
                        (long long)g, s);
    const char *e = "fp";
    ER_TRY(json_opt_string(j, "embeddings", &e, ctx));
    if (quant_parse_embeddings(e, &q->embed) < 0)
        return er_error(ER_EFORMAT, "%s: quantization_config.embeddings \"%s\" must be \"int8\", \"q8_0\" or \"fp\"",
                        ctx, e);
    const char *h = s;
    ER_TRY(json_opt_string(j, "lm_head", &h, ctx));
    int hg = 0;
    if (strcmp(h, "fp") == 0)
        q->lm_head = WF_F32;
    else if (quant_parse_spec(h, &q->lm_head, &hg) < 0)
        return er_error(ER_EFORMAT, "%s: quantization_config.lm_head \"%s\" is not a known format (fp, %s)", ctx, h,
                        specs);
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
    int64_t sp = 0;
    ER_TRY(json_opt_int(j, "sparse_per_row", &sp, ctx));
    if (sp < 0 || sp > 65536 || (sp && !weight_format_info(q->linear)->levels))
        return er_error(ER_EFORMAT,
                        "%s: quantization_config.sparse_per_row %lld: must be 0, or 1..65536 with codebook weights "
                        "(q2lut, q4lut; here \"%s\")",
                        ctx, (long long)sp, s);
    q->sparse = (int)sp;
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
    cJSON_AddStringToObject(j, "weights", q->mix ? (q->linear == WF_Q4_K ? "q4_k_m" : "q5_k_m")
                                                 : quant_spec_name(q->linear, q->group, buf));
    cJSON_AddNumberToObject(j, "group_size", q->linear == WF_Q4G ? q->group : 0);
    cJSON_AddStringToObject(j, "embeddings", q->embed == WF_Q8 ? "int8" : q->embed == WF_Q8_0 ? "q8_0" : "fp");
    cJSON_AddStringToObject(j, "lm_head", quant_spec_name(q->lm_head, q->group, buf));
    cJSON_AddStringToObject(j, "transforms", q->transforms[0] ? q->transforms : "none");
    if (q->sparse)
        cJSON_AddNumberToObject(j, "sparse_per_row", q->sparse);
    cJSON_AddNumberToObject(j, "bits_per_weight", q->bits_per_weight);
    return j;
}
