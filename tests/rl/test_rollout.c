// Rollouts and policy updates together: the runtime's log-probs of sampled tokens (masked adapter,
// prompt KV from the base) equal the training forward's, and GRPO raises a reward it can learn.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"
#include "core/threads.h"
#include "infer/engine.h"
#include "rl/policy.h"
#include "train/optim.h"

static ModelConfig cfg(void) {
    ModelConfig c = {.arch = ARCH_QWEN2, .C = 32, .FF = 64, .L = 2, .NH = 4, .NKV = 2, .HS = 8, .V = 16,
                     .max_pos = 256, .rope_theta = 10000.0f, .eps = 1e-6f, .tied = 1, .qkv_bias = 1,
                     .dtype = DT_F32, .bos_id = -1, .eos_id = -1};
    return c;
}

static void setup_model(Model *m, LoraAdapter *ad, float b_noise) {
    threads_set(2);
    ModelConfig c = cfg();
    cr_assert_eq(model_build_random(m, &c, 0.4f, 1), 0);
    m->trainable = 0;
    LoraShape s = model_config_lora_shape(&c);
    cr_assert_eq(lora_init(ad, &s, 4, 8.0f, 0, 0.0f, LORA_ALL_TARGETS, 1, 2), 0);
    ErRng r;
    rng_seed(&r, 3);
    for (size_t i = 0; i < ad->n_params; i++)
        ad->params[i] += b_noise * rng_normal(&r);
}

// Rows of a RolloutBatch from a prompt and the samples (adapter on the completions).
static RolloutBatch make_batch(const int *prompt, int P, const GenSample *s, int G, int *tokens, uint8_t *mask,
                               int *plen, int *clen) {
    int T = 0;
    for (int i = 0; i < G; i++)
        T = P + s[i].n_tokens > T ? P + s[i].n_tokens : T;
    for (int i = 0; i < G; i++) {
        for (int t = 0; t < T; t++) {
            tokens[i * T + t] = t < P ? prompt[t] : t < P + s[i].n_tokens ? s[i].tokens[t - P] : 0;
            mask[i * T + t] = t >= P;
        }
        plen[i] = P;
        clen[i] = s[i].n_tokens;
    }
    return (RolloutBatch){G, T, tokens, mask, plen, clen};
}

Test(rollout, sampled_logprobs_equal_training_forward) {
    Model m;
    LoraAdapter ad;
    setup_model(&m, &ad, 0.05f);
    Engine e;
    cr_assert_eq(engine_init(&e, &m, NULL, KV_F32, 4, 64, 8, 0), 0);
    int prompt[11] = {1, 5, 2, 7, 3, 3, 9, 12, 4, 6, 2}, P = 11, G = 4;
    GenConfig g;
    gen_config_default(&g);
    g.n_samples = G;
    g.max_new = 12;
    g.sampler.temperature = 1.0f;
    g.seed = 4;
    g.adapter = &ad;
    GenSample s[4];
    GenStats st;
    cr_assert_eq(engine_generate(&e, prompt, P, &g, NULL, NULL, s, &st), 0, "%s", er_last_error());
    int tokens[4 * 64], plen[4], clen[4];
    uint8_t mask[4 * 64];
    RolloutBatch rb = make_batch(prompt, P, s, G, tokens, mask, plen, clen);
    Activations a;
    cr_assert_eq(acts_alloc(&a, &m.cfg, G, rb.T, ACTS_TRAIN, 0), 0);
    float lp[4 * 64];
    cr_assert_eq(policy_logprobs(&m, &ad, &a, &rb, 1.0f, lp), 0);
    int k = 0;
    for (int i = 0; i < G; i++)
        for (int j = 0; j < s[i].n_tokens; j++, k++)
            cr_assert(fabsf(lp[k] - s[i].logprobs[j]) <= 1e-5f * (1 + fabsf(lp[k])), "sample %d token %d: %.7g vs %.7g",
                      i, j, s[i].logprobs[j], lp[k]);
    gen_samples_free(s, G);
    acts_free(&a);
    engine_free(&e);
    lora_free(&ad);
    model_free(&m);
}

// A task the adapter can learn: the reward is 1 when the second generated token is odd (the first
// comes from the last prompt position, which the masked rule leaves to the base model). GRPO updates
// (rollouts by the runtime, policy steps through the adapter) must raise the mean reward.
Test(rollout, grpo_raises_a_learnable_reward, .timeout = 120) {
    Model m;
    LoraAdapter ad;
    setup_model(&m, &ad, 0.0f); // B = 0: the adapter starts as the base model
    int G = 8, P = 6, prompt[6] = {3, 1, 4, 1, 5, 9};
    Engine e;
    cr_assert_eq(engine_init(&e, &m, NULL, KV_F32, G, 32, 8, 0), 0);
    Activations a;
    cr_assert_eq(acts_alloc(&a, &m.cfg, G, 32, ACTS_TRAIN, 0), 0);
    AdamW opt;
    cr_assert_eq(adamw_init(&opt, backend_cpu(), ad.n_params, 3e-2, 0.9, 0.99, 1e-8, 0.0), 0);
    PolicyLossConfig lc = {.eps = 0.2, .eps_high = 0.2, .beta = 0.0, .type = LOSS_GRPO};
    double first = 0, last = 0;
    int steps = 30;
    for (int step = 0; step < steps; step++) {
        GenConfig g;
        gen_config_default(&g);
        g.n_samples = G;
        g.max_new = 3;
        g.sampler.temperature = 1.0f;
        g.seed = (uint64_t)step;
        g.adapter = &ad;
        GenSample s[8];
        GenStats st;
        cr_assert_eq(engine_generate(&e, prompt, P, &g, NULL, NULL, s, &st), 0, "%s", er_last_error());
        float r[8], adv[8];
        double mean = 0;
        for (int i = 0; i < G; i++) {
            r[i] = s[i].n_tokens > 1 && s[i].tokens[1] % 2 == 1;
            mean += r[i] / G;
        }
        if (step < 5)
            first += mean / 5;
        if (step >= steps - 5)
            last += mean / 5;
        grpo_advantages(r, 1, G, SCALE_GROUP, adv, NULL);
        int tokens[8 * 32], plen[8], clen[8];
        uint8_t mask[8 * 32];
        RolloutBatch rb = make_batch(prompt, P, s, G, tokens, mask, plen, clen);
        float lp[8 * 32];
        PolicyLossStats ps;
        lora_zero_grad(&ad);
        cr_assert_eq(policy_step(&m, &ad, &a, &rb, 1.0f, NULL, NULL, adv, &lc, 1, lp, &ps), 0);
        double norm;
        cr_assert_eq(clip_grad_norm(backend_cpu(), ad.grads, ad.n_params, 1.0, &norm), ER_OK);
        adamw_step(&opt, ad.params, ad.grads, NULL, 3e-2);
        gen_samples_free(s, G);
    }
    printf("GRPO sanity run: mean reward %.2f over the first 5 steps, %.2f over the last 5\n", first, last);
    cr_assert(last > first + 0.2 && last > 0.8, "mean reward %.2f over the first 5 steps, %.2f over the last 5", first,
              last);
    adamw_free(&opt);
    acts_free(&a);
    engine_free(&e);
    lora_free(&ad);
    model_free(&m);
}
