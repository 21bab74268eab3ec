// Head training (train/head_fit.h): the loss falls and the held-out AUC is high on
// separable synthetic features (with noise and dropout, and with features on a large scale, which
// the standardisation folded into the saved head handles); ROC-AUC and thresholds on hand-made
// scores; the threshold chosen on the calibration rows and the accuracy at it reported on the report rows;
// rows of one label refused.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "core/rng.h"
#include "model/head.h"
#include "train/head_fit.h"

// n rows of C features: label = 1 when feature 0 + feature 1 > 0, features scaled by `scale` and
// shifted by `shift`.
static void make_rows(float *x, float *y, int n, int C, float scale, float shift, uint64_t seed) {
    ErRng r;
    rng_seed(&r, seed);
    for (int i = 0; i < n; i++) {
        for (int c = 0; c < C; c++)
            x[i * C + c] = rng_normal(&r);
        y[i] = x[i * C] + x[i * C + 1] > 0 ? 1.0f : 0.0f;
        for (int c = 0; c < C; c++)
            x[i * C + c] = x[i * C + c] * scale + shift;
    }
}

static void check_fit(HeadKind kind, float noise, float scale, float shift) {
    enum { N = 200, NV = 100, C = 6 };
    float *x = malloc(sizeof(float) * N * C), *y = malloc(sizeof(float) * N);
    float *xv = malloc(sizeof(float) * NV * C), *yv = malloc(sizeof(float) * NV), *p = malloc(sizeof(float) * NV);
    make_rows(x, y, N, C, scale, shift, 1);
    make_rows(xv, yv, NV, C, scale, shift, 2);
    Head h;
    cr_assert_eq(head_init(&h, kind, C, 8, 0.2f, 1, 3), 0);
    HeadFitConfig c;
    head_fit_config_default(&c);
    c.epochs = 60;
    c.lr = 1e-2;
    c.noise = noise;
    c.seed = 4;
    HeadFitResult res;
    cr_assert_eq(head_fit(&h, x, y, N, xv, yv, NV, &c, &res), 0);
    cr_assert_lt(res.last_loss, 0.6 * res.first_loss, "loss %g -> %g", res.first_loss, res.last_loss);
    cr_assert_lt(res.val_loss, 0.4, "held-out loss %g", res.val_loss);
    // The saved head reads raw features: predictions on them separate the classes.
    cr_assert_eq(head_predict(&h, xv, NV, p), 0);
    double auc = roc_auc(p, yv, NV);
    cr_assert_gt(auc, 0.95, "held-out AUC %g", auc);
    float t = threshold_choose(p, yv, NV, 0);
    cr_assert_gt(accuracy_at(p, yv, NV, t), 0.85);
    head_free(&h);
    free(x);
    free(y);
    free(xv);
    free(yv);
    free(p);
}

Test(head_fit, mlp_with_noise_and_dropout_learns_separable_features) { check_fit(HEAD_MLP, 0.5f, 1, 0); }
Test(head_fit, linear_learns_separable_features) { check_fit(HEAD_LINEAR, 0, 1, 0); }
Test(head_fit, raw_features_on_a_large_scale) { check_fit(HEAD_MLP, 0.5f, 40, 25); }

Test(head_fit, roc_auc_on_hand_made_scores) {
    float s[] = {0.1f, 0.4f, 0.35f, 0.8f}, y[] = {0, 0, 1, 1};
    cr_assert_float_eq(roc_auc(s, y, 4), 0.75, 1e-12);
    float perfect[] = {0.1f, 0.2f, 0.8f, 0.9f};
    cr_assert_float_eq(roc_auc(perfect, y, 4), 1.0, 1e-12);
    float ties[] = {0.5f, 0.5f, 0.5f, 0.5f};
    cr_assert_float_eq(roc_auc(ties, y, 4), 0.5, 1e-12);
    float one_class[] = {1, 1, 1, 1};
    cr_assert(isnan(roc_auc(s, one_class, 4)));
}

