// The public C API (infer/erinfer.h) misused as a new user or a fuzzer would: NULL for every pointer
// (an error status or a NULL result, never a crash), the model freed before its session (the session
// keeps it alive), a session size whose product overflows an int, and an unmasked adapter replaced in
// place (the prompt cached under the old one must not be reused). Also the header's promises: the
// version, a name for every status, stop strings as pointer + count, and sessions of one model
// generating on two threads at once. Compiling infer/api.c checks the public enums against the
// internal ones.
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "infer/erinfer.h"
#include "lora/peft.h"
#include "tests/common/api_helpers.h"
#include "tests/common/heads_helpers.h"
#include "tests/common/helpers.h"

static HelperFixture fx; // per test: the temp dir and tmp/model

static void setup(void) {
    threads_set(2);
    helper_fixture_open(&fx, "er_api_", NULL);
}

static void teardown(void) { helper_fixture_close(&fx); }

TestSuite(api, .init = setup, .fini = teardown);

// A failed call: negative status and a message naming the function and saying what was NULL.
static void expect_null_error(int rc, const char *fn) {
    cr_assert_lt(rc, 0, "%s accepted a NULL argument", fn);
    cr_assert(strstr(er_last_error(), fn) && strstr(er_last_error(), "NULL"), "%s: message \"%s\"", fn,
              er_last_error());
}

Test(api, null_arguments_are_errors) {
    ErModel *m = (ErModel *)0x1;
    ErSession *s = (ErSession *)0x1;
    expect_null_error(er_model_load(&m, NULL), "er_model_load");
    cr_assert_null(m);
    expect_null_error(er_model_load(NULL, fx.model), "er_model_load");
    cr_assert_eq(er_model_load(&m, fx.model), 0, "%s", er_last_error());
    expect_null_error(er_model_load_adapter(m, NULL), "er_model_load_adapter");
    expect_null_error(er_model_load_adapter(NULL, fx.model), "er_model_load_adapter");
    expect_null_error(er_model_load_switcher(m, NULL), "er_model_load_switcher");
    expect_null_error(er_model_load_verifier(NULL, "x"), "er_model_load_verifier");
    cr_assert_lt(er_model_max_positions(NULL), 0);
    ErSessionParams sp = helper_session_params(1, 64, 0);
    expect_null_error(er_session_open(NULL, m, &sp), "er_session_open");
    expect_null_error(er_session_open(&s, NULL, &sp), "er_session_open");
    cr_assert_null(s);
    s = (ErSession *)0x1;
    expect_null_error(er_session_open(&s, m, NULL), "er_session_open");
    cr_assert_null(s);
    cr_assert_eq(helper_session_open(&s, m, 1, 64, 0), 0, "%s", er_last_error());

    ErGenParams p;
    er_gen_params_init(&p);
    er_gen_params_init(NULL);
    expect_null_error(er_gen_params_init_size(NULL, sizeof p), "er_gen_params_init_size");
    expect_null_error(er_session_params_init_size(NULL, sizeof sp), "er_session_params_init_size");
    expect_null_error(er_callbacks_init_size(NULL, sizeof(ErCallbacks)), "er_callbacks_init_size");
    p.max_new_tokens = 4;
    ErMessage msg = {"user", "Start with 2. What is the result?"}, no_content = {"user", NULL};
    expect_null_error(er_generate(NULL, &msg, 1, &p, NULL, NULL), "er_generate");
    expect_null_error(er_generate(s, NULL, 1, &p, NULL, NULL), "er_generate");
    expect_null_error(er_generate(s, &msg, 1, NULL, NULL, NULL), "er_generate");
    expect_null_error(er_generate(s, &no_content, 1, &p, NULL, NULL), "er_generate");
    cr_assert_lt(er_generate(s, &msg, 0, &p, NULL, NULL), 0, "no messages accepted");
    expect_null_error(er_generate_raw(NULL, "x", &p, NULL, NULL), "er_generate_raw");
    expect_null_error(er_generate_raw(s, NULL, &p, NULL, NULL), "er_generate_raw");
    expect_null_error(er_generate_raw(s, "x", NULL, NULL, NULL), "er_generate_raw");
    cr_assert_lt(er_result_count(NULL), 0);
    cr_assert_null(er_result_sample(NULL, 0));
    cr_assert_null(er_result_route(NULL));
    cr_assert_null(er_result_stats(NULL));
    // The session still works after all that.
    cr_assert_eq(er_generate(s, &msg, 1, &p, NULL, NULL), 0, "%s", er_last_error());
    cr_assert_eq(er_result_count(s), 1);
    cr_assert_null(er_result_sample(s, 1));
    er_session_free(NULL);
    er_model_free(NULL);
    er_session_free(s);
    er_model_free(m);
}

