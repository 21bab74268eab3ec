// Whole-model gradient checks on a tiny config against finite differences, and the optimizer
// overfitting one batch. The model runs in fp32, so the differences use a step large enough to rise
// above rounding and compare with a tolerance sized for fp32 (the ops themselves are checked in
// double in test_ops_grad.c).
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"
#include "core/threads.h"
#include "model/model.h"
#include "tests/common/fd.h"
#include "train/optim.h"

// Qwen2 (q/k/v biases) or Qwen3 (per-head q/k norms, no biases).
static ModelConfig tiny_config(int tied, ModelArch arch) {
    ModelConfig c = {0};
    c.arch = arch;
    c.C = 16;
    c.FF = 24;
    c.L = 2;
    c.NH = 4;
    c.NKV = 2;
    c.HS = 6; // head_dim != C / NH on purpose
    c.V = 13;
    c.max_pos = 64;
    c.rope_theta = 10000.0f;
    c.eps = 1e-6f;
    c.tied = tied;
    c.qkv_bias = arch == ARCH_QWEN2;
    c.dtype = DT_F32;
    c.bos_id = c.eos_id = -1;
    return c;
}

typedef struct {
    Model m;
    Activations a;
    ModelInput in;
    int tokens[2 * 6], targets[2 * 6];
    float mask[2 * 6];
} Fixture;

static void fixture_init(Fixture *f, int tied, ModelArch arch, uint64_t seed) {
    threads_set(1);
    ModelConfig c = tiny_config(tied, arch);
    cr_assert_eq(model_build_random(&f->m, &c, 0.3f, seed), 0);
    // Biases are zero at init; make them non-zero so their gradients are exercised.
    ErRng r;
    rng_seed(&r, seed + 1);
    for (int i = 0; i < f->m.n_params; i++)
        if (strstr(f->m.params[i].name, "bias") || strstr(f->m.params[i].name, "norm"))
            for (size_t j = 0; j < f->m.params[i].numel; j++)
                f->m.params[i].data[j] += 0.2f * rng_normal(&r);
    cr_assert_eq(acts_alloc(&f->a, &c, 2, 6, ACTS_TRAIN, 0), 0);
    // Token 12 appears exactly once (position 4 of row 1): its embedding gradient is the input
    // gradient at that position.
    int toks[12] = {1, 5, 3, 7, 2, 9, 4, 4, 0, 11, 12, 6};
    for (int i = 0; i < 12; i++) {
        f->tokens[i] = toks[i];
        f->targets[i] = (toks[i] * 7 + 3) % c.V;
        f->mask[i] = (i % 5 == 3) ? 0.0f : 1.0f;
    }
    f->in = (ModelInput){.B = 2, .T = 6, .tokens = f->tokens};
}

static double loss_of(Fixture *f) {
    double L;
    cr_assert_eq(model_forward(&f->m, &f->in, &f->a), 0);
    cr_assert_eq(model_loss(&f->a, f->targets, f->mask, 0, &L), 0);
    return L;
}

static double loss_cb(void *f) { return loss_of(f); }

