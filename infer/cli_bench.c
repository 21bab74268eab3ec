// erinfer bench: time to first token, decode speed and KV memory of a model dir for N = 1, 2, 4, 8
// parallel samples sharing one prompt, with the KV cache in fp32 and in int8. The engine runs with
// EOS stopping off (no tokenizer, no eos id), so every sample decodes exactly --new-tokens tokens;
// the table still reports the tokens actually generated.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/args.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/threads.h"
#include "data/tokenizer.h"
#include "infer/cli.h"
#include "infer/engine.h"
#include "lora/peft.h"
#include "model/model.h"

// A prompt of exactly n tokens: ordinary text repeated when the dir has a tokenizer, else a fixed
// pattern of ids.
static int bench_prompt(const char *dir, int V, int n, int **out) {
    int *ids = er_alloc(sizeof(int) * (size_t)n);
    if (!ids)
        return ER_ENOMEM;
    Tokenizer *tok = NULL;
    int *text_ids = NULL, n_text = 0;
    static const char text[] = "The quick brown fox jumps over the lazy dog while seven ducks swim in the pond. ";
    if (tok_load(&tok, dir) == ER_OK)
        tok_encode(tok, text, strlen(text), &text_ids, &n_text);
    er_clear_error();
    for (int i = 0; i < n; i++) {
        int id = n_text > 0 ? text_ids[i % n_text] : (int)((13 + 7919L * i) % V);
        ids[i] = id < V ? id : id % V;
    }
    er_free(text_ids);
    tok_free(tok);
    *out = ids;
    return ER_OK;
}

typedef struct {
    double ttft_s, step_s, stream_tps, total_tps;
    long tokens;
    size_t kv_bytes;
} BenchRow;

static int bench_run(Model *m, const LoraAdapter *ad, KvType kv, int N, const int *prompt, int P, int T,
                     BenchRow *row) {
    Engine e;
    ER_TRY(engine_init(&e, m, NULL, kv, N, P + T, 128, 0));
    GenConfig g;
    gen_config_default(&g);
    g.n_samples = N;
    g.max_new = T;
    g.sampler.temperature = 1.0f; // fixed-seed sampling: the samples differ, as they do in use
    g.seed = 1234;
    g.adapter = ad;
    GenSample *out = er_calloc((size_t)N, sizeof *out);
    GenStats st;
    int rc = out ? engine_generate(&e, prompt, P, &g, NULL, NULL, out, &st) : ER_ENOMEM;
    if (rc == ER_OK) {
        int steps = 0; // forward passes after the first token: the longest sample's tokens - 1
        for (int i = 0; i < N; i++)
            if (out[i].n_tokens - 1 > steps)
                steps = out[i].n_tokens - 1;
        long decoded = st.generated_tokens - N; // the first token of each sample comes from the prefill
        row->ttft_s = st.ttft_s;
        row->step_s = steps > 0 ? st.decode_s / steps : 0;
        row->stream_tps = row->step_s > 0 ? 1.0 / row->step_s : 0;
        row->total_tps = st.decode_s > 0 ? decoded / st.decode_s : 0;
        row->tokens = st.generated_tokens;
        row->kv_bytes = st.kv_bytes;
        gen_samples_free(out, N);
    }
    er_free(out);
    engine_free(&e);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    const char *dir = NULL, *adapter_dir = NULL;
    int P = 128, T = 32, threads = 0;
    ArgSpec specs[] = {
        {"model", ARG_STR, &dir, "model dir (config.json, safetensors; tokenizer.json optional)", 1, 0, 0},
        {"adapter", ARG_STR, &adapter_dir, "LoRA adapter dir (PEFT layout), on while decoding", 0, 0, 0},
        {"prompt-tokens", ARG_INT, &P, "synthetic prompt length", 0, 1, 1 << 20},
        {"new-tokens", ARG_INT, &T, "tokens generated per sample (EOS does not stop them)", 0, 2, 1 << 20},
        {"threads", ARG_INT, &threads, "threads (0 = all cores)", 0, 0, 4096},
    };
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof specs[0],
                        "erinfer bench --model DIR [--prompt-tokens P] [--new-tokens T] [--threads N]");
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0)
        return cli_fail("bench");
    int nthreads = threads_set(threads);

    Model m;
    if (model_load(&m, dir, 0) < 0)
        return cli_fail("bench");
    m.cfg.eos_id = -1; // no EOS stop: every run decodes the same number of tokens
    LoraAdapter ad, *adp = NULL;
    if (adapter_dir) {
        LoraShape shape = {m.cfg.L, m.cfg.C, m.cfg.NH * m.cfg.HS, m.cfg.NKV * m.cfg.HS, m.cfg.FF};
        if (peft_load(&ad, adapter_dir, &shape, 0) < 0) {
            model_free(&m);
            return cli_fail("bench");
        }
        adp = &ad;
    }
    int *prompt = NULL;
    rc = bench_prompt(dir, m.cfg.V, P, &prompt);
    // Warm-up: brings the mmapped weights into memory so the first row does not pay for it.
    BenchRow warm;
    if (rc == ER_OK)
        rc = bench_run(&m, adp, KV_F32, 1, prompt, P < 8 ? P : 8, 2, &warm);
    if (rc == ER_OK) {
        printf("erinfer bench: %s, %d layers, hidden %d, vocab %d, prompt %d tokens, %d new tokens per sample, "
               "%d threads\n", dir, m.cfg.L, m.cfg.C, m.cfg.V, P, T, nthreads);
        printf("%-5s %3s %9s %9s %11s %11s %7s %11s %9s\n", "kv", "N", "TTFT_ms", "step_ms", "tok/s/seq", "tok/s_all",
               "tokens", "KV_KiB", "step/N1");
    }
    static const int Ns[] = {1, 2, 4, 8};
    static const KvType kvs[] = {KV_F32, KV_INT8};
    for (int k = 0; k < 2 && rc == ER_OK; k++) {
        double step1 = 0;
        for (int j = 0; j < 4 && rc == ER_OK; j++) {
            BenchRow r;
            rc = bench_run(&m, adp, kvs[k], Ns[j], prompt, P, T, &r);
            if (rc < 0)
                break;
            if (Ns[j] == 1)
                step1 = r.step_s;
            printf("%-5s %3d %9.2f %9.3f %11.1f %11.1f %7ld %11.1f %8.2fx\n", kvs[k] == KV_F32 ? "f32" : "int8",
                   Ns[j], 1e3 * r.ttft_s, 1e3 * r.step_s, r.stream_tps, r.total_tps, r.tokens, r.kv_bytes / 1024.0,
                   step1 > 0 ? r.step_s / step1 : 0.0);
            fflush(stdout);
        }
    }
    er_free(prompt);
    if (adp)
        lora_free(adp);
    model_free(&m);
    return rc < 0 ? cli_fail("bench") : 0;
}
