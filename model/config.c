#include "model/config.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"

static int get_dim(const cJSON *j, const char *key, int *out, const char *ctx) {
    int64_t v;
    ER_TRY(json_get_int(j, key, &v, ctx));
    if (v <= 0 || v > (1 << 24))
        return er_error(ER_EFORMAT, "%s: \"%s\" = %lld is out of range", ctx, key, (long long)v);
    *out = (int)v;
    return ER_OK;
}

int model_config_from_json(ModelConfig *c, const cJSON *j, const char *ctx) {
    memset(c, 0, sizeof *c);
    if (!cJSON_IsObject(j))
        return er_error(ER_EFORMAT, "%s: config must be a JSON object", ctx);
    const char *type;
    ER_TRY(json_get_string(j, "model_type", &type, ctx));
    if (strcmp(type, "qwen2") == 0)
        c->arch = ARCH_QWEN2;
    else if (strcmp(type, "qwen3") == 0)
        c->arch = ARCH_QWEN3;
    else if (strcmp(type, "llama") == 0)
        c->arch = ARCH_LLAMA;
    else
        return er_error(ER_EUNSUPPORTED, "%s: model_type \"%s\" is not supported (expected qwen2, qwen3 or llama)",
                        ctx, type);
    ER_TRY(get_dim(j, "hidden_size", &c->C, ctx));
    ER_TRY(get_dim(j, "intermediate_size", &c->FF, ctx));
    ER_TRY(get_dim(j, "num_hidden_layers", &c->L, ctx));
    ER_TRY(get_dim(j, "num_attention_heads", &c->NH, ctx));
    c->NKV = c->NH;
    if (cJSON_GetObjectItemCaseSensitive(j, "num_key_value_heads"))
        ER_TRY(get_dim(j, "num_key_value_heads", &c->NKV, ctx));
    ER_TRY(get_dim(j, "vocab_size", &c->V, ctx));
    c->HS = c->C / c->NH;
    const cJSON *hd = cJSON_GetObjectItemCaseSensitive(j, "head_dim");
    if (hd && !cJSON_IsNull(hd))
        ER_TRY(get_dim(j, "head_dim", &c->HS, ctx));
    c->max_pos = 32768;
    if (cJSON_GetObjectItemCaseSensitive(j, "max_position_embeddings"))
        ER_TRY(get_dim(j, "max_position_embeddings", &c->max_pos, ctx));

    double theta = 10000.0, eps = 1e-6;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    if (rp && cJSON_IsObject(rp)) {
        char sub[512];
        snprintf(sub, sizeof sub, "%s: rope_parameters", ctx);
        const char *rtype = "default";
        ER_TRY(json_opt_string(rp, "rope_type", &rtype, sub));
        if (strcmp(rtype, "default") != 0)
            return er_error(ER_EUNSUPPORTED, "%s: rope_type \"%s\" is not supported (only default)", sub, rtype);
        ER_TRY(json_get_double(rp, "rope_theta", &theta, sub));
    } else {
        ER_TRY(json_opt_double(j, "rope_theta", &theta, ctx));
    }
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    if (rs && !cJSON_IsNull(rs))
        return er_error(ER_EUNSUPPORTED, "%s: rope_scaling is not supported", ctx);
    // Checked as the floats the model uses: 1e300 would become inf, 1e-50 zero and 0.999999999 one.
    c->rope_theta = (float)theta;
    if (!(theta > 0) || !isfinite(c->rope_theta) || !(c->rope_theta > 1))
        return er_error(ER_EFORMAT, "%s: rope_theta %g must be a float above 1", ctx, theta);
    ER_TRY(json_opt_double(j, "rms_norm_eps", &eps, ctx));
    c->eps = (float)eps;
    if (!(c->eps >= 1e-30f && c->eps < 1))
        return er_error(ER_EFORMAT, "%s: rms_norm_eps %g must be in [1e-30, 1) as a float", ctx, eps);

    c->tied = 0;
    ER_TRY(json_opt_bool(j, "tie_word_embeddings", &c->tied, ctx));
    c->qkv_bias = c->arch == ARCH_QWEN2;
    if (c->arch != ARCH_QWEN2) { // Qwen3Attention and LlamaAttention: bias=config.attention_bias, the MLP mlp_bias
        ER_TRY(json_opt_bool(j, "attention_bias", &c->qkv_bias, ctx));
        int mlp_bias = 0;
        ER_TRY(json_opt_bool(j, "mlp_bias", &mlp_bias, ctx));
        if (mlp_bias)
            return er_error(ER_EUNSUPPORTED, "%s: mlp_bias is not supported", ctx);
    }
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "hidden_act");
    if (cJSON_IsString(act) && strcmp(act->valuestring, "silu") != 0)
        return er_error(ER_EUNSUPPORTED, "%s: hidden_act \"%s\" is not supported (only silu)", ctx, act->valuestring);

    const char *dt = "float32";
    ER_TRY(json_opt_string(j, "torch_dtype", &dt, ctx));
    ER_TRY(json_opt_string(j, "dtype", &dt, ctx));
    if (strcmp(dt, "float32") == 0)
        c->dtype = DT_F32;
    else if (strcmp(dt, "bfloat16") == 0)
        c->dtype = DT_BF16;
    else if (strcmp(dt, "float16") == 0)
        c->dtype = DT_F16;
    else
        return er_error(ER_EUNSUPPORTED, "%s: dtype \"%s\" is not supported", ctx, dt);

    int64_t bos = -1, eos = -1;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "eos_token_id");
    if (cJSON_IsNumber(e))
        ER_TRY(json_opt_int(j, "eos_token_id", &eos, ctx));
    ER_TRY(json_opt_int(j, "bos_token_id", &bos, ctx));
    c->bos_id = (int)bos;
    c->eos_id = (int)eos;
    return model_config_validate(c, ctx);
}

