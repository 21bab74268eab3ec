// LoRA gradients through the whole model against finite differences: masked (adapter on the
// response positions only), unmasked, and with adapter dropout; and the masked rule itself.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/threads.h"
#include "lora/lora.h"
#include "model/model.h"

static ModelConfig cfg(void) {
    ModelConfig c = {.arch = ARCH_QWEN2, .C = 16, .FF = 24, .L = 2, .NH = 4, .NKV = 2, .HS = 4, .V = 13,
                     .max_pos = 64, .rope_theta = 10000.0f, .eps = 1e-6f, .tied = 1, .qkv_bias = 1,
                     .dtype = DT_F32, .bos_id = -1, .eos_id = -1};
    return c;
}

typedef struct {
    Model m;
    LoraAdapter ad;
    Activations a;
    ModelInput in;
    ErRng drop;
    int tokens[12], targets[12];
    float mask[12];
    uint8_t amask[12];
} Fx;

static void fx_init(Fx *f, int masked, float dropout) {
    threads_set(1);
    ModelConfig c = cfg();
    cr_assert_eq(model_build_random(&f->m, &c, 0.3f, 3), 0);
    f->m.trainable = 0; // a frozen base: only the adapter and the inputs get gradients
    LoraShape s = model_config_lora_shape(&c);
    cr_assert_eq(lora_init(&f->ad, &s, 3, 6.0f, 0, dropout, LORA_ALL_TARGETS, 1, 9), 0);
    ErRng r;
    rng_seed(&r, 4);
    for (size_t i = 0; i < f->ad.n_params; i++) // B must be non-zero for A's gradient to exist
        f->ad.params[i] += 0.05f * rng_normal(&r);
    cr_assert_eq(acts_alloc(&f->a, &c, 2, 6, ACTS_TRAIN, 0), 0);
    for (int i = 0; i < 12; i++) {
        f->tokens[i] = (i * 5 + 2) % c.V;
        f->targets[i] = (i * 3 + 1) % c.V;
        f->mask[i] = 1.0f;
        f->amask[i] = masked ? (i % 6 >= 3) : 1; // the first 3 positions of each row are the prompt
    }
    f->in = (ModelInput){.B = 2, .T = 6, .tokens = f->tokens, .adapter = &f->ad, .adapter_mask = f->amask,
                         .dropout_rng = dropout > 0 ? &f->drop : NULL};
}

static void fx_free(Fx *f) {
    acts_free(&f->a);
    lora_free(&f->ad);
    model_free(&f->m);
}

static double loss_of(Fx *f, int grad) {
    double L;
    rng_seed(&f->drop, 77); // the same dropout masks on every evaluation
    cr_assert_eq(model_forward(&f->m, &f->in, &f->a), 0);
    cr_assert_eq(model_loss(&f->a, f->targets, f->mask, grad, &L), 0);
    return L;
}

static void check(int masked, float dropout) {
    Fx f;
    fx_init(&f, masked, dropout);
    lora_zero_grad(&f.ad);
    loss_of(&f, 1);
    cr_assert_eq(model_backward(&f.m, &f.in, &f.a), 0);
    int checked = 0;
    for (int l = 0; l < f.ad.L; l++)
        for (int t = 0; t < LT_COUNT; t++) {
            LoraMat *m = &f.ad.mats[l * LT_COUNT + t];
            float *ps[2] = {m->A, m->B}, *gs[2] = {m->gA, m->gB};
            size_t ns[2] = {(size_t)f.ad.r * m->in, (size_t)m->out * f.ad.r};
            for (int k = 0; k < 2; k++) {
                size_t best = 0;
                for (size_t j = 1; j < ns[k]; j++)
                    if (fabsf(gs[k][j]) > fabsf(gs[k][best]))
                        best = j;
                float w0 = ps[k][best];
                const double h = 1e-2;
                ps[k][best] = w0 + (float)h;
                double a = loss_of(&f, 0);
                ps[k][best] = w0 - (float)h;
                double b = loss_of(&f, 0);
                ps[k][best] = w0;
                double fd = (a - b) / (2 * h), an = gs[k][best];
                cr_assert(fabs(an) > 1e-5, "layer %d %s %s: zero gradient", l, lora_target_name((LoraTarget)t), k ? "B" : "A");
                cr_assert(fabs(fd - an) <= 1e-2 * fabs(an) + 2e-5, "layer %d %s lora_%s[%zu]: fd %.7g vs analytic %.7g", l,
                          lora_target_name((LoraTarget)t), k ? "B" : "A", best, fd, an);
                checked++;
            }
        }
    cr_assert_eq(checked, 2 * 2 * LT_COUNT);
    fx_free(&f);
}

