// Text embeddings (er_embed): a model's final hidden states pooled into one vector per text, as the model
// says to pool them, optionally truncated (Matryoshka) and L2-normalised, as sentence-transformers computes
// them for decoder models (Qwen3-Embedding: the last token, an <|endoftext|> its tokenizer appends).
#ifndef INFER_EMBED_H
#define INFER_EMBED_H

#include "core/gguf.h"

typedef enum { EMBED_UNSUPPORTED = 0, EMBED_MEAN = 1, EMBED_LAST = 2 } EmbedPooling;

typedef struct {
    EmbedPooling pooling;  // sentence-transformers' Pooling module config (pooling_mode_lasttoken -> last,
                           // pooling_mode_mean_tokens -> mean), or a GGUF's <arch>.pooling_type (1 mean, 3 last);
                           // mean when the model says nothing; EMBED_UNSUPPORTED for another mode (named in mode)
    char mode[128];        // the mode's name, for the refusal
    char *query_prompt;    // config_sentence_transformers.json's prompts.query (Qwen3-Embedding: "Instruct: ...
                           // \nQuery:"); NULL = none
} EmbedSpec;

// From a model dir (modules.json's Pooling module, else 1_Pooling/config.json; config_sentence_transformers.json),
// or, with gguf set, from that file's keys. Missing files leave the defaults; malformed ones are refused naming
// the file. Free with embed_spec_free (safe on a zeroed spec).
int embed_spec_load(EmbedSpec *s, const char *dir, const GgufFile *gguf);
void embed_spec_free(EmbedSpec *s);

// out (dims) = the first dims of h's C values (1 <= dims <= C), divided by their L2 norm when normalize (a zero
// vector stays zero). out may be h.
void embed_finish(float *out, const float *h, int dims, int normalize);

#endif
