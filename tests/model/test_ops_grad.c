// Finite-difference checks, in double, of every op's backward. The _f64 ops are the very bodies the
// model runs (model/ops_impl.h compiled for double), so this checks the code, not a copy of it.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "model/ops.h"

static ErRng rng;

// Test buffers are tracked and released after each test, so ASan's leak check stays quiet.
static void *tracked[64];
static int n_tracked;
static void *talloc(size_t bytes) {
    cr_assert(n_tracked < 64);
    return tracked[n_tracked++] = calloc(1, bytes);
}
static void free_tracked(void) {
    while (n_tracked > 0)
        free(tracked[--n_tracked]);
}
TestSuite(ops_grad, .fini = free_tracked);

static double *randv(size_t n, double scale) {
    double *v = talloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        v[i] = scale * rng_normal(&rng);
    return v;
}

static double dot(const double *a, const double *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

// Checks analytic[i] against (L(x + h e_i) - L(x - h e_i)) / 2h for every i, where eval(x) = L.
typedef double (*LossFn)(double *x, void *ctx);
static void check_grad(const char *what, double *x, const double *analytic, size_t n, LossFn eval, void *ctx) {
    const double h = 1e-6;
    double max_err = 0, max_ref = 0;
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + h;
        double lp = eval(x, ctx);
        x[i] = x0 - h;
        double lm = eval(x, ctx);
        x[i] = x0;
        double fd = (lp - lm) / (2 * h);
        double err = fabs(fd - analytic[i]);
        if (err > max_err)
            max_err = err;
        if (fabs(fd) > max_ref)
            max_ref = fabs(fd);
    }
    cr_assert(max_ref > 1e-3, "%s: gradient is trivially zero", what);
    cr_assert(max_err <= 1e-6 * (1 + max_ref), "%s: max |fd - analytic| = %g (max |grad| %g)", what, max_err, max_ref);
}

// ---- rmsnorm ----
typedef struct { int N, C; double *x, *w, *r; int wrt_w; } NormCtx;
static double norm_loss(double *p, void *vc) {
    NormCtx *c = vc;
    double *out = malloc(sizeof(double) * c->N * c->C), *rstd = malloc(sizeof(double) * c->N);
    rmsnorm_forward_f64(out, rstd, c->wrt_w ? c->x : p, c->wrt_w ? p : c->w, c->N, c->C, 1e-5);
    double L = dot(out, c->r, (size_t)c->N * c->C);
    free(out);
    free(rstd);
    return L;
}
Test(ops_grad, rmsnorm) {
    rng_seed(&rng, 1);
    int N = 3, C = 8;
    NormCtx c = {N, C, randv(N * C, 1), randv(C, 1), randv(N * C, 1), 0};
    double *out = talloc((N * C) * 8), *rstd = talloc((N) * 8), *dx = talloc((N * C) * 8), *dw = talloc((C) * 8);
    rmsnorm_forward_f64(out, rstd, c.x, c.w, N, C, 1e-5);
    rmsnorm_backward_f64(dx, dw, c.r, c.x, c.w, rstd, N, C);
    check_grad("rmsnorm dx", c.x, dx, N * C, norm_loss, &c);
    c.wrt_w = 1;
    check_grad("rmsnorm dw", c.w, dw, C, norm_loss, &c);
}

// ---- rope ----
typedef struct { int N, nh, HS; int *pos; double *cs, *sn, *r; } RopeCtx;
static double rope_loss(double *p, void *vc) {
    RopeCtx *c = vc;
    size_t n = (size_t)c->N * c->nh * c->HS;
    double *y = malloc(n * 8);
    memcpy(y, p, n * 8);
    rope_forward_f64(y, c->pos, c->cs, c->sn, c->N, c->nh, c->HS);
    double L = dot(y, c->r, n);
    free(y);
    return L;
}
Test(ops_grad, rope) {
    rng_seed(&rng, 2);
    int N = 4, nh = 3, HS = 8, P = 16, pos[4] = {0, 3, 7, 15};
    double *cs = talloc(P * HS / 2 * 8), *sn = talloc(P * HS / 2 * 8);
    rope_tables_f64(cs, sn, P, HS, 10000.0);
    RopeCtx c = {N, nh, HS, pos, cs, sn, randv(N * nh * HS, 1)};
    double *x = randv(N * nh * HS, 1), *dx = talloc(N * nh * HS * 8);
    memcpy(dx, c.r, N * nh * HS * 8);
    rope_backward_f64(dx, pos, cs, sn, N, nh, HS);
    check_grad("rope dx", x, dx, N * nh * HS, rope_loss, &c);
}

