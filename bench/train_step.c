// Training-step throughput: forward + loss + backward of a Qwen2-shaped model with random weights,
// against the machine's own OpenBLAS sgemm peak (same threads). Prints one JSON line per measurement;
// bench/run.sh pairs them with the PyTorch peer and prints the ratios.
//
//   train_step --shape 0.5b|small --batch B --seq T --steps S --threads N
//   train_step --shape 0.5b --lora 16 ...   LoRA SFT step: frozen base, rank-16 adapter on all seven linears
//   train_step --shape 7b --lora 16 --bf16 --seq 2048 --device cuda   the same on a GPU, bf16 base
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
#include "model/backend.h"
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

// What one benchmark run holds: the model and adapter (on the host, and placed on the device when one
// is used), the activations and the batch.
typedef struct {
    Backend *be;
    Model host, placed, *m;
    LoraAdapter host_ad, placed_ad, *ad;
    Activations a;
    int *tokens, *targets;
    uint8_t *amask;
    float *lmask;
} Bench;

static int bench_setup(Bench *b, const ModelConfig *c, int rank, int bf16, int recompute, const char *device, int batch,
                       int seq) {
    ER_TRY(backend_open(&b->be, device));
    ER_TRY(bf16 ? model_build_random_bf16(&b->host, c, 0.02f, 1) : model_build_random(&b->host, c, 0.02f, 1));
    if (rank > 0) {
        // The base is frozen: the backward computes only input gradients and the adapter's.
        b->host.trainable = 0;
        LoraShape ls = model_config_lora_shape(c);
        ER_TRY(lora_init(&b->host_ad, &ls, rank, 2.0f * rank, 0, 0.0f, LORA_ALL_TARGETS, 1, 7));
        // PEFT starts B at zero; small random values make the adapter change the loss (same work).
        ErRng rng;
        rng_seed(&rng, 11);
        for (int i = 0; i < b->host_ad.L * LT_COUNT; i++)
            if (b->host_ad.mats[i].A)
                for (size_t j = 0; j < (size_t)b->host_ad.mats[i].out * rank; j++)
                    b->host_ad.mats[i].B[j] = 0.01f * rng_normal(&rng);
        b->ad = &b->host_ad;
    }
    b->m = &b->host;
    if (b->be->kind != BACKEND_CPU) {
        ER_TRY(model_to_backend(&b->placed, &b->host, b->be));
        b->m = &b->placed;
        if (rank > 0) {
            ER_TRY(lora_to_backend(&b->placed_ad, &b->host_ad, b->be));
            b->ad = &b->placed_ad;
        }
    }
    size_t limit;
    ER_TRY(b->be->ops->mem_available(b->be, &limit));
    // as the trainer sizes them: the LM head and the loss a chunk of rows at a time
    ActsMode mode = (recompute ? ACTS_TRAIN_RECOMPUTE : ACTS_TRAIN) | ACTS_LOSS_ONLY;
    ER_TRY(acts_alloc_on(&b->a, b->be, c, batch, seq, mode, limit));
    int N = batch * seq;
    b->tokens = malloc(sizeof(int) * N);
    b->targets = malloc(sizeof(int) * N);
    b->amask = malloc(N);
    b->lmask = malloc(sizeof(float) * N);
    if (!b->tokens || !b->targets || !b->amask || !b->lmask)
        return er_error(ER_ENOMEM, "batch of %d positions", N);
    for (int i = 0; i < N; i++) {
        b->tokens[i] = (int)((i * 2654435761u) % (unsigned)c->V);
        b->targets[i] = (int)(((i + 1) * 2654435761u) % (unsigned)c->V);
        b->amask[i] = 1; // every position a response position: the adapter's full cost
        b->lmask[i] = 1.0f;
    }
    return ER_OK;
}

static void bench_free(Bench *b) {
    if (b->placed_ad.mats)
        lora_backend_free(&b->placed_ad, b->be);
    lora_free(&b->host_ad);
    acts_free(&b->a);
    model_free(&b->placed);
    model_free(&b->host);
    free(b->tokens);
    free(b->targets);
    free(b->amask);
    free(b->lmask);
    backend_close(b->be);
}

