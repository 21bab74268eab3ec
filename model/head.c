#include "model/head.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/safetensors.h"

int head_init(Head *h, HeadKind kind, int in, int hidden, float dropout, int with_grads, uint64_t seed) {
    memset(h, 0, sizeof *h);
    if (in < 1 || (kind == HEAD_MLP && hidden < 1) || dropout < 0 || dropout >= 1)
        return er_error(ER_EINVAL, "head: need in >= 1, hidden >= 1 for an MLP and dropout in [0, 1)");
    int H = kind == HEAD_MLP ? hidden : 1;
    h->kind = kind;
    h->in = in;
    h->hidden = H;
    h->dropout = kind == HEAD_MLP ? dropout : 0;
    h->n_params = (size_t)H * in + H + (kind == HEAD_MLP ? (size_t)H + 1 : 0);
    h->params = er_calloc(h->n_params, sizeof(float));
    if (with_grads)
        h->grads = er_calloc(h->n_params, sizeof(float));
    if (!h->params || (with_grads && !h->grads)) {
        head_free(h);
        return ER_ENOMEM;
    }
    h->w1 = h->params;
    h->b1 = h->w1 + (size_t)H * in;
    if (kind == HEAD_MLP) {
        h->w2 = h->b1 + H;
        h->b2 = h->w2 + H;
    }
    ErRng r;
    rng_seed(&r, seed);
    float k1 = 1.0f / sqrtf((float)in), k2 = 1.0f / sqrtf((float)H);
    for (size_t i = 0; i < (size_t)H * in + H; i++)
        h->params[i] = (2 * rng_uniform(&r) - 1) * k1;
    if (kind == HEAD_MLP)
        for (int i = 0; i < H + 1; i++)
            h->w2[i] = (2 * rng_uniform(&r) - 1) * k2;
    return ER_OK;
}

void head_free(Head *h) {
    er_free(h->params);
    er_free(h->grads);
    memset(h, 0, sizeof *h);
}

void head_zero_grad(Head *h) {
    if (h->grads)
        memset(h->grads, 0, sizeof(float) * h->n_params);
}

int head_acts_alloc(HeadActs *a, const Head *h, int cap) {
    memset(a, 0, sizeof *a);
    a->cap = cap;
    a->H = h->hidden;
    a->hid = er_alloc(sizeof(float) * (size_t)cap * h->hidden);
    a->dgate = er_alloc(sizeof(float) * (size_t)cap * h->hidden);
    if (!a->hid || !a->dgate) {
        head_acts_free(a);
        return ER_ENOMEM;
    }
    return ER_OK;
}

void head_acts_free(HeadActs *a) {
    er_free(a->hid);
    er_free(a->dgate);
    memset(a, 0, sizeof *a);
}

float head_sigmoid(float x) { return x >= 0 ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x)); }

int head_forward(const Head *h, const float *x, int N, float *logit, HeadActs *acts, ErRng *rng) {
    int C = h->in, H = h->hidden;
    if (acts && (N > acts->cap || acts->H != H))
        return er_error(ER_EINVAL, "head: %d rows do not fit activations for %d", N, acts->cap);
    if (h->kind == HEAD_LINEAR) {
        for (int n = 0; n < N; n++) {
            const float *xn = x + (size_t)n * C;
            double s = h->b1[0];
            for (int i = 0; i < C; i++)
                s += (double)h->w1[i] * xn[i];
            logit[n] = (float)s;
        }
        return ER_OK;
    }
    float p = h->dropout, inv = 1.0f / (1.0f - p);
    int drop = acts && rng && p > 0;
    for (int n = 0; n < N; n++) {
        const float *xn = x + (size_t)n * C;
        double out = h->b2[0];
        for (int j = 0; j < H; j++) {
            const float *wj = h->w1 + (size_t)j * C;
            double s = h->b1[j];
            for (int i = 0; i < C; i++)
                s += (double)wj[i] * xn[i];
            float g = s > 0 ? 1.0f : 0.0f;
            if (drop && g > 0)
                g = rng_uniform(rng) < p ? 0.0f : inv;
            else if (drop)
                (void)rng_uniform(rng); // one draw per unit whatever its sign: the stream stays aligned
            float hv = (float)s * g;
            if (acts) {
                acts->hid[(size_t)n * H + j] = hv;
                acts->dgate[(size_t)n * H + j] = g;
            }
            out += (double)h->w2[j] * hv;
        }
        logit[n] = (float)out;
    }
    return ER_OK;
}