// ---- swiglu ----
typedef struct { int N, F; double *g, *u, *r; int wrt_u; } SwiCtx;
static double swiglu_loss(double *p, void *vc) {
    SwiCtx *c = vc;
    double *y = malloc(sizeof(double) * c->N * c->F);
    swiglu_forward_f64(y, c->wrt_u ? c->g : p, c->wrt_u ? p : c->u, c->N, c->F);
    double L = dot(y, c->r, (size_t)c->N * c->F);
    free(y);
    return L;
}
Test(ops_grad, swiglu) {
    rng_seed(&rng, 3);
    int N = 3, F = 10;
    SwiCtx c = {N, F, randv(N * F, 2), randv(N * F, 1), randv(N * F, 1), 0};
    double *dg = talloc(N * F * 8), *du = talloc(N * F * 8);
    swiglu_backward_f64(dg, du, c.r, c.g, c.u, N, F);
    check_grad("swiglu dgate", c.g, dg, N * F, swiglu_loss, &c);
    c.wrt_u = 1;
    check_grad("swiglu dup", c.u, du, N * F, swiglu_loss, &c);
}

// ---- attention (GQA, causal, with a query offset) ----
typedef struct { int B, T, Tk, NH, NKV, HS; int *qoff; double *q, *k, *v, *r; int wrt; } AttCtx;
static double att_loss(double *p, void *vc) {
    AttCtx *c = vc;
    size_t no = (size_t)c->B * c->T * c->NH * c->HS;
    double *o = malloc(no * 8), *lse = malloc(sizeof(double) * c->B * c->NH * c->T);
    double scores[64]; // one thread's row of Tk scores
    attention_forward_f64(o, lse, c->wrt == 0 ? p : c->q, c->wrt == 1 ? p : c->k, c->wrt == 2 ? p : c->v, c->qoff, c->B,
                          c->T, c->Tk, c->NH, c->NKV, c->HS, scores, 1);
    double L = dot(o, c->r, no);
    free(o);
    free(lse);
    return L;
}
static void attention_case(int B, int T, int Tk, int NH, int NKV, int HS, int *qoff) {
    size_t nq = (size_t)B * T * NH * HS, nk = (size_t)B * Tk * NKV * HS;
    AttCtx c = {B, T, Tk, NH, NKV, HS, qoff, randv(nq, 1), randv(nk, 1), randv(nk, 1), randv(nq, 1), 0};
    double *o = talloc(nq * 8), *lse = talloc(sizeof(double) * B * NH * T);
    double *dq = talloc(nq * 8), *dk = talloc(nk * 8), *dv = talloc(nk * 8);
    double *scores = talloc(sizeof(double) * 2 * Tk); // two threads' rows
    double *dkh = talloc(sizeof(double) * B * NH * Tk * HS), *dvh = talloc(sizeof(double) * B * NH * Tk * HS);
    cr_assert_eq(attention_forward_f64(o, lse, c.q, c.k, c.v, qoff, B, T, Tk, NH, NKV, HS, scores, 2), 0);
    cr_assert_eq(attention_backward_f64(dq, dk, dv, c.r, o, lse, c.q, c.k, c.v, qoff, B, T, Tk, NH, NKV, HS, dkh, dvh), 0);
    check_grad("attention dq", c.q, dq, nq, att_loss, &c);
    c.wrt = 1;
    check_grad("attention dk", c.k, dk, nk, att_loss, &c);
    c.wrt = 2;
    check_grad("attention dv", c.v, dv, nk, att_loss, &c);
}
Test(ops_grad, attention_gqa) {
    rng_seed(&rng, 4);
    attention_case(2, 5, 5, 4, 2, 4, NULL);
}
Test(ops_grad, attention_offset_queries) {
    rng_seed(&rng, 5);
    int qoff[2] = {3, 1}; // queries after cached keys: 3 new positions over 6 keys
    attention_case(2, 3, 6, 2, 1, 4, qoff);
}

