// Trained FPTQuant transforms: parametrisation, its backward, the two losses and the training run
// (see train/fpt.h).
#include "train/fpt.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/gemm.h"
#include "core/progress.h"
#include "quant/quant.h"
#include "quant/transform.h"
#include "train/checkpoint.h"
#include "train/optim.h"
#include "train/qat.h"
#include "train/run.h"

static size_t off_of(const Model *m, const void *p) { return (size_t)((const float *)p - m->param_mem); }

// ---- parameters ----

static int all_ones(const float *g, int n) {
    for (int i = 0; i < n; i++)
        if (g[i] != 1.0f)
            return 0;
    return 1;
}

int fpt_params_init(FptParams *p, const Model *m) {
    memset(p, 0, sizeof *p);
    const ModelConfig *c = &m->cfg;
    if (!m->trainable || !m->param_mem)
        return er_error(ER_EINVAL, "fpt: the model is not trainable fp32");
    if (c->HS % 2 != 0 || c->NKV <= 0 || c->NH % c->NKV != 0)
        return er_error(ER_EINVAL, "fpt: needs an even head_dim and query heads in whole KV groups (HS %d, %d/%d heads)",
                        c->HS, c->NH, c->NKV);
    // T_r is exact only on a stream whose norms carry no scale (the closed-form rotate folded them).
    int ones = all_ones(m->norm, c->C);
    for (int l = 0; l < c->L; l++)
        ones = ones && all_ones(m->layers[l].ln1, c->C) && all_ones(m->layers[l].ln2, c->C);
    if (!ones)
        return er_error(ER_EINVAL, "fpt: the RMSNorm scales are not folded (apply the closed-form rotate first)");
    p->C = c->C, p->FF = c->FF, p->HS = c->HS, p->NKV = c->NKV, p->NH = c->NH, p->L = c->L;
    p->keys = c->arch != ARCH_QWEN3;
    p->layer_n = (size_t)c->FF + (size_t)c->NKV * c->HS * c->HS + (size_t)c->NKV * c->HS;
    p->n = (size_t)c->C * c->C + (size_t)c->L * p->layer_n;
    if (!(p->theta = er_calloc(p->n, sizeof(float))))
        return er_error(ER_ENOMEM, "fpt: no memory for %zu transform parameters", p->n);
    for (int l = 0; l < c->L; l++) {
        float *M = p->theta + (size_t)c->C * c->C + l * p->layer_n + c->FF;
        for (int h = 0; h < c->NKV; h++)
            for (int d = 0; d < c->HS; d++)
                M[((size_t)h * c->HS + d) * c->HS + d] = 1.0f;
    }
    return ER_OK;
}

void fpt_params_free(FptParams *p) {
    er_free(p->theta);
    memset(p, 0, sizeof *p);
}

// Layer l's parameters.
typedef struct {
    const float *u, *M, *ka, *kt; // (FF), (NKV, HS, HS), (NKV, HS/2), (NKV, HS/2)
} LayerTheta;

static LayerTheta layer_theta(const FptParams *p, const float *theta, int l) {
    const float *t = theta + (size_t)p->C * p->C + l * p->layer_n;
    LayerTheta r = {t, t + p->FF, t + p->FF + (size_t)p->NKV * p->HS * p->HS, NULL};
    r.kt = r.ka + (size_t)p->NKV * p->HS / 2;
    return r;
}

// inv (n, n) = a⁻¹ (Gauss-Jordan, partial pivoting, in double); work (n, n) is destroyed.
static int mat_inverse(double *inv, double *work, const double *a, int n) {
    memcpy(work, a, sizeof(double) * (size_t)n * n);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            inv[(size_t)i * n + j] = i == j;
    for (int col = 0; col < n; col++) {
        int piv = col;
        for (int r = col + 1; r < n; r++)
            if (fabs(work[(size_t)r * n + col]) > fabs(work[(size_t)piv * n + col]))
                piv = r;
        double d = work[(size_t)piv * n + col];
        if (!(fabs(d) > 1e-12))
            return er_error(ER_EINVAL, "fpt: a transform matrix became singular");
        for (int j = 0; j < n; j++) {
            double t = work[(size_t)col * n + j];
            work[(size_t)col * n + j] = work[(size_t)piv * n + j], work[(size_t)piv * n + j] = t;
            t = inv[(size_t)col * n + j];
            inv[(size_t)col * n + j] = inv[(size_t)piv * n + j], inv[(size_t)piv * n + j] = t;
        }
        for (int j = 0; j < n; j++)
            work[(size_t)col * n + j] /= d, inv[(size_t)col * n + j] /= d;
        for (int r = 0; r < n; r++) {
            double f = work[(size_t)r * n + col];
            if (r == col || f == 0)
                continue;
            for (int j = 0; j < n; j++)
                work[(size_t)r * n + j] -= f * work[(size_t)col * n + j], inv[(size_t)r * n + j] -= f * inv[(size_t)col * n + j];
        }
    }
    return ER_OK;
}

// Scratch of the rotation: Q (C, C) float; inv = (I - A)⁻¹, Qd = Q, work (C, C) double.
typedef struct {
    float *Q;
    double *inv, *Qd, *work;
} Cayley;

static void cayley_free(Cayley *k) {
    er_free(k->Q), er_free(k->inv), er_free(k->Qd), er_free(k->work);
    memset(k, 0, sizeof *k);
}

// Q = (I - A)⁻¹ (I + A), A = P - Pᵀ.
static int cayley_forward(Cayley *k, const float *P, int C) {
    size_t n = (size_t)C * C;
    if (!k->Q && (!(k->Q = er_alloc(sizeof(float) * n)) || !(k->inv = er_alloc(sizeof(double) * n)) ||
                  !(k->Qd = er_alloc(sizeof(double) * n)) || !(k->work = er_alloc(sizeof(double) * n))))
        return er_error(ER_ENOMEM, "fpt: no memory for a %d x %d rotation", C, C);
    for (int i = 0; i < C; i++) // Qd <- I - A for the inverse
        for (int j = 0; j < C; j++)
            k->Qd[(size_t)i * C + j] = (i == j) - ((double)P[(size_t)i * C + j] - P[(size_t)j * C + i]);
    ER_TRY(mat_inverse(k->inv, k->work, k->Qd, C));
    for (int i = 0; i < C; i++) // Q = inv + inv·A = inv·(I + A) = 2·inv - inv·(I - A) = 2·inv - I
        for (int j = 0; j < C; j++) {
            k->Qd[(size_t)i * C + j] = 2.0 * k->inv[(size_t)i * C + j] - (i == j);
            k->Q[(size_t)i * C + j] = (float)k->Qd[(size_t)i * C + j];
        }
    return ER_OK;
}

