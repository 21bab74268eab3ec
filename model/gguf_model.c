// GGUF models for llama.cpp: export and import (layouts in model/gguf_model.h).
#include "model/gguf_model.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/alloc.h"
#include "core/error.h"
#include "lora/gguf_lora.h"
#include "quant/blocks.h"

static const struct {
    const char *name;
    uint32_t type, file_type; // ggml type; general.file_type (llama_ftype: ALL_F32, MOSTLY_F16, ...)
} EXPORT_TYPES[] = {
    {"f32", GGML_F32, 0},   {"f16", GGML_F16, 1},   {"bf16", GGML_BF16, 32}, {"q8_0", GGML_Q8_0, 7},
    {"q4_0", GGML_Q4_0, 2}, {"q4_1", GGML_Q4_1, 3}, {"q5_0", GGML_Q5_0, 8},  {"q5_1", GGML_Q5_1, 9},
    {"q4_K", GGML_Q4_K, 15}, {"q5_K", GGML_Q5_K, 17}, {"q6_K", GGML_Q6_K, 18},
};
#define N_EXPORT_TYPES (int)(sizeof EXPORT_TYPES / sizeof EXPORT_TYPES[0])
#define EXPORT_TYPE_LIST "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K or q6_K"

// The ggml block types and our formats that hold them byte for byte (quant/blocks.h).
static const struct {
    uint32_t type;
    WeightFormat f;
} BLOCK_TYPES[] = {{GGML_Q8_0, WF_Q8_0}, {GGML_Q4_0, WF_Q4_0}, {GGML_Q4_1, WF_Q4_1}, {GGML_Q5_0, WF_Q5_0},
                   {GGML_Q5_1, WF_Q5_1}, {GGML_Q4_K, WF_Q4_K}, {GGML_Q5_K, WF_Q5_K}, {GGML_Q6_K, WF_Q6_K}};
#define N_BLOCK_TYPES (int)(sizeof BLOCK_TYPES / sizeof BLOCK_TYPES[0])

// Our format of ggml block type t; WF_COUNT when t is not one.
static WeightFormat block_format(uint32_t t) {
    for (int i = 0; i < N_BLOCK_TYPES; i++)
        if (BLOCK_TYPES[i].type == t)
            return BLOCK_TYPES[i].f;
    return WF_COUNT;
}

int model_gguf_parse_type(const char *s, uint32_t *type) {
    for (int i = 0; i < N_EXPORT_TYPES; i++)
        if (strcasecmp(s, EXPORT_TYPES[i].name) == 0) {
            *type = EXPORT_TYPES[i].type;
            return ER_OK;
        }
    return er_error(ER_EINVAL, "unknown GGUF type \"%s\" (expected " EXPORT_TYPE_LIST ")", s);
}

const char *model_gguf_arch(const ModelConfig *c) { return model_arch_name(c->arch); }

// llama.cpp's name of an HF parameter name into out (96 bytes).
static int gguf_param_name(const char *hf, char *out) {
    static const char *const fixed[][2] = {{"model.embed_tokens.weight", "token_embd.weight"},
                                           {"model.norm.weight", "output_norm.weight"},
                                           {"lm_head.weight", "output.weight"}};
    for (int i = 0; i < 3; i++)
        if (strcmp(hf, fixed[i][0]) == 0) {
            snprintf(out, 96, "%s", fixed[i][1]);
            return ER_OK;
        }
    int l, at = 0;
    if (sscanf(hf, "model.layers.%d.%n", &l, &at) != 1 || at == 0)
        return er_error(ER_EINVAL, "gguf: no llama.cpp name for \"%s\"", hf);
    const char *rest = hf + at;
    if (strcmp(rest, "input_layernorm.weight") == 0)
        return snprintf(out, 96, "blk.%d.attn_norm.weight", l), ER_OK;
    if (strcmp(rest, "post_attention_layernorm.weight") == 0)
        return snprintf(out, 96, "blk.%d.ffn_norm.weight", l), ER_OK;
    if (strcmp(rest, "self_attn.q_norm.weight") == 0) // Qwen3
        return snprintf(out, 96, "blk.%d.attn_q_norm.weight", l), ER_OK;
    if (strcmp(rest, "self_attn.k_norm.weight") == 0)
        return snprintf(out, 96, "blk.%d.attn_k_norm.weight", l), ER_OK;
    const char *proj = strchr(rest, '.'); // "self_attn.q_proj.weight" -> "q_proj.weight"
    for (int t = 0; proj && t < LT_COUNT; t++) {
        size_t n = strlen(lora_target_name((LoraTarget)t));
        if (strncmp(proj + 1, lora_target_name((LoraTarget)t), n) == 0 && proj[1 + n] == '.')
            return snprintf(out, 96, "blk.%d.%s%s", l, lora_gguf_target_name((LoraTarget)t), proj + 1 + n), ER_OK;
    }
    return er_error(ER_EINVAL, "gguf: no llama.cpp name for \"%s\"", hf);
}

