// erinfer memory's exact vector scan (erinfer/memory_search.c) against the machine's read bandwidth: a store of
// N random int8 vectors of DIM dims is built in a scratch SQLite file, the first vector search loads them into
// memory, and the best of --reps searches (vector only, top 10) is the scan's time; bytes scanned (codes and
// scales) per second over bench_read_bandwidth's GB/s is the ratio. Prints one JSON line and one for people.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "core/rng.h"
#include "erinfer/memory.h"

static int build_store(MemStore *s, int n, int dim) {
    const int batch = 2000;
    float *v = er_alloc(sizeof(float) * (size_t)batch * (size_t)dim);
    MemItem *it = er_calloc((size_t)batch, sizeof *it);
    ErRng r;
    int rc = ER_OK;
    rng_seed(&r, 1024);
    if (!v || !it)
        rc = ER_ENOMEM;
    for (int i0 = 0; rc == ER_OK && i0 < n; i0 += batch) {
        int m = n - i0 < batch ? n - i0 : batch;
        for (int i = 0; i < m; i++) {
            float *x = v + (size_t)i * (size_t)dim;
            for (int j = 0; j < dim; j++)
                x[j] = rng_normal(&r);
            it[i] = (MemItem){"entry", NULL, x, dim, -1.0};
        }
        rc = mem_add_items(s, it, m, NULL);
    }
    er_free(v), er_free(it);
    return rc;
}

static int search_once(MemStore *s, const float *q, int dim, double *secs) {
    MemHit h[10];
    int n = 0;
    MemQuery mq = {NULL, q, dim, NULL, 10};
    double t0 = time_now();
    int rc = mem_search(s, &mq, h, 10, &n);
    *secs = time_now() - t0;
    mem_hits_free(h, n);
    return rc;
}

int main(int argc, char **argv) {
    int n = 100000, dim = 1024, reps = 3, threads = 0;
    ArgSpec specs[] = {
        {"n", ARG_INT, &n, "entries", 0, 1, 10000000},
        {"dim", ARG_INT, &dim, "dimensions", 0, 1, MEM_MAX_DIM},
        {"reps", ARG_INT, &reps, "searches timed (the best counts)", 0, 1, 100},
        {"threads", ARG_INT, &threads, "threads (0 = all cores)", 0, 0, 1024},
    };
    int st = bench_args("memory_scan", argc, argv, specs, 4, &threads);
    if (st >= 0)
        return st;
    char path[256], load[64];
    snprintf(path, sizeof path, "/tmp/er_memory_scan_%d.db", (int)getpid());
    MemStore *s = NULL;
    float *q = NULL;
    double t_build = time_now(), t_load, best = INFINITY, t;
    if (mem_open(&s, path, 1, dim, MEM_VEC_INT8) < 0 || build_store(s, n, dim) < 0)
        goto fail;
    t_build = time_now() - t_build;
    if (!(q = er_alloc(sizeof(float) * (size_t)dim)))
        goto fail;
    ErRng r;
    rng_seed(&r, 7);
    for (int j = 0; j < dim; j++)
        q[j] = rng_normal(&r);
    if (search_once(s, q, dim, &t_load) < 0)
        goto fail;
    for (int i = 0; i < reps; i++) {
        if (search_once(s, q, dim, &t) < 0)
            goto fail;
        best = t < best ? t : best;
    }
    er_free(q);
    q = NULL;
    const char *kernel;
    mem_scan_kernel(NULL, &kernel);
    double bytes = (double)n * (double)((dim + MEM_SCAN_ALIGN - 1) / MEM_SCAN_ALIGN * MEM_SCAN_ALIGN + 4);
    double gbs = bytes / best / 1e9, bw = bench_read_bandwidth(512, 3);
    bench_load_average(load, sizeof load);
    printf("{\"bench\": \"memory_scan\", \"n\": %d, \"dim\": %d, \"threads\": %d, \"kernel\": \"%s\", \"build_s\": %.2f, "
           "\"first_search_s\": %.4f, \"search_ms\": %.3f, \"scan_gb_s\": %.2f, \"read_bw_gb_s\": %.2f, "
           "\"load\": \"%s\"}\n",
           n, dim, threads, kernel, t_build, t_load, best * 1e3, gbs, bw, load);
    printf("memory scan: %d x %d int8 (%s, %d threads): best of %d searches %.2f ms = %.2f GB/s scanned, "
           "%.0f%% of the %.2f GB/s read bandwidth (first search, loading the vectors: %.3f s; load %s)\n",
           n, dim, kernel, threads, reps, best * 1e3, gbs, 100.0 * gbs / bw, bw, t_load, load);
    mem_close(s);
    unlink(path);
    return 0;
fail:
    er_free(q);
    mem_close(s);
    unlink(path);
    return bench_fail("memory_scan");
}