// Freeing the model first is not a use-after-free: the session keeps the model until it closes
// (ASan, in `make SAN=1 test`, checks that nothing is touched after it is released or leaked).
Test(api, session_keeps_its_model_alive) {
    ErModel *m;
    ErSession *s, *s2;
    cr_assert_eq(er_model_load(&m, fx.model), 0, "%s", er_last_error());
    cr_assert_eq(helper_session_open(&s, m, 2, 128, 0), 0, "%s", er_last_error());
    er_model_free(m);
    ErGenParams p;
    er_gen_params_init(&p);
    p.max_new_tokens = 8;
    p.n_samples = 2;
    ErMessage msg = {"user", "Start with 2. Add 3. What is the result?"};
    cr_assert_eq(er_generate(s, &msg, 1, &p, NULL, NULL), 0, "%s", er_last_error());
    cr_assert_eq(er_result_count(s), 2);
    cr_assert(helper_session_open(&s2, m, 1, 64, 0) < 0, "a new session on a freed model was opened");
    cr_assert(strstr(er_last_error(), "freed"), "%s", er_last_error());
    er_session_free(s);
}

// 4 x 1073741825 positions overflowed an int in the memory check, which then passed.
Test(api, session_sizes_are_checked) {
    ErModel *m;
    ErSession *s;
    cr_assert_eq(er_model_load(&m, fx.model), 0, "%s", er_last_error());
    cr_assert_lt(helper_session_open(&s, m, 4, 1073741825, 0), 0);
    cr_assert(strstr(er_last_error(), "max_position_embeddings"), "%s", er_last_error());
    cr_assert_lt(helper_session_open(&s, m, 0, 64, 0), 0);
    cr_assert_lt(helper_session_open(&s, m, 1, er_model_max_positions(m) + 1, 0), 0);
    cr_assert_eq(helper_session_open(&s, m, 1, er_model_max_positions(m), 0), 0, "%s", er_last_error());
    er_session_free(s);
    er_model_free(m);
}

static void save_unmasked_adapter(const char *dir, uint64_t seed) {
    Model m;
    cr_assert_eq(model_load(&m, fx.model, 0), 0, "%s", er_last_error());
    LoraAdapter a;
    helper_random_adapter(&a, &m.cfg, 0.5f, seed);
    a.masked = 0;
    cr_assert_eq(peft_save(&a, dir), 0, "%s", er_last_error());
    lora_free(&a);
    model_free(&m);
}

static char *generate_text(ErSession *s, int *reused) {
    ErGenParams p;
    er_gen_params_init(&p);
    p.max_new_tokens = 24;
    ErMessage msg = {"user", "Start with 7. Add 5. Multiply by 3. What is the result?"};
    cr_assert_eq(er_generate(s, &msg, 1, &p, NULL, NULL), 0, "%s", er_last_error());
    *reused = er_result_stats(s)->prompt_reused;
    const ErSample *x = er_result_sample(s, 0);
    char *t = er_alloc(x->text_len + 1);
    memcpy(t, x->text, x->text_len + 1);
    return t;
}

