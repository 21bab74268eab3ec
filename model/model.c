// Model weights: the parameter table, loading HF dirs (single file or shards), random init, saving.
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/rng.h"

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

// Fills `slots` (capacity 4 + 12 L) for the model's config; returns the count.
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

// Builds the parameter table and the fp32 arenas. Trainable: every tensor in param_mem, gradients in
// grad_mem. Otherwise only vectors live in param_mem; matrices are placed by the caller.
static int model_setup(Model *m, int trainable) {
    const ModelConfig *c = &m->cfg;
    m->trainable = trainable;
    m->layers = er_calloc((size_t)c->L, sizeof(LayerWeights));
    m->grads = er_calloc((size_t)c->L, sizeof(LayerGrads));
    Slot *slots = er_calloc(4 + 12 * (size_t)c->L, sizeof(Slot));
    if (!m->layers || !m->grads || !slots) {
        er_free(slots);
        return ER_ENOMEM;
    }
    int n = list_slots(m, slots);
    m->params = er_calloc((size_t)n, sizeof(ParamTensor));
    if (!m->params) {
        er_free(slots);
        return ER_ENOMEM;
    }
    m->n_params = n;
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (trainable || slots[i].ndim == 1)
            total += slot_numel(&slots[i]);
    m->n_param_floats = total;
    m->param_mem = er_calloc(total, sizeof(float));
    m->grad_mem = trainable ? er_calloc(total, sizeof(float)) : NULL;
    if (!m->param_mem || (trainable && !m->grad_mem)) {
        er_free(slots);
        return er_error(ER_ENOMEM, "model: cannot allocate %.1f MiB for %zu parameters", total * 4.0 * (trainable ? 2 : 1) / 1048576.0, total);
    }
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
        if (trainable || s->ndim == 1) {
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
    }
    if (c->tied) {
        m->lm_head = m->embed;
        m->g_lm_head = m->g_embed;
    }
    er_free(slots);
    return ER_OK;
}

const ParamTensor *model_find_param(const Model *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0)
            return &m->params[i];
    return NULL;
}

void model_free(Model *m) {
    er_free(m->layers);
    er_free(m->grads);
    er_free(m->params);
    er_free(m->param_mem);
    er_free(m->grad_mem);
    er_free(m->owned_mats);
    for (int i = 0; i < m->n_files; i++)
        safetensors_close(&m->files[i]);
    er_free(m->files);
    memset(m, 0, sizeof *m);
}

void model_zero_grad(Model *m) {
    if (m->grad_mem)
        memset(m->grad_mem, 0, m->n_param_floats * sizeof(float));
}

int model_build_random(Model *m, const ModelConfig *cfg, float std, uint64_t seed) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    int rc = model_config_validate(cfg, "model config");
    if (rc == ER_OK)
        rc = model_setup(m, 1);
    if (rc < 0) {
        model_free(m);
        return rc;
    }
    // Each chunk of each tensor draws from its own stream, so init runs in parallel and gives the
    // same weights for any thread count.
    ErRng base;
    rng_seed(&base, seed);
    const size_t CHUNK = 1 << 16;
    for (int i = 0; i < m->n_params; i++) {
        ParamTensor *p = &m->params[i];
        int is_norm = strstr(p->name, "norm") != NULL, is_bias = strstr(p->name, ".bias") != NULL;
        long nchunks = (long)((p->numel + CHUNK - 1) / CHUNK);
#pragma omp parallel for schedule(static)
        for (long ch = 0; ch < nchunks; ch++) {
            ErRng r;
            rng_fork(&r, &base, ((uint64_t)i << 32) | (uint64_t)ch);
            size_t end = (size_t)(ch + 1) * CHUNK < p->numel ? (size_t)(ch + 1) * CHUNK : p->numel;
            for (size_t j = (size_t)ch * CHUNK; j < end; j++)
                p->data[j] = is_norm ? 1.0f : is_bias ? 0.0f : std * rng_normal(&r);
        }
    }
    return ER_OK;
}

// ---- loading ----

