// Decode speed against the machine's memory bandwidth, on a random Qwen2.5-0.5B-shaped model and a
// tiny one, through the engine (infer/engine.h) with EOS stopping off so every run decodes exactly
// the asked number of tokens:
//   - memory read bandwidth: multi-threaded streaming sum over a buffer far larger than the caches,
//     best of several passes;
//   - single-stream decode tokens/s as a share of the bound bandwidth / weight bytes read per token
//     (every matrix once plus the lm_head; the embedding contributes one row);
//   - decode step time with N = 8 samples relative to N = 1 (one weight pass serves all rows, so
//     the target is <= 1.5x);
//   - KV int8 vs fp32 at a long-ish context: decode speed and KV bytes.
// Ends with one summary block of ratios.
//
//   decode [--threads N] [--context 1024] [--new-tokens 12] [--bw-mib 1024] [--skip-big]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "core/alloc.h"
#include "core/args.h"
#include "core/error.h"
#include "core/progress.h"
#include "infer/bench.h"
#include "infer/engine.h"
#include "model/model.h"

// Bytes of weights one decode step reads for one token: every layer's matrices and vectors, the
// final norm, the lm_head, and one embedding row.
static double weight_bytes_per_token(const Model *m) {
    const ModelConfig *c = &m->cfg;
    double b = 0;
    for (int l = 0; l < c->L; l++) {
        const LayerWeights *w = &m->layers[l];
        b += (double)weight_bytes(&w->wq) + weight_bytes(&w->wk) + weight_bytes(&w->wv) + weight_bytes(&w->wo);
        b += (double)weight_bytes(&w->wgate) + weight_bytes(&w->wup) + weight_bytes(&w->wdown);
        b += 4.0 * 2 * c->C; // norms
        if (w->bq)
            b += 4.0 * (c->NH + 2 * c->NKV) * c->HS;
    }
    b += 4.0 * c->C; // final norm
    b += (double)weight_bytes(&m->lm_head);
    b += (double)weight_bytes(&m->embed) / c->V; // one row
    return b;
}

typedef struct {
    double step_s;   // seconds per decode step (one forward for all live rows)
    double prefill_s;
    size_t kv_bytes; // peak KV bytes in use
    long tokens;
} DecodeRun;

// Best of `reps` runs of N samples x T new tokens after `prompt` (the prompt stays cached between
// reps, so only the first pays the full prefill; prefill_s is the first run's).
static int decode_best(Engine *e, const int *prompt, int P, int N, int T, int reps, DecodeRun *out) {
    GenConfig g;
    gen_config_default(&g);
    g.n_samples = N;
    g.max_new = T;
    g.sampler.temperature = 1.0f;
    g.seed = 99;
    GenSample *s = er_calloc((size_t)N, sizeof *s);
    if (!s)
        return ER_ENOMEM;
    memset(out, 0, sizeof *out);
    out->step_s = 1e30;
    int rc = ER_OK;
    for (int r = 0; r < reps; r++) {
        GenStats st;
        ER_CHECK(engine_generate(e, prompt, P, &g, NULL, NULL, s, &st));
        int steps = bench_decode_steps(s, N);
        double step = steps > 0 ? st.decode_s / steps : 0;
        if (step < out->step_s)
            out->step_s = step;
        if (r == 0)
            out->prefill_s = st.prefill_s;
        out->kv_bytes = st.kv_bytes;
        out->tokens = st.generated_tokens;
        gen_samples_free(s, N);
    }
done:
    er_free(s);
    return rc;
}

typedef struct {
    double tps1, bound_tps, ratio_n8, kv_speed_ratio, kv_bytes_ratio, prefill_tps;
    size_t kv_f32, kv_i8;
} ShapeResult;

