// The routed pipeline of erinfer: base prefill (adapter off) -> switcher score on the prefill's
// hidden states -> below the threshold, the base answers directly (greedy, one sample); at or
// above it, the reasoning prefix is forced and N samples decode with the adapter, reusing the
// prompt's KV cache, under the hard budget -> verifier score per sample from its KV cache ->
// answer = argmax over extracted answers of the summed verifier scores (weighted majority vote;
// ties go to the answer with the highest single score, then to the earliest sample).
// On a hybrid-thinking model (Qwen3, chat_style_hybrid) the two routes are its thinking switch after
// the same prompt: the direct route forces the empty think block (CHAT_THINK_OFF, thinking off) and
// the reasoning route thinks (the reasoning prefix, CHAT_THINK_ON unless given), with the adapter when
// there is one and the base itself without.
#ifndef INFER_PIPELINE_H
#define INFER_PIPELINE_H

#include "infer/engine.h"
#include "model/head.h"

enum { ROUTE_DIRECT = 0, ROUTE_REASONING = 1 };
enum { PIPELINE_AUTO = 0, PIPELINE_DIRECT = 1, PIPELINE_REASONING = 2 };

typedef struct {
    const TrainedHead *switcher; // NULL: every query takes the reasoning route (when there is an adapter)
    const TrainedHead *verifier; // NULL: every sample weighs 1 (plain majority vote)
    GenConfig direct;            // the base's direct answer: used greedy, n_samples 1, no adapter, no prefix
    GenConfig reasoning;         // the reasoning samples: adapter (NULL: no reasoning route), prefix,
                                 // n_samples, temperature, budget; keep_kv is set by the pipeline
    int force_route;             // PIPELINE_AUTO: the switcher decides; PIPELINE_DIRECT / PIPELINE_REASONING
                                 // take that route (reasoning only with an adapter or hybrid); the switcher
                                 // still scores
    int hybrid;                  // the base thinks natively (chat_style_hybrid): the direct route forces
                                 // CHAT_THINK_OFF, and the reasoning route runs without an adapter too
} PipelineConfig;

// Whether c has a reasoning route: an adapter, or a hybrid base.
int pipeline_can_reason(const PipelineConfig *c);

typedef struct {
    char *answer;  // the first voter's extracted answer (the group's representative)
    double weight; // sum of the voters' weights
    int count;     // voters
    float best;    // highest single tie-break score among them
    int first;     // first voter's sample index
} Vote;

typedef struct {
    int route;               // ROUTE_*
    float switcher_score;    // P(needs reasoning); -1 without a switcher
    int n;                   // samples written to `out`
    char **answers;          // (n) extracted final answers, NULL where none was found
    float *verifier_scores;  // (n) P(correct); NULL without a verifier or on the direct route
    Vote *votes;             // (n_votes) in order of first appearance
    int n_votes;
    int winner;              // index into votes; -1 when no sample has an answer
    int prompt_reused;       // prompt positions the prefill found cached (0 with a switcher: it reads all)
    int *verify_tokens;      // (n_verify) the verifier's prompt, encoded by pipeline_begin
    int n_verify;
    double prefill_s, switcher_s, generate_s, verify_s, total_s;
    double t_generate;       // when the generation started (pipeline_begin's end)
    char *response_prefix;   // the route's forced response start (a copy; NULL = none)
    GenStats gen;            // of the generation (set by the caller of pipeline_begin / pipeline_end)
    long forward_positions;  // all passes of this query
} PipelineResult;

// Runs one query. `out` holds room for max(1, c->reasoning.n_samples) samples (gen_samples_free).
int pipeline_run(Engine *e, const int *prompt, int n_prompt, const PipelineConfig *c, GenTokenFn cb, void *user,
                 GenSample *out, PipelineResult *r);
// pipeline_run in its three parts, for a generation the caller runs (engine_generate, or a request of a
// decode batch): begin prefills the prompt into the engine's prompt sequence, scores it and fills *g
// (the route's generation: n_samples, adapter, keep_kv for the verifier); the caller generates from
// that prompt sequence with g, sets r->gen to its stats, and with the samples in `out` (their KV kept,
// nothing run on the engine in between) end scores them and votes. end releases the kept samples; on
// failure it frees r (not out). r is freed with pipeline_result_free after a successful begin.
int pipeline_begin(Engine *e, const int *prompt, int n_prompt, const PipelineConfig *c, PipelineResult *r,
                   GenConfig *g);
int pipeline_end(Engine *e, const PipelineConfig *c, const GenSample *out, PipelineResult *r);
void pipeline_result_free(PipelineResult *r);

// Groups the n answers (NULL = no vote) by grade_equal and sums their weights; the winner has the
// largest sum, then the highest single tiebreak score, then the earliest first voter. *votes
// (free with votes_free) gets the groups in order of first appearance; *winner = -1 when no answer.
int pipeline_vote(char *const *answers, const float *weights, const float *tiebreak, int n, Vote **votes,
                  int *n_votes, int *winner);
void votes_free(Vote *v, int n);

#endif
