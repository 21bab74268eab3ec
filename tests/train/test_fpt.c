// Trained FPTQuant transforms (train/fpt.h): merged at random parameters they preserve the logits; the
// gradient of the transform parameters against finite differences (and of both losses); a tiny run
// lowers both objectives, and a run stopped and resumed equals an uninterrupted one bit for bit;
// the outlier test model (train/transform_model.h) computes the same function; `ertrain quantize
// --transforms fpt-trained` end to end with its bad flags.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/alloc.h"
#include "core/rng.h"
#include "core/threads.h"
#include "tests/common/helpers.h"
#include "train/fpt.h"
#include "train/transform_model.h"

// Qwen2-style: GQA (4 query heads over 2 KV heads), q/k/v biases, non-unit norms (folded by fpt). ARCH_QWEN3:
// the same with per-head q/k norms (non-unit too) and no biases.
static void build_arch(Model *m, int tied, ModelArch arch, uint64_t seed) {
    threads_set(1);
    ModelConfig c = {.arch = arch, .C = 24, .FF = 40, .L = 2, .NH = 4, .NKV = 2, .HS = 8, .V = 29,
                     .max_pos = 64, .rope_theta = 10000.0f, .eps = 1e-6f, .tied = tied, .qkv_bias = arch == ARCH_QWEN2,
                     .dtype = DT_F32, .bos_id = -1, .eos_id = -1};
    cr_assert_eq(model_build_random(m, &c, 0.2f, seed), 0, "%s", er_last_error());
    ErRng r;
    rng_seed(&r, seed + 1);
    for (int i = 0; i < m->n_params; i++) {
        ParamTensor *p = &m->params[i];
        int final_norm = strcmp(p->name, "model.norm.weight") == 0;
        if (strstr(p->name, "norm") && !(tied && final_norm))
            for (size_t j = 0; j < p->numel; j++)
                p->data[j] = 1.0f + 0.3f * rng_normal(&r);
        else if (strstr(p->name, "bias"))
            for (size_t j = 0; j < p->numel; j++)
                p->data[j] = 0.3f * rng_normal(&r);
    }
}

static void build(Model *m, int tied, uint64_t seed) { build_arch(m, tied, ARCH_QWEN2, seed); }

// θ away from the identity: every transform does something.
static void randomize(FptParams *p, uint64_t seed, float scale) {
    ErRng r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < p->n; i++)
        p->theta[i] += scale * 0.3f * rng_normal(&r);
}

enum { TB = 2, TT = 7 };
static const int tokens[TB * TT] = {1, 5, 3, 7, 2, 9, 4, 28, 0, 11, 12, 6, 20, 17};

// On Qwen3 (tied = 2 below) T_k is left out, its α and θ (random here too) ignored: the q/k norms sit between
// the projections and RoPE.
Test(fpt, merged_transforms_preserve_the_logits) {
    for (int tied = 0; tied <= 2; tied++) {
        Model m;
        build_arch(&m, tied > 0, tied == 2 ? ARCH_QWEN3 : ARCH_QWEN2, 11 + tied);
        float *before = helper_forward_logits(&m, tokens, TB, TT);
        cr_assert_eq(transform_model(&m, "fpt-trained", 5), 0, "%s", er_last_error());
        FptParams p;
        cr_assert_eq(fpt_params_init(&p, &m), 0, "%s", er_last_error());
        randomize(&p, 7, 1.0f);
        float *base = malloc(sizeof(float) * m.n_param_floats);
        memcpy(base, m.param_mem, sizeof(float) * m.n_param_floats);
        cr_assert_eq(fpt_params_apply(&p, &m, base, m.param_mem), 0, "%s", er_last_error());
        float *after = helper_forward_logits(&m, tokens, TB, TT);
        double rel = helper_rel_err(after, before, (size_t)TB * TT * m.cfg.V), moved = 0;
        for (size_t i = 0; i < m.n_param_floats; i++)
            moved = fmax(moved, fabs((double)m.param_mem[i] - base[i]));
        fprintf(stderr, "fpt: %s tied=%d merged trained transforms: max |dlogit| / max |logit| = %.3g (weights moved "
                "%.3g)\n", model_arch_name(m.cfg.arch), m.cfg.tied, rel, moved);
        cr_assert(rel <= 1e-5, "%s tied=%d: logits moved by %g relative", model_arch_name(m.cfg.arch), m.cfg.tied, rel);
        cr_assert(moved > 0.05, "the random transforms left the weights as they were (%g)", moved);
        free(before), free(after), free(base);
        fpt_params_free(&p);
        model_free(&m);
    }
}

