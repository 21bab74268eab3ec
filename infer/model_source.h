// A model, its tokenizer and its chat style from one model file in memory (core/bytes.h: a caller's
// buffer, an fd's range), for er_model_load_from_buffer and er_model_load_from_fd: a GGUF (everything
// inside), or a safetensors file with config.json and tokenizer.json given as texts.
#ifndef INFER_MODEL_SOURCE_H
#define INFER_MODEL_SOURCE_H

#include "core/bytes.h"
#include "core/json.h"
#include "data/chat.h"
#include "data/tokenizer.h"
#include "model/model.h"

// The JSON files beside a model file, as texts (text NULL: not given); each named in messages by its name.
typedef struct {
    JsonText config, tokenizer, tokenizer_config, generation_config;
} ModelTexts;

// The format is told by the bytes: "GGUF" first, else safetensors. A GGUF takes no config (its own is
// inside) and its tokenizer and chat style are its own unless texts->tokenizer is given (then with
// tokenizer_config and generation_config as for a model dir; those two alone are refused). A safetensors
// file needs config and tokenizer. *bytes is taken over (zeroed; freed on failure); on success m owns
// them and *tok and *style are set. Every message names the bytes (bytes->name) or the text at fault.
int model_source_load(Model *m, Tokenizer **tok, ChatStyle *style, ByteRange *bytes, const ModelTexts *texts);

#endif