Test(head_fit, thresholds_for_recall_and_accuracy) {
    float s[] = {0.1f, 0.2f, 0.3f, 0.4f, 0.6f, 0.7f, 0.9f}, y[] = {0, 1, 0, 1, 1, 0, 1};
    // Positives scored 0.2, 0.4, 0.6, 0.9: recall 0.5 needs 2 of them -> 0.6; recall 1 -> 0.2.
    cr_assert_float_eq(threshold_choose(s, y, 7, 0.5), 0.6f, 1e-7);
    cr_assert_float_eq(threshold_choose(s, y, 7, 1.0), 0.2f, 1e-7);
    cr_assert_float_eq(threshold_choose(s, y, 7, 0.7), 0.4f, 1e-7);
    float t = threshold_choose(s, y, 7, 0);
    double best = accuracy_at(s, y, 7, t);
    for (int i = 0; i < 7; i++)
        cr_assert_geq(best, accuracy_at(s, y, 7, s[i]));
    cr_assert_float_eq(accuracy_at(s, y, 7, 0.35f), 5.0 / 7, 1e-12);
    cr_assert_float_eq(threshold_choose(s, y, 0, 0), 0.5f, 1e-7);
}

// n rows as make_rows writes them, in a HeadRows; flip: every label the other way round.
static void rows_of(HeadRows *r, int n, int C, uint64_t seed, int flip) {
    *r = (HeadRows){.C = C};
    cr_assert_eq(head_rows_reserve(r, n), 0);
    make_rows(r->x, r->y, n, C, 1, 0, seed);
    for (int i = 0; flip && i < n; i++)
        r->y[i] = 1 - r->y[i];
    r->n = n;
}

static double metric(const cJSON *m, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, key);
    cr_assert(cJSON_IsNumber(v), "metrics have no \"%s\"", key);
    return v->valuedouble;
}

static const char *metric_str(const cJSON *m, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, key);
    cr_assert(cJSON_IsString(v), "metrics have no \"%s\"", key);
    return v->valuestring;
}

// head_train chooses the threshold on the calibration rows and reports the accuracy at it on the report
// rows, which it never looked at: here the report rows' labels contradict their features, so an
// accuracy measured where the threshold was chosen (high) and one measured on the report rows (low)
// cannot be confused. Without report rows the calibration rows report, and the metrics and line say so.
Test(head_fit, report_accuracy_comes_from_rows_the_threshold_never_saw) {
    enum { N = 200, NC = 60, NR = 40, C = 6 };
    HeadRows tr, cal, rep, none = {.C = C};
    rows_of(&tr, N, C, 1, 0);
    rows_of(&cal, NC, C, 2, 0);
    rows_of(&rep, NR, C, 3, 1);
    for (int with_report = 1; with_report >= 0; with_report--) {
        TrainedHead t = {0};
        cr_assert_eq(head_init(&t.net, HEAD_LINEAR, C, 1, 0, 1, 3), 0);
        HeadTrainSpec s = {0};
        head_fit_config_default(&s.fit);
        s.fit.epochs = 60;
        s.fit.lr = 1e-2;
        s.fit.seed = 4;
        s.fit.label = "probe";
        char *line = NULL;
        size_t n;
        s.out = open_memstream(&line, &n);
        cJSON *results = cJSON_CreateObject();
        int rc = head_train(&t, &tr, &cal, with_report ? &rep : &none, &s, results);
        fclose(s.out);
        cr_assert_eq(rc, 0, "%s", er_last_error());
        float pc[NC], pr[NR];
        cr_assert_eq(head_predict(&t.net, cal.x, NC, pc), 0);
        cr_assert_eq(head_predict(&t.net, rep.x, NR, pr), 0);
        cr_assert_eq(t.threshold, threshold_choose(pc, cal.y, NC, 0), "the threshold is the calibration rows'");
        double acc_c = accuracy_at(pc, cal.y, NC, t.threshold), acc_r = accuracy_at(pr, rep.y, NR, t.threshold);
        cr_assert_gt(acc_c, 0.85);
        cr_assert_lt(acc_r, 0.15);
        const cJSON *m = t.metrics;
        cr_assert_eq(metric(m, "calibration_accuracy"), acc_c);
        cr_assert_str_eq(metric_str(m, "threshold_split"), "calibration");
        cr_assert_eq(metric(m, "n_calibration"), NC);
        if (with_report) {
            cr_assert_eq(metric(m, "report_accuracy"), acc_r, "reported %g, the report rows' accuracy is %g",
                         metric(m, "report_accuracy"), acc_r);
            cr_assert_str_eq(metric_str(m, "report_split"), "report");
            cr_assert_eq(metric(m, "n_report"), NR);
            char want[64];
            snprintf(want, sizeof want, "accuracy %.4f on the %d report rows", acc_r, NR);
            cr_assert(strstr(line, want), "the line does not give the report rows' accuracy (%s):\n%s", want, line);
        } else {
            cr_assert_eq(metric(m, "report_accuracy"), acc_c);
            cr_assert_str_eq(metric_str(m, "report_split"), "calibration");
            cr_assert(strstr(line, "calibration rows (none held out to report on)"), "%s", line);
        }
        cr_assert(cJSON_GetObjectItem(results, "probe"), "the metrics are added to the results");
        cJSON_Delete(results);
        free(line);
        trained_head_free(&t);
    }
    head_rows_free(&tr);
    head_rows_free(&cal);
    head_rows_free(&rep);
}

