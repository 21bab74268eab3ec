// The generation engine: chunked prefill of a prompt into the KV cache (adapter off), N samples
// forked from it without copying or recomputing the prefix, batched decode of all live samples
// (one weight pass per step for N rows), sampling, stop conditions and the hard budget. For the
// switcher and verifier heads (model/head.h) it also computes their features without extra passes:
// the prompt EMA during the prefill, and a sample's verification features from its KV cache.
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

enum { ENGINE_TOP_MAX = 20 }; // GenConfig.top_logprobs at most

typedef struct {
    int n_samples;           // parallel samples sharing the prompt
    int max_new;             // generated tokens per sample (forced tokens included)
    SamplerParams sampler;
    uint64_t seed;           // sample i draws from stream i of this seed, whatever n_samples is
    int budget;              // hard budget B on the think length L (GenSample.think_len): L <= B. While the
                             // sample has not closed its think block, the suffix is forced when L so far plus
                             // the suffix's tokens through the one completing "</think>" would reach B (a
                             // suffix without "</think>": after B tokens); once the model closed the block
                             // itself, or the response prefix closed one (grade_think_closes: a hybrid model's
                             // thinking off), nothing is forced. 0 = off; else at least those suffix tokens
    int answer_tokens;       // A: at most B + A tokens in all, the suffix included
    const char *budget_suffix; // forced-answer text (default "\n</think>\n\nFinal answer: ")
    const char *response_prefix; // forced at the start of every response (e.g. "<think>\n"); NULL = none
    const char *const *stop; // stop strings (cut from the text); NULL/0 = none
    int n_stop;
    const LoraAdapter *adapter; // masked (adapter->masked): response positions only, so the prompt's KV
                                // cache is the base model's; unmasked: every position. NULL = base
    int keep_kv;             // keep each sample's KV sequence open for engine_verify_features, until the
                             // next engine_generate or engine_release_samples
    int top_logprobs;        // 0..ENGINE_TOP_MAX: the most probable tokens (under the model, as GenSample.logprobs)
                             // recorded at each step (GenSample.top_ids); 0 = none, no extra pass over the logits
} GenConfig;

void gen_config_default(GenConfig *g);

