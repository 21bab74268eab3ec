#include "infer/decode_batch.h"

#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

int decode_batch_init(DecodeBatch *b, Model *m, const Tokenizer *tok, const LoraAdapter *adapter, KvType kv_type, int max_rows,
               int max_len, int chunk, size_t max_bytes) {
    memset(b, 0, sizeof *b);
    if (max_rows < 1)
        return er_error(ER_EINVAL, "batch: need at least 1 row");
    // One sample more than the rows: its room holds the prompt sequence, which the rows do not share
    // once a request of another prompt has been admitted.
    ER_TRY(engine_init(&b->e, m, tok, kv_type, max_rows + 1, max_len, chunk, max_bytes));
    b->max_rows = max_rows;
    b->adapter = adapter;
    b->live = er_calloc((size_t)max_rows, sizeof *b->live);
    b->tok = er_alloc(sizeof(int) * (size_t)max_rows);
    b->slot = er_alloc(sizeof(int) * (size_t)max_rows);
    b->mask = er_alloc((size_t)max_rows);
    if (!b->live || !b->tok || !b->slot || !b->mask) {
        decode_batch_free(b);
        return ER_ENOMEM;
    }
    return ER_OK;
}

void decode_batch_free(DecodeBatch *b) {
    while (b->n_live > 0)
        decode_batch_end(b, b->live[0], NULL);
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

int decode_batch_add(DecodeBatch *b, const int *prompt, int n_prompt, const GenConfig *g, GenTokenFn cb, void *user,
              GenSample *out, EngineRequest **req) {
    *req = NULL;
    if (g->adapter && g->adapter != b->adapter)
        return er_error(ER_EINVAL, "batch: a request's adapter must be the batch's (one forward takes one adapter)");
    if (g->n_samples < 1 || decode_batch_rows(b) + g->n_samples > b->max_rows)
        return er_error(ER_ERANGE, "batch: %d samples do not fit the %d free rows of %d", g->n_samples,
                        b->max_rows - decode_batch_rows(b), b->max_rows);
    ER_TRY(engine_request_begin(&b->e, prompt, n_prompt, g, cb, user, out, req));
    b->live[b->n_live++] = *req;
    return ER_OK;
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
    const float *logits = b->e.decode.logits;
    for (int k = 0; k < b->n_live; k++) {
        int n = engine_request_pending_rows(b->live[k]);
        if (rc < 0)
            engine_request_fail(b->live[k], rc);
        else
            engine_request_accept(&b->e, b->live[k], logits);
        logits += (size_t)n * b->e.model->cfg.V;
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
