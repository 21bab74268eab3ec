// Model weights: the parameter table, loading HF dirs (single file or shards), random init, saving.
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/rng.h"
#include "model/gguf_model.h"

// Every parameter in HF order, with where it lives in the Model. `vec` is set for 1-D tensors.
typedef struct {
    char name[96];
    int ndim;
    int64_t shape[2];
    Weight *w;
    float **vec;
    float **grad; // where a trainable model keeps the gradient pointer
} Slot;

static int add_slot(Slot *s, int *n, Weight *w, float **vec, float **grad, int64_t d0, int64_t d1, const char *fmt,
                    int layer) {
    Slot *e = &s[(*n)++];
    memset(e, 0, sizeof *e);
    e->grad = grad;
    snprintf(e->name, sizeof e->name, fmt, layer);
    e->w = w;
    e->vec = vec;
    e->ndim = w ? 2 : 1;
    e->shape[0] = d0;
    e->shape[1] = d1;
    if (w) {
        w->rows = (int)d0;
        w->cols = (int)d1;
    }
    return 0;
}

// Fills `slots` (capacity 4 + 14 L) for the model's config; returns the count.
static int list_slots(Model *m, Slot *slots) {
    const ModelConfig *c = &m->cfg;
    int n = 0, qd = c->NH * c->HS, kvd = c->NKV * c->HS;
    add_slot(slots, &n, &m->embed, NULL, &m->g_embed, c->V, c->C, "model.embed_tokens.weight", 0);
    for (int l = 0; l < c->L; l++) {
        LayerWeights *lw = &m->layers[l];
        LayerGrads *lg = &m->grads[l];
        add_slot(slots, &n, NULL, &lw->ln1, &lg->ln1, c->C, 0, "model.layers.%d.input_layernorm.weight", l);
        add_slot(slots, &n, &lw->wq, NULL, &lg->wq, qd, c->C, "model.layers.%d.self_attn.q_proj.weight", l);
        if (c->qkv_bias)
            add_slot(slots, &n, NULL, &lw->bq, &lg->bq, qd, 0, "model.layers.%d.self_attn.q_proj.bias", l);
        add_slot(slots, &n, &lw->wk, NULL, &lg->wk, kvd, c->C, "model.layers.%d.self_attn.k_proj.weight", l);
        if (c->qkv_bias)
            add_slot(slots, &n, NULL, &lw->bk, &lg->bk, kvd, 0, "model.layers.%d.self_attn.k_proj.bias", l);
        add_slot(slots, &n, &lw->wv, NULL, &lg->wv, kvd, c->C, "model.layers.%d.self_attn.v_proj.weight", l);
        if (c->qkv_bias)
            add_slot(slots, &n, NULL, &lw->bv, &lg->bv, kvd, 0, "model.layers.%d.self_attn.v_proj.bias", l);
        add_slot(slots, &n, &lw->wo, NULL, &lg->wo, c->C, qd, "model.layers.%d.self_attn.o_proj.weight", l);
        if (c->arch == ARCH_QWEN3) {
            add_slot(slots, &n, NULL, &lw->q_norm, &lg->q_norm, c->HS, 0, "model.layers.%d.self_attn.q_norm.weight", l);
            add_slot(slots, &n, NULL, &lw->k_norm, &lg->k_norm, c->HS, 0, "model.layers.%d.self_attn.k_norm.weight", l);
        }
        add_slot(slots, &n, NULL, &lw->ln2, &lg->ln2, c->C, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        add_slot(slots, &n, &lw->wgate, NULL, &lg->wgate, c->FF, c->C, "model.layers.%d.mlp.gate_proj.weight", l);
        add_slot(slots, &n, &lw->wup, NULL, &lg->wup, c->FF, c->C, "model.layers.%d.mlp.up_proj.weight", l);
        add_slot(slots, &n, &lw->wdown, NULL, &lg->wdown, c->C, c->FF, "model.layers.%d.mlp.down_proj.weight", l);
    }
    add_slot(slots, &n, NULL, &m->norm, &m->g_norm, c->C, 0, "model.norm.weight", 0);
    if (!c->tied)
        add_slot(slots, &n, &m->lm_head, NULL, &m->g_lm_head, c->V, c->C, "lm_head.weight", 0);
    return n;
}

static size_t slot_numel(const Slot *s) { return (size_t)s->shape[0] * (size_t)(s->ndim == 2 ? s->shape[1] : 1); }

static Backend *model_be(const Model *m) { return m->be ? m->be : backend_cpu(); }

// Zeroed fp32 storage for n floats where the model lives.
static float *model_arena(const Model *m, size_t n) {
    Backend *be = model_be(m);
    float *p = be->ops->alloc(be, n * sizeof(float));
    if (p && be->ops->zero(be, p, n * sizeof(float)) < 0) {
        be->ops->free(be, p);
        return NULL;
    }
    return p;
}

// Builds the parameter table and the fp32 arenas. Trainable: every tensor in param_mem, gradients in
// grad_mem. Otherwise only vectors live in param_mem; matrices are placed by the caller.
int model_setup(Model *m, int trainable) {
    const ModelConfig *c = &m->cfg;
    int rc = ER_OK;
    m->trainable = trainable;
    m->layers = er_calloc((size_t)c->L, sizeof(LayerWeights));
    m->grads = er_calloc((size_t)c->L, sizeof(LayerGrads));
    Slot *slots = er_calloc(4 + 14 * (size_t)c->L, sizeof(Slot));
    if (!m->layers || !m->grads || !slots)
        ER_CHECK(ER_ENOMEM);
    int n = list_slots(m, slots);
    m->params = er_calloc((size_t)n, sizeof(ParamTensor));
    if (!m->params)
        ER_CHECK(ER_ENOMEM);
    m->n_params = n;
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (trainable || slots[i].ndim == 1)
            total += slot_numel(&slots[i]);
    m->n_param_floats = total;
    m->param_mem = model_arena(m, total);
    m->grad_mem = trainable ? model_arena(m, total) : NULL;
    if (!m->param_mem || (trainable && !m->grad_mem))
        ER_CHECK(er_error(ER_ENOMEM, "model: cannot allocate %.1f MiB for %zu parameters",
                          total * 4.0 * (trainable ? 2 : 1) / 1048576.0, total));
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        ParamTensor *p = &m->params[i];
        Slot *s = &slots[i];
        memcpy(p->name, s->name, sizeof p->name);
        p->ndim = s->ndim;
        p->shape[0] = s->shape[0];
        p->shape[1] = s->ndim == 2 ? s->shape[1] : 0;
        p->numel = slot_numel(s);
        p->w = s->w;
        if (!trainable && s->ndim != 1)
            continue; // a matrix the loader places
        p->data = m->param_mem + off;
        p->grad = trainable ? m->grad_mem + off : NULL;
        off += p->numel;
        if (trainable)
            *s->grad = p->grad;
        if (s->vec)
            *s->vec = p->data;
        if (s->w) {
            s->w->fmt = WF_F32;
            s->w->data = p->data;
        }
    }
    if (c->tied) {
        m->lm_head = m->embed;
        m->g_lm_head = m->g_embed;
    }
done:
    er_free(slots);
    return rc;
}

