// infer/sampler and infer/stop. The sampler is checked against an independent double-precision
// reference written the way Hugging Face's warpers are (full sorts, softmax, ascending cumsum for
// top-p), through empirical frequencies of many seeded draws; the stop matcher against a brute
// force search over every way of chunking the stream.
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"
#include "infer/sampler.h"
#include "infer/stop.h"

// ---------------------------------------------------------------------------------------------
// reference (double, full sorts, HF order)

static const double *sort_key;
static int cmp_key_asc(const void *a, const void *b) {
    double x = sort_key[*(const int *)a], y = sort_key[*(const int *)b];
    return (x > y) - (x < y);
}

static void softmax_ref(const double *z, int V, double *p) {
    double m = -INFINITY, s = 0.0;
    for (int i = 0; i < V; i++)
        if (z[i] > m)
            m = z[i];
    for (int i = 0; i < V; i++)
        s += (p[i] = exp(z[i] - m));
    for (int i = 0; i < V; i++)
        p[i] /= s;
}

// The distribution HF samples from: TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
// MinPLogitsWarper, softmax. Returns the number of tokens with nonzero probability. *margin gets
// the smallest distance of any filter decision from its boundary (to catch test vectors whose
// answer hinges on rounding).
static int ref_dist(const float *logits, int V, SamplerParams p, double *prob, double *margin) {
    double *z = malloc(sizeof(double) * V), *q = malloc(sizeof(double) * V);
    int *idx = malloc(sizeof(int) * V);
    double mg = INFINITY;
    for (int i = 0; i < V; i++)
        z[i] = (double)logits[i] / (double)p.temperature;
    if (p.top_k > 0 && p.top_k < V) {
        for (int i = 0; i < V; i++)
            idx[i] = i;
        sort_key = z;
        qsort(idx, V, sizeof(int), cmp_key_asc);
        double thr = z[idx[V - p.top_k]];
        for (int i = 0; i < V; i++) {
            if (z[i] < thr)
                z[i] = -INFINITY;
            if (z[i] != thr && isfinite(z[i]))
                mg = fmin(mg, fabs(z[i] - thr));
        }
    }
    if (p.top_p < 1.0f) {
        softmax_ref(z, V, q);
        for (int i = 0; i < V; i++)
            idx[i] = i;
        sort_key = q;
        qsort(idx, V, sizeof(int), cmp_key_asc);
        double cum = 0.0, lim = 1.0 - (double)p.top_p;
        for (int j = 0; j < V; j++) {
            int t = idx[j];
            cum += q[t];
            if (q[t] > 0)
                mg = fmin(mg, fabs(cum - lim));
            if (cum <= lim && j < V - 1)
                z[t] = -INFINITY;
        }
    }
    if (p.min_p > 0.0f) {
        softmax_ref(z, V, q);
        double qmax = 0.0;
        for (int i = 0; i < V; i++)
            qmax = fmax(qmax, q[i]);
        for (int i = 0; i < V; i++) {
            if (q[i] > 0)
                mg = fmin(mg, fabs(q[i] / qmax - (double)p.min_p));
            if (q[i] < p.min_p * qmax)
                z[i] = -INFINITY;
        }
    }
    softmax_ref(z, V, prob);
    int n = 0;
    for (int i = 0; i < V; i++)
        n += prob[i] > 0;
    if (margin)
        *margin = mg;
    free(z);
    free(q);
    free(idx);
    return n;
}

static double log_softmax_ref(const float *logits, int V, int t) {
    double m = -INFINITY, s = 0.0;
    for (int i = 0; i < V; i++)
        m = fmax(m, logits[i]);
    for (int i = 0; i < V; i++)
        s += exp((double)logits[i] - m);
    return (double)logits[t] - m - log(s);
}

static void random_logits(float *l, int V, uint64_t seed, float scale) {
    ErRng r;
    rng_seed(&r, seed);
    for (int i = 0; i < V; i++)
        l[i] = scale * rng_normal(&r);
}

