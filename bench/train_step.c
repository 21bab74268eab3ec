// Training-step throughput: forward + loss + backward of a Qwen2-shaped model with random weights,
// against the machine's own OpenBLAS sgemm peak (same threads). Prints one JSON line per measurement;
// bench/run.sh pairs them with the PyTorch peer and prints the ratios.
//
//   train_step --shape 0.5b|small --batch B --seq T --steps S --threads N
//   train_step --shape 0.5b --lora 16 ...   LoRA SFT step: frozen base, rank-16 adapter on all seven linears
//   train_step --sgemm-peak --threads N
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "core/alloc.h"
#include "core/args.h"
#include "core/error.h"
#include "core/gemm.h"
#include "core/progress.h"
#include "core/rng.h"
#include "lora/lora.h"
#include "model/model.h"

static double sgemm_peak(void) {
    // Square-ish products large enough to reach the kernel's steady state; best of several runs.
    int n = 2048;
    float *A = er_alloc(sizeof(float) * n * n), *B = er_alloc(sizeof(float) * n * n), *C = er_alloc(sizeof(float) * n * n);
    if (!A || !B || !C)
        return 0;
    for (long i = 0; i < (long)n * n; i++) {
        A[i] = (float)((i % 17) - 8) * 0.01f;
        B[i] = (float)((i % 13) - 6) * 0.01f;
    }
    double best = 0;
    for (int r = 0; r < 6; r++) {
        double t0 = time_now();
        gemm_f32(0, 1, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
        double dt = time_now() - t0;
        double gf = 2.0 * n * n * (double)n / dt / 1e9;
        if (r > 0 && gf > best) // first run warms up threads and pages
            best = gf;
    }
    er_free(A);
    er_free(B);
    er_free(C);
    return best;
}

// Model FLOPs of one training step: forward matmuls + attention, backward counted as twice forward.
static double step_flops(const ModelConfig *c, int B, int T) {
    double N = (double)B * T, C = c->C, qd = (double)c->NH * c->HS, kvd = (double)c->NKV * c->HS, FF = c->FF;
    double mat = C * qd + 2 * C * kvd + qd * C + 3 * C * FF; // per layer
    double fwd = 2 * N * (c->L * mat + (double)c->V * C);
    double att = 0; // q·k and p·v over the causal triangle
    for (int t = 0; t < T; t++)
        att += 2.0 * 2.0 * (t + 1) * qd;
    fwd += (double)B * c->L * att;
    return 3 * fwd;
}

// Model FLOPs of one LoRA step on a frozen base: the forward, the backward to the inputs only (one
// more forward's matmuls; attention's backward twice its forward), and the adapter: x·Aᵀ and h·Bᵀ
// forward, then dh, gB, gA, dx backward (twice its forward).
static double lora_step_flops(const ModelConfig *c, int B, int T, int r) {
    double N = (double)B * T, C = c->C, qd = (double)c->NH * c->HS, kvd = (double)c->NKV * c->HS, FF = c->FF;
    double mat = C * qd + 2 * C * kvd + qd * C + 3 * C * FF;
    double lora = r * ((C + qd) + 2 * (C + kvd) + (qd + C) + 2 * (C + FF) + (FF + C));
    double att = 0;
    for (int t = 0; t < T; t++)
        att += 2.0 * 2.0 * (t + 1) * qd;
    return 2 * (2 * N * (c->L * mat + (double)c->V * C)) + 3 * (double)B * c->L * att + 3 * 2 * N * c->L * lora;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv) {
    const char *shape = "small";
    int batch = 1, seq = 256, steps = 3, threads = 0, peak = 0, rank = 0;
    ArgSpec specs[] = {
        {"shape", ARG_STR, &shape, "0.5b (hidden 896, 24 layers, 14/2 heads, ff 4864) or small (hidden 256, 4 layers)", 0, 0, 0},
        {"batch", ARG_INT, &batch, "sequences per step", 0, 1, 1024},
        {"seq", ARG_INT, &seq, "positions per sequence", 0, 1, 32768},
        {"steps", ARG_INT, &steps, "timed steps (after one warm-up step); the median is reported", 0, 1, 1000},
        {"threads", ARG_INT, &threads, "threads (0 = all cores)", 0, 0, 4096},
        {"lora", ARG_INT, &rank, "LoRA SFT step: frozen base + rank-R adapter (alpha 2R, all 7 targets); 0 = full",
         0, 0, 4096},
        {"sgemm-peak", ARG_FLAG, &peak, "measure the sgemm peak instead", 0, 0, 0},
    };
    int exit_status = bench_args("train_step", argc, argv, specs, sizeof specs / sizeof specs[0], &threads);
    if (exit_status >= 0)
        return exit_status;
    if (peak) {
        printf("{\"impl\": \"sgemm\", \"threads\": %d, \"gflops\": %.2f}\n", threads, sgemm_peak());
        return 0;
    }
    ModelConfig c = {.arch = ARCH_QWEN2, .V = 151936, .max_pos = 32768, .rope_theta = 1e6f, .eps = 1e-6f, .tied = 1,
                     .qkv_bias = 1, .dtype = DT_F32, .bos_id = -1, .eos_id = -1};
    if (strcmp(shape, "0.5b") == 0) {
        c.C = 896; c.L = 24; c.NH = 14; c.NKV = 2; c.FF = 4864;
    } else if (strcmp(shape, "small") == 0) {
        c.C = 256; c.L = 4; c.NH = 4; c.NKV = 2; c.FF = 1024;
    } else {
        fprintf(stderr, "train_step: --shape must be 0.5b or small\n");
        return 1;
    }
    c.HS = c.C / c.NH;
    Model m;
    Activations a;
    if (model_build_random(&m, &c, 0.02f, 1) < 0 || acts_alloc(&a, &c, batch, seq, ACTS_TRAIN, 0) < 0) 
        return bench_fail("train_step");
    LoraAdapter ad = {0};
    if (rank > 0) {
        // The base is frozen: the backward computes only input gradients and the adapter's.
        m.trainable = 0;
        LoraShape ls = model_config_lora_shape(&c);
        if (lora_init(&ad, &ls, rank, 2.0f * rank, 0, 0.0f, LORA_ALL_TARGETS, 1, 7) < 0) 
            return bench_fail("train_step");
        // PEFT starts B at zero; small random values make the adapter change the loss (same work).
        ErRng rng;
        rng_seed(&rng, 11);
        for (int i = 0; i < ad.L * LT_COUNT; i++)
            if (ad.mats[i].A)
                for (size_t j = 0; j < (size_t)ad.mats[i].out * rank; j++)
                    ad.mats[i].B[j] = 0.01f * rng_normal(&rng);
    }
    int N = batch * seq;
    int *tokens = malloc(sizeof(int) * N), *targets = malloc(sizeof(int) * N);
    uint8_t *amask = malloc(N);
    float *lmask = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) {
        tokens[i] = (int)((i * 2654435761u) % (unsigned)c.V);
        targets[i] = (int)(((i + 1) * 2654435761u) % (unsigned)c.V);
        amask[i] = 1; // every position a response position: the adapter's full cost
        lmask[i] = 1.0f;
    }
    ModelInput in = {.B = batch, .T = seq, .tokens = tokens};
    if (rank > 0) {
        in.adapter = &ad;
        in.adapter_mask = amask;
    }
    double *times = malloc(sizeof(double) * steps), loss = 0;
    for (int s = 0; s <= steps; s++) {
        double t0 = time_now();
        if (rank > 0)
            lora_zero_grad(&ad);
        else
            model_zero_grad(&m);
        if (model_forward(&m, &in, &a) < 0 || model_loss(&a, targets, rank > 0 ? lmask : NULL, 1, &loss) < 0 ||
            model_backward(&m, &in, &a) < 0) 
            return bench_fail("train_step");
        if (s > 0)
            times[s - 1] = time_now() - t0;
    }
    // median, like the PyTorch peer: robust to the odd step that shares the cores with something else
    qsort(times, steps, sizeof(double), cmp_double);
    double step_s = steps % 2 ? times[steps / 2] : 0.5 * (times[steps / 2 - 1] + times[steps / 2]);
    double step_min = times[0];
    free(times);
    double flops = rank > 0 ? lora_step_flops(&c, batch, seq, rank) : step_flops(&c, batch, seq);
    printf("{\"impl\": \"ertrain\", \"mode\": \"%s\", \"shape\": \"%s\", \"params\": %zu, \"trainable\": %zu, "
           "\"lora_r\": %d, \"batch\": %d, \"seq\": %d, \"threads\": %d, \"step_s\": %.4f, \"step_s_min\": %.4f, "
           "\"tokens_per_s\": %.1f, \"gflops\": %.2f, \"loss\": %.4f}\n",
           rank > 0 ? "lora" : "full", shape, model_config_num_params(&c),
           rank > 0 ? ad.n_params : model_config_num_params(&c), rank, batch, seq, threads, step_s, step_min,
           N / step_s, flops / step_s / 1e9, loss);
    if (rank > 0)
        lora_free(&ad);
    free(amask);
    free(lmask);
    free(tokens);
    free(targets);
    acts_free(&a);
    model_free(&m);
    return 0;
}
