// ErCallbacks: the log (what a load found, a session's size, a head fitted on another KV cache type), progress
// (a load's steps, a prefill's positions) and abort (polled between load steps, prefill chunks and decode
// steps: ER_EABORTED, and the session generates the next call exactly as a fresh one would, reusing the chunks
// computed before the abort). Every callback runs on the thread of the call.
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "infer/erinfer.h"
#include "infer/runner.h"
#include "model/head.h"
#include "tests/common/api_helpers.h"
#include "tests/common/heads_helpers.h"
#include "tests/common/helpers.h"

static HelperFixture fx; // per test: the temp dir and tmp/model

static void setup(void) { helper_fixture_open(&fx, "er_api_cb_", NULL); }
static void teardown(void) { helper_fixture_close(&fx); }
TestSuite(api_callbacks, .init = setup, .fini = teardown);

enum { MAX_CALLS = 4096 };

// What the callbacks saw.
typedef struct {
    pthread_t caller;
    int off_thread;                     // calls from another thread than the caller's
    int n_log, levels[64];
    char lines[64][512];
    int n_progress, phase[MAX_CALLS];
    long done[MAX_CALLS], total[MAX_CALLS];
    int polls, abort_at;                // abort_at: the poll that says stop (1-based); 0 = never
} Seen;

static void on_log(void *user, int level, const char *line) {
    Seen *s = user;
    s->off_thread += !pthread_equal(pthread_self(), s->caller);
    if (s->n_log < 64) {
        s->levels[s->n_log] = level;
        snprintf(s->lines[s->n_log], sizeof s->lines[0], "%s", line);
    }
    s->n_log++;
}

static void on_progress(void *user, int phase, long done, long total) {
    Seen *s = user;
    s->off_thread += !pthread_equal(pthread_self(), s->caller);
    if (s->n_progress < MAX_CALLS) {
        s->phase[s->n_progress] = phase;
        s->done[s->n_progress] = done;
        s->total[s->n_progress] = total;
    }
    s->n_progress++;
}

static int on_abort(void *user) {
    Seen *s = user;
    s->off_thread += !pthread_equal(pthread_self(), s->caller);
    return ++s->polls == s->abort_at;
}

static ErCallbacks callbacks(Seen *s) {
    memset(s, 0, sizeof *s);
    s->caller = pthread_self();
    ErCallbacks cb;
    er_callbacks_init(&cb);
    cb.user = s;
    cb.log = on_log;
    cb.progress = on_progress;
    cb.abort = on_abort;
    return cb;
}

static const char *find_line(const Seen *s, const char *needle) {
    for (int i = 0; i < s->n_log && i < 64; i++)
        if (strstr(s->lines[i], needle))
            return s->lines[i];
    return NULL;
}

Test(api_callbacks, a_load_reports_its_steps_and_what_it_found) {
    Seen seen;
    ErCallbacks cb = callbacks(&seen);
    ErModel *m;
    cr_assert_eq(er_model_load_ex(&m, fx.model, &cb), ER_OK, "%s", er_last_error());
    // The tiny model: 2 layers x 7 matrices + the embedding (tied) = 15 matrices, + the files + the tokenizer.
    cr_assert_eq(seen.n_progress, 17, "%d progress calls", seen.n_progress);
    for (int i = 0; i < seen.n_progress; i++) {
        cr_assert_eq(seen.phase[i], ER_PROGRESS_LOAD);
        cr_assert_eq(seen.total[i], 17);
        cr_assert_eq(seen.done[i], i + 1, "call %d: done %ld", i, seen.done[i]);
    }
    const char *line = find_line(&seen, "loaded ");
    cr_assert(line && strstr(line, fx.model) && strstr(line, "2 layers") && strstr(line, "chat template chatml"),
              "no load line: %s", seen.n_log ? seen.lines[0] : "(none)");
    cr_assert_eq(seen.levels[0], ER_LOG_INFO);
    // The model's log serves a session without one of its own; a session's own takes its messages.
    int before = seen.n_log;
    ErSession *s;
    cr_assert_eq(helper_session_open(&s, m, 2, 128, 1), ER_OK, "%s", er_last_error());
    cr_assert_eq(seen.n_log, before + 1);
    cr_assert(strstr(seen.lines[before], "2 samples x 128 positions, KV cache int8"), "%s", seen.lines[before]);
    er_session_free(s);
    Seen own;
    ErCallbacks scb = callbacks(&own);
    ErSessionParams sp = helper_session_params(1, 64, 0);
    sp.callbacks = &scb;
    sp.n_threads = 1;
    cr_assert_eq(er_session_open(&s, m, &sp), ER_OK, "%s", er_last_error());
    cr_assert_eq(seen.n_log, before + 1, "the model's log got the session's message");
    cr_assert_eq(own.n_log, 1);
    cr_assert(strstr(own.lines[0], "1 samples x 64 positions, KV cache f32") && strstr(own.lines[0], "1 threads"),
              "%s", own.lines[0]);
    er_session_free(s);
    cr_assert_eq(seen.off_thread + own.off_thread, 0, "a callback ran on another thread");
    er_model_free(m);
}