static SamplerParams params(float t, int k, float top_p, float min_p) {
    SamplerParams p = {.temperature = t, .top_k = k, .top_p = top_p, .min_p = min_p};
    return p;
}

// sampler_dist against the reference prob (V): the same set of allowed tokens exactly, the same
// probabilities to float precision.
static void check_dist(Sampler *s, const float *logits, int V, SamplerParams p, const double *prob) {
    float *q = malloc(sizeof(float) * V);
    cr_assert_eq(sampler_dist(s, &p, logits, q), ER_OK, "%s", er_last_error());
    for (int i = 0; i < V; i++) {
        cr_assert_eq(q[i] > 0.0f, prob[i] > 0.0, "token %d: sampler prob %g, reference %g", i, q[i], prob[i]);
        cr_assert(fabs(q[i] - prob[i]) <= 1e-6 + 1e-5 * prob[i], "token %d: sampler prob %.8f, reference %.8f", i,
                  q[i], prob[i]);
    }
    free(q);
}

// Checks sampler_dist, then draws n tokens from logits (V) and checks the counts against prob
// (V): tokens with prob 0 never appear, every frequency is within 5 sigma of its probability and
// within max_abs overall.
static void check_freq(const float *logits, int V, SamplerParams p, const double *prob, int n, uint64_t seed,
                       double max_abs) {
    Sampler s;
    cr_assert_eq(sampler_init(&s, V), ER_OK);
    check_dist(&s, logits, V, p, prob);
    ErRng rng;
    rng_seed(&rng, seed);
    int *count = calloc(V, sizeof(int));
    for (int i = 0; i < n; i++) {
        int t = -1;
        cr_assert_eq(sampler_sample(&s, &p, logits, &rng, &t, NULL), ER_OK, "%s", er_last_error());
        cr_assert(t >= 0 && t < V, "token %d out of range", t);
        count[t]++;
    }
    for (int i = 0; i < V; i++) {
        if (prob[i] == 0.0) {
            cr_assert_eq(count[i], 0, "token %d is outside the allowed set but was drawn %d times", i, count[i]);
            continue;
        }
        double f = (double)count[i] / n, sd = sqrt(prob[i] * (1 - prob[i]) / n);
        cr_assert(fabs(f - prob[i]) <= 5 * sd + 1.0 / n, "token %d: frequency %.5f, expected %.5f (sd %.5f)", i, f,
                  prob[i], sd);
        cr_assert(fabs(f - prob[i]) < max_abs, "token %d: frequency %.5f, expected %.5f", i, f, prob[i]);
    }
    free(count);
    sampler_free(&s);
}

// ---------------------------------------------------------------------------------------------
// sampler

Test(sampler, greedy_argmax_lowest_id_on_ties) {
    float l[6] = {1.0f, 5.0f, 3.0f, 5.0f, -INFINITY, 4.9f};
    Sampler s;
    cr_assert_eq(sampler_init(&s, 6), ER_OK);
    ErRng rng, before;
    rng_seed(&rng, 7);
    before = rng;
    SamplerParams ps[3] = {params(0, 0, 1, 0), params(0, 3, 0.5f, 0.2f), params(0, 1, 1, 0)};
    for (int k = 0; k < 3; k++) {
        int t = -1;
        float lp = 0;
        cr_assert_eq(sampler_sample(&s, &ps[k], l, &rng, &t, &lp), ER_OK);
        cr_assert_eq(t, 1, "greedy picked %d, expected the first of the tied maxima (1)", t);
        cr_assert_float_eq(lp, log_softmax_ref(l, 6, 1), 1e-5);
    }
    cr_assert(memcmp(&rng, &before, sizeof rng) == 0, "greedy must not consume random numbers");
    float q[6];
    cr_assert_eq(sampler_dist(&s, &ps[1], l, q), ER_OK);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(q[i], i == 1 ? 1.0f : 0.0f, "greedy distribution is not one-hot at the argmax");
    float m[4] = {-2.0f, -1.0f, -1.5f, -3.0f};
    int t = -1;
    SamplerParams g = params(0, 0, 1, 0);
    sampler_free(&s);
    cr_assert_eq(sampler_init(&s, 4), ER_OK);
    cr_assert_eq(sampler_sample(&s, &g, m, &rng, &t, NULL), ER_OK);
    cr_assert_eq(t, 1);
    sampler_free(&s);
}