int head_backward(Head *h, const float *x, const float *dlogit, int N, const HeadActs *acts) {
    if (!h->grads)
        return er_error(ER_EINVAL, "head: backward needs a head with gradients");
    int C = h->in, H = h->hidden;
    float *gw1 = h->grads, *gb1 = gw1 + (size_t)H * C;
    if (h->kind == HEAD_LINEAR) {
        for (int n = 0; n < N; n++) {
            const float *xn = x + (size_t)n * C;
            for (int i = 0; i < C; i++)
                gw1[i] += dlogit[n] * xn[i];
            gb1[0] += dlogit[n];
        }
        return ER_OK;
    }
    if (!acts || N > acts->cap)
        return er_error(ER_EINVAL, "head: the MLP backward needs the activations of its forward");
    float *gw2 = gb1 + H, *gb2 = gw2 + H;
    for (int n = 0; n < N; n++) {
        const float *xn = x + (size_t)n * C, *hid = acts->hid + (size_t)n * H, *dg = acts->dgate + (size_t)n * H;
        float d = dlogit[n];
        gb2[0] += d;
        for (int j = 0; j < H; j++) {
            gw2[j] += d * hid[j];
            float dpre = d * h->w2[j] * dg[j];
            if (dpre == 0)
                continue;
            float *gj = gw1 + (size_t)j * C;
            for (int i = 0; i < C; i++)
                gj[i] += dpre * xn[i];
            gb1[j] += dpre;
        }
    }
    return ER_OK;
}

double head_bce(const float *logit, const float *y, int N, float *dlogit) {
    double sum = 0;
    for (int n = 0; n < N; n++) {
        double z = logit[n];
        // -[y log s(z) + (1-y) log(1-s(z))] = max(z,0) - z*y + log(1 + exp(-|z|))
        sum += (z > 0 ? z : 0) - z * y[n] + log1p(exp(-fabs(z)));
        if (dlogit)
            dlogit[n] = (head_sigmoid(logit[n]) - y[n]) / (float)N;
    }
    return N > 0 ? sum / N : 0;
}

int head_predict(const Head *h, const float *x, int N, float *p) {
    ER_TRY(head_forward(h, x, N, p, NULL, NULL));
    for (int n = 0; n < N; n++)
        p[n] = head_sigmoid(p[n]);
    return ER_OK;
}

// ---- fingerprint ----

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

void model_fingerprint(const Model *m, char out[17]) {
    const ModelConfig *c = &m->cfg;
    int dims[] = {c->L, c->C, c->NH, c->NKV, c->HS, c->FF, c->V, c->tied};
    uint64_t h = fnv1a(0xcbf29ce484222325ULL, dims, sizeof dims);
    float *row = er_alloc(sizeof(float) * (size_t)c->C);
    for (int i = 0; row && i < 16; i++) {
        weight_row_f32(row, &m->embed, (int)((int64_t)i * (c->V - 1) / 15));
        h = fnv1a(h, row, sizeof(float) * (size_t)c->C);
    }
    if (!row) // out of memory: the dimensions alone still tell most models apart
        h ^= 1;
    er_free(row);
    snprintf(out, 17, "%016llx", (unsigned long long)h);
}

// ---- files ----