// dP (C, C) from GQ = dL/dQ: dQ = (I - A)⁻¹ dA (Q + I), so dL/dA = (I - A)⁻ᵀ GQ (Q + I)ᵀ and dP = GA - GAᵀ.
static void cayley_backward(Cayley *k, const double *GQ, int C, float *dP) {
    double *T = k->work; // (C, C): GQ (Q + I)ᵀ
    for (int i = 0; i < C; i++)
        for (int j = 0; j < C; j++) {
            double s = GQ[(size_t)i * C + j];
            for (int e = 0; e < C; e++)
                s += GQ[(size_t)i * C + e] * k->Qd[(size_t)j * C + e];
            T[(size_t)i * C + j] = s;
        }
    for (int i = 0; i < C; i++)
        for (int j = i; j < C; j++) {
            double gij = 0, gji = 0; // GA[i][j], GA[j][i] with GA = invᵀ T
            for (int e = 0; e < C; e++) {
                gij += k->inv[(size_t)e * C + i] * T[(size_t)e * C + j];
                gji += k->inv[(size_t)e * C + j] * T[(size_t)e * C + i];
            }
            dP[(size_t)i * C + j] += (float)(gij - gji);
            if (j != i)
                dP[(size_t)j * C + i] += (float)(gji - gij);
        }
}

// ---- W'(θ) ----

// M⁻¹ of one T_v matrix as float (HS, HS); work (3 HS²) doubles.
static int value_inverse(const float *M, int HS, float *Minv, double *work) {
    double *a = work, *inv = work + (size_t)HS * HS, *w = inv + (size_t)HS * HS;
    for (size_t i = 0; i < (size_t)HS * HS; i++)
        a[i] = M[i];
    ER_TRY(mat_inverse(inv, w, a, HS));
    for (size_t i = 0; i < (size_t)HS * HS; i++)
        Minv[i] = (float)inv[i];
    return ER_OK;
}

// The inner transforms (T_u, T_v, T_k) of layer l from base into x (both in param_mem's layout, x
// already a copy of base). s: FF + HS² floats, work: 3 HS² doubles.
static int apply_layer_inner(const FptParams *p, const Model *m, int l, const float *base, float *x, float *s,
                             double *work) {
    const LayerWeights *w = &m->layers[l];
    LayerTheta t = layer_theta(p, p->theta, l);
    int C = p->C, FF = p->FF, HS = p->HS, half = HS / 2, G = p->NH / p->NKV, qd = p->NH * HS;
    for (int j = 0; j < FF; j++)
        s[j] = expf(t.u[j]);
    transform_scale_rows(x + off_of(m, w->wup.data), FF, C, C, s, 0);
    transform_scale_cols(x + off_of(m, w->wdown.data), C, FF, FF, s, 1);
    float *Minv = s + FF;
    for (int h = 0; h < p->NKV; h++) {
        const float *M = t.M + (size_t)h * HS * HS;
        ER_TRY(value_inverse(M, HS, Minv, work));
        size_t ov = off_of(m, w->wv.data) + (size_t)h * HS * C;
        gemm_f32(0, 0, HS, C, HS, 1.0f, M, HS, base + ov, C, 0.0f, x + ov, C);
        if (w->bv) {
            size_t ob = off_of(m, w->bv) + (size_t)h * HS;
            for (int d = 0; d < HS; d++) {
                double acc = 0;
                for (int e = 0; e < HS; e++)
                    acc += (double)M[(size_t)d * HS + e] * base[ob + e];
                x[ob + d] = (float)acc;
            }
        }
        for (int g = 0; g < G; g++) {
            size_t oo = off_of(m, w->wo.data) + (size_t)(h * G + g) * HS;
            gemm_f32(0, 0, C, HS, HS, 1.0f, base + oo, qd, Minv, HS, 0.0f, x + oo, qd);
        }
    }
    for (int h = 0; h < p->NKV * p->keys; h++) // T_k (none on Qwen3)
        for (int i = 0; i < half; i++) {
            double a = exp(t.ka[h * half + i]), th = t.kt[h * half + i], cs = cos(th), sn = sin(th);
            int k0 = h * HS + i, k1 = k0 + half;
            transform_rotate_rows(x + off_of(m, w->wk.data), C, C, k0, k1, cs, sn, a);
            if (w->bk)
                transform_rotate_rows(x + off_of(m, w->bk), 1, 1, k0, k1, cs, sn, a);
            for (int g = 0; g < G; g++) {
                int q0 = (h * G + g) * HS + i, q1 = q0 + half;
                transform_rotate_rows(x + off_of(m, w->wq.data), C, C, q0, q1, cs, sn, 1.0 / a);
                if (w->bq)
                    transform_rotate_rows(x + off_of(m, w->bq), 1, 1, q0, q1, cs, sn, 1.0 / a);
            }
        }
    return ER_OK;
}

static int apply_inner(const FptParams *p, const Model *m, const float *base, float *x) {
    int rc = ER_OK;
    float *s = er_alloc(sizeof(float) * ((size_t)p->FF + (size_t)p->HS * p->HS));
    double *work = er_alloc(sizeof(double) * 3 * (size_t)p->HS * p->HS);
    if (!s || !work)
        ER_CHECK(er_error(ER_ENOMEM, "fpt: out of memory"));
    memcpy(x, base, sizeof(float) * m->n_param_floats);
    for (int l = 0; l < p->L; l++)
        ER_CHECK(apply_layer_inner(p, m, l, base, x, s, work));
done:
    er_free(s);
    er_free(work);
    return rc;
}

// The matrices T_r touches: offset, rows, cols, and whether it writes the stream (W <- Qᵀ·W) or reads it.
typedef struct {
    size_t off;
    int rows, cols, writer;
} RotMat;

// layers_only: the layers' matrices alone (the local stage: its objective reads nothing else, and embed /
// lm_head are V x C, the largest products of a step at a real vocabulary).
static int rot_mats(const Model *m, RotMat *r, int layers_only) {
    const ModelConfig *c = &m->cfg;
    int n = 0, qd = c->NH * c->HS, kvd = c->NKV * c->HS;
    if (!layers_only) {
        r[n++] = (RotMat){off_of(m, m->embed.data), c->V, c->C, 0};
        if (m->lm_head.data != m->embed.data)
            r[n++] = (RotMat){off_of(m, m->lm_head.data), c->V, c->C, 0};
    }
    for (int l = 0; l < c->L; l++) {
        const LayerWeights *w = &m->layers[l];
        r[n++] = (RotMat){off_of(m, w->wq.data), qd, c->C, 0};
        r[n++] = (RotMat){off_of(m, w->wk.data), kvd, c->C, 0};
        r[n++] = (RotMat){off_of(m, w->wv.data), kvd, c->C, 0};
        r[n++] = (RotMat){off_of(m, w->wgate.data), c->FF, c->C, 0};
        r[n++] = (RotMat){off_of(m, w->wup.data), c->FF, c->C, 0};
        r[n++] = (RotMat){off_of(m, w->wo.data), c->C, qd, 1};
        r[n++] = (RotMat){off_of(m, w->wdown.data), c->C, c->FF, 1};
    }
    return n;
}

