// The public C API against the misuses its header names: sizes whose arithmetic overflows an int, a
// batch and its requests freed in either order, calls that re-enter a session or a batch from its own
// token callback, one session used by two threads at once, and an adapter or head loaded while a
// generation reads the model. Each is refused with an error status, or (the frees, which return
// nothing) made safe; `make SAN=1 test` runs these under ASan + UBSan. The races are made
// deterministic: the second call runs on another thread started and joined inside the first call's
// token callback, so the first call is certainly in progress.
#include <criterion/criterion.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "infer/erinfer.h"
#include "tests/common/api_helpers.h"
#include "tests/common/heads_helpers.h"

static HelperFixture fx; // per test: the temp dir and tmp/model

static void setup(void) {
    threads_set(2);
    helper_fixture_open(&fx, "er_api_misuse_", NULL);
}

static void teardown(void) { helper_fixture_close(&fx); }

TestSuite(api_misuse, .init = setup, .fini = teardown);

static ErModel *load_model(void) {
    ErModel *m;
    cr_assert_eq(er_model_load(&m, fx.model), 0, "%s", er_last_error());
    return m;
}

static ErGenParams params(int max_new, int n_samples) {
    ErGenParams p;
    er_gen_params_init(&p);
    p.max_new_tokens = max_new;
    p.n_samples = n_samples;
    p.temperature = 0.8f;
    return p;
}

// ---- sizes ----

// INT_MAX samples overflowed max_samples + 1 (the KV sequences: samples and the prompt); half of INT_MAX
// rows overflowed rows + cached prompts; INT_MAX / 16 + 1 samples of 16 positions are more positions
// than a KV cache numbers. Each is refused before any size is computed from it, naming the numbers.
Test(api_misuse, session_and_batch_sizes_do_not_overflow) {
    ErModel *m = load_model();
    static const int sizes[][2] = {{INT_MAX, 16}, {INT_MAX - 1, 2}, {INT_MAX / 2 + 1, 16}, {INT_MAX / 16 + 1, 16}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        char n[32];
        snprintf(n, sizeof n, "%d", sizes[i][0]);
        ErSession *s = (ErSession *)0x1;
        cr_assert_eq(helper_session_open(&s, m, sizes[i][0], sizes[i][1], 0), ER_ERANGE, "%d samples x %d: %s",
                     sizes[i][0], sizes[i][1], er_last_error());
        cr_assert_null(s);
        cr_assert(strstr(er_last_error(), "er_session_open") && strstr(er_last_error(), n), "%s", er_last_error());
        ErBatch *b = (ErBatch *)0x1;
        cr_assert_eq(helper_batch_open(&b, m, sizes[i][0], sizes[i][1], 1), ER_ERANGE, "%d rows x %d: %s", sizes[i][0],
                     sizes[i][1], er_last_error());
        cr_assert_null(b);
        cr_assert(strstr(er_last_error(), "er_batch_open") && strstr(er_last_error(), n), "%s", er_last_error());
    }
    ErSession *s;
    cr_assert_eq(helper_session_open(&s, m, 4, 64, 0), 0, "%s", er_last_error()); // the model is still fine
    er_session_free(s);
    er_model_free(m);
}

// ---- a batch and its requests freed in either order ----

// One request done and one still decoding, then the batch and the requests freed in both orders. The
// batch stops the live request (it fails, without results) and frees its own buffers; each request
// stays the caller's until er_request_free, before or after er_batch_free (ASan: no use after free, no
// leak). Before, er_batch_free freed the live request under the caller's handle.
Test(api_misuse, batch_and_requests_free_in_either_order) {
    ErModel *m = load_model();
    for (int batch_first = 0; batch_first < 2; batch_first++) {
        ErBatch *b;
        cr_assert_eq(helper_batch_open(&b, m, 4, 128, 0), 0, "%s", er_last_error());
        ErGenParams p = params(2, 2);
        ErRequest *done, *live, *stepped;
        cr_assert_eq(er_batch_submit(b, "Start with 7.", &p, NULL, NULL, &done), 0, "%s", er_last_error());
        while (er_request_status(done) == 1)
            er_batch_step(b);
        cr_assert_eq(er_request_status(done), ER_OK);
        p = params(64, 1);
        cr_assert_eq(er_batch_submit(b, "Add 5.", &p, NULL, NULL, &stepped), 0, "%s", er_last_error());
        er_batch_step(b);
        cr_assert_eq(er_batch_submit(b, "Start with 7. Add 5.", &p, NULL, NULL, &live), 0, "%s", er_last_error());
        cr_assert_eq(er_request_status(live), 1);
        if (batch_first) {
            er_batch_free(b);
            cr_assert_eq(er_request_status(done), ER_OK, "a done request keeps its results");
            cr_assert_eq(er_request_count(done), 2);
            cr_assert_gt(er_request_sample(done, 1)->n_tokens, 0);
            cr_assert_lt(er_request_status(live), 0, "a request stopped by er_batch_free failed");
            cr_assert_eq(er_request_count(live), 0);
            cr_assert_null(er_request_sample(live, 0));
            cr_assert_null(er_request_stats(live));
            cr_assert_leq(er_request_status(stepped), 0);
            er_request_free(live);
            er_request_free(stepped);
            er_request_free(done);
        } else {
            er_request_free(live);
            er_request_free(done);
            er_request_free(stepped);
            er_batch_free(b);
        }
    }
    er_model_free(m);
}