const ParamTensor *model_find_param(const Model *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0)
            return &m->params[i];
    return NULL;
}

LoraShape model_config_lora_shape(const ModelConfig *c) {
    return (LoraShape){c->L, c->C, c->NH * c->HS, c->NKV * c->HS, c->FF};
}

void model_free(Model *m) {
    Backend *be = model_be(m);
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].w) { // quantized matrices made in memory own their buffers, as placed ones do
            if (m->be)
                backend_weight_free(be, m->params[i].w);
            else
                weight_free(m->params[i].w);
        }
    er_free(m->layers);
    er_free(m->grads);
    er_free(m->params);
    be->ops->free(be, m->param_mem);
    be->ops->free(be, m->grad_mem);
    er_free(m->owned_mats);
    for (int i = 0; i < m->n_files; i++)
        safetensors_close(&m->files[i]);
    er_free(m->files);
    gguf_close(m->gguf);
    er_free(m->gguf);
    memset(m, 0, sizeof *m);
}

void model_zero_grad(Model *m) {
    if (m->grad_mem)
        model_be(m)->ops->zero(model_be(m), m->grad_mem, m->n_param_floats * sizeof(float));
}

int model_to_backend(Model *dst, const Model *src, Backend *be) {
    memset(dst, 0, sizeof *dst);
    dst->cfg = src->cfg;
    dst->quant = src->quant;
    dst->be = be;
    int rc = ER_OK;
    ER_CHECK(model_setup(dst, src->trainable));
    for (int i = 0; i < dst->n_params; i++) {
        const ParamTensor *s = &src->params[i];
        ParamTensor *d = &dst->params[i];
        if (d->data)
            ER_CHECK(be->ops->upload(be, d->data, s->data, d->numel * sizeof(float)));
        else
            ER_CHECK(be->ops->weight_upload(be, d->w, s->w, 1)); // a model's matrix outside param_mem is frozen
    }
    if (dst->cfg.tied)
        dst->lm_head = dst->embed;
    return ER_OK;
done:
    model_free(dst);
    return er_error_prefix(rc, "placing the model on %s", be->name);
}

