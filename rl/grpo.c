#include "rl/grpo.h"

#include <math.h>
#include <string.h>

#include "core/error.h"

double reward_budget(int L, int B, double m, double p) {
    double lo = (1.0 - m) * B, hi = (1.0 + m) * B;
    if (L <= lo)
        return 1.0;
    if (L <= hi)
        return 1.0 - (1.0 - p) * (L - lo) / (hi - lo);
    return p;
}

double reward_total(int correct, int L, int B, double m, double p) {
    return correct ? reward_budget(L, B, m, p) : 0.0;
}

int reward_scale_parse(const char *name, RewardScale *out) {
    if (strcmp(name, "group") == 0)
        *out = SCALE_GROUP;
    else if (strcmp(name, "batch") == 0)
        *out = SCALE_BATCH;
    else if (strcmp(name, "none") == 0)
        *out = SCALE_NONE;
    else
        return er_error(ER_EINVAL, "--scale-rewards must be group, batch or none, got \"%s\"", name);
    return ER_OK;
}

int loss_type_parse(const char *name, LossType *out) {
    static const char *names[] = {"grpo", "bnpo", "dr_grpo", "dapo"};
    for (int i = 0; i < 4; i++)
        if (strcmp(name, names[i]) == 0) {
            *out = (LossType)i;
            return ER_OK;
        }
    return er_error(ER_EINVAL, "--loss-type must be grpo, bnpo, dr_grpo or dapo, got \"%s\"", name);
}

static double sample_std(const float *x, int n, double mean) {
    if (n < 2)
        return 0.0;
    double ss = 0.0;
    for (int i = 0; i < n; i++)
        ss += (x[i] - mean) * (x[i] - mean);
    return sqrt(ss / (n - 1));
}

int grpo_advantages(const float *r, int n_groups, int G, RewardScale scale, float *adv, unsigned char *flat) {
    int n = n_groups * G, n_flat = 0;
    double bmean = 0.0;
    for (int i = 0; i < n; i++)
        bmean += r[i];
    bmean /= n;
    double bstd = sample_std(r, n, bmean);
    for (int g = 0; g < n_groups; g++) {
        const float *rg = r + (size_t)g * G;
        double mean = 0.0;
        int same = 1;
        for (int i = 0; i < G; i++) {
            mean += rg[i];
            same &= rg[i] == rg[0];
        }
        mean /= G;
        double std = scale == SCALE_GROUP ? sample_std(rg, G, mean) : scale == SCALE_BATCH ? bstd : 1.0;
        double denom = scale == SCALE_NONE ? 1.0 : std + 1e-4;
        for (int i = 0; i < G; i++)
            adv[(size_t)g * G + i] = (float)((rg[i] - mean) / denom);
        if (flat)
            flat[g] = (unsigned char)same;
        n_flat += same;
    }
    return n_flat;
}

int grpo_policy_loss(const float *logp, const float *old, const float *ref, const float *adv, const int *off,
                     const int *len, int n_seq, const PolicyLossConfig *c, float *dlogp, PolicyLossStats *st) {
    memset(st, 0, sizeof *st);
    if (c->beta > 0 && !ref)
        return er_error(ER_EINVAL, "policy loss: beta > 0 needs reference log-probs");
    if (c->type == LOSS_DR_GRPO && c->max_completion_len < 1)
        return er_error(ER_EINVAL, "policy loss: dr_grpo needs the maximum completion length");
    if (c->type == LOSS_DAPO && !(c->global_tokens > 0))
        return er_error(ER_EINVAL, "policy loss: dapo needs the global token count");
    long tokens = 0;
    for (int i = 0; i < n_seq; i++)
        tokens += len[i];
    st->tokens = tokens;
    double total = 0.0, kl = 0.0;
    long clipped = 0, low = 0, high = 0;
    for (int i = 0; i < n_seq; i++) {
        double w; // the weight of one token's loss in the normalised loss
        switch (c->type) {
        case LOSS_GRPO: w = len[i] > 0 ? 1.0 / ((double)len[i] * n_seq) : 0.0; break;
        case LOSS_BNPO: w = tokens > 0 ? 1.0 / (double)tokens : 0.0; break;
        case LOSS_DR_GRPO: w = 1.0 / ((double)n_seq * c->max_completion_len); break;
        default: w = 1.0 / c->global_tokens; break;
        }
        double A = adv[i];
        for (int j = off[i]; j < off[i] + len[i]; j++) {
            double rho = old ? exp((double)logp[j] - old[j]) : 1.0; // no old: the current policy, detached
            double lo = 1.0 - c->eps, hi = 1.0 + c->eps_high;
            double rc = rho < lo ? lo : rho > hi ? hi : rho;
            // min(rho A, clip(rho) A): the clipped term wins (and stops the gradient) only outside the range.
            int is_low = A < 0 && rho < lo, is_high = A > 0 && rho > hi, is_clipped = is_low || is_high;
            double l = -fmin(rho * A, rc * A), g = is_clipped ? 0.0 : -rho * A;
            if (c->beta > 0) {
                double d = (double)ref[j] - logp[j];
                double k3 = exp(d) - d - 1.0;
                l += c->beta * k3;
                g += c->beta * (1.0 - exp(d));
                kl += k3;
            }
            clipped += is_clipped;
            low += is_low;
            high += is_high;
            total += w * l;
            dlogp[j] = (float)(w * g);
        }
    }
    st->loss = total;
    st->kl = tokens > 0 ? kl / tokens : 0.0;
    st->clip_frac = tokens > 0 ? (double)clipped / tokens : 0.0;
    st->clip_low = tokens > 0 ? (double)low / tokens : 0.0;
    st->clip_high = tokens > 0 ? (double)high / tokens : 0.0;
    return ER_OK;
}