// er_model_load_adapter replaces the adapter in place (the same address): a session must notice.
Test(api, replaced_unmasked_adapter_is_not_served_from_the_old_cache) {
    char *a_dir = path_join(fx.tmp, "a"), *b_dir = path_join(fx.tmp, "b");
    save_unmasked_adapter(a_dir, 11);
    save_unmasked_adapter(b_dir, 12);
    ErModel *m, *fresh;
    ErSession *s, *fs;
    int reused;
    cr_assert_eq(er_model_load(&m, fx.model), 0, "%s", er_last_error());
    cr_assert_eq(er_model_load_adapter(m, a_dir), 0, "%s", er_last_error());
    cr_assert_eq(helper_session_open(&s, m, 1, 256, 0), 0, "%s", er_last_error());
    char *with_a = generate_text(s, &reused);
    char *again_a = generate_text(s, &reused);
    cr_assert_gt(reused, 0, "the same prompt under the same adapter should be reused");
    cr_assert_str_eq(with_a, again_a);
    cr_assert_eq(er_model_load_adapter(m, b_dir), 0, "%s", er_last_error());
    char *with_b = generate_text(s, &reused);
    cr_assert_eq(reused, 0, "the prompt computed under adapter a was reused for adapter b");
    cr_assert_eq(er_model_load(&fresh, fx.model), 0, "%s", er_last_error());
    cr_assert_eq(er_model_load_adapter(fresh, b_dir), 0, "%s", er_last_error());
    cr_assert_eq(helper_session_open(&fs, fresh, 1, 256, 0), 0, "%s", er_last_error());
    char *fresh_b = generate_text(fs, &reused);
    cr_assert_str_eq(with_b, fresh_b, "after replacing the adapter the session answers as a fresh one would");
    er_free(with_a);
    er_free(again_a);
    er_free(with_b);
    er_free(fresh_b);
    er_session_free(fs);
    er_model_free(fresh);
    er_session_free(s);
    er_model_free(m);
    er_free(a_dir);
    er_free(b_dir);
}

Test(api, version_is_the_headers) {
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", ER_VERSION_MAJOR, ER_VERSION_MINOR, ER_VERSION_PATCH);
    cr_assert_str_eq(ER_VERSION_STRING, want);
    cr_assert_str_eq(er_version(), ER_VERSION_STRING);
}

Test(api, every_status_has_its_name) {
    const struct {
        int status;
        const char *name;
    } all[] = {{ER_OK, "ok"},          {ER_EINVAL, "invalid argument"}, {ER_EIO, "I/O error"},
               {ER_ENOMEM, "out of memory"}, {ER_EFORMAT, "bad format"},   {ER_EUNSUPPORTED, "unsupported"},
               {ER_ERANGE, "out of range"},  {ER_EABORTED, "aborted"}};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        cr_assert_eq(all[i].status, -(int)i, "the statuses are 0, -1, -2, ...");
        cr_assert_str_eq(er_status_name(all[i].status), all[i].name);
    }
    cr_assert_str_eq(er_status_name(1), "unknown status");
    cr_assert_str_eq(er_status_name(-8), "unknown status");
}

// Greedy text of a fixed prompt with the given stop strings; the status of the call.
static int generate_stopped(ErSession *s, const char *const *stop, int n_stop) {
    ErGenParams p;
    er_gen_params_init(&p);
    p.max_new_tokens = 24;
    p.stop = stop;
    p.n_stop = n_stop;
    return er_generate_raw(s, "Start with 7. Add 5. What is the result?", &p, NULL, NULL);
}