static int open_shards(Model *m, const char *dir, cJSON **weight_map) {
    *weight_map = NULL;
    char *single = path_join(dir, "model.safetensors");
    char *index = path_join(dir, "model.safetensors.index.json");
    int rc = ER_OK;
    if (!single || !index) {
        rc = ER_ENOMEM;
        goto done;
    }
    if (path_exists(single)) {
        m->files = er_calloc(1, sizeof(StFile));
        if (!m->files) {
            rc = ER_ENOMEM;
            goto done;
        }
        rc = safetensors_open(&m->files[0], single);
        if (rc == ER_OK)
            m->n_files = 1;
        goto done;
    }
    if (!path_exists(index)) {
        rc = er_error(ER_EIO, "%s: no model.safetensors or model.safetensors.index.json", dir);
        goto done;
    }
    cJSON *j;
    rc = json_parse_file(index, 64u << 20, &j);
    if (rc < 0)
        goto done;
    cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(j);
        rc = er_error(ER_EFORMAT, "%s: missing object \"weight_map\"", index);
        goto done;
    }
    // Distinct shard names, in first-seen order.
    int cap = cJSON_GetArraySize(wm);
    m->files = er_calloc((size_t)(cap > 0 ? cap : 1), sizeof(StFile));
    const char **names = er_calloc((size_t)(cap > 0 ? cap : 1), sizeof(char *));
    if (!m->files || !names) {
        er_free(names);
        cJSON_Delete(j);
        rc = ER_ENOMEM;
        goto done;
    }
    int nn = 0;
    for (cJSON *e = wm->child; e; e = e->next) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/')) {
            rc = er_error(ER_EFORMAT, "%s: weight_map[\"%s\"] must be a file name in the model dir", index, e->string);
            break;
        }
        int k = 0;
        while (k < nn && strcmp(names[k], e->valuestring) != 0)
            k++;
        if (k == nn)
            names[nn++] = e->valuestring;
    }
    for (int k = 0; k < nn && rc == ER_OK; k++) {
        char *p = path_join(dir, names[k]);
        rc = p ? safetensors_open(&m->files[k], p) : ER_ENOMEM;
        free(p);
        if (rc == ER_OK)
            m->n_files++;
    }
    er_free(names);
    if (rc == ER_OK)
        *weight_map = j;
    else
        cJSON_Delete(j);
done:
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

static int place_param(Model *m, ParamTensor *p, const StTensor *t, const StFile *f, size_t *owned_off) {
    if (t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_F16)
        return er_error(ER_EUNSUPPORTED, "%s: tensor \"%s\" has dtype %s (expected F32, BF16 or F16)", f->path, p->name,
                        dtype_name(t->dtype));
    int shape_ok = t->ndim == p->ndim && t->shape[0] == p->shape[0] && (p->ndim == 1 || t->shape[1] == p->shape[1]);
    if (!shape_ok) {
        char got[64] = "";
        for (int d = 0; d < t->ndim && d < 4; d++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? "," : "", (long long)t->shape[d]);
        return er_error(ER_EFORMAT, "%s: tensor \"%s\" has shape [%s], expected [%lld%s%lld] from config.json", f->path,
                        p->name, got, (long long)p->shape[0], p->ndim == 2 ? "," : "",
                        p->ndim == 2 ? (long long)p->shape[1] : 0LL);
    }
    if (p->data) // fp32 destination (vectors, or everything when trainable)
        return dtype_to_f32(p->data, t->data, t->dtype, p->numel);
    // A matrix kept in the file's dtype: in place when aligned, else copied once.
    Weight *w = p->w;
    w->fmt = t->dtype == DT_F32 ? WF_F32 : t->dtype == DT_BF16 ? WF_BF16 : WF_F16;
    size_t esz = dtype_size(t->dtype);
    if ((uintptr_t)t->data % esz == 0) {
        w->data = t->data;
    } else {
        char *dst = (char *)m->owned_mats + *owned_off;
        memcpy(dst, t->data, t->nbytes);
        w->data = dst;
        *owned_off += (t->nbytes + 63) & ~(size_t)63;
    }
    if (w->fmt == WF_F32)
        p->data = (float *)w->data;
    return ER_OK;
}