// Parameter i's values: norms 1, biases 0, the rest std * N(0, 1). Each chunk of each tensor draws from
// its own stream, so init runs in parallel and gives the same values for any thread count. Into
// p->data, or as bf16 into bf16 (a frozen matrix) when given.
static void init_param(const ParamTensor *p, int i, uint16_t *bf16, float std, const ErRng *base) {
    const size_t CHUNK = 1 << 16;
    int is_norm = strstr(p->name, "norm") != NULL, is_bias = strstr(p->name, ".bias") != NULL;
    long nchunks = (long)((p->numel + CHUNK - 1) / CHUNK);
#pragma omp parallel for schedule(static)
    for (long ch = 0; ch < nchunks; ch++) {
        ErRng r;
        rng_fork(&r, base, ((uint64_t)i << 32) | (uint64_t)ch);
        size_t end = (size_t)(ch + 1) * CHUNK < p->numel ? (size_t)(ch + 1) * CHUNK : p->numel;
        for (size_t j = (size_t)ch * CHUNK; j < end; j++) {
            float v = is_norm ? 1.0f : is_bias ? 0.0f : std * rng_normal(&r);
            if (bf16)
                bf16[j] = f32_to_bf16(v);
            else
                p->data[j] = v;
        }
    }
}

// Every parameter from init_param: trainable fp32, or frozen with bf16 matrices.
static int build_random(Model *m, const ModelConfig *cfg, float std, uint64_t seed, int bf16) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    int rc = ER_OK;
    ER_CHECK(model_config_validate(cfg, "model config"));
    ER_CHECK(model_setup(m, !bf16));
    ErRng base;
    rng_seed(&base, seed);
    for (int i = 0; i < m->n_params; i++) {
        ParamTensor *p = &m->params[i];
        if (bf16 && p->w)
            ER_CHECK(quant_weight_alloc(p->w, WF_BF16, (int)p->shape[0], (int)p->shape[1], 0, 0));
        init_param(p, i, bf16 && p->w ? (uint16_t *)p->w->owned : NULL, std, &base);
    }
    if (cfg->tied)
        m->lm_head = m->embed;
done:
    if (rc < 0)
        model_free(m);
    return rc;
}

int model_build_random(Model *m, const ModelConfig *cfg, float std, uint64_t seed) {
    return build_random(m, cfg, std, seed, 0);
}

int model_build_random_bf16(Model *m, const ModelConfig *cfg, float std, uint64_t seed) {
    return build_random(m, cfg, std, seed, 1);
}

// ---- loading ----

// The shards of an index: distinct file names of weight_map, in first-seen order, opened into m->files.
static int open_index(Model *m, const char *dir, const char *index, const cJSON *wm) {
    int rc = ER_OK, cap = cJSON_GetArraySize(wm);
    m->files = er_calloc((size_t)(cap > 0 ? cap : 1), sizeof(StFile));
    const char **names = er_calloc((size_t)(cap > 0 ? cap : 1), sizeof(char *));
    if (!m->files || !names)
        ER_CHECK(ER_ENOMEM);
    int nn = 0;
    for (cJSON *e = wm->child; e; e = e->next) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/'))
            ER_CHECK(er_error(ER_EFORMAT, "%s: weight_map[\"%s\"] must be a file name in the model dir", index, e->string));
        int k = 0;
        while (k < nn && strcmp(names[k], e->valuestring) != 0)
            k++;
        if (k == nn)
            names[nn++] = e->valuestring;
    }
    for (int k = 0; k < nn; k++) {
        char *p = path_join(dir, names[k]);
        rc = p ? safetensors_open(&m->files[k], p) : ER_ENOMEM;
        free(p);
        ER_CHECK(rc);
        m->n_files++;
    }
done:
    er_free(names);
    return rc;
}

// model.safetensors, or the shards of model.safetensors.index.json (its JSON into *weight_map).
static int open_shards(Model *m, const char *dir, cJSON **weight_map) {
    *weight_map = NULL;
    char *single = path_join(dir, "model.safetensors");
    char *index = path_join(dir, "model.safetensors.index.json");
    cJSON *j = NULL;
    int rc = ER_OK;
    if (!single || !index)
        ER_CHECK(ER_ENOMEM);
    if (path_exists(single)) {
        if (!(m->files = er_calloc(1, sizeof(StFile))))
            ER_CHECK(ER_ENOMEM);
        ER_CHECK(safetensors_open(&m->files[0], single));
        m->n_files = 1;
        goto done;
    }
    if (!path_exists(index))
        ER_CHECK(er_error(ER_EIO, "%s: no model.safetensors or model.safetensors.index.json", dir));
    ER_CHECK(json_parse_file(index, 64u << 20, &j));
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
    if (!cJSON_IsObject(wm))
        ER_CHECK(er_error(ER_EFORMAT, "%s: missing object \"weight_map\"", index));
    ER_CHECK(open_index(m, dir, index, wm));
    *weight_map = j;
    j = NULL;
done:
    cJSON_Delete(j);
    free(single);
    free(index);
    return rc;
}

static const StTensor *find_tensor(const Model *m, const char *name, const StFile **file) {
    for (int i = 0; i < m->n_files; i++) {
        const StTensor *t = safetensors_find(&m->files[i], name);
        if (t) {
            *file = &m->files[i];
            return t;
        }
    }
    return NULL;
}

