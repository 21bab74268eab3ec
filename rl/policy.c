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

int policy_logprobs(Model *m, const LoraAdapter *ad, Activations *a, const RolloutBatch *rb, float inv_temp,
                    float *logp) {
    int N = rb->B * rb->T, V = m->cfg.V;
    int *pos = er_alloc(sizeof(int) * (size_t)N), *tgt = er_alloc(sizeof(int) * (size_t)N);
    int rc = pos && tgt ? gather(rb, pos, tgt) : ER_ENOMEM;
    int n = rc;
    if (rc >= 0)
        rc = forward(m, ad, a, rb);
    for (int i = 0; rc == ER_OK && i < n; i++)
        logprob_forward(&logp[i], a->logits + (size_t)pos[i] * V, &tgt[i], 1, V, inv_temp);
    er_free(pos);
    er_free(tgt);
    return rc < 0 ? rc : ER_OK;
}

int policy_step(Model *m, LoraAdapter *ad, Activations *a, const RolloutBatch *rb, float inv_temp, const float *old,
                const float *ref, const float *adv, const PolicyLossConfig *c, int grad, float *logp,
                PolicyLossStats *st) {
    int N = rb->B * rb->T, V = m->cfg.V;
    if (grad && a->mode != ACTS_TRAIN)
        return er_error(ER_EINVAL, "policy step: the gradient needs ACTS_TRAIN activations");
    int *pos = er_alloc(sizeof(int) * (size_t)N), *tgt = er_alloc(sizeof(int) * (size_t)N);
    int *off = er_alloc(sizeof(int) * (size_t)rb->B);
    float *dlogp = er_alloc(sizeof(float) * (size_t)N), *coef = er_calloc((size_t)N, sizeof(float));
    int rc = pos && tgt && off && dlogp && coef ? gather(rb, pos, tgt) : ER_ENOMEM;
    int n = rc;
    if (rc >= 0)
        rc = forward(m, ad, a, rb);
    for (int i = 0; rc == ER_OK && i < n; i++)
        logprob_forward(&logp[i], a->logits + (size_t)pos[i] * V, &tgt[i], 1, V, inv_temp);
    if (rc == ER_OK) {
        rollout_offsets(rb, off);
        rc = grpo_policy_loss(logp, old, ref, adv, off, rb->comp_len, rb->B, c, dlogp, st);
    }
    if (rc == ER_OK && n > 0) {
        // Per-position entropies (in dlogp's place once the loss is done), summed in order.
        float *ent_at = coef;
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
            ent_at[i] = (float)(log(z) - zl / z);
        }
        double ent = 0.0;
        for (int i = 0; i < n; i++)
            ent += ent_at[i];
        st->entropy = ent / n;
        memset(coef, 0, sizeof(float) * (size_t)N);
    }
    if (rc == ER_OK && grad) {
        // d loss / d logits: non-zero only at the gathered positions, each row a tempered softmax backward.
        for (int i = 0; i < n; i++)
            coef[pos[i]] = dlogp[i];
        int *all_tgt = er_calloc((size_t)N, sizeof(int));
        if (!all_tgt) {
            rc = ER_ENOMEM;
        } else {
            for (int i = 0; i < n; i++)
                all_tgt[pos[i]] = tgt[i];
            logprob_backward(a->logits, a->logits, all_tgt, coef, N, V, inv_temp);
            er_free(all_tgt);
            ModelInput in = {.B = rb->B, .T = rb->T, .tokens = rb->tokens, .adapter = ad,
                             .adapter_mask = rb->adapter_mask};
            rc = model_backward(m, &in, a);
        }
    }
    er_free(pos);
    er_free(tgt);
    er_free(off);
    er_free(dlogp);
    er_free(coef);
    return rc < 0 ? rc : ER_OK;
}