// One training step (forward, loss, backward), finished: the device's queue is drained by a download.
static int bench_step(Bench *b, int batch, int seq, double *loss) {
    Backend *be = b->be;
    if (b->ad)
        ER_TRY(be->ops->zero(be, b->ad->grads, b->ad->n_params * sizeof(float)));
    else
        model_zero_grad(b->m);
    ModelInput in = {.B = batch, .T = seq, .tokens = b->tokens, .adapter = b->ad, .adapter_mask = b->ad ? b->amask : NULL};
    ER_TRY(model_forward(b->m, &in, &b->a));
    ER_TRY(model_loss(&b->a, b->targets, b->ad ? b->lmask : NULL, 1, loss));
    ER_TRY(model_backward(b->m, &in, &b->a));
    float sink;
    return be->ops->download(be, &sink, b->a.dres, sizeof sink);
}

int main(int argc, char **argv) {
    const char *shape = "small", *device = "cpu";
    int batch = 1, seq = 256, steps = 3, threads = 0, peak = 0, rank = 0, bf16 = 0, recompute = 0;
    ArgSpec specs[] = {
        {"shape", ARG_STR, &shape, "small (hidden 256, 4 layers), 0.5b, 1.5b or 7b (the Qwen2.5 shapes)", 0, 0, 0},
        {"batch", ARG_INT, &batch, "sequences per step", 0, 1, 1024},
        {"seq", ARG_INT, &seq, "positions per sequence", 0, 1, 32768},
        {"steps", ARG_INT, &steps, "timed steps (after one warm-up step); the median is reported", 0, 1, 1000},
        {"threads", ARG_INT, &threads, "threads (0 = all cores)", 0, 0, 4096},
        {"lora", ARG_INT, &rank, "LoRA SFT step: frozen base + rank-R adapter (alpha 2R, all 7 targets); 0 = full",
         0, 0, 4096},
        {"bf16", ARG_FLAG, &bf16, "the frozen base in bf16 (with --lora)", 0, 0, 0},
        {"recompute", ARG_FLAG, &recompute, "keep only each layer's input; the backward recomputes the rest", 0, 0, 0},
        {"device", ARG_STR, &device, "cpu, cuda or cuda:N", 0, 0, 0},
        {"sgemm-peak", ARG_FLAG, &peak, "measure the sgemm peak instead", 0, 0, 0},
    };
    int exit_status = bench_args("train_step", argc, argv, specs, sizeof specs / sizeof specs[0], &threads);
    if (exit_status >= 0)
        return exit_status;
    if (peak) {
        printf("{\"impl\": \"sgemm\", \"threads\": %d, \"gflops\": %.2f}\n", threads, sgemm_peak());
        return 0;
    }
    ModelConfig c;
    if (bench_shape_config(shape, &c) < 0 || (bf16 && rank == 0 && er_error(ER_EINVAL, "--bf16 needs --lora") < 0))
        return bench_fail("train_step");
    Bench b = {0};
    double *times = malloc(sizeof(double) * steps), loss = 0;
    int rc = bench_setup(&b, &c, rank, bf16, recompute, device, batch, seq);
    for (int s = 0; rc == ER_OK && s <= steps; s++) {
        double t0 = time_now();
        rc = bench_step(&b, batch, seq, &loss);
        if (s > 0)
            times[s - 1] = time_now() - t0;
    }
    if (rc < 0) {
        bench_free(&b);
        free(times);
        return bench_fail("train_step");
    }
    // median, like the PyTorch peer: robust to the odd step that shares the cores with something else
    qsort(times, steps, sizeof(double), cmp_double);
    double step_s = steps % 2 ? times[steps / 2] : 0.5 * (times[steps / 2 - 1] + times[steps / 2]);
    double step_min = times[0];
    free(times);
    int N = batch * seq;
    double flops = rank > 0 ? lora_step_flops(&c, batch, seq, rank) : step_flops(&c, batch, seq);
    printf("{\"impl\": \"ertrain\", \"mode\": \"%s\", \"shape\": \"%s\", \"device\": \"%s\", \"base\": \"%s\", "
           "\"params\": %zu, \"trainable\": %zu, \"lora_r\": %d, \"batch\": %d, \"seq\": %d, \"threads\": %d, "
           "\"recompute\": %d, \"acts_mib\": %.0f, \"step_s\": %.4f, \"step_s_min\": %.4f, \"tokens_per_s\": %.1f, "
           "\"gflops\": %.2f, \"loss\": %.4f}\n",
           rank > 0 ? "lora" : "full", shape, b.be->device, bf16 ? "bf16" : "f32", model_config_num_params(&c),
           rank > 0 ? b.host_ad.n_params : model_config_num_params(&c), rank, batch, seq, threads, recompute,
           b.a.bytes / 1048576.0, step_s, step_min,
           N / step_s, flops / step_s / 1e9, loss);
    bench_free(&b);
    return 0;
}