static int params_apply(const FptParams *p, const Model *m, const float *base, float *out, int layers_only) {
    Cayley k = {0};
    RotMat *r = er_alloc(sizeof(RotMat) * (2 + 7 * (size_t)p->L));
    int rc = ER_OK;
    if (!r)
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(apply_inner(p, m, base, out));
    ER_CHECK(cayley_forward(&k, p->theta, p->C));
    int n = rot_mats(m, r, layers_only);
    for (int i = 0; i < n; i++) {
        float *W = out + r[i].off;
        if (r[i].writer)
            ER_CHECK(transform_matmul_left_t(W, r[i].rows, r[i].cols, r[i].cols, k.Q));
        else
            ER_CHECK(transform_matmul_right(W, r[i].rows, r[i].cols, r[i].cols, k.Q));
    }
done:
    er_free(r);
    cayley_free(&k);
    return rc;
}

// ---- d loss / dθ ----

static double dot_rows(const float *a, const float *b, int n) {
    double s = 0;
    for (int i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

// T_v of KV head h: dM = (G_v X_vᵀ + g_b x_bᵀ - Σ_g X_oᵀ G_o) M⁻ᵀ, with X the inner-transformed weights
// and G their gradients (o: the query group's column blocks). B: HS² doubles; Minv (HS, HS).
static void value_grad(const FptParams *p, const Model *m, const LayerWeights *w, int h, const float *x,
                       const float *gx, const float *Minv, double *B, float *dM) {
    int C = p->C, HS = p->HS, G = p->NH / p->NKV, qd = p->NH * HS;
    const float *xv = x + off_of(m, w->wv.data) + (size_t)h * HS * C, *gv = gx + off_of(m, w->wv.data) + (size_t)h * HS * C;
    for (int d = 0; d < HS; d++)
        for (int e = 0; e < HS; e++)
            B[d * HS + e] = dot_rows(gv + (size_t)d * C, xv + (size_t)e * C, C);
    if (w->bv) {
        const float *xb = x + off_of(m, w->bv) + (size_t)h * HS, *gb = gx + off_of(m, w->bv) + (size_t)h * HS;
        for (int d = 0; d < HS; d++)
            for (int e = 0; e < HS; e++)
                B[d * HS + e] += (double)gb[d] * xb[e];
    }
    for (int g = 0; g < G; g++) {
        const float *xo = x + off_of(m, w->wo.data) + (size_t)(h * G + g) * HS;
        const float *go = gx + off_of(m, w->wo.data) + (size_t)(h * G + g) * HS;
        for (int c = 0; c < C; c++)
            for (int d = 0; d < HS; d++)
                for (int e = 0; e < HS; e++)
                    B[d * HS + e] -= (double)xo[(size_t)c * qd + d] * go[(size_t)c * qd + e];
    }
    for (int d = 0; d < HS; d++)
        for (int e = 0; e < HS; e++) {
            double s = 0;
            for (int f = 0; f < HS; f++)
                s += B[d * HS + f] * Minv[(size_t)e * HS + f];
            dM[(size_t)d * HS + e] += (float)s;
        }
}

// d/dα and d/dθ of one pair of rows r0, r1 (cols wide) after x' = a·R(θ)·x: <G, x'> and <G, J x'> with
// J x' = [-x1'; x0'] (R(θ)'s derivative is R(θ)·J and J commutes with R).
static void pair_grad(const float *x, const float *g, int cols, int r0, int r1, double *da, double *dt) {
    const float *x0 = x + (size_t)r0 * cols, *x1 = x + (size_t)r1 * cols, *g0 = g + (size_t)r0 * cols,
                *g1 = g + (size_t)r1 * cols;
    *da = dot_rows(g0, x0, cols) + dot_rows(g1, x1, cols);
    *dt = dot_rows(g1, x0, cols) - dot_rows(g0, x1, cols);
}

static int inner_grad(const FptParams *p, const Model *m, const float *x, const float *gx, float *dtheta) {
    int C = p->C, FF = p->FF, HS = p->HS, half = HS / 2, G = p->NH / p->NKV, rc = ER_OK;
    float *Minv = er_alloc(sizeof(float) * (size_t)HS * HS);
    double *work = er_alloc(sizeof(double) * 3 * (size_t)HS * HS);
    if (!Minv || !work)
        ER_CHECK(er_error(ER_ENOMEM, "fpt: out of memory"));
    for (int l = 0; l < p->L; l++) {
        const LayerWeights *w = &m->layers[l];
        LayerTheta t = layer_theta(p, p->theta, l), d = layer_theta(p, dtheta, l);
        float *du = (float *)d.u, *dM = (float *)d.M, *dka = (float *)d.ka, *dkt = (float *)d.kt;
        const float *xu = x + off_of(m, w->wup.data), *gu = gx + off_of(m, w->wup.data);
        const float *xd = x + off_of(m, w->wdown.data), *gd = gx + off_of(m, w->wdown.data);
        for (int j = 0; j < FF; j++) {
            double s = dot_rows(gu + (size_t)j * C, xu + (size_t)j * C, C);
            for (int i = 0; i < C; i++)
                s -= (double)gd[(size_t)i * FF + j] * xd[(size_t)i * FF + j];
            du[j] += (float)s;
        }
        for (int h = 0; h < p->NKV; h++) {
            ER_CHECK(value_inverse(t.M + (size_t)h * HS * HS, HS, Minv, work));
            value_grad(p, m, w, h, x, gx, Minv, work, dM + (size_t)h * HS * HS);
        }
        for (int h = 0; h < p->NKV * p->keys; h++) // without T_k its α and θ keep a zero gradient (the identity)
            for (int i = 0; i < half; i++) {
                int k0 = h * HS + i, k1 = k0 + half;
                double da, dt, sa = 0, st = 0;
                pair_grad(x + off_of(m, w->wk.data), gx + off_of(m, w->wk.data), C, k0, k1, &da, &dt);
                sa += da, st += dt;
                if (w->bk)
                    pair_grad(x + off_of(m, w->bk), gx + off_of(m, w->bk), 1, k0, k1, &da, &dt), sa += da, st += dt;
                for (int g = 0; g < G; g++) { // q pairs scale by e^-α
                    int q0 = (h * G + g) * HS + i, q1 = q0 + half;
                    pair_grad(x + off_of(m, w->wq.data), gx + off_of(m, w->wq.data), C, q0, q1, &da, &dt);
                    sa -= da, st += dt;
                    if (w->bq)
                        pair_grad(x + off_of(m, w->bq), gx + off_of(m, w->bq), 1, q0, q1, &da, &dt), sa -= da, st += dt;
                }
                dka[h * half + i] += (float)sa;
                dkt[h * half + i] += (float)st;
            }
    }
done:
    er_free(Minv);
    er_free(work);
    return rc;
}

static int params_backward(const FptParams *p, const Model *m, const float *base, const float *grad, const float *gq,
                           float *x, float *gx, float *dtheta, int layers_only) {
    int C = p->C, rc = ER_OK;
    Cayley k = {0};
    RotMat *r = er_alloc(sizeof(RotMat) * (2 + 7 * (size_t)p->L));
    float *Qt = er_alloc(sizeof(float) * (size_t)C * C), *GQf = er_calloc((size_t)C * C, sizeof(float));
    double *GQ = er_alloc(sizeof(double) * (size_t)C * C);
    if (!r || !Qt || !GQf || !GQ)
        ER_CHECK(er_error(ER_ENOMEM, "fpt: out of memory"));
    memset(dtheta, 0, sizeof(float) * p->n);
    ER_CHECK(apply_inner(p, m, base, x));
    ER_CHECK(cayley_forward(&k, p->theta, C));
    for (int i = 0; i < C; i++)
        for (int j = 0; j < C; j++)
            Qt[(size_t)i * C + j] = k.Q[(size_t)j * C + i];
    memcpy(gx, grad, sizeof(float) * m->n_param_floats);
    int n = rot_mats(m, r, layers_only);
    for (int i = 0; i < n; i++) {
        const float *X = x + r[i].off;
        float *GX = gx + r[i].off;
        int R = r[i].rows, K = r[i].cols;
        if (r[i].writer) { // W' = Qᵀ X: dL/dQ += X G'ᵀ, G_X = Q G'
            gemm_f32(0, 1, C, C, K, 1.0f, X, K, GX, K, 1.0f, GQf, C);
            ER_CHECK(transform_matmul_left_t(GX, R, K, K, Qt));
        } else { // W' = X Q: dL/dQ += Xᵀ G', G_X = G' Qᵀ
            gemm_f32(1, 0, C, C, R, 1.0f, X, K, GX, K, 1.0f, GQf, C);
            ER_CHECK(transform_matmul_right(GX, R, K, K, Qt));
        }
    }
    for (size_t i = 0; i < (size_t)C * C; i++)
        GQ[i] = (double)GQf[i] + (gq ? gq[i] : 0.0f);
    cayley_backward(&k, GQ, C, dtheta);
    ER_CHECK(inner_grad(p, m, x, gx, dtheta));
done:
    cayley_free(&k);
    er_free(r);
    er_free(Qt);
    er_free(GQf);
    er_free(GQ);
    return rc;
}

int fpt_params_apply(const FptParams *p, const Model *m, const float *base, float *out) {
    return params_apply(p, m, base, out, 0);
}

int fpt_params_backward(const FptParams *p, const Model *m, const float *base, const float *grad, const float *gq,
                        float *x, float *gx, float *dtheta) {
    return params_backward(p, m, base, grad, gq, x, gx, dtheta, 0);
}

// ---- the local objective ----

static int is_projection(const Model *m, const Weight *w) {
    for (int l = 0; l < m->cfg.L; l++) {
        const LayerWeights *lw = &m->layers[l];
        if (w == &lw->wq || w == &lw->wk || w == &lw->wv || w == &lw->wo || w == &lw->wgate || w == &lw->wup ||
            w == &lw->wdown)
            return 1;
    }
    return 0;
}

// One projection W (R, K) with quantization errors E (R, K) and its inputs' second moment H (K, K): adds
// the sum over its rows of (e_r H e_rᵀ) / (w_r H w_rᵀ), divided by n_rows, to *loss; gw, ge (R, K) +=
// the gradients in W (through the denominators) and E; gh (K, K) += the gradient in H. s0, s1: R K
// floats of scratch. Rows with w_r H w_rᵀ = 0 (dead inputs or a zero row) are left out.
static void output_error(const float *W, const float *E, const float *H, int R, int K, double n_rows, float *gw,
                         float *ge, float *gh, float *s0, float *s1, double *loss) {
    gemm_f32(0, 0, R, K, K, 1.0f, E, K, H, K, 0.0f, s0, K); // E H
    gemm_f32(0, 0, R, K, K, 1.0f, W, K, H, K, 0.0f, s1, K); // W H
    double sum = 0;
    for (int r = 0; r < R; r++) {
        const float *e = E + (size_t)r * K, *w = W + (size_t)r * K;
        float *eh = s0 + (size_t)r * K, *wh = s1 + (size_t)r * K, *gwr = gw + (size_t)r * K, *ger = ge + (size_t)r * K;
        double a = dot_rows(e, eh, K), b = dot_rows(w, wh, K);
        if (!(b > 0)) {
            memset(eh, 0, sizeof(float) * (size_t)K);
            memset(wh, 0, sizeof(float) * (size_t)K);
            continue;
        }
        sum += a / b;
        double fe = 2.0 / (b * n_rows), fw = -2.0 * a / (b * b * n_rows);
        for (int j = 0; j < K; j++) {
            ger[j] += (float)(fe * eh[j]);
            gwr[j] += (float)(fw * wh[j]);
            eh[j] = (float)(e[j] / (b * n_rows)); // the rows of gh's two outer-product sums
            wh[j] = (float)(w[j] * a / (b * b * n_rows));
        }
    }
    gemm_f32(1, 0, K, K, R, 1.0f, s0, K, E, K, 1.0f, gh, K);  // Σ_r e_rᵀ e_r / (b_r n)
    gemm_f32(1, 0, K, K, R, -1.0f, s1, K, W, K, 1.0f, gh, K); // - Σ_r a_r w_rᵀ w_r / (b_r² n)
    *loss += sum / n_rows;
}

// gs (n, n) = g + gᵀ.
static void symmetrize(float *gs, const float *g, int n) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            gs[(size_t)i * n + j] = g[(size_t)i * n + j] + g[(size_t)j * n + i];
}

int fpt_local_objective(const FptParams *p, const Model *m, const float *moments, const float *w, const float *e,
                        float *gw, float *ge, float *gq, float *dtheta, double *loss) {
    const ModelConfig *c = &m->cfg;
    int C = p->C, FF = p->FF, HS = p->HS, qd = p->NH * HS, G = p->NH / p->NKV, rc = ER_OK;
    int D = C > qd ? C : qd;
    D = D > FF ? D : FF;
    size_t per_layer = 2 * (size_t)C * C + (size_t)qd * qd + (size_t)FF * FF, rk = 0;
    double n_rows = 0;
    for (int i = 0; i < m->n_params; i++)
        if (is_projection(m, m->params[i].w)) {
            const Weight *x = m->params[i].w;
            n_rows += x->rows;
            rk = (size_t)x->rows * x->cols > rk ? (size_t)x->rows * x->cols : rk;
        }
    Cayley k = {0};
    float *hp = er_alloc(sizeof(float) * (size_t)D * D), *gh = er_alloc(sizeof(float) * (size_t)D * D);
    float *t0 = er_alloc(sizeof(float) * (size_t)D * D), *t1 = er_alloc(sizeof(float) * (size_t)D * D);
    float *s0 = er_alloc(sizeof(float) * rk), *s1 = er_alloc(sizeof(float) * rk);
    if (!hp || !gh || !t0 || !t1 || !s0 || !s1)
        ER_CHECK(er_error(ER_ENOMEM, "fpt: out of memory for the local objective"));
    ER_CHECK(cayley_forward(&k, p->theta, C));
    *loss = 0;
    memset(gq, 0, sizeof(float) * (size_t)C * C);
    for (int l = 0; l < c->L; l++) {
        const LayerWeights *lw = &m->layers[l];
        const float *h1 = moments + per_layer * l, *ho = h1 + (size_t)C * C, *h2 = ho + (size_t)qd * qd,
                    *hd = h2 + (size_t)C * C;
        LayerTheta th = layer_theta(p, p->theta, l), dth = layer_theta(p, dtheta, l);
        // The readers of the residual stream: their inputs are x' = Qᵀx, H' = QᵀHQ, dL/dQ = HQ(G + Gᵀ).
        const Weight *readers[2][3] = {{&lw->wq, &lw->wk, &lw->wv}, {&lw->wgate, &lw->wup, NULL}};
        const float *hr[2] = {h1, h2};
        for (int s = 0; s < 2; s++) {
            gemm_f32(0, 0, C, C, C, 1.0f, hr[s], C, k.Q, C, 0.0f, t0, C);
            gemm_f32(1, 0, C, C, C, 1.0f, k.Q, C, t0, C, 0.0f, hp, C);
            memset(gh, 0, sizeof(float) * (size_t)C * C);
            for (int i = 0; i < 3 && readers[s][i]; i++) {
                size_t o = off_of(m, readers[s][i]->data);
                output_error(w + o, e + o, hp, readers[s][i]->rows, C, n_rows, gw + o, ge + o, gh, s0, s1, loss);
            }
            symmetrize(t1, gh, C);
            gemm_f32(0, 0, C, C, C, 1.0f, k.Q, C, t1, C, 0.0f, t0, C);
            gemm_f32(0, 0, C, C, C, 1.0f, hr[s], C, t0, C, 1.0f, gq, C);
        }
        // o_proj: the heads' outputs z' = Bz with B = blockdiag(M of each query head's KV head), H' = BHBᵀ,
        // dL/dB = (G + Gᵀ)BH, of which M takes the diagonal blocks of its query group.
        for (int n = 0; n < p->NH; n++) // t0 = B H
            gemm_f32(0, 0, HS, qd, HS, 1.0f, th.M + (size_t)(n / G) * HS * HS, HS, ho + (size_t)n * HS * qd, qd, 0.0f,
                     t0 + (size_t)n * HS * qd, qd);
        for (int n = 0; n < p->NH; n++) // hp = t0 Bᵀ
            gemm_f32(0, 1, qd, HS, HS, 1.0f, t0 + (size_t)n * HS, qd, th.M + (size_t)(n / G) * HS * HS, HS, 0.0f,
                     hp + (size_t)n * HS, qd);
        memset(gh, 0, sizeof(float) * (size_t)qd * qd);
        size_t oo = off_of(m, lw->wo.data);
        output_error(w + oo, e + oo, hp, C, qd, n_rows, gw + oo, ge + oo, gh, s0, s1, loss);
        symmetrize(t1, gh, qd);
        for (int n = 0; n < p->NH; n++)
            gemm_f32(0, 0, HS, HS, qd, 1.0f, t1 + (size_t)n * HS * qd, qd, t0 + (size_t)n * HS, qd, 1.0f,
                     (float *)dth.M + (size_t)(n / G) * HS * HS, HS);
        // down_proj: its inputs scaled by s = e^u, H' = SHS, dL/du_j = s_j Σ_k (G + Gᵀ)_jk H_jk s_k.
        for (int j = 0; j < FF; j++)
            t0[j] = expf(th.u[j]);
        for (int j = 0; j < FF; j++)
            for (int i = 0; i < FF; i++)
                hp[(size_t)j * FF + i] = t0[j] * hd[(size_t)j * FF + i] * t0[i];
        memset(gh, 0, sizeof(float) * (size_t)FF * FF);
        size_t od = off_of(m, lw->wdown.data);
        output_error(w + od, e + od, hp, C, FF, n_rows, gw + od, ge + od, gh, s0, s1, loss);
        for (int j = 0; j < FF; j++) {
            double acc = 0;
            for (int i = 0; i < FF; i++)
                acc += ((double)gh[(size_t)j * FF + i] + gh[(size_t)i * FF + j]) * hd[(size_t)j * FF + i] * t0[i];
            ((float *)dth.u)[j] += (float)(t0[j] * acc);
        }
    }
done:
    cayley_free(&k);
    er_free(hp), er_free(gh), er_free(t0), er_free(t1), er_free(s0), er_free(s1);
    return rc;
}

// ---- the end-to-end loss ----

double fpt_kl_loss(const float *p, const float *logits, float *dlogits, int N, int V) {
    double total = 0;
    for (int n = 0; n < N; n++) {
        const float *pt = p + (size_t)n * V, *l = logits + (size_t)n * V;
        double mx = l[0], z = 0, kl = 0;
        for (int v = 1; v < V; v++)
            mx = l[v] > mx ? l[v] : mx;
        for (int v = 0; v < V; v++)
            z += exp((double)l[v] - mx);
        double lz = mx + log(z);
        for (int v = 0; v < V; v++)
            if (pt[v] > 0)
                kl += pt[v] * (log((double)pt[v]) - ((double)l[v] - lz));
        total += kl;
        if (dlogits) {
            float *d = dlogits + (size_t)n * V;
            for (int v = 0; v < V; v++)
                d[v] = (float)((exp((double)l[v] - lz) - pt[v]) / N);
        }
    }
    return N ? total / N : 0.0;
}

// p (N, V) = softmax of each row of logits.
static void softmax_rows(float *p, const float *logits, int N, int V) {
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * V;
        float *o = p + (size_t)n * V;
        double mx = l[0], z = 0;
        for (int v = 1; v < V; v++)
            mx = l[v] > mx ? l[v] : mx;
        for (int v = 0; v < V; v++)
            z += exp((double)l[v] - mx);
        for (int v = 0; v < V; v++)
            o[v] = (float)(exp((double)l[v] - mx) / z);
    }
}

