// A hybrid-thinking model (Qwen3's template) runs the routed pipeline with its thinking switch as the two
// routes: the direct route's response starts with the empty think block, the reasoning route's with
// "<think>\n", both right after the prompt whose KV cache they reuse; without an adapter, through the
// pipeline, the C API (session and batch, streamed and not); the hard budget on the base's own thinking; a
// model that is not hybrid keeps today's behaviour.
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/strbuf.h"
#include "data/chat.h"
#include "data/grade.h"
#include "infer/erinfer.h"
#include "infer/pipeline.h"
#include "tests/common/api_helpers.h"
#include "tests/common/helpers.h"

static const char *QUESTION = "Start with 7. Add 5. What is the result?";

// ids of a then b, encoded apart (as the engine prefills a prompt, then a forced prefix).
static int *concat_ids(const Tokenizer *tok, const char *a, const char *b, int *n) {
    int *x, *y, nx, ny;
    cr_assert_eq(tok_encode(tok, a, strlen(a), &x, &nx), 0);
    cr_assert_eq(tok_encode(tok, b, strlen(b), &y, &ny), 0);
    int *out = malloc(sizeof(int) * (size_t)(nx + ny));
    memcpy(out, x, sizeof(int) * (size_t)nx);
    memcpy(out + nx, y, sizeof(int) * (size_t)ny);
    *n = nx + ny;
    er_free(x);
    er_free(y);
    return out;
}

// The pipeline on a hybrid base without adapter or heads: each forced route generates exactly what the
// base generates after the prompt and that route's think block, from the prompt's cache.
Test(thinking, pipeline_routes_are_the_switch_after_the_cached_prompt) {
    Model m;
    Tokenizer *tok;
    helper_tiny_setup(&m, &tok, NULL);
    ChatMessage msg = {"user", QUESTION};
    char *prompt;
    cr_assert_eq(chat_render(CHAT_QWEN3, &msg, 1, CHAT_ADD_GENERATION_PROMPT, &prompt, NULL), 0);
    int *ids, n;
    cr_assert_eq(tok_encode(tok, prompt, strlen(prompt), &ids, &n), 0);
    Engine e, ref;
    cr_assert_eq(engine_init(&e, &m, tok, KV_F32, 1, 256, 128, 0), 0);
    cr_assert_eq(engine_init(&ref, &m, tok, KV_F32, 1, 256, 128, 0), 0);
    GenConfig g;
    gen_config_default(&g);
    g.max_new = 12;
    g.sampler.temperature = 0; // greedy, as the direct route always is
    g.response_prefix = CHAT_THINK_ON; // as the C API sets it on a hybrid model
    static const int force[2] = {PIPELINE_DIRECT, PIPELINE_REASONING};
    static const char *const start[2] = {CHAT_THINK_OFF, CHAT_THINK_ON};
    for (int k = 0; k < 2; k++) {
        PipelineConfig c = {NULL, NULL, g, g, force[k], 1};
        GenSample out;
        PipelineResult r;
        cr_assert_eq(pipeline_run(&e, ids, n, &c, NULL, NULL, &out, &r), 0, "%s", er_last_error());
        cr_assert_eq(r.route, k ? ROUTE_REASONING : ROUTE_DIRECT);
        cr_assert_str_eq(r.response_prefix, start[k]);
        cr_expect_eq(r.gen.prompt_reused, n, "the route's generation reuses the whole prompt the prefill computed");
        // The same tokens as the base greedy after the prompt and the block, fed as one text.
        int nw, *want = concat_ids(tok, prompt, start[k], &nw);
        GenConfig plain = g;
        plain.response_prefix = NULL;
        GenSample w;
        GenStats st;
        cr_assert_eq(engine_generate(&ref, want, nw, &plain, NULL, NULL, &w, &st), 0, "%s", er_last_error());
        cr_assert_eq(out.n_tokens, w.n_tokens, "route %d", k);
        for (int i = 0; i < w.n_tokens; i++)
            cr_expect_eq(out.tokens[i], w.tokens[i], "route %d token %d", k, i);
        cr_expect_eq(out.think_len, k ? w.think_len : 0, "thinking off: no think length");
        gen_samples_free(&w, 1);
        free(want);
        gen_samples_free(&out, 1);
        pipeline_result_free(&r);
    }
    // A non-hybrid config without adapter has no reasoning route: forced "reasoning" answers directly.
    PipelineConfig plain = {NULL, NULL, g, g, PIPELINE_REASONING, 0};
    GenSample out;
    PipelineResult r;
    cr_assert_eq(pipeline_run(&e, ids, n, &plain, NULL, NULL, &out, &r), 0, "%s", er_last_error());
    cr_expect_eq(r.route, ROUTE_DIRECT);
    cr_expect_null(r.response_prefix, "no think block forced on a model that is not hybrid");
    gen_samples_free(&out, 1);
    pipeline_result_free(&r);
    engine_free(&e);
    engine_free(&ref);
    er_free(ids);
    er_free(prompt);
    helper_tiny_teardown(&m, tok, NULL);
}