Test(api_callbacks, an_aborted_load_leaves_no_model) {
    for (int at = 1; at <= 3; at++) {
        Seen seen;
        ErCallbacks cb = callbacks(&seen);
        seen.abort_at = at;
        ErModel *m = (ErModel *)0x1;
        cr_assert_eq(er_model_load_ex(&m, fx.model, &cb), ER_EABORTED, "poll %d: %s", at, er_last_error());
        cr_assert_null(m);
        cr_assert(strstr(er_last_error(), "er_model_load") && strstr(er_last_error(), fx.model) &&
                      strstr(er_last_error(), "abort"), "%s", er_last_error());
        cr_assert_eq(seen.n_progress, at, "stopped at the poll that said so");
    }
    cr_assert_str_eq(er_status_name(ER_EABORTED), "aborted");
}

// A prompt of about 700 tokens: six prefill chunks of 128.
static char *long_prompt(void) {
    static const char step[] = "Add 3. Multiply by 2. Subtract 1. ";
    char *t = malloc(50 * sizeof step + 64);
    strcpy(t, "Start with 2. ");
    for (int i = 0; i < 50; i++)
        strcat(t, step);
    strcat(t, "What is the result?");
    return t;
}

typedef struct {
    int n;
    int tokens[64];
    float logprobs[64];
    char text[1024];
} Result;

static void keep(const ErSession *s, Result *r) {
    const ErSample *x = er_result_sample(s, 0);
    cr_assert(x);
    r->n = x->n_tokens;
    memcpy(r->tokens, x->tokens, sizeof(int) * (size_t)x->n_tokens);
    memcpy(r->logprobs, x->logprobs, sizeof(float) * (size_t)x->n_tokens);
    snprintf(r->text, sizeof r->text, "%s", x->text);
}

static ErGenParams gen_params(void) {
    ErGenParams p;
    er_gen_params_init(&p);
    p.max_new_tokens = 24;
    p.temperature = 0.8f;
    p.seed = 11;
    return p;
}

// The same prompt on a fresh session, no callbacks.
static Result fresh_result(ErModel *m, const char *prompt) {
    ErSession *s;
    cr_assert_eq(helper_session_open(&s, m, 1, 1024, 0), ER_OK, "%s", er_last_error());
    ErGenParams p = gen_params();
    cr_assert_eq(er_generate_raw(s, prompt, &p, NULL, NULL), ER_OK, "%s", er_last_error());
    Result r;
    keep(s, &r);
    er_session_free(s);
    return r;
}

static void expect_same(const Result *a, const Result *b) {
    cr_assert_eq(a->n, b->n);
    cr_assert_arr_eq(a->tokens, b->tokens, sizeof(int) * (size_t)a->n);
    cr_assert_arr_eq(a->logprobs, b->logprobs, sizeof(float) * (size_t)a->n, "the same logprobs, bit for bit");
    cr_assert_str_eq(a->text, b->text);
}

static int count_tokens(ErModel *m, const char *text) {
    int *ids, n;
    cr_assert_eq(tok_encode(runner_model_tokenizer(m), text, strlen(text), &ids, &n), ER_OK, "%s", er_last_error());
    er_free(ids);
    return n;
}