// ---- the run ----

// A layer projection of the local stage: its quantizer and its last quantization.
typedef struct {
    const ParamTensor *p;
    QuantOptions qo;
    Weight q;
} LocalMat;

typedef struct {
    Model *m;
    const FptTrainConfig *c;
    FptParams p;
    float *base, *master, *gx, *dtheta; // (n_param_floats) x 3, (p.n)
    float *tp;                          // (max_len, V) teacher probabilities
    // the local stage: the base's input moments, the errors Q(W') - W' (n_param_floats), dL/dQ through the
    // moments (C, C), the direct gradient of u and M (p.n), the quantized projections
    float *moments, *err, *gq, *dlocal;
    LocalMat *lm;
    int n_lm;
    AdamW opt;
    TrainState st;
    QatState *qs;
    Activations a;
    Batch b;
    MetricsLog ml;
    char *ckdir;
} FptRun;

static void fpt_run_free(FptRun *r) {
    fpt_params_free(&r->p);
    er_free(r->base), er_free(r->master), er_free(r->gx), er_free(r->dtheta), er_free(r->tp);
    er_free(r->moments), er_free(r->err), er_free(r->gq), er_free(r->dlocal);
    for (int i = 0; i < r->n_lm; i++)
        weight_free(&r->lm[i].q);
    er_free(r->lm);
    adamw_free(&r->opt);
    train_state_free(&r->st);
    qat_state_free(r->qs);
    acts_free(&r->a);
    batch_free(&r->b);
    metrics_close(&r->ml);
    er_free(r->ckdir);
}

