// Next-token sampling with Hugging Face transformers' warper semantics, applied in HF's order:
// temperature, top-k, top-p, min-p, then one draw from the renormalised distribution.
//   temperature  logits / T; T = 0 means greedy (argmax, lowest id on ties, no RNG draw)
//   top-k        keep tokens whose scaled logit >= the k-th largest (ties at the k-th are kept, as
//                in HF); 0 = off, k >= V = off
//   top-p        keep the smallest set of most probable tokens whose cumulative probability is
//                >= top_p (HF: drop the ascending-sorted prefix whose cumsum <= 1 - top_p); the
//                most probable token is always kept; 1 = off
//   min-p        keep tokens with prob >= min_p * max prob; 0 = off
// Equal probabilities at the top-p boundary are ranked by lower id. Tokens whose probability is
// below exp(-86) times the most probable one's (~4e-38) count as 0: no draw can resolve them.
// Each sample consumes exactly one rng_uniform_f64 (none when greedy), so a sequence's seed fully
// determines its tokens whatever the thread count. The draw walks the surviving tokens in id order.
// Single-threaded, allocation-free per call, no full sort of the vocabulary.
#ifndef INFER_SAMPLER_H
#define INFER_SAMPLER_H

#include "core/rng.h"

typedef struct {
    float temperature; // >= 0, finite; 0 = greedy
    int top_k;         // >= 0; 0 = off
    float top_p;       // (0, 1]; 1 = off
    float min_p;       // [0, 1); 0 = off
} SamplerParams;

// temperature 1, top_k 0, top_p 1, min_p 0: plain ancestral sampling.
SamplerParams sampler_params_default(void);
// ER_OK, or ER_EINVAL naming the bad field and its valid range.
int sampler_params_validate(const SamplerParams *p);

typedef struct {
    float w; // probability relative to the most probable token, exp((l - max l) / T)
    int id;
} SamplerCand;

// Scratch only (no per-sequence state): one per thread, shared by every sequence it samples.
typedef struct {
    int V;
    float *w;          // (V) unnormalised probabilities; filters zero what they remove
    SamplerCand *cand; // (V) top-p candidates
    float *heap;       // (V) top-k selection
    double *bsum;      // (V / 64 + 1) the sums of w's blocks of 64, in id order, for the draw
} Sampler;

int sampler_init(Sampler *s, int V);
void sampler_free(Sampler *s);

// Draws one token from logits (V). *logprob (if not NULL) is log softmax(logits)[token] with no
// temperature or filtering, i.e. the token's log-prob under the model itself. On error (bad
// params, NaN or +inf logits, all logits -inf) returns ER_EINVAL and leaves *token, *logprob and
// the RNG untouched.
int sampler_sample(Sampler *s, const SamplerParams *p, const float *logits, ErRng *rng, int *token,
                   float *logprob);

// The k most probable tokens under the model itself, log softmax(logits) with no temperature or filtering (the
// distribution *logprob of sampler_sample refers to, whatever the sampling parameters): ids (k) from the most
// probable down, ties to the lower id, and their log-probs (k), each equal to the *logprob sampler_sample gives
// that token. 1 <= k <= V. Same errors as sampler_sample (logits without a finite maximum).
int sampler_top_logprobs(Sampler *s, const float *logits, int k, int *ids, float *logprobs);

// The distribution sampler_sample draws from, normalised: probs (V), 0 for every filtered token
// (one-hot at the argmax when greedy). Same errors as sampler_sample.
int sampler_dist(Sampler *s, const SamplerParams *p, const float *logits, float *probs);

#endif