Test(api, stop_strings_are_pointer_and_count) {
    ErModel *m;
    ErSession *s;
    cr_assert_eq(er_model_load(&m, fx.model), 0, "%s", er_last_error());
    cr_assert_eq(helper_session_open(&s, m, 1, 256, 0), 0, "%s", er_last_error());
    ErGenParams p;
    er_gen_params_init(&p);
    cr_assert_null(p.stop);
    cr_assert_eq(p.n_stop, 0);

    // No stop strings: the whole text.
    cr_assert_eq(generate_stopped(s, NULL, 0), 0, "%s", er_last_error());
    const ErSample *x = er_result_sample(s, 0);
    cr_assert_geq(x->text_len, 6, "too little text to cut: \"%s\"", x->text);
    size_t n_full = x->text_len;
    char *full = er_alloc(n_full + 1);
    memcpy(full, x->text, n_full + 1);

    // Several: the text ends where the first of them first appears (here a piece of the full text).
    char piece[4] = {full[n_full / 2], full[n_full / 2 + 1], full[n_full / 2 + 2], 0};
    size_t cut = (size_t)(strstr(full, piece) - full);
    char never[ER_STOP_MAX_LEN + 1];
    memset(never, 'q', ER_STOP_MAX_LEN);
    never[ER_STOP_MAX_LEN] = 0;
    const char *stops[ER_STOP_MAX + 1] = {"\x01\x02", piece, never};
    for (int i = 3; i <= ER_STOP_MAX; i++)
        stops[i] = "\x03";
    cr_assert_eq(generate_stopped(s, stops, ER_STOP_MAX), 0, "%s", er_last_error());
    x = er_result_sample(s, 0);
    cr_assert_eq(x->finish, ER_FINISH_STOP);
    cr_assert_eq(x->text_len, cut, "cut at %zu, expected %zu", x->text_len, cut);
    cr_assert(memcmp(x->text, full, cut) == 0);

    // Refused before anything runs, with a message naming the field.
    const char *with_null[] = {"a", NULL, "b"};
    cr_assert_eq(generate_stopped(s, with_null, 3), ER_EINVAL);
    cr_assert(strstr(er_last_error(), "stop[1]") && strstr(er_last_error(), "NULL"), "%s", er_last_error());
    cr_assert_eq(generate_stopped(s, stops, ER_STOP_MAX + 1), ER_EINVAL);
    cr_assert(strstr(er_last_error(), "n_stop"), "%s", er_last_error());
    cr_assert_eq(generate_stopped(s, stops, -1), ER_EINVAL);
    cr_assert_eq(generate_stopped(s, NULL, 1), ER_EINVAL);
    cr_assert(strstr(er_last_error(), "NULL"), "%s", er_last_error());
    cr_assert_eq(er_result_count(s), 0, "a refused call leaves no results");

    er_free(full);
    er_session_free(s);
    er_model_free(m);
}

typedef struct {
    ErSession *s;
    int rc;
    char text[4096];
} Worker;

static void *worker_run(void *arg) {
    Worker *w = arg;
    w->rc = generate_stopped(w->s, NULL, 0);
    if (w->rc == 0)
        snprintf(w->text, sizeof w->text, "%s", er_result_sample(w->s, 0)->text);
    return NULL;
}

// One model, two sessions, two threads generating at once: each answers as it does alone.
Test(api, sessions_of_one_model_run_on_two_threads) {
    ErModel *m;
    Worker w[2];
    cr_assert_eq(er_model_load(&m, fx.model), 0, "%s", er_last_error());
    for (int i = 0; i < 2; i++)
        cr_assert_eq(helper_session_open(&w[i].s, m, 1, 256, i), 0, "%s", er_last_error());
    Worker alone[2] = {{w[0].s, 0, ""}, {w[1].s, 0, ""}};
    for (int i = 0; i < 2; i++) {
        worker_run(&alone[i]);
        cr_assert_eq(alone[i].rc, 0, "%s", er_last_error());
    }
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, worker_run, &w[i]), 0);
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], NULL);
        cr_assert_eq(w[i].rc, 0, "session %d failed on its thread", i);
        cr_assert_str_eq(w[i].text, alone[i].text, "session %d", i);
    }
    er_model_free(m);
    for (int i = 0; i < 2; i++)
        er_session_free(w[i].s);
}

// ErGenParams.route: NULL/"auto" leave the choice to the pipeline (no heads: no pipeline), "direct" makes the
// base answer greedily once even without heads, "reasoning" needs an adapter, anything else is refused.
Test(api, route_is_forced_or_refused) {
    char *a_dir = path_join(fx.tmp, "adapter");
    save_unmasked_adapter(a_dir, 13);
    ErModel *m;
    ErSession *s;
    cr_assert_eq(er_model_load(&m, fx.model), 0, "%s", er_last_error());
    cr_assert_eq(helper_session_open(&s, m, 3, 256, 0), 0, "%s", er_last_error());
    ErGenParams p;
    er_gen_params_init(&p);
    cr_assert_null(p.route);
    p.max_new_tokens = 8;
    p.n_samples = 3;
    p.temperature = 0.8f;
    p.route = "reasoning";
    cr_expect_eq(er_generate_raw(s, "Start with 7.", &p, NULL, NULL), ER_EINVAL, "reasoning without an adapter");
    cr_expect(strstr(er_last_error(), "needs an adapter"), "%s", er_last_error());
    p.route = "sideways";
    cr_expect_eq(er_generate_raw(s, "Start with 7.", &p, NULL, NULL), ER_EINVAL);
    cr_expect(strstr(er_last_error(), "sideways"), "%s", er_last_error());
    cr_assert_eq(er_model_load_adapter(m, a_dir), 0, "%s", er_last_error());
    p.route = "auto";
    cr_assert_eq(er_generate_raw(s, "Start with 7.", &p, NULL, NULL), ER_OK, "%s", er_last_error());
    cr_expect_null(er_result_route(s), "auto without heads runs no pipeline");
    cr_expect_eq(er_result_count(s), 3);
    p.route = "direct";
    cr_assert_eq(er_generate_raw(s, "Start with 7.", &p, NULL, NULL), ER_OK, "%s", er_last_error());
    const ErRoute *r = er_result_route(s);
    cr_assert(r, "a forced route runs the pipeline");
    cr_expect_eq(r->route, ER_ROUTE_DIRECT);
    cr_expect_eq(er_result_count(s), 1, "the direct answer is one sample");
    p.route = "reasoning";
    cr_assert_eq(er_generate_raw(s, "Start with 7.", &p, NULL, NULL), ER_OK, "%s", er_last_error());
    cr_expect_eq(er_result_route(s)->route, ER_ROUTE_REASONING);
    cr_expect_eq(er_result_count(s), 3);
    er_session_free(s);
    er_model_free(m);
    er_free(a_dir);
}