void trained_head_free(TrainedHead *t) {
    head_free(&t->net);
    er_free(t->verify_prompt);
    cJSON_Delete(t->metrics);
    memset(t, 0, sizeof *t);
}

size_t trained_head_name_len(const char *path) {
    static const char *const suffixes[] = {".safetensors", ".json"};
    size_t n = strlen(path);
    for (int i = 0; i < 2; i++) {
        size_t k = strlen(suffixes[i]);
        if (n > k && strcmp(path + n - k, suffixes[i]) == 0)
            return n - k;
    }
    return n;
}

// NAME from a path naming the head (trained_head_name_len); the two file paths.
static int head_paths(const char *path, char **st, char **js) {
    size_t n = trained_head_name_len(path), sfx = strlen(".safetensors");
    *st = er_alloc(n + sfx + 1);
    *js = er_alloc(n + 6);
    if (!*st || !*js) {
        er_free(*st);
        er_free(*js);
        return ER_ENOMEM;
    }
    memcpy(*st, path, n);
    memcpy(*st + n, ".safetensors", sfx + 1);
    memcpy(*js, path, n);
    memcpy(*js + n, ".json", 6);
    return ER_OK;
}

static const char *role_name(HeadRole r) { return r == HEAD_SWITCHER ? "switcher" : "verifier"; }

// The head's JSON beside its tensors; NULL on ENOMEM.
static cJSON *head_json(const TrainedHead *t) {
    const Head *h = &t->net;
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return NULL;
    cJSON_AddStringToObject(j, "format", "er_head");
    cJSON_AddNumberToObject(j, "version", 1);
    cJSON_AddStringToObject(j, "role", role_name(t->role));
    cJSON_AddStringToObject(j, "kind", h->kind == HEAD_MLP ? "mlp" : "linear");
    cJSON_AddNumberToObject(j, "in", h->in);
    cJSON_AddNumberToObject(j, "hidden", h->kind == HEAD_MLP ? h->hidden : 0);
    cJSON_AddNumberToObject(j, "dropout", h->dropout);
    cJSON_AddNumberToObject(j, "threshold", t->threshold);
    cJSON *f = cJSON_AddObjectToObject(j, "features");
    if (f && t->role == HEAD_SWITCHER) {
        cJSON_AddStringToObject(f, "kind", "prompt_ema");
        cJSON_AddStringToObject(f, "hidden_state", "final_norm_output");
        cJSON_AddNumberToObject(f, "chunk", t->chunk);
        cJSON_AddNumberToObject(f, "alpha", t->alpha);
    } else if (f) {
        cJSON_AddStringToObject(f, "kind", "verify_last");
        cJSON_AddStringToObject(f, "hidden_state", "final_norm_output");
        cJSON_AddStringToObject(f, "prompt", t->verify_prompt ? t->verify_prompt : "");
        cJSON_AddBoolToObject(f, "adapter_on", t->adapter_on);
    }
    if (f && t->kv != HEAD_KV_UNKNOWN)
        cJSON_AddStringToObject(f, "kv", t->kv == HEAD_KV_INT8 ? "int8" : "f32");
    cJSON_AddStringToObject(j, "model_fingerprint", t->fingerprint);
    if (t->metrics)
        cJSON_AddItemToObject(j, "metrics", cJSON_Duplicate(t->metrics, 1));
    return j;
}

int trained_head_save(const TrainedHead *t, const char *path) {
    const Head *h = &t->net;
    char *st, *js;
    ER_TRY(head_paths(path, &st, &js));
    StWriteTensor ts[4] = {
        {"w1", DT_F32, 2, {h->hidden, h->in}, h->w1},
        {"b1", DT_F32, 1, {h->hidden}, h->b1},
        {"w2", DT_F32, 2, {1, h->hidden}, h->w2},
        {"b2", DT_F32, 1, {1}, h->b2},
    };
    const char *meta[] = {"format", "er_head", "role", role_name(t->role)};
    cJSON *j = NULL;
    int rc = ER_OK;
    ER_CHECK(safetensors_write(st, ts, h->kind == HEAD_MLP ? 4 : 2, meta, 2));
    if (!(j = head_json(t)))
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(json_write_file(js, j));
done:
    cJSON_Delete(j);
    er_free(st);
    er_free(js);
    return rc;
}

