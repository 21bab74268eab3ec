// The loss-only pass (ACTS_LOSS_ONLY): the LM head, the cross-entropy and the head's backward a chunk of
// rows at a time inside model_loss. Against the pass that keeps the whole (B*T, V) logits on a tiny model:
// the same loss and gradients (tied and untied heads, trained whole or frozen under an adapter, with and
// without a mask, chunks of 1, 3 and every row), the bytes it saves, and the misuses it refuses.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"
#include "core/threads.h"
#include "lora/lora.h"
#include "model/model.h"

enum { B = 2, T = 7, N = B * T };

static ModelConfig tiny(int tied) {
    return (ModelConfig){.arch = ARCH_QWEN2, .C = 16, .FF = 24, .L = 2, .NH = 4, .NKV = 2, .HS = 6, .V = 37,
                         .max_pos = 64, .rope_theta = 10000.0f, .eps = 1e-6f, .tied = tied, .qkv_bias = 1,
                         .dtype = DT_F32, .bos_id = -1, .eos_id = -1};
}

typedef struct {
    Model m;
    LoraAdapter ad; // lora: the model frozen, the adapter trained
    int lora;
    int tokens[N], targets[N];
    float mask[N];
    uint8_t amask[N];
    ModelInput in;
} Fx;

static void fx_init(Fx *f, int tied, int lora) {
    threads_set(1);
    memset(f, 0, sizeof *f);
    ModelConfig c = tiny(tied);
    cr_assert_eq(model_build_random(&f->m, &c, 0.3f, 11 + tied), ER_OK, "%s", er_last_error());
    ErRng r;
    rng_seed(&r, 5);
    for (int i = 0; i < f->m.n_params; i++) // non-zero biases and norms, so their gradients are exercised
        if (strstr(f->m.params[i].name, "bias") || strstr(f->m.params[i].name, "norm"))
            for (size_t j = 0; j < f->m.params[i].numel; j++)
                f->m.params[i].data[j] += 0.2f * rng_normal(&r);
    f->lora = lora;
    if (lora) {
        f->m.trainable = 0; // a frozen base: the head gets no gradient, only dln goes through it
        LoraShape s = model_config_lora_shape(&c);
        cr_assert_eq(lora_init(&f->ad, &s, 3, 6.0f, 0, 0.0f, LORA_ALL_TARGETS, 1, 9), ER_OK);
        for (size_t i = 0; i < f->ad.n_params; i++) // B non-zero, so A gets a gradient
            f->ad.params[i] += 0.05f * rng_normal(&r);
    }
    for (int i = 0; i < N; i++) {
        f->tokens[i] = (i * 5 + 2) % c.V;
        f->targets[i] = (i * 11 + 3) % c.V;
        f->mask[i] = i % 4 == 1 ? 0.0f : i % 3 == 0 ? 0.5f : 1.0f; // zeros and a weight other than 1
        f->amask[i] = i % T >= 2;                                   // the first 2 positions of a row: prompt
    }
    f->in = (ModelInput){.B = B, .T = T, .tokens = f->tokens};
    if (lora) {
        f->in.adapter = &f->ad;
        f->in.adapter_mask = f->amask;
    }
}

static void fx_free(Fx *f) {
    lora_free(&f->ad);
    model_free(&f->m);
}

// What one training pass gives: the loss, every gradient (model, adapter) and d loss / d embedding output.
typedef struct {
    double loss;
    float *g, *ga, *dres;
} Pass;

static void pass_free(Pass *p) {
    free(p->g);
    free(p->ga);
    free(p->dres);
}

static float *copy(const float *x, size_t n) {
    float *c = malloc(sizeof(float) * (n ? n : 1));
    cr_assert(c);
    if (n)
        memcpy(c, x, sizeof(float) * n);
    return c;
}

// One forward, loss with grad and backward in `mode`; rows > 0 cuts the loss-only chunk to that many rows.
static Pass run_pass(Fx *f, ActsMode mode, const float *mask, int rows) {
    Activations a;
    cr_assert_eq(acts_alloc(&a, &f->m.cfg, B, T, mode, 0), ER_OK, "%s", er_last_error());
    if (rows > 0)
        cr_assert_eq(acts_set_loss_rows(&a, rows), ER_OK, "%s", er_last_error());
    if (f->lora)
        lora_zero_grad(&f->ad);
    else
        model_zero_grad(&f->m);
    Pass p;
    cr_assert_eq(model_forward(&f->m, &f->in, &a), ER_OK, "%s", er_last_error());
    cr_assert_eq(model_loss(&a, f->targets, mask, 1, &p.loss), ER_OK, "%s", er_last_error());
    cr_assert_eq(model_backward(&f->m, &f->in, &a), ER_OK, "%s", er_last_error());
    p.g = copy(f->m.grad_mem, f->lora ? 0 : f->m.n_param_floats);
    p.ga = copy(f->ad.grads, f->lora ? f->ad.n_params : 0);
    p.dres = copy(a.dres, (size_t)N * f->m.cfg.C);
    acts_free(&a);
    return p;
}