// The forward's causal rule against a direct computation: query t sees exactly keys 0..t.
Test(ops_grad, attention_is_causal) {
    rng_seed(&rng, 6);
    int T = 4, HS = 4;
    double *q = randv(T * HS, 1), *k = randv(T * HS, 1), *v = randv(T * HS, 1);
    double o[16], lse[4], scores[4];
    attention_forward_f64(o, lse, q, k, v, NULL, 1, T, T, 1, 1, HS, scores, 1);
    for (int t = 0; t < T; t++) {
        double w[4], mx = -1e300, sum = 0;
        for (int s = 0; s <= t; s++) {
            w[s] = dot(q + t * HS, k + s * HS, HS) / 2.0; // 1/sqrt(4)
            mx = fmax(mx, w[s]);
        }
        for (int s = 0; s <= t; s++)
            sum += (w[s] = exp(w[s] - mx));
        for (int i = 0; i < HS; i++) {
            double ref = 0;
            for (int s = 0; s <= t; s++)
                ref += w[s] / sum * v[s * HS + i];
            cr_assert_float_eq(o[t * HS + i], ref, 1e-12, "t=%d i=%d", t, i);
        }
    }
}

// ---- cross-entropy with a loss mask ----
typedef struct { int N, V; int *tgt; double *mask; } CeCtx;
static double ce_loss(double *p, void *vc) {
    CeCtx *c = vc;
    double *l = malloc(sizeof(double) * c->N * c->V);
    memcpy(l, p, sizeof(double) * c->N * c->V);
    double row_loss[8];
    double L = cross_entropy_forward_backward_f64(l, c->tgt, c->mask, c->N, c->V, 0, 0, row_loss);
    free(l);
    return L;
}
Test(ops_grad, cross_entropy_masked) {
    rng_seed(&rng, 7);
    int N = 4, V = 7, tgt[4] = {1, 6, 0, 3};
    double mask[4] = {1, 0, 1, 0.5};
    CeCtx c = {N, V, tgt, mask};
    double *x = randv(N * V, 2), *g = talloc(N * V * 8);
    memcpy(g, x, N * V * 8);
    double row_loss[4];
    double L = cross_entropy_forward_backward_f64(g, tgt, mask, N, V, 1, 0, row_loss);
    cr_assert_float_eq(L, ce_loss(x, &c), 1e-12);
    check_grad("cross-entropy dlogits", x, g, N * V, ce_loss, &c);
    for (int i = 0; i < V; i++)
        cr_assert_eq(g[1 * V + i], 0.0, "masked row must get no gradient");
}

Test(ops_grad, logprob_matches_cross_entropy) {
    rng_seed(&rng, 8);
    int N = 3, V = 5, tgt[3] = {4, 0, 2};
    double *x = randv(N * V, 1), lp[3];
    logprob_forward_f64(lp, x, tgt, N, V, 1.0);
    double *l = talloc(N * V * 8);
    memcpy(l, x, N * V * 8);
    double row_loss[3];
    double L = cross_entropy_forward_backward_f64(l, tgt, NULL, N, V, 0, 0, row_loss);
    cr_assert_float_eq(-(lp[0] + lp[1] + lp[2]) / 3, L, 1e-12);
}