Test(fpt, unfolded_norms_are_refused) {
    Model m;
    build(&m, 0, 3);
    FptParams p;
    cr_assert_lt(fpt_params_init(&p, &m), 0);
    cr_assert(strstr(er_last_error(), "not folded"), "%s", er_last_error());
    fpt_params_free(&p);
    model_free(&m);
}

// A smooth test loss of the merged weights: Σ c_i w_i + ½ Σ d_i w_i², in double.
typedef struct {
    Model *m;
    FptParams *p;
    const float *base;
    float *w;
    double *c, *d;
} Quad;

static double quad_loss(void *ctx) {
    Quad *q = ctx;
    cr_assert_eq(fpt_params_apply(q->p, q->m, q->base, q->w), 0, "%s", er_last_error());
    double s = 0;
    for (size_t i = 0; i < q->m->n_param_floats; i++)
        s += q->c[i] * q->w[i] + 0.5 * q->d[i] * q->w[i] * q->w[i];
    return s;
}

// θ entries of every block (P, then per layer u, M, α, θ) against central finite differences of `loss`:
// |fd - analytic| within 2% of max(|fd|, floor).
static void check_theta_gradients(FptParams *p, const float *dtheta, double (*loss)(void *), void *ctx, double floor,
                                  const char *what) {
    size_t C2 = (size_t)p->C * p->C, L1 = C2 + p->layer_n, u = 0, M = p->FF, a = M + (size_t)p->NKV * p->HS * p->HS,
           t = a + (size_t)p->NKV * p->HS / 2;
    size_t idx[] = {1, 2 * p->C + 5, C2 - 2, C2 + u + 3, C2 + M + 1, C2 + M + 9, L1 + M + 30, L1 + a + 2, C2 + t + 1,
                    L1 + t + 7, L1 + u + 17};
    for (size_t k = 0; k < sizeof idx / sizeof idx[0]; k++) {
        size_t i = idx[k];
        float keep = p->theta[i];
        double h = 1e-3;
        p->theta[i] = keep + (float)h;
        double lp = loss(ctx);
        p->theta[i] = keep - (float)h;
        double lm = loss(ctx);
        p->theta[i] = keep;
        double fd = (lp - lm) / (2 * h);
        fprintf(stderr, "%s: dθ[%zu] analytic %+.6f finite differences %+.6f\n", what, i, dtheta[i], fd);
        cr_assert(fabs(fd - dtheta[i]) <= 2e-2 * fmax(fabs(fd), floor), "%s θ[%zu]: analytic %g, finite differences %g",
                  what, i, dtheta[i], fd);
    }
}

Test(fpt, parameter_gradients_match_finite_differences) {
    Model m;
    build(&m, 1, 21);
    cr_assert_eq(transform_model(&m, "fpt", 2), 0, "%s", er_last_error());
    FptParams p;
    cr_assert_eq(fpt_params_init(&p, &m), 0);
    randomize(&p, 9, 0.5f);
    size_t n = m.n_param_floats;
    Quad q = {&m, &p, m.param_mem, malloc(sizeof(float) * n), malloc(sizeof(double) * n), malloc(sizeof(double) * n)};
    float *g = malloc(sizeof(float) * n), *s0 = malloc(sizeof(float) * n), *s1 = malloc(sizeof(float) * n);
    float *dtheta = malloc(sizeof(float) * p.n);
    ErRng r;
    rng_seed(&r, 4);
    for (size_t i = 0; i < n; i++)
        q.c[i] = rng_normal(&r), q.d[i] = 1.0 + rng_uniform(&r);
    quad_loss(&q);
    for (size_t i = 0; i < n; i++)
        g[i] = (float)(q.c[i] + q.d[i] * q.w[i]);
    cr_assert_eq(fpt_params_backward(&p, &m, q.base, g, NULL, s0, s1, dtheta), 0, "%s", er_last_error());
    check_theta_gradients(&p, dtheta, quad_loss, &q, 0.5, "fpt");
    free(q.w), free(q.c), free(q.d), free(g), free(s0), free(s1), free(dtheta);
    fpt_params_free(&p);
    model_free(&m);
}