// ---- calls re-entering a session or a batch from its own callback ----

typedef struct {
    ErSession *s;
    ErBatch *b;
    ErRequest *r, *other;
    int calls, rc, rc2;
    char msg[512], msg2[512];
} Reentry;

static int reenter_generate(void *user, int sample, const char *text, size_t len) {
    (void)sample, (void)text, (void)len;
    Reentry *x = user;
    if (x->calls++ == 0) {
        ErGenParams p = params(4, 1);
        x->rc = er_generate_raw(x->s, "Hi", &p, NULL, NULL);
        snprintf(x->msg, sizeof x->msg, "%s", er_last_error());
        ErMessage msg = {"user", "Hi"};
        x->rc2 = er_generate(x->s, &msg, 1, &p, NULL, NULL);
        snprintf(x->msg2, sizeof x->msg2, "%s", er_last_error());
    }
    return 0;
}

// er_generate from inside its own callback returned 0 and left the outer call's samples freed under it.
Test(api_misuse, generate_refuses_reentry_from_its_callback) {
    ErModel *m = load_model();
    Reentry x = {0};
    cr_assert_eq(helper_session_open(&x.s, m, 2, 128, 0), 0, "%s", er_last_error());
    ErGenParams p = params(6, 2);
    cr_assert_eq(er_generate_raw(x.s, "Start with 7.", &p, reenter_generate, &x), ER_OK, "%s", er_last_error());
    cr_assert_eq(x.rc, ER_EINVAL, "er_generate_raw re-entered its session: %d", x.rc);
    cr_assert(strstr(x.msg, "er_generate_raw") && strstr(x.msg, "in use"), "%s", x.msg);
    cr_assert_eq(x.rc2, ER_EINVAL, "er_generate re-entered its session: %d", x.rc2);
    cr_assert(strstr(x.msg2, "er_generate") && strstr(x.msg2, "in use"), "%s", x.msg2);
    cr_assert_eq(er_result_count(x.s), 2, "the outer call's results");
    cr_assert_gt(er_result_sample(x.s, 1)->n_tokens, 0);
    cr_assert_eq(er_generate_raw(x.s, "Hi", &p, NULL, NULL), ER_OK, "the session is usable again: %s",
                 er_last_error());
    er_session_free(x.s);
    er_model_free(m);
}

static int free_session(void *user, int sample, const char *text, size_t len) {
    (void)sample, (void)text, (void)len;
    Reentry *x = user;
    if (x->calls++ == 0)
        er_session_free(x->s);
    return 0;
}

// er_session_free from inside a callback freed the session under the running call: now the call stops
// (no callback after the free), and the session is freed as the call returns.
Test(api_misuse, session_freed_from_its_callback_is_freed_after_the_call) {
    ErModel *m = load_model();
    Reentry x = {0};
    cr_assert_eq(helper_session_open(&x.s, m, 2, 128, 0), 0, "%s", er_last_error());
    er_model_free(m); // the session keeps it: its release follows the session's
    ErGenParams p = params(8, 2);
    cr_assert_geq(er_generate_raw(x.s, "Start with 7.", &p, free_session, &x), ER_OK, "%s", er_last_error());
    cr_assert_eq(x.calls, 1, "callbacks ran after er_session_free");
}

static int reenter_batch(void *user, int sample, const char *text, size_t len) {
    (void)sample, (void)text, (void)len;
    Reentry *x = user;
    if (x->calls++ == 0) {
        x->rc = er_batch_step(x->b);
        snprintf(x->msg, sizeof x->msg, "%s", er_last_error());
        ErGenParams p = params(4, 1);
        ErRequest *r = (ErRequest *)0x1;
        x->rc2 = er_batch_submit(x->b, "Hi", &p, NULL, NULL, &r);
        snprintf(x->msg2, sizeof x->msg2, "%s", er_last_error());
        cr_assert_null(r);
    }
    return 0;
}

