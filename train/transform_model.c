// Function-preserving transforms wired into a Model: which weights pair up, in which order, with which
// scales. The math on arrays is in quant/transform.c; the choices are documented in transform_model.h.
#include "train/transform_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/rng.h"
#include "quant/transform.h"

// Trainable matrices are fp32 in the model's own param_mem, so writing through them is legitimate.
static float *mat(const Weight *w) { return (float *)w->data; }

static int in_param_mem(const Model *m, const void *p) {
    const float *f = p;
    return f && f >= m->param_mem && f < m->param_mem + m->n_param_floats;
}

static int check_model(const Model *m, unsigned flags) {
    const ModelConfig *c = &m->cfg;
    if (!m->trainable || !m->param_mem)
        return er_error(ER_EINVAL, "transform: the model is not trainable fp32 (load it with MODEL_LOAD_TRAINABLE)");
    for (int i = 0; i < m->n_params; i++) {
        const ParamTensor *p = &m->params[i];
        if (!in_param_mem(m, p->data))
            return er_error(ER_EINVAL, "transform: parameter \"%s\" is not fp32 in the model's own memory", p->name);
        if (p->w && (p->w->fmt != WF_F32 || p->w->data != p->data))
            return er_error(ER_EINVAL, "transform: matrix \"%s\" has format %s (expected f32)", p->name,
                            weight_format_name(p->w->fmt));
    }
    if (m->lm_head.fmt != WF_F32 || !in_param_mem(m, m->lm_head.data))
        return er_error(ER_EINVAL, "transform: lm_head is not fp32 in the model's own memory");
    if (c->NKV <= 0 || c->NH % c->NKV != 0)
        return er_error(ER_EINVAL, "transform: %d query heads do not split into %d KV groups", c->NH, c->NKV);
    if ((flags & TRANSFORM_K) && c->HS % 2 != 0)
        return er_error(ER_EINVAL, "transform: T_k needs an even head_dim for RoPE pairs (got %d)", c->HS);
    return ER_OK;
}

static int all_ones(const float *g, int n) {
    for (int i = 0; i < n; i++)
        if (g[i] != 1.0f)
            return 0;
    return 1;
}

// The columns of the matrices that read layer w's normalised stream times s1 (q, k, v: after ln1) and s2
// (gate, up: after ln2), or divided by them.
static void scale_readers(const ModelConfig *c, LayerWeights *w, const float *s1, const float *s2, int divide) {
    int C = c->C, qd = c->NH * c->HS, kvd = c->NKV * c->HS;
    transform_scale_cols(mat(&w->wq), qd, C, C, s1, divide);
    transform_scale_cols(mat(&w->wk), kvd, C, C, s1, divide);
    transform_scale_cols(mat(&w->wv), kvd, C, C, s1, divide);
    transform_scale_cols(mat(&w->wgate), c->FF, C, C, s2, divide);
    transform_scale_cols(mat(&w->wup), c->FF, C, C, s2, divide);
}

// RMSNorm scales into the matrices that read the normalised stream; the norms become 1.
static void fold_norms(Model *m) {
    const ModelConfig *c = &m->cfg;
    int C = c->C;
    for (int l = 0; l < c->L; l++) {
        LayerWeights *w = &m->layers[l];
        scale_readers(c, w, w->ln1, w->ln2, 0);
        for (int i = 0; i < C; i++)
            w->ln1[i] = w->ln2[i] = 1.0f;
    }
    if (m->lm_head.data != m->embed.data) // tied models reach here only with a unit final norm
        transform_scale_cols(mat(&m->lm_head), c->V, C, C, m->norm, 0);
    for (int i = 0; i < C; i++)
        m->norm[i] = 1.0f;
}