// t's data, or a copy in owned_mats when it is misaligned for its dtype (headers are padded to 8, but
// a U8 tensor of odd length shifts everything after it).
static const void *aligned_data(Model *m, const StTensor *t, size_t *owned_off) {
    size_t esz = dtype_size(t->dtype);
    if (esz <= 1 || (uintptr_t)t->data % esz == 0)
        return t->data;
    char *dst = (char *)m->owned_mats + *owned_off;
    memcpy(dst, t->data, t->nbytes);
    *owned_off += (t->nbytes + 63) & ~(size_t)63;
    return dst;
}

WeightFormat model_quant_format(const Model *m, const ParamTensor *p, int *group, int *sparse) {
    *group = *sparse = 0;
    return m->quant.enabled ? model_quant_format_in(m, &m->quant, p, group, sparse) : WF_F32;
}

WeightFormat model_quant_format_in(const Model *m, const QuantConfig *q, const ParamTensor *p, int *group, int *sparse) {
    *group = *sparse = 0;
    if (!p->w)
        return WF_F32;
    WeightFormat f = p->w == &m->embed ? q->embed : p->w == &m->lm_head ? q->lm_head : q->linear;
    for (int l = 0; l < m->cfg.L && q->mix; l++)
        if (p->w == &m->layers[l].wv || p->w == &m->layers[l].wdown)
            f = quant_mix_format(q, l, m->cfg.L, 1);
    if (weight_format_grouped(f))
        *group = q->group;
    if (p->w != &m->embed && p->w != &m->lm_head)
        *sparse = q->sparse;
    return quant_block_fallback(f, p->w->cols);
}

// Non-finite values are refused at load, naming the tensor and the first bad index: a NaN would reach
// every output (and quantizing would hide it in a packed model that still runs). Scales of packed
// matrices must also not be negative (the quantizers write >= 0; 0 is an all-zero row).
static int check_values(const char *path, const char *name, const void *data, ErDType dt, size_t n, int scales) {
    const size_t CHUNK = (size_t)1 << 20;
    long nchunks = (long)((n + CHUNK - 1) / CHUNK);
    size_t first = n;
#pragma omp parallel for schedule(dynamic) reduction(min : first)
    for (long c = 0; c < nchunks; c++) {
        size_t b = (size_t)c * CHUNK, len = n - b < CHUNK ? n - b : CHUNK;
        size_t k = dtype_find_nonfinite((const char *)data + b * dtype_size(dt), dt, len);
        if (k < len && b + k < first)
            first = b + k;
    }
    if (first < n) {
        float v;
        dtype_to_f32(&v, (const char *)data + first * dtype_size(dt), dt, 1);
        return er_error(ER_EFORMAT, "%s: tensor \"%s\" holds %g at index %zu (weights must be finite)", path, name, v,
                        first);
    }
    for (size_t i = 0; scales && i < n; i++) {
        float v;
        dtype_to_f32(&v, (const char *)data + i * dtype_size(dt), dt, 1);
        if (v < 0)
            return er_error(ER_EFORMAT, "%s: tensor \"%s\" holds the negative scale %g at index %zu", path, name, v, i);
    }
    return ER_OK;
}

// The model files as quant_packed_load reads them: tensors found across the shards, values checked,
// misaligned ones copied into owned_mats.
typedef struct {
    Model *m;
    size_t *owned_off;
} LoadCtx;

static const StTensor *load_find(void *ctx, const char *name, const char **path) {
    const StFile *f = NULL;
    const StTensor *t = find_tensor(((LoadCtx *)ctx)->m, name, &f);
    *path = f ? f->path : NULL;
    return t;
}

static int load_use(void *ctx, const StTensor *t, const char *path, const char *name, int nonneg, const void **data) {
    LoadCtx *lc = ctx;
    ER_TRY(check_values(path, name, t->data, t->dtype, (size_t)st_numel(t), nonneg));
    *data = aligned_data(lc->m, t, lc->owned_off);
    return ER_OK;
}

static int place_param(Model *m, ParamTensor *p, const StTensor *t, const StFile *f, size_t *owned_off) {
    WeightFormat wf = WF_COUNT; // the float format stored in t's dtype
    for (int i = 0; i < WF_COUNT; i++)
        if (!weight_is_quantized((WeightFormat)i) && weight_format_info((WeightFormat)i)->dtype == t->dtype)
            wf = (WeightFormat)i;
    if (wf == WF_COUNT)
        return er_error(ER_EUNSUPPORTED, "%s: tensor \"%s\" has dtype %s (expected F32, BF16 or F16)", f->path, p->name,
                        dtype_name(t->dtype));
    int shape_ok = t->ndim == p->ndim && t->shape[0] == p->shape[0] && (p->ndim == 1 || t->shape[1] == p->shape[1]);
    if (!shape_ok) {
        char got[64], want[64];
        quant_shape_str(got, sizeof got, t);
        quant_dims_str(want, sizeof want, p->shape[0], p->ndim == 2 ? p->shape[1] : 0);
        return er_error(ER_EFORMAT, "%s: tensor \"%s\" has shape [%s], expected [%s] from config.json", f->path,
                        p->name, got, want);
    }
    ER_TRY(check_values(f->path, p->name, t->data, t->dtype, p->numel, 0));
    if (p->data) // fp32 destination (vectors, or everything when trainable)
        return dtype_to_f32(p->data, t->data, t->dtype, p->numel);
    // A matrix kept in the file's dtype: in place when aligned, else copied once.
    Weight *w = p->w;
    w->fmt = wf;
    w->data = aligned_data(m, t, owned_off);
    if (w->fmt == WF_F32)
        p->data = (float *)w->data;
    return ER_OK;
}

