// Batched decode across requests (infer/decode_batch.h) against each request decoded alone by
// engine_generate on an engine of its own: for fixed seeds every request's tokens, logprobs
// (bitwise), text, finish and streamed chunks are the same, with prompts of different lengths (two
// sharing a prefix, which the batch reuses, and one repeated after others), different max_tokens,
// samplers, seeds and sample counts, a stop string, the hard budget, the masked adapter on some
// rows only, a callback that stops a sample, and requests arriving mid-way and waiting for rows.
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "infer/decode_batch.h"
#include "tests/common/heads_helpers.h"
#include "tests/common/streamed.h"

static Model model;
static Tokenizer *tok;
static LoraAdapter ad;

static void setup(void) { helper_tiny_setup(&model, &tok, &ad); }
static void teardown(void) { helper_tiny_teardown(&model, tok, &ad); }
TestSuite(decode_batch, .init = setup, .fini = teardown);

enum { NREQ = 5, MAXN = 2 /* <= 3, Streamed */, ROWS = 4, PROMPTS = 3, MAX_LEN = 256, CHUNK = 16 };

typedef struct {
    const char *text;
    int arrive;     // the step at which it is submitted
    int shares;     // the earlier request whose cached prompt it is prefilled from (-1 = none)
    int stop_after; // the callback stops sample 0
    GenConfig g;
    int *ids, n;
} Req;

static void requests(Req *r, const char **stop) {
    static const char *A = "Start with 7. Add 5. Multiply by 3. Subtract 4. Divide by 2. What is the result?";
    static const char *S1 = "System: answer briefly and check your arithmetic twice.\nUser: What is 12 * 12?";
    static const char *S2 = "System: answer briefly and check your arithmetic twice.\nUser: Name a prime above 90.";
    const char *texts[NREQ] = {A, S1, S2, "Hi", A};
    int arrive[NREQ] = {0, 0, 3, 5, 6}, shares[NREQ] = {-1, -1, 1, -1, 0};
    for (int i = 0; i < NREQ; i++) {
        memset(&r[i], 0, sizeof r[i]);
        r[i].text = texts[i];
        r[i].arrive = arrive[i];
        r[i].shares = shares[i];
        gen_config_default(&r[i].g);
        cr_assert_eq(tok_encode(tok, texts[i], strlen(texts[i]), &r[i].ids, &r[i].n), 0);
    }
    r[0].g.max_new = 14; // greedy, base
    GenConfig *g = &r[1].g; // the adapter, two samples, the hard budget
    g->n_samples = 2, g->max_new = 26, g->sampler.temperature = 1.0f, g->sampler.top_k = 40, g->seed = 11;
    g->adapter = &ad, g->response_prefix = ad.reasoning_prefix, g->budget = 10, g->answer_tokens = 16;
    g = &r[2].g; // reuses r[1]'s prefix in the batch; a stop string
    g->max_new = 30, g->sampler.temperature = 0.8f, g->sampler.top_p = 0.9f, g->seed = 3;
    g->stop = stop, g->n_stop = stop ? 1 : 0;
    g = &r[3].g; // waits for rows; the callback stops sample 0
    g->n_samples = 2, g->max_new = 9, g->sampler.temperature = 1.2f, g->sampler.min_p = 0.05f, g->seed = 7;
    g->adapter = &ad;
    r[3].stop_after = 4;
    g = &r[4].g; // r[0]'s prompt again, still cached after three other prompts
    g->max_new = 18, g->sampler.temperature = 0.7f, g->seed = 9;
}

static void requests_free(Req *r) {
    for (int i = 0; i < NREQ; i++)
        free(r[i].ids);
}

// Request r alone on an engine of its own whose cache first saw the prompts of the `before` requests,
// as the batch's cached prompt it is prefilled from did: a prompt that reuses a cached prefix is prefilled
// from there, in chunks placed differently than a whole prefill's, and the matrix products of a
// chunk round differently with its length (last bits of the logits); the decode rows do not.
static void run_alone(const Req *r, const Req *before, int n_before, KvType kv, GenSample *out, Streamed *s) {
    Engine e;
    cr_assert_eq(engine_init(&e, &model, tok, kv, r->g.n_samples, MAX_LEN, CHUNK, 0), 0, "%s", er_last_error());
    for (int k = 0; k < n_before; k++)
        cr_assert_eq(engine_prefill(&e, before[k].ids, before[k].n, before[k].g.adapter, NULL, NULL, NULL), 0, "%s",
                     er_last_error());
    memset(s, 0, sizeof *s);
    s->stop_after = r->stop_after;
    GenStats st;
    cr_assert_eq(engine_generate(&e, r->ids, r->n, &r->g, streamed_collect, s, out, &st), 0, "%s", er_last_error());
    engine_free(&e);
}

