// The verifier: is this answer right? A linear head on a response's verification features (the
// final-token hidden state after a verification prompt appended to the response, read from the
// sample's own KV cache: only its tokens are computed, see engine_verify_features), labelled by
// grading responses sampled from the adapter against the gold answer. Its threshold is calibrated on
// the calibration half of the held-out records for the best accuracy and reported on the other half.
// It trains as a job of heads_run (train/heads.h) on the head fitting of train/head_fit.h.
#ifndef VERIFIER_TRAIN_VERIFIER_H
#define VERIFIER_TRAIN_VERIFIER_H

#include "infer/engine.h"
#include "train/head_fit.h"
#include "train/heads.h"

// Samples g->n_samples responses (g: adapter, prefix, temperature, budget; keep_kv is set here),
// grades each against gold into labels (n_samples) in {0, 1} and writes their features into
// feats (n_samples, C), computed after the verification tokens vq (nvq) with the adapter on
// them when adapter_on. *tokens (may be NULL) gets the generated tokens added.
int verifier_collect(Engine *e, const int *prompt, int n_prompt, const GenConfig *g, const int *vq, int nvq,
                     int adapter_on, const char *gold, float *feats, float *labels, long *tokens);

typedef struct {
    const char *out;           // FILE.safetensors (+ FILE.json)
    const char *verify_prompt; // text appended to each response
    int adapter_on;            // adapter on for the verification tokens (default off: base features)
    int samples;               // responses sampled from the adapter per training prompt
    double temperature;        // their sampling temperature
    HeadFitConfig fit;         // epochs, batch, lr, weight_decay, noise (0); seed, label, metrics: the run's
} VerifierConfig;

void verifier_config_default(VerifierConfig *c);

// *job: a verifier trained by heads_run as c says (c must outlive the job); head_job_free frees it.
int verifier_job(const VerifierConfig *c, HeadJob *job);

#endif
