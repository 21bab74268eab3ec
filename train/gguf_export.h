// ertrain export gguf / gguf-lora: a model (HF dir or GGUF file) or a PEFT adapter as a GGUF file for
// llama.cpp (layouts in model/gguf_model.h and lora/gguf_lora.h).
#ifndef TRAIN_GGUF_EXPORT_H
#define TRAIN_GGUF_EXPORT_H

#include <stdio.h>

// The model at `model` (dir or .gguf) with its tokenizer and chat template (tokenizer_config.json's, or
// the source GGUF's) into `out`, as `type` ("f32", "f16", "bf16", "q8_0", "q4_0"; NULL: the model's own,
// model_gguf_default_type). Notes (requantized or widened matrices) go to log (NULL = silent).
int gguf_export_model(const char *model, const char *out, const char *type, FILE *log);
// The PEFT adapter `adapter` for the base `model` as a llama.cpp LoRA GGUF into `out`.
int gguf_export_lora(const char *model, const char *adapter, const char *out, FILE *log);

#endif
