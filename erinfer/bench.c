// erinfer bench: TTFT, decode speed and KV memory at N = 1, 2, 4, 8 samples, fp32 vs int8 KV (the
// runner: infer/bench.h), then the memory a device must hold; a table, or one JSON object with --json.
#include <stdio.h>

#include <cjson/cJSON.h>

#include "core/args.h"
#include "core/error.h"
#include "core/threads.h"
#include "infer/bench.h"
#include "erinfer/cli.h"

typedef struct {
    const BenchConfig *c;
    int threads;
    double step1; // the N = 1 row's step time of the current KV type
} BenchTable;

// The table, a row at a time as the runner measures them (the header before the first).
static void table_row(void *user, const BenchResult *res, int i) {
    BenchTable *t = user;
    const BenchRow *r = &res->rows[i];
    if (i == 0) {
        printf("erinfer bench: %s, %d layers, hidden %d, vocab %d, prompt %d tokens, %d new tokens per sample, "
               "%d threads\n", t->c->model, res->L, res->C, res->V, t->c->prompt_tokens, t->c->new_tokens, t->threads);
        printf("%-5s %3s %9s %9s %11s %11s %7s %11s %9s\n", "kv", "N", "TTFT_ms", "step_ms", "tok/s/seq", "tok/s_all",
               "tokens", "KV_KiB", "step/N1");
    }
    if (r->n == 1)
        t->step1 = r->step_s;
    printf("%-5s %3d %9.2f %9.3f %11.1f %11.1f %7ld %11.1f %8.2fx\n", r->kv, r->n, 1e3 * r->ttft_s, 1e3 * r->step_s,
           r->stream_tps, r->total_tps, r->tokens, r->kv_bytes / 1024.0, t->step1 > 0 ? r->step_s / t->step1 : 0.0);
    fflush(stdout);
}

// What a device must hold at the table's largest N (its last row of each KV type), to size a phone:
// the weights (mapped from the files, and as held), the KV cache and the scratch.
static void print_memory(const BenchConfig *c, const BenchResult *res) {
    const BenchRow *f = &res->rows[res->n_rows / 2 - 1], *q = &res->rows[res->n_rows - 1];
    const double MiB = 1048576.0;
    printf("memory at N = %d, %d + %d positions per sample: weights %.2f MiB mapped from the files + %.2f MiB "
           "copied (resident after a step: %.2f MiB), KV %.2f MiB f32 / %.2f MiB int8, scratch %.2f MiB; total %.2f "
           "MiB with int8 KV; kernels %s\n",
           q->n, c->prompt_tokens, c->new_tokens, res->mapped_bytes / MiB, res->copied_bytes / MiB,
           res->resident_weight_bytes / MiB, f->kv_alloc_bytes / MiB, q->kv_alloc_bytes / MiB, q->scratch_bytes / MiB,
           (res->mapped_bytes + res->copied_bytes + q->kv_alloc_bytes + q->scratch_bytes) / MiB, res->kernels);
}

static int print_json(const BenchConfig *c, int threads, const BenchResult *res) {
    cJSON *root = cJSON_CreateObject(), *rows = root ? cJSON_AddArrayToObject(root, "rows") : NULL;
    if (!rows) {
        cJSON_Delete(root);
        return ER_ENOMEM;
    }
    cJSON_AddStringToObject(root, "model", c->model);
    cJSON_AddNumberToObject(root, "weight_bytes", (double)res->weight_bytes);
    cJSON_AddNumberToObject(root, "weights_mapped_bytes", (double)res->mapped_bytes);
    cJSON_AddNumberToObject(root, "weights_copied_bytes", (double)res->copied_bytes);
    cJSON_AddNumberToObject(root, "weights_resident_bytes", (double)res->resident_weight_bytes);
    cJSON_AddStringToObject(root, "kernels", res->kernels);
    cJSON_AddNumberToObject(root, "prompt_tokens", c->prompt_tokens);
    cJSON_AddNumberToObject(root, "new_tokens", c->new_tokens);
    cJSON_AddNumberToObject(root, "threads", threads);
    for (int i = 0; i < res->n_rows; i++) {
        const BenchRow *r = &res->rows[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "kv", r->kv);
        cJSON_AddNumberToObject(o, "n", r->n);
        cJSON_AddNumberToObject(o, "ttft_ms", 1e3 * r->ttft_s);
        cJSON_AddNumberToObject(o, "step_ms", 1e3 * r->step_s);
        cJSON_AddNumberToObject(o, "tokens_per_s_seq", r->stream_tps);
        cJSON_AddNumberToObject(o, "tokens_per_s_all", r->total_tps);
        cJSON_AddNumberToObject(o, "tokens", (double)r->tokens);
        cJSON_AddNumberToObject(o, "kv_bytes", (double)r->kv_bytes);
        cJSON_AddNumberToObject(o, "prompt_reused", r->prompt_reused);
        cJSON_AddNumberToObject(o, "kv_alloc_bytes", (double)r->kv_alloc_bytes);
        cJSON_AddNumberToObject(o, "scratch_bytes", (double)r->scratch_bytes);
        cJSON_AddItemToArray(rows, o);
    }
    if (res->has_adapter) {
        cJSON *o = cJSON_AddObjectToObject(root, "adapter_after_base_prefill");
        cJSON_AddStringToObject(o, "adapter_mask", res->adapter_masked ? "response" : "all");
        cJSON_AddNumberToObject(o, "ttft_ms", 1e3 * res->adapter_row.ttft_s);
        cJSON_AddNumberToObject(o, "prompt_reused", res->adapter_row.prompt_reused);
    }
    char *txt = cJSON_Print(root);
    cJSON_Delete(root);
    if (!txt)
        return ER_ENOMEM;
    printf("%s\n", txt);
    cJSON_free(txt);
    return ER_OK;
}

int cmd_bench(int argc, char **argv) {
    BenchConfig c = {.prompt_tokens = 128, .new_tokens = 32};
    int threads = 0, json = 0;
    ArgSpec specs[] = {
        {"model", ARG_STR, &c.model, "model dir (config.json, safetensors; tokenizer.json optional) or .gguf file", 1, 0, 0},
        {"adapter", ARG_STR, &c.adapter, "LoRA adapter dir (PEFT layout), on while decoding", 0, 0, 0},
        {"prompt-tokens", ARG_INT, &c.prompt_tokens, "synthetic prompt length", 0, 1, 1 << 20},
        {"new-tokens", ARG_INT, &c.new_tokens, "tokens generated per sample (EOS does not stop them)", 0, 2, 1 << 20},
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
    BenchTable table = {&c, threads_set(threads), 0};
    if (!json) {
        c.on_row = table_row;
        c.user = &table;
    }
    BenchResult res;
    if (bench_run(&c, &res) < 0 || (json && print_json(&c, table.threads, &res) < 0))
        return cli_fail("bench");
    if (!json)
        print_memory(&c, &res);
    if (!json && res.has_adapter)
        printf("after a base prefill of the prompt, the %s adapter's first token: TTFT %.2f ms, %d of %d prompt "
               "positions reused\n", res.adapter_masked ? "masked" : "unmasked", 1e3 * res.adapter_row.ttft_s,
               res.adapter_row.prompt_reused, c.prompt_tokens);
    return 0;
}