// The local objective at W'(θ) with the errors held (random, as an input): its loss against θ (through the
// weights, fpt_params_backward, and through the transformed moments: the rotation's gq, u's and M's
// direct terms) and against the errors, by finite differences. Moments: random positive definite blocks.
typedef struct {
    Model *m;
    FptParams *p;
    const float *base, *moments, *e;
    float *w, *gw, *ge, *gq, *dt;
} Local;

static double local_loss(void *ctx) {
    Local *q = ctx;
    size_t n = q->m->n_param_floats;
    cr_assert_eq(fpt_params_apply(q->p, q->m, q->base, q->w), 0, "%s", er_last_error());
    memset(q->gw, 0, sizeof(float) * n), memset(q->ge, 0, sizeof(float) * n);
    memset(q->dt, 0, sizeof(float) * q->p->n);
    double loss;
    cr_assert_eq(fpt_local_objective(q->p, q->m, q->moments, q->w, q->e, q->gw, q->ge, q->gq, q->dt, &loss), 0, "%s",
                 er_last_error());
    return loss;
}

static float *random_moments(const Model *m, uint64_t seed) {
    const ModelConfig *c = &m->cfg;
    int qd = c->NH * c->HS, dims[4] = {c->C, qd, c->C, c->FF};
    size_t per_layer = 2 * (size_t)c->C * c->C + (size_t)qd * qd + (size_t)c->FF * c->FF;
    float *h = calloc(per_layer * c->L, sizeof(float)), *at = h;
    ErRng r;
    rng_seed(&r, seed);
    for (int l = 0; l < c->L; l++)
        for (int k = 0; k < 4; k++) {
            int n = dims[k], N = n + 3; // H = AᵀA over N rows, one input channel 4x the rest (an outlier)
            float *a = malloc(sizeof(float) * (size_t)N * n);
            for (int i = 0; i < N * n; i++)
                a[i] = rng_normal(&r) * (i % n == 1 ? 4.0f : 1.0f);
            for (int i = 0; i < n; i++)
                for (int j = 0; j < n; j++) {
                    double acc = 0;
                    for (int t = 0; t < N; t++)
                        acc += (double)a[t * n + i] * a[t * n + j];
                    at[(size_t)i * n + j] = (float)acc;
                }
            free(a);
            at += (size_t)n * n;
        }
    return h;
}

