// erinfer score: per-token log-probabilities of token sequences under a model.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/args.h"
#include "core/error.h"
#include "core/json.h"
#include "core/threads.h"
#include "infer/cli.h"
#include "model/model.h"
#include "model/ops.h"

// Reads {"tokens": [ids...]} from one JSONL record.
static int read_tokens(const cJSON *rec, const char *ctx, int V, int **ids, int *n) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(rec, "tokens");
    if (!cJSON_IsArray(arr))
        return er_error(ER_EFORMAT, "%s: expected {\"tokens\": [ids...]}", ctx);
    int len = cJSON_GetArraySize(arr);
    if (len < 1)
        return er_error(ER_EFORMAT, "%s: \"tokens\" is empty", ctx);
    int *out = er_alloc(sizeof(int) * (size_t)len);
    if (!out)
        return ER_ENOMEM;
    int i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        double d = e->valuedouble;
        if (!cJSON_IsNumber(e) || d != (double)(int)d || d < 0 || d >= V) {
            er_free(out);
            return er_error(ER_EFORMAT, "%s: tokens[%d] must be an integer id in [0, %d)", ctx, i, V);
        }
        out[i] = (int)d;
    }
    *ids = out;
    *n = len;
    return ER_OK;
}

int cmd_score(int argc, char **argv) {
    const char *model_dir = NULL, *input = NULL, *output = "-";
    int threads = 0;
    ArgSpec specs[] = {
        {"model", ARG_STR, &model_dir, "Hugging Face model dir (config.json + safetensors)", 1, 0, 0},
        {"input", ARG_STR, &input, "JSONL file of {\"tokens\": [ids...]} lines (- for stdin)", 1, 0, 0},
        {"output", ARG_STR, &output, "JSONL output, one {\"logprobs\", \"nll\", \"n\"} line per input (- for stdout)", 0, 0, 0},
        {"threads", ARG_INT, &threads, "threads (0 = all cores)", 0, 0, 4096},
    };
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof specs[0],
                        "erinfer score --model DIR --input FILE.jsonl [--output FILE.jsonl]");
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0)
        return cli_fail("score");
    threads_set(threads);

    Model m;
    if (model_load(&m, model_dir, 0) < 0)
        return cli_fail("score");
    JsonlReader r;
    if (jsonl_open(&r, input) < 0) {
        model_free(&m);
        return cli_fail("score");
    }
    FILE *out = strcmp(output, "-") == 0 ? stdout : fopen(output, "w");
    if (!out) {
        er_error(ER_EIO, "%s: cannot create", output);
        jsonl_close(&r);
        model_free(&m);
        return cli_fail("score");
    }
    Activations a = {0};
    float *logp = NULL;
    int cap = 0, status = 0;
    cJSON *rec;
    while ((rc = jsonl_next(&r, &rec)) == 1) {
        char ctx[600];
        snprintf(ctx, sizeof ctx, "%s:%ld", r.path, r.lineno);
        int *ids = NULL, n = 0;
        rc = read_tokens(rec, ctx, m.cfg.V, &ids, &n);
        cJSON_Delete(rec);
        if (rc == ER_OK && n > cap) {
            acts_free(&a);
            er_free(logp);
            cap = n;
            logp = er_alloc(sizeof(float) * (size_t)n);
            rc = logp ? acts_alloc(&a, &m.cfg, 1, n, ACTS_SCORE, 0) : ER_ENOMEM;
            if (rc < 0)
                cap = 0;
        }
        if (rc == ER_OK) {
            ModelInput in = {.B = 1, .T = n, .tokens = ids};
            rc = model_forward(&m, &in, &a);
        }
        if (rc < 0) {
            er_free(ids);
            status = 1;
            break;
        }
        // logprobs[i] = log p(tokens[i+1] | tokens[..i])
        logprob_forward(logp, a.logits, ids + 1, n - 1, m.cfg.V);
        double sum = 0.0;
        fputs("{\"logprobs\": [", out);
        for (int i = 0; i < n - 1; i++) {
            fprintf(out, "%s%.8g", i ? ", " : "", logp[i]);
            sum += logp[i];
        }
        if (n > 1)
            fprintf(out, "], \"nll\": %.8g, \"n\": %d}\n", -sum / (n - 1), n - 1);
        else
            fputs("], \"nll\": null, \"n\": 0}\n", out);
        er_free(ids);
    }
    if (rc < 0)
        status = 1;
    if (out != stdout && fclose(out) != 0 && !status) {
        er_error(ER_EIO, "%s: write failed", output);
        status = 1;
    }
    acts_free(&a);
    er_free(logp);
    jsonl_close(&r);
    model_free(&m);
    return status ? cli_fail("score") : 0;
}