// How close the chunked values must be. The loss and each row's dloss/dlogits are the same bits (the
// head's product rounds a row alike at any row count up to QUANT_BATCH_MAX_N, and the op is given the
// pass's mask sum). Two sums are not: the head's weight gradient adds the rows chunk by chunk (fp32
// rounding of those sums), and dln = dlogits · lm_head runs as a product of the chunk's rows, which
// OpenBLAS's sgemm may round differently at another row count; everything below dln inherits that. The
// built-in GEMM (BLAS=0) rounds a row alike at any row count: there, all but the head's gradient are
// the same bits.
#ifdef ER_BLAS
#define BELOW_HEAD_TOL 5e-6f
#else
#define BELOW_HEAD_TOL 0.0f
#endif
#define HEAD_TOL 1e-6f

// got within tol x (want's largest magnitude) of want, element by element; tol 0: the same bits.
static void expect_close(const float *got, const float *want, size_t n, float tol, const char *what,
                         const char *name) {
    float mx = 0;
    for (size_t i = 0; i < n; i++)
        mx = fmaxf(mx, fabsf(want[i]));
    for (size_t i = 0; i < n; i++) {
        int ok = tol > 0 ? fabsf(got[i] - want[i]) <= tol * mx : memcmp(&got[i], &want[i], sizeof(float)) == 0;
        cr_assert(ok, "%s: %s [%zu] %.9g vs %.9g (largest %.3g, tolerance %g)", what, name, i, got[i], want[i], mx,
                  tol);
    }
}

static void compare(const Fx *f, const Pass *want, const Pass *got, const char *what) {
    cr_assert(fabs(got->loss - want->loss) <= 1e-12 * fabs(want->loss), "%s: loss %.17g vs %.17g", what, got->loss,
              want->loss);
    cr_assert_eq(memcmp(&got->loss, &want->loss, sizeof(double)), 0, "%s: loss %.17g vs %.17g not the same bits",
                 what, got->loss, want->loss);
    expect_close(got->dres, want->dres, (size_t)N * f->m.cfg.C, BELOW_HEAD_TOL, what, "d(embedding output)");
    if (f->lora) {
        for (int i = 0; i < f->ad.L * LT_COUNT; i++) {
            const LoraMat *m = &f->ad.mats[i];
            if (!m->A)
                continue;
            size_t oa = (size_t)(m->gA - f->ad.grads), ob = (size_t)(m->gB - f->ad.grads);
            expect_close(got->ga + oa, want->ga + oa, (size_t)f->ad.r * m->in, BELOW_HEAD_TOL, what, "lora A");
            expect_close(got->ga + ob, want->ga + ob, (size_t)m->out * f->ad.r, BELOW_HEAD_TOL, what, "lora B");
        }
        return;
    }
    int head_seen = 0;
    for (int i = 0; i < f->m.n_params; i++) {
        const ParamTensor *p = &f->m.params[i];
        size_t off = (size_t)(p->grad - f->m.grad_mem);
        int head = p->grad == f->m.g_lm_head; // tied: the embedding's gradient, which the head's adds to
        head_seen += head;
        expect_close(got->g + off, want->g + off, p->numel, head ? HEAD_TOL : BELOW_HEAD_TOL, what, p->name);
    }
    cr_assert_eq(head_seen, 1, "%s: the head's gradient found", what);
}

static void check_chunked(int tied, int lora) {
    Fx f;
    fx_init(&f, tied, lora);
    const float *masks[2] = {f.mask, NULL};
    for (int k = 0; k < 2; k++) {
        Pass want = run_pass(&f, ACTS_TRAIN, masks[k], 0);
        int rows[3] = {1, 3, 0}; // 0: as allocated, every row at this V (one chunk)
        for (int i = 0; i < 3; i++) {
            char what[96];
            snprintf(what, sizeof what, "tied %d, lora %d, mask %d, %d-row chunks", tied, lora, !k, rows[i]);
            Pass got = run_pass(&f, ACTS_TRAIN | ACTS_LOSS_ONLY, masks[k], rows[i]);
            compare(&f, &want, &got, what);
            pass_free(&got);
        }
        // with recomputation too (the loss-only head is independent of how the layers are kept)
        Pass got = run_pass(&f, ACTS_TRAIN_RECOMPUTE | ACTS_LOSS_ONLY, masks[k], 3);
        compare(&f, &want, &got, "recompute, 3-row chunks");
        pass_free(&got);
        pass_free(&want);
    }
    fx_free(&f);
}