// What a resumed run must match: the training settings and the caller's (c->settings).
static cJSON *fpt_config_json(const FptTrainConfig *c) {
    cJSON *j = c->settings ? cJSON_Duplicate(c->settings, 1) : cJSON_CreateObject();
    if (!j)
        return NULL;
    cJSON_AddNumberToObject(j, "fpt_local_steps", (double)c->local_steps);
    cJSON_AddNumberToObject(j, "fpt_steps", (double)c->steps);
    cJSON_AddNumberToObject(j, "fpt_lr", c->lr);
    cJSON_AddNumberToObject(j, "fpt_sequences", c->n_seqs);
    cJSON_AddStringToObject(j, "weights", c->q->weights ? c->q->weights : "");
    return j;
}

// ER_OK when the checkpoint's config equals want, else an error naming the first setting that differs.
static int fpt_config_check(const char *ckdir, const cJSON *want, const cJSON *have) {
    if (!have)
        return er_error(ER_EINVAL, "%s: the checkpoint records no settings; start a new run", ckdir);
    for (const cJSON *w = want->child; w; w = w->next) {
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(have, w->string);
        if (h && cJSON_Compare(w, h, 1))
            continue;
        const cJSON *calib = cJSON_GetObjectItemCaseSensitive(want, "calib");
        if (h && strcmp(w->string, "calib_bytes_fnv1a") == 0 && cJSON_IsString(calib))
            return er_error(ER_EINVAL, "%s: the file changed since the checkpoint in %s was made (bytes:FNV-1a %s "
                            "then, %s now): resume with the data the run started with, or start a new run in another "
                            "--out", calib->valuestring, ckdir, cJSON_IsString(h) ? h->valuestring : "?",
                            cJSON_IsString(w) ? w->valuestring : "?");
        char *ws = cJSON_PrintUnformatted(w), *hs = h ? cJSON_PrintUnformatted(h) : NULL;
        int rc = er_error(ER_EINVAL, "%s: the checkpoint was made with %s = %s, this run has %s; resume with the same "
                          "settings", ckdir, w->string, hs ? hs : "(unset)", ws ? ws : "?");
        cJSON_free(ws), cJSON_free(hs);
        return rc;
    }
    if (cJSON_GetArraySize((cJSON *)have) != cJSON_GetArraySize((cJSON *)want))
        return er_error(ER_EINVAL, "%s: the checkpoint records settings this run does not have; start a new run", ckdir);
    return ER_OK;
}

