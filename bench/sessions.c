// Sessions side by side: what ErSessionParams.n_threads buys an app that runs two conversations at once on a
// small machine. The same work three ways, through the public API (infer/erinfer.h) on a model dir:
//   1 x 2: one session of 2 threads on one app thread, doing both conversations' calls one after another;
//   2 x 1: two sessions of 1 thread each on two app threads at once (one core each);
//   2 x 2: two sessions of 2 threads each on two app threads at once (4 threads on 2 cores: oversubscribed);
//   1 x 1: one session of 1 thread doing all the calls (what one core does alone).
// Each twice: prefill (long prompts, 1 new token; every prompt starts differently, so nothing is reused) and
// decode (a short prompt, --new-tokens sampled tokens, EOS allowed), the four ways in turn for --rounds rounds
// (other load on the machine comes and goes: each way meets it alike). Prints one JSON line per run and the
// median aggregate rates with their ratios against 1 x 2, and the load average before and after.
//
//   sessions [--model models/tiny-base] [--calls 32] [--new-tokens 128] [--steps 40] [--rounds 5]
#include <pthread.h>
#include <stdio.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "infer/erinfer.h"

typedef struct {
    ErModel *m;
    int n_threads, calls, first_call, new_tokens, steps, decode;
    long prompt_positions, generated;
    int rc;
    char error[512];
} Job;

// Call k's prompt: a different first step per call (no prefix reuse), then `steps` chain steps (prefill) or one.
static char *job_prompt(const Job *j, int k) {
    static const char step[] = "Add 3. Multiply by 2. Subtract 1. ";
    int steps = j->decode ? 1 : j->steps;
    char *t = malloc((size_t)steps * sizeof step + 64);
    if (!t)
        return NULL;
    snprintf(t, 64, "Start with %d. ", j->first_call + k);
    for (int i = 0; i < steps; i++)
        strcat(t, step);
    strcat(t, "What is the result?");
    return t;
}

// One app thread: a session of j->n_threads and j->calls generations on it.
static void *job_main(void *arg) {
    Job *j = arg;
    ErSessionParams sp;
    er_session_params_init(&sp);
    sp.n_threads = j->n_threads;
    sp.max_tokens = er_model_max_positions(j->m);
    ErSession *s;
    if ((j->rc = er_session_open(&s, j->m, &sp)) < 0) {
        snprintf(j->error, sizeof j->error, "%s", er_last_error());
        return NULL;
    }
    ErGenParams p;
    er_gen_params_init(&p);
    p.max_new_tokens = j->decode ? j->new_tokens : 1;
    p.temperature = 1.0f;
    for (int k = 0; k < j->calls && j->rc == ER_OK; k++) {
        char *prompt = job_prompt(j, k);
        p.seed = (uint64_t)(j->first_call + k);
        j->rc = prompt ? er_generate_raw(s, prompt, &p, NULL, NULL) : ER_ENOMEM;
        free(prompt);
        if (j->rc < 0) {
            snprintf(j->error, sizeof j->error, "%s", er_last_error());
            break;
        }
        const ErStats *st = er_result_stats(s);
        j->prompt_positions += st->prompt_tokens - st->prompt_reused;
        j->generated += st->generated_tokens;
    }
    er_session_free(s);
    return NULL;
}

typedef struct {
    double wall_s, cpu_s, positions_per_s, tokens_per_s;
} Rate;