Test(sampler, one_draw_per_sample_and_seed_determines_tokens) {
    enum { V = 200, N = 400 };
    static float logits[N][V];
    for (int i = 0; i < N; i++)
        random_logits(logits[i], V, 1000 + i, 2.0f);
    SamplerParams p = params(0.8f, 40, 0.9f, 0.02f);
    Sampler s;
    cr_assert_eq(sampler_init(&s, V), ER_OK);
    int a[N], b[N], c[N];
    for (int run = 0; run < 3; run++) {
        ErRng rng, shadow;
        rng_seed(&rng, run == 2 ? 43 : 42);
        shadow = rng;
        int *out = run == 0 ? a : run == 1 ? b : c;
        for (int i = 0; i < N; i++) {
            cr_assert_eq(sampler_sample(&s, &p, logits[i], &rng, &out[i], NULL), ER_OK);
            (void)rng_uniform_f64(&shadow);
            cr_assert(memcmp(&rng, &shadow, sizeof rng) == 0, "sample %d did not consume exactly one draw", i);
        }
    }
    cr_assert(memcmp(a, b, sizeof a) == 0, "same seed, different tokens");
    int diff = 0;
    for (int i = 0; i < N; i++)
        diff += a[i] != c[i];
    cr_assert_gt(diff, N / 10, "different seeds gave nearly the same tokens (%d of %d differ)", diff, N);
    sampler_free(&s);
}

Test(sampler, temperature_one_matches_softmax) {
    float l[8] = {0.5f, -1.0f, 2.0f, 0.0f, 1.2f, -3.0f, 0.7f, 1.9f};
    double prob[8];
    SamplerParams p = sampler_params_default();
    ref_dist(l, 8, p, prob, NULL);
    check_freq(l, 8, p, prob, 200000, 1, 0.005);
}

Test(sampler, temperature_half_sharpens) {
    float l[8] = {0.5f, -1.0f, 2.0f, 0.0f, 1.2f, -3.0f, 0.7f, 1.9f};
    double z[8], prob[8], prob1[8];
    for (int i = 0; i < 8; i++)
        z[i] = l[i] / 0.5;
    softmax_ref(z, 8, prob);
    for (int i = 0; i < 8; i++)
        z[i] = l[i];
    softmax_ref(z, 8, prob1);
    cr_assert_gt(prob[2] - prob1[2], 0.1, "test vector does not separate T = 0.5 from T = 1");
    check_freq(l, 8, params(0.5f, 0, 1, 0), prob, 200000, 2, 0.005);
    // large T flattens, tiny T is greedy in the limit (and must not overflow)
    double flat[8];
    for (int i = 0; i < 8; i++)
        flat[i] = 1.0 / 8;
    float same[8] = {3, 3, 3, 3, 3, 3, 3, 3};
    check_freq(same, 8, params(1e-30f, 0, 1, 0), flat, 50000, 3, 0.01);
    double hot[8] = {0, 0, 1, 0, 0, 0, 0, 0};
    check_freq(l, 8, params(1e-30f, 0, 1, 0), hot, 1000, 4, 1e-9);
}