static int fpt_run_resume(FptRun *r) {
    TrainState st;
    ER_TRY(checkpoint_load(r->ckdir, &st, r->p.theta, r->p.n, &r->opt));
    cJSON *want = fpt_config_json(r->c);
    int rc = want ? fpt_config_check(r->ckdir, want, st.config) : ER_ENOMEM;
    cJSON_Delete(want);
    if (rc < 0) {
        train_state_free(&st);
        return rc;
    }
    train_state_free(&r->st);
    r->st = st;
    return ER_OK;
}

// The local stage's buffers and each quantized projection's quantizer (its input moments: local_moments).
static int local_init(FptRun *r) {
    Model *m = r->m;
    QuantizePlan plan;
    ER_TRY(quantize_plan(m, r->c->q, &plan));
    r->err = er_alloc(sizeof(float) * m->n_param_floats);
    r->gq = er_alloc(sizeof(float) * (size_t)r->p.C * r->p.C);
    r->dlocal = er_alloc(sizeof(float) * r->p.n);
    r->lm = er_calloc((size_t)m->n_params, sizeof(LocalMat));
    if (!r->err || !r->gq || !r->dlocal || !r->lm)
        return er_error(ER_ENOMEM, "fpt: out of memory for the local stage");
    for (int i = 0; i < m->n_params; i++) {
        const ParamTensor *p = &m->params[i];
        QuantOptions qo;
        quantize_plan_options(m, &plan, r->c->q, p, &qo);
        qo.sparse = 0; // as the end-to-end stage's fake quantizer (train/qat.c): the dense codes
        if (is_projection(m, p->w) && weight_is_quantized(qo.fmt))
            r->lm[r->n_lm++] = (LocalMat){.p = p, .qo = qo};
    }
    return ER_OK;
}

// The base model's input moments over every calibration sequence, at the first local step this call runs (a
// run resumed past the local stage needs none).
static int local_moments(FptRun *r) {
    if (r->moments)
        return ER_OK;
    memcpy(r->m->param_mem, r->base, sizeof(float) * r->m->n_param_floats);
    return quantize_input_moments(r->m, r->c->sb, r->c->seqs, 0, r->c->n_seqs, r->c->max_len, &r->moments, NULL);
}

// r->err = Q(w) - w for the quantized projections (0 elsewhere), each one's quantization kept in r->lm.
static int local_errors(FptRun *r, const float *w) {
    const Model *m = r->m;
    memset(r->err, 0, sizeof(float) * m->n_param_floats);
    for (int i = 0; i < r->n_lm; i++) {
        LocalMat *l = &r->lm[i];
        int R = (int)l->p->shape[0], K = (int)l->p->shape[1];
        size_t o = (size_t)(l->p->data - m->param_mem);
        weight_free(&l->q);
        ER_TRY(quantize_matrix(&l->q, w + o, R, K, NULL, &l->qo));
        quant_dequant_rows(r->err + o, &l->q, 0, R);
        for (size_t j = 0; j < (size_t)R * K; j++)
            r->err[o + j] -= w[o + j];
    }
    return ER_OK;
}

// gw += the straight-through gradient of local_errors' errors from their gradient ge.
static void local_errors_backward(FptRun *r, const float *w, const float *ge, float *gw) {
    const Model *m = r->m;
    for (int i = 0; i < r->n_lm; i++) {
        const LocalMat *l = &r->lm[i];
        int R = (int)l->p->shape[0], K = (int)l->p->shape[1];
        size_t o = (size_t)(l->p->data - m->param_mem);
#pragma omp parallel for schedule(static)
        for (int row = 0; row < R; row++)
            quant_ste_error_row(&l->q, &l->qo, row, w + o + (size_t)row * K, ge + o + (size_t)row * K,
                                gw + o + (size_t)row * K);
    }
}