static int bench_shape(const char *name, const ModelConfig *cfg, double bw_gbs, int ctx, int T, int reps,
                       ShapeResult *res) {
    int rc = ER_OK, P = 32;
    Model m = {0};
    Engine e = {0};
    int *prompt = NULL;
    double t0 = time_now();
    ER_CHECK(model_build_random(&m, cfg, 0.02f, 1));
    m.cfg.eos_id = -1; // no tokenizer and no eos id: nothing stops a sample early
    double bytes = weight_bytes_per_token(&m);
    printf("\n== %s: hidden %d, %d layers, %d/%d heads, ff %d, vocab %d (built in %.1f s) ==\n", name, cfg->C, cfg->L,
           cfg->NH, cfg->NKV, cfg->FF, cfg->V, time_now() - t0);
    printf("weights read per token: %.1f MB -> bound %.1f tokens/s at %.1f GB/s\n", bytes / 1e6, bw_gbs * 1e9 / bytes,
           bw_gbs);
    fflush(stdout);
    prompt = er_alloc(sizeof(int) * (size_t)(ctx > P ? ctx : P));
    if (!prompt) {
        rc = ER_ENOMEM;
        goto done;
    }
    for (int i = 0; i < (ctx > P ? ctx : P); i++)
        prompt[i] = (int)((17 + 7919L * i) % cfg->V);

    DecodeRun one, eight, warm, f32, i8;
    ER_CHECK(engine_init(&e, &m, NULL, KV_F32, 8, P + T, 128, 0));
    ER_CHECK(decode_best(&e, prompt, P, 1, 3, 1, &warm)); // threads, pages, caches
    ER_CHECK(decode_best(&e, prompt, P, 1, T, reps, &one));
    ER_CHECK(decode_best(&e, prompt, P, 8, T, reps, &eight));
    engine_free(&e);
    res->tps1 = 1.0 / one.step_s;
    res->bound_tps = bw_gbs * 1e9 / bytes;
    res->ratio_n8 = eight.step_s / one.step_s;
    printf("N=1: %.2f ms/step = %.2f tokens/s (%.0f%% of the bound); N=8: %.2f ms/step = %.1f tokens/s total\n",
           1e3 * one.step_s, res->tps1, 100 * res->tps1 / res->bound_tps, 1e3 * eight.step_s, 8 / eight.step_s);
    fflush(stdout);
    for (int k = 0; k < 2; k++) {
        DecodeRun *d = k == 0 ? &f32 : &i8;
        ER_CHECK(engine_init(&e, &m, NULL, k == 0 ? KV_F32 : KV_INT8, 1, ctx + T, 128, 0));
        ER_CHECK(decode_best(&e, prompt, ctx, 1, T, reps, d));
        engine_free(&e);
        printf("context %d, KV %-4s: prefill %.2f s (%.0f tokens/s), decode %.2f ms/step, KV %.2f MiB\n", ctx,
               k == 0 ? "f32" : "int8", d->prefill_s, ctx / d->prefill_s, 1e3 * d->step_s, d->kv_bytes / 1048576.0);
        fflush(stdout);
    }
    res->kv_speed_ratio = f32.step_s / i8.step_s;
    res->kv_bytes_ratio = (double)i8.kv_bytes / (double)f32.kv_bytes;
    res->prefill_tps = ctx / f32.prefill_s;
    res->kv_f32 = f32.kv_bytes;
    res->kv_i8 = i8.kv_bytes;
done:
    engine_free(&e);
    er_free(prompt);
    model_free(&m);
    return rc;
}

static void print_summary(const char *name, const ShapeResult *r, int ctx) {
    printf("%-5s single-stream decode %8.2f tokens/s = %5.1f%% of the bandwidth bound (%.2f tokens/s)\n", name, r->tps1,
           100 * r->tps1 / r->bound_tps, r->bound_tps);
    printf("%-5s step time N=8 / N=1 = %.2fx (target <= 1.5x: %s)\n", name, r->ratio_n8,
           r->ratio_n8 <= 1.5 ? "met" : "NOT MET");
    printf("%-5s context %d: decode speed int8/f32 = %.2fx, KV bytes int8/f32 = %.3f (%.2f vs %.2f MiB)\n", name, ctx,
           r->kv_speed_ratio, r->kv_bytes_ratio, r->kv_i8 / 1048576.0, r->kv_f32 / 1048576.0);
}

int main(int argc, char **argv) {
    int threads = 0, ctx = 1024, T = 12, bw_mib = 1024, skip_big = 0;
    ArgSpec specs[] = {
        {"threads", ARG_INT, &threads, "threads (0 = all cores)", 0, 0, 4096},
        {"context", ARG_INT, &ctx, "prompt tokens for the KV f32 vs int8 comparison", 0, 33, 32768},
        {"new-tokens", ARG_INT, &T, "decode steps per 0.5B measurement (the tiny model does 8x more)", 0, 3, 4096},
        {"bw-mib", ARG_INT, &bw_mib, "bandwidth buffer size in MiB", 0, 64, 1 << 16},
        {"skip-big", ARG_FLAG, &skip_big, "only the tiny model", 0, 0, 0},
    };
    int exit_status = bench_args("decode", argc, argv, specs, sizeof specs / sizeof specs[0], &threads);
    if (exit_status >= 0)
        return exit_status;
    char load[128];
    bench_load_average(load, sizeof load);
    printf("== decode vs memory bandwidth (threads %d, load average %s) ==\n", threads, load);
    double bw = bench_read_bandwidth((size_t)bw_mib, 5);
    printf("memory read bandwidth: %.2f GB/s (best of 5 passes over %d MiB, %d threads)\n", bw, bw_mib, threads);
    fflush(stdout);

    ModelConfig tiny = {.arch = ARCH_QWEN2, .C = 64, .FF = 256, .L = 2, .NH = 4, .NKV = 2, .HS = 16, .V = 512,
                        .max_pos = 32768, .rope_theta = 10000.0f, .eps = 1e-6f, .tied = 1, .qkv_bias = 1,
                        .dtype = DT_F32, .bos_id = -1, .eos_id = -1};
    ModelConfig big = {.arch = ARCH_QWEN2, .C = 896, .FF = 4864, .L = 24, .NH = 14, .NKV = 2, .HS = 64, .V = 151936,
                       .max_pos = 32768, .rope_theta = 1e6f, .eps = 1e-6f, .tied = 1, .qkv_bias = 1,
                       .dtype = DT_F32, .bos_id = -1, .eos_id = -1};
    ShapeResult rt = {0}, rb = {0};
    if (bench_shape("tiny", &tiny, bw, ctx, 8 * T, 5, &rt) < 0 ||
        (!skip_big && bench_shape("0.5b", &big, bw, ctx, T, 3, &rb) < 0))
        return bench_fail("decode");
    printf("\n== decode summary (threads %d, load average %s, bandwidth %.2f GB/s) ==\n", threads, load, bw);
    if (!skip_big)
        print_summary("0.5b", &rb, ctx);
    print_summary("tiny", &rt, ctx);
    return 0;
}
