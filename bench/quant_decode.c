// Quantized decode speed: the per-token weight pass of a Qwen2.5-0.5B-shaped model (24 layers of
// q 896x896, k/v 128x896, o 896x896, gate/up 4864x896, down 896x4864, plus the 151936x896 lm_head)
// through weight_matmul_forward, with N = 1 and N = 8 input rows, for fp32, q8, q4, q4g32/64/128,
// q4lut and q2lut.
// Weights are random codes (speed does not depend on the values), so nothing is quantized here and
// the ~2 GB fp32 set is the only big allocation. Prints per format the time per token, tokens/s,
// the effective weight bandwidth against the machine's read bandwidth, and the ratio against fp32;
// ends with the summary ratios (target: q4 decode >= 2.5x fp32).
//
//   quant_decode [--threads N] [--layers 24] [--no-lm-head] [--reps 5] [--bw-mib 512] [--portable]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_util.h"
#include "core/alloc.h"
#include "core/args.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/threads.h"
#include "quant/quant.h"

enum { C = 896, FF = 4864, KV = 128, V = 151936, PER_LAYER = 7 };

static inline uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

// A pseudo-random float weight in [-0.02, 0.02).
static float small_value(uint64_t key) { return ((float)(mix(key) >> 40) / (float)(1 << 24) - 0.5f) * 0.04f; }

// A weight of format f with pseudo-random contents (codes, scales ~0.02, codebooks).
static int make_weight(Weight *w, WeightFormat f, int rows, int cols, int group, uint64_t seed) {
    if (f == WF_F32) {
        memset(w, 0, sizeof *w);
        float *d = er_alloc(sizeof(float) * (size_t)rows * cols);
        if (!d)
            return ER_ENOMEM;
        size_t n = (size_t)rows * cols;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++)
            d[i] = small_value(seed + i);
        w->fmt = WF_F32;
        w->rows = rows;
        w->cols = cols;
        w->data = d;
        w->owned = d;
        return ER_OK;
    }
    ER_TRY(quant_weight_alloc(w, f, rows, cols, group, 0));
    size_t nb = (size_t)rows * weight_row_bytes(f, cols);
    uint8_t *d = (uint8_t *)w->data;
    if (f == WF_BF16) { // random bits would make NaNs and denormals: small values as the f32 weight has
        uint16_t *h = (uint16_t *)d;
        size_t n = (size_t)rows * cols;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++)
            h[i] = f32_to_bf16(small_value(seed + i));
    } else {
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < nb; i++)
            d[i] = (uint8_t)(mix(seed + i) & (f == WF_Q8 ? 0x7f : 0xff));
    }
    for (int r = 0; r < rows; r++) {
        if (f == WF_Q8 || f == WF_Q4)
            ((float *)w->scale)[r] = 0.02f / (f == WF_Q8 ? 127 : 7);
        if (f == WF_Q2LUT || f == WF_Q4LUT) {
            int nc = f == WF_Q2LUT ? 4 : 16;
            for (int j = 0; j < nc; j++)
                ((uint16_t *)w->lut)[r * nc + j] = f32_to_f16(0.01f * (j - 0.5f * (nc - 1)));
        }
    }
    if (f == WF_Q4G) {
        size_t ng = (size_t)rows * (cols / group);
        for (size_t i = 0; i < ng; i++) {
            ((uint16_t *)w->gscale)[i] = f32_to_f16(0.003f);
            ((uint16_t *)w->gzero)[i] = f32_to_f16(-0.02f);
        }
    }
    int rc = quant_tile(w); // q4 and q8 as the runtime lays it out (model_tile_for_decode)
    return rc < 0 ? rc : ER_OK;
}

typedef struct {
    const char *name;
    WeightFormat f;
    int group;
    double s1, s8; // seconds per token pass, N = 1 and N = 8
    double c1, c8; // CPU seconds of the same
    double bytes;
} Fmt;

static void shape_of(int i, int *rows, int *cols) {
    static const int R[PER_LAYER] = {C, KV, KV, C, FF, FF, C}, K[PER_LAYER] = {C, C, C, C, C, C, FF};
    if (i < 0) { // the lm_head
        *rows = V;
        *cols = C;
    } else {
        *rows = R[i % PER_LAYER];
        *cols = K[i % PER_LAYER];
    }
}

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// One weight pass per token: every matrix times N input rows. Best of reps, wall clock and CPU time
// of the process (on a machine shared with other work the CPU time shows what the kernels cost when
// they run; with more than one thread it includes OpenMP's spinning).
// portable: the reference kernels even where SIMD ones exist.
static int time_pass(Weight *ws, int nw, const float *x, float *out, int N, int portable, float *scratch, int reps,
                     double *best, double *best_cpu) {
    *best = *best_cpu = 1e30;
    for (int r = 0; r <= reps; r++) { // r = 0 warms up
        double t0 = time_now(), c0 = cpu_now();
        for (int i = 0; i < nw; i++)
            ER_TRY(portable ? quant_matmul_decode_portable(out, x, &ws[i], N, scratch)
                            : weight_matmul_forward(out, x, &ws[i], NULL, N, scratch, QUANT_INT8_PREFILL));
        double dt = time_now() - t0, dc = cpu_now() - c0;
        if (r > 0 && dt < *best)
            *best = dt;
        if (r > 0 && dc < *best_cpu)
            *best_cpu = dc;
    }
    return ER_OK;
}