// config.json against the weight files, before anything is sized from it: a config that lies (say
// num_hidden_layers = 16777216 over a 4-layer file) is refused naming the mismatch instead of
// allocating for it. Row counts do not depend on the weight format (packed rows stay rows).
static int check_config_files(const Model *m, const char *cfg_name) {
    const ModelConfig *c = &m->cfg;
    long layers = 0;
    for (int i = 0; i < m->n_files; i++)
        for (int j = 0; j < m->files[i].n_tensors; j++) {
            const char *name = m->files[i].tensors[j].name;
            if (strncmp(name, "model.layers.", 13) != 0)
                continue;
            char *end;
            long l = strtol(name + 13, &end, 10);
            if (end != name + 13 && *end == '.' && l >= 0 && l < (1L << 24) && l + 1 > layers)
                layers = l + 1;
        }
    if (layers != c->L)
        return er_error(ER_EFORMAT, "%s: num_hidden_layers is %d but the weight files hold %ld layers", cfg_name,
                        c->L, layers);
    const struct {
        const char *tensor, *field;
        int64_t rows;
    } dims[] = {
        {"model.embed_tokens.weight", "vocab_size", c->V},
        {"model.norm.weight", "hidden_size", c->C},
        {"model.layers.0.self_attn.q_proj.weight", "num_attention_heads x head_dim", (int64_t)c->NH * c->HS},
        {"model.layers.0.self_attn.k_proj.weight", "num_key_value_heads x head_dim", (int64_t)c->NKV * c->HS},
        {"model.layers.0.mlp.gate_proj.weight", "intermediate_size", c->FF},
    };
    for (size_t k = 0; k < sizeof dims / sizeof dims[0]; k++) {
        const StFile *f;
        const StTensor *t = find_tensor(m, dims[k].tensor, &f);
        if (t && (t->ndim < 1 || t->shape[0] != dims[k].rows))
            return er_error(ER_EFORMAT, "%s: %s gives %lld but \"%s\" in %s has %lld rows", cfg_name,
                            dims[k].field, (long long)dims[k].rows, dims[k].tensor, f->path,
                            t->ndim < 1 ? 0LL : (long long)t->shape[0]);
    }
    return ER_OK;
}

// config.json (parsed, named cfg_name in messages): the model config and its quantization_config, refused
// for training when quantized.
static int load_config(Model *m, const char *cfg_name, const cJSON *cj, int flags) {
    ER_TRY(model_config_from_json(&m->cfg, cj, cfg_name));
    const cJSON *qc = cJSON_GetObjectItemCaseSensitive(cj, "quantization_config");
    if (qc && !cJSON_IsNull(qc))
        ER_TRY(quant_config_from_json(&m->quant, qc, cfg_name));
    if (m->quant.enabled && (flags & MODEL_LOAD_TRAINABLE)) {
        char spec[16];
        return er_error(ER_EUNSUPPORTED,
                        "%s: a quantized model (quantization_config weights %s) cannot be loaded for full-parameter "
                        "training; train a LoRA adapter on it (ertrain sft) or start from the float model",
                        cfg_name, quant_spec_name(m->quant.linear, m->quant.group, spec));
    }
    return ER_OK;
}

// Space for matrices that are misaligned in their file (rare: headers are padded to 8).
static int alloc_misaligned(Model *m) {
    size_t need = 0;
    for (int i = 0; i < m->n_files; i++)
        for (int j = 0; j < m->files[i].n_tensors; j++) {
            const StTensor *t = &m->files[i].tensors[j];
            size_t esz = dtype_size(t->dtype);
            if (esz > 1 && (uintptr_t)t->data % esz != 0)
                need += (t->nbytes + 63) & ~(size_t)63;
        }
    if (need && !(m->owned_mats = er_alloc(need)))
        return ER_ENOMEM;
    return ER_OK;
}