static int permuted(const ModelConfig *c, const char *hf) {
    return c->arch == ARCH_LLAMA && (strstr(hf, "q_proj") || strstr(hf, "k_proj"));
}

// llama: the HF row behind GGUF row r of a q/k projection with n_head heads of HS (convert_hf_to_gguf's
// permute: rows (head, 2, HS/2) stored as (head, HS/2, 2)); every other tensor keeps its rows.
static int hf_row(const ModelConfig *c, const char *hf, int r) {
    return permuted(c, hf) ? lora_gguf_llama_row(r, c->HS) : r;
}


// ---- export ----

// 1 when row r of a q4g32 weight is q4_0 blocks: each group's zero is exactly -8 x its scale (fp16).
static int q4g_row_is_q4_0(const Weight *w, int r) {
    int g = w->cols / 32;
    for (int b = 0; b < g; b++) {
        size_t k = (size_t)r * g + b;
        if (w->gzero[k] != f32_to_f16(-8.0f * f16_to_f32(w->gscale[k])))
            return 0;
    }
    return 1;
}

static int weight_is_q4_0(const Weight *w) {
    if (w->fmt != WF_Q4G || w->group != 32)
        return 0;
    for (int r = 0; r < w->rows; r++)
        if (!q4g_row_is_q4_0(w, r))
            return 0;
    return 1;
}

// Row r of a q4_0-shaped q4g32 weight as q4_0 blocks, bytes copied (no rounding anywhere).
static void q4g_row_to_q4_0(uint8_t *dst, const Weight *w, int r) {
    uint8_t buf[QUANT_PACKED_ROW_MAX];
    const uint8_t *row = weight_packed_row(w, r, buf);
    for (int b = 0; b < w->cols / 32; b++, dst += 18) {
        memcpy(dst, &w->gscale[weight_group_index(w, r, b)], 2);
        for (int j = 0; j < 16; j++) {
            unsigned lo = quant_code4(row, w->cols, b * 32 + j), hi = quant_code4(row, w->cols, b * 32 + j + 16);
            dst[2 + j] = (uint8_t)(lo | hi << 4);
        }
    }
}

// The ggml type that holds w byte for byte: its float type, q4_0 for a q4_0-shaped q4g32, its block type (q4_0
// for WF_Q4_0); -1 for none.
static long exact_type(const Weight *w) {
    if (!weight_is_quantized(w->fmt))
        return w->fmt == WF_F16 ? GGML_F16 : w->fmt == WF_BF16 ? GGML_BF16 : GGML_F32;
    if (weight_is_q4_0(w))
        return GGML_Q4_0;
    for (int i = 0; i < N_BLOCK_TYPES; i++)
        if (BLOCK_TYPES[i].f == w->fmt)
            return BLOCK_TYPES[i].type;
    return -1;
}

int model_gguf_default_type(const Model *m, uint32_t *type) {
    int q4g = 0, blocks = 0;
    for (int i = 0; i < m->n_params; i++) {
        const Weight *w = m->params[i].w;
        if (!w || !weight_is_quantized(w->fmt))
            continue;
        long t = exact_type(w);
        if (t < 0)
            return er_error(ER_EUNSUPPORTED,
                            "\"%s\" is %s%s, which no GGUF type holds exactly; choose one with --type (" EXPORT_TYPE_LIST
                            ") to requantize from its dequantized values",
                            m->params[i].name, weight_format_name(w->fmt),
                            w->fmt == WF_Q4G ? " with groups other than 32 or zeros other than -8 x scale" : "");
        q4g += w->fmt == WF_Q4G; // a q4_0-shaped q4g32
        blocks += w->fmt != WF_Q4G;
    }
    WeightFormat f = m->embed.fmt;
    *type = blocks ? MODEL_GGUF_NATIVE : q4g ? GGML_Q4_0 : f == WF_F16 ? GGML_F16 : f == WF_BF16 ? GGML_BF16 : GGML_F32;
    return ER_OK;
}