Test(fpt, local_objective_gradients_match_finite_differences) {
    Model m;
    build(&m, 0, 5);
    cr_assert_eq(transform_model(&m, "fpt", 2), 0, "%s", er_last_error());
    FptParams p;
    cr_assert_eq(fpt_params_init(&p, &m), 0);
    randomize(&p, 13, 0.5f);
    size_t n = m.n_param_floats;
    float *e = malloc(sizeof(float) * n), *s0 = malloc(sizeof(float) * n), *s1 = malloc(sizeof(float) * n);
    float *dtheta = malloc(sizeof(float) * p.n);
    ErRng r;
    rng_seed(&r, 6);
    for (size_t i = 0; i < n; i++)
        e[i] = 0.02f * rng_normal(&r);
    Local q = {&m, &p, m.param_mem, random_moments(&m, 17), e, malloc(sizeof(float) * n), malloc(sizeof(float) * n),
               malloc(sizeof(float) * n), malloc(sizeof(float) * (size_t)p.C * p.C), malloc(sizeof(float) * p.n)};
    double l0 = local_loss(&q);
    cr_assert(l0 > 0 && isfinite(l0), "local objective %g", l0);
    cr_assert_eq(fpt_params_backward(&p, &m, q.base, q.gw, q.gq, s0, s1, dtheta), 0, "%s", er_last_error());
    for (size_t i = 0; i < p.n; i++)
        dtheta[i] += q.dt[i];
    float *ge = malloc(sizeof(float) * n);
    memcpy(ge, q.ge, sizeof(float) * n);
    check_theta_gradients(&p, dtheta, local_loss, &q, 0.02 * fabs(l0), "fpt local");
    const char *names[] = {"model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.o_proj.weight",
                           "model.layers.1.mlp.down_proj.weight"};
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 3; j++) {
            size_t i = (size_t)(model_find_param(&m, names[k])->data - m.param_mem) + 37 * j + 4;
            float keep = e[i];
            double h = 1e-3;
            e[i] = keep + (float)h;
            double lp = local_loss(&q);
            e[i] = keep - (float)h;
            double lm = local_loss(&q);
            e[i] = keep;
            double fd = (lp - lm) / (2 * h);
            cr_assert(fabs(fd - ge[i]) <= 1e-2 * fmax(fabs(fd), 1e-3 * l0), "d/de[%zu]: %g vs fd %g", i, ge[i], fd);
        }
    free(e), free(s0), free(s1), free(dtheta), free(ge);
    free((void *)q.moments), free(q.w), free(q.gw), free(q.ge), free(q.gq), free(q.dt);
    fpt_params_free(&p);
    model_free(&m);
}

Test(fpt, kl_gradients_match_finite_differences) {
    // KL(p || softmax(z)) against its logits.
    enum { N = 3, V = 7 };
    float pt[N * V], z[N * V], dz[N * V];
    ErRng r;
    rng_seed(&r, 8);
    for (int i = 0; i < N * V; i++)
        pt[i] = 2 * rng_normal(&r), z[i] = rng_normal(&r);
    for (int row = 0; row < N; row++) { // p: a softmax, with one exact zero
        double sum = 0;
        for (int v = 0; v < V; v++)
            sum += (pt[row * V + v] = v == 2 ? 0.0f : expf(pt[row * V + v]));
        for (int v = 0; v < V; v++)
            pt[row * V + v] /= (float)sum;
    }
    double kl = fpt_kl_loss(pt, z, dz, N, V);
    cr_assert(kl > 0, "KL %g", kl);
    for (int i = 0; i < N * V; i += 4) {
        float keep = z[i];
        double h = 1e-2;
        z[i] = keep + (float)h;
        double lp = fpt_kl_loss(pt, z, NULL, N, V);
        z[i] = keep - (float)h;
        double lm = fpt_kl_loss(pt, z, NULL, N, V);
        z[i] = keep;
        double fd = (lp - lm) / (2 * h);
        cr_assert(fabs(fd - dz[i]) <= 1e-3 * fmax(fabs(fd), 1e-2), "KL d/dz[%d]: %g vs fd %g", i, dz[i], fd);
    }
}

// ---- the training run ----

enum { NSEQ = 3, SEQN = 9 }; // several sequences: the data order cycles, and resume must continue it

typedef struct {
    Model m;
    SeqBuilder sb;
    Sequence seqs[NSEQ];
    int toks[NSEQ][SEQN];
    QuantizeOptions q;
    FptTrainConfig c;
} Run;

static void run_init(Run *r, const char *dir, long stop_after, int resume) {
    memset(r, 0, sizeof *r);
    build(&r->m, 1, 31);
    cr_assert_eq(transform_model(&r->m, "fpt", 1), 0, "%s", er_last_error());
    r->sb = (SeqBuilder){.loss_all = 1, .no_mask = 1, .seq_len = SEQN};
    for (int s = 0; s < NSEQ; s++) {
        for (int t = 0; t < SEQN; t++)
            r->toks[s][t] = (s * 7 + t * 5 + 1) % r->m.cfg.V;
        r->seqs[s] = (Sequence){.tokens = r->toks[s], .n = SEQN};
    }
    r->q = (QuantizeOptions){.weights = "q8", .embeddings = "int8"};
    r->c = (FptTrainConfig){.local_steps = 6, .steps = 10, .lr = 3e-3, .q = &r->q, .sb = &r->sb, .seqs = r->seqs,
                            .n_seqs = NSEQ, .max_len = SEQN - 1, .dir = dir, .save_every = 4, .resume = resume,
                            .stop_after = stop_after};
}

