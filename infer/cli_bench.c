// erinfer bench: time to first token, decode speed and KV memory of a model dir for N = 1, 2, 4, 8
// parallel samples sharing one prompt, with the KV cache in fp32 and in int8. The engine runs with
// EOS stopping off (no tokenizer, no eos id), so every sample decodes exactly --new-tokens tokens;
// the table still reports the tokens actually generated. With --adapter, one more row times the
// pipeline's case: the base model has prefilled the prompt (for the switcher), then the adapter
// decodes. A masked adapter reuses that prompt KV cache; an unmasked one must recompute the prompt.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

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

// Bytes of the weights as held in memory (packed formats at their size; vectors fp32).
static size_t model_weight_bytes(const Model *m) {
    size_t n = 0;
    for (int i = 0; i < m->n_params; i++)
        n += m->params[i].w ? weight_bytes(m->params[i].w) : m->params[i].numel * sizeof(float);
    return n;
}

typedef struct {
    double ttft_s, step_s, stream_tps, total_tps;
    long tokens;
    size_t kv_bytes;
    int prompt_reused; // prompt positions found in the cache
} BenchRow;

static void row_print(const char *kv, int N, const BenchRow *r, double step1, cJSON *rows) {
    if (rows) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "kv", kv);
        cJSON_AddNumberToObject(o, "n", N);
        cJSON_AddNumberToObject(o, "ttft_ms", 1e3 * r->ttft_s);
        cJSON_AddNumberToObject(o, "step_ms", 1e3 * r->step_s);
        cJSON_AddNumberToObject(o, "tokens_per_s_seq", r->stream_tps);
        cJSON_AddNumberToObject(o, "tokens_per_s_all", r->total_tps);
        cJSON_AddNumberToObject(o, "tokens", (double)r->tokens);
        cJSON_AddNumberToObject(o, "kv_bytes", (double)r->kv_bytes);
        cJSON_AddNumberToObject(o, "prompt_reused", r->prompt_reused);
        cJSON_AddItemToArray(rows, o);
        return;
    }
    printf("%-5s %3d %9.2f %9.3f %11.1f %11.1f %7ld %11.1f %8.2fx\n", kv, N, 1e3 * r->ttft_s, 1e3 * r->step_s,
           r->stream_tps, r->total_tps, r->tokens, r->kv_bytes / 1024.0, step1 > 0 ? r->step_s / step1 : 0.0);
    fflush(stdout);
}

// base_first: prefill the prompt with the base model first (as the pipeline does for the switcher),
// untimed; the row then times what the adapter's generation adds.
static int bench_run(Model *m, const LoraAdapter *ad, KvType kv, int N, const int *prompt, int P, int T,
                     int base_first, BenchRow *row) {
    Engine e;
    ER_TRY(engine_init(&e, m, NULL, kv, N, P + T, 128, 0));
    if (base_first) {
        int rc = engine_prefill(&e, prompt, P, NULL, NULL, NULL, NULL);
        if (rc < 0) {
            engine_free(&e);
            return rc;
        }
    }
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
        row->prompt_reused = st.prompt_reused;
        gen_samples_free(out, N);
    }
    er_free(out);
    engine_free(&e);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    const char *dir = NULL, *adapter_dir = NULL;
    int P = 128, T = 32, threads = 0, json = 0;
    ArgSpec specs[] = {
        {"model", ARG_STR, &dir, "model dir (config.json, safetensors; tokenizer.json optional)", 1, 0, 0},
        {"adapter", ARG_STR, &adapter_dir, "LoRA adapter dir (PEFT layout), on while decoding", 0, 0, 0},
        {"prompt-tokens", ARG_INT, &P, "synthetic prompt length", 0, 1, 1 << 20},
        {"new-tokens", ARG_INT, &T, "tokens generated per sample (EOS does not stop them)", 0, 2, 1 << 20},
        {"threads", ARG_INT, &threads, "threads (0 = all cores)", 0, 0, 4096},
        {"json", ARG_FLAG, &json, "print one JSON object (rows, the adapter-after-prefill row, model facts)", 0, 0, 0},
    };
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof specs[0],
                        "erinfer bench --model DIR [--adapter DIR] [--prompt-tokens P] [--new-tokens T] [--threads N] "
                        "[--json]");
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
        rc = bench_run(&m, adp, KV_F32, 1, prompt, P < 8 ? P : 8, 2, 0, &warm);
    cJSON *root = json ? cJSON_CreateObject() : NULL, *rows = root ? cJSON_AddArrayToObject(root, "rows") : NULL;
    if (json && !rows)
        rc = ER_ENOMEM;
    if (rc == ER_OK && json) {
        cJSON_AddStringToObject(root, "model", dir);
        cJSON_AddNumberToObject(root, "weight_bytes", (double)model_weight_bytes(&m));
        cJSON_AddNumberToObject(root, "prompt_tokens", P);
        cJSON_AddNumberToObject(root, "new_tokens", T);
        cJSON_AddNumberToObject(root, "threads", nthreads);
    } else if (rc == ER_OK) {
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
            rc = bench_run(&m, adp, kvs[k], Ns[j], prompt, P, T, 0, &r);
            if (rc < 0)
                break;
            if (Ns[j] == 1)
                step1 = r.step_s;
            row_print(kvs[k] == KV_F32 ? "f32" : "int8", Ns[j], &r, step1, rows);
        }
    }
    if (rc == ER_OK && adp) {
        BenchRow r;
        rc = bench_run(&m, adp, KV_F32, 1, prompt, P, T, 1, &r);
        if (rc == ER_OK && root) {
            cJSON *o = cJSON_AddObjectToObject(root, "adapter_after_base_prefill");
            cJSON_AddStringToObject(o, "adapter_mask", adp->masked ? "response" : "all");
            cJSON_AddNumberToObject(o, "ttft_ms", 1e3 * r.ttft_s);
            cJSON_AddNumberToObject(o, "prompt_reused", r.prompt_reused);
        } else if (rc == ER_OK) {
            printf("after a base prefill of the prompt, the %s adapter's first token: TTFT %.2f ms, %d of %d prompt "
                   "positions reused\n", adp->masked ? "masked" : "unmasked", 1e3 * r.ttft_s, r.prompt_reused, P);
        }
    }
    if (rc == ER_OK && root) {
        char *txt = cJSON_Print(root);
        if (txt)
            printf("%s\n", txt);
        else
            rc = ER_ENOMEM;
        cJSON_free(txt);
    }
    cJSON_Delete(root);
    er_free(prompt);
    if (adp)
        lora_free(adp);
    model_free(&m);
    return rc < 0 ? cli_fail("bench") : 0;
}