// One row of the table: the weight pass of every matrix in format f, N = 1 and N = 8, against the fp32
// row f32 (measured first; f itself for that row).
static int bench_format(Fmt *f, const Fmt *f32, Weight *ws, int nw, int layers, const float *x, float *out, int portable,
                        float *scratch, int reps, double bw) {
    int rc = ER_OK;
    double n_weights = 0;
    f->bytes = 0;
    for (int i = 0; i < nw; i++) {
        int rows, cols;
        shape_of(i == layers * PER_LAYER ? -1 : i, &rows, &cols);
        ER_CHECK(make_weight(&ws[i], f->f, rows, cols, f->group, (uint64_t)i << 32));
        f->bytes += (double)weight_bytes(&ws[i]);
        n_weights += (double)rows * cols;
    }
    ER_CHECK(time_pass(ws, nw, x, out, 1, portable, scratch, reps, &f->s1, &f->c1));
    ER_CHECK(time_pass(ws, nw, x, out, 8, portable, scratch, reps, &f->s8, &f->c8));
    double gbs = f->bytes / f->s1 / 1e9;
    printf("%-6s %7.3f %9.1f %8.2f %9.2f %7.2f (%3.0f%%) %8.2f %8.2fx %10.2f\n", f->name, f->bytes * 8 / n_weights,
           f->bytes / 1e6, 1e3 * f->s1, 1 / f->s1, gbs, 100 * gbs / bw, 1e3 * f->s8, f32->s1 / f->s1,
           1e3 * f->c1);
    fflush(stdout);
done:
    for (int i = 0; i < nw; i++)
        weight_free(&ws[i]);
    return rc;
}

int main(int argc, char **argv) {
    int threads = 0, layers = 24, no_head = 0, reps = 5, bw_mib = 512, portable = 0;
    ArgSpec specs[] = {
        {"threads", ARG_INT, &threads, "threads (0 = all cores)", 0, 0, 4096},
        {"layers", ARG_INT, &layers, "transformer layers (Qwen2.5-0.5B: 24)", 0, 1, 1000},
        {"no-lm-head", ARG_FLAG, &no_head, "leave the 151936 x 896 lm_head out of the pass", 0, 0, 0},
        {"reps", ARG_INT, &reps, "timed passes per format and N (best is kept)", 0, 1, 1000},
        {"bw-mib", ARG_INT, &bw_mib, "bandwidth buffer size in MiB", 0, 64, 1 << 16},
        {"portable", ARG_FLAG, &portable, "use the portable kernels even where SIMD ones exist", 0, 0, 0},
    };
    int exit_status = bench_args("quant_decode", argc, argv, specs, (int)(sizeof specs / sizeof specs[0]), &threads);
    if (exit_status >= 0)
        return exit_status;
    char load[128];
    bench_load_average(load, sizeof load);
    printf("== quantized decode: weight pass of a Qwen2.5-0.5B-shaped model (%d layers%s), threads %d, %s kernels, "
           "load average %s ==\n",
           layers, no_head ? "" : " + lm_head", threads, quant_has_simd() && !portable ? quant_simd_name() : "portable", load);
    double bw = bench_read_bandwidth((size_t)bw_mib, 5);
    printf("memory read bandwidth: %.2f GB/s (best of 5 passes over %d MiB)\n", bw, bw_mib);
    fflush(stdout);

    int nw = layers * PER_LAYER + (no_head ? 0 : 1);
    Fmt fmts[] = {{.name = "f32", .f = WF_F32},
                  {.name = "bf16", .f = WF_BF16},
                  {.name = "q8", .f = WF_Q8},
                  {.name = "q4", .f = WF_Q4},
                  {.name = "q4g32", .f = WF_Q4G, .group = 32},
                  {.name = "q4g64", .f = WF_Q4G, .group = 64},
                  {.name = "q4g128", .f = WF_Q4G, .group = 128},
                  {.name = "q4lut", .f = WF_Q4LUT},
                  {.name = "q2lut", .f = WF_Q2LUT}};
    int nf = (int)(sizeof fmts / sizeof fmts[0]);
    Weight *ws = er_calloc((size_t)nw, sizeof(Weight));
    float *x = er_alloc(sizeof(float) * 8 * FF), *out = er_alloc(sizeof(float) * 8 * (size_t)V);
    float *scratch = er_alloc(sizeof(float) * quant_scratch_floats(FF)); // FF: the widest input
    int rc = ER_OK;
    if (!ws || !x || !out || !scratch)
        ER_CHECK(er_error(ER_ENOMEM, "out of memory"));
    for (int i = 0; i < 8 * FF; i++)
        x[i] = (float)(mix((uint64_t)i) >> 40) / (float)(1 << 24) - 0.5f;
    printf("%-6s %7s %9s %8s %9s %14s %8s %9s %10s\n", "format", "bits/w", "MB/token", "N=1 ms", "tokens/s",
           "GB/s (of bw)", "N=8 ms", "vs f32", "cpu ms N=1");
    for (int fi = 0; fi < nf; fi++)
        ER_CHECK(bench_format(&fmts[fi], &fmts[0], ws, nw, layers, x, out, portable, scratch, reps, bw));
done:
    er_free(ws);
    er_free(x);
    er_free(out);
    er_free(scratch);
    if (rc < 0)
        return bench_fail("quant_decode");
    printf("\nsummary (N = 1 weight pass per token; N = 8 in parentheses):\n");
    for (int fi = 1; fi < nf; fi++)
        printf("  %-6s decode = %5.2fx fp32 (%5.2fx)%s\n", fmts[fi].name, fmts[0].s1 / fmts[fi].s1,
               fmts[0].s8 / fmts[fi].s8,
               fmts[fi].f == WF_Q4 ? (fmts[0].s1 / fmts[fi].s1 >= 2.5 ? "   target >= 2.5x: met" : "   target >= 2.5x: NOT MET")
                                   : "");
    return 0;
}
