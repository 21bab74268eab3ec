// The integer multiply-add peak of this machine's int8 dot-product instruction on all threads: vpdpbusd on
// 16 lanes (AVX512-VNNI), else vpmaddubsw + vpmaddwd + vpaddd on 8 (AVX2), twelve independent chains per thread
// so that latency does not set the pace; the best of --reps passes of about 0.3 s. The physical limit the
// int8-input products (prefill and decode of the quantized formats) are measured against in bench/run_llama.sh.
//
//   int8_peak [--threads N] [--reps 3]      prints {"isa": ..., "threads": N, "gmacs": X}
#include <stdio.h>
#include <time.h>

#include "bench/bench_util.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define CHAINS 12
#define ITERS 20000000L

// int8 multiply-adds one thread does in ITERS rounds of CHAINS instructions; sink keeps the sums alive.
static double one_thread(int *sink) {
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
    __m512i acc[CHAINS], u = _mm512_set1_epi8(1), x = _mm512_set1_epi8(2);
    for (int c = 0; c < CHAINS; c++)
        acc[c] = _mm512_setzero_si512();
    for (long i = 0; i < ITERS; i++)
#pragma GCC unroll 12
        for (int c = 0; c < CHAINS; c++)
            acc[c] = _mm512_dpbusd_epi32(acc[c], u, x);
    for (int c = 0; c < CHAINS; c++)
        *sink += _mm512_reduce_add_epi32(acc[c]);
    return (double)ITERS * CHAINS * 64;
#elif defined(__AVX2__)
    __m256i acc[CHAINS], u = _mm256_set1_epi8(1), x = _mm256_set1_epi8(2), one = _mm256_set1_epi16(1);
    for (int c = 0; c < CHAINS; c++)
        acc[c] = _mm256_setzero_si256();
    for (long i = 0; i < ITERS / 4; i++)
#pragma GCC unroll 12
        for (int c = 0; c < CHAINS; c++)
            acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), one));
    for (int c = 0; c < CHAINS; c++)
        *sink += _mm256_extract_epi32(acc[c], 0);
    return (double)(ITERS / 4) * CHAINS * 32;
#else
    (void)sink;
    return 0.0;
#endif
}

int main(int argc, char **argv) {
    int threads = 0, reps = 3;
    ArgSpec specs[] = {
        {"threads", ARG_INT, &threads, "threads (0 = all cores)", 0, 0, 4096},
        {"reps", ARG_INT, &reps, "passes; the best is reported", 0, 1, 100},
    };
    int rc = bench_args("int8_peak", argc, argv, specs, 2, &threads);
    if (rc >= 0)
        return rc;
    const char *isa =
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
        "AVX512-VNNI vpdpbusd";
#elif defined(__AVX2__)
        "AVX2 vpmaddubsw";
#else
        "none";
#endif
    double best = 0;
    int sink = 0;
    for (int r = 0; r < reps; r++) {
        double macs = 0, t = now();
#pragma omp parallel reduction(+ : macs, sink) num_threads(threads)
        macs += one_thread(&sink);
        t = now() - t;
        best = macs / t > best ? macs / t : best;
    }
    printf("{\"isa\": \"%s\", \"threads\": %d, \"gmacs\": %.1f, \"sink\": %d}\n", isa, threads, best / 1e9, sink & 1);
    return 0;
}
