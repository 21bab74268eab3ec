// Finite-difference checks shared by the model-level gradient tests.
#ifndef TESTS_MODEL_FD_H
#define TESTS_MODEL_FD_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "model/model.h"

// The directional derivative of loss(ctx) along a random unit direction over all n parameters
// (seeded), by central differences with step h, into *fd; the analytic one (direction · grad) into
// *gd. params is restored afterwards.
static inline void fd_directional(float *params, const float *grad, size_t n, uint64_t seed, double h,
                                  double (*loss)(void *ctx), void *ctx, double *fd, double *gd) {
    float *dir = malloc(n * sizeof(float)), *theta = malloc(n * sizeof(float));
    ErRng r;
    rng_seed(&r, seed);
    double g = 0, dn = 0;
    for (size_t i = 0; i < n; i++) {
        dir[i] = rng_normal(&r);
        dn += (double)dir[i] * dir[i];
    }
    for (size_t i = 0; i < n; i++) {
        dir[i] /= (float)sqrt(dn);
        g += (double)dir[i] * grad[i];
    }
    memcpy(theta, params, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        params[i] = theta[i] + (float)h * dir[i];
    double lp = loss(ctx);
    for (size_t i = 0; i < n; i++)
        params[i] = theta[i] - (float)h * dir[i];
    double lm = loss(ctx);
    memcpy(params, theta, n * sizeof(float));
    *fd = (lp - lm) / (2 * h);
    *gd = g;
    free(dir);
    free(theta);
}

// Index of the entry of g (n) with the largest magnitude: where a single-entry check is most telling.
static inline size_t fd_argmax_abs(const float *g, size_t n) {
    size_t best = 0;
    for (size_t j = 1; j < n; j++)
        if (fabsf(g[j]) > fabsf(g[best]))
            best = j;
    return best;
}

// Central difference of loss(ctx) in the one parameter *w with step h; *w is restored.
static inline double fd_entry(float *w, float h, double (*loss)(void *ctx), void *ctx) {
    float w0 = *w;
    *w = w0 + h;
    double a = loss(ctx);
    *w = w0 - h;
    double b = loss(ctx);
    *w = w0;
    return (a - b) / (2.0 * h);
}

// The gradient m->grad_mem (filled by a backward at the current parameters) against central differences
// of loss(ctx) with step 1e-2: first the directional derivative along a random direction over all the
// parameters at once (seeded), then every parameter tensor at its largest-gradient entry, one at a time.
// grad names the gradient under test in failure messages ("analytic", "STE").
static inline void fd_check_model(Model *m, uint64_t seed, double (*loss)(void *ctx), void *ctx, const char *grad) {
    double fd, gd;
    fd_directional(m->param_mem, m->grad_mem, m->n_param_floats, seed, 1e-2, loss, ctx, &fd, &gd);
    cr_assert(fabs(gd) > 1e-2, "directional derivative is trivially small (%g)", gd);
    cr_assert(fabs(fd - gd) <= 2e-3 * fabs(gd), "directional derivative: fd %.7g vs %s %.7g", fd, grad, gd);
    for (int p = 0; p < m->n_params; p++) {
        ParamTensor *pt = &m->params[p];
        size_t best = fd_argmax_abs(pt->grad, pt->numel);
        double fde = fd_entry(&pt->data[best], 1e-2f, loss, ctx), an = pt->grad[best];
        cr_assert(fabs(fde - an) <= 1e-2 * fabs(an) + 2e-5, "%s[%zu]: fd %.7g vs %s %.7g", pt->name, best, fde, grad, an);
    }
}

#endif