// The hard budget on the base's own thinking (opened by the forced "<think>\n", or by the model): the
// suffix closes it at the budget; a prefix that closed the block (thinking off) leaves nothing to bound.
Test(thinking, hard_budget_on_native_thinking) {
    Model m;
    Tokenizer *tok;
    helper_tiny_setup(&m, &tok, NULL);
    ChatMessage msg = {"user", QUESTION};
    char *prompt;
    cr_assert_eq(chat_render(CHAT_QWEN3, &msg, 1, CHAT_ADD_GENERATION_PROMPT, &prompt, NULL), 0);
    int *ids, n;
    cr_assert_eq(tok_encode(tok, prompt, strlen(prompt), &ids, &n), 0);
    Engine e;
    cr_assert_eq(engine_init(&e, &m, tok, KV_F32, 2, 256, 16, 0), 0);
    GenConfig g;
    gen_config_default(&g);
    g.n_samples = 2;
    g.sampler.temperature = 1.0f;
    g.seed = 5;
    g.budget = 8;
    g.answer_tokens = 12;
    g.max_new = 20;
    static const char *const prefixes[3] = {CHAT_THINK_ON, NULL, CHAT_THINK_OFF};
    for (int k = 0; k < 3; k++) {
        g.response_prefix = prefixes[k];
        GenSample out[2];
        GenStats st;
        cr_assert_eq(engine_generate(&e, ids, n, &g, NULL, NULL, out, &st), 0, "%s", er_last_error());
        for (int i = 0; i < 2; i++) {
            if (k == 2) {
                cr_expect_eq(out[i].think_len, 0);
                cr_expect_eq(out[i].budget_cut, 0, "thinking off: nothing forced");
                continue;
            }
            cr_expect_leq(out[i].think_len, g.budget, "prefix %d sample %d", k, i);
            if (out[i].budget_cut) {
                cr_expect(strstr(out[i].text, "</think>"), "%s", out[i].text);
                cr_expect_geq(out[i].answer_at, 0);
            }
        }
        gen_samples_free(out, 2);
    }
    engine_free(&e);
    er_free(ids);
    er_free(prompt);
    helper_tiny_teardown(&m, tok, NULL);
}

typedef struct {
    StrBuf text;
} Acc;

static int on_token(void *user, int sample, const char *text, size_t len) {
    strbuf_put(&((Acc *)user)->text, text, len);
    return 0;
}

// The prompt the template renders for QUESTION (a new string, er_free).
static char *api_prompt(ErModel *m) {
    ErMessage msg = {"user", QUESTION};
    int len = er_apply_template(m, &msg, 1, 1, NULL, 0);
    cr_assert_gt(len, 0, "%s", er_last_error());
    char *p = er_alloc((size_t)len + 1);
    cr_assert_eq(er_apply_template(m, &msg, 1, 1, p, (size_t)len + 1), len);
    return p;
}

