// GRPO rollouts of a step decoded together: the G samples of each of the P prompts are requests of one
// DecodeBatch (infer/decode_batch.h), so every decode step runs one forward over the rows of all groups
// (one read of the weights per step instead of one per group), each group forked from its own prompt's KV.
#ifndef RL_ROLLOUT_H
#define RL_ROLLOUT_H

#include "infer/decode_batch.h"

typedef struct {
    const int *prompt; // prompt tokens (the response prefix is GenConfig.response_prefix's job)
    int n_prompt;
    GenConfig gc;      // gc.n_samples = G, seed, max_new, sampler, adapter (the batch's), budget, ...
    GenSample *out;    // (gc.n_samples) filled as engine_generate fills it; the caller frees it (gen_samples_free)
} RolloutGroup;

// Decodes every group's samples in b, which must hold no live request. Groups join in order while their
// rows fit b->max_rows, the rest as rows leave; b->n_prompts >= n keeps every group's prompt cached (a
// prompt seen again, in this call or a later one, reuses its KV), and a group's prompt sharing at least
// half of a cached prompt is prefilled from it. Sample i of a group draws from stream i of its gc.seed,
// so a group's outputs are engine_generate's for the same prompt and GenConfig on an engine whose prompt
// sequence held no prefix of it: bitwise while a step holds at most QUANT_BATCH_MAX_N rows with fp32
// weights (QUANT_DECODE_MAX_N with packed ones), past that the products round as sgemm does (the tokens
// stay the same unless a draw falls on such a last bit).
// Every out is overwritten (not freed), as engine_generate's. *gen_tokens (NULL = not wanted) gains the
// tokens generated. On failure the error names the group, every request is ended and every group's out
// is freed and zeroed (safe to gen_samples_free again).
int rollout_groups(DecodeBatch *b, RolloutGroup *groups, int n, long *gen_tokens);

#endif