// er_batch_*: requests decoded together give each request's er_generate_raw results (a session of
// its own, same seed), a request waits for rows, NULLs are errors, and the batch keeps its model alive.
Test(api, batched_requests_equal_their_sessions_results) {
    ErModel *m;
    cr_assert_eq(er_model_load(&m, fx.model), 0, "%s", er_last_error());
    static const char *texts[3] = {"Start with 7. Add 5.", "Name a prime above 90, then one below 20.", "Hi"};
    ErGenParams p[3];
    for (int i = 0; i < 3; i++) {
        er_gen_params_init(&p[i]);
        p[i].max_new_tokens = 6 + 5 * i;
        p[i].temperature = 0.9f;
        p[i].seed = (uint64_t)(40 + i);
    }
    p[1].n_samples = 2;
    ErBatch *b;
    ErRequest *rq[3] = {0};
    ErSessionParams bp = helper_session_params(3, 128, 0);
    expect_null_error(er_batch_open(NULL, m, &bp), "er_batch_open");
    expect_null_error(er_batch_open(&b, NULL, &bp), "er_batch_open");
    expect_null_error(er_batch_open(&b, m, NULL), "er_batch_open");
    cr_assert_eq(helper_batch_open(&b, m, 3, 128, 0), 0, "%s", er_last_error());
    expect_null_error(er_batch_submit(b, NULL, &p[0], NULL, NULL, &rq[0]), "er_batch_submit");
    expect_null_error(er_batch_step(NULL), "er_batch_step");
    cr_assert_null(er_request_sample(NULL, 0));
    cr_assert_eq(er_batch_submit(b, texts[0], &p[0], NULL, NULL, &rq[0]), 0, "%s", er_last_error());
    cr_assert_eq(er_batch_submit(b, texts[1], &p[1], NULL, NULL, &rq[1]), 0, "%s", er_last_error());
    cr_assert_eq(er_batch_free_rows(b), 0);
    cr_assert_eq(er_batch_submit(b, texts[2], &p[2], NULL, NULL, &rq[2]), ER_ERANGE, "no row is free");
    cr_assert_eq(er_request_status(rq[0]), 1);
    cr_assert_eq(er_request_count(rq[0]), 0, "no results while decoding");
    while (er_request_status(rq[0]) == 1)
        cr_assert_geq(er_batch_step(b), 1);
    cr_assert_eq(er_batch_submit(b, texts[2], &p[2], NULL, NULL, &rq[2]), 0, "%s", er_last_error());
    while (er_batch_step(b) > 0)
        ;
    ErSession *s;
    cr_assert_eq(helper_session_open(&s, m, 2, 128, 0), 0, "%s", er_last_error());
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(er_request_status(rq[i]), ER_OK, "request %d", i);
        er_session_free(s); // a fresh cache: no prefix from the previous text
        cr_assert_eq(helper_session_open(&s, m, 2, 128, 0), 0, "%s", er_last_error());
        cr_assert_eq(er_generate_raw(s, texts[i], &p[i], NULL, NULL), 0, "%s", er_last_error());
        cr_assert_eq(er_request_count(rq[i]), er_result_count(s));
        for (int k = 0; k < er_result_count(s); k++) {
            const ErSample *x = er_request_sample(rq[i], k), *y = er_result_sample(s, k);
            cr_assert_eq(x->n_tokens, y->n_tokens, "request %d sample %d", i, k);
            cr_assert(memcmp(x->tokens, y->tokens, sizeof(int) * (size_t)x->n_tokens) == 0);
            cr_assert_eq(x->text_len, y->text_len);
            cr_assert(memcmp(x->text, y->text, x->text_len) == 0);
            cr_assert_eq(x->finish, y->finish);
        }
        cr_assert_eq(er_request_stats(rq[i])->generated_tokens, er_result_stats(s)->generated_tokens);
    }
    er_session_free(s);
    er_model_free(m); // the batch keeps it: its requests' results stay readable
    cr_assert_gt(er_request_sample(rq[1], 1)->n_tokens, 0);
    for (int i = 0; i < 3; i++)
        er_request_free(rq[i]);
    er_batch_free(b); // the model's last holder
}