Test(sampler, masked_tokens_never_drawn) {
    float l[10] = {1, -INFINITY, 0.5f, -INFINITY, -INFINITY, 2, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    double prob[10];
    SamplerParams p = params(1, 5, 1, 0); // top_k larger than the finite count
    int n = ref_dist(l, 10, p, prob, NULL);
    cr_assert_eq(n, 3);
    check_freq(l, 10, p, prob, 50000, 5, 0.01);
}

Test(sampler, top_k_only_k_best) {
    enum { V = 100, K = 7 };
    float l[V];
    random_logits(l, V, 11, 1.5f);
    double prob[V], margin;
    SamplerParams p = params(1, K, 1, 0);
    cr_assert_eq(ref_dist(l, V, p, prob, &margin), K);
    cr_assert_gt(margin, 1e-4);
    check_freq(l, V, p, prob, 100000, 6, 0.01);
    // HF keeps every token tied with the k-th
    float t[5] = {3, 1, 3, 0, 3};
    double tp[5] = {1.0 / 3, 0, 1.0 / 3, 0, 1.0 / 3};
    check_freq(t, 5, params(1, 1, 1, 0), tp, 60000, 7, 0.01);
}

Test(sampler, top_p_nucleus_only) {
    enum { V = 64 };
    for (int v = 0; v < 3; v++) {
        float l[V];
        random_logits(l, V, 20 + v, 2.0f);
        double prob[V], margin;
        SamplerParams p = params(1, 0, 0.7f, 0);
        int n = ref_dist(l, V, p, prob, &margin);
        cr_assert(n > 1 && n < V, "nucleus of %d tokens does not exercise top-p", n);
        cr_assert_gt(margin, 1e-5, "test vector %d sits on a top-p boundary", v);
        check_freq(l, V, p, prob, 100000, 30 + v, 0.01);
    }
    // exact boundary: four equal tokens, top_p 0.5 -> HF drops the ascending prefix with cumsum
    // <= 0.5, i.e. keeps two (ties by lower id here)
    float e[4] = {1, 1, 1, 1};
    double ep[4] = {0.5, 0.5, 0, 0};
    check_freq(e, 4, params(1, 0, 0.5f, 0), ep, 40000, 8, 0.01);
    // tiny top_p keeps only the most probable token
    float l[V];
    random_logits(l, V, 29, 2.0f);
    double prob[V];
    cr_assert_eq(ref_dist(l, V, params(1, 0, 1e-3f, 0), prob, NULL), 1);
    check_freq(l, V, params(1, 0, 1e-3f, 0), prob, 2000, 9, 1e-9);
}

// A wide, flat distribution: hundreds of top-p candidates, so the nucleus is found by the
// partition rounds rather than the final small sort.
Test(sampler, top_p_large_nucleus) {
    enum { V = 2048 };
    float l[V];
    random_logits(l, V, 314, 0.7f);
    double prob[V], margin;
    SamplerParams p = params(1, 0, 0.5f, 0);
    int n = ref_dist(l, V, p, prob, &margin);
    cr_assert(n > 200 && n < V / 2, "nucleus of %d tokens", n);
    cr_assert_gt(margin, 1e-5, "test vector sits on the top-p boundary (margin %g)", margin);
    check_freq(l, V, p, prob, 20000, 315, 0.01);
    // many more vectors, distribution only: each partition round has some chance of landing its
    // pivot exactly on the boundary token, a case a single vector rarely hits
    Sampler s;
    cr_assert_eq(sampler_init(&s, V), ER_OK);
    int used = 0;
    for (int v = 0; v < 60; v++) {
        random_logits(l, V, 400 + v, 0.5f + 0.05f * (v % 10));
        SamplerParams q = params(1, 0, 0.3f + 0.01f * (float)v, 0);
        if (ref_dist(l, V, q, prob, &margin) < 100 || margin < 1e-6)
            continue;
        check_dist(&s, l, V, q, prob);
        used++;
    }
    cr_assert_gt(used, 40, "only %d usable vectors", used);
    sampler_free(&s);
}

Test(sampler, min_p_only) {
    enum { V = 64 };
    for (int v = 0; v < 3; v++) {
        float l[V];
        random_logits(l, V, 40 + v, 1.5f);
        double prob[V], margin;
        SamplerParams p = params(1, 0, 1, 0.1f);
        int n = ref_dist(l, V, p, prob, &margin);
        cr_assert(n > 1 && n < V, "min-p keeps %d tokens: does not exercise it", n);
        cr_assert_gt(margin, 1e-5);
        check_freq(l, V, p, prob, 100000, 50 + v, 0.01);
    }
}

Test(sampler, combined_filters_in_hf_order) {
    enum { V = 64 };
    SamplerParams ps[4] = {params(0.7f, 20, 0.8f, 0.05f), params(1.3f, 30, 0.6f, 0.02f), params(0.9f, 12, 0.95f, 0.2f),
                           params(1.0f, 25, 0.5f, 0.0f)};
    int checked = 0;
    for (int v = 0; v < 6; v++) {
        float l[V];
        random_logits(l, V, 60 + v, 2.0f);
        SamplerParams p = ps[v % 4];
        double prob[V], margin;
        int n = ref_dist(l, V, p, prob, &margin);
        cr_assert(n > 1 && n < p.top_k, "vector %d: %d tokens allowed, filters not exercised", v, n);
        cr_assert_gt(margin, 1e-5, "vector %d sits on a filter boundary", v);
        check_freq(l, V, p, prob, 60000, 70 + v, 0.01);
        checked++;
    }
    cr_assert_eq(checked, 6);
    // the order matters: top-p on the top-k-renormalised distribution differs from top-p first
    float l[V];
    random_logits(l, V, 99, 1.0f);
    double a[V], b[V];
    int na = ref_dist(l, V, params(1, 10, 0.5f, 0), a, NULL);
    int nb = ref_dist(l, V, params(1, 0, 0.5f, 0), b, NULL);
    cr_assert_lt(na, nb, "test vector does not distinguish HF order (%d vs %d)", na, nb);
    check_freq(l, V, params(1, 10, 0.5f, 0), a, 100000, 80, 0.01);
}

Test(sampler, logprob_is_unmodified_log_softmax) {
    enum { V = 1000 };
    float l[V];
    random_logits(l, V, 123, 3.0f);
    l[17] = -INFINITY;
    Sampler s;
    cr_assert_eq(sampler_init(&s, V), ER_OK);
    ErRng rng;
    rng_seed(&rng, 5);
    // The default reuses the draw's weights for the log-prob; temperature 1 with a filter must not.
    SamplerParams ps[7] = {sampler_params_default(), params(0.6f, 50, 0.9f, 0.05f), params(2.0f, 0, 1, 0),
                           params(0, 0, 1, 0), params(1.0f, 50, 1, 0), params(1.0f, 0, 0.9f, 0),
                           params(1.0f, 0, 1, 0.05f)};
    for (int k = 0; k < 7; k++) {
        for (int i = 0; i < 100; i++) {
            int t = -1;
            float lp = 1.0f;
            cr_assert_eq(sampler_sample(&s, &ps[k], l, &rng, &t, &lp), ER_OK);
            double ref = log_softmax_ref(l, V, t);
            cr_assert(fabs(lp - ref) < 1e-5, "params %d token %d: logprob %.7f, expected %.7f", k, t, lp, ref);
        }
    }
    sampler_free(&s);
}

Test(sampler, full_vocab_top_p) {
    enum { V = 151936 };
    float *l = malloc(sizeof(float) * V);
    double *prob = malloc(sizeof(double) * V);
    random_logits(l, V, 777, 3.0f);
    Sampler s;
    cr_assert_eq(sampler_init(&s, V), ER_OK);
    ErRng rng;
    rng_seed(&rng, 9);
    SamplerParams ps[4] = {params(1, 0, 0.9f, 0), params(0.8f, 40, 0.9f, 0), params(1, 0, 0.95f, 0.01f),
                           params(0.6f, 20, 0.95f, 0)};
    for (int k = 0; k < 4; k++) {
        double margin;
        int n = ref_dist(l, V, ps[k], prob, &margin);
        cr_assert(n > 1 && n < V, "params %d: %d tokens allowed", k, n);
        cr_assert_gt(margin, 1e-6, "params %d: the test vector sits on a filter boundary", k);
        check_dist(&s, l, V, ps[k], prob);
        for (int i = 0; i < 20; i++) {
            int t = -1;
            float lp;
            cr_assert_eq(sampler_sample(&s, &ps[k], l, &rng, &t, &lp), ER_OK, "%s", er_last_error());
            cr_assert(t >= 0 && t < V);
            cr_assert_gt(prob[t], 0.0, "params %d: token %d is outside the reference's allowed set", k, t);
            cr_assert(fabs(lp - log_softmax_ref(l, V, t)) < 1e-4);
        }
    }
    sampler_free(&s);
    free(l);
    free(prob);
}

Test(sampler, bad_input_is_an_error) {
    float l[4] = {0.1f, 0.2f, NAN, 0.3f};
    Sampler s;
    cr_assert_eq(sampler_init(&s, 4), ER_OK);
    ErRng rng, before;
    rng_seed(&rng, 1);
    before = rng;
    SamplerParams p = sampler_params_default();
    int t = -7;
    float lp = 42.0f;
    er_clear_error();
    cr_assert_eq(sampler_sample(&s, &p, l, &rng, &t, &lp), ER_EINVAL);
    cr_assert(strstr(er_last_error(), "logits hold NaN (at vocabulary id 2)"), "message: %s", er_last_error());
    cr_assert_eq(t, -7);
    cr_assert_eq(lp, 42.0f);
    cr_assert(memcmp(&rng, &before, sizeof rng) == 0);
    l[2] = INFINITY;
    cr_assert_eq(sampler_sample(&s, &p, l, &rng, &t, NULL), ER_EINVAL);
    cr_assert(strstr(er_last_error(), "+inf"), "message: %s", er_last_error());
    float masked[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    cr_assert_eq(sampler_sample(&s, &p, masked, &rng, &t, NULL), ER_EINVAL);
    cr_assert(strstr(er_last_error(), "-inf"), "message: %s", er_last_error());

    struct {
        SamplerParams p;
        const char *field;
    } bad[] = {
        {params(-1, 0, 1, 0), "temperature"},   {params(NAN, 0, 1, 0), "temperature"},
        {params(INFINITY, 0, 1, 0), "temperature"}, {params(1, -1, 1, 0), "top_k"},
        {params(1, 0, 0, 0), "top_p"},          {params(1, 0, 1.5f, 0), "top_p"},
        {params(1, 0, NAN, 0), "top_p"},        {params(1, 0, -0.1f, 0), "top_p"},
        {params(1, 0, 1, 1), "min_p"},          {params(1, 0, 1, -0.1f), "min_p"},
        {params(1, 0, 1, NAN), "min_p"},
    };
    float ok[4] = {0.1f, 0.2f, 0.3f, 0.4f};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        er_clear_error();
        cr_assert_eq(sampler_params_validate(&bad[i].p), ER_EINVAL, "case %zu accepted", i);
        cr_assert(strstr(er_last_error(), bad[i].field), "case %zu message: %s", i, er_last_error());
        t = -7;
        cr_assert_eq(sampler_sample(&s, &bad[i].p, ok, &rng, &t, NULL), ER_EINVAL, "case %zu sampled", i);
        cr_assert_eq(t, -7);
    }
    SamplerParams good[] = {sampler_params_default(), params(0, 0, 1, 0), params(0.5f, 100000, 1e-6f, 0.999f)};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        cr_assert_eq(sampler_params_validate(&good[i]), ER_OK, "good case %zu: %s", i, er_last_error());
        cr_assert_eq(sampler_sample(&s, &good[i], ok, &rng, &t, NULL), ER_OK);
        cr_assert(t >= 0 && t < 4);
    }
    cr_assert_eq(sampler_sample(&s, NULL, ok, &rng, &t, NULL), ER_EINVAL);
    float q[4];
    cr_assert_eq(sampler_dist(&s, &p, l, q), ER_EINVAL); // l holds +inf here
    cr_assert_eq(sampler_dist(&s, &bad[0].p, ok, q), ER_EINVAL);
    cr_assert_eq(sampler_dist(&s, &p, ok, NULL), ER_EINVAL);
    sampler_free(&s);
    Sampler z;
    cr_assert_eq(sampler_init(&z, 0), ER_EINVAL);
    sampler_free(&z); // safe after a failed init
}