int model_config_validate(const ModelConfig *c, const char *ctx) {
    if (c->C <= 0 || c->FF <= 0 || c->L <= 0 || c->NH <= 0 || c->NKV <= 0 || c->HS <= 0 || c->V <= 0)
        return er_error(ER_EFORMAT, "%s: every dimension must be positive", ctx);
    if (c->NH % c->NKV != 0)
        return er_error(ER_EFORMAT, "%s: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)",
                        ctx, c->NH, c->NKV);
    // Widths are ints in the kernels: their products must stay in range (each dimension is <= 2^24).
    if ((int64_t)c->NH * c->HS > (1 << 24) || (int64_t)c->NKV * c->HS > (1 << 24))
        return er_error(ER_EFORMAT, "%s: num_attention_heads x head_dim = %lld is out of range (at most %d)", ctx,
                        (long long)c->NH * c->HS, 1 << 24);
    if (c->HS % 2 != 0)
        return er_error(ER_EFORMAT, "%s: head_dim (%d) must be even for RoPE", ctx, c->HS);
    return ER_OK;
}

const char *model_arch_name(ModelArch a) { return a == ARCH_QWEN2 ? "qwen2" : a == ARCH_QWEN3 ? "qwen3" : "llama"; }

int model_config_load(ModelConfig *c, const char *path) {
    cJSON *j;
    ER_TRY(json_parse_file(path, 1 << 20, &j));
    int rc = model_config_from_json(c, j, path);
    cJSON_Delete(j);
    return rc;
}

cJSON *model_config_to_json(const ModelConfig *c) {
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return NULL;
    cJSON_AddStringToObject(j, "model_type", model_arch_name(c->arch));
    cJSON *archs = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(archs, cJSON_CreateString(c->arch == ARCH_QWEN2   ? "Qwen2ForCausalLM"
                                                   : c->arch == ARCH_QWEN3 ? "Qwen3ForCausalLM"
                                                                           : "LlamaForCausalLM"));
    cJSON_AddNumberToObject(j, "hidden_size", c->C);
    cJSON_AddNumberToObject(j, "intermediate_size", c->FF);
    cJSON_AddNumberToObject(j, "num_hidden_layers", c->L);
    cJSON_AddNumberToObject(j, "num_attention_heads", c->NH);
    cJSON_AddNumberToObject(j, "num_key_value_heads", c->NKV);
    cJSON_AddNumberToObject(j, "head_dim", c->HS);
    cJSON_AddNumberToObject(j, "vocab_size", c->V);
    cJSON_AddNumberToObject(j, "max_position_embeddings", c->max_pos);
    cJSON_AddNumberToObject(j, "rope_theta", c->rope_theta);
    cJSON_AddNumberToObject(j, "rms_norm_eps", c->eps);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tied);
    if (c->arch != ARCH_QWEN2)
        cJSON_AddBoolToObject(j, "attention_bias", c->qkv_bias);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddStringToObject(j, "torch_dtype", c->dtype == DT_BF16 ? "bfloat16" : c->dtype == DT_F16 ? "float16" : "float32");
    if (c->bos_id >= 0)
        cJSON_AddNumberToObject(j, "bos_token_id", c->bos_id);
    if (c->eos_id >= 0)
        cJSON_AddNumberToObject(j, "eos_token_id", c->eos_id);
    return j;
}

size_t model_config_num_params(const ModelConfig *c) {
    size_t C = c->C, qd = (size_t)c->NH * c->HS, kvd = (size_t)c->NKV * c->HS, FF = c->FF;
    size_t per_layer = 2 * C + C * qd + 2 * C * kvd + qd * C + 3 * C * FF + (c->qkv_bias ? qd + 2 * kvd : 0) +
                       (c->arch == ARCH_QWEN3 ? 2 * (size_t)c->HS : 0);
    return (size_t)c->V * C * (c->tied ? 1 : 2) + C + (size_t)c->L * per_layer;
}
