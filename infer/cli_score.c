// erinfer score: per-token log-probabilities under a model, optionally with a LoRA adapter.
//   {"tokens": [...]} or {"text": "..."}: logprobs[i] = log p(x[i+1] | x[..i]), adapter at every position.
//   {"prompt": "...", "completion": "..."} or {"prompt_tokens": [...], "completion_tokens": [...]}:
//   one log-prob per completion token, log p(c[j] | prompt, c[<j]); the adapter is on at completion
//   positions only (the masked rule), so prompt positions are the base model's.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/args.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/threads.h"
#include "data/tokenizer.h"
#include "infer/cli.h"
#include "lora/peft.h"
#include "model/model.h"
#include "model/ops.h"

typedef struct {
    int *ids;     // (n) prompt then completion
    int n;
    int n_prompt; // positions before the completion (0 for plain sequences)
    int split;    // 1: prompt/completion record
} ScoreItem;

static int read_ids(const cJSON *arr, const char *ctx, const char *key, int V, int *out, int cap, int *n) {
    if (!cJSON_IsArray(arr))
        return er_error(ER_EFORMAT, "%s: \"%s\" must be an array of token ids", ctx, key);
    int i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        double d = e->valuedouble;
        if (!cJSON_IsNumber(e) || d != (double)(int)d || d < 0 || d >= V)
            return er_error(ER_EFORMAT, "%s: %s[%d] must be an integer id in [0, %d)", ctx, key, i, V);
        if (*n + 1 > cap)
            return er_error(ER_ERANGE, "%s: too many tokens", ctx);
        out[(*n)++] = (int)d;
    }
    return ER_OK;
}

static int append_text(const Tokenizer *tok, const char *text, const char *ctx, int **ids, int *n) {
    if (!tok)
        return er_error(ER_EINVAL, "%s: text input needs a tokenizer.json in the model dir", ctx);
    int *t, k;
    int rc = tok_encode(tok, text, strlen(text), &t, &k);
    if (rc < 0)
        return er_error_prefix(rc, "%s", ctx);
    int *grown = er_realloc_array(*ids, (size_t)(*n + k + 1), sizeof(int));
    if (!grown) {
        er_free(t);
        return ER_ENOMEM;
    }
    if (k > 0) // empty text: no ids (t is NULL)
        memcpy(grown + *n, t, sizeof(int) * (size_t)k);
    *ids = grown;
    *n += k;
    er_free(t);
    return ER_OK;
}

static int parse_item(const cJSON *rec, const char *ctx, const Tokenizer *tok, int V, ScoreItem *it) {
    memset(it, 0, sizeof *it);
    const cJSON *tokens = cJSON_GetObjectItemCaseSensitive(rec, "tokens");
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(rec, "text");
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(rec, "prompt");
    const cJSON *completion = cJSON_GetObjectItemCaseSensitive(rec, "completion");
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(rec, "prompt_tokens");
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(rec, "completion_tokens");
    int rc = ER_OK;
    if (tokens || pt) {
        int cap = (tokens ? cJSON_GetArraySize(tokens) : 0) + (pt ? cJSON_GetArraySize(pt) : 0) +
                  (ct ? cJSON_GetArraySize(ct) : 0) + 1;
        it->ids = er_alloc(sizeof(int) * (size_t)cap);
        if (!it->ids)
            return ER_ENOMEM;
        if (tokens) {
            rc = read_ids(tokens, ctx, "tokens", V, it->ids, cap, &it->n);
        } else {
            if (!ct)
                return er_error(ER_EFORMAT, "%s: \"prompt_tokens\" needs \"completion_tokens\"", ctx);
            it->split = 1;
            rc = read_ids(pt, ctx, "prompt_tokens", V, it->ids, cap, &it->n);
            it->n_prompt = it->n;
            if (rc == ER_OK)
                rc = read_ids(ct, ctx, "completion_tokens", V, it->ids, cap, &it->n);
        }
    } else if (cJSON_IsString(text)) {
        rc = append_text(tok, text->valuestring, ctx, &it->ids, &it->n);
    } else if (cJSON_IsString(prompt) && cJSON_IsString(completion)) {
        it->split = 1;
        rc = append_text(tok, prompt->valuestring, ctx, &it->ids, &it->n);
        it->n_prompt = it->n;
        if (rc == ER_OK)
            rc = append_text(tok, completion->valuestring, ctx, &it->ids, &it->n);
    } else {
        return er_error(ER_EFORMAT, "%s: expected {\"tokens\"}, {\"text\"}, {\"prompt\", \"completion\"} or "
                                    "{\"prompt_tokens\", \"completion_tokens\"}", ctx);
    }
    if (rc == ER_OK && it->split && it->n_prompt < 1)
        rc = er_error(ER_EFORMAT, "%s: the prompt is empty", ctx);
    if (rc == ER_OK && it->split && it->n == it->n_prompt)
        rc = er_error(ER_EFORMAT, "%s: the completion is empty", ctx);
    if (rc == ER_OK && it->n < 1)
        rc = er_error(ER_EFORMAT, "%s: no tokens", ctx);
    return rc;
}