// ---------------------------------------------------------------------------------------------
// stop strings

static int feed_str(StopMatcher *m, const char *s, size_t *at) { return stop_feed(m, s, strlen(s), at); }

Test(stop, split_across_three_feeds) {
    const char *stops[] = {"</answer>"};
    StopMatcher m;
    cr_assert_eq(stop_init(&m, stops, 1), ER_OK);
    size_t at = 12345;
    cr_assert_eq(feed_str(&m, "The result </an", &at), 0);
    cr_assert_eq(stop_pending(&m), 4); // "</an" might still become the stop string
    cr_assert_eq(feed_str(&m, "sw", &at), 0);
    cr_assert_eq(at, 12345);
    cr_assert_eq(feed_str(&m, "er> trailing", &at), 1);
    cr_assert_eq(at, 11);
    // sticky: later feeds change nothing
    cr_assert_eq(feed_str(&m, "</answer>", &at), 1);
    cr_assert_eq(at, 11);
    cr_assert_eq(stop_pending(&m), 0);
    stop_reset(&m);
    cr_assert_eq(feed_str(&m, "x</answer>", &at), 1);
    cr_assert_eq(at, 1);
}

Test(stop, overlapping_prefixes) {
    const char *stops[] = {"aab"};
    StopMatcher m;
    cr_assert_eq(stop_init(&m, stops, 1), ER_OK);
    size_t at = 0;
    cr_assert_eq(feed_str(&m, "aaab", &at), 1);
    cr_assert_eq(at, 1);
    stop_reset(&m);
    cr_assert_eq(feed_str(&m, "a", &at), 0);
    cr_assert_eq(feed_str(&m, "a", &at), 0);
    cr_assert_eq(feed_str(&m, "a", &at), 0);
    cr_assert_eq(stop_pending(&m), 2);
    cr_assert_eq(feed_str(&m, "b", &at), 1);
    cr_assert_eq(at, 1);
    const char *s2[] = {"abab"};
    cr_assert_eq(stop_init(&m, s2, 1), ER_OK);
    cr_assert_eq(feed_str(&m, "abaabab", &at), 1);
    cr_assert_eq(at, 3);
}

