// Model hyperparameters from a Hugging Face config.json (Qwen2, Qwen3 and Llama families).
#ifndef MODEL_CONFIG_H
#define MODEL_CONFIG_H

#include <cjson/cJSON.h>

#include "core/dtype.h"

// ARCH_QWEN3 is Qwen2 with per-head RMSNorm on q and k before RoPE (q_norm, k_norm: weights (HS) each) and
// q/k/v biases only with attention_bias.
typedef enum { ARCH_QWEN2, ARCH_QWEN3, ARCH_LLAMA } ModelArch;

typedef struct {
    ModelArch arch;
    int C;          // hidden_size
    int FF;         // intermediate_size
    int L;          // num_hidden_layers
    int NH;         // num_attention_heads
    int NKV;        // num_key_value_heads (NH % NKV == 0)
    int HS;         // head_dim (default C / NH)
    int V;          // vocab_size
    int max_pos;    // max_position_embeddings
    float rope_theta;
    float eps;      // rms_norm_eps
    int tied;       // tie_word_embeddings: lm_head is the embedding
    int qkv_bias;   // q/k/v projections have biases (always for qwen2; qwen3 / llama: attention_bias)
    ErDType dtype;  // torch_dtype / dtype of the weights on disk
    int bos_id, eos_id; // -1 when absent
} ModelConfig;

// `ctx` names the file in error messages.
int model_config_from_json(ModelConfig *c, const cJSON *j, const char *ctx);
int model_config_load(ModelConfig *c, const char *config_json_path);
// A new cJSON object in HF layout (free with cJSON_Delete); NULL on ENOMEM.
cJSON *model_config_to_json(const ModelConfig *c);
// Checks the dimensions are consistent; used by the loader and by model_build_random.
int model_config_validate(const ModelConfig *c, const char *ctx);
size_t model_config_num_params(const ModelConfig *c);
// config.json's model_type of a: "qwen2", "qwen3" or "llama".
const char *model_arch_name(ModelArch a);

#endif