int cmd_score(int argc, char **argv) {
    const char *model_dir = NULL, *adapter_dir = NULL, *input = NULL, *output = "-";
    int threads = 0;
    ArgSpec specs[] = {
        {"model", ARG_STR, &model_dir, "Hugging Face model dir (config.json + safetensors)", 1, 0, 0},
        {"adapter", ARG_STR, &adapter_dir, "LoRA adapter dir (PEFT layout)", 0, 0, 0},
        {"input", ARG_STR, &input, "JSONL of {\"tokens\"}, {\"text\"} or {\"prompt\", \"completion\"} lines (- = stdin)", 1, 0, 0},
        {"output", ARG_STR, &output, "JSONL output, one {\"logprobs\", \"nll\", \"n\"} line per input (- for stdout)", 0, 0, 0},
        {"threads", ARG_INT, &threads, "threads (0 = all cores)", 0, 0, 4096},
    };
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof specs[0],
                        "erinfer score --model DIR --input FILE.jsonl [--adapter DIR] [--output FILE.jsonl]");
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0)
        return cli_fail("score");
    threads_set(threads);

    Model m;
    if (model_load(&m, model_dir, 0) < 0)
        return cli_fail("score");
    // The tokenizer is needed for text lines only; a dir without one scores token lines.
    Tokenizer *tok = NULL;
    char *tj = path_join(model_dir, "tokenizer.json");
    if (tj && path_exists(tj))
        rc = tok_load(&tok, model_dir);
    er_free(tj);
    LoraAdapter ad;
    int has_ad = 0;
    if (rc == ER_OK && adapter_dir) {
        LoraShape shape = {m.cfg.L, m.cfg.C, m.cfg.NH * m.cfg.HS, m.cfg.NKV * m.cfg.HS, m.cfg.FF};
        rc = peft_load(&ad, adapter_dir, &shape, 0);
        has_ad = rc == ER_OK;
    }
    JsonlReader r = {0};
    if (rc == ER_OK)
        rc = jsonl_open(&r, input);
    AtomicFile af = {0};
    FILE *out = stdout;
    if (rc == ER_OK && strcmp(output, "-") != 0) {
        rc = atomic_open(&af, output);
        out = af.fp;
    }
    Activations a = {0};
    float *logp = NULL;
    uint8_t *mask = NULL;
    int cap = 0;
    cJSON *rec;
    while (rc == ER_OK && (rc = jsonl_next(&r, &rec)) == 1) {
        char ctx[600];
        snprintf(ctx, sizeof ctx, "%s:%ld", r.path, r.lineno);
        ScoreItem it;
        rc = parse_item(rec, ctx, tok, m.cfg.V, &it);
        cJSON_Delete(rec);
        if (rc == ER_OK && it.n > m.cfg.max_pos)
            rc = er_error(ER_ERANGE, "%s: %d tokens exceed the model's %d positions (max_position_embeddings)", ctx,
                          it.n, m.cfg.max_pos);
        if (rc == ER_OK && it.n > cap) {
            acts_free(&a);
            er_free(logp);
            er_free(mask);
            cap = it.n;
            logp = er_alloc(sizeof(float) * (size_t)cap);
            mask = er_alloc((size_t)cap);
            rc = logp && mask ? acts_alloc(&a, &m.cfg, 1, cap, ACTS_SCORE, 0) : ER_ENOMEM;
            if (rc < 0)
                cap = 0;
        }
        if (rc == ER_OK) {
            for (int i = 0; i < it.n; i++)
                mask[i] = i >= it.n_prompt; // plain sequences: n_prompt = 0, adapter everywhere
            ModelInput in = {.B = 1, .T = it.n, .tokens = it.ids, .adapter = has_ad ? &ad : NULL, .adapter_mask = mask};
            rc = model_forward(&m, &in, &a);
        }
        if (rc < 0) {
            er_free(it.ids);
            break;
        }
        // Plain: logp[i] = log p(x[i+1] | x[..i]). Split: from the last prompt position on.
        int first = it.split ? it.n_prompt - 1 : 0, count = it.n - 1 - first;
        logprob_forward(logp, a.logits + (size_t)first * m.cfg.V, it.ids + first + 1, count, m.cfg.V, 1.0f);
        for (int i = 0; i < count; i++)
            if (!isfinite(logp[i])) { // JSON has no NaN: say so instead of writing an invalid line
                rc = er_error(ER_ERANGE, "%s: the log-prob of token %d is %g (the forward overflowed)", ctx,
                              first + 1 + i, logp[i]);
                break;
            }
        if (rc < 0) {
            er_free(it.ids);
            break;
        }
        double sum = 0.0;
        fputs("{\"logprobs\": [", out);
        for (int i = 0; i < count; i++) {
            fprintf(out, "%s%.8g", i ? ", " : "", logp[i]);
            sum += logp[i];
        }
        if (count > 0)
            fprintf(out, "], \"nll\": %.8g, \"n\": %d}\n", -sum / count, count);
        else
            fputs("], \"nll\": null, \"n\": 0}\n", out);
        er_free(it.ids);
    }
    if (af.fp) {
        if (rc == ER_OK)
            rc = atomic_commit(&af);
        else
            atomic_abort(&af);
    }
    acts_free(&a);
    er_free(logp);
    er_free(mask);
    jsonl_close(&r);
    if (has_ad)
        lora_free(&ad);
    tok_free(tok);
    model_free(&m);
    return rc < 0 ? cli_fail("score") : 0;
}
