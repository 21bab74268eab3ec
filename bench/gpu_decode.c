// Decode on a device against its weight-read bound: a Qwen2.5-shaped model (random weights, the base in bf16
// as a GPU holds a frozen one) placed on --device, N samples sharing a prompt decoded through the engine (no
// tokenizer: EOS stopping off, every sample decodes exactly --new-tokens) for each N of --rows; the device's
// memory bandwidth measured in the same run (a copy within the device of a buffer far larger than its caches:
// bytes read plus bytes written over the time, best of several); the bound is that bandwidth over the bytes of
// weights one decode step reads (every matrix in bf16 and the LM head). One JSON line per N, then a summary:
// the share of the bound at N = 1 and the tokens/s of the largest N over N = 1's.
//   gpu_decode --shape 0.5b|1.5b|7b|small [--device cuda] [--rows 1,8,64] [--prompt-tokens 128] [--new-tokens 32]
#include <stdio.h>
#include <string.h>

#include "bench/bench_util.h"
#include "infer/engine.h"
#include "model/backend.h"
#include "model/model.h"

// Bytes of weights one decode step reads: the layers' matrices in bf16 (their vectors are noise beside them)
// and the LM head (the embedding, when tied).
static double step_weight_bytes(const ModelConfig *c) {
    double q = (double)c->NH * c->HS, kv = (double)c->NKV * c->HS;
    double layer = (double)c->C * q * 2 + (double)c->C * kv * 2 + 3.0 * c->C * c->FF;
    return 2.0 * (layer * c->L + (double)c->V * c->C);
}

// Best-of-5 bandwidth in GB/s of a copy of `mib` MiB within backend be (read + write), 0 when it does not fit.
static double device_bandwidth(Backend *be, size_t mib) {
    size_t bytes = mib << 20;
    char *a = be->ops->alloc(be, 2 * bytes);
    if (!a)
        return 0;
    double best = 0;
    float sink;
    if (be->ops->zero(be, a, 2 * bytes) == ER_OK && be->ops->download(be, &sink, a, sizeof sink) == ER_OK)
        for (int r = 0; r < 5; r++) {
            double t0 = time_now();
            if (be->ops->copy(be, a + bytes, a, bytes) < 0 || be->ops->download(be, &sink, a + bytes, sizeof sink) < 0)
                break;
            double gbs = 2.0 * (double)bytes / (time_now() - t0) / 1e9;
            best = gbs > best ? gbs : best;
        }
    be->ops->free(be, a);
    return best;
}

