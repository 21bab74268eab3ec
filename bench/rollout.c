// GRPO rollouts of one step on the Qwen2.5-0.5B shape (random fp32 weights, rank-16 masked adapter): P
// prompts x G samples rolled out by the old loop (one engine_generate of G rows per prompt, the weights
// read once per step of each group) against rollout_groups (rl/rollout.h: every group in one DecodeBatch,
// the weights read once per step for all groups), on the same prompts and seeds, alternating, best of
// several rounds; whether their tokens match; the bound of each side measured in the same run (weight bytes
// per step over the read bandwidth; FLOPs per token over the fp32 decode kernel's rate, or sgemm's at the
// step's shapes past QUANT_BATCH_MAX_N rows); and the rollout share of a GRPO step.
//   rollout [--threads N] [--prompts P] [--group G] [--prompt-tokens N] [--new-tokens T] [--rounds R]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "core/gemm.h"
#include "infer/decode_batch.h"
#include "quant/quant.h"
#include "rl/policy.h"
#include "rl/rollout.h"

typedef struct {
    int P, G, Np, T, rounds;
    Model m;
    LoraAdapter ad;
    int *prompts;          // (P, Np), new ones each round: a GRPO step draws new prompts
    RolloutGroup *groups;  // (P)
    GenSample *old, *batch; // (P, G) each
} Bench;

static void set_prompts(Bench *bn, int round) {
    for (int p = 0; p < bn->P; p++) {
        for (int i = 0; i < bn->Np; i++) // different sequences from their first token on: no shared prefix
            bn->prompts[p * bn->Np + i] =
                (int)(((uint32_t)(round * 7919 + p * 104729 + i) * 2654435761u) % (unsigned)bn->m.cfg.V);
        RolloutGroup *g = &bn->groups[p];
        g->prompt = bn->prompts + (size_t)p * bn->Np;
        g->n_prompt = bn->Np;
        gen_config_default(&g->gc);
        g->gc.n_samples = bn->G;
        g->gc.max_new = bn->T;
        g->gc.sampler.temperature = 1.0f;
        g->gc.seed = 1000 * (uint64_t)round + (uint64_t)p;
        g->gc.adapter = &bn->ad;
    }
}

// The old loop: group after group, each one engine_generate of G rows.
static int run_old(Bench *bn, Engine *e, double *t, long *tokens) {
    double t0 = time_now();
    *tokens = 0;
    for (int p = 0; p < bn->P; p++) {
        RolloutGroup *g = &bn->groups[p];
        GenStats st;
        ER_TRY(engine_generate(e, g->prompt, g->n_prompt, &g->gc, NULL, NULL, bn->old + (size_t)p * bn->G, &st));
        *tokens += st.generated_tokens;
    }
    *t = time_now() - t0;
    return ER_OK;
}

static int run_batch(Bench *bn, DecodeBatch *b, double *t, long *tokens) {
    for (int p = 0; p < bn->P; p++)
        bn->groups[p].out = bn->batch + (size_t)p * bn->G;
    double t0 = time_now();
    *tokens = 0;
    ER_TRY(rollout_groups(b, bn->groups, bn->P, tokens));
    *t = time_now() - t0;
    return ER_OK;
}

// Samples (and tokens) the two sides generated identically.
static void compare(const Bench *bn, long *same_samples, long *same_tokens, long *all_tokens) {
    for (int k = 0; k < bn->P * bn->G; k++) {
        const GenSample *a = &bn->old[k], *b = &bn->batch[k];
        int n = a->n_tokens < b->n_tokens ? a->n_tokens : b->n_tokens, j = 0;
        while (j < n && a->tokens[j] == b->tokens[j])
            j++;
        *same_samples += a->n_tokens == b->n_tokens && j == n;
        *same_tokens += j; // the common start: a sample that differs once goes on differently
        *all_tokens += a->n_tokens;
    }
}

