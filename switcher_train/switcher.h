// The switcher: does this prompt need reasoning? An MLP on the prompt's features (the engine's EMA
// over prompt chunks of the base prefill's final hidden states, see engine_prefill), labelled by the
// records' "needs_reasoning" or, with derive_labels, by running both routes (reasoning is needed where
// the base's direct answer is wrong and the adapter's is right). Its threshold is calibrated on the
// calibration half of the held-out records for the best accuracy or for a target recall of
// reasoning-needed prompts, and reported on the other half. It trains
// as a job of heads_run (train/heads.h) on the head fitting of train/head_fit.h.
#ifndef SWITCHER_TRAIN_SWITCHER_H
#define SWITCHER_TRAIN_SWITCHER_H

#include "infer/engine.h"
#include "train/head_fit.h"
#include "train/heads.h"

// feat (C): the prompt's switcher features, computed as the runtime computes them (prompt adapter:
// `adapter` when unmasked, else the base).
int switcher_features(Engine *e, const int *prompt, int n_prompt, const LoraAdapter *adapter,
                      const PromptFeatureSpec *spec, float *feat);

// Runs the direct route (base, `direct`) and the reasoning route (`reasoning`: its adapter, prefix
// and budget) on the prompt, one greedy sample each, and grades both against gold: *label =
// !base_ok && adapter_ok. base_ok, adapter_ok may be NULL. Tokens generated go to *tokens (may be NULL).
// hybrid: the base thinks natively (chat_style_hybrid), so the routes are its thinking switch, as the
// runtime's pipeline runs them: the direct answer starts with the empty think block (CHAT_THINK_OFF),
// and the reasoning route may run without an adapter (the base thinking, its prefix as given).
int switcher_derive_label(Engine *e, const int *prompt, int n_prompt, const GenConfig *direct,
                          const GenConfig *reasoning, int hybrid, const char *gold, int *label, int *base_ok,
                          int *adapter_ok, long *tokens);

typedef struct {
    const char *out;       // FILE.safetensors (+ FILE.json)
    int chunk;             // prompt positions per chunk of the EMA
    double alpha;          // EMA weight of each new chunk's mean
    int hidden;            // hidden units of the MLP
    double dropout;        // on the hidden units
    int derive_labels;     // label = base direct answer wrong and the reasoning route's right (on a hybrid
                           // model: thinking off wrong and thinking on right)
    int direct_max_new;    // tokens of the base's direct answer (derive_labels)
    double target_recall;  // threshold reaching this recall on the calibration records (0 = best accuracy)
    HeadFitConfig fit;     // epochs, batch, lr, weight_decay, noise (0.5); seed, label, metrics: the run's
} SwitcherConfig;

void switcher_config_default(SwitcherConfig *c);

// *job: a switcher trained by heads_run as c says (c must outlive the job); head_job_free frees it.
int switcher_job(const SwitcherConfig *c, HeadJob *job);

#endif