// x -> x·Q on the residual stream, Q (C, C) orthogonal: embed (and an untied lm_head) and the readers
// W <- W·Q, the writers W <- Qᵀ·W.
static int rotate_residual_by(Model *m, const float *Q) {
    const ModelConfig *c = &m->cfg;
    int C = c->C, qd = c->NH * c->HS, kvd = c->NKV * c->HS;
    ER_TRY(transform_matmul_right(mat(&m->embed), c->V, C, C, Q));
    if (m->lm_head.data != m->embed.data)
        ER_TRY(transform_matmul_right(mat(&m->lm_head), c->V, C, C, Q));
    for (int l = 0; l < c->L; l++) {
        LayerWeights *w = &m->layers[l];
        ER_TRY(transform_matmul_right(mat(&w->wq), qd, C, C, Q));
        ER_TRY(transform_matmul_right(mat(&w->wk), kvd, C, C, Q));
        ER_TRY(transform_matmul_right(mat(&w->wv), kvd, C, C, Q));
        ER_TRY(transform_matmul_right(mat(&w->wgate), c->FF, C, C, Q));
        ER_TRY(transform_matmul_right(mat(&w->wup), c->FF, C, C, Q));
        ER_TRY(transform_matmul_left_t(mat(&w->wo), C, qd, qd, Q));
        ER_TRY(transform_matmul_left_t(mat(&w->wdown), C, c->FF, c->FF, Q));
    }
    return ER_OK;
}

// T_r: the residual stream rotated by a seeded randomized Hadamard matrix.
static int rotate_residual(Model *m, uint64_t seed) {
    int C = m->cfg.C, rc = ER_OK;
    float *Q = er_alloc(sizeof(float) * (size_t)C * C); // (C, C)
    if (!Q)
        return er_error(ER_ENOMEM, "transform: no memory for a %d x %d rotation", C, C);
    ER_CHECK(transform_rotation(Q, C, seed));
    ER_CHECK(rotate_residual_by(m, Q));
done:
    er_free(Q);
    return rc;
}

// Folds the norms (untying a tied model whose final norm is not all ones, as rotate does).
static int fold_for_rotation(Model *m) {
    if (m->cfg.tied && !all_ones(m->norm, m->cfg.C))
        ER_TRY(model_untie(m)); // the final norm can then be folded into lm_head alone
    fold_norms(m);
    return ER_OK;
}

// T_u: up rows *= s, down columns /= s.
static int scale_up_down(Model *m) {
    const ModelConfig *c = &m->cfg;
    int C = c->C, FF = c->FF, rc = ER_OK;
    float *mu = er_alloc(sizeof(float) * FF), *md = er_calloc((size_t)FF, sizeof(float)); // (FF), (FF)
    if (!mu || !md)
        ER_CHECK(ER_ENOMEM);
    for (int l = 0; l < c->L; l++) {
        LayerWeights *w = &m->layers[l];
        transform_row_absmax(mu, mat(&w->wup), FF, C, C);
        memset(md, 0, sizeof(float) * FF);
        transform_col_absmax_acc(md, mat(&w->wdown), C, FF, FF);
        for (int j = 0; j < FF; j++)
            mu[j] = transform_balance_scale(mu[j], md[j], 0.5f); // mu now holds s
        transform_scale_rows(mat(&w->wup), FF, C, C, mu, 0);
        transform_scale_cols(mat(&w->wdown), C, FF, FF, mu, 1);
    }
done:
    er_free(mu);
    er_free(md);
    return rc;
}

// T_v for KV head h of layer w: v_h -> D·Qᵀ·v_h and the group's o columns -> o·Q·D⁻¹, with the
// rotation Q (HS, HS) and mv, mo (HS) as scratch.
static int transform_value_head(const ModelConfig *c, LayerWeights *w, int h, uint64_t seed, float *Q, float *mv,
                                float *mo) {
    int C = c->C, HS = c->HS, qd = c->NH * HS, G = c->NH / c->NKV;
    float *wv = mat(&w->wv) + (size_t)h * HS * C, *bv = w->bv ? w->bv + (size_t)h * HS : NULL;
    ER_TRY(transform_rotation(Q, HS, seed));
    ER_TRY(transform_matmul_left_t(wv, HS, C, C, Q));
    if (bv)
        ER_TRY(transform_matmul_left_t(bv, HS, 1, 1, Q));
    for (int g = 0; g < G; g++)
        ER_TRY(transform_matmul_right(mat(&w->wo) + (size_t)(h * G + g) * HS, C, HS, qd, Q));
    transform_row_absmax(mv, wv, HS, C, C);
    memset(mo, 0, sizeof(float) * HS);
    for (int g = 0; g < G; g++)
        transform_col_absmax_acc(mo, mat(&w->wo) + (size_t)(h * G + g) * HS, C, HS, qd);
    for (int d = 0; d < HS; d++)
        mv[d] = transform_balance_scale(mv[d], mo[d], 0.5f); // mv now holds D
    transform_scale_rows(wv, HS, C, C, mv, 0);
    if (bv)
        transform_scale_rows(bv, HS, 1, 1, mv, 0);
    for (int g = 0; g < G; g++)
        transform_scale_cols(mat(&w->wo) + (size_t)(h * G + g) * HS, C, HS, qd, mv, 1);
    return ER_OK;
}