static int parse_json(TrainedHead *t, const cJSON *j, const char *js, HeadRole role, HeadKind *kind, int *in, int *hidden,
                      double *dropout) {
    const char *s;
    ER_TRY(json_get_string(j, "format", &s, js));
    if (strcmp(s, "er_head") != 0)
        return er_error(ER_EFORMAT, "%s: \"format\" is \"%s\", expected \"er_head\"", js, s);
    ER_TRY(json_get_string(j, "role", &s, js));
    if (strcmp(s, role_name(role)) != 0)
        return er_error(ER_EINVAL, "%s: this is a %s head, expected a %s", js, s, role_name(role));
    t->role = role;
    ER_TRY(json_get_string(j, "kind", &s, js));
    if (strcmp(s, "mlp") != 0 && strcmp(s, "linear") != 0)
        return er_error(ER_EFORMAT, "%s: \"kind\" must be \"mlp\" or \"linear\", got \"%s\"", js, s);
    *kind = strcmp(s, "mlp") == 0 ? HEAD_MLP : HEAD_LINEAR;
    int64_t v;
    ER_TRY(json_get_int(j, "in", &v, js));
    if (v < 1 || v > (1 << 20))
        return er_error(ER_EFORMAT, "%s: \"in\" = %lld is not a hidden size", js, (long long)v);
    *in = (int)v;
    v = 0;
    ER_TRY(json_opt_int(j, "hidden", &v, js));
    if (*kind == HEAD_MLP && (v < 1 || v > (1 << 20)))
        return er_error(ER_EFORMAT, "%s: an MLP head needs \"hidden\" >= 1", js);
    *hidden = (int)v;
    *dropout = 0;
    ER_TRY(json_opt_double(j, "dropout", dropout, js));
    double th;
    ER_TRY(json_get_double(j, "threshold", &th, js));
    if (!(th >= 0 && th <= 1))
        return er_error(ER_EFORMAT, "%s: \"threshold\" must be in [0, 1]", js);
    if (role == HEAD_SWITCHER && th >= 1)
        return er_error(ER_EFORMAT, "%s: a switcher with threshold 1 sends no prompt to reasoning (retrain it with "
                        "ertrain heads --target-recall R)", js);
    t->threshold = (float)th;
    ER_TRY(json_get_string(j, "model_fingerprint", &s, js));
    snprintf(t->fingerprint, sizeof t->fingerprint, "%s", s);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, "features");
    if (!cJSON_IsObject(f))
        return er_error(ER_EFORMAT, "%s: no \"features\" object", js);
    char ctx[600];
    snprintf(ctx, sizeof ctx, "%s: features", js);
    if (role == HEAD_SWITCHER) {
        double a;
        ER_TRY(json_get_int(f, "chunk", &v, ctx));
        ER_TRY(json_get_double(f, "alpha", &a, ctx));
        if (v < 1 || v > (1 << 20) || !(a > 0 && a <= 1))
            return er_error(ER_EFORMAT, "%s: need chunk >= 1 and alpha in (0, 1]", ctx);
        t->chunk = (int)v;
        t->alpha = (float)a;
    } else {
        ER_TRY(json_get_string(f, "prompt", &s, ctx));
        if (!s[0])
            return er_error(ER_EFORMAT, "%s: the verification prompt is empty", ctx);
        t->verify_prompt = er_strdup(s);
        if (!t->verify_prompt)
            return ER_ENOMEM;
        ER_TRY(json_opt_bool(f, "adapter_on", &t->adapter_on, ctx));
    }
    const cJSON *kv = cJSON_GetObjectItemCaseSensitive(f, "kv");
    if (kv && !(cJSON_IsString(kv) && (strcmp(kv->valuestring, "f32") == 0 || strcmp(kv->valuestring, "int8") == 0)))
        return er_error(ER_EFORMAT, "%s: \"kv\" must be \"f32\" or \"int8\"", ctx);
    t->kv = !kv ? HEAD_KV_UNKNOWN : strcmp(kv->valuestring, "int8") == 0 ? HEAD_KV_INT8 : HEAD_KV_F32;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "metrics");
    if (mt && !(t->metrics = cJSON_Duplicate(mt, 1)))
        return ER_ENOMEM;
    return ER_OK;
}

