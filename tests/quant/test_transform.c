// Function-preserving transforms: the rotations are orthogonal, each transform leaves a random tiny
// model's logits unchanged (to fp32 rounding), the transformed model saves and reloads, and the
// rotation does what it is for (flattens outlier columns).
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/rng.h"
#include "core/threads.h"
#include "model/model.h"
#include "quant/transform.h"
#include "tests/common/helpers.h"
#include "train/transform_model.h"

// ---- rotations ----

Test(quant_transform, hadamard_matrices_are_hadamard) {
    // Sylvester, Paley I (12, 20, 24, 44), Paley II (28 = 2·14, 36), and products (48, 96, 112).
    int sizes[] = {1, 2, 4, 8, 12, 20, 24, 28, 36, 44, 48, 64, 76, 96, 112, 140};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        int n = sizes[s];
        cr_assert(transform_hadamard_exists(n), "order %d", n);
        float *H = malloc(sizeof(float) * n * n);
        cr_assert_eq(transform_hadamard(H, n), 0, "%s", er_last_error());
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) {
                cr_assert(H[i * n + j] == 1.0f || H[i * n + j] == -1.0f);
                double d = 0;
                for (int k = 0; k < n; k++)
                    d += (double)H[k * n + i] * H[k * n + j];
                cr_assert_eq(d, i == j ? n : 0, "order %d: column %d . column %d = %g", n, i, j, d);
            }
        free(H);
    }
    // Orders that are not 1, 2 or a multiple of 4 have no Hadamard matrix.
    cr_assert_not(transform_hadamard_exists(6));
    cr_assert_not(transform_hadamard_exists(14));
    float H[36];
    cr_assert_eq(transform_hadamard(H, 6), ER_EUNSUPPORTED);
}

Test(quant_transform, rotations_are_orthogonal) {
    // Hadamard-based (48, 96, 896 = 32·28) and the Kronecker fallback (6, 14, 86 = 2·43, 7, 3).
    int sizes[] = {1, 3, 6, 7, 14, 48, 86, 96, 896};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        int n = sizes[s];
        float *Q = malloc(sizeof(float) * n * n), *Q2 = malloc(sizeof(float) * n * n);
        cr_assert_eq(transform_rotation(Q, n, 1234), 0, "%s", er_last_error());
        double err = transform_orthogonality_error(Q, n);
        cr_assert(err < 1e-5, "order %d: max |QᵀQ - I| = %g", n, err);
        // Seeded: the same seed gives the same matrix, another seed another one.
        cr_assert_eq(transform_rotation(Q2, n, 1234), 0);
        cr_assert_eq(memcmp(Q, Q2, sizeof(float) * n * n), 0, "order %d is not reproducible", n);
        if (n > 1) {
            cr_assert_eq(transform_rotation(Q2, n, 99), 0);
            cr_assert_neq(memcmp(Q, Q2, sizeof(float) * n * n), 0, "order %d ignores the seed", n);
        }
        if (transform_hadamard_exists(n)) // every entry ±1/√n: outliers spread over all channels
            for (int i = 0; i < n * n; i++)
                cr_assert_float_eq(fabsf(Q[i]), 1.0f / sqrtf((float)n), 1e-6);
        free(Q);
        free(Q2);
    }
    ErRng r;
    rng_seed(&r, 5);
    float R[25];
    cr_assert_eq(transform_random_orthogonal(R, 5, &r), 0);
    cr_assert(transform_orthogonality_error(R, 5) < 1e-6);
    cr_assert_eq(transform_rotation(R, 0, 1), ER_EINVAL);
}