// A stop string from r's own output: the bytes of a token well inside it (the first match may come
// earlier; alone and batched must agree either way).
static void pick_stop(const Req *r, KvType kv, char *stop) {
    GenSample o;
    Streamed s;
    run_alone(r, NULL, 0, kv, &o, &s);
    stop[0] = 0;
    for (int k = 8; k < o.n_tokens && !stop[0]; k++) {
        size_t nb;
        const char *b = tok_token_bytes(tok, o.tokens[k], &nb);
        if (b && nb >= 2 && nb < 8 && !memchr(b, 0, nb)) {
            memcpy(stop, b, nb);
            stop[nb] = 0;
        }
    }
    cr_assert(stop[0], "no token to stop at in %d tokens", o.n_tokens);
    gen_samples_free(&o, 1);
}

static void assert_same(const GenSample *a, const GenSample *b, const Streamed *sa, const Streamed *sb, int n,
                        int req) {
    for (int i = 0; i < n; i++) {
        cr_assert_eq(a[i].n_tokens, b[i].n_tokens, "request %d sample %d: %d tokens batched, %d alone", req, i,
                     a[i].n_tokens, b[i].n_tokens);
        for (int t = 0; t < a[i].n_tokens; t++) {
            cr_assert_eq(a[i].tokens[t], b[i].tokens[t], "request %d sample %d token %d", req, i, t);
            cr_assert(memcmp(&a[i].logprobs[t], &b[i].logprobs[t], sizeof(float)) == 0,
                      "request %d sample %d logprob %d: %.9g vs %.9g", req, i, t, a[i].logprobs[t], b[i].logprobs[t]);
        }
        cr_assert_eq(a[i].text_len, b[i].text_len);
        cr_assert(memcmp(a[i].text, b[i].text, a[i].text_len) == 0, "request %d sample %d text", req, i);
        cr_assert_eq(a[i].finish, b[i].finish, "request %d sample %d finish", req, i);
        cr_assert_eq(a[i].budget_cut, b[i].budget_cut);
        cr_assert_eq(a[i].answer_at, b[i].answer_at);
        cr_assert_eq(a[i].think_len, b[i].think_len, "request %d sample %d think length", req, i);
        cr_assert_eq(sa->len[i], a[i].text_len, "request %d sample %d: streamed bytes differ from the text", req, i);
        cr_assert(memcmp(sa->buf[i], sb->buf[i], sa->len[i]) == 0);
        cr_assert_eq(sa->calls[i], sb->calls[i]);
    }
}