// Parameter p from the files: where the index says it is, packed as quantization_config says or float.
static int load_param(Model *m, const char *dir, const cJSON *weight_map, ParamTensor *p, size_t *owned_off) {
    const StFile *f = NULL;
    const StTensor *t = find_tensor(m, p->name, &f);
    if (!t)
        return er_error(ER_EFORMAT, "%s: tensor \"%s\" is missing from the model files", dir, p->name);
    if (weight_map) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(weight_map, "weight_map");
        const cJSON *where = cJSON_GetObjectItemCaseSensitive(e, p->name);
        const char *base = strrchr(f->path, '/');
        if (!cJSON_IsString(where) || strcmp(where->valuestring, base ? base + 1 : f->path) != 0)
            return er_error(ER_EFORMAT, "%s: tensor \"%s\" is in %s but the index says otherwise", dir, p->name, f->path);
    }
    int group, sparse;
    WeightFormat qf = model_quant_format(m, p, &group, &sparse);
    if (!weight_is_quantized(qf))
        return place_param(m, p, t, f, owned_off);
    LoadCtx lc = {m, owned_off};
    QuantTensorSource src = {load_find, load_use, &lc};
    ER_TRY(quant_packed_load(p->w, qf, group, sparse, (int)p->shape[0], (int)p->shape[1], p->name, dir, &src));
    p->data = NULL;
    return ER_OK;
}

// The weights from the open files (m->files), against the config already read: `name` (the dir, or what
// names the bytes) and cfg_name name them in messages. On failure the caller frees m.
static int load_weights(Model *m, const char *name, const char *cfg_name, const cJSON *weight_map, int flags) {
    ER_TRY(check_config_files(m, cfg_name));
    ER_TRY(model_setup(m, flags & MODEL_LOAD_TRAINABLE));
    if (!m->trainable)
        ER_TRY(alloc_misaligned(m));
    size_t owned_off = 0;
    for (int i = 0; i < m->n_params; i++)
        ER_TRY(load_param(m, name, weight_map, &m->params[i], &owned_off));
    if (m->cfg.tied)
        m->lm_head = m->embed;
    if (m->trainable) {
        // fp32 copies made: the files are no longer needed.
        for (int i = 0; i < m->n_files; i++)
            safetensors_close(&m->files[i]);
        m->n_files = 0;
    }
    return ER_OK;
}

int model_load(Model *m, const char *dir, int flags) {
    if (gguf_is_path(dir))
        return model_load_gguf(m, dir, flags);
    memset(m, 0, sizeof *m);
    cJSON *weight_map = NULL, *cj = NULL;
    char *cfg_path = path_join(dir, "config.json");
    int rc = ER_OK;
    if (!cfg_path)
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(json_parse_file(cfg_path, 1 << 20, &cj));
    ER_CHECK(load_config(m, cfg_path, cj, flags));
    ER_CHECK(open_shards(m, dir, &weight_map));
    ER_CHECK(load_weights(m, dir, cfg_path, weight_map, flags));
done:
    cJSON_Delete(weight_map);
    cJSON_Delete(cj);
    er_free(cfg_path);
    if (rc < 0)
        model_free(m);
    return rc;
}

int model_load_safetensors(Model *m, const JsonText *config, StFile *file, int flags) {
    memset(m, 0, sizeof *m);
    cJSON *cj = NULL;
    int rc = ER_OK;
    if (!(m->files = er_calloc(1, sizeof(StFile)))) {
        safetensors_close(file);
        return ER_ENOMEM;
    }
    m->files[0] = *file; // taken over: model_free closes it
    memset(file, 0, sizeof *file);
    m->n_files = 1;
    ER_CHECK(json_parse_text(config, 1 << 20, &cj));
    ER_CHECK(load_config(m, config->name, cj, flags));
    ER_CHECK(load_weights(m, m->files[0].path, config->name, NULL, flags));
done:
    cJSON_Delete(cj);
    if (rc < 0)
        model_free(m);
    return rc;
}

// ---- saving ----

// Every matrix must be in the format quantization_config will claim, or the dir would not load.
static int check_save_formats(const Model *m, const char *dir) {
    for (int i = 0; i < m->n_params; i++) {
        const ParamTensor *p = &m->params[i];
        int group, sparse;
        WeightFormat want = model_quant_format(m, p, &group, &sparse);
        if (p->w && p->w->tiled)
            return er_error(ER_EINVAL, "model_save %s: \"%s\" is tiled for the decode kernels (model_tile_for_decode)",
                            dir, p->name);
        int ok = !p->w ? 1
                 : weight_is_quantized(want)
                     ? p->w->fmt == want && (!weight_format_grouped(want) || p->w->group == group) &&
                           p->w->sparse == sparse
                     : !weight_is_quantized(p->w->fmt);
        if (ok)
            continue;
        char spec[16];
        return er_error(ER_EINVAL,
                        "model_save %s: \"%s\" is %s with %d sparse corrections per row but the model's "
                        "quantization_config says %s with %d",
                        dir, p->name, weight_format_name(p->w->fmt), p->w->sparse, quant_spec_name(want, group, spec),
                        sparse);
    }
    return ER_OK;
}