// er_batch_step and er_batch_submit from inside a batch callback ran a step (or an admission) inside
// the step that was gathering its rows.
Test(api_misuse, batch_refuses_reentry_from_its_callback) {
    ErModel *m = load_model();
    Reentry x = {0};
    cr_assert_eq(helper_batch_open(&x.b, m, 2, 128, 0), 0, "%s", er_last_error());
    ErGenParams p = params(6, 1);
    cr_assert_eq(er_batch_submit(x.b, "Start with 7.", &p, reenter_batch, &x, &x.r), 0, "%s", er_last_error());
    while (er_batch_step(x.b) > 0)
        ;
    cr_assert_eq(x.rc, ER_EINVAL, "er_batch_step re-entered its batch: %d", x.rc);
    cr_assert(strstr(x.msg, "er_batch_step") && strstr(x.msg, "in use"), "%s", x.msg);
    cr_assert_eq(x.rc2, ER_EINVAL, "er_batch_submit re-entered its batch: %d", x.rc2);
    cr_assert(strstr(x.msg2, "er_batch_submit") && strstr(x.msg2, "in use"), "%s", x.msg2);
    cr_assert_eq(er_request_status(x.r), ER_OK);
    cr_assert_eq(er_batch_free_rows(x.b), 2, "the refused submission holds no row");
    er_request_free(x.r);
    er_batch_free(x.b);
    er_model_free(m);
}

static int count_calls(void *user, int sample, const char *text, size_t len) {
    (void)sample, (void)text, (void)len;
    ((Reentry *)user)->calls++;
    return 0;
}

// From the first request's callback: frees itself, the second (live) request, or the batch.
static int free_from_callback(void *user, int sample, const char *text, size_t len) {
    (void)sample, (void)text, (void)len;
    Reentry *x = user;
    if (x->calls++ == 0) {
        if (x->rc == 0)
            er_request_free(x->r);
        else if (x->rc == 1)
            er_request_free(x->other);
        else
            er_batch_free(x->b);
    }
    return 0;
}

// er_request_free and er_batch_free from inside a batch callback freed what the step was iterating.
// Now the step finishes first: no callback of a freed request (or of a freed batch's) runs afterwards,
// the freed request's rows come back, and a freed batch is released when the step returns (its
// requests stay the caller's to free).
Test(api_misuse, batch_frees_from_its_callback_wait_for_the_step) {
    ErModel *m = load_model();
    for (int what = 0; what < 3; what++) {
        Reentry x = {.rc = what}, y = {0};
        cr_assert_eq(helper_batch_open(&x.b, m, 4, 128, 0), 0, "%s", er_last_error());
        ErGenParams p = params(8, 2);
        cr_assert_eq(er_batch_submit(x.b, "Start with 7.", &p, free_from_callback, &x, &x.r), 0, "%s",
                     er_last_error());
        cr_assert_eq(er_batch_submit(x.b, "Add 5.", &p, count_calls, &y, &x.other), 0, "%s", er_last_error());
        int left = er_batch_step(x.b);
        // Its two samples each emit a token; once it or its batch is freed, the second gets no call.
        cr_assert_eq(x.calls, what == 1 ? 2 : 1, "what %d: the first request's callback ran %d times", what, x.calls);
        if (what == 2) {
            cr_assert_eq(y.calls, 0, "a callback ran after er_batch_free");
            cr_assert_lt(er_request_status(x.other), 0);
            er_request_free(x.r);
            er_request_free(x.other);
            continue;
        }
        if (what == 1)
            cr_assert_eq(y.calls, 0, "a callback of the freed request ran");
        cr_assert_eq(left, 1, "what %d: one request left", what);
        cr_assert_eq(er_batch_free_rows(x.b), 2, "what %d: the freed request's rows came back", what);
        while (er_batch_step(x.b) > 0)
            ;
        er_request_free(what == 0 ? x.other : x.r);
        er_batch_free(x.b);
    }
    er_model_free(m);
}

// ---- two threads ----

typedef struct {
    ErModel *m;
    ErSession *s;  // the session the other thread uses
    const char *path; // what it loads (adapter dir, switcher head), or NULL: it generates
    int load_switcher;
    int rc, calls;
    char msg[512];
    char text[1024];
} Other;

static void *other_call(void *arg) {
    Other *o = arg;
    if (o->path) {
        o->rc = o->load_switcher ? er_model_load_switcher(o->m, o->path) : er_model_load_adapter(o->m, o->path);
    } else {
        ErGenParams p = params(6, 1);
        o->rc = er_generate_raw(o->s, "Add 5.", &p, NULL, NULL);
        if (o->rc == ER_OK)
            snprintf(o->text, sizeof o->text, "%s", er_result_sample(o->s, 0)->text);
    }
    snprintf(o->msg, sizeof o->msg, "%s", er_last_error()); // the error is the other thread's
    return NULL;
}

