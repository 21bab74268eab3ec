// ErSessionParams.n_threads: a session's (or a batch's) calls run every parallel region on its own thread
// count whatever the calling thread's OpenMP default is, leave that default as it was, and two sessions of
// one thread each on two threads of the app each stay on their own thread. The teams are observed by
// tests/common/omp_probe.h, which sees every region the library starts.
#include <criterion/criterion.h>
#include <omp.h>
#include <pthread.h>
#include <string.h>

#include "core/threads.h"
#include "infer/erinfer.h"
#include "tests/common/api_helpers.h"
#include "tests/common/helpers.h"
#include "tests/common/omp_probe.h"

static HelperFixture fx; // per test: the temp dir and tmp/model

static void setup(void) {
    threads_set(2); // the default a session of n_threads 0 takes; the others must not
    helper_fixture_open(&fx, "er_api_threads_", NULL);
}

static void teardown(void) { helper_fixture_close(&fx); }
TestSuite(api_threads, .init = setup, .fini = teardown);

// A prompt of a few hundred tokens: its prefill chunks are products big enough to run in parallel.
static char *long_prompt(void) {
    static const char step[] = "Add 3. Multiply by 2. Subtract 1. ";
    size_t n = 40 * (sizeof step - 1) + 64;
    char *t = malloc(n);
    strcpy(t, "Start with 2. ");
    for (int i = 0; i < 40; i++)
        strcat(t, step);
    strcat(t, "What is the result?");
    return t;
}

static ErGenParams gen_params(int max_new) {
    ErGenParams p;
    er_gen_params_init(&p);
    p.max_new_tokens = max_new;
    return p;
}

// The widest team of one generate call on a session of n_threads (0: the default); regions > 0 checked.
static int widest_team(ErModel *m, int n_threads) {
    ErSessionParams sp = helper_session_params(2, 1024, 0);
    sp.n_threads = n_threads;
    ErSession *s;
    cr_assert_eq(er_session_open(&s, m, &sp), ER_OK, "%s", er_last_error());
    char *prompt = long_prompt();
    ErGenParams p = gen_params(8);
    p.n_samples = 2;
    omp_probe_reset();
    cr_assert_eq(er_generate_raw(s, prompt, &p, NULL, NULL), ER_OK, "%s", er_last_error());
    OmpProbe probe = omp_probe_get();
    cr_assert_gt(probe.regions, 0, "no parallel region seen: the probe is not wired (Makefile --wrap)");
    cr_assert_eq(omp_get_max_threads(), 2, "the calling thread's count changed to %d", omp_get_max_threads());
    free(prompt);
    er_session_free(s);
    return probe.widest;
}

Test(api_threads, a_session_runs_its_regions_on_its_thread_count) {
    ErModel *m;
    cr_assert_eq(er_model_load(&m, fx.model), ER_OK, "%s", er_last_error());
    cr_assert_eq(widest_team(m, 1), 1, "a session of 1 thread ran a region on more");
    cr_assert_eq(widest_team(m, 2), 2, "a session of 2 threads never used both (the probe would miss a wider team)");
    cr_assert_eq(widest_team(m, 0), 2, "n_threads 0 is the opening thread's default (2 here)");
    // Not the opening thread's default at call time: the session's count, fixed at open.
    ErSessionParams sp = helper_session_params(1, 1024, 0);
    sp.n_threads = 1;
    ErSession *s;
    cr_assert_eq(er_session_open(&s, m, &sp), ER_OK, "%s", er_last_error());
    threads_set(3);
    omp_probe_reset();
    char *prompt = long_prompt();
    ErGenParams p = gen_params(4);
    cr_assert_eq(er_generate_raw(s, prompt, &p, NULL, NULL), ER_OK, "%s", er_last_error());
    cr_assert_eq(omp_probe_get().widest, 1);
    cr_assert_eq(omp_get_max_threads(), 3);
    free(prompt);
    er_session_free(s);
    er_model_free(m);
}

Test(api_threads, a_batch_runs_its_regions_on_its_thread_count) {
    ErModel *m;
    cr_assert_eq(er_model_load(&m, fx.model), ER_OK, "%s", er_last_error());
    for (int nt = 1; nt <= 2; nt++) {
        ErSessionParams sp = helper_session_params(2, 1024, 0);
        sp.n_threads = nt;
        ErBatch *b;
        cr_assert_eq(er_batch_open(&b, m, &sp), ER_OK, "%s", er_last_error());
        char *prompt = long_prompt();
        ErGenParams p = gen_params(6);
        p.n_samples = 2;
        ErRequest *r;
        omp_probe_reset();
        cr_assert_eq(er_batch_submit(b, prompt, &p, NULL, NULL, &r), ER_OK, "%s", er_last_error());
        while (er_batch_step(b) > 0)
            ;
        cr_assert_eq(er_request_status(r), ER_OK);
        OmpProbe probe = omp_probe_get();
        cr_assert_gt(probe.regions, 0);
        cr_assert_eq(probe.widest, nt, "a batch of %d threads ran a region on %d", nt, probe.widest);
        cr_assert_eq(omp_get_max_threads(), 2);
        er_request_free(r);
        er_batch_free(b);
        free(prompt);
    }
    er_model_free(m);
}

typedef struct {
    ErModel *m;
    const char *prompt;
    OmpProbe probe;
    int rc;
    char text[512];
} Worker;

// One app thread: its own session of 1 thread, a greedy generation; the regions it started.
static void *worker_main(void *arg) {
    Worker *w = arg;
    ErSessionParams sp = helper_session_params(1, 1024, 0);
    sp.n_threads = 1;
    ErSession *s;
    w->rc = er_session_open(&s, w->m, &sp);
    if (w->rc < 0)
        return NULL;
    ErGenParams p = gen_params(24);
    omp_probe_reset();
    w->rc = er_generate_raw(s, w->prompt, &p, NULL, NULL);
    w->probe = omp_probe_get();
    if (w->rc == ER_OK)
        snprintf(w->text, sizeof w->text, "%s", er_result_sample(s, 0)->text);
    er_session_free(s);
    return NULL;
}

Test(api_threads, two_sessions_of_one_thread_on_two_app_threads) {
    ErModel *m;
    cr_assert_eq(er_model_load(&m, fx.model), ER_OK, "%s", er_last_error());
    char *prompt = long_prompt();
    Worker w[2] = {{m, prompt, {0, 0}, 0, ""}, {m, prompt, {0, 0}, 0, ""}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(w[i].rc, ER_OK, "thread %d failed", i);
        cr_assert_gt(w[i].probe.regions, 0);
        cr_assert_eq(w[i].probe.widest, 1, "thread %d's session ran a region on %d threads", i, w[i].probe.widest);
    }
    cr_assert_str_eq(w[0].text, w[1].text, "the same greedy generation on both threads");
    free(prompt);
    er_model_free(m);
}