static void check_model_grads(int tied, ModelArch arch) {
    Fixture f;
    fixture_init(&f, tied, arch, 42 + tied);
    model_zero_grad(&f.m);
    double L;
    cr_assert_eq(model_forward(&f.m, &f.in, &f.a), 0);
    cr_assert_eq(model_loss(&f.a, f.targets, f.mask, 1, &L), 0);
    cr_assert_eq(model_backward(&f.m, &f.in, &f.a), 0);

    // 1. Directional derivative along a random direction over all parameters at once; 2. every parameter
    // tensor: its largest-gradient entries, one at a time.
    fd_check_model(&f.m, 7, loss_cb, &f, "analytic");

    // 3. Input gradient: token 12 appears once, at row 1 position 4, so d loss / d embed[12] (through
    //    the input path; untied) is the gradient w.r.t. the embedding output there.
    if (!tied) {
        const float *dx = f.a.dres + (size_t)(1 * 6 + 4) * f.m.cfg.C;
        const float *ge = f.m.g_embed + (size_t)12 * f.m.cfg.C;
        for (int i = 0; i < f.m.cfg.C; i++)
            cr_assert_float_eq(dx[i], ge[i], 1e-7, "input gradient and embedding gradient differ at %d", i);
        float *e = f.m.embed.data ? (float *)f.m.embed.data + (size_t)12 * f.m.cfg.C : NULL;
        for (int i = 0; i < f.m.cfg.C; i += 3) {
            float e0 = e[i];
            e[i] = e0 + 1e-2f;
            double a = loss_of(&f);
            e[i] = e0 - 1e-2f;
            double b = loss_of(&f);
            e[i] = e0;
            double fde = (a - b) / 2e-2;
            cr_assert(fabs(fde - dx[i]) <= 1e-2 * fabs(dx[i]) + 2e-5, "input grad [%d]: fd %.7g vs analytic %.7g", i, fde,
                      dx[i]);
        }
    }
    acts_free(&f.a);
    model_free(&f.m);
}

Test(model_grad, untied_with_biases) { check_model_grads(0, ARCH_QWEN2); }
Test(model_grad, tied_embeddings) { check_model_grads(1, ARCH_QWEN2); }
Test(model_grad, qwen3_qk_norms) { check_model_grads(0, ARCH_QWEN3); }

// Gradients accumulate across backward calls (gradient accumulation relies on it).
Test(model_grad, gradients_accumulate) {
    Fixture f;
    fixture_init(&f, 0, ARCH_QWEN2, 3);
    double L;
    model_zero_grad(&f.m);
    model_forward(&f.m, &f.in, &f.a);
    model_loss(&f.a, f.targets, f.mask, 1, &L);
    model_backward(&f.m, &f.in, &f.a);
    size_t n = f.m.n_param_floats;
    float *once = malloc(n * sizeof(float));
    memcpy(once, f.m.grad_mem, n * sizeof(float));
    model_forward(&f.m, &f.in, &f.a);
    model_loss(&f.a, f.targets, f.mask, 1, &L);
    model_backward(&f.m, &f.in, &f.a);
    for (size_t i = 0; i < n; i++)
        cr_assert_float_eq(f.m.grad_mem[i], 2 * once[i], 1e-6 + 1e-5 * fabsf(once[i]));
    free(once);
    acts_free(&f.a);
    model_free(&f.m);
}

// AdamW with warmup + cosine drives the loss on one fixed batch near zero.
Test(model_grad, overfits_one_batch) {
    Fixture f;
    fixture_init(&f, 1, ARCH_QWEN2, 11);
    AdamW opt;
    cr_assert_eq(adamw_init(&opt, backend_cpu(), f.m.n_param_floats, 1e-2, 0.9, 0.95, 1e-8, 0.0), 0);
    double first = 0, L = 0;
    int steps = 300;
    for (int s = 0; s < steps; s++) {
        model_zero_grad(&f.m);
        cr_assert_eq(model_forward(&f.m, &f.in, &f.a), 0);
        cr_assert_eq(model_loss(&f.a, f.targets, f.mask, 1, &L), 0);
        if (s == 0)
            first = L;
        cr_assert_eq(model_backward(&f.m, &f.in, &f.a), 0);
        double norm;
        cr_assert_eq(clip_grad_norm(backend_cpu(), f.m.grad_mem, f.m.n_param_floats, 1.0, &norm), 0);
        adamw_step(&opt, f.m.param_mem, f.m.grad_mem, NULL, lr_schedule(s, 10, steps, 1e-2, 1e-3));
    }
    L = loss_of(&f);
    cr_assert(first > 1.5, "initial loss %g should be near log(V)", first);
    cr_assert(L < 0.05, "loss after %d steps is %g (started at %g)", steps, L, first);
    adamw_free(&opt);
    acts_free(&f.a);
    model_free(&f.m);
}