// An unmasked adapter in a batch: a forced route runs the pipeline (no heads), a direct answer after a
// reasoning one with the same prompt prefix computes its prompt again (it was cached under the
// adapter) and says so, a plain request freed while decoding gives its row back, and the batch stops a
// live request when it is freed first.
Test(api, batch_runs_an_unmasked_adapter) {
    char *a_dir = path_join(fx.tmp, "adapter");
    save_unmasked_adapter(a_dir, 13);
    ErModel *m;
    cr_assert_eq(er_model_load(&m, fx.model), 0, "%s", er_last_error());
    cr_assert_eq(er_model_load_adapter(m, a_dir), 0, "%s", er_last_error());
    ErBatch *b;
    cr_assert_eq(helper_batch_open(&b, m, 2, 128, 1), 0, "%s", er_last_error());
    ErGenParams p;
    er_gen_params_init(&p);
    p.max_new_tokens = 4;
    p.route = "reasoning";
    ErRequest *r, *d;
    cr_assert_eq(er_batch_submit(b, "Start with 7.", &p, NULL, NULL, &r), 0, "%s", er_last_error());
    while (er_batch_step(b) > 0)
        ;
    cr_assert_eq(er_request_route(r)->route, ER_ROUTE_REASONING);
    p.route = "direct";
    cr_assert_eq(er_batch_submit(b, "Start with 7. Add 5.", &p, NULL, NULL, &d), 0, "%s", er_last_error());
    while (er_batch_step(b) > 0)
        ;
    cr_assert_eq(er_request_route(d)->route, ER_ROUTE_DIRECT);
    cr_assert_eq(er_request_stats(d)->prompt_reused, 0, "the direct answer's prompt was cached under the adapter");
    ErSession *s;
    cr_assert_eq(helper_session_open(&s, m, 1, 128, 1), 0, "%s", er_last_error());
    cr_assert_eq(er_generate_raw(s, "Start with 7. Add 5.", &p, NULL, NULL), 0, "%s", er_last_error());
    const ErSample *x = er_request_sample(d, 0), *y = er_result_sample(s, 0);
    cr_assert(x->n_tokens == y->n_tokens && memcmp(x->tokens, y->tokens, sizeof(int) * (size_t)x->n_tokens) == 0);
    er_session_free(s);
    er_request_free(r);
    er_request_free(d);
    p.route = NULL; // the adapter decodes, no pipeline
    cr_assert_eq(er_batch_submit(b, "Start with 7.", &p, NULL, NULL, &r), 0, "%s", er_last_error());
    cr_assert_null(er_request_route(r));
    er_batch_step(b);
    er_request_free(r); // stopped while decoding: its row goes back
    cr_expect_eq(er_batch_free_rows(b), 2);
    cr_assert_eq(er_batch_submit(b, "Start with 7.", &p, NULL, NULL, &r), 0, "%s", er_last_error());
    er_batch_free(b); // stops the live request, which stays the caller's to free
    cr_assert_eq(er_request_status(r), ER_EINVAL);
    er_request_free(r);
    er_model_free(m);
    er_free(a_dir);
}