// A head trained for m: its input size and the fingerprint of the weights it saw (js names the file).
static int check_head_model(const TrainedHead *t, int in, const Model *m, const char *js) {
    char fp[17];
    model_fingerprint(m, fp);
    if (in != m->cfg.C)
        return er_error(ER_EINVAL, "%s: the head reads hidden states of size %d, the model's are %d: it was trained "
                        "for another model", js, in, m->cfg.C);
    if (strcmp(fp, t->fingerprint) != 0)
        return er_error(ER_EINVAL, "%s: the head was trained on another model (fingerprint %s, this model %s); heads "
                        "are tied to the exact weights (a quantized copy counts as another model): retrain it with "
                        "ertrain heads on this model", js, t->fingerprint, fp);
    return ER_OK;
}

int trained_head_load(TrainedHead *t, const char *path, HeadRole role, const Model *m) {
    memset(t, 0, sizeof *t);
    char *st, *js;
    ER_TRY(head_paths(path, &st, &js));
    cJSON *j = NULL;
    StFile f = {0};
    HeadKind kind = HEAD_LINEAR;
    int in = 0, hidden = 0, rc = ER_OK;
    double dropout = 0;
    ER_CHECK(json_parse_file(js, 1u << 24, &j));
    ER_CHECK(parse_json(t, j, js, role, &kind, &in, &hidden, &dropout));
    if (m)
        ER_CHECK(check_head_model(t, in, m, js));
    ER_CHECK(safetensors_open(&f, st));
    // The sizes in the JSON are checked against the file before anything is allocated from them.
    const StTensor *w1 = safetensors_find(&f, "w1");
    int64_t rows = kind == HEAD_MLP ? hidden : 1;
    if (!w1 || w1->ndim != 2 || w1->shape[0] != rows || w1->shape[1] != in)
        ER_CHECK(er_error(ER_EFORMAT, "%s: tensor \"w1\" is %s, but %s says [%lld, %d]", st,
                          w1 ? "of another shape" : "missing", js, (long long)rows, in));
    ER_CHECK(head_init(&t->net, kind, in, hidden, dropout < 1 && dropout >= 0 ? (float)dropout : 0, 0, 0));
    const Head *h = &t->net;
    ER_CHECK(safetensors_read_tensor(&f, "w1", DT_F32, 2, (int64_t[]){h->hidden, h->in}, h->w1));
    ER_CHECK(safetensors_read_tensor(&f, "b1", DT_F32, 1, (int64_t[]){h->hidden}, h->b1));
    if (kind == HEAD_MLP) {
        ER_CHECK(safetensors_read_tensor(&f, "w2", DT_F32, 2, (int64_t[]){1, h->hidden}, h->w2));
        ER_CHECK(safetensors_read_tensor(&f, "b2", DT_F32, 1, (int64_t[]){1}, h->b2));
    }
    for (size_t i = 0; i < h->n_params; i++)
        if (!isfinite(h->params[i]))
            ER_CHECK(er_error(ER_EFORMAT, "%s: parameter %zu is not finite", st, i));
done:
    safetensors_close(&f);
    cJSON_Delete(j);
    er_free(st);
    er_free(js);
    if (rc < 0)
        trained_head_free(t);
    return rc;
}
