#include "rl/policy.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "model/ops.h"

int rollout_offsets(const RolloutBatch *rb, int *off) {
    int n = 0;
    for (int b = 0; b < rb->B; b++) {
        off[b] = n;
        n += rb->comp_len[b];
    }
    return n;
}

// Row b's completion token j is predicted at position prompt_len + j - 1: gather those (position,
// target) pairs so the log-prob ops run over them only.
static int gather(const RolloutBatch *rb, int *pos, int *tgt) {
    int n = 0;
    for (int b = 0; b < rb->B; b++) {
        if (rb->prompt_len[b] < 1 || rb->prompt_len[b] + rb->comp_len[b] > rb->T)
            return er_error(ER_EINVAL, "rollout row %d: prompt %d + completion %d tokens do not fit %d positions", b,
                            rb->prompt_len[b], rb->comp_len[b], rb->T);
        for (int j = 0; j < rb->comp_len[b]; j++) {
            int p = rb->prompt_len[b] + j;
            pos[n] = b * rb->T + p - 1;
            tgt[n] = rb->tokens[b * rb->T + p];
            n++;
        }
    }
    return n;
}

static int forward(Model *m, const LoraAdapter *ad, Activations *a, const RolloutBatch *rb) {
    ModelInput in = {.B = rb->B, .T = rb->T, .tokens = rb->tokens, .adapter = ad, .adapter_mask = rb->adapter_mask};
    return model_forward(m, &in, a);
}

// logp (n) = tempered log-probs of the gathered targets under a->logits.
static void gathered_logprobs(const Activations *a, int V, const int *pos, const int *tgt, int n, float inv_temp,
                              float *logp) {
    for (int i = 0; i < n; i++)
        logprob_forward(&logp[i], a->logits + (size_t)pos[i] * V, &tgt[i], 1, V, inv_temp);
}

int policy_logprobs(Model *m, const LoraAdapter *ad, Activations *a, const RolloutBatch *rb, float inv_temp,
                    float *logp) {
    int N = rb->B * rb->T;
    int *pos = er_alloc(sizeof(int) * (size_t)N), *tgt = er_alloc(sizeof(int) * (size_t)N);
    int rc = ER_OK;
    if (!pos || !tgt)
        ER_CHECK(ER_ENOMEM);
    int n = gather(rb, pos, tgt);
    ER_CHECK(n);
    ER_CHECK(forward(m, ad, a, rb));
    gathered_logprobs(a, m->cfg.V, pos, tgt, n, inv_temp, logp);
done:
    er_free(pos);
    er_free(tgt);
    return rc;
}

// Mean entropy (nats) of the tempered distributions at the n gathered positions; ent (n) is scratch.
static double mean_entropy(const Activations *a, int V, const int *pos, int n, float inv_temp, float *ent) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        const float *l = a->logits + (size_t)pos[i] * V;
        float mx = l[0];
        for (int v = 1; v < V; v++)
            mx = l[v] > mx ? l[v] : mx;
        double z = 0.0, zl = 0.0;
        for (int v = 0; v < V; v++) {
            double x = (double)(l[v] - mx) * inv_temp, e = exp(x);
            z += e;
            zl += e * x;
        }
        ent[i] = (float)(log(z) - zl / z);
    }
    double sum = 0.0; // summed in order: the same on any thread count
    for (int i = 0; i < n; i++)
        sum += ent[i];
    return sum / n;
}

// d loss / d logits from dlogp (n, at the gathered positions), then the backward into the adapter.
// coef and all_tgt (N) are zeroed scratch.
static int policy_backward(Model *m, LoraAdapter *ad, Activations *a, const RolloutBatch *rb, float inv_temp,
                           const int *pos, const int *tgt, int n, const float *dlogp, float *coef, int *all_tgt) {
    int N = rb->B * rb->T;
    // Non-zero only at the gathered positions, each row a tempered softmax backward.
    for (int i = 0; i < n; i++) {
        coef[pos[i]] = dlogp[i];
        all_tgt[pos[i]] = tgt[i];
    }
    logprob_backward(a->logits, a->logits, all_tgt, coef, N, m->cfg.V, inv_temp);
    ModelInput in = {.B = rb->B, .T = rb->T, .tokens = rb->tokens, .adapter = ad, .adapter_mask = rb->adapter_mask};
    return model_backward(m, &in, a);
}

int policy_step(Model *m, LoraAdapter *ad, Activations *a, const RolloutBatch *rb, float inv_temp, const float *old,
                const float *ref, const float *adv, const PolicyLossConfig *c, int grad, float *logp,
                PolicyLossStats *st) {
    int N = rb->B * rb->T;
    if (grad && a->mode != ACTS_TRAIN)
        return er_error(ER_EINVAL, "policy step: the gradient needs ACTS_TRAIN activations");
    int *pos = er_alloc(sizeof(int) * (size_t)N), *tgt = er_alloc(sizeof(int) * (size_t)N);
    int *off = er_alloc(sizeof(int) * (size_t)rb->B), *all_tgt = NULL;
    float *dlogp = er_alloc(sizeof(float) * (size_t)N), *coef = er_calloc((size_t)N, sizeof(float));
    int rc = ER_OK;
    if (!pos || !tgt || !off || !dlogp || !coef)
        ER_CHECK(ER_ENOMEM);
    int n = gather(rb, pos, tgt);
    ER_CHECK(n);
    ER_CHECK(forward(m, ad, a, rb));
    gathered_logprobs(a, m->cfg.V, pos, tgt, n, inv_temp, logp);
    rollout_offsets(rb, off);
    ER_CHECK(grpo_policy_loss(logp, old, ref, adv, off, rb->comp_len, rb->B, c, dlogp, st));
    if (n > 0) {
        st->entropy = mean_entropy(a, m->cfg.V, pos, n, inv_temp, coef); // coef as scratch, zeroed again below
        memset(coef, 0, sizeof(float) * (size_t)N);
    }
    if (grad) {
        if (!(all_tgt = er_calloc((size_t)N, sizeof(int))))
            ER_CHECK(ER_ENOMEM);
        ER_CHECK(policy_backward(m, ad, a, rb, inv_temp, pos, tgt, n, dlogp, coef, all_tgt));
    }
done:
    er_free(pos);
    er_free(tgt);
    er_free(off);
    er_free(dlogp);
    er_free(coef);
    er_free(all_tgt);
    return rc;
}