static char *read_all(const char *dir, const char *name) {
    char *p = path_join(dir, name);
    FILE *f = fopen(p, "rb");
    cr_assert(f, "%s", p);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    er_free(p);
    char *s = malloc(n + 1);
    memcpy(s, buf, n + 1);
    return s;
}

Test(fpt_run, lowers_both_objectives_and_resume_is_bit_for_bit, .timeout = 120) {
    char *tmp = helper_tmpdir("er_fpt_"), *a = path_join(tmp, "a"), *b = path_join(tmp, "b");
    Run ra, rb;
    FptTrainResult res;
    run_init(&ra, a, 0, 0);
    cr_assert_eq(fpt_train(&ra.m, &ra.c, &res), 0, "%s", er_last_error());
    fprintf(stderr, "fpt run: local %.5f -> %.5f, KL %.6f -> %.6f\n", res.local_first, res.local_last, res.kl_before,
            res.kl_after);
    cr_assert(res.complete && res.steps_done == 16);
    cr_assert(res.local_last < res.local_first, "local objective %g -> %g", res.local_first, res.local_last);
    cr_assert(res.kl_after < res.kl_before, "KL %g -> %g", res.kl_before, res.kl_after);
    // Stopped after 3 steps, then after 5 more (across the stage boundary), then to the end.
    long stops[] = {3, 5, 0};
    for (int i = 0; i < 3; i++) {
        run_init(&rb, b, stops[i], i > 0);
        cr_assert_eq(fpt_train(&rb.m, &rb.c, &res), 0, "%s", er_last_error());
        cr_assert_eq(res.complete, i == 2);
        if (i < 2)
            model_free(&rb.m);
    }
    cr_assert_eq(memcmp(ra.m.param_mem, rb.m.param_mem, sizeof(float) * ra.m.n_param_floats), 0,
                 "the resumed run's merged weights differ from the uninterrupted run's");
    char *ma = read_all(a, "metrics.jsonl"), *mb = read_all(b, "metrics.jsonl");
    cr_assert_eq(helper_count_lines(ma), 17); // 16 steps and the before/after evaluation
    cr_assert_str_eq(ma, mb, "metrics differ:\n%s\nvs\n%s", ma, mb);
    // A different configuration is refused on resume.
    Run rc;
    run_init(&rc, b, 0, 1);
    rc.c.lr = 2e-2;
    cr_assert_lt(fpt_train(&rc.m, &rc.c, &res), 0);
    cr_assert(strstr(er_last_error(), "fpt_lr = 0.003"), "%s", er_last_error());
    model_free(&rc.m);
    // ... and so is one the caller's settings (calibration file, seed, ...) differ in.
    run_init(&rc, b, 0, 1);
    cJSON *other = cJSON_Parse("{\"seed\": 2}");
    rc.c.settings = other;
    cr_assert_lt(fpt_train(&rc.m, &rc.c, &res), 0);
    cr_assert(strstr(er_last_error(), "seed = (unset)"), "%s", er_last_error());
    cJSON_Delete(other);
    free(ma), free(mb);
    model_free(&ra.m), model_free(&rb.m), model_free(&rc.m);
    helper_rmdir(tmp);
    er_free(a), er_free(b), er_free(tmp);
}

// The merge check: the same weights pass; 64 down_proj weights scaled by 1.5 fail it.
Test(fpt, merge_check_refuses_changed_logits) {
    Model m;
    build(&m, 1, 43);
    size_t n = m.n_param_floats;
    float *base = malloc(sizeof(float) * n), *merged = malloc(sizeof(float) * n);
    memcpy(base, m.param_mem, sizeof(float) * n);
    memcpy(merged, base, sizeof(float) * n);
    cr_assert_eq(fpt_merge_check(&m, base, merged, NULL, 0), 0, "%s", er_last_error());
    float *w = merged + (model_find_param(&m, "model.layers.1.mlp.down_proj.weight")->data - m.param_mem);
    for (int i = 0; i < 64; i++)
        w[i] *= 1.5f;
    cr_assert_lt(fpt_merge_check(&m, base, merged, NULL, 0), 0);
    cr_assert(strstr(er_last_error(), "not function-preserving"), "%s", er_last_error());
    free(base), free(merged);
    model_free(&m);
}