// Training rows of one label: refused with the head's name and the label counts of every split, unless
// allow_one_class, which writes it with a loud warning. Calibration rows of one label (for a target
// recall: no positive) are warned about loudly; all positive is fine for a target recall.
Test(head_fit, one_class_is_refused_with_the_counts) {
    enum { N = 40, NC = 10, C = 4 };
    HeadRows tr, cal, rep = {.C = C};
    rows_of(&tr, N, C, 1, 0);
    rows_of(&cal, NC, C, 2, 0);
    struct {
        HeadRows *r;
        float label;
        double target;
        int refused, warned;
        const char *expect;
    } cases[] = {
        {&tr, 1, 0, 1, 1, "probe: the training rows hold one class (needs reasoning in 40 of 40 training rows, "},
        {&tr, 0, 0, 1, 1, "probe: the training rows hold one class (needs reasoning in 0 of 40 training rows, "},
        {&cal, 1, 0, 0, 1, "probe: WARNING: the calibration rows hold one class (needs reasoning in "},
        {&cal, 0, 0.9, 0, 1, "probe: WARNING: the calibration rows hold one class"},
        {&cal, 1, 0.9, 0, 0, NULL},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        for (int allow = 0; allow <= 1; allow++) {
            HeadRows saved = *cases[k].r, copy;
            rows_of(&copy, saved.n, C, cases[k].r == &tr ? 1 : 2, 0);
            for (int i = 0; i < copy.n; i++)
                copy.y[i] = cases[k].label;
            *cases[k].r = copy;
            TrainedHead t = {0};
            cr_assert_eq(head_init(&t.net, HEAD_LINEAR, C, 1, 0, 1, 3), 0);
            HeadTrainSpec s = {0};
            head_fit_config_default(&s.fit);
            s.fit.epochs = 2;
            s.fit.label = "probe";
            s.positive = "needs reasoning";
            s.target_recall = cases[k].target;
            s.allow_one_class = allow;
            char *log = NULL;
            size_t n;
            s.log = open_memstream(&log, &n);
            cJSON *results = cJSON_CreateObject();
            int rc = head_train(&t, &tr, &cal, &rep, &s, results);
            fclose(s.log);
            if (cases[k].refused && !allow) {
                cr_assert_eq(rc, ER_EINVAL, "case %zu: not refused", k);
                cr_assert(strstr(er_last_error(), cases[k].expect) && strstr(er_last_error(), "--allow-one-class"),
                          "case %zu: %s", k, er_last_error());
            } else {
                cr_assert_eq(rc, 0, "case %zu (allow %d): %s", k, allow, er_last_error());
                cr_assert_eq(strstr(log, "WARNING") != NULL, cases[k].warned, "case %zu: %s", k, log);
                if (cases[k].warned && !cases[k].refused)
                    cr_assert(strstr(log, cases[k].expect), "case %zu: %s", k, log);
            }
            free(log);
            cJSON_Delete(results);
            trained_head_free(&t);
            head_rows_free(cases[k].r);
            *cases[k].r = saved;
        }
    }
    head_rows_free(&tr);
    head_rows_free(&cal);
}
