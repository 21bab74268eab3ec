// Training-step throughput: forward + loss + backward of a Qwen2-shaped model with random weights,
// against the machine's own OpenBLAS sgemm peak (same threads). Prints one JSON line per measurement;
// bench/run.sh pairs them with the PyTorch peer and prints the ratios.
//
//   train_step --shape 0.5b|small --batch B --seq T --steps S --threads N
//   train_step --sgemm-peak --threads N
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/args.h"
#include "core/error.h"
#include "core/gemm.h"
#include "core/progress.h"
#include "core/threads.h"
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

int main(int argc, char **argv) {
    const char *shape = "small";
    int batch = 1, seq = 256, steps = 3, threads = 0, peak = 0;
    ArgSpec specs[] = {
        {"shape", ARG_STR, &shape, "0.5b (hidden 896, 24 layers, 14/2 heads, ff 4864) or small (hidden 256, 4 layers)", 0, 0, 0},
        {"batch", ARG_INT, &batch, "sequences per step", 0, 1, 1024},
        {"seq", ARG_INT, &seq, "positions per sequence", 0, 1, 32768},
        {"steps", ARG_INT, &steps, "timed steps (after one warm-up step)", 0, 1, 1000},
        {"threads", ARG_INT, &threads, "threads (0 = all cores)", 0, 0, 4096},
        {"sgemm-peak", ARG_FLAG, &peak, "measure the sgemm peak instead", 0, 0, 0},
    };
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof specs[0], "train_step [flags]");
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0) {
        fprintf(stderr, "train_step: %s\n", er_last_error());
        return 1;
    }
    threads = threads_set(threads);
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
    if (model_build_random(&m, &c, 0.02f, 1) < 0 || acts_alloc(&a, &c, batch, seq, ACTS_TRAIN, 0) < 0) {
        fprintf(stderr, "train_step: %s\n", er_last_error());
        return 1;
    }
    int N = batch * seq;
    int *tokens = malloc(sizeof(int) * N), *targets = malloc(sizeof(int) * N);
    for (int i = 0; i < N; i++) {
        tokens[i] = (int)((i * 2654435761u) % (unsigned)c.V);
        targets[i] = (int)(((i + 1) * 2654435761u) % (unsigned)c.V);
    }
    ModelInput in = {.B = batch, .T = seq, .tokens = tokens};
    double total = 0, loss = 0;
    for (int s = 0; s <= steps; s++) {
        double t0 = time_now();
        model_zero_grad(&m);
        if (model_forward(&m, &in, &a) < 0 || model_loss(&a, targets, NULL, 1, &loss) < 0 ||
            model_backward(&m, &in, &a) < 0) {
            fprintf(stderr, "train_step: %s\n", er_last_error());
            return 1;
        }
        if (s > 0)
            total += time_now() - t0;
    }
    double step_s = total / steps;
    printf("{\"impl\": \"ertrain\", \"shape\": \"%s\", \"params\": %zu, \"batch\": %d, \"seq\": %d, \"threads\": %d, "
           "\"step_s\": %.4f, \"tokens_per_s\": %.1f, \"gflops\": %.2f, \"loss\": %.4f}\n",
           shape, model_config_num_params(&c), batch, seq, threads, step_s, N / step_s,
           step_flops(&c, batch, seq) / step_s / 1e9, loss);
    free(tokens);
    free(targets);
    acts_free(&a);
    model_free(&m);
    return 0;
}
