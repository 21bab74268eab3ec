// GRPO with the soft-barrier budget reward: the reward, group-relative advantages, and the clipped
// token-level policy loss with a k3 KL penalty, normalised as TRL's loss types define it. Pure
// functions over flat arrays, so every formula is tested on hand-computed cases.
#ifndef RL_GRPO_H
#define RL_GRPO_H

#include <stddef.h>

// R_budget(L) (docs/design.md): 1 up to L_low = (1-m)B, linear down to p at L_high = (1+m)B, p above. L is
// the think length (data/grade.h, GenSample.think_len): through the first "</think>", the hard budget's L.
double reward_budget(int L, int B, double m, double p);
// R = R_acc x R_budget(L), R_acc in {0, 1}.
double reward_total(int correct, int L, int B, double m, double p);

typedef enum { SCALE_GROUP, SCALE_BATCH, SCALE_NONE } RewardScale;
int reward_scale_parse(const char *name, RewardScale *out);

// Advantages of n_groups groups of G rewards each (r, adv: n_groups * G):
// (r - mean_group) / (std + 1e-4), std the group's (SCALE_GROUP), the whole batch's (SCALE_BATCH)
// or 1 (SCALE_NONE). std is the unbiased sample standard deviation, as torch.std. flat[g] is set to
// 1 for groups whose rewards are all equal (no learning signal). Returns the number of flat groups.
int grpo_advantages(const float *r, int n_groups, int G, RewardScale scale, float *adv, unsigned char *flat);

typedef enum { LOSS_GRPO, LOSS_BNPO, LOSS_DR_GRPO, LOSS_DAPO } LossType;
int loss_type_parse(const char *name, LossType *out);

typedef struct {
    double eps, eps_high;     // clip range [1 - eps, 1 + eps_high]
    double beta;              // k3 KL weight against the reference (0 = no KL term)
    LossType type;
    int max_completion_len;   // dr_grpo's denominator: batch x this
    double global_tokens;     // dapo's denominator: completion tokens over the whole accumulated batch
} PolicyLossConfig;

typedef struct {
    double loss;        // normalised as the loss type says
    double kl;          // mean k3 KL per token
    double clip_frac;   // share of tokens whose ratio was clipped (in the direction that stops the gradient):
                        // TRL's clip_ratio/region_mean
    double clip_low;    // of those, rho < 1 - eps with A < 0 (clip_ratio/low_mean)
    double clip_high;   // rho > 1 + eps_high with A > 0 (clip_ratio/high_mean)
    long tokens;
    double entropy;     // filled by policy_step
} PolicyLossStats;

// Sequence i owns tokens [off[i], off[i] + len[i]) of logp (current policy), old (at rollout; NULL =
// the current policy detached, rho = 1, as with one update per rollout batch) and
// ref (the KL reference; may be NULL when beta = 0); adv (n_seq). Per token:
//   l = -min(rho A, clip(rho, 1-eps, 1+eps_high) A) + beta (exp(ref - logp) - (ref - logp) - 1),
//   rho = exp(logp - old)
// then normalised by the loss type: grpo = mean over sequences of per-sequence token means (a sequence
// with no tokens in the loss, e.g. a masked truncated one, counts as 0, as TRL's clamp(min=1)); bnpo = sum /
// tokens in this batch; dr_grpo = sum / (n_seq x max_completion_len); dapo = sum / global_tokens.
// dlogp (same layout as logp) receives d loss / d logp.
int grpo_policy_loss(const float *logp, const float *old, const float *ref, const float *adv, const int *off,
                     const int *len, int n_seq, const PolicyLossConfig *c, float *dlogp, PolicyLossStats *st);

#endif