static void check_batch_equals_alone(KvType kv) {
    Req r[NREQ];
    char stop[8];
    requests(r, NULL);
    pick_stop(&r[2], kv, stop);
    const char *stops[1] = {stop};
    r[2].g.stop = stops, r[2].g.n_stop = 1;

    GenSample alone[NREQ][MAXN], got[NREQ][MAXN];
    Streamed s_alone[NREQ], s_got[NREQ];
    for (int i = 0; i < NREQ; i++)
        run_alone(&r[i], r[i].shares >= 0 ? &r[r[i].shares] : NULL, r[i].shares >= 0, kv, alone[i], &s_alone[i]);
    cr_assert_eq(alone[2][0].finish, FINISH_STOP, "the stop string must end request 2");
    cr_assert(alone[1][0].budget_cut || alone[1][1].budget_cut, "the budget must cut a sample of request 1");
    for (int i = 0; i < 2; i++) // the budget bounds the think length: a cut sample's ends at B
        cr_assert(!alone[1][i].budget_cut || alone[1][i].think_len == r[1].g.budget, "request 1 sample %d: L %d", i,
                  alone[1][i].think_len);
    cr_assert_eq(alone[3][0].finish, FINISH_STOP, "the callback must stop request 3's sample 0");

    DecodeBatch b;
    cr_assert_eq(decode_batch_init(&b, &model, tok, &ad, kv, ROWS, PROMPTS, MAX_LEN, CHUNK, 0), 0, "%s",
                 er_last_error());
    EngineRequest *h[NREQ] = {0};
    int next = 0, ended = 0, waited = 0, max_live = 0;
    long positions0 = b.e.forward_positions;
    for (int step = 0; ended < NREQ; step++) {
        // Arrivals join between steps, in order, while their samples fit.
        while (next < NREQ && r[next].arrive <= step && decode_batch_rows(&b) + r[next].g.n_samples <= ROWS) {
            memset(&s_got[next], 0, sizeof s_got[next]);
            s_got[next].stop_after = r[next].stop_after;
            Req *q = &r[next];
            cr_assert_eq(decode_batch_add(&b, q->ids, q->n, &q->g, streamed_collect, &s_got[next], got[next], &h[next]),
                         0, "%s", er_last_error());
            next++;
        }
        if (next < NREQ && r[next].arrive <= step)
            waited = 1;
        if (b.n_live > max_live)
            max_live = b.n_live;
        decode_batch_step(&b);
        for (int i = 0; i < next; i++)
            if (h[i] && engine_request_done(h[i])) {
                GenStats st;
                cr_assert_eq(decode_batch_end(&b, h[i], &st), 0, "request %d: %s", i, er_last_error());
                if (i == 2)
                    cr_assert_gt(st.prompt_reused, 0, "request 2 shares request 1's system prompt");
                if (i == 4) // interleaved prompts did not evict it
                    cr_assert_eq(st.prompt_reused, r[4].n, "request 4 repeats request 0's prompt");
                h[i] = NULL;
                ended++;
            }
        cr_assert_lt(step, 1000);
    }
    cr_assert(waited, "a request must have waited for free rows");
    cr_assert_geq(max_live, 3, "the steps must hold several requests at once");
    long generated = 0;
    for (int i = 0; i < NREQ; i++) {
        assert_same(got[i], alone[i], &s_got[i], &s_alone[i], r[i].g.n_samples, i);
        for (int k = 0; k < r[i].g.n_samples; k++)
            generated += got[i][k].n_tokens;
        gen_samples_free(got[i], r[i].g.n_samples);
        gen_samples_free(alone[i], r[i].g.n_samples);
    }
    // Fewer forwards than tokens: rows of different requests shared them.
    cr_assert_lt(b.steps, generated / 2, "%ld steps for %ld tokens", b.steps, generated);
    cr_assert_gt(b.e.forward_positions, positions0);
    int cached = 0;
    for (int k = 0; k < PROMPTS; k++)
        cached += b.prompts[k].slot >= 0 ? b.e.kv.seqs[b.prompts[k].slot].n_blocks : 0;
    cr_assert_eq(kv_cache_blocks_in_use(&b.e.kv), cached, "only the cached prompts hold blocks once all ended");
    decode_batch_free(&b);
    requests_free(r);
}

Test(decode_batch, requests_decoded_together_equal_each_decoded_alone) { check_batch_equals_alone(KV_F32); }
Test(decode_batch, requests_decoded_together_equal_each_decoded_alone_int8_kv) { check_batch_equals_alone(KV_INT8); }

// Admission refuses what the batch cannot hold, without touching the live requests.
Test(decode_batch, admission_refuses_more_rows_than_free_and_another_adapter) {
    DecodeBatch b;
    cr_assert_eq(decode_batch_init(&b, &model, tok, NULL, KV_F32, 2, 1, MAX_LEN, CHUNK, 0), 0, "%s", er_last_error());
    int ids[3] = {10, 11, 12};
    GenConfig g;
    gen_config_default(&g);
    g.n_samples = 3;
    g.max_new = 8;
    GenSample out[3];
    EngineRequest *h;
    cr_assert_eq(decode_batch_add(&b, ids, 3, &g, NULL, NULL, out, &h), ER_ERANGE);
    g.n_samples = 1;
    g.adapter = &ad;
    cr_assert_eq(decode_batch_add(&b, ids, 3, &g, NULL, NULL, out, &h), ER_EINVAL);
    g.adapter = NULL;
    g.keep_kv = 1; // only a routed request keeps its samples (its end releases them)
    cr_assert_eq(decode_batch_add(&b, ids, 3, &g, NULL, NULL, out, &h), ER_EINVAL);
    g.keep_kv = 0;
    cr_assert_eq(decode_batch_add(&b, ids, 3, &g, NULL, NULL, out, &h), 0, "%s", er_last_error());
    cr_assert_eq(decode_batch_rows(&b), 1);
    decode_batch_free(&b); // ends the live request; its texts are ours
    gen_samples_free(out, 1);
}
