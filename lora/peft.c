#include "lora/peft.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/safetensors.h"

#define PEFT_CONFIG "adapter_config.json"
#define PEFT_WEIGHTS "adapter_model.safetensors"
#define PEFT_PREFIX "base_model.model.model.layers."
#define PEFT_NAME_MAX 128

static int is_attention(LoraTarget t) { return t <= LT_O; }

// base_model.model.model.layers.{l}.{self_attn|mlp}.{target}.lora_{A|B}.weight
static void tensor_name(char *buf, size_t n, int layer, LoraTarget t, int is_b) {
    snprintf(buf, n, PEFT_PREFIX "%d.%s.%s.lora_%c.weight", layer, is_attention(t) ? "self_attn" : "mlp",
             lora_target_name(t), is_b ? 'B' : 'A');
}

static int popcount(unsigned x) {
    int n = 0;
    for (; x; x &= x - 1)
        n++;
    return n;
}

// The shortest decimal that reads back as the same float, so the JSON says 0.05 rather than
// 0.05000000074505806 and a save/load round trip is still exact.
static double float_for_json(float f) {
    char buf[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)f);
        double d = strtod(buf, NULL);
        if ((float)d == f)
            return d;
    }
    return (double)f;
}

// ---- save ----

static cJSON *config_to_json(const LoraAdapter *a) {
    cJSON *j = cJSON_CreateObject();
    cJSON *tm = cJSON_CreateArray();
    if (!j || !tm) {
        cJSON_Delete(j);
        cJSON_Delete(tm);
        return NULL;
    }
    for (int t = 0; t < LT_COUNT; t++)
        if (a->targets & (1u << t))
            cJSON_AddItemToArray(tm, cJSON_CreateString(lora_target_name((LoraTarget)t)));
    cJSON_AddStringToObject(j, "peft_type", "LORA");
    cJSON_AddStringToObject(j, "task_type", "CAUSAL_LM");
    cJSON_AddNumberToObject(j, "r", a->r);
    cJSON_AddNumberToObject(j, "lora_alpha", float_for_json(a->alpha));
    cJSON_AddItemToObject(j, "target_modules", tm);
    cJSON_AddNumberToObject(j, "lora_dropout", float_for_json(a->dropout));
    cJSON_AddStringToObject(j, "bias", "none");
    cJSON_AddBoolToObject(j, "use_rslora", a->rslora != 0);
    cJSON_AddBoolToObject(j, "fan_in_fan_out", 0);
    // PEFT's neutral values, written out so a reader sees at a glance that none of them is in use.
    cJSON_AddBoolToObject(j, "use_dora", 0);
    cJSON_AddItemToObject(j, "rank_pattern", cJSON_CreateObject());
    cJSON_AddItemToObject(j, "alpha_pattern", cJSON_CreateObject());
    cJSON_AddNullToObject(j, "layers_to_transform");
    cJSON_AddNullToObject(j, "layers_pattern");
    cJSON_AddNullToObject(j, "modules_to_save");
    cJSON_AddBoolToObject(j, "init_lora_weights", 1);
    cJSON_AddStringToObject(j, "base_model_name_or_path", a->base_model ? a->base_model : "");
    cJSON_AddBoolToObject(j, "inference_mode", 1);
    cJSON_AddStringToObject(j, "er_mask", a->masked ? "response" : "all");
    if (a->reasoning_prefix)
        cJSON_AddStringToObject(j, "er_reasoning_prefix", a->reasoning_prefix);
    // cJSON's Add* return NULL on allocation failure; the object then lacks a key.
    if (cJSON_GetArraySize(j) < 19 + (a->reasoning_prefix != NULL) || cJSON_GetArraySize(tm) != popcount(a->targets)) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

int peft_save(const LoraAdapter *a, const char *dir) {
    if (!a->mats || a->r < 1 || a->L < 1 || !a->targets || (a->targets & ~LORA_ALL_TARGETS))
        return er_error(ER_EINVAL, "%s: peft_save: the adapter is not initialised", dir);
    ER_TRY(dir_make(dir));
    char *cfg_path = path_join(dir, PEFT_CONFIG), *st_path = path_join(dir, PEFT_WEIGHTS);
    int n = a->L * popcount(a->targets) * 2;
    StWriteTensor *ts = er_calloc((size_t)n, sizeof *ts);
    char(*names)[PEFT_NAME_MAX] = er_calloc((size_t)n, PEFT_NAME_MAX);
    cJSON *j = NULL;
    int rc = ER_OK;
    if (!cfg_path || !st_path || !ts || !names)
        ER_CHECK(ER_ENOMEM);
    int k = 0;
    for (int l = 0; l < a->L; l++)
        for (int t = 0; t < LT_COUNT; t++) {
            const LoraMat *m = lora_mat(a, l, (LoraTarget)t);
            if (!(a->targets & (1u << t)))
                continue;
            if (!m)
                ER_CHECK(er_error(ER_EINVAL, "%s: peft_save: layer %d %s is targeted but has no matrices", dir, l,
                                  lora_target_name((LoraTarget)t)));
            for (int is_b = 0; is_b < 2; is_b++, k++) {
                tensor_name(names[k], PEFT_NAME_MAX, l, (LoraTarget)t, is_b);
                ts[k].name = names[k];
                ts[k].dtype = DT_F32;
                ts[k].ndim = 2;
                ts[k].shape[0] = is_b ? m->out : a->r;  // A (r, in), B (out, r)
                ts[k].shape[1] = is_b ? a->r : m->in;
                ts[k].data = is_b ? m->B : m->A;
            }
        }
    // The weights first: adapter_config.json appearing last marks a complete adapter.
    static const char *const meta[] = {"format", "pt"};
    ER_CHECK(safetensors_write(st_path, ts, n, meta, 1));
    if (!(j = config_to_json(a)))
        ER_CHECK(er_error(ER_ENOMEM, "%s: out of memory building the config", cfg_path));
    ER_CHECK(json_write_file(cfg_path, j));
done:
    cJSON_Delete(j);
    er_free(names);
    er_free(ts);
    er_free(cfg_path);
    er_free(st_path);
    return rc;
}

// ---- load: adapter_config.json ----

typedef struct {
    int r;
    float alpha, dropout;
    int rslora, masked;
    unsigned targets;
    const char *base_model, *prefix; // into the cJSON tree
} PeftConfig;

static const cJSON *field(const cJSON *j, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

// null, {}, [] and "" all mean "not used" in the PEFT configs seen in the wild.
static int is_empty(const cJSON *v) {
    return !v || ((cJSON_IsObject(v) || cJSON_IsArray(v)) && !v->child) ||
           (cJSON_IsString(v) && !v->valuestring[0]);
}

// Options that change what the adapter computes (or that touch more than the linear layers):
// an adapter using any of them would load "fine" and then compute something else, so refuse.
static int refuse_unsupported(const cJSON *j, const char *path) {
    static const struct {
        const char *key, *why;
    } must_be_empty[] = {
        {"rank_pattern", "per-module ranks are not supported"},
        {"alpha_pattern", "per-module alphas are not supported"},
        {"layers_to_transform", "adapting a subset of layers is not supported"},
        {"layers_pattern", "adapting a subset of layers is not supported"},
        {"modules_to_save", "fully trained extra modules are not supported"},
        {"layer_replication", "layer replication is not supported"},
        {"exclude_modules", "excluded modules are not supported"},
        {"target_parameters", "LoRA on parameters (not modules) is not supported"},
        {"trainable_token_indices", "trainable token embeddings are not supported"},
        {"megatron_config", "Megatron-parallel LoRA is not supported"},
        {"alora_invocation_tokens", "activated LoRA (aLoRA) is not supported"},
        {"arrow_config", "Arrow routing is not supported"},
    };
    for (size_t i = 0; i < sizeof must_be_empty / sizeof must_be_empty[0]; i++)
        if (!is_empty(field(j, must_be_empty[i].key)))
            return er_error(ER_EUNSUPPORTED, "%s: \"%s\" is set: %s", path, must_be_empty[i].key, must_be_empty[i].why);
    static const struct {
        const char *key, *why;
    } must_be_false[] = {
        {"use_dora", "DoRA adapters are not supported"},
        {"fan_in_fan_out", "fan_in_fan_out (Conv1D-style transposed weights) is not supported"},
        {"lora_bias", "LoRA bias terms are not supported"},
        {"use_qalora", "QA-LoRA is not supported"},
    };
    for (size_t i = 0; i < sizeof must_be_false / sizeof must_be_false[0]; i++) {
        int on = 0;
        ER_TRY(json_opt_bool(j, must_be_false[i].key, &on, path));
        if (on)
            return er_error(ER_EUNSUPPORTED, "%s: \"%s\" is true: %s", path, must_be_false[i].key, must_be_false[i].why);
    }
    // Initialisations other than these rewrite the base weights (PiSSA, OLoRA, LoftQ, CorDA, ...)
    // or need data (EVA): the adapter is then only meaningful against a modified base.
    const cJSON *init = field(j, "init_lora_weights");
    if (init && !cJSON_IsBool(init) && !(cJSON_IsString(init) && strcmp(init->valuestring, "gaussian") == 0))
        return er_error(ER_EUNSUPPORTED, "%s: \"init_lora_weights\" is %s%s%s: only true, false and \"gaussian\" are "
                                         "supported (the others modify the base model)",
                        path, cJSON_IsString(init) ? "\"" : "", cJSON_IsString(init) ? init->valuestring : "not a string",
                        cJSON_IsString(init) ? "\"" : "");
    return ER_OK;
}

static int parse_targets(const cJSON *j, const char *path, unsigned *targets) {
    const cJSON *tm = field(j, "target_modules");
    *targets = 0;
    if (!tm)
        return er_error(ER_EFORMAT, "%s: missing field \"target_modules\"", path);
    if (cJSON_IsString(tm)) {
        if (strcmp(tm->valuestring, "all-linear") != 0)
            return er_error(ER_EUNSUPPORTED, "%s: \"target_modules\" is the pattern \"%s\": only a list of module names "
                                             "or \"all-linear\" is supported", path, tm->valuestring);
        *targets = LORA_ALL_TARGETS;
        return ER_OK;
    }
    if (!cJSON_IsArray(tm))
        return er_error(ER_EFORMAT, "%s: \"target_modules\" must be a list of module names", path);
    const cJSON *e;
    cJSON_ArrayForEach(e, tm) {
        if (!cJSON_IsString(e))
            return er_error(ER_EFORMAT, "%s: \"target_modules\" must be a list of strings", path);
        int found = -1;
        for (int t = 0; t < LT_COUNT; t++)
            if (strcmp(e->valuestring, lora_target_name((LoraTarget)t)) == 0)
                found = t;
        if (found < 0)
            return er_error(ER_EUNSUPPORTED, "%s: \"target_modules\" names \"%s\": expected q_proj, k_proj, v_proj, "
                                             "o_proj, gate_proj, up_proj or down_proj", path, e->valuestring);
        *targets |= 1u << found;
    }
    if (!*targets)
        return er_error(ER_EFORMAT, "%s: \"target_modules\" is empty", path);
    return ER_OK;
}

static int parse_config(const cJSON *j, const char *path, PeftConfig *pc) {
    memset(pc, 0, sizeof *pc);
    if (!cJSON_IsObject(j))
        return er_error(ER_EFORMAT, "%s: must be a JSON object", path);
    const char *s = NULL;
    ER_TRY(json_get_string(j, "peft_type", &s, path));
    if (strcmp(s, "LORA") != 0)
        return er_error(ER_EUNSUPPORTED, "%s: \"peft_type\" is \"%s\": only \"LORA\" adapters are supported", path, s);
    s = NULL;
    ER_TRY(json_opt_string(j, "task_type", &s, path));
    if (s && strcmp(s, "CAUSAL_LM") != 0)
        return er_error(ER_EUNSUPPORTED, "%s: \"task_type\" is \"%s\": only \"CAUSAL_LM\" is supported", path, s);
    int64_t r;
    ER_TRY(json_get_int(j, "r", &r, path));
    if (r < 1 || r > 65536)
        return er_error(ER_ERANGE, "%s: \"r\" is %lld: expected an integer in [1, 65536]", path, (long long)r);
    pc->r = (int)r;
    double alpha, dropout = 0;
    ER_TRY(json_get_double(j, "lora_alpha", &alpha, path));
    if (!(alpha > 0) || !isfinite(alpha))
        return er_error(ER_ERANGE, "%s: \"lora_alpha\" is %g: expected a finite number > 0", path, alpha);
    ER_TRY(json_opt_double(j, "lora_dropout", &dropout, path));
    if (!(dropout >= 0 && dropout < 1))
        return er_error(ER_ERANGE, "%s: \"lora_dropout\" is %g: expected in [0, 1)", path, dropout);
    pc->dropout = (float)dropout;
    ER_TRY(parse_targets(j, path, &pc->targets));
    s = NULL;
    ER_TRY(json_opt_string(j, "bias", &s, path));
    if (s && strcmp(s, "none") != 0)
        return er_error(ER_EUNSUPPORTED, "%s: \"bias\" is \"%s\": only \"none\" is supported", path, s);
    ER_TRY(json_opt_bool(j, "use_rslora", &pc->rslora, path));
    // The scale multiplies every adapted output: alpha 1e38 is a float, but its scale overflows the
    // forward, and such an adapter would load and then only fail at generate with NaN logits.
    double scale = pc->rslora ? alpha / sqrt((double)r) : alpha / (double)r;
    if (!(scale <= LORA_MAX_SCALE))
        return er_error(ER_ERANGE, "%s: \"lora_alpha\" is %g: with \"r\" %d%s the LoRA scale is %g, expected at "
                        "most %g", path, alpha, pc->r, pc->rslora ? " and \"use_rslora\"" : "", scale,
                        (double)LORA_MAX_SCALE);
    pc->alpha = (float)alpha; // at most LORA_MAX_SCALE * r
    ER_TRY(refuse_unsupported(j, path));
    // A plain PEFT adapter (no "er_mask") was trained with the adapter on everywhere.
    s = NULL;
    ER_TRY(json_opt_string(j, "er_mask", &s, path));
    if (s && strcmp(s, "response") != 0 && strcmp(s, "all") != 0)
        return er_error(ER_EFORMAT, "%s: \"er_mask\" is \"%s\": expected \"response\" or \"all\"", path, s);
    pc->masked = s && strcmp(s, "response") == 0;
    ER_TRY(json_opt_string(j, "er_reasoning_prefix", &pc->prefix, path));
    ER_TRY(json_opt_string(j, "base_model_name_or_path", &pc->base_model, path));
    if (pc->base_model && !pc->base_model[0])
        pc->base_model = NULL;
    return ER_OK;
}

// ---- load: adapter_model.safetensors ----

// Parses a PEFT tensor name into (layer, target, is_b); -1 when it is not one.
static int parse_tensor_name(const char *name, int *layer, LoraTarget *t, int *is_b) {
    size_t np = strlen(PEFT_PREFIX);
    if (strncmp(name, PEFT_PREFIX, np) != 0)
        return -1;
    const char *p = name + np;
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9'))
        return -1;
    long l = 0;
    while (*p >= '0' && *p <= '9') {
        l = l * 10 + (*p++ - '0');
        if (l > 1000000)
            return -1;
    }
    for (int k = 0; k < LT_COUNT; k++)
        for (int b = 0; b < 2; b++) {
            char want[PEFT_NAME_MAX];
            tensor_name(want, sizeof want, (int)l, (LoraTarget)k, b);
            if (strcmp(name, want) == 0) {
                *layer = (int)l;
                *t = (LoraTarget)k;
                *is_b = b;
                return 0;
            }
        }
    return -1;
}

// One tensor of the file: a targeted matrix of a layer the base has, of the right shape and a float
// dtype; marked in seen (L, LT_COUNT, 2).
static int check_tensor(const StTensor *st, const char *path, const PeftConfig *pc, const LoraShape *s, uint8_t *seen) {
    int l, is_b, in, out, L = s->L;
    LoraTarget t;
    if (parse_tensor_name(st->name, &l, &t, &is_b) < 0)
        return er_error(ER_EFORMAT, "%s: unexpected tensor \"%s\": expected names like "
                                    PEFT_PREFIX "0.self_attn.q_proj.lora_A.weight", path, st->name);
    if (l >= L)
        return er_error(ER_EFORMAT, "%s: tensor \"%s\" is for layer %d but the base model has %d layer%s", path,
                        st->name, l, L, L == 1 ? "" : "s");
    if (!(pc->targets & (1u << t)))
        return er_error(ER_EFORMAT, "%s: tensor \"%s\" is for %s, which \"target_modules\" does not list", path,
                        st->name, lora_target_name(t));
    lora_target_shape(s, t, &in, &out);
    int64_t want0 = is_b ? out : pc->r, want1 = is_b ? pc->r : in;
    if (st->ndim != 2 || st->shape[0] != want0 || st->shape[1] != want1) {
        char got[96] = "[";
        for (int d = 0; d < st->ndim; d++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "", (long long)st->shape[d]);
        strncat(got, "]", sizeof got - strlen(got) - 1);
        return er_error(ER_EFORMAT, "%s: tensor \"%s\" has shape %s, expected [%lld, %lld] (r = %d, base %s %d -> %d)",
                        path, st->name, got, (long long)want0, (long long)want1, pc->r, lora_target_name(t), in, out);
    }
    if (st->dtype != DT_F32 && st->dtype != DT_BF16 && st->dtype != DT_F16)
        return er_error(ER_EFORMAT, "%s: tensor \"%s\" has dtype %s, expected F32, BF16 or F16", path, st->name,
                        dtype_name(st->dtype));
    seen[(l * LT_COUNT + t) * 2 + is_b] = 1;
    return ER_OK;
}

// The file against the config, before anything is sized from "r" and "target_modules": every tensor is
// a targeted matrix of the right shape and every targeted A [r, in] and B [out, r] is there, so an adapter
// never takes more memory than its file holds (a 60-byte config with r = 65536 asked for 2.5 GB).
static int check_tensors(const StFile *f, const char *path, const PeftConfig *pc, const LoraShape *s) {
    int L = s->L, rc = ER_OK;
    uint8_t *seen = er_calloc((size_t)L * LT_COUNT * 2, 1); // (L, LT_COUNT, 2)
    if (!seen)
        return ER_ENOMEM;
    for (int i = 0; i < f->n_tensors; i++)
        ER_CHECK(check_tensor(&f->tensors[i], path, pc, s, seen));
    for (int l = 0; l < L; l++)
        for (int t = 0; t < LT_COUNT; t++)
            for (int b = 0; b < 2; b++)
                if ((pc->targets & (1u << t)) && !seen[(l * LT_COUNT + t) * 2 + b]) {
                    char want[PEFT_NAME_MAX];
                    tensor_name(want, sizeof want, l, (LoraTarget)t, b);
                    ER_CHECK(er_error(ER_EFORMAT, "%s: missing tensor \"%s\"", path, want));
                }
done:
    er_free(seen);
    return rc;
}

// The checked tensors into the adapter's fp32 matrices; non-finite values are refused by index.
static int copy_tensors(LoraAdapter *a, const StFile *f, const char *path) {
    for (int i = 0; i < f->n_tensors; i++) {
        const StTensor *st = &f->tensors[i];
        int l, is_b;
        LoraTarget t;
        parse_tensor_name(st->name, &l, &t, &is_b); // check_tensors accepted it
        LoraMat *m = &a->mats[l * LT_COUNT + t];
        float *dst = is_b ? m->B : m->A;
        size_t n = (size_t)st_numel(st);
        ER_TRY(dtype_to_f32(dst, st->data, st->dtype, n));
        for (size_t k = 0; k < n; k++)
            if (!isfinite(dst[k]))
                return er_error(ER_EFORMAT, "%s: tensor \"%s\" holds a non-finite value at index %zu", path, st->name,
                                k);
    }
    return ER_OK;
}

int peft_load(LoraAdapter *a, const char *dir, const LoraShape *s, int with_grads) {
    memset(a, 0, sizeof *a);
    if (s->L < 1 || s->C < 1 || s->q_dim < 1 || s->kv_dim < 1 || s->FF < 1)
        return er_error(ER_EINVAL, "%s: peft_load: invalid base shape (L %d, C %d, q %d, kv %d, FF %d)", dir, s->L, s->C,
                        s->q_dim, s->kv_dim, s->FF);
    char *cfg_path = path_join(dir, PEFT_CONFIG), *st_path = path_join(dir, PEFT_WEIGHTS);
    cJSON *j = NULL;
    StFile f = {0};
    PeftConfig pc;
    int rc = ER_OK;
    if (!cfg_path || !st_path)
        ER_CHECK(ER_ENOMEM);
    if (!path_exists(cfg_path))
        ER_CHECK(er_error(ER_EIO, "%s: missing: %s is not a PEFT adapter dir", cfg_path, dir));
    if (!path_exists(st_path))
        ER_CHECK(er_error(ER_EIO, "%s: missing (adapter weights; only the safetensors format is supported)", st_path));
    ER_CHECK(json_parse_file(cfg_path, 1u << 20, &j));
    ER_CHECK(parse_config(j, cfg_path, &pc));
    ER_CHECK(safetensors_open(&f, st_path));
    ER_CHECK(check_tensors(&f, st_path, &pc, s));
    ER_CHECK(lora_init(a, s, pc.r, pc.alpha, pc.rslora, pc.dropout, pc.targets, with_grads, 0));
    a->masked = pc.masked;
    if ((pc.prefix && !(a->reasoning_prefix = er_strdup(pc.prefix))) ||
        (pc.base_model && !(a->base_model = er_strdup(pc.base_model))))
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(copy_tensors(a, &f, st_path));
done:
    if (rc < 0)
        lora_free(a);
    safetensors_close(&f);
    cJSON_Delete(j);
    er_free(cfg_path);
    er_free(st_path);
    return rc;
}
