// Adapters on disk in Hugging Face PEFT layout: adapter_config.json + adapter_model.safetensors with
// keys base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight (r, in) and ...lora_B.weight
// (out, r). This project's own keys in adapter_config.json: "er_mask" ("response" for masked LoRA,
// "all" for standard LoRA) and "er_reasoning_prefix".
#ifndef LORA_PEFT_H
#define LORA_PEFT_H

#include "lora/lora.h"

// Writes dir/adapter_config.json and dir/adapter_model.safetensors atomically (creates dir).
int peft_save(const LoraAdapter *a, const char *dir);
// Loads an adapter for a base of shape `s`; unsupported PEFT options (rank_pattern, alpha_pattern,
// use_dora, bias other than "none", fan_in_fan_out, layers_to_transform, modules_to_save, ...) and
// shapes that do not match the base are refused with the file and the key named.
int peft_load(LoraAdapter *a, const char *dir, const LoraShape *s, int with_grads);

#endif