// The bytes of parameter p as ggml type `type`, rows in llama.cpp's order, into a new block.
static int param_bytes(const Model *m, const ParamTensor *p, uint32_t type, void **out, size_t *nbytes) {
    int rows = p->ndim == 2 ? (int)p->shape[0] : 1, cols = p->ndim == 2 ? (int)p->shape[1] : (int)p->shape[0];
    size_t row_bytes = (size_t)cols / ggml_type_block(type) * ggml_type_block_bytes(type);
    uint8_t *buf = er_alloc((size_t)rows * row_bytes);
    float *tmp = er_alloc((size_t)cols * sizeof(float));
    if (!buf || !tmp) {
        er_free(buf);
        er_free(tmp);
        return er_error(ER_ENOMEM, "gguf: out of memory for \"%s\"", p->name);
    }
    WeightFormat bf = block_format(type);
    int exact = p->w && exact_type(p->w) == (long)type;
    uint8_t rowbuf[QUANT_PACKED_ROW_MAX];
    for (int r = 0; r < rows; r++) {
        uint8_t *dst = buf + (size_t)r * row_bytes;
        int src = hf_row(&m->cfg, p->name, r);
        if (!p->w) { // a vector: one row, its elements in llama.cpp's order (llama q/k biases)
            for (int e = 0; e < cols; e++)
                tmp[e] = p->data[hf_row(&m->cfg, p->name, e)];
            dtype_from_f32(dst, DT_F32, tmp, (size_t)cols);
            continue;
        }
        if (exact && p->w->fmt == WF_Q4G) { // q4_0-shaped
            q4g_row_to_q4_0(dst, p->w, src);
            continue;
        }
        if (exact && bf != WF_COUNT) { // the blocks as loaded (gathered back where tiled for decode)
            memcpy(dst, weight_packed_row(p->w, src, rowbuf), row_bytes);
            continue;
        }
        weight_row_f32(tmp, p->w, src);
        if (bf != WF_COUNT)
            blocks_quantize_row(bf, dst, tmp, NULL, cols);
        else
            dtype_from_f32(dst, type == GGML_F16 ? DT_F16 : type == GGML_BF16 ? DT_BF16 : DT_F32, tmp, (size_t)cols);
    }
    er_free(tmp);
    *out = buf;
    *nbytes = (size_t)rows * row_bytes;
    return ER_OK;
}

// The type parameter p is written in: `type`, or with MODEL_GGUF_NATIVE its exact type.
static uint32_t param_type(const ParamTensor *p, uint32_t type) {
    if (p->ndim == 1)
        return GGML_F32;
    return type == MODEL_GGUF_NATIVE ? (uint32_t)exact_type(p->w) : type;
}

static int put_hparams(const Model *m, uint32_t type, GgufWriter *w) {
    const ModelConfig *c = &m->cfg;
    const char *arch = model_gguf_arch(c);
    if (type == MODEL_GGUF_NATIVE) // general.file_type names the type of the most weights
        for (int i = 0, most = 0; i < m->n_params; i++) {
            const ParamTensor *p = &m->params[i];
            if (p->ndim == 2 && weight_is_quantized(p->w->fmt) && p->shape[0] * p->shape[1] > most) {
                most = (int)(p->shape[0] * p->shape[1]);
                type = param_type(p, MODEL_GGUF_NATIVE);
            }
        }
    uint32_t file_type = 0;
    for (int i = 0; i < N_EXPORT_TYPES; i++)
        if (EXPORT_TYPES[i].type == type)
            file_type = EXPORT_TYPES[i].file_type;
    const struct {
        const char *key;
        int v;
    } ints[] = {{"context_length", c->max_pos},       {"embedding_length", c->C},
                {"block_count", c->L},                {"feed_forward_length", c->FF},
                {"attention.head_count", c->NH},      {"attention.head_count_kv", c->NKV},
                {"attention.key_length", c->HS},      {"attention.value_length", c->HS},
                {"rope.dimension_count", c->HS}};
    char key[96];
    ER_TRY(gguf_set_str(w, "general.architecture", arch));
    ER_TRY(gguf_set_u32(w, "general.file_type", file_type));
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        snprintf(key, sizeof key, "%s.%s", arch, ints[i].key);
        ER_TRY(gguf_set_u32(w, key, (uint32_t)ints[i].v));
    }
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    ER_TRY(gguf_set_f32(w, key, c->rope_theta));
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    return gguf_set_f32(w, key, c->eps);
}