// The float instantiation (vectorised exp) agrees with the double one.
Test(ops_grad, float_ops_match_double) {
    rng_seed(&rng, 9);
    int N = 4, V = 3000;
    int tgt[4] = {0, 17, 2999, 1500};
    double *x = randv((size_t)N * V, 6);
    x[5] = -200; // far below the exp range
    float *xf = talloc(sizeof(float) * N * V), lpf[4];
    double lpd[4];
    for (int i = 0; i < N * V; i++)
        xf[i] = (float)x[i];
    logprob_forward(lpf, xf, tgt, N, V, 1.0f);
    logprob_forward_f64(lpd, x, tgt, N, V, 1.0);
    for (int n = 0; n < N; n++)
        cr_assert(fabs(lpf[n] - lpd[n]) <= 2e-6 * (1 + fabs(lpd[n])), "logprob %d: %.9g vs %.9g", n, lpf[n], lpd[n]);
    double row_loss[4];
    double lf = cross_entropy_forward_backward(xf, tgt, NULL, N, V, 1, 0, row_loss);
    double ld = cross_entropy_forward_backward_f64(x, tgt, NULL, N, V, 1, 0, row_loss);
    cr_assert(fabs(lf - ld) <= 2e-6 * fabs(ld), "loss %.9g vs %.9g", lf, ld);
    for (int i = 0; i < N * V; i++)
        cr_assert(fabs(xf[i] - x[i]) <= 1e-7 + 1e-5 * fabs(x[i]), "dlogits[%d]: %.9g vs %.9g", i, xf[i], x[i]);
    float g[5] = {-90, -10, 0, 3, 20}, u[5] = {1, 2, 3, 4, 5}, yf[5];
    double gd[5], ud[5], yd[5];
    for (int i = 0; i < 5; i++) {
        gd[i] = g[i];
        ud[i] = u[i];
    }
    swiglu_forward(yf, g, u, 1, 5);
    swiglu_forward_f64(yd, gd, ud, 1, 5);
    for (int i = 0; i < 5; i++)
        cr_assert(fabs(yf[i] - yd[i]) <= 1e-6 * (1e-30 + fabs(yd[i])) + 1e-30, "swiglu %d: %.9g vs %.9g", i, yf[i], yd[i]);
}

// The backward of a weighted sum of tempered token log-probs (the policy-gradient losses).
typedef struct { int N, V; int *tgt; double *coef; double inv_t; } LpCtx;
static double lp_loss(double *p, void *vc) {
    LpCtx *c = vc;
    double lp[4], L = 0;
    logprob_forward_f64(lp, p, c->tgt, c->N, c->V, c->inv_t);
    for (int n = 0; n < c->N; n++)
        L += c->coef[n] * lp[n];
    return L;
}
Test(ops_grad, logprob_backward_tempered) {
    rng_seed(&rng, 10);
    int N = 4, V = 9, tgt[4] = {0, 8, 3, 3};
    double coef[4] = {0.7, -1.3, 0.0, 2.1};
    LpCtx c = {N, V, tgt, coef, 1.0 / 0.8};
    double *x = randv(N * V, 2), *g = talloc(N * V * 8);
    logprob_backward_f64(g, x, tgt, coef, N, V, c.inv_t);
    check_grad("logprob backward (temperature 0.8)", x, g, N * V, lp_loss, &c);
}

// The float exp on non-finite input: NaN stays NaN (it shifted a negative int, undefined behaviour
// that UBSan reports in `make SAN=1 test`), infinities clamp; ordinary values match libm.
Test(ops_grad, expf_on_non_finite_input) {
    volatile float nan = NAN, inf = INFINITY;
    cr_assert(isnan(ops_expf(nan)));
    cr_assert(isnan(ops_expf(-nan)));
    cr_assert(ops_expf(inf) > 1e38f); // +inf or the largest floats, never NaN
    cr_assert(ops_expf(-inf) >= 0 && ops_expf(-inf) < 1e-37f);
    for (float x = -80; x <= 80; x += 7.5f)
        cr_assert_float_eq(ops_expf(x), expf(x), 4e-7f * expf(x), "exp(%g)", x);
}
