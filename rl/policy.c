#include "rl/policy.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

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

// Host arrays placed on a backend (a pass's scratch): one buffer, freed by staged_free.
typedef struct {
    Backend *be;
    void *mem;
} Staged;

// The address `at` bytes into st's buffer (64-byte multiples); with host, n bytes of it copied there (*rc keeps
// the first failure).
static void *staged_at(Staged *st, size_t at, const void *host, size_t n, int *rc) {
    void *p = (char *)st->mem + at;
    if (*rc == ER_OK && host)
        *rc = st->be->ops->upload(st->be, p, host, n);
    return p;
}

static int staged_alloc(Staged *st, Backend *be, size_t bytes) {
    st->be = be;
    st->mem = be->ops->alloc(be, bytes);
    return st->mem ? ER_OK : ER_ENOMEM;
}

static void staged_free(Staged *st) {
    if (st->be)
        st->be->ops->free(st->be, st->mem);
}

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

// logp (n) = tempered log-probs of the gathered targets under a->logits, and with ent (n) the entropies of
// those distributions: the backend's token_stats where the logits are, the results brought to the host.
static int gathered_stats(const Activations *a, int V, const int *pos, const int *tgt, int n, float inv_temp,
                          float *logp, float *ent) {
    if (n == 0)
        return ER_OK;
    Backend *be = a->be;
    size_t b = round64(sizeof(int) * (size_t)n);
    Staged st = {0};
    int rc = staged_alloc(&st, be, 4 * b);
    if (rc == ER_OK) {
        const int *d_pos = staged_at(&st, 0, pos, sizeof(int) * (size_t)n, &rc);
        const int *d_tgt = staged_at(&st, b, tgt, sizeof(int) * (size_t)n, &rc);
        float *d_logp = staged_at(&st, 2 * b, NULL, 0, &rc), *d_ent = ent ? staged_at(&st, 3 * b, NULL, 0, &rc) : NULL;
        if (rc == ER_OK)
            rc = be->ops->token_stats(be, d_logp, d_ent, a->logits, d_pos, d_tgt, n, V, inv_temp);
        if (rc == ER_OK)
            rc = be->ops->download(be, logp, d_logp, sizeof(float) * (size_t)n);
        if (rc == ER_OK && ent)
            rc = be->ops->download(be, ent, d_ent, sizeof(float) * (size_t)n);
    }
    staged_free(&st);
    return rc;
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
    ER_CHECK(gathered_stats(a, m->cfg.V, pos, tgt, n, inv_temp, logp, NULL));
done:
    er_free(pos);
    er_free(tgt);
    return rc;
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
    Backend *be = a->be;
    size_t b = round64(sizeof(float) * (size_t)N);
    Staged st = {0};
    int rc = staged_alloc(&st, be, 2 * b);
    if (rc == ER_OK) {
        const float *d_coef = staged_at(&st, 0, coef, sizeof(float) * (size_t)N, &rc);
        const int *d_tgt = staged_at(&st, b, all_tgt, sizeof(int) * (size_t)N, &rc);
        if (rc == ER_OK)
            rc = be->ops->logprob_backward(be, a->logits, a->logits, d_tgt, d_coef, N, m->cfg.V, inv_temp);
    }
    staged_free(&st);
    ER_TRY(rc);
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
    ER_CHECK(gathered_stats(a, m->cfg.V, pos, tgt, n, inv_temp, logp, coef)); // coef as the entropies' room
    rollout_offsets(rb, off);
    ER_CHECK(grpo_policy_loss(logp, old, ref, adv, off, rb->comp_len, rb->B, c, dlogp, st));
    if (n > 0) { // the mean entropy, summed in order: the same on any thread count
        double sum = 0.0;
        for (int i = 0; i < n; i++)
            sum += coef[i];
        st->entropy = sum / n;
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