// Matrix parameters (weight elements) a decode step reads per row: every layer's seven and the lm_head.
static double matrix_params(const Model *m) {
    double n = (double)m->lm_head.rows * m->lm_head.cols;
    for (int l = 0; l < m->cfg.L; l++) {
        const LayerWeights *w = &m->layers[l];
        const Weight *ws[7] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->wgate, &w->wup, &w->wdown};
        for (int k = 0; k < 7; k++)
            n += (double)ws[k]->rows * ws[k]->cols;
    }
    return n;
}

// sgemm's rate (GFLOP/s) on one decode step's products at `rows` rows (the model's own weights, as the
// forward multiplies them past QUANT_DECODE_MAX_N rows), best of `reps`.
static double sgemm_step_rate(const Model *m, int rows, int reps) {
    int C = m->cfg.C, FF = m->cfg.FF, widest = m->cfg.V > FF ? m->cfg.V : FF;
    float *inp = er_calloc((size_t)rows * (C > FF ? C : FF), sizeof(float));
    float *out = er_alloc(sizeof(float) * (size_t)rows * widest);
    double best = 0;
    for (int r = 0; inp && out && r < reps; r++) {
        double t0 = time_now();
        for (int l = 0; l < m->cfg.L; l++) {
            const LayerWeights *w = &m->layers[l];
            const Weight *ws[7] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->wgate, &w->wup, &w->wdown};
            for (int k = 0; k < 7; k++)
                gemm_f32(0, 1, rows, ws[k]->rows, ws[k]->cols, 1.0f, inp, ws[k]->cols, ws[k]->data, ws[k]->cols, 0.0f,
                         out, ws[k]->rows);
        }
        gemm_f32(0, 1, rows, m->lm_head.rows, C, 1.0f, inp, C, m->lm_head.data, C, 0.0f, out, m->lm_head.rows);
        double gf = 2.0 * rows * matrix_params(m) / (time_now() - t0) / 1e9;
        best = gf > best ? gf : best;
    }
    er_free(inp);
    er_free(out);
    return best;
}

// The fp32 decode kernel's rate (GFLOP/s) at QUANT_DECODE_MAX_N rows on a slice of the model's weights that
// stays in cache (512 rows of the first MLP up-projection): its arithmetic ceiling once the weights are not
// what bounds it, i.e. what a step's products of up to QUANT_BATCH_MAX_N rows reach (blocked through it in groups
// of 8).
static double decode_kernel_rate(const Model *m) {
    Weight v = m->layers[0].wup;
    v.rows = v.rows < 512 ? v.rows : 512;
    v.owned = NULL;
    int N = QUANT_DECODE_MAX_N, reps = 200;
    float *inp = er_calloc((size_t)N * v.cols, sizeof(float)), *out = er_alloc(sizeof(float) * (size_t)N * v.rows);
    double best = 0;
    for (int r = 0; inp && out && r < 6; r++) {
        double t0 = time_now();
        for (int k = 0; k < reps; k++)
            if (quant_matmul_decode(out, inp, &v, N, NULL) < 0)
                break;
        double gf = 2.0 * N * v.rows * (double)v.cols * reps / (time_now() - t0) / 1e9;
        if (r > 0 && gf > best) // the first pass brings the slice into cache
            best = gf;
    }
    er_free(inp);
    er_free(out);
    return best;
}