// ---- recomputation: the backward from each layer's kept input gives the same gradients ----

// The model's and a masked adapter's gradients after one pass with activations of `mode`.
static void grads_with(Model *m, LoraAdapter *ad, ActsMode mode, float **g, float **ga) {
    int B = 2, T = 9, N = B * T, tok[18], tgt[18];
    float mask[18];
    uint8_t amask[18];
    for (int i = 0; i < N; i++) {
        tok[i] = (i * 5 + 2) % m->cfg.V;
        tgt[i] = (i * 7 + 1) % m->cfg.V;
        amask[i] = i % T > 2;
        mask[i] = amask[i];
    }
    Activations a;
    cr_assert_eq(acts_alloc(&a, &m->cfg, B, T, mode, 0), 0, "%s", er_last_error());
    model_zero_grad(m);
    lora_zero_grad(ad);
    ModelInput in = {.B = B, .T = T, .tokens = tok, .adapter = ad, .adapter_mask = amask};
    double loss;
    cr_assert_eq(model_forward(m, &in, &a), 0, "%s", er_last_error());
    cr_assert_eq(model_loss(&a, tgt, mask, 1, &loss), 0, "%s", er_last_error());
    cr_assert_eq(model_backward(m, &in, &a), 0, "%s", er_last_error());
    *g = malloc(sizeof(float) * m->n_param_floats);
    *ga = malloc(sizeof(float) * ad->n_params);
    memcpy(*g, m->grad_mem, sizeof(float) * m->n_param_floats);
    memcpy(*ga, ad->grads, sizeof(float) * ad->n_params);
    acts_free(&a);
}

Test(model_grad, recompute_gives_the_same_gradients_bitwise) {
    threads_set(2);
    for (int tied = 0; tied <= 2; tied++) { // 2: Qwen3, tied
        ModelConfig c = tiny_config(tied > 0, tied == 2 ? ARCH_QWEN3 : ARCH_QWEN2);
        Model m;
        cr_assert_eq(model_build_random(&m, &c, 0.3f, 21), 0);
        LoraShape s = model_config_lora_shape(&c);
        LoraAdapter ad;
        cr_assert_eq(lora_init(&ad, &s, 3, 6.0f, 0, 0.0f, LORA_ALL_TARGETS, 1, 4), 0);
        for (size_t i = 0; i < ad.n_params; i++)
            ad.params[i] += 0.05f * (float)((i * 37) % 11) - 0.25f;
        float *g1, *ga1, *g2, *ga2;
        grads_with(&m, &ad, ACTS_TRAIN, &g1, &ga1);
        grads_with(&m, &ad, ACTS_TRAIN_RECOMPUTE, &g2, &ga2);
        cr_expect_eq(memcmp(g1, g2, sizeof(float) * m.n_param_floats), 0, "model gradients (tied %d)", tied);
        cr_expect_eq(memcmp(ga1, ga2, sizeof(float) * ad.n_params), 0, "adapter gradients (tied %d)", tied);
        free(g1);
        free(ga1);
        free(g2);
        free(ga2);
        lora_free(&ad);
        model_free(&m);
    }
    // The memory it saves: one layer's intermediates instead of L (at the 0.5B shape, 24 layers, 2048 positions).
    ModelConfig q = {.arch = ARCH_QWEN2, .C = 896, .FF = 4864, .L = 24, .NH = 14, .NKV = 2, .HS = 64, .V = 151936,
                     .max_pos = 32768, .rope_theta = 1e6f, .eps = 1e-6f, .tied = 1, .qkv_bias = 1, .dtype = DT_F32};
    size_t full = acts_bytes(&q, 1, 2048, ACTS_TRAIN), rec = acts_bytes(&q, 1, 2048, ACTS_TRAIN_RECOMPUTE);
    cr_expect_lt(rec * 2, full, "recomputation %.0f MiB, keeping every layer %.0f MiB", rec / 1048576.0,
                 full / 1048576.0);
}