Test(quant_transform, products_with_strided_blocks) {
    // W·Q and Qᵀ·W on a column block of a wider matrix leave the other columns alone.
    enum { R = 5, N = 6, LD = 9 };
    float W[R * LD], W0[R * LD], Q[N * N];
    ErRng r;
    rng_seed(&r, 3);
    for (int i = 0; i < R * LD; i++)
        W[i] = W0[i] = rng_normal(&r);
    cr_assert_eq(transform_rotation(Q, N, 8), 0);
    cr_assert_eq(transform_matmul_right(W + 2, R, N, LD, Q), 0);
    for (int i = 0; i < R; i++)
        for (int j = 0; j < LD; j++) {
            double want = W0[i * LD + j];
            if (j >= 2 && j < 2 + N) {
                want = 0;
                for (int k = 0; k < N; k++)
                    want += (double)W0[i * LD + 2 + k] * Q[k * N + (j - 2)];
            }
            cr_assert_float_eq(W[i * LD + j], want, 1e-5, "W·Q [%d,%d]", i, j);
        }
    float X[N * 3], X0[N * 3];
    for (int i = 0; i < N * 3; i++)
        X[i] = X0[i] = rng_normal(&r);
    cr_assert_eq(transform_matmul_left_t(X, N, 3, 3, Q), 0);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < 3; j++) {
            double want = 0;
            for (int k = 0; k < N; k++)
                want += (double)Q[k * N + i] * X0[k * 3 + j];
            cr_assert_float_eq(X[i * 3 + j], want, 1e-5, "QᵀW [%d,%d]", i, j);
        }
}

// What T_r is for: a matrix whose inputs carry a few outlier channels has them spread out.
Test(quant_transform, rotation_flattens_outlier_columns) {
    enum { R = 64, N = 96 };
    float *W = malloc(sizeof(float) * R * N), *Q = malloc(sizeof(float) * N * N);
    ErRng r;
    rng_seed(&r, 17);
    for (int i = 0; i < R * N; i++)
        W[i] = rng_normal(&r);
    for (int i = 0; i < R; i++) {
        W[i * N + 5] *= 30.0f;
        W[i * N + 40] *= 20.0f;
    }
    float max0 = transform_absmax(W, R * N);
    double kurt0 = transform_kurtosis(W, R * N);
    cr_assert_eq(transform_rotation(Q, N, 4), 0);
    cr_assert_eq(transform_matmul_right(W, R, N, N, Q), 0);
    float max1 = transform_absmax(W, R * N);
    double kurt1 = transform_kurtosis(W, R * N);
    fprintf(stderr, "transform: outlier columns: max |W| %.2f -> %.2f, kurtosis %.2f -> %.2f\n", max0, max1, kurt0,
            kurt1);
    cr_assert(max1 < max0 / 4, "max |W| %g -> %g", max0, max1);
    cr_assert(kurt0 > 20 && kurt1 < 4, "kurtosis %g -> %g", kurt0, kurt1);
    free(W);
    free(Q);
}

// ---- whole models ----

// Qwen2-style tiny model: GQA (4 query heads over 2 KV heads), q/k/v biases, head_dim != C / NH, and
// a hidden size that is not a power of 2.
static ModelConfig tiny_config(int C, int tied) {
    ModelConfig c = {.arch = ARCH_QWEN2, .C = C, .FF = 40, .L = 2, .NH = 4, .NKV = 2, .HS = 16, .V = 29,
                     .max_pos = 64, .rope_theta = 10000.0f, .eps = 1e-6f, .tied = tied, .qkv_bias = 1,
                     .dtype = DT_F32, .bos_id = -1, .eos_id = -1};
    return c;
}

// Random weights with non-trivial norms (a few outsized channels) and biases, so folding matters.
static void build(Model *m, int C, int tied, int unit_final_norm, uint64_t seed) {
    threads_set(1);
    ModelConfig c = tiny_config(C, tied);
    cr_assert_eq(model_build_random(m, &c, 0.2f, seed), 0, "%s", er_last_error());
    ErRng r;
    rng_seed(&r, seed + 1);
    for (int i = 0; i < m->n_params; i++) {
        ParamTensor *p = &m->params[i];
        int is_norm = strstr(p->name, "norm") != NULL;
        if (is_norm && unit_final_norm && strcmp(p->name, "model.norm.weight") == 0)
            continue;
        if (is_norm)
            for (size_t j = 0; j < p->numel; j++)
                p->data[j] = (1.0f + 0.3f * rng_normal(&r)) * (j % 17 == 3 ? 4.0f : 1.0f);
        else if (strstr(p->name, "bias"))
            for (size_t j = 0; j < p->numel; j++)
                p->data[j] = 0.3f * rng_normal(&r);
    }
}

enum { TB = 2, TT = 7 };

// Logits (TB, TT, V) of a fixed batch.
static float *logits_of(Model *m) {
    static const int tokens[TB * TT] = {1, 5, 3, 7, 2, 9, 4, 28, 0, 11, 12, 6, 20, 17};
    return helper_forward_logits(m, tokens, TB, TT);
}