Test(lora_grad, masked) { check(1, 0.0f); }
Test(lora_grad, unmasked) { check(0, 0.0f); }
Test(lora_grad, masked_with_dropout) { check(1, 0.25f); }

// The masked rule: prompt positions compute exactly the base model; response positions differ.
Test(lora_grad, mask_off_means_base_model) {
    Fx f;
    fx_init(&f, 1, 0.0f);
    Activations base;
    cr_assert_eq(acts_alloc(&base, &f.m.cfg, 2, 6, ACTS_TRAIN, 0), 0);
    ModelInput bin = {.B = 2, .T = 6, .tokens = f.tokens};
    cr_assert_eq(model_forward(&f.m, &bin, &base), 0);
    loss_of(&f, 0);
    int V = f.m.cfg.V;
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 6; t++) {
            const float *x = f.a.logits + (size_t)(b * 6 + t) * V, *y = base.logits + (size_t)(b * 6 + t) * V;
            if (t < 3)
                cr_assert_arr_eq(x, y, sizeof(float) * V, "prompt position %d of row %d must be the base model's", t, b);
            else
                cr_assert(memcmp(x, y, sizeof(float) * V) != 0, "response position %d of row %d must use the adapter", t, b);
        }
    acts_free(&base);
    fx_free(&f);
}

// Merging B·A into the weights gives the unmasked adapter's logits; unmerging restores the base.
Test(lora_grad, merge_and_unmerge) {
    Fx f;
    fx_init(&f, 0, 0.0f);
    loss_of(&f, 0);
    int N = 12, V = f.m.cfg.V;
    float *with = malloc(sizeof(float) * N * V);
    memcpy(with, f.a.logits, sizeof(float) * N * V);
    float *orig = malloc(sizeof(float) * f.m.n_param_floats);
    memcpy(orig, f.m.param_mem, sizeof(float) * f.m.n_param_floats);
    for (int l = 0; l < f.m.cfg.L; l++) {
        LayerWeights *w = &f.m.layers[l];
        Weight *ws[LT_COUNT] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->wgate, &w->wup, &w->wdown};
        for (int t = 0; t < LT_COUNT; t++)
            lora_merge_into((float *)ws[t]->data, lora_mat(&f.ad, l, (LoraTarget)t), f.ad.r, f.ad.scale, 1.0f);
    }
    ModelInput bin = {.B = 2, .T = 6, .tokens = f.tokens};
    cr_assert_eq(model_forward(&f.m, &bin, &f.a), 0);
    for (int i = 0; i < N * V; i++)
        cr_assert(fabsf(f.a.logits[i] - with[i]) <= 1e-4f * (1 + fabsf(with[i])), "merged logit %d: %g vs %g", i,
                  f.a.logits[i], with[i]);
    for (int l = 0; l < f.m.cfg.L; l++) {
        LayerWeights *w = &f.m.layers[l];
        Weight *ws[LT_COUNT] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->wgate, &w->wup, &w->wdown};
        for (int t = 0; t < LT_COUNT; t++)
            lora_merge_into((float *)ws[t]->data, lora_mat(&f.ad, l, (LoraTarget)t), f.ad.r, f.ad.scale, -1.0f);
    }
    for (size_t i = 0; i < f.m.n_param_floats; i++)
        cr_assert(fabsf(f.m.param_mem[i] - orig[i]) <= 1e-5f, "unmerge must restore parameter %zu", i);
    free(with);
    free(orig);
    fx_free(&f);
}

Test(lora_grad, targets_parse) {
    unsigned m;
    cr_assert_eq(lora_targets_parse("q_proj,v_proj", &m), 0);
    cr_assert_eq(m, (1u << LT_Q) | (1u << LT_V));
    cr_assert_eq(lora_targets_parse("gate,up,down", &m), 0);
    cr_assert_eq(m, (1u << LT_GATE) | (1u << LT_UP) | (1u << LT_DOWN));
    cr_assert_eq(lora_targets_parse("all", &m), 0);
    cr_assert_eq(m, LORA_ALL_TARGETS);
    cr_assert(lora_targets_parse("qkv", &m) < 0);
    cr_assert(lora_targets_parse("", &m) < 0);
}