int model_gguf_put(const Model *m, uint32_t type, GgufWriter *w, FILE *log) {
    ER_TRY(put_hparams(m, type, w));
    int requant = 0, widened = 0;
    for (int i = 0; i < m->n_params; i++) {
        const ParamTensor *p = &m->params[i];
        uint32_t t = param_type(p, type);
        if (p->ndim == 2 && p->shape[1] % (int64_t)ggml_type_block(t)) {
            t = GGML_F16; // llama.cpp's converter does the same for rows that are not whole blocks
            widened++;
        }
        if (p->w && weight_is_quantized(p->w->fmt) && exact_type(p->w) != (long)t)
            requant++;
        char name[96];
        void *data = NULL;
        size_t nbytes = 0;
        uint64_t ne[2] = {(uint64_t)(p->ndim == 2 ? p->shape[1] : p->shape[0]), (uint64_t)p->shape[0]};
        ER_TRY(gguf_param_name(p->name, name));
        ER_TRY(param_bytes(m, p, t, &data, &nbytes));
        ER_TRY(gguf_add_tensor_owned(w, name, t, p->ndim, ne, data, nbytes));
    }
    if (log && widened)
        fprintf(log, "note: %d matrices have rows that are not whole %s blocks: written f16\n", widened,
                ggml_type_name(type));
    if (log && requant)
        fprintf(log, "note: %d quantized matrices were requantized to %s from their dequantized values\n", requant,
                ggml_type_name(type));
    return ER_OK;
}

// ---- import ----

// The hyper-parameters: "<arch>.*" keys and the shapes of token_embd / output.
static int read_config(const GgufFile *f, ModelConfig *c) {
    const char *arch = NULL;
    ER_TRY(gguf_get_str(f, "general.architecture", 0, &arch));
    memset(c, 0, sizeof *c);
    if (strcmp(arch, "qwen2") == 0)
        c->arch = ARCH_QWEN2;
    else if (strcmp(arch, "qwen3") == 0)
        c->arch = ARCH_QWEN3;
    else if (strcmp(arch, "llama") == 0)
        c->arch = ARCH_LLAMA;
    else
        return er_error(ER_EUNSUPPORTED, "%s: general.architecture is \"%s\" (supported: qwen2, qwen3, llama)",
                        f->path, arch);
    int64_t v[8] = {0};
    const char *keys[8] = {"embedding_length", "feed_forward_length", "block_count",  "attention.head_count",
                           "attention.head_count_kv", "attention.key_length", "context_length", NULL};
    char key[96];
    for (int i = 0; keys[i]; i++) {
        snprintf(key, sizeof key, "%s.%s", arch, keys[i]);
        int optional = i >= 4 && i <= 5; // head_count_kv defaults to head_count, key_length to C / NH
        if (i == 4)
            v[4] = v[3];
        if (i == 5)
            v[5] = v[3] ? v[0] / v[3] : 0;
        ER_TRY(gguf_get_int(f, key, optional, 1, 1 << 24, &v[i]));
    }
    double theta = 10000.0, eps = 0;
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    ER_TRY(gguf_get_float(f, key, 1, &theta));
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    ER_TRY(gguf_get_float(f, key, 0, &eps));
    const GgufTensor *emb = gguf_find_tensor(f, "token_embd.weight");
    if (!emb || emb->ndim != 2)
        return er_error(ER_EFORMAT, "%s: tensor \"token_embd.weight\" is missing or not a matrix", f->path);
    *c = (ModelConfig){c->arch, (int)v[0], (int)v[1], (int)v[2], (int)v[3], (int)v[4], (int)v[5],
                       emb->ne[1] < (1u << 24) ? (int)emb->ne[1] : -1, (int)v[6], (float)theta, (float)eps,
                       gguf_find_tensor(f, "output.weight") == NULL, gguf_find_tensor(f, "blk.0.attn_q.bias") != NULL,
                       DT_F32, -1, -1};
    c->dtype = emb->type == GGML_F16 ? DT_F16 : emb->type == GGML_BF16 ? DT_BF16 : DT_F32;
    int64_t id = -1;
    ER_TRY(gguf_get_int(f, "tokenizer.ggml.bos_token_id", 1, 0, INT32_MAX, &id));
    c->bos_id = (int)id;
    id = -1;
    ER_TRY(gguf_get_int(f, "tokenizer.ggml.eos_token_id", 1, 0, INT32_MAX, &id));
    c->eos_id = (int)id;
    if ((uint64_t)c->C != emb->ne[0])
        return er_error(ER_EFORMAT, "%s: %s.embedding_length is %d but token_embd.weight has rows of %llu", f->path,
                        arch, c->C, (unsigned long long)emb->ne[0]);
    return model_config_validate(c, f->path);
}

