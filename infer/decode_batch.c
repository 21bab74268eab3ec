#include "infer/decode_batch.h"

#include <limits.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

int decode_batch_init(DecodeBatch *b, Model *m, const Tokenizer *tok, const LoraAdapter *adapter, KvType kv_type,
                      int max_rows, int n_prompts, int max_len, int chunk, size_t max_bytes) {
    memset(b, 0, sizeof *b);
    if (max_rows < 1 || n_prompts < 1)
        return er_error(ER_EINVAL, "batch: need at least 1 row and 1 cached prompt");
    // The engine holds both (below): their sum and its positions must be numbers it can hold.
    if (max_rows > INT_MAX - n_prompts || (long long)(max_rows + n_prompts) * max_len > INT_MAX)
        return er_error(ER_ERANGE, "a batch of %d rows and %d cached prompts of %d positions is more than a KV cache "
                        "can address (%d positions)", max_rows, n_prompts, max_len, INT_MAX);
    // The engine's room for samples holds the rows and the cached prompts (sequences the rows share
    // only while they decode from them).
    ER_TRY(engine_init(&b->e, m, tok, kv_type, max_rows + n_prompts, max_len, chunk, max_bytes));
    b->max_rows = max_rows;
    b->adapter = adapter;
    b->n_prompts = n_prompts;
    b->live = er_calloc((size_t)max_rows, sizeof *b->live);
    b->tok = er_alloc(sizeof(int) * (size_t)max_rows);
    b->slot = er_alloc(sizeof(int) * (size_t)max_rows);
    b->mask = er_alloc((size_t)max_rows);
    b->prompts = er_calloc((size_t)n_prompts, sizeof *b->prompts);
    int ok = b->live && b->tok && b->slot && b->mask && b->prompts;
    for (int k = 0; ok && k < n_prompts; k++) {
        BatchPrompt *p = &b->prompts[k];
        p->slot = -1;
        p->tokens = er_alloc(sizeof(int) * (size_t)max_len);
        p->logits = er_alloc(sizeof(float) * (size_t)m->cfg.V);
        ok = p->tokens && p->logits;
    }
    if (!ok) {
        decode_batch_free(b);
        return ER_ENOMEM;
    }
    return ER_OK;
}

// Exchanges the engine's prompt sequence and a cached prompt (twice: back as it was).
static void prompt_swap(Engine *e, BatchPrompt *p) {
    BatchPrompt t = {e->prompt_slot, e->prompt_tokens, e->n_prompt, e->prompt_adapter, e->prompt_logits,
                     e->prompt_logits_valid, p->used};
    e->prompt_slot = p->slot;
    e->prompt_tokens = p->tokens;
    e->n_prompt = p->n;
    e->prompt_adapter = p->adapter;
    e->prompt_logits = p->logits;
    e->prompt_logits_valid = p->logits_valid;
    *p = t;
}

// The cached prompt a request's prompt is prefilled from (the rule above DecodeBatch.prompts).
static BatchPrompt *prompt_for(DecodeBatch *b, const int *prompt, int n_prompt, uint64_t adapter) {
    BatchPrompt *best = NULL, *lru = NULL;
    int best_len = 0;
    for (int k = 0; k < b->n_prompts; k++) {
        BatchPrompt *p = &b->prompts[k];
        int len = 0;
        while (p->slot >= 0 && p->adapter == adapter && len < p->n && len < n_prompt && p->tokens[len] == prompt[len])
            len++;
        if (len > 0 && 2 * len >= p->n && len > best_len)
            best = p, best_len = len;
        if (!lru || p->used < lru->used)
            lru = p;
    }
    return best ? best : lru;
}

void decode_batch_free(DecodeBatch *b) {
    while (b->n_live > 0)
        decode_batch_end(b, b->live[0], NULL);
    for (int k = 0; b->prompts && k < b->n_prompts; k++) {
        if (b->prompts[k].slot >= 0)
            kv_seq_close(&b->e.kv, b->prompts[k].slot);
        er_free(b->prompts[k].tokens);
        er_free(b->prompts[k].logits);
    }
    er_free(b->prompts);
    engine_free(&b->e);
    er_free(b->live);
    er_free(b->tok);
    er_free(b->slot);
    er_free(b->mask);
    memset(b, 0, sizeof *b);
}

int decode_batch_rows(const DecodeBatch *b) {
    int rows = 0;
    for (int k = 0; k < b->n_live; k++)
        rows += engine_request_samples(b->live[k]);
    return rows;
}