// T_v: every KV head of every layer, each with its own stream of the seed.
static int transform_values(Model *m, uint64_t seed) {
    const ModelConfig *c = &m->cfg;
    int HS = c->HS, rc = ER_OK;
    float *Q = er_alloc(sizeof(float) * (size_t)HS * HS); // (HS, HS)
    float *mv = er_alloc(sizeof(float) * HS), *mo = er_alloc(sizeof(float) * HS); // (HS), (HS)
    if (!Q || !mv || !mo)
        ER_CHECK(ER_ENOMEM);
    ErRng base;
    rng_seed(&base, seed);
    for (int l = 0; l < c->L; l++)
        for (int h = 0; h < c->NKV; h++) {
            ErRng r;
            rng_fork(&r, &base, (uint64_t)l * c->NKV + h);
            ER_CHECK(transform_value_head(c, &m->layers[l], h, rng_u64(&r), Q, mv, mo));
        }
done:
    er_free(Q);
    er_free(mv);
    er_free(mo);
    return rc;
}

// T_k: per KV head and RoPE pair, k <- a·R(θ)·k and the group's q <- (1/a)·R(θ)·q.
static void transform_keys(Model *m) {
    const ModelConfig *c = &m->cfg;
    int C = c->C, HS = c->HS, half = HS / 2, G = c->NH / c->NKV;
    for (int l = 0; l < c->L; l++) {
        LayerWeights *w = &m->layers[l];
        float *wk = mat(&w->wk), *wq = mat(&w->wq);
        for (int h = 0; h < c->NKV; h++)
            for (int i = 0; i < half; i++) {
                int k0 = h * HS + i, k1 = k0 + half;
                const float *u = wk + (size_t)k0 * C, *v = wk + (size_t)k1 * C;
                double uu = 0, vv = 0, uv = 0;
                for (int j = 0; j < C; j++) {
                    uu += (double)u[j] * u[j];
                    vv += (double)v[j] * v[j];
                    uv += (double)u[j] * v[j];
                }
                double th = 0.5 * atan2(uu - vv, 2 * uv), cs = cos(th), sn = sin(th);
                transform_rotate_rows(wk, C, C, k0, k1, cs, sn, 1.0);
                if (w->bk)
                    transform_rotate_rows(w->bk, 1, 1, k0, k1, cs, sn, 1.0);
                float mk = fmaxf(transform_absmax(u, C), transform_absmax(v, C)), mq = 0;
                for (int g = 0; g < G; g++) {
                    int q0 = (h * G + g) * HS + i, q1 = q0 + half;
                    transform_rotate_rows(wq, C, C, q0, q1, cs, sn, 1.0);
                    if (w->bq)
                        transform_rotate_rows(w->bq, 1, 1, q0, q1, cs, sn, 1.0);
                    mq = fmaxf(mq, fmaxf(transform_absmax(wq + (size_t)q0 * C, C), transform_absmax(wq + (size_t)q1 * C, C)));
                }
                double a = transform_balance_scale(mk, mq, 0.5f);
                transform_rotate_rows(wk, C, C, k0, k1, 1.0, 0.0, a);
                if (w->bk)
                    transform_rotate_rows(w->bk, 1, 1, k0, k1, 1.0, 0.0, a);
                for (int g = 0; g < G; g++) {
                    int q0 = (h * G + g) * HS + i, q1 = q0 + half;
                    transform_rotate_rows(wq, C, C, q0, q1, 1.0, 0.0, 1.0 / a);
                    if (w->bq)
                        transform_rotate_rows(w->bq, 1, 1, q0, q1, 1.0, 0.0, 1.0 / a);
                }
            }
    }
}