Test(api_callbacks, abort_mid_prefill_then_the_next_call_is_a_fresh_sessions) {
    ErModel *m;
    cr_assert_eq(er_model_load(&m, fx.model), ER_OK, "%s", er_last_error());
    char *prompt = long_prompt();
    int P = count_tokens(m, prompt);
    cr_assert_gt(P, 5 * 128, "the prompt has %d tokens", P);
    Result want = fresh_result(m, prompt);

    Seen seen;
    ErCallbacks cb = callbacks(&seen);
    seen.abort_at = 3; // polled before each chunk: two chunks run, the third is not started
    ErSessionParams sp = helper_session_params(1, 1024, 0);
    sp.callbacks = &cb;
    ErSession *s;
    cr_assert_eq(er_session_open(&s, m, &sp), ER_OK, "%s", er_last_error());
    int streamed = 0;
    ErGenParams p = gen_params();
    cr_assert_eq(er_generate_raw(s, prompt, &p, NULL, &streamed), ER_EABORTED, "%s", er_last_error());
    cr_assert(strstr(er_last_error(), "prefill") && strstr(er_last_error(), "abort") &&
                  strstr(er_last_error(), "256"), "%s", er_last_error());
    cr_assert_eq(er_result_count(s), 0, "an aborted call leaves no results");
    cr_assert_null(er_result_sample(s, 0));
    // Progress: positions in the cache out of the prompt's, before the first chunk and after each.
    cr_assert_eq(seen.n_progress, 3);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(seen.phase[i], ER_PROGRESS_PREFILL);
        cr_assert_eq(seen.done[i], 128 * i);
        cr_assert_eq(seen.total[i], P);
    }

    seen.abort_at = 0;
    seen.n_progress = 0;
    cr_assert_eq(er_generate_raw(s, prompt, &p, NULL, NULL), ER_OK, "%s", er_last_error());
    cr_assert_eq(er_result_stats(s)->prompt_reused, 256, "the chunks computed before the abort are reused");
    Result got;
    keep(s, &got);
    expect_same(&got, &want);
    cr_assert_eq(seen.done[0], 256);
    cr_assert_eq(seen.done[seen.n_progress - 1], P, "the last progress call has done == total");
    cr_assert_eq(seen.total[seen.n_progress - 1], P);

    // The same prompt again: all of it reused, one progress call saying so.
    seen.n_progress = 0;
    cr_assert_eq(er_generate_raw(s, prompt, &p, NULL, NULL), ER_OK, "%s", er_last_error());
    cr_assert_eq(seen.n_progress, 1);
    cr_assert(seen.done[0] == P && seen.total[0] == P);
    cr_assert_eq(seen.off_thread, 0, "a callback ran on another thread");
    free(prompt);
    er_session_free(s);
    er_model_free(m);
}

// An abort in the first poll: before any chunk, nothing computed, nothing kept but the session.
Test(api_callbacks, abort_before_the_first_chunk_and_during_decode) {
    ErModel *m;
    cr_assert_eq(er_model_load(&m, fx.model), ER_OK, "%s", er_last_error());
    char *prompt = long_prompt();
    int P = count_tokens(m, prompt), chunks = (P + 127) / 128;
    Result want = fresh_result(m, prompt);
    Seen seen;
    ErCallbacks cb = callbacks(&seen);
    ErSessionParams sp = helper_session_params(1, 1024, 0);
    sp.callbacks = &cb;
    ErSession *s;
    cr_assert_eq(er_session_open(&s, m, &sp), ER_OK, "%s", er_last_error());
    ErGenParams p = gen_params();
    seen.abort_at = 1;
    cr_assert_eq(er_generate_raw(s, prompt, &p, NULL, NULL), ER_EABORTED);
    cr_assert_eq(er_result_count(s), 0);
    // In the decode: the prefill's polls, then 5 decode steps.
    seen.polls = 0;
    seen.abort_at = chunks + 6;
    cr_assert_eq(er_generate_raw(s, prompt, &p, NULL, NULL), ER_EABORTED, "%s", er_last_error());
    cr_assert(strstr(er_last_error(), "decode") && strstr(er_last_error(), "abort"), "%s", er_last_error());
    cr_assert_eq(er_result_count(s), 0);
    seen.abort_at = 0;
    cr_assert_eq(er_generate_raw(s, prompt, &p, NULL, NULL), ER_OK, "%s", er_last_error());
    cr_assert_eq(er_result_stats(s)->prompt_reused, P, "the whole prompt stayed in the cache");
    Result got;
    keep(s, &got);
    expect_same(&got, &want);
    free(prompt);
    er_session_free(s);
    er_model_free(m);
}

