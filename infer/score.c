// The score runner (infer/score.h).
#include "infer/score.h"

#include <math.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/gguf.h"
#include "core/json.h"
#include "data/tokenizer.h"
#include "lora/peft.h"
#include "model/model.h"
#include "model/ops.h"

typedef struct {
    int *ids;     // (n) prompt then completion
    int n;
    int n_prompt; // positions before the completion (0 for plain sequences)
    int split;    // 1: prompt/completion record
} ScoreItem;

// Buffers for the longest record so far.
typedef struct {
    Activations a;
    float *logp;   // (cap)
    uint8_t *mask; // (cap) adapter on at completion positions
    int cap;
} ScoreBuffers;

static void score_buffers_free(ScoreBuffers *b) {
    acts_free(&b->a);
    er_free(b->logp);
    er_free(b->mask);
    memset(b, 0, sizeof *b);
}

static int score_buffers_reserve(ScoreBuffers *b, const ModelConfig *cfg, int n) {
    if (n <= b->cap)
        return ER_OK;
    score_buffers_free(b);
    b->logp = er_alloc(sizeof(float) * (size_t)n);
    b->mask = er_alloc((size_t)n);
    if (!b->logp || !b->mask)
        return ER_ENOMEM;
    ER_TRY(acts_alloc(&b->a, cfg, 1, n, ACTS_SCORE, 0));
    b->cap = n;
    return ER_OK;
}

