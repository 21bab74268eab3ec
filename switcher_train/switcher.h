// Switcher data: the features of a prompt (the engine's EMA over the base prefill's final hidden
// states, see engine_prefill) and, when the dataset has no "needs_reasoning", a label derived by
// running both routes: reasoning is needed where the base's direct answer is wrong and the
// adapter's is right.
#ifndef SWITCHER_TRAIN_SWITCHER_H
#define SWITCHER_TRAIN_SWITCHER_H

#include "infer/engine.h"

// feat (C): the prompt's switcher features, computed as the runtime computes them (prompt adapter:
// `adapter` when unmasked, else the base).
int switcher_features(Engine *e, const int *prompt, int n_prompt, const LoraAdapter *adapter,
                      const PromptFeatureSpec *spec, float *feat);

// Runs the direct route (base, `direct`) and the reasoning route (`reasoning`: its adapter, prefix
// and budget) on the prompt, one greedy sample each, and grades both against gold: *label =
// !base_ok && adapter_ok. base_ok, adapter_ok may be NULL. Tokens generated go to *tokens (may be NULL).
int switcher_derive_label(Engine *e, const int *prompt, int n_prompt, const GenConfig *direct,
                          const GenConfig *reasoning, const char *gold, int *label, int *base_ok, int *adapter_ok,
                          long *tokens);

#endif