static double max_param_change(const Model *a, const Model *b, const char *name) {
    const ParamTensor *p = model_find_param(a, name), *q = model_find_param(b, name);
    cr_assert(p && q && p->numel == q->numel, "%s", name);
    double d = 0;
    for (size_t i = 0; i < p->numel; i++)
        d = fmax(d, fabs((double)p->data[i] - q->data[i]));
    return d;
}

// Applies `mode` and returns the relative logit difference; asserts it is within 1e-4.
static double check_preserved(int C, int tied, int unit_final_norm, const char *mode, uint64_t seed) {
    Model m, orig;
    build(&m, C, tied, unit_final_norm, seed);
    build(&orig, C, tied, unit_final_norm, seed);
    float *before = logits_of(&m);
    cr_assert_eq(transform_model(&m, mode, seed * 31 + 1), 0, "%s: %s", mode, er_last_error());
    float *after = logits_of(&m);
    double rel = helper_rel_err(after, before, (size_t)TB * TT * m.cfg.V);
    fprintf(stderr, "transform: mode %-8s C=%d tied=%d: max |dlogit| / max |logit| = %.3g\n", mode, C, tied, rel);
    cr_assert(rel <= 1e-4, "%s (C=%d, tied=%d): logits moved by %g relative", mode, C, tied, rel);
    // Not a no-op: the transformed weights differ.
    const char *touched = strcmp(mode, "u") == 0 ? "model.layers.1.mlp.up_proj.weight"
                          : strcmp(mode, "v") == 0 ? "model.layers.1.self_attn.v_proj.weight"
                                                   : "model.layers.1.self_attn.k_proj.weight";
    if (strcmp(mode, "none") != 0)
        cr_assert(max_param_change(&m, &orig, touched) > 1e-2, "%s left %s unchanged", mode, touched);
    free(before);
    free(after);
    model_free(&m);
    model_free(&orig);
    return rel;
}

Test(quant_transform, rotate_preserves_logits) {
    check_preserved(96, 0, 0, "rotate", 1);
    check_preserved(48, 0, 0, "rotate", 2);
    check_preserved(86, 0, 0, "rotate", 5); // no Hadamard of order 86: the Kronecker fallback
}
Test(quant_transform, rotate_tied_unties) {
    Model m;
    build(&m, 48, 1, 0, 3);
    cr_assert_eq(transform_model(&m, "rotate", 5), 0, "%s", er_last_error());
    cr_assert_eq(m.cfg.tied, 0, "a non-unit final norm cannot be folded into a tied lm_head");
    cr_assert_neq(m.lm_head.data, m.embed.data);
    cr_assert(model_find_param(&m, "lm_head.weight"));
    cr_assert_eq(model_find_param(&m, "model.embed_tokens.weight")->w, &m.embed);
    // Still a trainable model: its own lm_head gradient, every gradient in place.
    cr_assert(m.trainable && m.grad_mem && m.g_lm_head && m.g_lm_head != m.g_embed);
    for (int i = 0; i < m.n_params; i++)
        cr_assert(m.params[i].grad, "%s has no gradient", m.params[i].name);
    model_free(&m);
    check_preserved(48, 1, 0, "rotate", 3);
    check_preserved(96, 1, 0, "rotate", 4);
}
Test(quant_transform, rotate_tied_unit_norm_stays_tied) {
    Model m;
    build(&m, 96, 1, 1, 6);
    cr_assert_eq(transform_model(&m, "rotate", 5), 0, "%s", er_last_error());
    cr_assert_eq(m.cfg.tied, 1);
    cr_assert_eq(m.lm_head.data, m.embed.data);
    model_free(&m);
    check_preserved(96, 1, 1, "rotate", 6);
}
Test(quant_transform, up_down_scale_preserves_logits) {
    check_preserved(96, 0, 0, "u", 7);
    check_preserved(48, 1, 0, "u", 8);
}
Test(quant_transform, value_output_preserves_logits) {
    check_preserved(96, 0, 0, "v", 9);
    check_preserved(48, 1, 0, "v", 10);
}
Test(quant_transform, query_key_preserves_logits) {
    check_preserved(96, 0, 0, "k", 11);
    check_preserved(48, 1, 0, "k", 12);
}
Test(quant_transform, fpt_preserves_logits) {
    check_preserved(96, 0, 0, "fpt", 13);
    check_preserved(96, 1, 0, "fpt", 14);
    check_preserved(48, 1, 1, "fpt", 15);
    check_preserved(48, 0, 0, "none", 16);
}

