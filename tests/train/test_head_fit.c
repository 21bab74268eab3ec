// Head training (train/head_fit.h): the loss falls and the held-out AUC is high on
// separable synthetic features (with noise and dropout, and with features on a large scale, which
// the standardisation folded into the saved head handles); ROC-AUC and thresholds on hand-made
// scores.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

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