// Two routes' worth of the pipeline's outputs are equal: samples bitwise, the route, the scores and
// the votes exactly.
static void expect_same_route(const ErRequest *rq, const ErSession *s, int i) {
    const ErRoute *x = er_request_route(rq), *y = er_result_route(s);
    cr_assert(x && y, "request %d: no route reported", i);
    cr_assert_eq(er_request_count(rq), er_result_count(s), "request %d", i);
    for (int k = 0; k < er_result_count(s); k++) {
        const ErSample *a = er_request_sample(rq, k), *b = er_result_sample(s, k);
        cr_assert_eq(a->n_tokens, b->n_tokens, "request %d sample %d", i, k);
        cr_assert(memcmp(a->tokens, b->tokens, sizeof(int) * (size_t)a->n_tokens) == 0, "request %d sample %d", i, k);
        cr_assert(a->text_len == b->text_len && memcmp(a->text, b->text, a->text_len) == 0);
        cr_assert_eq(a->finish, b->finish);
        cr_assert_eq(a->budget_cut, b->budget_cut);
        cr_assert_eq(!x->answers[k], !y->answers[k]);
        cr_assert(!x->answers[k] || strcmp(x->answers[k], y->answers[k]) == 0);
        cr_assert_eq(!x->verifier_scores, !y->verifier_scores);
        if (x->verifier_scores)
            cr_assert(x->verifier_scores[k] == y->verifier_scores[k], "request %d sample %d: verifier %.9g vs %.9g",
                      i, k, x->verifier_scores[k], y->verifier_scores[k]);
    }
    cr_assert_eq(x->route, y->route, "request %d", i);
    cr_assert(x->switcher_score == y->switcher_score, "request %d: switcher %.9g vs %.9g", i, x->switcher_score,
              y->switcher_score);
    cr_assert_eq(x->n_votes, y->n_votes);
    for (int k = 0; k < x->n_votes; k++) {
        cr_assert_str_eq(x->vote_answers[k], y->vote_answers[k]);
        cr_assert(x->vote_weights[k] == y->vote_weights[k] && x->vote_counts[k] == y->vote_counts[k]);
    }
    cr_assert_eq(!x->answer, !y->answer);
    cr_assert(!x->answer || strcmp(x->answer, y->answer) == 0);
    cr_assert_eq(er_request_stats(rq)->prompt_reused, 0, "the switcher reads the whole prompt");
}