static int fpt_run_init(FptRun *r) {
    Model *m = r->m;
    const FptTrainConfig *c = r->c;
    size_t n = m->n_param_floats;
    ER_TRY(fpt_params_init(&r->p, m));
    r->base = er_alloc(sizeof(float) * n), r->master = er_alloc(sizeof(float) * n), r->gx = er_alloc(sizeof(float) * n);
    r->dtheta = er_alloc(sizeof(float) * r->p.n);
    r->st.order = er_calloc((size_t)c->n_seqs + 1, sizeof(int));
    r->st.batch_start = er_calloc((size_t)c->n_seqs + 2, sizeof(int));
    if (!r->base || !r->master || !r->gx || !r->dtheta || !r->st.order || !r->st.batch_start)
        return er_error(ER_ENOMEM, "fpt: cannot allocate %.1f MiB for the transform training",
                        3.0 * n * 4 / 1048576.0);
    memcpy(r->base, m->param_mem, sizeof(float) * n);
    // One sequence per step, in order: the checkpoint's data order says so.
    r->st.n_order = r->st.n_batches = c->n_seqs;
    for (int i = 0; i < c->n_seqs; i++)
        r->st.order[i] = i;
    for (int i = 0; i <= c->n_seqs; i++)
        r->st.batch_start[i] = i;
    rng_seed(&r->st.rng, 0);
    if (!(r->st.config = fpt_config_json(c)))
        return ER_ENOMEM;
    ER_TRY(adamw_init(&r->opt, backend_cpu(), r->p.n, c->lr, 0.9, 0.999, 1e-8, 0.0));
    if (c->local_steps > 0)
        ER_TRY(local_init(r));
    if (c->steps > 0) {
        ER_TRY(qat_state_init(&r->qs, m, r->master, c->q, NULL, 1));
        ER_TRY(acts_alloc(&r->a, &m->cfg, 1, c->max_len, ACTS_TRAIN, 0));
        ER_TRY(batch_alloc(&r->b, 1, c->max_len));
        if (!(r->tp = er_alloc(sizeof(float) * (size_t)c->max_len * m->cfg.V)))
            return ER_ENOMEM;
    }
    if (c->dir) {
        ER_TRY(dir_make(c->dir));
        if (!(r->ckdir = path_join(c->dir, "checkpoint")))
            return ER_ENOMEM;
        if (c->resume && checkpoint_exists(r->ckdir))
            ER_TRY(fpt_run_resume(r));
        ER_TRY(metrics_open(&r->ml, c->dir, "metrics.jsonl", c->resume, r->st.step));
    }
    return ER_OK;
}

// *kl = KL(teacher || student) on calibration sequence i, the student Q(r->master) (quantized under
// qat_state_apply's key); with grad, m->grad_mem = its gradient (STE: dL/dQ(W') is taken as dL/dW').
static int fpt_seq_kl(FptRun *r, int i, long key, int grad, double *kl) {
    Model *m = r->m;
    int V = m->cfg.V;
    ER_TRY(batch_fill(&r->b, r->c->sb, r->c->seqs, &i, 1));
    ModelInput in = {.B = 1, .T = r->b.T, .tokens = r->b.tokens, .len = r->b.len};
    memcpy(m->param_mem, r->base, sizeof(float) * m->n_param_floats); // the teacher: the float model
    ER_TRY(model_forward(m, &in, &r->a));
    softmax_rows(r->tp, r->a.logits, r->b.T, V);
    ER_TRY(qat_state_apply(r->qs, key)); // the student: Q(W'(θ))
    if (grad)
        model_zero_grad(m);
    ER_TRY(model_forward(m, &in, &r->a));
    *kl = fpt_kl_loss(r->tp, r->a.logits, grad ? r->a.logits : NULL, r->b.T, V);
    return grad ? model_backward(m, &in, &r->a) : ER_OK;
}

// *before / *after = the KL of the end-to-end stage, token-weighted mean over every calibration
// sequence, at θ = identity and at the trained θ: the same data on both sides.
static int fpt_eval_kl(FptRun *r, double *before, double *after) {
    const FptTrainConfig *c = r->c;
    for (int side = 0; side < 2; side++) {
        if (side == 0)
            memcpy(r->master, r->base, sizeof(float) * r->m->n_param_floats);
        else
            ER_TRY(fpt_params_apply(&r->p, r->m, r->base, r->master));
        double sum = 0, kl;
        long tokens = 0;
        for (int i = 0; i < c->n_seqs; i++) {
            // key -1 - side: the quantizer fit to this side's master once, Q(master) rewritten per sequence
            ER_TRY(fpt_seq_kl(r, i, -1 - side, 0, &kl));
            sum += kl * r->b.T, tokens += r->b.T;
        }
        *(side == 0 ? before : after) = tokens ? sum / tokens : NAN;
    }
    return ER_OK;
}

// One optimizer step on θ; *loss is the objective at the θ before the step.
static int fpt_step(FptRun *r, long step, double lr, double *loss, double *gnorm) {
    Model *m = r->m;
    const FptTrainConfig *c = r->c;
    int local = step < c->local_steps; // embed / lm_head stay unrotated: the local objective does not read them
    ER_TRY(params_apply(&r->p, m, r->base, r->master, local));
    if (local) { // r->gx holds dL/d(errors) until params_backward reuses it
        ER_TRY(local_moments(r));
        ER_TRY(local_errors(r, r->master));
        memset(m->grad_mem, 0, sizeof(float) * m->n_param_floats);
        memset(r->gx, 0, sizeof(float) * m->n_param_floats);
        memset(r->dlocal, 0, sizeof(float) * r->p.n);
        ER_TRY(fpt_local_objective(&r->p, m, r->moments, r->master, r->err, m->grad_mem, r->gx, r->gq, r->dlocal,
                                   loss));
        local_errors_backward(r, r->master, r->gx, m->grad_mem);
    } else {
        if (step == c->local_steps) { // a new objective: the moments of the local stage do not carry over
            memset(r->opt.m, 0, sizeof(float) * r->p.n);
            memset(r->opt.v, 0, sizeof(float) * r->p.n);
            r->opt.step = 0;
        }
        ER_TRY(fpt_seq_kl(r, (int)((step - c->local_steps) % c->n_seqs), step, 1, loss));
    }
    ER_TRY(params_backward(&r->p, m, r->base, m->grad_mem, local ? r->gq : NULL, r->master, r->gx, r->dtheta, local));
    for (size_t i = 0; local && i < r->p.n; i++)
        r->dtheta[i] += r->dlocal[i];
    ER_TRY(clip_grad_norm(backend_cpu(), r->dtheta, r->p.n, 1.0, gnorm));
    if (!isfinite(*loss) || !isfinite(*gnorm))
        return er_error(ER_EINVAL, "fpt: the objective is not finite at step %ld (lower --fpt-lr)", step + 1);
    return adamw_step(&r->opt, r->p.theta, r->dtheta, NULL, lr);
}

