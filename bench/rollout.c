// GRPO rollouts: G = 8 samples decoded as one batch (shared prompt prefix) against 8 sequential
// single-stream generations, and the share of a GRPO step spent in rollout vs the policy update.
//   rollout [--threads N] [--new-tokens T]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "core/args.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/rng.h"
#include "infer/engine.h"
#include "rl/policy.h"

#define G 8
#define REPS 3

static int generate(Engine *e, const LoraAdapter *ad, const int *prompt, int P, int n, int T, uint64_t seed,
                    GenSample *out) {
    GenConfig g;
    gen_config_default(&g);
    g.n_samples = n;
    g.max_new = T;
    g.sampler.temperature = 1.0f;
    g.seed = seed;
    g.adapter = ad;
    GenStats st;
    return engine_generate(e, prompt, P, &g, NULL, NULL, out, &st);
}

// One policy update on the G rollouts in out (forward + loss + backward into the adapter), timed.
static int time_update(Model *m, LoraAdapter *ad, Activations *a, const int *prompt, int P, int T,
                       const GenSample *out, long batch_tokens, double *t_train) {
    int rc = ER_OK, Tt = P + T, plen[G], clen[G];
    int *tokens = malloc(sizeof(int) * G * (size_t)Tt);
    uint8_t *mask = malloc((size_t)G * Tt);
    float adv[G], *lp = malloc(sizeof(float) * G * Tt), *ref = malloc(sizeof(float) * G * Tt);
    if (!tokens || !mask || !lp || !ref) {
        rc = ER_ENOMEM;
        goto done;
    }
    for (int i = 0; i < G; i++) {
        for (int t = 0; t < Tt; t++) {
            tokens[i * Tt + t] = t < P ? prompt[t] : t < P + out[i].n_tokens ? out[i].tokens[t - P] : 0;
            mask[i * Tt + t] = t >= P;
        }
        plen[i] = P;
        clen[i] = out[i].n_tokens;
        adv[i] = (float)(i % 2 ? 1 : -1);
    }
    RolloutBatch rb = {G, Tt, tokens, mask, plen, clen};
    PolicyLossConfig lc = {.eps = 0.2, .eps_high = 0.2, .beta = 1e-3, .type = LOSS_DAPO, .global_tokens = batch_tokens};
    PolicyLossStats ps;
    double t0 = time_now();
    ER_CHECK(policy_logprobs(m, NULL, a, &rb, 1.0f, ref));
    ER_CHECK(policy_step(m, ad, a, &rb, 1.0f, NULL, ref, adv, &lc, 1, lp, &ps));
    *t_train = time_now() - t0;
done:
    free(tokens);
    free(mask);
    free(lp);
    free(ref);
    return rc;
}

int main(int argc, char **argv) {
    int threads = 0, T = 64, P = 64;
    ArgSpec specs[] = {
        {"threads", ARG_INT, &threads, "threads (0 = all cores)", 0, 0, 4096},
        {"new-tokens", ARG_INT, &T, "tokens per sample", 0, 2, 4096},
        {"prompt-tokens", ARG_INT, &P, "prompt length", 0, 1, 4096},
    };
    int exit_status = bench_args("rollout", argc, argv, specs, sizeof specs / sizeof specs[0], &threads);
    if (exit_status >= 0)
        return exit_status;
    // The "small" shape of bench/train_step (hidden 256, 4 layers, Qwen vocabulary) with a rank-16 adapter.
    ModelConfig c = {.arch = ARCH_QWEN2, .C = 256, .FF = 1024, .L = 4, .NH = 4, .NKV = 2, .HS = 64, .V = 151936,
                     .max_pos = 4096, .rope_theta = 1e6f, .eps = 1e-6f, .tied = 1, .qkv_bias = 1, .dtype = DT_F32,
                     .bos_id = -1, .eos_id = -1};
    int rc = ER_OK;
    Model m = {0};
    LoraAdapter ad = {0};
    LoraShape s = model_config_lora_shape(&c);
    Engine e = {0};
    Activations a = {0};
    GenSample out[G];
    memset(out, 0, sizeof out);
    int *prompt = malloc(sizeof(int) * (size_t)P);
    if (!prompt) {
        rc = ER_ENOMEM;
        goto done;
    }
    ER_CHECK(model_build_random(&m, &c, 0.02f, 1));
    ER_CHECK(lora_init(&ad, &s, 16, 32.0f, 0, 0.0f, LORA_ALL_TARGETS, 1, 2));
    ER_CHECK(engine_init(&e, &m, NULL, KV_F32, G, P + T, 128, 0));
    ER_CHECK(acts_alloc(&a, &c, G, P + T, ACTS_TRAIN, 0));
    m.trainable = 0;
    for (int i = 0; i < P; i++)
        prompt[i] = (int)((i * 2654435761u) % (unsigned)c.V);
    ER_CHECK(generate(&e, &ad, prompt, P, 1, 4, 99, out)); // warm-up
    gen_samples_free(out, 1);

    // Best of REPS rounds, each the 8 sequential generations then the batch of 8: the machine is shared,
    // and one round of either side is under a second.
    double t_seq = 1e300, t_batch = 1e300, t_train = 0;
    long seq_tokens = 0, batch_tokens = 0;
    for (int rep = 0; rep < REPS; rep++) {
        double t0 = time_now();
        long n = 0;
        for (int i = 0; i < G; i++) {
            ER_CHECK(generate(&e, &ad, prompt, P, 1, T, (uint64_t)i, out));
            n += out[0].n_tokens;
            gen_samples_free(out, 1);
        }
        double t = time_now() - t0;
        if (t < t_seq)
            t_seq = t, seq_tokens = n;
        t0 = time_now();
        ER_CHECK(generate(&e, &ad, prompt, P, G, T, 7, out));
        t = time_now() - t0;
        n = 0;
        for (int i = 0; i < G; i++)
            n += out[i].n_tokens;
        if (t < t_batch)
            t_batch = t, batch_tokens = n;
        if (rep < REPS - 1)
            gen_samples_free(out, G);
    }
    ER_CHECK(time_update(&m, &ad, &a, prompt, P, T, out, batch_tokens, &t_train));
    double seq_tps = seq_tokens / t_seq, batch_tps = batch_tokens / t_batch;
    printf("== GRPO rollouts (hidden 256, 4 layers, vocab 151936, rank-16 adapter; prompt %d, %d new tokens, "
           "threads %d; best of %d rounds) ==\n", P, T, threads, REPS);
    printf("8 sequential single-stream generations: %.1f tokens/s\n", seq_tps);
    printf("G = 8 batched (shared prefix):          %.1f tokens/s = %.2fx sequential (target >= 6x)\n", batch_tps,
           batch_tps / seq_tps);
    printf("GRPO step: rollout %.2f s + policy update (reference + forward + backward) %.2f s: rollout share %.0f%%\n",
           t_batch, t_train, 100 * t_batch / (t_batch + t_train));
done:
    gen_samples_free(out, G);
    free(prompt);
    acts_free(&a);
    engine_free(&e);
    lora_free(&ad);
    model_free(&m);
    return rc < 0 ? bench_fail("rollout") : 0;
}