Test(loss_chunk, untied_full_finetune) { check_chunked(0, 0); }
Test(loss_chunk, tied_full_finetune) { check_chunked(1, 0); }
Test(loss_chunk, untied_frozen_lora) { check_chunked(0, 1); }
Test(loss_chunk, tied_frozen_lora) { check_chunked(1, 1); }

// Gradients accumulate across passes as the unchunked ones do (gradient accumulation relies on it).
Test(loss_chunk, gradients_accumulate) {
    Fx f;
    fx_init(&f, 0, 0);
    Activations a;
    cr_assert_eq(acts_alloc(&a, &f.m.cfg, B, T, ACTS_TRAIN | ACTS_LOSS_ONLY, 0), ER_OK);
    cr_assert_eq(acts_set_loss_rows(&a, 4), ER_OK);
    model_zero_grad(&f.m);
    double l;
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(model_forward(&f.m, &f.in, &a), ER_OK);
        cr_assert_eq(model_loss(&a, f.targets, f.mask, 1, &l), ER_OK);
        cr_assert_eq(model_backward(&f.m, &f.in, &a), ER_OK);
    }
    float *twice = copy(f.m.grad_mem, f.m.n_param_floats);
    acts_free(&a);
    Pass once = run_pass(&f, ACTS_TRAIN | ACTS_LOSS_ONLY, f.mask, 4);
    for (size_t i = 0; i < f.m.n_param_floats; i++) // 2 x once scales every value alike
        once.g[i] *= 2;
    expect_close(twice, once.g, f.m.n_param_floats, HEAD_TOL, "accumulated", "every gradient");
    free(twice);
    pass_free(&once);
    fx_free(&f);
}

// model_loss_scaled: dloss/dlogits x scale, as the scale op after the loss gives (the trainer's weighting of
// a micro-batch); chunked and not, the same bits.
Test(loss_chunk, scaled_gradient) {
    Fx f;
    fx_init(&f, 1, 0);
    float *g[2];
    double loss[2];
    ActsMode modes[2] = {ACTS_TRAIN, ACTS_TRAIN | ACTS_LOSS_ONLY};
    for (int k = 0; k < 2; k++) {
        Activations a;
        cr_assert_eq(acts_alloc(&a, &f.m.cfg, B, T, modes[k], 0), ER_OK);
        if (k)
            cr_assert_eq(acts_set_loss_rows(&a, 5), ER_OK);
        model_zero_grad(&f.m);
        cr_assert_eq(model_forward(&f.m, &f.in, &a), ER_OK);
        cr_assert_eq(model_loss_scaled(&a, f.targets, f.mask, 0.25f, &loss[k]), ER_OK, "%s", er_last_error());
        cr_assert_eq(model_backward(&f.m, &f.in, &a), ER_OK, "%s", er_last_error());
        g[k] = copy(f.m.grad_mem, f.m.n_param_floats);
        acts_free(&a);
    }
    Pass plain = run_pass(&f, ACTS_TRAIN, f.mask, 0);
    cr_assert_eq(loss[0], plain.loss, "the loss is not scaled");
    cr_assert_eq(loss[1], plain.loss);
    for (size_t i = 0; i < f.m.n_param_floats; i++)
        plain.g[i] *= 0.25f;
    expect_close(g[0], plain.g, f.m.n_param_floats, HEAD_TOL, "scaled", "every gradient");
    expect_close(g[1], g[0], f.m.n_param_floats, BELOW_HEAD_TOL > HEAD_TOL ? BELOW_HEAD_TOL : HEAD_TOL,
                 "scaled, chunked", "every gradient");
    free(g[0]);
    free(g[1]);
    pass_free(&plain);
    fx_free(&f);
}