// Admits a request: its prompt prefilled from the cached prompt chosen for it (through the routed
// pipeline's begin when c is given, which picks the generation), its samples started.
static int batch_admit(DecodeBatch *b, const int *prompt, int n_prompt, const GenConfig *g, const PipelineConfig *c,
                       PipelineResult *res, GenTokenFn cb, void *user, GenSample *out, EngineRequest **req) {
    *req = NULL;
    if (!c && g->keep_kv) // only the routed end (pipeline_end) takes the kept samples and releases them
        return er_error(ER_EINVAL, "batch: a plain request cannot keep its samples' KV sequences");
    if (g->adapter && g->adapter != b->adapter)
        return er_error(ER_EINVAL, "batch: a request's adapter must be the batch's (one forward takes one adapter)");
    if (g->n_samples < 1 || decode_batch_rows(b) + g->n_samples > b->max_rows)
        return er_error(ER_ERANGE, "batch: %d samples do not fit the %d free rows of %d", g->n_samples,
                        b->max_rows - decode_batch_rows(b), b->max_rows);
    const LoraAdapter *prompt_ad = g->adapter && !g->adapter->masked ? g->adapter : NULL;
    BatchPrompt *p = prompt_for(b, prompt, n_prompt, prompt_ad ? prompt_ad->generation : 0);
    p->used = ++b->admitted;
    prompt_swap(&b->e, p);
    GenConfig routed;
    int rc = c ? pipeline_begin(&b->e, prompt, n_prompt, c, res, &routed) : ER_OK;
    if (rc == ER_OK) {
        rc = engine_request_begin(&b->e, prompt, n_prompt, c ? &routed : g, cb, user, out, req);
        if (rc < 0 && c)
            pipeline_result_free(res);
    }
    prompt_swap(&b->e, p);
    if (rc < 0)
        return rc;
    b->live[b->n_live++] = *req;
    return ER_OK;
}

int decode_batch_add(DecodeBatch *b, const int *prompt, int n_prompt, const GenConfig *g, GenTokenFn cb, void *user,
                     GenSample *out, EngineRequest **req) {
    return batch_admit(b, prompt, n_prompt, g, NULL, NULL, cb, user, out, req);
}

// The rows asked for are the reasoning route's (the direct route takes one of them).
int decode_batch_add_routed(DecodeBatch *b, const int *prompt, int n_prompt, const PipelineConfig *c,
                            PipelineResult *r, GenTokenFn cb, void *user, GenSample *out, EngineRequest **req) {
    return batch_admit(b, prompt, n_prompt, pipeline_can_reason(c) ? &c->reasoning : &c->direct, c, r, cb, user,
                       out, req);
}

void decode_batch_step(DecodeBatch *b) {
    int B = 0;
    for (int k = 0; k < b->n_live; k++)
        B += engine_request_rows(&b->e, b->live[k], b->tok + B, b->slot + B, b->mask + B);
    if (B == 0)
        return;
    ModelInput in = {.B = B, .T = 1, .tokens = b->tok, .adapter_mask = b->mask, .adapter = b->adapter,
                     .kv = &b->e.kv, .kv_slots = b->slot};
    int rc = model_forward(b->e.model, &in, &b->e.decode);
    b->e.forward_positions += B;
    b->steps++;
    // The requests' rows lie in the order they were gathered, each request's together.
    const float *logits = NULL;
    if (rc == ER_OK)
        rc = engine_download(&b->e, b->e.decode.logits, (size_t)B * b->e.model->cfg.V, &logits);
    for (int k = 0; k < b->n_live; k++) {
        int n = engine_request_pending_rows(b->live[k]);
        if (rc < 0)
            engine_request_fail(b->live[k], rc);
        else {
            engine_request_accept(&b->e, b->live[k], logits);
            logits += (size_t)n * b->e.model->cfg.V;
        }
    }
}

int decode_batch_end(DecodeBatch *b, EngineRequest *r, GenStats *stats) {
    for (int k = 0; k < b->n_live; k++)
        if (b->live[k] == r) {
            memmove(&b->live[k], &b->live[k + 1], sizeof *b->live * (size_t)(b->n_live - k - 1));
            b->n_live--;
            return engine_request_end(&b->e, r, stats);
        }
    return er_error(ER_EINVAL, "batch: the request is not in this batch");
}

int decode_batch_end_routed(DecodeBatch *b, EngineRequest *r, const PipelineConfig *c, GenSample *out,
                            PipelineResult *res) {
    if (!engine_request_done(r))
        return er_error(ER_EINVAL, "batch: a routed request ends once done (abandon it with decode_batch_end)");
    int rc = decode_batch_end(b, r, &res->gen); // keeps the samples' KV for the verifier (GenConfig.keep_kv)
    if (rc < 0) {
        engine_release_samples(&b->e);
        pipeline_result_free(res);
        return rc;
    }
    int n = res->n;
    rc = pipeline_end(&b->e, c, out, res);
    if (rc < 0)
        gen_samples_free(out, n);
    return rc;
}