// The scales do what they are chosen for: after T_u each up row and its down column share one
// range; after T_k each RoPE pair's q and k rows share one range.
Test(quant_transform, scales_balance_ranges) {
    Model m;
    build(&m, 48, 0, 0, 21);
    cr_assert_eq(transform_model(&m, "u,k", 1), 0, "%s", er_last_error());
    const ModelConfig *c = &m.cfg;
    for (int l = 0; l < c->L; l++) {
        const LayerWeights *w = &m.layers[l];
        float *mu = malloc(sizeof(float) * c->FF), *md = calloc(c->FF, sizeof(float));
        transform_row_absmax(mu, w->wup.data, c->FF, c->C, c->C);
        transform_col_absmax_acc(md, w->wdown.data, c->C, c->FF, c->FF);
        for (int j = 0; j < c->FF; j++)
            cr_assert_float_eq(mu[j], md[j], 1e-5f * md[j], "layer %d channel %d: up %g, down %g", l, j, mu[j], md[j]);
        free(mu);
        free(md);
        const float *wk = w->wk.data, *wq = w->wq.data;
        int G = c->NH / c->NKV, half = c->HS / 2;
        for (int h = 0; h < c->NKV; h++)
            for (int i = 0; i < half; i++) {
                int k0 = h * c->HS + i;
                float mk = fmaxf(transform_absmax(wk + k0 * c->C, c->C), transform_absmax(wk + (k0 + half) * c->C, c->C));
                float mq = 0;
                for (int g = 0; g < G; g++) {
                    int q0 = (h * G + g) * c->HS + i;
                    mq = fmaxf(mq, fmaxf(transform_absmax(wq + q0 * c->C, c->C),
                                         transform_absmax(wq + (q0 + half) * c->C, c->C)));
                }
                cr_assert_float_eq(mk, mq, 1e-5f * mq, "layer %d head %d pair %d: k %g, q %g", l, h, i, mk, mq);
            }
    }
    model_free(&m);
}

Test(quant_transform, transformed_model_saves_and_reloads) {
    Model m, b;
    build(&m, 48, 1, 0, 31);
    cr_assert_eq(transform_model(&m, "fpt", 77), 0, "%s", er_last_error());
    float *want = logits_of(&m);
    char dir[] = "/tmp/er_transform_XXXXXX";
    cr_assert(mkdtemp(dir));
    cr_assert_eq(model_save(&m, dir, 0), 0, "%s", er_last_error());
    for (int flags = 0; flags <= MODEL_LOAD_TRAINABLE; flags++) {
        cr_assert_eq(model_load(&b, dir, flags), 0, "%s", er_last_error());
        cr_assert_eq(b.cfg.tied, 0);
        cr_assert(model_find_param(&b, "lm_head.weight"));
        float *got = logits_of(&b);
        double rel = helper_rel_err(got, want, (size_t)TB * TT * m.cfg.V);
        cr_assert(rel <= 1e-6, "reloaded (flags %d) logits differ by %g relative", flags, rel);
        free(got);
        model_free(&b);
    }
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
    free(want);
    model_free(&m);
}