// CPU seconds the process has used (every thread, spinning OpenMP workers included).
static double cpu_seconds(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// `sessions` app threads, each with a session of n_threads and calls / sessions of the calls.
static int run(ErModel *m, int sessions, int n_threads, int calls, int decode, int new_tokens, int steps, Rate *r) {
    Job jobs[2];
    pthread_t t[2];
    for (int i = 0; i < sessions; i++)
        jobs[i] = (Job){m, n_threads, calls / sessions, 1000 * decode + i * (calls / sessions), new_tokens, steps,
                        decode, 0, 0, 0, ""};
    double t0 = time_now(), c0 = cpu_seconds();
    for (int i = 0; i < sessions; i++)
        if (pthread_create(&t[i], NULL, job_main, &jobs[i]) != 0)
            return er_error(ER_ENOMEM, "sessions: cannot start an app thread");
    for (int i = 0; i < sessions; i++)
        pthread_join(t[i], NULL);
    r->wall_s = time_now() - t0;
    r->cpu_s = cpu_seconds() - c0;
    long positions = 0, generated = 0;
    for (int i = 0; i < sessions; i++) {
        if (jobs[i].rc < 0)
            return er_error(jobs[i].rc, "%s", jobs[i].error);
        positions += jobs[i].prompt_positions;
        generated += jobs[i].generated;
    }
    r->positions_per_s = positions / r->wall_s;
    r->tokens_per_s = generated / r->wall_s;
    printf("{\"phase\": \"%s\", \"sessions\": %d, \"threads_each\": %d, \"calls\": %d, \"wall_s\": %.3f, "
           "\"cpu_s\": %.3f, \"prefill_positions\": %ld, \"prefill_positions_per_s\": %.1f, \"generated\": %ld, "
           "\"tokens_per_s\": %.1f}\n",
           decode ? "decode" : "prefill", sessions, n_threads, calls, r->wall_s, r->cpu_s, positions,
           r->positions_per_s, generated, r->tokens_per_s);
    fflush(stdout);
    return ER_OK;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

enum { MAX_ROUNDS = 64 };

int main(int argc, char **argv) {
    const char *model = "models/tiny-base";
    int calls = 32, new_tokens = 128, steps = 40, rounds = 5, threads = 0;
    ArgSpec specs[] = {
        {"model", ARG_STR, &model, "model dir", 0, 0, 0},
        {"calls", ARG_INT, &calls, "generate calls per run (split between the sessions; even)", 0, 2, 100000},
        {"new-tokens", ARG_INT, &new_tokens, "sampled tokens per decode call", 0, 1, 100000},
        {"steps", ARG_INT, &steps, "chain steps in a prefill prompt (about 13 tokens each)", 0, 1, 1000},
        {"rounds", ARG_INT, &rounds, "rounds of the four ways; medians reported", 0, 1, MAX_ROUNDS},
    };
    int rc = bench_args("sessions", argc, argv, specs, sizeof specs / sizeof *specs, &threads);
    if (rc >= 0)
        return rc;
    char load0[64], load1[64];
    bench_load_average(load0, sizeof load0);
    ErModel *m;
    if (er_model_load(&m, model) < 0)
        return bench_fail("sessions");
    enum { WAYS = 4 };
    static const int shape[WAYS][2] = {{1, 2}, {2, 1}, {2, 2}, {1, 1}};
    // [decode][way][round]: positions (prefill) or tokens (decode) per wall second, and per CPU second used
    static double rate[2][WAYS][MAX_ROUNDS], per_cpu[2][WAYS][MAX_ROUNDS];
    for (int round = 0; round < rounds; round++)
        for (int decode = 0; decode <= 1; decode++)
            for (int k = 0; k < WAYS; k++) {
                Rate r = {0, 0, 0, 0};
                if (run(m, shape[k][0], shape[k][1], calls & ~1, decode, new_tokens, steps, &r) < 0) {
                    er_model_free(m);
                    return bench_fail("sessions");
                }
                rate[decode][k][round] = decode ? r.tokens_per_s : r.positions_per_s;
                per_cpu[decode][k][round] = rate[decode][k][round] * r.wall_s / (r.cpu_s > 0 ? r.cpu_s : 1e-9);
            }
    er_model_free(m);
    bench_load_average(load1, sizeof load1);
    printf("\n%s, %d calls per run, medians of %d rounds; load average %s before, %s after\n", model, calls & ~1,
           rounds, load0, load1);
    static const char *names[WAYS] = {"1 session  x 2 threads", "2 sessions x 1 thread ", "2 sessions x 2 threads",
                                      "1 session  x 1 thread "};
    double med[2][WAYS], cpu[2][WAYS];
    for (int decode = 0; decode <= 1; decode++)
        for (int k = 0; k < WAYS; k++) {
            med[decode][k] = median(rate[decode][k], rounds);
            cpu[decode][k] = median(per_cpu[decode][k], rounds);
        }
    printf("per wall second (what the app gets), then per CPU second the process used (what it costs):\n");
    for (int k = 0; k < WAYS; k++)
        printf("%s: prefill %8.1f positions/s (%.2fx), decode %7.1f tokens/s (%.2fx) | per CPU s: prefill %8.1f "
               "(%.2fx), decode %7.1f (%.2fx)\n", names[k], med[0][k], med[0][k] / med[0][0], med[1][k],
               med[1][k] / med[1][0], cpu[0][k], cpu[0][k] / cpu[0][0], cpu[1][k], cpu[1][k] / cpu[1][0]);
    return 0;
}