// sgemm on square 2048 products (bench/train_step's peak), best of 4 after a warm-up.
static double sgemm_square_peak(void) {
    int n = 2048;
    size_t bytes = sizeof(float) * (size_t)n * n;
    float *A = er_alloc(bytes), *B = er_alloc(bytes), *C = er_alloc(bytes);
    double best = 0;
    for (long i = 0; A && B && i < (long)n * n; i++)
        A[i] = B[i] = (float)((i % 17) - 8) * 0.01f;
    for (int r = 0; A && B && C && r < 5; r++) {
        double t0 = time_now();
        gemm_f32(0, 1, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
        double gf = 2.0 * n * n * (double)n / (time_now() - t0) / 1e9;
        if (r > 0 && gf > best)
            best = gf;
    }
    er_free(A);
    er_free(B);
    er_free(C);
    return best;
}

// One group's policy update (reference log-probs, forward + loss + backward into the adapter) on its G
// rollouts, timed; a step's update runs it once per group.
static int time_update(Bench *bn, const int *prompt, const GenSample *out, long step_tokens, double *t_update) {
    int rc = ER_OK, G = bn->G, Tt = bn->Np + bn->T;
    Activations a = {0};
    int *tokens = malloc(sizeof(int) * (size_t)G * Tt);
    int *plen = malloc(sizeof(int) * G), *clen = malloc(sizeof(int) * G);
    uint8_t *mask = malloc((size_t)G * Tt);
    float *adv = malloc(sizeof(float) * G), *lp = malloc(sizeof(float) * (size_t)G * Tt);
    float *ref = malloc(sizeof(float) * (size_t)G * Tt);
    if (!tokens || !plen || !clen || !mask || !adv || !lp || !ref)
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(acts_alloc(&a, &bn->m.cfg, G, Tt, ACTS_TRAIN, 0));
    for (int i = 0; i < G; i++) {
        for (int t = 0; t < Tt; t++) {
            tokens[i * Tt + t] = t < bn->Np ? prompt[t] : t < bn->Np + out[i].n_tokens ? out[i].tokens[t - bn->Np] : 0;
            mask[i * Tt + t] = t >= bn->Np;
        }
        plen[i] = bn->Np;
        clen[i] = out[i].n_tokens;
        adv[i] = (float)(i % 2 ? 1 : -1);
    }
    RolloutBatch rb = {G, Tt, tokens, mask, plen, clen};
    PolicyLossConfig lc = {.eps = 0.2, .eps_high = 0.2, .beta = 1e-3, .type = LOSS_DAPO, .global_tokens = step_tokens};
    PolicyLossStats ps;
    double t0 = time_now();
    ER_CHECK(policy_logprobs(&bn->m, NULL, &a, &rb, 1.0f, ref));
    ER_CHECK(policy_step(&bn->m, &bn->ad, &a, &rb, 1.0f, NULL, ref, adv, &lc, 1, lp, &ps));
    *t_update = time_now() - t0;
done:
    acts_free(&a);
    free(tokens);
    free(plen);
    free(clen);
    free(mask);
    free(adv);
    free(lp);
    free(ref);
    return rc;
}

typedef struct {
    double t_old, t_batch;   // best round of each
    long tok_old, tok_batch; // tokens of that round
    long same_samples, same_tokens, all_tokens;
    long steps;              // the batch's forwards in its best round
} Rounds;

// R rounds on new prompts each, the two sides alternating which goes first; both sides' outputs of the last
// round are kept (bn->old, bn->batch) for the update.
static int run_rounds(Bench *bn, Engine *e, DecodeBatch *b, Rounds *r) {
    r->t_old = r->t_batch = 1e300;
    for (int round = 0; round < bn->rounds; round++) {
        set_prompts(bn, round + 1);
        gen_samples_free(bn->old, bn->P * bn->G);
        gen_samples_free(bn->batch, bn->P * bn->G);
        double t_old = 0, t_batch = 0;
        long n_old = 0, n_batch = 0, steps0 = b->steps;
        for (int side = 0; side < 2; side++) {
            if ((side + round) % 2 == 0)
                ER_TRY(run_old(bn, e, &t_old, &n_old));
            else
                ER_TRY(run_batch(bn, b, &t_batch, &n_batch));
        }
        if (t_old < r->t_old)
            r->t_old = t_old, r->tok_old = n_old;
        if (t_batch < r->t_batch)
            r->t_batch = t_batch, r->tok_batch = n_batch, r->steps = b->steps - steps0;
        compare(bn, &r->same_samples, &r->same_tokens, &r->all_tokens);
        fprintf(stderr, "round %d: old loop %.1f s, batch %.1f s\n", round + 1, t_old, t_batch);
    }
    return ER_OK;
}

static void report(const Bench *bn, const Rounds *r, double bw, double sgemm_step, double sgemm_peak, double kernel,
                   int threads, double t_update) {
    int rows = bn->P * bn->G;
    double params = matrix_params(&bn->m), bytes = 4 * (params + (double)bn->ad.n_params);
    double old_tps = r->tok_old / r->t_old, batch_tps = r->tok_batch / r->t_batch;
    // The old loop steps G rows at a time, each step reading every weight: G tokens per bytes / bw seconds.
    // The batch steps all rows at once. Up to QUANT_BATCH_MAX_N rows its fp32 products take the decode kernel,
    // the weights read once a step: bound by those bytes or by 2 FLOPs per matrix parameter per token at the
    // kernel's rate, whichever is slower; past it they run through sgemm, at its rate on the step's shapes.
    double old_bound = bn->G * bw * 1e9 / bytes, batch_bound = sgemm_step * 1e9 / (2 * params);
    double bytes_bound = rows * bw * 1e9 / bytes, kernel_bound = kernel * 1e9 / (2 * params);
    int kernels = rows <= QUANT_BATCH_MAX_N;
    if (kernels)
        batch_bound = bytes_bound < kernel_bound ? bytes_bound : kernel_bound;
    char load[64];
    bench_load_average(load, sizeof load);
    printf("== GRPO rollouts of one step (Qwen2.5-0.5B shape fp32, rank-16 adapter; %d prompts x G = %d, prompt %d, "
           "%d new tokens, threads %d; best of %d rounds; load %s) ==\n",
           bn->P, bn->G, bn->Np, bn->T, threads, bn->rounds, load);
    printf("old loop (%d engine_generate calls of %d rows): %.1f tokens/s\n", bn->P, bn->G, old_tps);
    printf("rollout_groups (one batch of %d rows, %ld forwards): %.1f tokens/s = %.2fx the old loop (target >= 1.5x)\n",
           rows, r->steps, batch_tps, batch_tps / old_tps);
    printf("tokens match: %ld of %ld samples identical, %ld of %ld tokens before the first difference (%d rows a "
           "step: past %d the products round as sgemm does)\n",
           r->same_samples, (long)bn->rounds * rows, r->same_tokens, r->all_tokens, rows, QUANT_BATCH_MAX_N);
    printf("bound, old loop: %.0f MB of weights per step of %d rows at %.1f GB/s read bandwidth = %.1f tokens/s "
           "(measured %.0f%%, prefill and sampling included)\n",
           bytes / 1e6, bn->G, bw, old_bound, 100 * old_tps / old_bound);
    if (kernels)
        printf("bound, batch: %d rows take the fp32 decode kernel: the slower of the weight bytes once a step "
               "(%.1f tokens/s) and the kernel's rate (%.1f tokens/s) = %.1f tokens/s (measured %.0f%%; sgemm would "
               "run %.1f GFLOP/s on the step's shapes)\n",
               rows, bytes_bound, kernel_bound, batch_bound, 100 * batch_tps / batch_bound, sgemm_step);
    else
        printf("bound, batch: %.2f GFLOP per token at sgemm %.1f GFLOP/s on the step's shapes (%d rows; square 2048: "
           "%.1f GFLOP/s) = %.1f tokens/s (measured %.0f%%)\n",
           2 * params / 1e9, sgemm_step, rows, sgemm_peak, batch_bound, 100 * batch_tps / batch_bound);
    printf("bound ratio batch / old loop: %.2fx%s\n", batch_bound / old_bound,
           kernels ? "" : " (= sgemm rate x 4 bytes / (2 FLOPs x G x bandwidth))");
    printf("fp32 decode kernel at %d rows, weights in cache: %.1f GFLOP/s = %.1f tokens/s, %.2fx the old loop's bound "
           "(the rate of the batch's products up to %d rows)\n",
           QUANT_DECODE_MAX_N, kernel, kernel_bound, kernel_bound / old_bound, QUANT_BATCH_MAX_N);
    double t_step_update = bn->P * t_update;
    printf("GRPO step: rollout %.1f s (rollout_groups) + policy update %.1f s (%d groups x %.1f s: reference + "
           "forward + backward of %d rows): rollout share %.0f%%\n",
           r->t_batch, t_step_update, bn->P, t_update, bn->G, 100 * r->t_batch / (r->t_batch + t_step_update));
}

int main(int argc, char **argv) {
    int threads = 0;
    Bench bn = {.P = 8, .G = 8, .Np = 16, .T = 20, .rounds = 2};
    ArgSpec specs[] = {
        {"threads", ARG_INT, &threads, "threads (0 = all cores)", 0, 0, 4096},
        {"prompts", ARG_INT, &bn.P, "prompts per step (P)", 0, 1, 64},
        {"group", ARG_INT, &bn.G, "samples per prompt (G)", 0, 1, 64},
        {"prompt-tokens", ARG_INT, &bn.Np, "prompt length", 0, 1, 4096},
        {"new-tokens", ARG_INT, &bn.T, "tokens per sample", 0, 1, 4096},
        {"rounds", ARG_INT, &bn.rounds, "rounds of both sides (the best of each is kept)", 0, 1, 100},
    };
    int exit_status = bench_args("rollout", argc, argv, specs, sizeof specs / sizeof specs[0], &threads);
    if (exit_status >= 0)
        return exit_status;
    ModelConfig c = {.arch = ARCH_QWEN2, .C = 896, .FF = 4864, .L = 24, .NH = 14, .NKV = 2, .HS = 64, .V = 151936,
                     .max_pos = 4096, .rope_theta = 1e6f, .eps = 1e-6f, .tied = 1, .qkv_bias = 1, .dtype = DT_F32,
                     .bos_id = -1, .eos_id = -1};
    int rc = ER_OK, rows = bn.P * bn.G, len = bn.Np + bn.T;
    LoraShape s = model_config_lora_shape(&c);
    Engine e = {0};
    DecodeBatch b = {0};
    Rounds r = {0};
    bn.prompts = malloc(sizeof(int) * (size_t)bn.P * bn.Np);
    bn.groups = calloc((size_t)bn.P, sizeof *bn.groups);
    bn.old = calloc((size_t)rows, sizeof(GenSample));
    bn.batch = calloc((size_t)rows, sizeof(GenSample));
    if (!bn.prompts || !bn.groups || !bn.old || !bn.batch)
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(model_build_random(&bn.m, &c, 0.02f, 1));
    bn.m.trainable = 0;
    ER_CHECK(lora_init(&bn.ad, &s, 16, 32.0f, 0, 0.0f, LORA_ALL_TARGETS, 1, 2));
    bn.ad.masked = 1; // GRPO's adapters: the prompt's KV is the base model's
    ER_CHECK(engine_init(&e, &bn.m, NULL, KV_F32, bn.G, len, 128, 0));
    ER_CHECK(decode_batch_init(&b, &bn.m, NULL, &bn.ad, KV_F32, rows, bn.P, len, 128, 0));
    double bw = bench_read_bandwidth(1024, 5), sgemm_peak = sgemm_square_peak();
    double sgemm_step = sgemm_step_rate(&bn.m, rows, 3), kernel = decode_kernel_rate(&bn.m);
    ER_CHECK(run_rounds(&bn, &e, &b, &r));
    double t_update = 0;
    ER_CHECK(time_update(&bn, bn.groups[0].prompt, bn.batch, r.tok_batch, &t_update));
    report(&bn, &r, bw, sgemm_step, sgemm_peak, kernel, threads, t_update);
done:
    gen_samples_free(bn.old, bn.old ? rows : 0);
    gen_samples_free(bn.batch, bn.batch ? rows : 0);
    free(bn.old);
    free(bn.batch);
    free(bn.groups);
    free(bn.prompts);
    decode_batch_free(&b);
    engine_free(&e);
    lora_free(&bn.ad);
    model_free(&bn.m);
    return rc < 0 ? bench_fail("rollout") : 0;
}