Test(quant_transform, refuses_what_it_cannot_transform) {
    Model m, b;
    build(&m, 48, 0, 0, 41);
    unsigned flags;
    cr_assert_eq(transform_model(&m, "rotate,bogus", 1), ER_EINVAL);
    cr_assert(strstr(er_last_error(), "bogus"));
    cr_assert_eq(transform_model(&m, "", 1), ER_EINVAL);
    cr_assert_eq(transform_model(&m, NULL, 1), ER_EINVAL);
    cr_assert_eq(transform_parse_mode("r+u,v", &flags), 0);
    cr_assert_eq(flags, TRANSFORM_ROTATE | TRANSFORM_UP | TRANSFORM_V);
    cr_assert_eq(transform_parse_mode("fpt", &flags), 0);
    cr_assert_eq(flags, TRANSFORM_ALL);
    cr_assert_eq(transform_model_apply(&m, 64, 1), ER_EINVAL);
    // An inference (mmapped, not trainable) model is refused, except for "none".
    char dir[] = "/tmp/er_transform_XXXXXX";
    cr_assert(mkdtemp(dir));
    cr_assert_eq(model_save(&m, dir, 1), 0, "%s", er_last_error());
    cr_assert_eq(model_load(&b, dir, 0), 0, "%s", er_last_error());
    cr_assert_eq(transform_model(&b, "none", 1), 0);
    cr_assert_eq(transform_model(&b, "rotate", 1), ER_EINVAL);
    cr_assert(strstr(er_last_error(), "trainable"), "%s", er_last_error());
    model_free(&b);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
    model_free(&m);
    // Qwen3: T_k by name is refused (its q/k norms sit between the projections and RoPE), before anything changes;
    // fpt there is the other three (tests/train/test_fpt.c checks the logits).
    ModelConfig c = tiny_config(48, 0);
    c.arch = ARCH_QWEN3, c.qkv_bias = 0;
    cr_assert_eq(model_build_random(&m, &c, 0.2f, 42), 0, "%s", er_last_error());
    float *before = logits_of(&m);
    cr_assert_eq(transform_model(&m, "r+k", 1), ER_EUNSUPPORTED);
    cr_assert(strstr(er_last_error(), "qwen3"), "%s", er_last_error());
    float *after = logits_of(&m);
    cr_assert_eq(memcmp(before, after, sizeof(float) * TB * TT * m.cfg.V), 0, "a refused transform changed the model");
    free(before);
    free(after);
    model_free(&m);
}

// ---- what the transforms are for ----

// Symmetric round-to-nearest with one scale per row, in place: a stand-in for the real quantizers.
static void quantize_rows_rtn(Model *m, int bits) {
    float qmax = (float)((1 << (bits - 1)) - 1);
    for (int i = 0; i < m->n_params; i++) {
        ParamTensor *p = &m->params[i];
        if (p->ndim != 2)
            continue;
        for (int64_t r = 0; r < p->shape[0]; r++) {
            float *row = p->data + r * p->shape[1];
            float s = transform_absmax(row, (size_t)p->shape[1]) / qmax;
            for (int64_t j = 0; s > 0 && j < p->shape[1]; j++)
                row[j] = s * nearbyintf(row[j] / s);
        }
    }
}

// A model whose weights carry outlier residual channels, as trained LLMs do: a few input columns
// of every reader and output rows of every writer are 10x the rest.
static void inject_outliers(Model *m) {
    const ModelConfig *c = &m->cfg;
    int ch[] = {3, 50, 71};
    for (int i = 0; i < m->n_params; i++) {
        ParamTensor *p = &m->params[i];
        if (p->ndim != 2)
            continue;
        int writer = strstr(p->name, "o_proj") || strstr(p->name, "down_proj");
        for (int k = 0; k < 3; k++) {
            if (ch[k] >= c->C)
                continue;
            if (writer)
                for (int64_t j = 0; j < p->shape[1]; j++)
                    p->data[ch[k] * p->shape[1] + j] *= 10.0f;
            else
                for (int64_t r = 0; r < p->shape[0]; r++)
                    p->data[r * p->shape[1] + ch[k]] *= 10.0f;
        }
    }
}

static double quantized_error(const char *mode, uint64_t seed) {
    Model m;
    build(&m, 96, 0, 0, seed);
    inject_outliers(&m);
    float *ref = logits_of(&m);
    cr_assert_eq(transform_model(&m, mode, 3), 0, "%s", er_last_error());
    quantize_rows_rtn(&m, 4);
    float *got = logits_of(&m);
    double rel = helper_rel_err(got, ref, (size_t)TB * TT * m.cfg.V);
    free(ref);
    free(got);
    model_free(&m);
    return rel;
}

Test(quant_transform, transforms_reduce_quantization_error) {
    for (uint64_t seed = 50; seed < 53; seed++) {
        double e_none = quantized_error("none", seed), e_rot = quantized_error("rotate", seed),
               e_fpt = quantized_error("fpt", seed);
        fprintf(stderr, "transform: W4 per-row RTN, relative logit error: none %.4f, rotate %.4f, fpt %.4f\n", e_none,
                e_rot, e_fpt);
        cr_assert(e_rot < 0.7 * e_none, "rotation did not help 4-bit RTN: %g vs %g", e_rot, e_none);
        cr_assert(e_fpt < 0.7 * e_none, "fpt did not help 4-bit RTN: %g vs %g", e_fpt, e_none);
    }
}