typedef struct {
    int *tokens;        // generated tokens, forced ones and a final EOS included
    float *logprobs;    // log p(token | context) under the model's untempered distribution
    int *top_ids;       // (n_tokens, n_top) GenConfig.top_logprobs most probable tokens at each step, the most
    float *top_logprobs; // probable first, and their logprobs (as logprobs); NULL when n_top is 0
    int n_top;
    int n_tokens;
    char *text;         // decoded, cut at a stop string, without the EOS
    size_t text_len;
    FinishReason finish;
    int budget_cut;     // the hard budget forced the answer suffix
    long answer_at;     // byte offset in text where the forced suffix ends (the answer starts; see
                        // data/grade.h); -1 when none was forced or a stop string cut it
    int think_len;      // the think length L (data/grade.h): tokens from the first generated one through the
                        // one completing the first "</think>" of the output (forced suffix tokens count);
                        // when no "</think>" came, all generated tokens but a final EOS; 0 when the
                        // response prefix closed the think block (grade_think_closes)
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

// Called for every generated token of every sample with the text it releases: bytes that may still
// turn into a stop string, and an incomplete UTF-8 character, wait for later tokens (the chunk may be
// empty), and the sample's last call flushes the rest, so a sample's chunks concatenate to exactly
// GenSample.text. Return non-zero to stop that sample: its text then ends with what was released.
typedef int (*GenTokenFn)(void *user, int sample, int token, const char *bytes, size_t n);

// The caller's say during long calls (all NULL: none), called on the calling thread, outside parallel regions.
// abort is polled before each prefill chunk and each decode step: non-zero stops the call with ER_EABORTED,
// leaving the engine usable (the prompt positions already in the cache stay there for the next call to
// reuse). progress gets the prompt positions in the cache out of the prompt's, before a prefill's first chunk
// and after each; its last call has done == total.
typedef struct {
    int (*abort)(void *user);
    void (*progress)(void *user, int done, int total);
    void *user;
} EngineHooks;

typedef struct {
    Model *model;
    const Tokenizer *tok;
    EngineHooks hooks;     // zeroed by engine_init; the owner sets them
    Backend *be;           // the model's (model_to_backend), where the KV cache and activations live
    float *host;           // (host_cap) engine_download's copies of a backend's buffers
    size_t host_cap;
    KVCache kv;
    Activations prefill;   // (1, chunk), ACTS_DECODE
    Activations decode;    // (max_samples, 1), ACTS_DECODE
    Activations verify;    // (max_samples, verification tokens + 1), ACTS_DECODE, sized on first use
    Sampler *samplers;     // (n_samplers) one per thread that samples rows at once
    int n_samplers;        // min(threads at engine_init, max_samples)
    int max_samples, max_len, chunk;
    int prompt_slot;       // the last prompt, kept for prefix reuse (-1 = none)
    int *prompt_tokens;
    int n_prompt;
    uint64_t prompt_adapter; // LoraAdapter.generation of what computed the cached prompt (0 = the base model)
    float *prompt_logits;  // (V) logits after the last prompt (and prefix) position
    int prompt_logits_valid; // the prompt sequence holds exactly prompt_tokens and prompt_logits follow them
    long forward_positions;
    double *feat_sum;      // (C) sum of the current feature chunk's final hidden states
    int *kept_slot;        // (max_samples) KV sequence of sample i kept by GenConfig.keep_kv (-1 = none)
    int *kept_tail;        // (max_samples) its final token, not yet in the cache (-1 = none, e.g. EOS)
    int n_kept;
    const LoraAdapter *kept_adapter; // the adapter that generated the kept samples
} Engine;

// Room for max_samples samples of up to max_len positions each (prompt included), KV as `kv_type`;
// prefill in chunks of `chunk` positions. Memory is checked against max_bytes (0 = no limit). The KV cache
// and the activations are placed where m is (m->be, the CPU when NULL); an adapter the engine is given must
// be placed there too (lora_to_backend). Logits and hidden states come to the host each pass.
int engine_init(Engine *e, Model *m, const Tokenizer *tok, KvType kv_type, int max_samples, int max_len, int chunk,
                size_t max_bytes);
void engine_free(Engine *e);
// *host = n floats of the engine's backend at p, readable on the host until the next call: p itself on the
// CPU, else a copy in the engine's scratch.
int engine_download(Engine *e, const float *p, size_t n, const float **host);

// Generates g->n_samples continuations of `prompt` (token ids). `out` holds g->n_samples entries,
// released with gen_samples_free. Sample i draws from stream i of g->seed (rng_fork), and the rows
// of a batched decode do not interact, so the first N samples of an 8-sample call are the samples
// of an N-sample call with the same seed (tests/infer/test_features.c checks it).
int engine_generate(Engine *e, const int *prompt, int n_prompt, const GenConfig *g, GenTokenFn cb, void *user,
                    GenSample *out, GenStats *stats);
void gen_samples_free(GenSample *s, int n);

// Switcher features: the final layer's hidden states after the final norm (what HF returns as the
// last hidden_states, and what the LM head reads) averaged over each chunk of `chunk` prompt
// positions (positions 0..chunk-1, chunk..2chunk-1, ...; the last chunk may be shorter) and folded
// into an EMA h <- alpha * mean(chunk) + (1 - alpha) * h, the first chunk initialising h. Computed
// during the prefill, chunk by chunk: memory O(C) whatever the prompt length, the chunking of the
// forward (Engine.chunk) does not change the result.
typedef struct {
    int chunk;
    float alpha;
} PromptFeatureSpec;

// Prefills `prompt` into the prompt sequence exactly as engine_generate does (the adapter only when
// it is unmasked; a masked adapter leaves the prompt to the base model). With spec != NULL the
// whole prompt is computed (no prefix reuse, so the EMA sees every position) and feat (C) receives
// its features. A following engine_generate with the same prompt and the same prompt adapter
// reuses it whole, without a forward position.
int engine_prefill(Engine *e, const int *prompt, int n_prompt, const LoraAdapter *adapter,
                   const PromptFeatureSpec *spec, float *feat, GenStats *stats);

// Verifier features of sample `sample` of the kept samples (the last engine_generate, or
// engine_request_end, with keep_kv): the n tokens are
// appended to that sample's KV sequence (after its response; a final EOS is not part of it) and
// out (C) receives the final-norm hidden state at the last one. Only these positions (and the
// sample's final token when the cache does not hold it yet) go through the forward; the
// verification tokens see the adapter when adapter_on. The sequence is cut back afterwards, so
// any number of verification prompts can be asked.
int engine_verify_features(Engine *e, int sample, const int *tokens, int n, int adapter_on, float *out);
// The same for every kept sample at once, in one batched pass (one read of the weights for all):
// out (n_kept, C), row i equal to engine_verify_features for sample i up to rounding.
int engine_verify_features_all(Engine *e, const int *tokens, int n, int adapter_on, float *out);

// An embedding's hidden state: the base model's final hidden states (after the final norm, HF's
// last_hidden_state) of tokens (n, 1..max_len) in a KV sequence of their own, chunk by chunk, pooled into
// out (C): their mean (last = 0) or the last position's (last = 1). The prompt sequence and its reuse are
// left as they were; kept samples are released.
int engine_embed(Engine *e, const int *tokens, int n, int last, float *out);
// The checks engine_generate makes on g before any work (sizes, budget, sampler, the prefix and suffix
// encode), for a prompt of n_prompt tokens and `extra` positions appended to each sample afterwards.
int engine_check_generation(const Engine *e, const GenConfig *g, int n_prompt, int extra);
// Closes the KV sequences kept by GenConfig.keep_kv.
void engine_release_samples(Engine *e);

// A request decoded step by step together with others (infer/decode_batch.h): engine_generate cut at its
// forward. begin prefills the prompt (reusing the prefix the engine's prompt sequence holds) and
// starts the samples; each step, rows emits every live sample's pending token (callback, stop
// strings, budget, EOS as engine_generate) and appends the sample's row (token, KV slot, adapter
// mask) to the arrays, returning how many; the caller runs one forward over the rows of all
// requests and gives each request its rows' logits (rows, V) through accept. done: no sample is
// live (or the request failed); end writes the texts and stats, releases the request and returns
// its status (out then freed on failure). Sample i draws from stream i of g->seed and the rows of
// a forward do not interact, so a request decodes the same tokens whatever else shares its steps
// (bitwise up to QUANT_BATCH_MAX_N rows a step with fp32 weights, QUANT_DECODE_MAX_N with packed ones:
// past it the products take sgemm's rounding).
// begin reads g's strings; g->adapter must stay valid until end. With g->keep_kv, end hands the finished
// samples' KV sequences to the engine's kept samples (replacing those kept before), as engine_generate
// does, for engine_verify_features* until engine_release_samples.
typedef struct EngineRequest EngineRequest;
int engine_request_begin(Engine *e, const int *prompt, int n_prompt, const GenConfig *g, GenTokenFn cb, void *user,
                         GenSample *out, EngineRequest **req);
int engine_request_rows(Engine *e, EngineRequest *r, int *tokens, int *slots, uint8_t *mask);
void engine_request_accept(Engine *e, EngineRequest *r, const float *logits);
void engine_request_fail(EngineRequest *r, int rc); // a forward that failed under its rows
int engine_request_samples(const EngineRequest *r);      // g->n_samples
int engine_request_pending_rows(const EngineRequest *r); // rows given to the current step
int engine_request_done(const EngineRequest *r);
int engine_request_end(Engine *e, EngineRequest *r, GenStats *stats);

#endif