// A loss-only scoring pass (the trainer's held-out loss): the same loss as the full one, no gradient.
Test(loss_chunk, scoring_pass) {
    Fx f;
    fx_init(&f, 0, 0);
    double l[2];
    ActsMode modes[2] = {ACTS_SCORE, ACTS_SCORE | ACTS_LOSS_ONLY};
    for (int k = 0; k < 2; k++) {
        Activations a;
        cr_assert_eq(acts_alloc(&a, &f.m.cfg, B, T, modes[k], 0), ER_OK);
        if (k)
            cr_assert_eq(acts_set_loss_rows(&a, 3), ER_OK);
        cr_assert_eq(model_forward(&f.m, &f.in, &a), ER_OK);
        cr_assert_eq(model_loss(&a, f.targets, f.mask, 0, &l[k]), ER_OK, "%s", er_last_error());
        if (k) {
            double g;
            cr_assert_eq(model_loss(&a, f.targets, f.mask, 1, &g), ER_EINVAL, "a scoring pass has no backward");
            cr_assert(strstr(er_last_error(), "loss-only scoring pass"), "%s", er_last_error());
        }
        acts_free(&a);
    }
    cr_assert_eq(memcmp(&l[0], &l[1], sizeof(double)), 0, "scoring loss %.17g chunked, %.17g whole", l[1], l[0]);
    fx_free(&f);
}

// The logits are never whole: the buffer is one chunk, a->logits NULL, and the bytes drop by
// (B*T - chunk) x V floats.
Test(loss_chunk, bytes_saved) {
    // the 7B shape (Qwen2.5-7B) at 2048 positions: 110 rows of 152064 logits instead of 2048
    ModelConfig q = {.arch = ARCH_QWEN2, .C = 3584, .FF = 18944, .L = 28, .NH = 28, .NKV = 4, .HS = 128, .V = 152064,
                     .max_pos = 32768, .rope_theta = 1e6f, .eps = 1e-6f, .tied = 0, .qkv_bias = 1, .dtype = DT_F32};
    size_t rows = ACTS_LOSS_CHUNK_FLOATS / q.V;
    cr_assert_eq(rows, 110);
    ActsMode modes[3] = {ACTS_TRAIN, ACTS_TRAIN_RECOMPUTE, ACTS_SCORE};
    for (int k = 0; k < 3; k++) {
        size_t full = acts_bytes(&q, 1, 2048, modes[k]), chunked = acts_bytes(&q, 1, 2048, modes[k] | ACTS_LOSS_ONLY);
        cr_assert_eq(full - chunked, (2048 - rows) * (size_t)q.V * sizeof(float), "mode %d: %zu - %zu", k, full,
                     chunked);
    }
    // fewer rows than a chunk: every row, nothing saved; a V above the chunk: one row at a time
    cr_assert_eq(acts_bytes(&q, 1, 64, ACTS_TRAIN), acts_bytes(&q, 1, 64, ACTS_TRAIN | ACTS_LOSS_ONLY));
    q.V = (1 << 24) + 5;
    cr_assert_eq(acts_bytes(&q, 1, 4, ACTS_TRAIN) - acts_bytes(&q, 1, 4, ACTS_TRAIN | ACTS_LOSS_ONLY),
                 3 * (size_t)q.V * sizeof(float));

    ModelConfig c = tiny(0);
    Activations a;
    cr_assert_eq(acts_alloc(&a, &c, B, T, ACTS_TRAIN | ACTS_LOSS_ONLY, 0), ER_OK);
    cr_assert_null(a.logits, "a loss-only pass has no logits to read");
    cr_assert_eq(a.loss_rows, N, "a tiny V: every row in one chunk");
    cr_assert_eq(a.mode, ACTS_TRAIN);
    cr_assert_eq(acts_set_loss_rows(&a, 0), ER_EINVAL);
    cr_assert_eq(acts_set_loss_rows(&a, N + 1), ER_EINVAL, "the buffer holds %d rows", N);
    acts_free(&a);
    cr_assert_eq(acts_alloc(&a, &c, B, T, ACTS_TRAIN, 0), ER_OK);
    cr_assert_eq(acts_set_loss_rows(&a, 1), ER_EINVAL, "not a loss-only pass");
    acts_free(&a);
    cr_assert_eq(acts_alloc(&a, &c, B, 1, ACTS_DECODE | ACTS_LOSS_ONLY, 0), ER_EINVAL);
    cr_assert(strstr(er_last_error(), "decode"), "%s", er_last_error());
}