int model_load(Model *m, const char *dir, int flags) {
    memset(m, 0, sizeof *m);
    char *cfg_path = path_join(dir, "config.json");
    if (!cfg_path)
        return ER_ENOMEM;
    int rc = model_config_load(&m->cfg, cfg_path);
    free(cfg_path);
    if (rc < 0)
        return rc;
    cJSON *weight_map = NULL;
    rc = model_setup(m, flags & MODEL_LOAD_TRAINABLE);
    if (rc == ER_OK)
        rc = open_shards(m, dir, &weight_map);
    if (rc == ER_OK && !m->trainable) {
        // Space for matrices that are misaligned in their file (rare: headers are padded to 8).
        size_t need = 0;
        for (int i = 0; i < m->n_params; i++) {
            const StFile *f;
            const StTensor *t = find_tensor(m, m->params[i].name, &f);
            if (t && m->params[i].w && (uintptr_t)t->data % dtype_size(t->dtype) != 0)
                need += (t->nbytes + 63) & ~(size_t)63;
        }
        if (need && !(m->owned_mats = er_alloc(need)))
            rc = ER_ENOMEM;
    }
    size_t owned_off = 0;
    for (int i = 0; rc == ER_OK && i < m->n_params; i++) {
        ParamTensor *p = &m->params[i];
        const StFile *f = NULL;
        const StTensor *t = find_tensor(m, p->name, &f);
        if (!t) {
            rc = er_error(ER_EFORMAT, "%s: tensor \"%s\" is missing from the model files", dir, p->name);
            break;
        }
        if (weight_map) {
            const cJSON *e = cJSON_GetObjectItemCaseSensitive(weight_map, "weight_map");
            const cJSON *where = cJSON_GetObjectItemCaseSensitive(e, p->name);
            const char *base = strrchr(f->path, '/');
            if (!cJSON_IsString(where) || strcmp(where->valuestring, base ? base + 1 : f->path) != 0) {
                rc = er_error(ER_EFORMAT, "%s: tensor \"%s\" is in %s but the index says otherwise", dir, p->name, f->path);
                break;
            }
        }
        rc = place_param(m, p, t, f, &owned_off);
    }
    cJSON_Delete(weight_map);
    if (rc == ER_OK && m->cfg.tied)
        m->lm_head = m->embed;
    if (rc == ER_OK && m->trainable) {
        // fp32 copies made: the files are no longer needed.
        for (int i = 0; i < m->n_files; i++)
            safetensors_close(&m->files[i]);
        m->n_files = 0;
    }
    if (rc < 0)
        model_free(m);
    return rc;
}

// ---- saving ----

int model_save(const Model *m, const char *dir, int as_bf16) {
    ER_TRY(dir_make(dir));
    int n = m->n_params, rc = ER_OK;
    StWriteTensor *ts = er_calloc((size_t)n, sizeof(StWriteTensor));
    void **bufs = er_calloc((size_t)n, sizeof(void *));
    if (!ts || !bufs) {
        er_free(ts);
        er_free(bufs);
        return ER_ENOMEM;
    }
    for (int i = 0; i < n && rc == ER_OK; i++) {
        const ParamTensor *p = &m->params[i];
        ErDType out = as_bf16 ? DT_BF16 : DT_F32;
        ts[i].name = p->name;
        ts[i].dtype = out;
        ts[i].ndim = p->ndim;
        ts[i].shape[0] = p->shape[0];
        ts[i].shape[1] = p->shape[1];
        // Widen to fp32 where needed, then narrow to the output dtype.
        float *f32 = p->data;
        float *tmp = NULL;
        if (!f32) {
            tmp = er_alloc(p->numel * sizeof(float));
            if (!tmp) {
                rc = ER_ENOMEM;
                break;
            }
            for (int r = 0; r < p->w->rows; r++)
                weight_row_f32(tmp + (size_t)r * p->w->cols, p->w, r);
            f32 = tmp;
        }
        if (out == DT_F32 && !tmp) {
            ts[i].data = f32;
        } else if (out == DT_F32) {
            ts[i].data = bufs[i] = tmp;
            tmp = NULL;
        } else {
            bufs[i] = er_alloc(p->numel * 2);
            if (!bufs[i])
                rc = ER_ENOMEM;
            else
                rc = dtype_from_f32(bufs[i], DT_BF16, f32, p->numel);
            ts[i].data = bufs[i];
        }
        er_free(tmp);
    }
    if (rc == ER_OK) {
        char *path = path_join(dir, "model.safetensors");
        const char *meta[] = {"format", "pt"};
        rc = path ? safetensors_write(path, ts, n, meta, 1) : ER_ENOMEM;
        free(path);
    }
    for (int i = 0; i < n; i++)
        er_free(bufs[i]);
    er_free(bufs);
    er_free(ts);
    if (rc == ER_OK) {
        ModelConfig c = m->cfg;
        c.dtype = as_bf16 ? DT_BF16 : DT_F32;
        cJSON *j = model_config_to_json(&c);
        char *path = path_join(dir, "config.json");
        rc = (j && path) ? json_write_file(path, j) : ER_ENOMEM;
        free(path);
        cJSON_Delete(j);
    }
    return rc;
}