// With heads and an adapter, batched requests run the routed pipeline: each gives what
// er_generate_raw gives in a session of its own (switcher score, route, samples, verifier scores,
// votes), whether it arrives alone or beside others, forced or switched; one freed while decoding
// gives its rows back. The seeded random switcher scores the two unforced prompts 0.536 and 0.506:
// at the threshold 0.52 the switcher sends one to each route.
Test(api, batched_routed_requests_equal_their_sessions_results) {
    heads_add_adapter(fx.tmp);
    heads_write_random_heads(fx.tmp, "sw", "vf", 0.52f, "\nIs this solution correct?");
    char *a_dir = path_join(fx.tmp, "adapter"), *sw = path_join(fx.tmp, "sw"), *vf = path_join(fx.tmp, "vf");
    ErModel *m;
    cr_assert_eq(er_model_load(&m, fx.model), 0, "%s", er_last_error());
    cr_assert_eq(er_model_load_adapter(m, a_dir), 0, "%s", er_last_error());
    cr_assert_eq(er_model_load_switcher(m, sw), 0, "%s", er_last_error());
    cr_assert_eq(er_model_load_verifier(m, vf), 0, "%s", er_last_error());
    enum { R = 5 };
    static const char *texts[R] = {"Start with 7. Add 5.", "Name a prime above 90.", "Hi", "Start with 7. Add 5.",
                                   "Count to four."};
    static const char *routes[R] = {NULL, "reasoning", "direct", "reasoning", NULL};
    ErGenParams p[R];
    for (int i = 0; i < R; i++) {
        er_gen_params_init(&p[i]);
        p[i].max_new_tokens = 8 + 4 * i;
        p[i].temperature = 0.9f;
        p[i].seed = (uint64_t)(70 + i);
        p[i].n_samples = 1 + i % 3;
        p[i].route = routes[i];
    }
    p[3].budget = 4; // the hard budget on one reasoning request
    p[3].answer_tokens = 12;
    ErBatch *b;
    cr_assert_eq(helper_batch_open(&b, m, 6, 128, 1), 0, "%s", er_last_error());
    ErRequest *rq[R] = {0}, *dropped;
    // Arrivals: 0 and 1 at once, 2 after a step, the rest when rows free up; one dropped mid-decode.
    cr_assert_eq(er_batch_submit(b, texts[0], &p[0], NULL, NULL, &rq[0]), 0, "%s", er_last_error());
    cr_assert_eq(er_batch_submit(b, texts[1], &p[1], NULL, NULL, &rq[1]), 0, "%s", er_last_error());
    cr_assert_eq(er_batch_submit(b, texts[4], &p[4], NULL, NULL, &dropped), 0, "%s", er_last_error());
    er_batch_step(b);
    er_request_free(dropped);
    cr_assert_eq(er_batch_submit(b, texts[2], &p[2], NULL, NULL, &rq[2]), 0, "%s", er_last_error());
    for (int next = 3; next < R || er_batch_step(b) > 0;) {
        if (next < R && er_batch_free_rows(b) >= p[next].n_samples) {
            cr_assert_eq(er_batch_submit(b, texts[next], &p[next], NULL, NULL, &rq[next]), 0, "%s", er_last_error());
            next++;
        } else if (next < R) {
            er_batch_step(b);
        }
    }
    int routes_seen[2] = {0, 0};
    for (int i = 0; i < R; i++) {
        cr_assert_eq(er_request_status(rq[i]), ER_OK, "request %d", i);
        ErSession *s;
        cr_assert_eq(helper_session_open(&s, m, 3, 128, 1), 0, "%s", er_last_error());
        cr_assert_eq(er_generate_raw(s, texts[i], &p[i], NULL, NULL), 0, "%s", er_last_error());
        expect_same_route(rq[i], s, i);
        const ErRoute *rt = er_request_route(rq[i]);
        routes_seen[rt->route]++;
        cr_assert_eq(!rt->verifier_scores, rt->route == ER_ROUTE_DIRECT, "request %d: verifier scores", i);
        if (i == 0 || i == 4) // the switched ones
            cr_assert_eq(rt->route, i == 0 ? ER_ROUTE_REASONING : ER_ROUTE_DIRECT, "request %d", i);
        if (i == 3)
            cr_assert(er_request_sample(rq[i], 0)->budget_cut, "the budget cut request 3");
        er_session_free(s);
        er_request_free(rq[i]);
    }
    cr_assert(routes_seen[ER_ROUTE_DIRECT] > 0 && routes_seen[ER_ROUTE_REASONING] > 0, "both routes ran");
    // Room: a reasoning request with its verifier pass fits prompt + max_new + er_model_extra_positions
    // positions exactly; one fewer is refused before any work.
    int extra = er_model_extra_positions(m), P;
    cr_assert_gt(extra, 0, "the reasoning prefix and the verifier prompt take positions");
    ErSession *s;
    cr_assert_eq(helper_session_open(&s, m, 1, 128, 1), 0, "%s", er_last_error());
    p[1].n_samples = 1;
    cr_assert_eq(er_generate_raw(s, texts[1], &p[1], NULL, NULL), 0, "%s", er_last_error());
    P = er_result_stats(s)->prompt_tokens;
    er_session_free(s);
    for (int less = 0; less < 2; less++) {
        cr_assert_eq(helper_session_open(&s, m, 1, P + p[1].max_new_tokens + extra - less, 1), 0, "%s", er_last_error());
        cr_assert_eq(er_generate_raw(s, texts[1], &p[1], NULL, NULL), less ? ER_ERANGE : ER_OK, "%s", er_last_error());
        er_session_free(s);
    }
    cr_assert_eq(er_batch_free_rows(b), 6, "every row is back");
    cr_assert_eq(er_batch_submit(b, texts[1], &p[1], NULL, NULL, &dropped), 0, "%s", er_last_error());
    er_batch_free(b); // stops the live request, which stays the caller's to free
    er_request_free(dropped);
    er_model_free(m);
    er_free(a_dir);
    er_free(sw);
    er_free(vf);
}