// The float tensor of p as written, fp32 or bf16: a matrix in another float format is widened first.
// *buf gets what was allocated for it (the caller frees it after the write).
static int float_tensor(const ParamTensor *p, int as_bf16, StWriteTensor *t, void **buf) {
    t->name = p->name;
    t->dtype = as_bf16 ? DT_BF16 : DT_F32;
    t->ndim = p->ndim;
    t->shape[0] = p->shape[0];
    t->shape[1] = p->shape[1];
    const float *f32 = p->data;
    float *tmp = NULL;
    if (!f32) {
        if (!(tmp = er_alloc(p->numel * sizeof(float))))
            return ER_ENOMEM;
        for (int r = 0; r < p->w->rows; r++)
            weight_row_f32(tmp + (size_t)r * p->w->cols, p->w, r);
        f32 = tmp;
    }
    if (!as_bf16) {
        t->data = f32;
        *buf = tmp;
        return ER_OK;
    }
    *buf = er_alloc(p->numel * 2);
    int rc = *buf ? dtype_from_f32(*buf, DT_BF16, f32, p->numel) : ER_ENOMEM;
    t->data = *buf;
    er_free(tmp);
    return rc;
}

static int write_config(const Model *m, const char *dir, int as_bf16) {
    ModelConfig c = m->cfg;
    c.dtype = as_bf16 ? DT_BF16 : DT_F32;
    char *path = NULL;
    int rc = ER_OK;
    cJSON *j = model_config_to_json(&c);
    if (!j)
        ER_CHECK(ER_ENOMEM);
    if (m->quant.enabled) {
        cJSON *q = quant_config_to_json(&m->quant);
        if (!q || !cJSON_AddItemToObject(j, "quantization_config", q)) {
            cJSON_Delete(q);
            ER_CHECK(ER_ENOMEM);
        }
    }
    if (!(path = path_join(dir, "config.json")))
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(json_write_file(path, j));
done:
    free(path);
    cJSON_Delete(j);
    return rc;
}

// 1 when p lies in a caller's buffer that a file of m borrows (core/bytes.h): its pages are the caller's.
static int model_borrows(const Model *m, const void *p) {
    for (int i = 0; i < m->n_files; i++)
        if (bytes_borrows(&m->files[i].bytes, p))
            return 1;
    return m->gguf && bytes_borrows(&m->gguf->bytes, p);
}

// Once some file pages are released, the matrices left in the file's mapping (untiled: float, or too wide, as a 7B's
// 18944-column down projection) are copied out and their pages released too: reading them would map back whole
// page-cache folios (2 MiB on ext4) that hold the released neighbours, and the process would hold both those and
// their tiled copies (a Q4_K_M file whose k-quant matrices were left untiled held 1.17x the file).
static int own_mapped_rest(Model *m, size_t *released) {
    for (int i = 0; i < m->n_params; i++) {
        Weight *w = m->params[i].w;
        if (!w || w->owned || w->tiled || !w->data || model_borrows(m, w->data))
            continue;
        size_t bytes = (size_t)w->rows * weight_row_bytes(w->fmt, w->cols);
        void *copy = er_alloc(bytes);
        if (!copy)
            return er_error(ER_ENOMEM, "model: copying \"%s\" out of its file (%zu bytes)", m->params[i].name, bytes);
        memcpy(copy, w->data, bytes);
        er_release_pages(w->data, bytes);
        *released += bytes;
        if (m->params[i].data == w->data)
            m->params[i].data = copy;
        w->data = w->owned = copy;
    }
    return ER_OK;
}

int model_tile_for_decode(Model *m, size_t *released, int (*step)(void *user, int done, int total), void *user) {
    size_t freed = 0;
    if (!released)
        released = &freed;
    *released = 0;
    if (m->be && m->be->kind != BACKEND_CPU)
        return ER_OK;
    int rc = ER_OK, total = 0, done = 0;
    for (int i = 0; i < m->n_params; i++)
        total += m->params[i].w != NULL;
    for (int i = 0; i < m->n_params && rc == ER_OK; i++)
        if (m->params[i].w) {
            Weight *w = m->params[i].w;
            const void *was[3] = {w->data, w->gscale, w->gzero};
            size_t bytes[3] = {(size_t)w->rows * weight_row_bytes(w->fmt, w->cols), 0, 0};
            if (w->fmt == WF_Q4G && w->group > 0)
                bytes[1] = bytes[2] = sizeof(uint16_t) * (size_t)w->rows * (size_t)(w->cols / w->group);
            int tiled = quant_tile(w);
            if (tiled < 0)
                rc = tiled;
            else if (tiled && w->data != was[0]) // copies: the file's pages (or the loader's) are not read again
                for (int k = 0; k < 3; k++) {
                    if (model_borrows(m, was[k])) // releasing a caller's anonymous pages would zero them
                        continue;
                    er_release_pages(was[k], bytes[k]);
                    *released += bytes[k];
                }
            if (rc == ER_OK && step && step(user, ++done, total))
                rc = er_error(ER_EABORTED, "model: laying out the weights for decode stopped by the caller after %d of "
                              "%d matrices", done, total);
        }
    if (rc == ER_OK && *released)
        rc = own_mapped_rest(m, released);
    if (m->cfg.tied) // the lm_head is a copy of the embedding's Weight
        m->lm_head = m->embed;
    return rc;
}