// block_count against the tensors: a count that lies is refused before anything is sized from it.
static int check_layers(const GgufFile *f, const ModelConfig *c) {
    long layers = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        const char *name = f->tensors[i].name;
        char *end;
        long l = strncmp(name, "blk.", 4) == 0 ? strtol(name + 4, &end, 10) : -1;
        if (l >= 0 && end != name + 4 && *end == '.' && l < (1L << 24) && l + 1 > layers)
            layers = l + 1;
    }
    if (layers != c->L)
        return er_error(ER_EFORMAT, "%s: %s.block_count is %d but the file holds %ld blocks", f->path,
                        model_gguf_arch(c), c->L, layers);
    return ER_OK;
}

// Row r of t (cols elements) as fp32.
static void tensor_row_f32(float *dst, const GgufTensor *t, size_t r, int cols) {
    size_t row_bytes = (size_t)cols / ggml_type_block(t->type) * ggml_type_block_bytes(t->type);
    const uint8_t *s = (const uint8_t *)t->data + r * row_bytes;
    if (block_format(t->type) != WF_COUNT)
        blocks_dequant_row(block_format(t->type), dst, s, cols);
    else
        dtype_to_f32(dst, s, t->type == GGML_F32 ? DT_F32 : t->type == GGML_F16 ? DT_F16 : DT_BF16, (size_t)cols);
}

// A float or block matrix kept in its type: in place, or a copy where (llama q/k) the rows go back in HF order
// or float data is misaligned for its type (a file read from a buffer or an fd offset that is not a multiple
// of it; block formats read their fields bytewise).
static int place_matrix(Weight *w, const GgufTensor *t, const ModelConfig *c, const char *hf) {
    w->fmt = block_format(t->type);
    if (w->fmt == WF_COUNT)
        w->fmt = t->type == GGML_F32 ? WF_F32 : t->type == GGML_F16 ? WF_F16 : WF_BF16;
    w->data = t->data;
    int misaligned = !weight_is_quantized(w->fmt) && (uintptr_t)t->data % (w->fmt == WF_F32 ? 4 : 2) != 0;
    if (!permuted(c, hf) && !misaligned)
        return ER_OK;
    size_t row_bytes = weight_row_bytes(w->fmt, w->cols);
    char *copy = er_alloc((size_t)w->rows * row_bytes);
    if (!copy)
        return ER_ENOMEM;
    for (int r = 0; r < w->rows; r++)
        memcpy(copy + (size_t)hf_row(c, hf, r) * row_bytes, (const char *)t->data + (size_t)r * row_bytes, row_bytes);
    w->data = w->owned = copy;
    return ER_OK;
}

// fp32 values of t in HF order into dst (rows, cols): rows of a matrix, elements of a vector permuted.
static int tensor_f32(float *dst, const GgufTensor *t, const ModelConfig *c, const char *hf, int rows, int cols) {
    if (t->ndim == 2) {
        for (int r = 0; r < rows; r++)
            tensor_row_f32(dst + (size_t)hf_row(c, hf, r) * cols, t, (size_t)r, cols);
        return ER_OK;
    }
    float *tmp = er_alloc((size_t)cols * sizeof(float));
    if (!tmp)
        return ER_ENOMEM;
    tensor_row_f32(tmp, t, 0, cols);
    for (int e = 0; e < cols; e++)
        dst[hf_row(c, hf, e)] = tmp[e];
    er_free(tmp);
    return ER_OK;
}

