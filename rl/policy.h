// The GRPO policy step on a batch of rollouts: THE forward over prompt + completion with the masked
// adapter, token log-probs of the completions, the policy loss and its gradient into the adapter.
#ifndef RL_POLICY_H
#define RL_POLICY_H

#include "lora/lora.h"
#include "model/model.h"
#include "rl/grpo.h"

typedef struct {
    int B, T;                    // rows right-padded to T
    const int *tokens;           // (B, T) prompt then completion
    const uint8_t *adapter_mask; // (B, T) 0 on prompt positions, 1 on completion positions
    const int *prompt_len;       // (B) completion tokens sit at [prompt_len, prompt_len + comp_len)
    const int *comp_len;         // (B)
} RolloutBatch;

// Offsets of each row's completion tokens in the flat per-token arrays; returns the token count.
int rollout_offsets(const RolloutBatch *rb, int *off);

// Log-probs (flat, rollout_offsets order) of the completion tokens at temperature 1/inv_temp, with the
// adapter (masked) or without it (adapter NULL: the reference policy). a: ACTS_SCORE or ACTS_TRAIN.
int policy_logprobs(Model *m, const LoraAdapter *ad, Activations *a, const RolloutBatch *rb, float inv_temp,
                    float *logp);

// Forward + policy loss (+ backward into ad->grads when grad != 0; a must be ACTS_TRAIN). old, ref, adv
// as in grpo_policy_loss. logp (flat) receives the current log-probs.
// st->entropy: mean entropy (nats) of the tempered distributions at the completion positions.
int policy_step(Model *m, LoraAdapter *ad, Activations *a, const RolloutBatch *rb, float inv_temp, const float *old,
                const float *ref, const float *adv, const PolicyLossConfig *c, int grad, float *logp,
                PolicyLossStats *st);

#endif