int model_save(const Model *m, const char *dir, int as_bf16) {
    ER_TRY(check_save_formats(m, dir));
    ER_TRY(dir_make(dir));
    int n = m->n_params, nt = 0, rc = ER_OK;
    char *path = NULL;
    StWriteTensor *ts = er_calloc((size_t)n * (1 + WEIGHT_MAX_COMPANIONS), sizeof(StWriteTensor));
    void **bufs = er_calloc((size_t)n, sizeof(void *));
    char(*names)[128] = er_calloc((size_t)n * WEIGHT_MAX_COMPANIONS, 128);
    if (!ts || !bufs || !names)
        ER_CHECK(ER_ENOMEM);
    for (int i = 0; i < n; i++) {
        const ParamTensor *p = &m->params[i];
        if (p->w && weight_is_quantized(p->w->fmt))
            nt += quant_packed_tensors(p->w, p->name, ts + nt, names + WEIGHT_MAX_COMPANIONS * i);
        else
            ER_CHECK(float_tensor(p, as_bf16, &ts[nt++], &bufs[i]));
    }
    // Widest element types first (stable otherwise): every tensor then starts aligned for its dtype,
    // so a loader can use all of them in place, scales and codebooks included.
    for (int i = 1; i < nt; i++)
        for (int j = i; j > 0 && dtype_size(ts[j].dtype) > dtype_size(ts[j - 1].dtype); j--) {
            StWriteTensor t = ts[j];
            ts[j] = ts[j - 1];
            ts[j - 1] = t;
        }
    if (!(path = path_join(dir, "model.safetensors")))
        ER_CHECK(ER_ENOMEM);
    const char *meta[] = {"format", "pt"};
    ER_CHECK(safetensors_write(path, ts, nt, meta, 1));
    ER_CHECK(write_config(m, dir, as_bf16));
done:
    for (int i = 0; bufs && i < n; i++)
        er_free(bufs[i]);
    free(path);
    er_free(bufs);
    er_free(ts);
    er_free(names);
    return rc;
}

int model_set_weight(Model *m, ParamTensor *p, Weight *w) {
    if (!p->w)
        return er_error(ER_EINVAL, "model_set_weight: \"%s\" is not a matrix", p->name);
    if (w->rows != p->shape[0] || w->cols != p->shape[1])
        return er_error(ER_EINVAL, "model_set_weight: \"%s\" is [%lld, %lld], the new weight [%d, %d]", p->name,
                        (long long)p->shape[0], (long long)p->shape[1], w->rows, w->cols);
    if (m->trainable && weight_is_quantized(w->fmt)) {
        // Frozen from here on: no gradients (the fp32 values stay in param_mem, unused by quantized matrices).
        er_free(m->grad_mem);
        m->grad_mem = NULL;
        for (int i = 0; i < m->n_params; i++)
            m->params[i].grad = NULL;
        memset(m->grads, 0, sizeof(LayerGrads) * (size_t)m->cfg.L);
        m->g_embed = m->g_norm = m->g_lm_head = NULL;
        m->trainable = 0;
    }
    weight_free(p->w);
    *p->w = *w;
    p->data = w->fmt == WF_F32 ? (float *)w->data : NULL;
    memset(w, 0, sizeof *w);
    if (m->cfg.tied && p->w == &m->embed)
        m->lm_head = m->embed;
    return ER_OK;
}

int model_untie(Model *m) {
    if (!m->cfg.tied)
        return ER_OK;
    ModelConfig c = m->cfg;
    c.tied = 0;
    // The old gradients go first: the new model brings zeroed ones.
    er_free(m->grad_mem);
    m->grad_mem = NULL;
    memset(m->grads, 0, sizeof(LayerGrads) * (size_t)m->cfg.L);
    m->g_embed = m->g_norm = m->g_lm_head = NULL;
    for (int i = 0; i < m->n_params; i++)
        m->params[i].grad = NULL;
    m->trainable = 0;
    Model u;
    ER_TRY(model_build_random(&u, &c, 0.0f, 0));
    for (int i = 0; i < u.n_params; i++) {
        ParamTensor *d = &u.params[i];
        const char *name = strcmp(d->name, "lm_head.weight") == 0 ? "model.embed_tokens.weight" : d->name;
        const ParamTensor *s = model_find_param(m, name);
        if (!s || s->numel != d->numel) {
            model_free(&u);
            return er_error(ER_EINVAL, "untie: no parameter \"%s\" of %zu values in the tied model", name, d->numel);
        }
        if (s->w)
            quant_dequant_rows(d->data, s->w, 0, s->w->rows);
        else
            memcpy(d->data, s->data, s->numel * sizeof(float));
    }
    model_free(m);
    *m = u;
    // The parameter table points at the Weight fields of the struct it was built in.
    for (int i = 0; i < m->n_params; i++) {
        if (m->params[i].w == &u.embed)
            m->params[i].w = &m->embed;
        else if (m->params[i].w == &u.lm_head)
            m->params[i].w = &m->lm_head;
    }
    return ER_OK;
}