static int place_param(Model *m, const GgufFile *f, ParamTensor *p) {
    char name[96];
    ER_TRY(gguf_param_name(p->name, name));
    const GgufTensor *t = gguf_find_tensor(f, name);
    int rows = p->ndim == 2 ? (int)p->shape[0] : 1, cols = p->ndim == 2 ? (int)p->shape[1] : (int)p->shape[0];
    if (!t)
        return er_error(ER_EFORMAT, "%s: tensor \"%s\" is missing", f->path, name);
    if (t->ndim != p->ndim || t->ne[0] != (uint64_t)cols || (p->ndim == 2 && t->ne[1] != (uint64_t)rows))
        return er_error(ER_EFORMAT, "%s: tensor \"%s\" has shape {%llu, %llu}, expected {%d, %d} from the metadata",
                        f->path, name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], cols, rows);
    uint32_t ty = t->type;
    int quantized = block_format(ty) != WF_COUNT;
    if (ty != GGML_F32 && ty != GGML_F16 && ty != GGML_BF16 && !quantized)
        return er_error(ER_EUNSUPPORTED, "%s: tensor \"%s\" has type %s (supported: " EXPORT_TYPE_LIST ")", f->path,
                        name, ggml_type_name(ty));
    if (quantized && m->trainable)
        return er_error(ER_EUNSUPPORTED,
                        "%s: a quantized model (tensor \"%s\" is %s) cannot be loaded for full-parameter training; "
                        "train a LoRA adapter on it (ertrain sft) or start from a float model",
                        f->path, name, ggml_type_name(ty));
    if (p->data)
        ER_TRY(tensor_f32(p->data, t, &m->cfg, p->name, rows, cols));
    else
        ER_TRY(place_matrix(p->w, t, &m->cfg, p->name));
    if (p->w && p->w->fmt == WF_F32)
        p->data = (float *)p->w->data;
    // Non-finite values are refused as in HF dirs (for the block formats: the block scales).
    WeightFormat wf = p->data ? WF_F32 : p->w->fmt;
    if (blocks_format(wf)) {
        size_t nb = (size_t)rows * (size_t)(cols / blocks_elems(wf)), bad = blocks_find_nonfinite(wf, p->w->data, nb);
        if (bad < nb)
            return er_error(ER_EFORMAT, "%s: tensor \"%s\" holds a NaN or infinite scale in block %zu", f->path, name,
                            bad);
        return ER_OK;
    }
    const void *vals = p->data ? (const void *)p->data : p->w->data;
    ErDType vt = wf == WF_F32 ? DT_F32 : wf == WF_BF16 ? DT_BF16 : DT_F16;
    size_t nv = (size_t)rows * cols, bad = dtype_find_nonfinite(vals, vt, nv);
    if (bad < nv)
        return er_error(ER_EFORMAT, "%s: tensor \"%s\" holds a NaN or infinity (value %zu)", f->path, name, bad);
    return ER_OK;
}

int model_load_gguf(Model *m, const char *path, int flags) {
    memset(m, 0, sizeof *m);
    GgufFile *f = er_calloc(1, sizeof *f);
    if (!f)
        return ER_ENOMEM;
    int rc = gguf_open(f, path);
    if (rc < 0) {
        er_free(f);
        return rc;
    }
    return model_load_gguf_file(m, f, flags);
}

int model_load_gguf_file(Model *m, GgufFile *f, int flags) {
    memset(m, 0, sizeof *m);
    m->gguf = f; // model_free closes it from here on
    int rc = ER_OK;
    ER_CHECK(read_config(m->gguf, &m->cfg));
    ER_CHECK(check_layers(m->gguf, &m->cfg));
    ER_CHECK(model_setup(m, flags & MODEL_LOAD_TRAINABLE));
    for (int i = 0; i < m->n_params; i++)
        ER_CHECK(place_param(m, m->gguf, &m->params[i]));
    if (m->cfg.tied)
        m->lm_head = m->embed;
    if (m->trainable) { // fp32 copies made: the file is no longer needed
        gguf_close(m->gguf);
        er_free(m->gguf);
        m->gguf = NULL;
    }
done:
    if (rc < 0)
        model_free(m);
    return rc;
}
