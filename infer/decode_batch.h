// Batched decode across requests: one engine (one KV cache) holds the samples of several requests,
// each in its own KV sequence at its own position, and every step runs ONE forward over the rows of
// all of them (one read of the weights per step, whatever the number of requests). Requests join
// between steps (their prompt is prefilled then, reusing a cached prompt's prefix, see below) and
// leave when their samples finish; each keeps its own sampling parameters, seed, stop strings,
// budget and token callback (infer/engine.h, EngineRequest). A routed request (infer/pipeline.h) runs
// its switcher on its prompt when it joins and its verifier passes when it ends, between steps; only
// its decode shares the steps.
#ifndef INFER_DECODE_BATCH_H
#define INFER_DECODE_BATCH_H

#include "infer/engine.h"
#include "infer/pipeline.h"

// A prompt kept in the KV cache for reuse (the engine's prompt sequence, swapped in for a prefill).
typedef struct {
    int slot;             // KV sequence; -1 = empty
    int *tokens;          // (max_len)
    int n;
    uint64_t adapter;     // Engine.prompt_adapter
    float *logits;        // (V) after its last position
    int logits_valid;
    unsigned long used;   // admission count when it last served (0 = never)
} BatchPrompt;

typedef struct {
    Engine e;              // room for max_rows samples (plus the prompt sequence)
    int max_rows;          // samples decoded together at most
    const LoraAdapter *adapter; // the one adapter rows may turn on (the forward takes one)
    EngineRequest **live;  // (max_rows) requests admitted and not yet ended
    int n_live;
    int *tok, *slot;       // (max_rows) one step's rows
    uint8_t *mask;         // (max_rows) adapter on per row
    long steps;            // forwards run
    // Cached prompts: a request's prompt is prefilled from the one sharing its longest prefix when it
    // reuses at least half of that prompt (a conversation's next turn, a shared system prompt), else
    // it replaces the least recently used one, so interleaved conversations keep their caches.
    BatchPrompt *prompts;  // (n_prompts)
    int n_prompts;
    unsigned long admitted;
} DecodeBatch;

// Room for max_rows samples and n_prompts cached prompts of up to max_len positions each (prompt
// included), KV as kv_type; `adapter` (NULL = none) is the only adapter requests may use.
int decode_batch_init(DecodeBatch *b, Model *m, const Tokenizer *tok, const LoraAdapter *adapter, KvType kv_type,
                      int max_rows, int n_prompts, int max_len, int chunk, size_t max_bytes);
void decode_batch_free(DecodeBatch *b); // ends live requests first (their outputs the caller's to free)

// Samples the live requests hold: a request of n samples may join while rows + n <= max_rows.
int decode_batch_rows(const DecodeBatch *b);

// Admits a request (prefill, first tokens); its samples decode from the next step on. out holds
// g->n_samples entries (released by decode_batch_end on failure, by gen_samples_free otherwise).
// keep_kv is refused: only a routed request keeps its samples (for its verifier).
int decode_batch_add(DecodeBatch *b, const int *prompt, int n_prompt, const GenConfig *g, GenTokenFn cb, void *user,
                     GenSample *out, EngineRequest **req);
// The same for the routed pipeline (pipeline_begin on the cached prompt: switcher, route): out holds
// max(1, c->reasoning.n_samples) entries, *r the route until decode_batch_end_routed (which then
// holds r->n samples in out). c and its heads must stay valid until then.
int decode_batch_add_routed(DecodeBatch *b, const int *prompt, int n_prompt, const PipelineConfig *c,
                            PipelineResult *r, GenTokenFn cb, void *user, GenSample *out, EngineRequest **req);

// One step for every live request: emit each live sample's pending token, then one forward over all
// rows that go on, and their next tokens. A failure of one request stops only it (decode_batch_end says
// so); a failing forward fails the requests whose rows it held.
void decode_batch_step(DecodeBatch *b);

// Ends a request that is done (engine_request_done) or abandons one that is not: texts, stats, its
// KV sequences freed, its status returned.
int decode_batch_end(DecodeBatch *b, EngineRequest *r, GenStats *stats);
// decode_batch_end for a routed request that is done, then its verifier passes and the vote
// (pipeline_end): res complete (res->gen its stats) or, on failure, freed with out. A routed request
// abandoned before it is done ends with decode_batch_end (no verifier pass, no vote; then
// pipeline_result_free).
int decode_batch_end_routed(DecodeBatch *b, EngineRequest *r, const PipelineConfig *c, GenSample *out,
                            PipelineResult *res);

#endif