Test(stop, several_strings_first_completed_wins) {
    const char *stops[] = {"STOP", "\n\n", "end"};
    StopMatcher m;
    cr_assert_eq(stop_init(&m, stops, 3), ER_OK);
    size_t at = 0;
    cr_assert_eq(feed_str(&m, "abc en", &at), 0);
    cr_assert_eq(feed_str(&m, "d\n\nSTOP", &at), 1);
    cr_assert_eq(at, 4);
    cr_assert_eq(m.match_index, 2);
    // "bc" completes before "abcd", so the stream stops there whatever the chunking
    const char *s2[] = {"abcd", "bc"};
    cr_assert_eq(stop_init(&m, s2, 2), ER_OK);
    cr_assert_eq(feed_str(&m, "xabcd", &at), 1);
    cr_assert_eq(at, 2);
    // two completing on the same byte: the longer one cuts more
    const char *s3[] = {"b", "ab"};
    cr_assert_eq(stop_init(&m, s3, 2), ER_OK);
    cr_assert_eq(feed_str(&m, "xab", &at), 1);
    cr_assert_eq(at, 1);
    cr_assert_eq(m.match_index, 1);
    // bytes above 0x7f, stop string split inside a UTF-8 character
    const char *s4[] = {"\xc3\xa9t\xc3\xa9"};
    cr_assert_eq(stop_init(&m, s4, 1), ER_OK);
    cr_assert_eq(feed_str(&m, "l'\xc3", &at), 0);
    cr_assert_eq(feed_str(&m, "\xa9t\xc3", &at), 0);
    cr_assert_eq(feed_str(&m, "\xa9!", &at), 1);
    cr_assert_eq(at, 2);
}