static double fpt_lr(const FptTrainConfig *c, long step) {
    long s = step < c->local_steps ? step : step - c->local_steps;
    long total = step < c->local_steps ? c->local_steps : c->steps;
    return lr_schedule(s, total / 10, total, c->lr, 0.1 * c->lr);
}

static int fpt_log_step(FptRun *r, long step, double lr, double loss, double gnorm) {
    if (!r->c->dir)
        return ER_OK;
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return ER_ENOMEM;
    cJSON_AddNumberToObject(j, "step", (double)(step + 1));
    cJSON_AddStringToObject(j, "stage", step < r->c->local_steps ? "local" : "e2e");
    RunNumber nums[] = {{"loss", loss}, {"lr", lr}, {"grad_norm", gnorm}};
    run_add_numbers(j, nums, sizeof nums / sizeof nums[0]);
    int rc = metrics_write(&r->ml, j);
    cJSON_Delete(j);
    return rc;
}

int fpt_merge_check(Model *m, const float *base, const float *merged, const int *tokens, int T) {
    int fixed[16], V = m->cfg.V, rc = ER_OK;
    if (!tokens) {
        T = m->cfg.max_pos < 16 ? m->cfg.max_pos : 16;
        for (int t = 0; t < T; t++)
            fixed[t] = (t * 7 + 1) % V;
        tokens = fixed;
    }
    T = T < m->cfg.max_pos ? T : m->cfg.max_pos;
    Activations a = {0};
    float *want = er_alloc(sizeof(float) * (size_t)T * V);
    if (!want)
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(acts_alloc(&a, &m->cfg, 1, T, ACTS_SCORE, 0));
    ModelInput in = {.B = 1, .T = T, .tokens = tokens};
    memcpy(m->param_mem, base, sizeof(float) * m->n_param_floats);
    ER_CHECK(model_forward(m, &in, &a));
    memcpy(want, a.logits, sizeof(float) * (size_t)T * V);
    memcpy(m->param_mem, merged, sizeof(float) * m->n_param_floats);
    ER_CHECK(model_forward(m, &in, &a));
    double dmax = 0, lmax = 0;
    for (size_t i = 0; i < (size_t)T * V; i++) {
        double d = fabs((double)a.logits[i] - want[i]);
        dmax = d > dmax || isnan(d) ? d : dmax;
        lmax = fabs(want[i]) > lmax ? fabs(want[i]) : lmax;
    }
    if (!(dmax <= 1e-4 * lmax))
        ER_CHECK(er_error(ER_EINVAL, "fpt: merging the trained transforms changed the logits by %.3g relative "
                          "(max |dlogit| / max |logit| over %d positions; want <= 1e-4): not function-preserving",
                          lmax > 0 ? dmax / lmax : dmax, T));
done:
    er_free(want);
    acts_free(&a);
    return rc;
}

static int fpt_log_eval(FptRun *r, long steps, double before, double after) {
    if (!r->c->dir)
        return ER_OK;
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return ER_ENOMEM;
    cJSON_AddNumberToObject(j, "step", (double)steps);
    cJSON_AddStringToObject(j, "stage", "eval");
    RunNumber nums[] = {{"kl_before", before}, {"kl_after", after}};
    run_add_numbers(j, nums, sizeof nums / sizeof nums[0]);
    int rc = metrics_write(&r->ml, j);
    cJSON_Delete(j);
    return rc;
}

int fpt_train(Model *m, const FptTrainConfig *c, FptTrainResult *res) {
    FptTrainResult local;
    if (!res)
        res = &local;
    *res = (FptTrainResult){NAN, NAN, NAN, NAN, 0, 0};
    if (c->local_steps < 0 || c->steps < 0 || !(c->lr > 0) || !isfinite(c->lr) || c->save_every < 0)
        return er_error(ER_EINVAL, "fpt: steps must be >= 0 and --fpt-lr > 0 (got %ld, %ld, %g)", c->local_steps,
                        c->steps, c->lr);
    if ((c->local_steps > 0 || c->steps > 0) && (!c->q || !c->sb || !c->seqs || c->n_seqs < 1 || c->max_len < 1))
        return er_error(ER_EINVAL, "fpt: the training needs calibration sequences (--calib)");
    FptRun r = {.m = m, .c = c};
    Progress prog = {0};
    int rc = ER_OK, prog_on = 0;
    ER_CHECK(fpt_run_init(&r));
    long total = c->local_steps + c->steps, start = r.st.step, step = start;
    progress_begin(&prog, c->log, "fpt", "step", start, total);
    prog_on = 1;
    for (; step < total && !(c->stop_after > 0 && step - start >= c->stop_after); step++) {
        double lr = fpt_lr(c, step), loss, gnorm;
        ER_CHECK(fpt_step(&r, step, lr, &loss, &gnorm));
        ER_CHECK(fpt_log_step(&r, step, lr, loss, gnorm));
        if (step < c->local_steps) {
            res->local_first = step == start ? loss : res->local_first;
            res->local_last = loss;
        }
        r.st.step = step + 1;
        if (r.ckdir && c->save_every > 0 && r.st.step % c->save_every == 0 && r.st.step < total)
            ER_CHECK(checkpoint_save(r.ckdir, &r.st, r.p.theta, r.p.n, &r.opt));
        char extra[64];
        snprintf(extra, sizeof extra, "%s %.5f", step < c->local_steps ? "local" : "kl", loss);
        progress_update(&prog, step + 1, extra);
    }
    progress_end(&prog, NULL);
    prog_on = 0;
    if (r.ckdir && step > start)
        ER_CHECK(checkpoint_save(r.ckdir, &r.st, r.p.theta, r.p.n, &r.opt));
    res->steps_done = step;
    res->complete = step >= total;
    if (res->complete && c->steps > 0) {
        ER_CHECK(fpt_eval_kl(&r, &res->kl_before, &res->kl_after));
        ER_CHECK(fpt_log_eval(&r, total, res->kl_before, res->kl_after));
        if (c->log)
            fprintf(c->log, "fpt: KL over the %d calibration sequences %.6f (closed-form) -> %.6f (trained)\n",
                    c->n_seqs, res->kl_before, res->kl_after);
    }
    if (res->complete) { // merge: the float model with W'(θ) in its weights
        ER_CHECK(fpt_params_apply(&r.p, m, r.base, r.master));
        const Sequence *s0 = c->n_seqs > 0 && c->seqs ? &c->seqs[0] : NULL;
        ER_CHECK(fpt_merge_check(m, r.base, r.master, s0 ? s0->tokens : NULL, s0 ? s0->n : 0));
    } else {
        memcpy(m->param_mem, r.base, sizeof(float) * m->n_param_floats);
    }
done:
    if (prog_on)
        progress_end(&prog, "failed");
    fpt_run_free(&r);
    return rc;
}