// model_backward after a loss-only forward needs model_loss with grad (the head's backward ran there).
Test(loss_chunk, backward_needs_grad_loss) {
    Fx f;
    fx_init(&f, 0, 0);
    Activations a;
    cr_assert_eq(acts_alloc(&a, &f.m.cfg, B, T, ACTS_TRAIN | ACTS_LOSS_ONLY, 0), ER_OK);
    double l;
    cr_assert_eq(model_forward(&f.m, &f.in, &a), ER_OK);
    cr_assert_eq(model_backward(&f.m, &f.in, &a), ER_EINVAL, "no loss yet");
    cr_assert(strstr(er_last_error(), "model_loss with grad"), "%s", er_last_error());
    cr_assert_eq(model_loss(&a, f.targets, f.mask, 0, &l), ER_OK);
    cr_assert_eq(model_backward(&f.m, &f.in, &a), ER_EINVAL, "a loss without grad");
    cr_assert_eq(model_loss(&a, f.targets, f.mask, 1, &l), ER_OK);
    cr_assert_eq(model_backward(&f.m, &f.in, &a), ER_OK, "%s", er_last_error());
    cr_assert_eq(model_backward(&f.m, &f.in, &a), ER_EINVAL, "the head's gradient is spent by one backward");
    // another model's backward on the pass
    Fx g;
    fx_init(&g, 0, 0);
    cr_assert_eq(model_forward(&f.m, &f.in, &a), ER_OK);
    cr_assert_eq(model_loss(&a, f.targets, f.mask, 1, &l), ER_OK);
    cr_assert_eq(model_backward(&g.m, &g.in, &a), ER_EINVAL);
    cr_assert(strstr(er_last_error(), "another model"), "%s", er_last_error());
    fx_free(&g);
    acts_free(&a);
    fx_free(&f);
}

// A negative loss weight is refused (it would make the mask's sum no divisor for the chunks), and a refused
// loss-only loss leaves nothing for model_backward to go on from.
Test(loss_chunk, negative_mask_refused) {
    Fx f;
    fx_init(&f, 0, 0);
    ActsMode modes[2] = {ACTS_TRAIN, ACTS_TRAIN | ACTS_LOSS_ONLY};
    for (int k = 0; k < 2; k++) {
        Activations a;
        cr_assert_eq(acts_alloc(&a, &f.m.cfg, B, T, modes[k], 0), ER_OK);
        cr_assert_eq(model_forward(&f.m, &f.in, &a), ER_OK);
        double l;
        cr_assert_eq(model_loss(&a, f.targets, f.mask, 1, &l), ER_OK);
        f.mask[5] = -1.0f;
        cr_assert_eq(model_loss(&a, f.targets, f.mask, 1, &l), ER_EINVAL);
        cr_assert(strstr(er_last_error(), "position 5 is negative"), "%s", er_last_error());
        f.mask[5] = 1.0f;
        if (k) // the refused loss leaves no head gradient, not the earlier loss's
            cr_assert_eq(model_backward(&f.m, &f.in, &a), ER_EINVAL);
        acts_free(&a);
    }
    fx_free(&f);
}

// A loss that is not finite is refused before the chunk that makes it adds its head gradient, so no NaN
// reaches the model's gradients (a NaN embedding reaches the last position only; the chunks before it have
// added theirs, as model.h says).
Test(loss_chunk, non_finite_loss_keeps_the_head_gradient_finite) {
    Fx f;
    fx_init(&f, 0, 0);
    f.tokens[N - 1] = 36; // no other position reads token 36
    ((float *)f.m.embed.data)[36 * f.m.cfg.C] = NAN;
    Activations a;
    cr_assert_eq(acts_alloc(&a, &f.m.cfg, B, T, ACTS_TRAIN | ACTS_LOSS_ONLY, 0), ER_OK);
    cr_assert_eq(acts_set_loss_rows(&a, 3), ER_OK);
    cr_assert_eq(model_forward(&f.m, &f.in, &a), ER_OK);
    double l;
    cr_assert_eq(model_loss(&a, f.targets, NULL, 1, &l), ER_ERANGE);
    cr_assert(strstr(er_last_error(), "not finite") && strstr(er_last_error(), "positions 12..13"), "%s",
              er_last_error());
    for (int i = 0; i < f.m.cfg.V * f.m.cfg.C; i++)
        cr_assert(isfinite(f.m.g_lm_head[i]), "head gradient %d is %g after a refused loss", i, f.m.g_lm_head[i]);
    acts_free(&a);
    fx_free(&f);
}

// An empty mask: loss 0 and zero gradients, as the unchunked op gives.
Test(loss_chunk, empty_mask) {
    Fx f;
    fx_init(&f, 1, 0);
    float zero[N] = {0};
    Pass want = run_pass(&f, ACTS_TRAIN, zero, 0), got = run_pass(&f, ACTS_TRAIN | ACTS_LOSS_ONLY, zero, 3);
    cr_assert_eq(want.loss, 0.0);
    cr_assert_eq(got.loss, 0.0);
    for (size_t i = 0; i < f.m.n_param_floats; i++)
        cr_assert_eq(got.g[i], want.g[i], "[%zu]", i);
    pass_free(&want);
    pass_free(&got);
    fx_free(&f);
}