Test(stop, no_match) {
    const char *stops[] = {"</answer>", "Human:"};
    StopMatcher m;
    cr_assert_eq(stop_init(&m, stops, 2), ER_OK);
    size_t at = 777;
    cr_assert_eq(feed_str(&m, "</ans", &at), 0);
    cr_assert_eq(stop_pending(&m), 5);
    cr_assert_eq(feed_str(&m, "wer >Human :Huma", &at), 0);
    cr_assert_eq(stop_pending(&m), 4);
    cr_assert_eq(feed_str(&m, "x", &at), 0);
    cr_assert_eq(stop_pending(&m), 0);
    cr_assert_eq(at, 777);
    cr_assert_eq(stop_feed(&m, NULL, 0, &at), 0);
    StopMatcher none;
    cr_assert_eq(stop_init(&none, NULL, 0), ER_OK);
    cr_assert_eq(feed_str(&none, "anything", &at), 0);
}

// Earliest-completing occurrence by brute force; ties at the same end go to the longest.
static int brute_first(const char *text, size_t n, const char *const *stops, int ns, size_t *at) {
    for (size_t e = 1; e <= n; e++) {
        int found = 0;
        size_t best = 0;
        for (int i = 0; i < ns; i++) {
            size_t L = strlen(stops[i]);
            if (L <= e && memcmp(text + e - L, stops[i], L) == 0 && (!found || e - L < best)) {
                found = 1;
                best = e - L;
            }
        }
        if (found) {
            *at = best;
            return 1;
        }
    }
    return 0;
}