static int read_ids(const cJSON *arr, const char *ctx, const char *key, int V, int *out, int cap, int *n) {
    if (!cJSON_IsArray(arr))
        return er_error(ER_EFORMAT, "%s: \"%s\" must be an array of token ids", ctx, key);
    int i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        double d = e->valuedouble;
        if (!cJSON_IsNumber(e) || !(d >= 0 && d < V) || d != (double)(int)d) // range first: (int)d is defined
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

// it->ids is the caller's to free, also on failure.
static int parse_item(const cJSON *rec, const char *ctx, const Tokenizer *tok, int V, ScoreItem *it) {
    memset(it, 0, sizeof *it);
    const cJSON *tokens = cJSON_GetObjectItemCaseSensitive(rec, "tokens");
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(rec, "text");
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(rec, "prompt");
    const cJSON *completion = cJSON_GetObjectItemCaseSensitive(rec, "completion");
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(rec, "prompt_tokens");
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(rec, "completion_tokens");
    if (tokens || pt) {
        int cap = (tokens ? cJSON_GetArraySize(tokens) : 0) + (pt ? cJSON_GetArraySize(pt) : 0) +
                  (ct ? cJSON_GetArraySize(ct) : 0) + 1;
        it->ids = er_alloc(sizeof(int) * (size_t)cap);
        if (!it->ids)
            return ER_ENOMEM;
        if (tokens) {
            ER_TRY(read_ids(tokens, ctx, "tokens", V, it->ids, cap, &it->n));
        } else {
            if (!ct)
                return er_error(ER_EFORMAT, "%s: \"prompt_tokens\" needs \"completion_tokens\"", ctx);
            it->split = 1;
            ER_TRY(read_ids(pt, ctx, "prompt_tokens", V, it->ids, cap, &it->n));
            it->n_prompt = it->n;
            ER_TRY(read_ids(ct, ctx, "completion_tokens", V, it->ids, cap, &it->n));
        }
    } else if (cJSON_IsString(text)) {
        ER_TRY(append_text(tok, text->valuestring, ctx, &it->ids, &it->n));
    } else if (cJSON_IsString(prompt) && cJSON_IsString(completion)) {
        it->split = 1;
        ER_TRY(append_text(tok, prompt->valuestring, ctx, &it->ids, &it->n));
        it->n_prompt = it->n;
        ER_TRY(append_text(tok, completion->valuestring, ctx, &it->ids, &it->n));
    } else {
        return er_error(ER_EFORMAT, "%s: expected {\"tokens\"}, {\"text\"}, {\"prompt\", \"completion\"} or "
                                    "{\"prompt_tokens\", \"completion_tokens\"}", ctx);
    }
    if (it->split && it->n_prompt < 1)
        return er_error(ER_EFORMAT, "%s: the prompt is empty", ctx);
    if (it->split && it->n == it->n_prompt)
        return er_error(ER_EFORMAT, "%s: the completion is empty", ctx);
    if (it->n < 1)
        return er_error(ER_EFORMAT, "%s: no tokens", ctx);
    return ER_OK;
}

// One {"logprobs", "nll", "n"} line.
static void score_write(FILE *out, const float *logp, int count) {
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
}

// Scores one parsed record; ctx ("path:line") names it in errors.
static int score_item(Model *m, const LoraAdapter *ad, const ScoreItem *it, const char *ctx, ScoreBuffers *b,
                      FILE *out, ScoreResult *res) {
    if (it->n > m->cfg.max_pos)
        return er_error(ER_ERANGE, "%s: %d tokens exceed the model's %d positions (max_position_embeddings)", ctx,
                        it->n, m->cfg.max_pos);
    ER_TRY(score_buffers_reserve(b, &m->cfg, it->n));
    for (int i = 0; i < it->n; i++)
        b->mask[i] = i >= it->n_prompt; // plain sequences: n_prompt = 0, adapter everywhere
    ModelInput in = {.B = 1, .T = it->n, .tokens = it->ids, .adapter = ad, .adapter_mask = b->mask};
    ER_TRY(model_forward(m, &in, &b->a));
    // Plain: logp[i] = log p(x[i+1] | x[..i]). Split: from the last prompt position on.
    int first = it->split ? it->n_prompt - 1 : 0, count = it->n - 1 - first, V = m->cfg.V;
    logprob_forward(b->logp, b->a.logits + (size_t)first * V, it->ids + first + 1, count, V, 1.0f);
    for (int i = 0; i < count; i++)
        if (!isfinite(b->logp[i])) // JSON has no NaN: say so instead of writing an invalid line
            return er_error(ER_ERANGE, "%s: the log-prob of token %d is %g (the forward overflowed)", ctx,
                            first + 1 + i, b->logp[i]);
    if (out)
        score_write(out, b->logp, count);
    res->records++;
    res->tokens += count;
    return ER_OK;
}

int score_run(const ScoreConfig *c, ScoreResult *res) {
    if (!c || !res || !c->model || !c->input)
        return er_error(ER_EINVAL, "score_run: NULL config, result, model or input");
    memset(res, 0, sizeof *res);
    int rc = ER_OK;
    Model m = {0};
    Tokenizer *tok = NULL;
    LoraAdapter ad = {0};
    JsonlReader r = {0};
    ScoreBuffers b = {0};
    cJSON *rec = NULL;
    ScoreItem it = {0};
    ER_CHECK(model_load(&m, c->model, 0));
    // The tokenizer is needed for text lines only; a dir without one scores token lines.
    char *tj = path_join(c->model, "tokenizer.json");
    if (!tj)
        ER_CHECK(er_error(ER_ENOMEM, "%s: out of memory", c->model));
    int has_tok = gguf_is_path(c->model) || path_exists(tj); // a GGUF file carries its tokenizer
    er_free(tj);
    if (has_tok)
        ER_CHECK(tok_load(&tok, c->model));
    if (c->adapter) {
        LoraShape shape = model_config_lora_shape(&m.cfg);
        ER_CHECK(peft_load(&ad, c->adapter, &shape, 0));
    }
    ER_CHECK(jsonl_open(&r, c->input));
    while ((rc = jsonl_next(&r, &rec)) == 1) {
        char ctx[600];
        snprintf(ctx, sizeof ctx, "%s:%ld", r.path, r.lineno);
        rc = parse_item(rec, ctx, tok, m.cfg.V, &it);
        cJSON_Delete(rec);
        rec = NULL;
        ER_CHECK(rc);
        ER_CHECK(score_item(&m, c->adapter ? &ad : NULL, &it, ctx, &b, c->out, res));
        er_free(it.ids);
        it.ids = NULL;
    }
done:
    er_free(it.ids);
    score_buffers_free(&b);
    jsonl_close(&r);
    lora_free(&ad);
    tok_free(tok);
    model_free(&m);
    return rc;
}
