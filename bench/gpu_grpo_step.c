// One GRPO step on a device, timed in its two parts: a Qwen2.5-shaped model (random weights, the base in bf16
// as a GPU holds a frozen one) with a rank-16 masked adapter, both placed on --device; P prompts x G samples
// rolled out together (rl/rollout.h: every group in one DecodeBatch) at temperature 1, prompt p's budget the
// p-th of --budgets in turn (its samples decode that many tokens: no tokenizer, so no EOS), then the policy
// update as ertrain grpo runs it per group (the reference's log-probs, the forward, the loss and the backward
// into the adapter), then AdamW. One warm-up step (unless --no-warmup), then --steps timed; the best is reported
// as JSON.
//   gpu_grpo_step --shape 1.5b [--device cuda] [--prompts 8] [--group 8] [--budgets 256,512,768,1024]
#include <stdio.h>
#include <string.h>

#include "bench/bench_util.h"
#include "infer/decode_batch.h"
#include "model/backend.h"
#include "rl/policy.h"
#include "rl/rollout.h"
#include "train/optim.h"

typedef struct {
    int P, G, Np, n_budgets, budgets[16], max_new;
    Backend *be;
    Model host, placed, *m;
    LoraAdapter host_ad, placed_ad, *ad;
    DecodeBatch batch;
    Activations a;
    AdamW opt;
    int *prompts;         // (P, Np)
    RolloutGroup *groups; // (P)
    GenSample *out;       // (P, G)
    // one group's update batch: (G, Np + max_new) tokens and adapter mask, prompt and completion lengths,
    // advantages, log-probs
    int *tokens, *plen, *clen;
    uint8_t *mask;
    float *adv, *lp, *ref;
} Step;

static int step_setup(Step *st, const ModelConfig *c, const char *device) {
    int rows = st->P * st->G, Tt = st->Np + st->max_new;
    ER_TRY(backend_open(&st->be, device));
    ER_TRY(model_build_random_bf16(&st->host, c, 0.02f, 1));
    st->host.trainable = 0;
    LoraShape ls = model_config_lora_shape(c);
    ER_TRY(lora_init(&st->host_ad, &ls, 16, 32.0f, 0, 0.0f, LORA_ALL_TARGETS, 1, 2));
    st->host_ad.masked = 1;
    st->m = &st->host, st->ad = &st->host_ad;
    if (st->be->kind != BACKEND_CPU) {
        ER_TRY(model_to_backend(&st->placed, &st->host, st->be));
        ER_TRY(lora_to_backend(&st->placed_ad, &st->host_ad, st->be));
        st->m = &st->placed, st->ad = &st->placed_ad;
    }
    size_t limit = 0;
    ER_TRY(st->be->ops->mem_available(st->be, &limit));
    ER_TRY(decode_batch_init(&st->batch, st->m, NULL, st->ad, KV_F32, rows, st->P, Tt + 1, 128, limit));
    ER_TRY(acts_alloc_on(&st->a, st->be, c, st->G, Tt, ACTS_TRAIN, limit));
    ER_TRY(adamw_init(&st->opt, st->be, st->ad->n_params, 1e-6, 0.9, 0.999, 1e-8, 0.0));
    st->prompts = er_alloc(sizeof(int) * (size_t)st->P * st->Np);
    st->groups = er_calloc((size_t)st->P, sizeof *st->groups);
    st->out = er_calloc((size_t)rows, sizeof *st->out);
    st->tokens = er_alloc(sizeof(int) * (size_t)st->G * Tt);
    st->plen = er_alloc(sizeof(int) * st->G);
    st->clen = er_alloc(sizeof(int) * st->G);
    st->mask = er_alloc((size_t)st->G * Tt);
    st->adv = er_alloc(sizeof(float) * st->G);
    st->lp = er_alloc(sizeof(float) * (size_t)st->G * Tt);
    st->ref = er_alloc(sizeof(float) * (size_t)st->G * Tt);
    if (!st->prompts || !st->groups || !st->out || !st->tokens || !st->plen || !st->clen || !st->mask || !st->adv ||
        !st->lp || !st->ref)
        return ER_ENOMEM;
    return ER_OK;
}

static void step_free(Step *st) {
    if (st->out)
        gen_samples_free(st->out, st->P * st->G);
    void *host[] = {st->prompts, st->groups, st->out, st->tokens, st->plen, st->clen, st->mask, st->adv, st->lp, st->ref};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        er_free(host[i]);
    adamw_free(&st->opt);
    acts_free(&st->a);
    decode_batch_free(&st->batch);
    if (st->placed_ad.mats)
        lora_backend_free(&st->placed_ad, st->be);
    model_free(&st->placed);
    lora_free(&st->host_ad);
    model_free(&st->host);
    if (st->be)
        backend_close(st->be);
}

// Every group's G samples, new prompts each round (no prompt cached from the round before).
static int rollouts(Step *st, int round, long *tokens) {
    *tokens = 0;
    gen_samples_free(st->out, st->P * st->G);
    for (int p = 0; p < st->P; p++) {
        for (int i = 0; i < st->Np; i++)
            st->prompts[p * st->Np + i] =
                (int)(((uint32_t)(round * 7919 + p * 104729 + i) * 2654435761u) % (unsigned)st->m->cfg.V);
        RolloutGroup *g = &st->groups[p];
        g->prompt = st->prompts + (size_t)p * st->Np;
        g->n_prompt = st->Np;
        g->out = st->out + (size_t)p * st->G;
        gen_config_default(&g->gc);
        g->gc.n_samples = st->G;
        g->gc.max_new = st->budgets[p % st->n_budgets];
        g->gc.sampler.temperature = 1.0f;
        g->gc.seed = 1000 * (uint64_t)round + (uint64_t)p;
        g->gc.adapter = st->ad;
    }
    return rollout_groups(&st->batch, st->groups, st->P, tokens);
}