Test(stop, any_chunking_matches_brute_force) {
    const char *stops[] = {"abab", "bba", "aaa", "babb"};
    ErRng r;
    rng_seed(&r, 3);
    int matches = 0;
    for (int trial = 0; trial < 500; trial++) {
        char text[40];
        size_t n = 1 + rng_below(&r, 39);
        for (size_t i = 0; i < n; i++)
            text[i] = rng_below(&r, 2) ? 'a' : 'b';
        int ns = 1 + (int)rng_below(&r, 4);
        size_t want_at = 0;
        int want = brute_first(text, n, stops, ns, &want_at);
        matches += want;
        StopMatcher m;
        cr_assert_eq(stop_init(&m, stops, ns), ER_OK);
        size_t at = 0, pos = 0;
        int got = 0;
        while (pos < n) {
            size_t c = 1 + rng_below(&r, 6);
            if (c > n - pos)
                c = n - pos;
            got = stop_feed(&m, text + pos, c, &at);
            pos += c;
        }
        cr_assert_eq(got, want, "trial %d: %.*s", trial, (int)n, text);
        if (want)
            cr_assert_eq(at, want_at, "trial %d: %.*s: at %zu, expected %zu", trial, (int)n, text, at, want_at);
    }
    cr_assert(matches > 50 && matches < 500, "%d of 500 random texts matched: not a useful mix", matches);
}

Test(stop, bad_stop_strings) {
    StopMatcher m;
    const char *nine[9] = {"a", "b", "c", "d", "e", "f", "g", "h", "i"};
    cr_assert_eq(stop_init(&m, nine, 9), ER_EINVAL);
    cr_assert_eq(stop_init(&m, nine, 8), ER_OK);
    const char *empty[] = {"x", ""};
    cr_assert_eq(stop_init(&m, empty, 2), ER_EINVAL);
    cr_assert(strstr(er_last_error(), "empty"), "%s", er_last_error());
    cr_assert_eq(stop_init(&m, NULL, 1), ER_EINVAL);
    char longs[STOP_MAX_LEN + 2];
    memset(longs, 'q', STOP_MAX_LEN + 1);
    longs[STOP_MAX_LEN + 1] = 0;
    const char *lp[] = {longs};
    cr_assert_eq(stop_init(&m, lp, 1), ER_EINVAL);
    longs[STOP_MAX_LEN] = 0; // exactly the maximum
    cr_assert_eq(stop_init(&m, lp, 1), ER_OK);
    size_t at = 0;
    cr_assert_eq(stop_feed(&m, "qq", 2, &at), 0);
    char text[STOP_MAX_LEN + 10];
    memset(text, 'q', sizeof text);
    cr_assert_eq(stop_feed(&m, text, sizeof text, &at), 1);
    cr_assert_eq(at, 0);
    cr_assert_eq(stop_feed(NULL, "x", 1, &at), ER_EINVAL);
}