// er_generate with ErGenParams.route on a hybrid model without adapter or heads: each route's response
// is the base's continuation of the prompt and its think block, streamed or not; the prompt's cache is
// reused by the next call.
Test(thinking, c_api_routes_streamed_and_not) {
    char *dir = helper_tmpdir("er_think_");
    helper_make_hybrid_model(dir);
    ErModel *m;
    cr_assert_eq(er_model_load(&m, dir), 0, "%s", er_last_error());
    ErSession *s, *ref;
    cr_assert_eq(helper_session_open(&s, m, 1, 512, 0), 0, "%s", er_last_error());
    cr_assert_eq(helper_session_open(&ref, m, 1, 512, 0), 0, "%s", er_last_error());
    char *prompt = api_prompt(m);
    cr_assert(!strstr(prompt, "<think>"), "the shared prompt holds no think block: %s", prompt);
    ErMessage msg = {"user", QUESTION};
    static const char *const routes[2] = {"direct", "reasoning"};
    static const char *const start[2] = {CHAT_THINK_OFF, CHAT_THINK_ON};
    for (int k = 0; k < 2; k++) {
        for (int stream = 0; stream < 2; stream++) {
            ErGenParams p;
            er_gen_params_init(&p);
            p.max_new_tokens = 12;
            p.route = routes[k];
            Acc acc = {{0}};
            strbuf_puts(&acc.text, "");
            cr_assert_eq(er_generate(s, &msg, 1, &p, stream ? on_token : NULL, &acc), 0, "%s", er_last_error());
            const ErRoute *rt = er_result_route(s);
            cr_assert(rt, "a forced route on a hybrid model runs the pipeline");
            cr_expect_eq(rt->route, k ? ER_ROUTE_REASONING : ER_ROUTE_DIRECT);
            cr_assert_str_eq(rt->response_prefix, start[k]);
            const ErSample *x = er_result_sample(s, 0);
            if (stream)
                cr_expect_str_eq(acc.text.p, x->text, "the streamed chunks are the text");
            // The same prompt as the call before: it comes from the cache, all but its last position, which
            // gives the logits again (the cache's sequence went on into the last call's think block).
            if (k || stream)
                cr_expect_eq(er_result_stats(s)->prompt_reused, er_result_stats(s)->prompt_tokens - 1, "%d of %d",
                             er_result_stats(s)->prompt_reused, er_result_stats(s)->prompt_tokens);
            er_free(acc.text.p);
            // The raw text prompt + think block, without a route: the same tokens.
            char *raw = er_alloc(strlen(prompt) + strlen(start[k]) + 1);
            strcpy(raw, prompt);
            strcat(raw, start[k]);
            ErGenParams q = p;
            q.route = NULL;
            cr_assert_eq(er_generate_raw(ref, raw, &q, NULL, NULL), 0, "%s", er_last_error());
            cr_expect_null(er_result_route(ref));
            const ErSample *w = er_result_sample(ref, 0);
            cr_assert_eq(x->n_tokens, w->n_tokens);
            cr_expect_eq(memcmp(x->tokens, w->tokens, sizeof(int) * (size_t)w->n_tokens), 0, "route %s", routes[k]);
            er_free(raw);
        }
    }
    // Without a route and heads the model chooses (Qwen3's default): no pipeline, nothing forced.
    ErGenParams p;
    er_gen_params_init(&p);
    p.max_new_tokens = 4;
    cr_assert_eq(er_generate(s, &msg, 1, &p, NULL, NULL), 0, "%s", er_last_error());
    cr_expect_null(er_result_route(s));
    cr_expect_gt(er_model_extra_positions(m), 0, "the think blocks are positions the pipeline adds");
    er_free(prompt);
    er_session_free(ref);
    er_session_free(s);
    er_model_free(m);
    helper_rmdir(dir);
    er_free(dir);
}

// A batch request with a forced route on a hybrid model reports it as a session does.
Test(thinking, c_api_batch_reports_the_route) {
    char *dir = helper_tmpdir("er_think_");
    helper_make_hybrid_model(dir);
    ErModel *m;
    cr_assert_eq(er_model_load(&m, dir), 0, "%s", er_last_error());
    ErBatch *b;
    cr_assert_eq(helper_batch_open(&b, m, 2, 512, 0), 0, "%s", er_last_error());
    char *prompt = api_prompt(m);
    static const char *const routes[2] = {"direct", "reasoning"};
    static const char *const start[2] = {CHAT_THINK_OFF, CHAT_THINK_ON};
    ErRequest *rq[2];
    for (int k = 0; k < 2; k++) {
        ErGenParams p;
        er_gen_params_init(&p);
        p.max_new_tokens = 6;
        p.route = routes[k];
        cr_assert_eq(er_batch_submit(b, prompt, &p, NULL, NULL, &rq[k]), 0, "%s", er_last_error());
    }
    while (er_batch_step(b) > 0) {
    }
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(er_request_status(rq[k]), 0);
        const ErRoute *rt = er_request_route(rq[k]);
        cr_assert(rt);
        cr_expect_eq(rt->route, k ? ER_ROUTE_REASONING : ER_ROUTE_DIRECT);
        cr_expect_str_eq(rt->response_prefix, start[k]);
        er_request_free(rq[k]);
    }
    er_free(prompt);
    er_batch_free(b);
    er_model_free(m);
    helper_rmdir(dir);
    er_free(dir);
}

// Not hybrid (the tiny ChatML template), no adapter: "reasoning" is refused and says why; "direct" runs
// no pipeline, as before.
Test(thinking, c_api_model_that_is_not_hybrid) {
    char *dir = helper_tmpdir("er_think_");
    helper_make_model(dir);
    ErModel *m;
    cr_assert_eq(er_model_load(&m, dir), 0, "%s", er_last_error());
    ErSession *s;
    cr_assert_eq(helper_session_open(&s, m, 1, 256, 0), 0, "%s", er_last_error());
    ErMessage msg = {"user", QUESTION};
    ErGenParams p;
    er_gen_params_init(&p);
    p.max_new_tokens = 4;
    p.route = "reasoning";
    cr_assert_eq(er_generate(s, &msg, 1, &p, NULL, NULL), ER_EINVAL);
    cr_expect(strstr(er_last_error(), "hybrid-thinking"), "%s", er_last_error());
    p.route = "direct";
    cr_assert_eq(er_generate(s, &msg, 1, &p, NULL, NULL), 0, "%s", er_last_error());
    cr_expect_null(er_result_route(s));
    cr_expect_eq(er_model_extra_positions(m), 0);
    er_session_free(s);
    er_model_free(m);
    helper_rmdir(dir);
    er_free(dir);
}