// A batch's submit polls during its prompt's prefill: the request is refused, the batch goes on.
Test(api_callbacks, abort_during_a_batch_submit) {
    ErModel *m;
    cr_assert_eq(er_model_load(&m, fx.model), ER_OK, "%s", er_last_error());
    char *prompt = long_prompt();
    Result want = fresh_result(m, prompt);
    Seen seen;
    ErCallbacks cb = callbacks(&seen);
    seen.abort_at = 2;
    ErSessionParams sp = helper_session_params(2, 1024, 0);
    sp.callbacks = &cb;
    ErBatch *b;
    cr_assert_eq(er_batch_open(&b, m, &sp), ER_OK, "%s", er_last_error());
    ErGenParams p = gen_params();
    ErRequest *r = (ErRequest *)0x1;
    cr_assert_eq(er_batch_submit(b, prompt, &p, NULL, NULL, &r), ER_EABORTED, "%s", er_last_error());
    cr_assert_null(r);
    cr_assert_eq(er_batch_free_rows(b), 2, "the aborted request holds no row");
    seen.abort_at = 0;
    cr_assert_eq(er_batch_submit(b, prompt, &p, NULL, NULL, &r), ER_OK, "%s", er_last_error());
    while (er_batch_step(b) > 0)
        ;
    cr_assert_eq(er_request_status(r), ER_OK);
    const ErSample *x = er_request_sample(r, 0);
    cr_assert_eq(x->n_tokens, want.n);
    cr_assert_arr_eq(x->tokens, want.tokens, sizeof(int) * (size_t)want.n);
    cr_assert_str_eq(x->text, want.text);
    er_request_free(r);
    er_batch_free(b);
    free(prompt);
    er_model_free(m);
}

// A switcher fitted on f32 KV features running on an int8 session: one warning per head load.
Test(api_callbacks, a_head_fitted_on_another_kv_type_is_a_warning) {
    heads_add_adapter(fx.tmp);
    heads_write_random_heads(fx.tmp, "sw", "vf", 0.0f, "\nIs this right?");
    char *sw = path_join(fx.tmp, "sw"), *ad = path_join(fx.tmp, "adapter");
    TrainedHead h;
    cr_assert_eq(trained_head_load(&h, sw, HEAD_SWITCHER, NULL), ER_OK, "%s", er_last_error());
    h.kv = HEAD_KV_F32;
    cr_assert_eq(trained_head_save(&h, sw), ER_OK, "%s", er_last_error());
    trained_head_free(&h);
    Seen seen;
    ErCallbacks cb = callbacks(&seen);
    ErModel *m;
    cr_assert_eq(er_model_load_ex(&m, fx.model, &cb), ER_OK, "%s", er_last_error());
    cr_assert_eq(er_model_load_adapter(m, ad), ER_OK, "%s", er_last_error());
    cr_assert_eq(er_model_load_switcher(m, sw), ER_OK, "%s", er_last_error());
    ErSession *s;
    cr_assert_eq(helper_session_open(&s, m, 1, 256, 1), ER_OK, "%s", er_last_error());
    ErGenParams p = gen_params();
    p.max_new_tokens = 4;
    ErMessage msg = {"user", "Start with 2. What is the result?"};
    int before = seen.n_log;
    for (int i = 0; i < 2; i++)
        cr_assert_eq(er_generate(s, &msg, 1, &p, NULL, NULL), ER_OK, "%s", er_last_error());
    cr_assert_eq(seen.n_log, before + 1, "one warning for the two calls");
    cr_assert_eq(seen.levels[before], ER_LOG_WARN);
    cr_assert(strstr(seen.lines[before], "switcher") && strstr(seen.lines[before], "f32") &&
                  strstr(seen.lines[before], "int8"), "%s", seen.lines[before]);
    // Reloaded: said again; an f32 session: nothing to say.
    cr_assert_eq(er_model_load_switcher(m, sw), ER_OK, "%s", er_last_error());
    cr_assert_eq(er_generate(s, &msg, 1, &p, NULL, NULL), ER_OK, "%s", er_last_error());
    cr_assert_eq(seen.n_log, before + 2);
    er_session_free(s);
    cr_assert_eq(helper_session_open(&s, m, 1, 256, 0), ER_OK, "%s", er_last_error());
    before = seen.n_log;
    cr_assert_eq(er_generate(s, &msg, 1, &p, NULL, NULL), ER_OK, "%s", er_last_error());
    cr_assert_eq(seen.n_log, before, "%s", seen.lines[before]);
    er_session_free(s);
    er_model_free(m);
    er_free(sw);
    er_free(ad);
}