// On the first token: the other call, on another thread, run to its end while this call waits.
static int run_other(void *user, int sample, const char *text, size_t len) {
    (void)sample, (void)text, (void)len;
    Other *o = user;
    if (o->calls++ == 0) {
        pthread_t t;
        cr_assert_eq(pthread_create(&t, NULL, other_call, o), 0);
        pthread_join(t, NULL);
    }
    return 0;
}

// A second thread's er_generate_raw on a session that is generating wrote into the running call's
// samples (a NULL store in the engine); now it is refused. A second session of the same model still
// generates on the other thread meanwhile, and gives what it gives alone.
Test(api_misuse, a_session_in_use_refuses_another_thread) {
    ErModel *m = load_model();
    ErSession *s, *s2;
    cr_assert_eq(helper_session_open(&s, m, 2, 128, 0), 0, "%s", er_last_error());
    cr_assert_eq(helper_session_open(&s2, m, 1, 128, 0), 0, "%s", er_last_error());
    ErGenParams p = params(6, 2);
    Other same = {.m = m, .s = s};
    cr_assert_eq(er_generate_raw(s, "Start with 7.", &p, run_other, &same), ER_OK, "%s", er_last_error());
    cr_assert_eq(same.rc, ER_EINVAL, "a second thread generated on a session in use: %d", same.rc);
    cr_assert(strstr(same.msg, "er_generate_raw") && strstr(same.msg, "in use"), "%s", same.msg);
    cr_assert_eq(er_result_count(s), 2);
    Other alone = {.m = m, .s = s2}, beside = {.m = m, .s = s2};
    other_call(&alone);
    cr_assert_eq(alone.rc, ER_OK, "%s", alone.msg);
    cr_assert_eq(er_generate_raw(s, "Start with 7.", &p, run_other, &beside), ER_OK, "%s", er_last_error());
    cr_assert_eq(beside.rc, ER_OK, "another session of the model, on another thread: %s", beside.msg);
    cr_assert_str_eq(beside.text, alone.text);
    er_session_free(s2);
    er_session_free(s);
    er_model_free(m);
}

// er_model_load_adapter on another thread while a generation read the adapter freed it under the
// generation; now a load while any of the model's sessions or batches generates is refused, and
// succeeds between generations. Likewise a head.
Test(api_misuse, loads_refused_while_the_model_generates) {
    heads_add_adapter(fx.tmp);
    heads_write_random_heads(fx.tmp, "sw", "vf", 0.5f, "\nIs this solution correct?");
    char *a_dir = path_join(fx.tmp, "adapter"), *sw = path_join(fx.tmp, "sw");
    ErModel *m = load_model();
    cr_assert_eq(er_model_load_adapter(m, a_dir), 0, "%s", er_last_error());
    ErSession *s;
    cr_assert_eq(helper_session_open(&s, m, 2, 128, 0), 0, "%s", er_last_error());
    ErGenParams p = params(6, 2);
    for (int head = 0; head < 2; head++) {
        Other o = {.m = m, .path = head ? sw : a_dir, .load_switcher = head};
        cr_assert_eq(er_generate_raw(s, "Start with 7.", &p, run_other, &o), ER_OK, "%s", er_last_error());
        const char *fn = head ? "er_model_load_switcher" : "er_model_load_adapter";
        cr_assert_eq(o.rc, ER_EINVAL, "%s during a generation: %d", fn, o.rc);
        cr_assert(strstr(o.msg, fn) && strstr(o.msg, "generat"), "%s", o.msg);
        cr_assert_eq(er_result_count(s), 2);
    }
    // A batch generates from its first submission to the step that finishes its last request.
    ErBatch *b;
    ErRequest *r;
    cr_assert_eq(helper_batch_open(&b, m, 2, 128, 0), 0, "%s", er_last_error());
    cr_assert_eq(er_batch_submit(b, "Start with 7.", &p, NULL, NULL, &r), 0, "%s", er_last_error());
    cr_assert_eq(er_model_load_adapter(m, a_dir), ER_EINVAL, "a load while a batch decodes");
    cr_assert(strstr(er_last_error(), "er_model_load_adapter"), "%s", er_last_error());
    while (er_batch_step(b) > 0)
        ;
    cr_assert_eq(er_request_status(r), ER_OK);
    er_request_free(r);
    cr_assert_eq(er_model_load_adapter(m, a_dir), ER_OK, "between generations: %s", er_last_error());
    cr_assert_eq(er_model_load_switcher(m, sw), ER_OK, "between generations: %s", er_last_error());
    cr_assert_eq(er_generate_raw(s, "Start with 7.", &p, NULL, NULL), ER_OK, "%s", er_last_error());
    er_batch_free(b);
    er_session_free(s);
    er_model_free(m);
    er_free(a_dir);
    er_free(sw);
}
