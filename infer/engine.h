// The generation engine: chunked prefill of a prompt into the KV cache (adapter off), N samples
// forked from it without copying or recomputing the prefix, batched decode of all live samples
// (one weight pass per step for N rows), sampling, stop conditions and the hard budget.
#ifndef INFER_ENGINE_H
#define INFER_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "data/tokenizer.h"
#include "infer/sampler.h"
#include "infer/stop.h"
#include "model/kvcache.h"
#include "model/model.h"

typedef enum { FINISH_EOS, FINISH_STOP, FINISH_LENGTH } FinishReason;

typedef struct {
    int n_samples;           // parallel samples sharing the prompt
    int max_new;             // generated tokens per sample (forced tokens included)
    SamplerParams sampler;
    uint64_t seed;           // sample i draws from stream i of this seed, whatever n_samples is
    int budget;              // hard budget B: after B generated tokens the suffix is forced (0 = off)
    int answer_tokens;       // A: after the budget, at most A more tokens, the suffix included
    const char *budget_suffix; // forced-answer text (default "\n</think>\n\nFinal answer: ")
    const char *response_prefix; // forced at the start of every response (e.g. "<think>\n"); NULL = none
    const char *const *stop; // stop strings (cut from the text); NULL/0 = none
    int n_stop;
    const LoraAdapter *adapter; // masked (adapter->masked): response positions only, so the prompt's KV
                                // cache is the base model's; unmasked: every position. NULL = base
} GenConfig;

void gen_config_default(GenConfig *g);

typedef struct {
    int *tokens;        // generated tokens, forced ones and a final EOS included
    float *logprobs;    // log p(token | context) under the model's untempered distribution
    int n_tokens;
    char *text;         // decoded, cut at a stop string, without the EOS
    size_t text_len;
    FinishReason finish;
    int budget_cut;     // the hard budget forced the answer suffix
} GenSample;

typedef struct {
    int prompt_tokens;
    int prompt_reused;       // prompt positions found in the cache from an earlier call
    long generated_tokens;   // over all samples
    double ttft_s;           // start to the first generated token
    double prefill_s, decode_s;
    double decode_tokens_per_s;
    size_t kv_bytes;         // KV cache bytes in use at the peak
    long forward_positions;  // positions run through the forward (the prefix once)
} GenStats;

// Called for every generated token of every sample: the token's bytes as they add to the text
// (empty for EOS). Return non-zero to stop that sample.
typedef int (*GenTokenFn)(void *user, int sample, int token, const char *bytes, size_t n);

typedef struct {
    Model *model;
    const Tokenizer *tok;
    KVCache kv;
    Activations prefill;   // (1, chunk), ACTS_DECODE
    Activations decode;    // (max_samples, 1), ACTS_DECODE
    Sampler sampler;
    int max_samples, max_len, chunk;
    int prompt_slot;       // the last prompt, kept for prefix reuse (-1 = none)
    int *prompt_tokens;
    int n_prompt;
    const LoraAdapter *prompt_adapter; // what computed the cached prompt (NULL = the base model)
    float *prompt_logits;  // (V) logits after the last prompt (and prefix) position
    long forward_positions;
} Engine;

// Room for max_samples samples of up to max_len positions each (prompt included), KV as `kv_type`;
// prefill in chunks of `chunk` positions. Memory is checked against max_bytes (0 = no limit).
int engine_init(Engine *e, Model *m, const Tokenizer *tok, KvType kv_type, int max_samples, int max_len, int chunk,
                size_t max_bytes);
void engine_free(Engine *e);

// Generates g->n_samples continuations of `prompt` (token ids). `out` holds g->n_samples entries,
// released with gen_samples_free.
int engine_generate(Engine *e, const int *prompt, int n_prompt, const GenConfig *g, GenTokenFn cb, void *user,
                    GenSample *out, GenStats *stats);
void gen_samples_free(GenSample *s, int n);

#endif