// k distinct indices of [0, n) into idx, seeded.
static void draw_channels(int *idx, int k, int n, ErRng *r) {
    for (int i = 0; i < k; i++) {
        int j, dup;
        do {
            j = (int)rng_below(r, (uint32_t)n);
            dup = 0;
            for (int e = 0; e < i; e++)
                dup |= idx[e] == j;
        } while (dup);
        idx[i] = j;
    }
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

// max_j |g_j| / median_j |g_j| of one norm (C), tmp (C) scratch.
static double norm_ratio(const float *g, int C, float *tmp) {
    for (int i = 0; i < C; i++)
        tmp[i] = fabsf(g[i]);
    qsort(tmp, (size_t)C, sizeof(float), cmp_float);
    return tmp[C / 2] > 0 ? tmp[C - 1] / tmp[C / 2] : INFINITY;
}

// v (C) minus its projections on the n orthonormal columns of V (C, ld), twice (Gram-Schmidt that stays
// orthogonal in double); then normalised. Returns its norm before the normalisation.
static double orthonormalise(double *v, const double *V, int n, int C, int ld) {
    for (int pass = 0; pass < 2; pass++)
        for (int j = 0; j < n; j++) {
            double d = 0;
            for (int i = 0; i < C; i++)
                d += v[i] * V[(size_t)i * ld + j];
            for (int i = 0; i < C; i++)
                v[i] -= d * V[(size_t)i * ld + j];
        }
    double nn = 0;
    for (int i = 0; i < C; i++)
        nn += v[i] * v[i];
    nn = sqrt(nn);
    for (int i = 0; i < C; i++)
        v[i] = nn > 0 ? v[i] / nn : 0;
    return nn;
}

// B (C, C): columns 0..k-1 the top-k eigenvectors of the symmetric S (C, C) (orthogonal iteration,
// ordered by Rayleigh quotient), the rest an orthonormal completion of seeded Gaussian vectors.
// *share = the k eigenvalues' share of the trace. work: 2C doubles.
static int dominant_basis(double *B, const double *S, int C, int k, ErRng *r, double *share, double *work) {
    double *v = work, *y = work + C;
    for (int j = 0; j < k; j++)
        for (int i = 0; i < C; i++)
            B[(size_t)i * C + j] = rng_normal(r);
    for (int it = 0; it < 300; it++) // V <- S·V, re-orthonormalised column by column
        for (int j = 0; j < k; j++) {
            for (int i = 0; i < C; i++) {
                double a = 0;
                for (int e = 0; e < C; e++)
                    a += S[(size_t)i * C + e] * B[(size_t)e * C + j];
                y[i] = a;
            }
            if (!(orthonormalise(y, B, j, C, C) > 0))
                return er_error(ER_EINVAL, "outliers: the residual stream's second moment has rank < %d", k);
            for (int i = 0; i < C; i++)
                B[(size_t)i * C + j] = y[i];
        }
    double trace = 0, top = 0, lam[OUTLIERS_MAX_ALIGNED];
    for (int i = 0; i < C; i++)
        trace += S[(size_t)i * C + i];
    for (int j = 0; j < k; j++) { // Rayleigh quotients, then a selection sort of the columns by them
        double q = 0;
        for (int i = 0; i < C; i++)
            for (int e = 0; e < C; e++)
                q += B[(size_t)i * C + j] * S[(size_t)i * C + e] * B[(size_t)e * C + j];
        lam[j] = q, top += q;
    }
    for (int j = 0; j < k; j++)
        for (int e = j + 1; e < k; e++)
            if (lam[e] > lam[j]) {
                double t = lam[j];
                lam[j] = lam[e], lam[e] = t;
                for (int i = 0; i < C; i++) {
                    t = B[(size_t)i * C + j];
                    B[(size_t)i * C + j] = B[(size_t)i * C + e], B[(size_t)i * C + e] = t;
                }
            }
    for (int j = k; j < C; j++) {
        double nn;
        do {
            for (int i = 0; i < C; i++)
                v[i] = rng_normal(r);
            nn = orthonormalise(v, B, j, C, C);
        } while (!(nn > 1e-6));
        for (int i = 0; i < C; i++)
            B[(size_t)i * C + j] = v[i];
    }
    *share = trace > 0 ? top / trace : 0;
    return ER_OK;
}

// The residual stream rotated so that channel idx[j] carries the j-th dominant direction of S.
static int align_residual(Model *m, const double *S, const int *idx, int k, ErRng *r, double *share) {
    int C = m->cfg.C, rc = ER_OK;
    double *B = er_alloc(sizeof(double) * (size_t)C * C), *work = er_alloc(sizeof(double) * 2 * (size_t)C);
    float *Q = er_alloc(sizeof(float) * (size_t)C * C); // (C, C): column c = the direction new channel c holds
    int *col = er_alloc(sizeof(int) * (size_t)C);       // (C): the column of B that channel c takes
    if (!B || !work || !Q || !col)
        ER_CHECK(er_error(ER_ENOMEM, "outliers: no memory for a %d x %d rotation", C, C));
    ER_CHECK(dominant_basis(B, S, C, k, r, share, work));
    for (int c = 0; c < C; c++)
        col[c] = -1;
    for (int j = 0; j < k; j++)
        col[idx[j]] = j;
    for (int c = 0, next = k; c < C; c++)
        if (col[c] < 0)
            col[c] = next++;
    for (int i = 0; i < C; i++)
        for (int c = 0; c < C; c++)
            Q[(size_t)i * C + c] = (float)B[(size_t)i * C + col[c]];
    ER_CHECK(fold_for_rotation(m));
    ER_CHECK(rotate_residual_by(m, Q));
done:
    er_free(B), er_free(work), er_free(Q), er_free(col);
    return rc;
}

int transform_model_add_outliers(Model *m, const double *S, int channels, float lo, float hi, uint64_t seed,
                                 int *idx, double *share) {
    const ModelConfig *c = &m->cfg;
    ER_TRY(check_model(m, 0));
    int lim = c->C < c->FF ? c->C : c->FF;
    lim = S && lim > OUTLIERS_MAX_ALIGNED ? OUTLIERS_MAX_ALIGNED : lim;
    if (channels < 1 || channels > lim || !(lo >= 1) || !(hi >= lo) || !isfinite(hi))
        return er_error(ER_EINVAL, "outliers: %d channels with factors in [%g, %g] (expected 1..%d channels, "
                        "1 <= lo <= hi)", channels, lo, hi, lim);
    int C = c->C, FF = c->FF, rc = ER_OK;
    int *res = er_alloc(sizeof(int) * channels), *mlp = er_alloc(sizeof(int) * channels);
    float *a = er_alloc(sizeof(float) * C), *b = er_alloc(sizeof(float) * FF); // (C), (FF) per-channel factors
    if (!res || !mlp || !a || !b)
        ER_CHECK(er_error(ER_ENOMEM, "outliers: out of memory"));
    ErRng r;
    rng_seed(&r, seed);
    double span = log((double)hi / lo), sh = 0;
    draw_channels(res, channels, C, &r); // the same residual channels in every layer, as in real models
    if (S)
        ER_CHECK(align_residual(m, S, res, channels, &r, &sh));
    for (int l = 0; l < c->L; l++) {
        LayerWeights *w = &m->layers[l];
        for (int i = 0; i < C; i++)
            a[i] = 1.0f;
        for (int i = 0; i < FF; i++)
            b[i] = 1.0f;
        for (int i = 0; i < channels; i++)
            a[res[i]] = (float)(lo * exp(span * rng_uniform(&r)));
        for (int i = 0; i < C; i++)
            w->ln1[i] *= a[i], w->ln2[i] *= a[i];
        scale_readers(c, w, a, a, 1); // the inverse of a norm fold
        draw_channels(mlp, channels, FF, &r);
        for (int i = 0; i < channels; i++)
            b[mlp[i]] = (float)(lo * exp(span * rng_uniform(&r)));
        transform_scale_rows(mat(&w->wup), FF, C, C, b, 0);
        transform_scale_cols(mat(&w->wdown), C, FF, FF, b, 1);
    }
    if (idx)
        memcpy(idx, res, sizeof(int) * channels);
    if (share)
        *share = sh;
done:
    er_free(res), er_free(mlp), er_free(a), er_free(b);
    return rc;
}

// x (T, C) rows, each divided by its RMS (rstd (T) = 1 / RMS, as the forward computed it), added into the
// (C, C) second moment S (NULL = not wanted) and the diagonal d (C).
static void stream_moment_add(double *S, double *d, const float *x, const float *rstd, int T, int C) {
    for (int t = 0; t < T; t++) {
        const float *r = x + (size_t)t * C;
        double s = rstd[t];
        for (int i = 0; i < C; i++) {
            double xi = r[i] * s;
            d[i] += xi * xi;
            if (S)
                for (int j = 0; j < C; j++)
                    S[(size_t)i * C + j] += xi * (r[j] * s);
        }
    }
}

int transform_stream_moments_add(Model *m, const ModelInput *in, Activations *a, double *S, double *diag,
                                 long *tokens) {
    if (a->mode != ACTS_TRAIN || a->recompute)
        return er_error(ER_EINVAL, "outliers: the stream moments need activations that keep every layer");
    const ModelConfig *c = &m->cfg;
    int C = c->C, N = 2 * c->L + 1, BT = in->B * in->T;
    ER_TRY(model_forward(m, in, a));
    for (int l = 0; l < c->L; l++) {
        const LayerActs *la = &a->layer[l];
        stream_moment_add(S, diag + (size_t)(2 * l) * C, la->res, la->rstd1, BT, C);
        stream_moment_add(S, diag + (size_t)(2 * l + 1) * C, la->res2, la->rstd2, BT, C);
    }
    stream_moment_add(S, diag + (size_t)(N - 1) * C, a->resf, a->rstdf, BT, C);
    *tokens += BT;
    return ER_OK;
}

void transform_stream_moments_mean(const ModelConfig *c, double *S, double *diag, long tokens) {
    int C = c->C, N = 2 * c->L + 1;
    double t = tokens > 0 ? (double)tokens : 1.0;
    if (S)
        for (size_t i = 0; i < (size_t)C * C; i++)
            S[i] /= t * N;
    for (size_t i = 0; i < (size_t)N * C; i++)
        diag[i] /= t;
}

int transform_stream_ratio(const Model *m, const double *diag, double *ratio) {
    const ModelConfig *c = &m->cfg;
    int C = c->C;
    float *v = er_alloc(sizeof(float) * C), *tmp = er_alloc(sizeof(float) * C);
    if (!v || !tmp) {
        er_free(v), er_free(tmp);
        return er_error(ER_ENOMEM, "outliers: out of memory");
    }
    *ratio = 0;
    for (int n = 0; n < 2 * c->L; n++) {
        const float *g = n % 2 == 0 ? m->layers[n / 2].ln1 : m->layers[n / 2].ln2;
        for (int i = 0; i < C; i++)
            v[i] = (float)(fabs(g[i]) * sqrt(diag[(size_t)n * C + i]));
        *ratio = fmax(*ratio, norm_ratio(v, C, tmp));
    }
    er_free(v), er_free(tmp);
    return ER_OK;
}

int transform_model_apply(Model *m, unsigned flags, uint64_t seed) {
    if (flags & ~(unsigned)(TRANSFORM_ALL | TRANSFORM_TRAINED))
        return er_error(ER_EINVAL, "transform: unknown flags 0x%x", flags);
    flags &= TRANSFORM_ALL; // the closed-form transforms; training them is train/fpt.h's
    if (m->cfg.arch == ARCH_QWEN3 && (flags & TRANSFORM_K)) { // q/k norms between the projections and RoPE
        if ((flags & TRANSFORM_ALL) != TRANSFORM_ALL)
            return er_error(ER_EUNSUPPORTED, "transform: T_k is not function-preserving on qwen3 (its q_norm / "
                            "k_norm sit between q/k and RoPE); fpt applies the others there");
        flags &= ~(unsigned)TRANSFORM_K;
    }
    if (!flags)
        return ER_OK;
    ER_TRY(check_model(m, flags));
    // Each transform draws from its own stream of the seed.
    ErRng base, r_rot, r_v;
    rng_seed(&base, seed);
    rng_fork(&r_rot, &base, 0);
    rng_fork(&r_v, &base, 1);
    if (flags & TRANSFORM_ROTATE) {
        ER_TRY(fold_for_rotation(m));
        ER_TRY(rotate_residual(m, rng_u64(&r_rot)));
    }
    if (flags & TRANSFORM_UP)
        ER_TRY(scale_up_down(m));
    if (flags & TRANSFORM_V)
        ER_TRY(transform_values(m, rng_u64(&r_v)));
    if (flags & TRANSFORM_K)
        transform_keys(m);
    return ER_OK;
}

int transform_model(Model *m, const char *mode, uint64_t seed) {
    unsigned flags;
    ER_TRY(transform_parse_mode(mode, &flags));
    return transform_model_apply(m, flags, seed);
}