int main(int argc, char **argv) {
    const char *shape = "small", *device = "cuda", *rows_s = "1,8,64";
    int prompt_tokens = 128, new_tokens = 32, threads = 0, mib = 1024;
    ArgSpec specs[] = {
        {"shape", ARG_STR, &shape, "small (hidden 256, 4 layers), 0.5b, 1.5b or 7b (the Qwen2.5 shapes)", 0, 0, 0},
        {"device", ARG_STR, &device, "cpu, cuda or cuda:N", 0, 0, 0},
        {"rows", ARG_STR, &rows_s, "sample counts N, comma-separated", 0, 0, 0},
        {"prompt-tokens", ARG_INT, &prompt_tokens, "prompt positions", 0, 1, 1 << 16},
        {"new-tokens", ARG_INT, &new_tokens, "tokens each sample decodes", 0, 2, 1 << 16},
        {"bw-mib", ARG_INT, &mib, "MiB copied to measure the bandwidth", 0, 1, 1 << 16},
        {"threads", ARG_INT, &threads, "threads (0 = all cores)", 0, 0, 4096},
    };
    int exit_status = bench_args("gpu_decode", argc, argv, specs, sizeof specs / sizeof specs[0], &threads);
    if (exit_status >= 0)
        return exit_status;
    int rows[16], n_rows, rc = ER_OK;
    ModelConfig c;
    Backend *be = NULL;
    Model host = {0}, placed = {0}, *m = &host;
    Engine e = {0};
    GenSample *out = NULL;
    int *prompt = NULL;
    ER_CHECK(bench_parse_counts("rows", rows_s, 1, 1024, rows, 16, &n_rows));
    ER_CHECK(bench_shape_config(shape, &c));
    int max_rows = 1;
    for (int i = 0; i < n_rows; i++)
        max_rows = rows[i] > max_rows ? rows[i] : max_rows;
    ER_CHECK(backend_open(&be, device));
    ER_CHECK(model_build_random_bf16(&host, &c, 0.02f, 1));
    host.trainable = 0; // a frozen base: bf16 on a GPU
    if (be->kind != BACKEND_CPU) {
        ER_CHECK(model_to_backend(&placed, &host, be));
        m = &placed;
    }
    size_t limit = 0;
    ER_CHECK(be->ops->mem_available(be, &limit));
    ER_CHECK(engine_init(&e, m, NULL, KV_F32, max_rows, prompt_tokens + new_tokens + 1, 128, limit));
    if (!(out = er_calloc((size_t)max_rows, sizeof *out)))
        ER_CHECK(ER_ENOMEM);
    double bw = device_bandwidth(be, (size_t)mib), wb = step_weight_bytes(&c), bound = bw * 1e9 / wb;
    char load[64];
    bench_load_average(load, sizeof load);
    if (!(prompt = er_alloc(sizeof(int) * (size_t)prompt_tokens)))
        ER_CHECK(ER_ENOMEM);
    for (int i = 0; i < prompt_tokens; i++)
        prompt[i] = (int)((i * 2654435761u) % (unsigned)c.V);
    double tps1 = 0, tps_last = 0;
    for (int i = 0; i < n_rows; i++) {
        GenConfig g;
        gen_config_default(&g);
        g.n_samples = rows[i];
        g.max_new = new_tokens;
        g.sampler.temperature = 0;
        GenStats st;
        double best = 0;
        for (int rep = 0; rep < 2 && rc == ER_OK; rep++) { // the first also warms up (the prompt cached after it)
            rc = engine_generate(&e, prompt, prompt_tokens, &g, NULL, NULL, out, &st);
            if (rc == ER_OK && st.decode_s > 0)
                best = (new_tokens - 1) / st.decode_s > best ? (new_tokens - 1) / st.decode_s : best;
            gen_samples_free(out, rows[i]);
        }
        ER_CHECK(rc);
        if (i == 0)
            tps1 = best;
        tps_last = best * rows[i];
        printf("{\"bench\": \"gpu_decode\", \"device\": \"%s\", \"device_name\": \"%s\", \"shape\": \"%s\", \"rows\": %d, "
               "\"step_ms\": %.3f, \"tokens_per_s\": %.1f, \"stream_tokens_per_s\": %.1f, \"weight_bytes\": %.0f, "
               "\"bandwidth_gbs\": %.1f, \"bound_steps_per_s\": %.1f, \"share_of_bound\": %.3f, \"load\": \"%s\"}\n",
               be->name, be->device, shape, rows[i], 1e3 / best, best * rows[i], best, wb, bw, bound, best / bound,
               load);
        fflush(stdout);
    }
    printf("gpu_decode %s on %s: N=%d at %.0f%% of the weight-read bound (%.0f GB/s over %.2f GB a step); N=%d gives "
           "%.1fx N=%d's tokens/s\n",
           shape, be->device, rows[0], 100 * tps1 / bound, bw, wb / 1e9, rows[n_rows - 1],
           tps1 > 0 ? tps_last / (tps1 * rows[0]) : 0, rows[0]);
done:
    er_free(prompt);
    er_free(out);
    engine_free(&e);
    model_free(&placed);
    model_free(&host);
    if (be)
        backend_close(be);
    return rc < 0 ? bench_fail("gpu_decode") : 0;
}
