// Shared by the benchmarks: the command line (flags, threads, the one-line error), the machine's read
// bandwidth (the bound a weight pass is measured against) and the load average printed next to every
// result, since a busy machine explains a slow one.
#ifndef BENCH_BENCH_UTIL_H
#define BENCH_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/args.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/threads.h"
#include "model/config.h"

// The Qwen2.5 shapes (hidden, layers, heads, kv heads, intermediate; 0.5B ties its embedding).
static inline int bench_shape_config(const char *shape, ModelConfig *c) {
    *c = (ModelConfig){.arch = ARCH_QWEN2, .V = 151936, .max_pos = 32768, .rope_theta = 1e6f, .eps = 1e-6f,
                       .tied = 1, .qkv_bias = 1, .dtype = DT_F32, .bos_id = -1, .eos_id = -1};
    static const struct {
        const char *name;
        int C, L, NH, NKV, FF, tied;
    } shapes[] = {
        {"small", 256, 4, 4, 2, 1024, 1}, {"0.5b", 896, 24, 14, 2, 4864, 1},
        {"1.5b", 1536, 28, 12, 2, 8960, 1}, {"7b", 3584, 28, 28, 4, 18944, 0},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (strcmp(shape, shapes[i].name) == 0) {
            c->C = shapes[i].C;
            c->L = shapes[i].L;
            c->NH = shapes[i].NH;
            c->NKV = shapes[i].NKV;
            c->FF = shapes[i].FF;
            c->tied = shapes[i].tied;
            c->HS = c->C / c->NH;
            return ER_OK;
        }
    return er_error(ER_EINVAL, "--shape must be small, 0.5b, 1.5b or 7b, not '%s'", shape);
}

// A comma-separated list of counts ("1,8,64") given as --flag into out (at most cap of them, each lo..hi).
static inline int bench_parse_counts(const char *flag, const char *s, int lo, int hi, int *out, int cap, int *count) {
    *count = 0;
    for (const char *p = s; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < lo || v > hi || *count == cap || (*end && *end != ','))
            return er_error(ER_EINVAL, "--%s: expected up to %d counts of %d..%d separated by commas, got \"%s\"", flag,
                            cap, lo, hi, s);
        out[(*count)++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return *count ? ER_OK : er_error(ER_EINVAL, "--%s is empty", flag);
}

// Prints "<prog>: <er_last_error()>" on stderr and returns the exit status 1.
static inline int bench_fail(const char *prog) {
    fprintf(stderr, "%s: %s\n", prog, er_last_error());
    return 1;
}

// Parses a benchmark's flags ("<prog> [flags]") and sets *threads to the threads now in use (0 asks for
// all cores). Returns -1 to go on, else the exit status: 0 after --help, 1 after the error line.
static inline int bench_args(const char *prog, int argc, char **argv, const ArgSpec *specs, int n, int *threads) {
    char usage[128];
    snprintf(usage, sizeof usage, "%s [flags]", prog);
    int rc = args_parse(argc, argv, specs, n, usage);
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0)
        return bench_fail(prog);
    *threads = threads_set(*threads);
    return -1;
}

// Best-of-`reps` read bandwidth in GB/s over `mib` MiB, all threads streaming; 0 when out of memory.
static inline double bench_read_bandwidth(size_t mib, int reps) {
    size_t n = mib * 1024 * 1024 / sizeof(float);
    float *buf = er_alloc(n * sizeof(float));
    if (!buf)
        return 0;
    // First touch by the threads that read it later (pages land near them).
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        buf[i] = (float)(i & 7);
    double best = 0;
    volatile float sink = 0;
    for (int r = 0; r < reps; r++) {
        float s = 0;
        double t0 = time_now();
#pragma omp parallel for simd schedule(static) reduction(+ : s)
        for (size_t i = 0; i < n; i++)
            s += buf[i];
        double dt = time_now() - t0;
        sink += s;
        double gbs = (double)(n * sizeof(float)) / dt / 1e9;
        if (gbs > best)
            best = gbs;
    }
    (void)sink;
    er_free(buf);
    return best;
}

// The three load averages from /proc/loadavg into buf ("?" where it cannot be read).
static inline void bench_load_average(char *buf, size_t n) {
    snprintf(buf, n, "?");
    FILE *fp = fopen("/proc/loadavg", "r");
    if (!fp)
        return;
    if (!fgets(buf, (int)n, fp))
        snprintf(buf, n, "?");
    char *sp = buf;
    for (int k = 0; k < 3 && sp; k++)
        sp = strchr(sp + 1, ' ');
    if (sp)
        *sp = 0;
    fclose(fp);
}

#endif
