// Verifier data: responses sampled from the adapter for a prompt, graded against the gold answer
// (the labels), with each response's verification features read from its own KV cache (the
// verification prompt appended, only its tokens computed; see engine_verify_features).
#ifndef VERIFIER_TRAIN_VERIFIER_H
#define VERIFIER_TRAIN_VERIFIER_H

#include "infer/engine.h"

// Samples g->n_samples responses (g: adapter, prefix, temperature, budget; keep_kv is set here),
// grades each against gold into labels (n_samples) in {0, 1} and writes their features into
// feats (n_samples, C), computed after the verification tokens vq (nvq) with the adapter on
// them when adapter_on. *tokens (may be NULL) gets the generated tokens added.
int verifier_collect(Engine *e, const int *prompt, int n_prompt, const GenConfig *g, const int *vq, int nvq,
                     int adapter_on, const char *gold, float *feats, float *labels, long *tokens);

#endif