// The update of every group (reference log-probs, then the policy step into the adapter's gradient), then
// AdamW; finished when a gradient value is back on the host.
static int update(Step *st, long step_tokens) {
    Backend *be = st->be;
    int G = st->G, Tt = st->Np + st->max_new;
    ER_TRY(be->ops->zero(be, st->ad->grads, sizeof(float) * st->ad->n_params));
    for (int p = 0; p < st->P; p++) {
        const GenSample *out = st->out + (size_t)p * G;
        for (int i = 0; i < G; i++) {
            for (int t = 0; t < Tt; t++) {
                int j = t - st->Np;
                st->tokens[i * Tt + t] = j < 0 ? st->prompts[p * st->Np + t] : j < out[i].n_tokens ? out[i].tokens[j] : 0;
                st->mask[i * Tt + t] = j >= 0;
            }
            st->plen[i] = st->Np;
            st->clen[i] = out[i].n_tokens;
            st->adv[i] = (float)(i % 2 ? 1 : -1);
        }
        RolloutBatch rb = {G, Tt, st->tokens, st->mask, st->plen, st->clen};
        PolicyLossConfig lc = {.eps = 0.2, .eps_high = 0.2, .beta = 1e-3, .type = LOSS_DAPO,
                               .global_tokens = step_tokens};
        PolicyLossStats ps;
        ER_TRY(policy_logprobs(st->m, NULL, &st->a, &rb, 1.0f, st->ref));
        ER_TRY(policy_step(st->m, st->ad, &st->a, &rb, 1.0f, NULL, st->ref, st->adv, &lc, 1, st->lp, &ps));
    }
    ER_TRY(adamw_step(&st->opt, st->ad->params, st->ad->grads, NULL, 1e-6));
    float sink;
    return be->ops->download(be, &sink, st->ad->params, sizeof sink);
}

int main(int argc, char **argv) {
    const char *shape = "small", *device = "cuda", *budgets = "256,512,768,1024";
    int threads = 0, steps = 1, no_warmup = 0;
    Step st = {.P = 8, .G = 8, .Np = 128};
    ArgSpec specs[] = {
        {"shape", ARG_STR, &shape, "small (hidden 256, 4 layers), 0.5b, 1.5b or 7b (the Qwen2.5 shapes)", 0, 0, 0},
        {"device", ARG_STR, &device, "cpu, cuda or cuda:N", 0, 0, 0},
        {"prompts", ARG_INT, &st.P, "prompts per step (P)", 0, 1, 256},
        {"group", ARG_INT, &st.G, "samples per prompt (G)", 0, 1, 256},
        {"prompt-tokens", ARG_INT, &st.Np, "prompt length", 0, 1, 1 << 16},
        {"budgets", ARG_STR, &budgets, "each prompt's tokens to decode, in turn", 0, 0, 0},
        {"steps", ARG_INT, &steps, "timed steps after the warm-up (the best is reported)", 0, 1, 100},
        {"no-warmup", ARG_FLAG, &no_warmup, "time the first step too (first use of every buffer included)", 0, 0, 0},
        {"threads", ARG_INT, &threads, "threads (0 = all cores)", 0, 0, 4096},
    };
    int exit_status = bench_args("gpu_grpo_step", argc, argv, specs, sizeof specs / sizeof specs[0], &threads);
    if (exit_status >= 0)
        return exit_status;
    ModelConfig c;
    int rc = ER_OK;
    ER_CHECK(bench_parse_counts("budgets", budgets, 1, 32768, st.budgets, 16, &st.n_budgets));
    for (int i = 0; i < st.n_budgets; i++)
        st.max_new = st.budgets[i] > st.max_new ? st.budgets[i] : st.max_new;
    ER_CHECK(bench_shape_config(shape, &c));
    ER_CHECK(step_setup(&st, &c, device));
    double best_roll = 0, best_update = 0;
    long tokens = 0;
    for (int s = no_warmup; s <= steps; s++) {
        double t0 = time_now();
        ER_CHECK(rollouts(&st, s, &tokens));
        double t1 = time_now();
        ER_CHECK(update(&st, tokens));
        double t2 = time_now();
        if ((s > 0 || no_warmup) && (best_roll == 0 || t1 - t0 + t2 - t1 < best_roll + best_update))
            best_roll = t1 - t0, best_update = t2 - t1;
    }
    char load[64];
    bench_load_average(load, sizeof load);
    printf("{\"bench\": \"gpu_grpo_step\", \"device\": \"%s\", \"device_name\": \"%s\", \"shape\": \"%s\", "
           "\"prompts\": %d, \"group\": %d, \"budgets\": \"%s\", \"rollout_tokens\": %ld, \"rollout_s\": %.3f, "
           "\"rollout_tokens_per_s\": %.0f, \"update_s\": %.3f, \"rollout_share\": %.3f, \"load\": \"%s\"}\n",
           st.be->name, st.be->device, shape, st.P, st.G, budgets, tokens, best_roll, tokens / best_roll, best_update,
           best_roll / (best_roll + best_update), load);
done:
    step_free(&st);
    return rc < 0 ? bench_fail("gpu_grpo_step") : 0;
}