// ---- the outlier test model ----

// Stream moments of m over the test tokens: S (C, C) pooled, diag (2L + 1, C); caller frees both.
static void moments(Model *m, double **S, double **diag) {
    int C = m->cfg.C, N = 2 * m->cfg.L + 1;
    *S = calloc((size_t)C * C, sizeof(double)), *diag = calloc((size_t)N * C, sizeof(double));
    Activations a = {0};
    cr_assert_eq(acts_alloc(&a, &m->cfg, TB, TT, ACTS_TRAIN, 0), 0, "%s", er_last_error());
    ModelInput in = {.B = TB, .T = TT, .tokens = tokens};
    long n = 0;
    cr_assert_eq(transform_stream_moments_add(m, &in, &a, *S, *diag, &n), 0, "%s", er_last_error());
    transform_stream_moments_mean(&m->cfg, *S, *diag, n);
    cr_assert_eq(n, TB * TT);
    acts_free(&a);
}

Test(fpt, outlier_model_computes_the_same_function) {
    for (int variant = 0; variant < 3; variant++) { // untied; tied with a scaled final norm (untied); no data
        Model m;
        build(&m, variant == 1, 41 + variant);
        if (variant == 1)
            for (int i = 0; i < m.cfg.C; i++)
                m.norm[i] = 1.0f + 0.05f * (float)(i % 5);
        float *before = helper_forward_logits(&m, tokens, TB, TT);
        double *S, *diag, share = -1, r0, r1;
        moments(&m, &S, &diag);
        cr_assert_eq(transform_stream_ratio(&m, diag, &r0), 0);
        int idx[2];
        cr_assert_eq(transform_model_add_outliers(&m, variant < 2 ? S : NULL, 2, 4, 20, 9, idx, &share), 0, "%s",
                     er_last_error());
        float *after = helper_forward_logits(&m, tokens, TB, TT);
        double rel = helper_rel_err(after, before, (size_t)TB * TT * m.cfg.V);
        double *S1, *diag1;
        moments(&m, &S1, &diag1);
        cr_assert_eq(transform_stream_ratio(&m, diag1, &r1), 0);
        fprintf(stderr, "outliers (variant %d): max |dlogit| / max |logit| = %.3g, dominant share %.3f, loudest "
                "normalised channel %.1fx the median (%.1fx before)\n", variant, rel, share, r1, r0);
        cr_assert(rel <= 1e-5, "the outlier model changed the logits by %g relative", rel);
        cr_assert(r1 >= 4 && r1 > r0, "the loudest channel is %gx the median (%gx before)", r1, r0);
        if (variant < 2) {
            // the pooled second moment in the new basis is QᵀSQ: channel idx[0] holds the top eigenvalue,
            // which no other channel's Rayleigh quotient exceeds
            int C = m.cfg.C;
            for (int c = 0; c < C; c++)
                cr_assert(S1[(size_t)c * C + c] <= S1[(size_t)idx[0] * C + idx[0]] * (1 + 1e-4),
                          "channel %d (%g) louder than the dominant channel %d (%g)", c, S1[(size_t)c * C + c],
                          idx[0], S1[(size_t)idx[0] * C + idx[0]]);
            cr_assert(share > 0 && share <= 1, "share %g", share);
            cr_assert(variant == 0 || !m.cfg.tied, "a tied model with a scaled final norm is untied");
        } else {
            cr_assert_eq(share, 0);
        }
        cr_assert_lt(transform_model_add_outliers(&m, NULL, 0, 20, 100, 9, NULL, NULL), 0);
        cr_assert_lt(transform_model_add_outliers(&m, NULL, 2, 50, 20, 9, NULL, NULL), 0);
        free(before), free(after), free(S), free(diag), free(S1), free(diag1);
        model_free(&m);
    }
}
