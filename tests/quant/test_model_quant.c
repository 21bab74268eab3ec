// Quantized models: quantize -> save -> load gives the same logits as the in-memory quantized model
// for every format (tied and untied, int8 or fp embeddings, dense-and-sparse); the loaded dir keeps its
// packed matrices mmapped; bad quantized dirs (missing scales, wrong packed size, unknown format, a group
// size that does not divide, sparse corrections off the matrix) get one clear error naming the file and
// tensor; trainable loads are refused; LoRA gradients through a quantized base match finite differences.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "core/threads.h"
#include "lora/lora.h"
#include "model/model.h"
#include "quant/quant.h"
#include "tests/common/fd.h"
#include "train/quantize.h"

// Rows of 256 and 512 where set (wide = 1): whole super-blocks, so the k-quants are what the tests get, not their
// 32-block fallbacks.
static int wide;

static ModelConfig tiny(int tied) {
    ModelConfig c = {.arch = ARCH_QWEN2, .C = 64, .FF = 128, .L = 2, .NH = 4, .NKV = 2, .HS = 16, .V = 40, .max_pos = 64,
                     .rope_theta = 10000.0f, .eps = 1e-6f, .tied = tied, .qkv_bias = 1, .dtype = DT_F32,
                     .bos_id = -1, .eos_id = 3};
    if (wide)
        c.C = 256, c.FF = 512, c.HS = 64;
    return c;
}

static char tmp[64];
static void mk_tmp(void) {
    strcpy(tmp, "/tmp/er_qmodel_XXXXXX");
    cr_assert(mkdtemp(tmp));
}
static void rm_tmp(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmp);
}
TestSuite(quant_model, .init = mk_tmp, .fini = rm_tmp);

static const int TOK[10] = {1, 5, 9, 3, 22, 17, 39, 0, 8, 30};

// Logits of a 2 x 5 pass (ACTS_SCORE) into a new buffer.
static float *logits_of(Model *m) {
    Activations a;
    cr_assert_eq(acts_alloc(&a, &m->cfg, 2, 5, ACTS_SCORE, 0), 0);
    ModelInput in = {.B = 2, .T = 5, .tokens = TOK};
    cr_assert_eq(model_forward(m, &in, &a), 0, "%s", er_last_error());
    size_t n = (size_t)10 * m->cfg.V;
    float *out = malloc(n * sizeof(float));
    memcpy(out, a.logits, n * sizeof(float));
    acts_free(&a);
    return out;
}

// The N of a test spec "SPEC+sN" (SPEC with N sparse corrections per row, --sparse N); 0 for a plain spec.
static int spec_sparse(const char *weights) {
    const char *plus = strstr(weights, "+s");
    return plus ? atoi(plus + 2) : 0;
}

// weights: a --weights spec, or "SPEC+sN" (spec_sparse).
static void quantized_model(Model *m, int tied, const char *weights, const char *emb) {
    ModelConfig c = tiny(tied);
    cr_assert_eq(model_build_random(m, &c, 0.3f, 11), 0);
    char spec[16];
    snprintf(spec, sizeof spec, "%.*s", (int)strcspn(weights, "+"), weights);
    QuantizeOptions o = {.weights = spec, .embeddings = emb, .sparse = spec_sparse(weights)};
    QuantizeReport rep;
    cr_assert_eq(quantize_model(m, &o, NULL, NULL, &rep), 0, "%s", er_last_error());
    cr_assert_eq(m->trainable, 0);
    cr_assert(rep.bits_per_weight > 0);
}

static void roundtrip(int tied, const char *weights, const char *emb) {
    threads_set(1);
    Model a, b;
    quantized_model(&a, tied, weights, emb);
    float *la = logits_of(&a);
    char dir[128];
    snprintf(dir, sizeof dir, "%s/%s_%d_%s", tmp, weights, tied, emb);
    cr_assert_eq(model_save(&a, dir, 0), 0, "%s", er_last_error());
    cr_assert_eq(model_load(&b, dir, 0), 0, "%s", er_last_error());
    cr_assert(b.quant.enabled);
    cr_assert_eq(b.layers[1].wup.fmt, a.layers[1].wup.fmt);
    cr_assert_eq(b.layers[1].wup.sparse, spec_sparse(weights), "%s: sparse corrections per row", weights);
    cr_assert_eq(b.embed.sparse + b.lm_head.sparse, 0, "%s: only the layer projections are sparse", weights);
    cr_assert_eq(b.layers[1].wup.owned, NULL, "packed matrices are used in place (mmapped)");
    cr_assert_eq(b.owned_mats, NULL, "every tensor is aligned in the file: nothing copied");
    WeightFormat ef;
    cr_assert_eq(quant_parse_embeddings(emb, &ef), ER_OK);
    cr_assert_eq(b.embed.fmt, ef);
    if (!tied)
        cr_assert_eq(b.lm_head.fmt, a.lm_head.fmt);
    cr_assert_eq(weight_bytes(&b.layers[0].wq), weight_bytes(&a.layers[0].wq));
    float *lb = logits_of(&b);
    for (int i = 0; i < 10 * a.cfg.V; i++)
        cr_assert_eq(la[i], lb[i], "%s tied=%d emb=%s: logit %d %.9g vs %.9g", weights, tied, emb, i, la[i], lb[i]);
    // saving the loaded model again gives a dir that loads to the same logits
    char dir2[160];
    snprintf(dir2, sizeof dir2, "%s/again", dir);
    cr_assert_eq(model_save(&b, dir2, 0), 0, "%s", er_last_error());
    Model c;
    cr_assert_eq(model_load(&c, dir2, 0), 0, "%s", er_last_error());
    float *lc = logits_of(&c);
    cr_assert_eq(memcmp(lb, lc, sizeof(float) * 10 * a.cfg.V), 0);
    free(la);
    free(lb);
    free(lc);
    model_free(&a);
    model_free(&b);
    model_free(&c);
}

Test(quant_model, roundtrip_every_format) {
    const char *ws[] = {"q8", "q4", "q4g32", "q4g64", "q2lut", "q4lut", "q2lut+s3", "q4lut+s1"};
    for (int i = 0; i < 8; i++)
        roundtrip(0, ws[i], "int8");
}
// The GGUF block formats and the q4_k_m mix, on rows of whole super-blocks: saved packed, loaded in place, the same
// logits; q4_k_m gives q6_k to the v and down projections of both layers (of 2, llama.cpp's use_more_bits).
Test(quant_model, roundtrip_block_formats) {
    const char *ws[] = {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q4_k_m"};
    wide = 1;
    for (int i = 0; i < (int)(sizeof ws / sizeof ws[0]); i++)
        roundtrip(0, ws[i], "q8_0");
    Model m;
    quantized_model(&m, 0, "q4_k_m", "q8_0");
    cr_expect(m.layers[0].wq.fmt == WF_Q4_K && m.layers[1].wv.fmt == WF_Q6_K && m.layers[1].wdown.fmt == WF_Q6_K &&
                  m.lm_head.fmt == WF_Q6_K,
              "q4_k_m: q %s, v %s, down %s, lm_head %s", weight_format_name(m.layers[0].wq.fmt),
              weight_format_name(m.layers[1].wv.fmt), weight_format_name(m.layers[1].wdown.fmt),
              weight_format_name(m.lm_head.fmt));
    model_free(&m);
    wide = 0;
}

Test(quant_model, roundtrip_tied_and_fp_embeddings) {
    roundtrip(1, "q4", "int8");
    roundtrip(1, "q4g32", "fp");
    roundtrip(0, "q2lut", "fp");
}

// A tied model untied (so its lm_head can be W4 while the embedding is int8) computes the same
// logits, and the untied quantized model round-trips through a dir.
Test(quant_model, untie_then_w4_lm_head) {
    threads_set(1);
    ModelConfig c = tiny(1);
    Model m;
    cr_assert_eq(model_build_random(&m, &c, 0.3f, 11), 0);
    float *l0 = logits_of(&m);
    cr_assert_eq(quantize_untie(&m), 0, "%s", er_last_error());
    cr_assert_eq(m.cfg.tied, 0);
    cr_assert(model_find_param(&m, "lm_head.weight"));
    float *l1 = logits_of(&m);
    cr_assert_eq(memcmp(l0, l1, sizeof(float) * 10 * c.V), 0, "untying changed the logits");
    QuantizeOptions o = {.weights = "q4g32", .embeddings = "int8", .lm_head = "q4"};
    QuantizeReport rep;
    cr_assert_eq(quantize_model(&m, &o, NULL, NULL, &rep), 0, "%s", er_last_error());
    cr_assert_eq(m.embed.fmt, WF_Q8);
    cr_assert_eq(m.lm_head.fmt, WF_Q4);
    float *lq = logits_of(&m);
    cr_assert_eq(model_save(&m, tmp, 0), 0, "%s", er_last_error());
    Model b;
    cr_assert_eq(model_load(&b, tmp, 0), 0, "%s", er_last_error());
    cr_assert_eq(b.cfg.tied, 0);
    cr_assert_eq(b.lm_head.fmt, WF_Q4);
    float *lb = logits_of(&b);
    cr_assert_eq(memcmp(lq, lb, sizeof(float) * 10 * c.V), 0);
    // a tied model refuses an lm_head format other than its embedding's
    Model t;
    cr_assert_eq(model_build_random(&t, &c, 0.3f, 1), 0);
    cr_assert_lt(quantize_model(&t, &o, NULL, NULL, &rep), 0);
    cr_assert(strstr(er_last_error(), "untie"), "%s", er_last_error());
    model_free(&t);
    free(l0);
    free(l1);
    free(lq);
    free(lb);
    model_free(&m);
    model_free(&b);
}

Test(quant_model, quantized_logits_close_to_float) {
    threads_set(1);
    ModelConfig c = tiny(0);
    Model f;
    cr_assert_eq(model_build_random(&f, &c, 0.3f, 11), 0);
    float *lf = logits_of(&f);
    model_free(&f);
    const char *ws[] = {"q8", "q4g32"};
    const double tol[] = {0.1, 0.5}; // random nets amplify weight noise layer by layer
    for (int k = 0; k < 2; k++) {
        Model q;
        quantized_model(&q, 0, ws[k], "int8");
        float *lq = logits_of(&q);
        double num = 0, den = 0;
        for (int i = 0; i < 10 * c.V; i++) {
            num += (lq[i] - lf[i]) * (double)(lq[i] - lf[i]);
            den += (double)lf[i] * lf[i];
        }
        cr_assert(sqrt(num / den) < tol[k], "%s: relative logit error %g", ws[k], sqrt(num / den));
        free(lq);
        model_free(&q);
    }
    free(lf);
}

Test(quant_model, trainable_load_refused) {
    Model a, b;
    quantized_model(&a, 1, "q4", "int8");
    cr_assert_eq(model_save(&a, tmp, 0), 0, "%s", er_last_error());
    model_free(&a);
    cr_assert_lt(model_load(&b, tmp, MODEL_LOAD_TRAINABLE), 0);
    cr_assert(strstr(er_last_error(), "config.json") && strstr(er_last_error(), "quantized") &&
                  strstr(er_last_error(), "LoRA"),
              "%s", er_last_error());
}

Test(quant_model, save_refuses_mismatched_formats) {
    Model a;
    quantized_model(&a, 0, "q4", "int8");
    a.quant.linear = WF_Q8; // the config now lies about the matrices
    cr_assert_lt(model_save(&a, tmp, 0), 0);
    cr_assert(strstr(er_last_error(), "q_proj"), "%s", er_last_error());
    model_free(&a);
    QuantizeOptions o = {.weights = "q4g128"};
    QuantizeReport rep;
    ModelConfig c = tiny(0);
    cr_assert_eq(model_build_random(&a, &c, 0.3f, 1), 0);
    cr_assert_lt(quantize_model(&a, &o, NULL, NULL, &rep), 0); // 128 does not divide C = 64
    cr_assert(strstr(er_last_error(), "does not divide"), "%s", er_last_error());
    o.weights = "q5";
    cr_assert_lt(quantize_model(&a, &o, NULL, NULL, &rep), 0);
    cr_assert(strstr(er_last_error(), "--weights"), "%s", er_last_error());
    model_free(&a);
}

// ---- corrupt dirs ----

// Rewrites dir/model.safetensors: drops tensor `drop`, and gives tensor `reshape` one more column.
static void rewrite(const char *dir, const char *drop, const char *reshape) {
    char *path = path_join(dir, "model.safetensors");
    StFile f;
    cr_assert_eq(safetensors_open(&f, path), 0, "%s", er_last_error());
    StWriteTensor *ts = calloc((size_t)f.n_tensors, sizeof *ts);
    void *extra = NULL;
    int n = 0;
    for (int i = 0; i < f.n_tensors; i++) {
        const StTensor *t = &f.tensors[i];
        if (drop && strcmp(t->name, drop) == 0)
            continue;
        StWriteTensor *w = &ts[n++];
        w->name = t->name;
        w->dtype = t->dtype;
        w->ndim = t->ndim;
        memcpy(w->shape, t->shape, sizeof w->shape);
        w->data = t->data;
        if (reshape && strcmp(t->name, reshape) == 0) {
            w->shape[1] += 1;
            extra = calloc((size_t)(w->shape[0] * w->shape[1]), dtype_size(t->dtype));
            w->data = extra;
        }
    }
    char *out = path_join(dir, "new.safetensors");
    cr_assert_eq(safetensors_write(out, ts, n, NULL, 0), 0, "%s", er_last_error());
    safetensors_close(&f);
    cr_assert_eq(rename(out, path), 0);
    free(ts);
    free(extra);
    free(path);
    free(out);
}

static void set_config(const char *dir, const char *key, const char *value, int number) {
    char *path = path_join(dir, "config.json");
    cJSON *j;
    cr_assert_eq(json_parse_file(path, 1 << 20, &j), 0);
    cJSON *q = cJSON_GetObjectItemCaseSensitive(j, "quantization_config");
    cJSON_DeleteItemFromObject(q, key);
    if (number)
        cJSON_AddNumberToObject(q, key, atof(value));
    else
        cJSON_AddStringToObject(q, key, value);
    cr_assert_eq(json_write_file(path, j), 0);
    cJSON_Delete(j);
    free(path);
}

static void expect_refused(const char *dir, const char *a, const char *b) {
    Model m;
    cr_assert_lt(model_load(&m, dir, 0), 0, "a bad dir loaded");
    const char *e = er_last_error();
    cr_assert(strstr(e, a) && (!b || strstr(e, b)), "error \"%s\" should mention \"%s\" and \"%s\"", e, a, b ? b : "");
}

static char *fresh(const char *name, const char *weights) {
    Model a;
    quantized_model(&a, 0, weights, "int8");
    char *dir = path_join(tmp, name);
    cr_assert_eq(model_save(&a, dir, 0), 0, "%s", er_last_error());
    model_free(&a);
    return dir;
}

Test(quant_model, missing_scale_tensor) {
    char *d = fresh("a", "q4");
    rewrite(d, "model.layers.1.mlp.up_proj.weight_scale", NULL);
    expect_refused(d, "model.layers.1.mlp.up_proj.weight_scale", "missing");
    free(d);
    d = fresh("b", "q4g32");
    rewrite(d, "model.layers.0.self_attn.k_proj.weight_zero", NULL);
    expect_refused(d, "model.layers.0.self_attn.k_proj.weight_zero", "missing");
    free(d);
    d = fresh("c", "q2lut");
    rewrite(d, "model.layers.0.mlp.gate_proj.weight_codebook", NULL);
    expect_refused(d, "model.layers.0.mlp.gate_proj.weight_codebook", "missing");
    free(d);
    d = fresh("c2", "q2lut");
    rewrite(d, "lm_head.weight_scale", NULL); // the lm_head of a q2lut model is q4
    expect_refused(d, "lm_head.weight_scale", "missing");
    free(d);
    d = fresh("d", "q8");
    rewrite(d, "model.embed_tokens.weight_scale", NULL);
    expect_refused(d, "model.embed_tokens.weight_scale", "missing");
    free(d);
    d = fresh("e", "q2lut+s2");
    rewrite(d, "model.layers.1.self_attn.v_proj.weight_sparse_values", NULL);
    expect_refused(d, "model.layers.1.self_attn.v_proj.weight_sparse_values", "missing");
    free(d);
}

Test(quant_model, wrong_packed_size) {
    char *d = fresh("a", "q4");
    rewrite(d, NULL, "model.layers.0.mlp.down_proj.weight");
    expect_refused(d, "model.layers.0.mlp.down_proj.weight", "U8 [64,64]");
    free(d);
    d = fresh("b", "q4g32");
    rewrite(d, NULL, "model.layers.1.mlp.gate_proj.weight_scale");
    expect_refused(d, "model.layers.1.mlp.gate_proj.weight_scale", "F16 [128,2]");
    free(d);
}

Test(quant_model, bad_quantization_config) {
    char *d = fresh("a", "q4");
    set_config(d, "weights", "q3", 0);
    expect_refused(d, "config.json", "\"q3\"");
    free(d);
    d = fresh("b", "q4g32");
    set_config(d, "weights", "q4g128", 0);
    set_config(d, "group_size", "128", 1);
    set_config(d, "lm_head", "q4g128", 0);
    expect_refused(d, "group_size 128 does not divide", "model.layers.0.self_attn.q_proj.weight");
    free(d);
    d = fresh("c", "q4g32");
    set_config(d, "group_size", "64", 1);
    expect_refused(d, "config.json", "group_size");
    free(d);
    d = fresh("e", "q4");
    set_config(d, "embeddings", "int4", 0);
    expect_refused(d, "config.json", "embeddings");
    free(d);
    d = fresh("f", "q4");
    set_config(d, "weights", "q8", 0); // the packed tensors are q4
    set_config(d, "lm_head", "q8", 0);
    expect_refused(d, "model.safetensors", "I8");
    free(d);
    // Another tool's packing, and transforms this runtime does not know, were accepted silently.
    d = fresh("g", "q4");
    set_config(d, "quant_method", "gptq", 0);
    expect_refused(d, "quant_method \"gptq\"", "not supported");
    free(d);
    d = fresh("h", "q4");
    set_config(d, "transforms", "quarot", 0);
    expect_refused(d, "transforms \"quarot\"", "not known");
    free(d);
    // Sparse corrections: only with codebook weights; a count the tensors do not have.
    d = fresh("i", "q4");
    set_config(d, "sparse_per_row", "2", 1);
    expect_refused(d, "config.json", "sparse_per_row 2");
    free(d);
    d = fresh("j", "q2lut+s2");
    set_config(d, "sparse_per_row", "3", 1);
    expect_refused(d, "weight_sparse_cols", "U16 [64,3]");
    free(d);
    d = fresh("k", "q2lut+s2");
    set_config(d, "sparse_per_row", "65", 1); // more than the 64 columns of q_proj
    expect_refused(d, "sparse_per_row 65 does not suit", "model.layers.0.self_attn.q_proj.weight");
    free(d);
    d = fresh("l", "q2lut+s2");
    set_config(d, "sparse_per_row", "0", 1); // the corrections would be dropped without a word
    expect_refused(d, "model.layers.0.self_attn.q_proj.weight_sparse_cols", "no sparse_per_row");
    free(d);
}

// Scales that are negative or not finite are refused at load, naming the tensor and the row.
Test(quant_model, bad_scales) {
    const char *fmts[] = {"q4", "q8", "q4g32"};
    for (int k = 0; k < 3; k++)
        for (int nan = 0; nan < 2; nan++) {
            Model a;
            quantized_model(&a, 0, fmts[k], "int8");
            Weight *w = &a.layers[1].wdown;
            if (w->fmt == WF_Q4G)
                ((uint16_t *)w->gscale)[5] = nan ? 0x7E00 : 0xBC00; // NaN, -1.0 in fp16
            else
                ((float *)w->scale)[5] = nan ? NAN : -0.5f;
            char name[32];
            snprintf(name, sizeof name, "s%d%d", k, nan);
            char *dir = path_join(tmp, name);
            cr_assert_eq(model_save(&a, dir, 0), 0, "%s", er_last_error());
            model_free(&a);
            expect_refused(dir, "model.layers.1.mlp.down_proj.weight_scale", nan ? "nan at index 5" : "negative scale");
            free(dir);
        }
}

// Sparse corrections at a column the matrix does not have, or not finite: refused at load, naming the
// tensor and the index.
Test(quant_model, bad_sparse_corrections) {
    for (int nan = 0; nan < 2; nan++) {
        Model a;
        quantized_model(&a, 0, "q2lut+s2", "int8");
        Weight *w = &a.layers[1].wdown;
        if (nan)
            ((uint16_t *)w->sp_vals)[3] = 0x7E00;
        else
            ((uint16_t *)w->sp_cols)[5] = (uint16_t)w->cols;
        char *dir = path_join(tmp, nan ? "nan" : "col");
        cr_assert_eq(model_save(&a, dir, 0), 0, "%s", er_last_error());
        model_free(&a);
        if (nan)
            expect_refused(dir, "model.layers.1.mlp.down_proj.weight_sparse_values", "nan at index 3");
        else
            expect_refused(dir, "model.layers.1.mlp.down_proj.weight_sparse_cols", "column 128 at index 5");
        free(dir);
    }
}

// ---- LoRA on a quantized base ----

static double loss_of(Model *m, const ModelInput *in, Activations *a, const int *targets, int grad) {
    double L;
    cr_assert_eq(model_forward(m, in, a), 0);
    cr_assert_eq(model_loss(a, targets, NULL, grad, &L), 0);
    return L;
}

Test(quant_model, lora_gradients_through_quantized_base) {
    threads_set(1);
    const char *ws[] = {"q4g32", "q2lut", "q4lut", "q4_k_m"}; // q4_k_m at rows of 256: q4_K and q6_K
    for (int wi = 0; wi < 4; wi++) {
        Model m;
        wide = wi == 3;
        quantized_model(&m, 1, ws[wi], wide ? "q8_0" : "int8");
        wide = 0;
        ModelConfig c = m.cfg;
        LoraShape s = model_config_lora_shape(&c);
        LoraAdapter ad;
        cr_assert_eq(lora_init(&ad, &s, 2, 4.0f, 0, 0.0f, LORA_ALL_TARGETS, 1, 9), 0);
        ErRng r;
        rng_seed(&r, 4);
        for (size_t i = 0; i < ad.n_params; i++)
            ad.params[i] += 0.05f * rng_normal(&r);
        Activations a;
        cr_assert_eq(acts_alloc(&a, &c, 2, 5, ACTS_TRAIN, 0), 0);
        int targets[10];
        uint8_t amask[10];
        for (int i = 0; i < 10; i++) {
            targets[i] = (i * 7 + 2) % c.V;
            amask[i] = i % 5 >= 2;
        }
        ModelInput in = {.B = 2, .T = 5, .tokens = TOK, .adapter = &ad, .adapter_mask = amask};
        lora_zero_grad(&ad);
        loss_of(&m, &in, &a, targets, 1);
        cr_assert_eq(model_backward(&m, &in, &a), 0, "%s", er_last_error());
        // the largest-gradient entry of A and of B in the first layer's q and down, and the last layer's v
        int checks[3][2] = {{0, LT_Q}, {0, LT_DOWN}, {1, LT_V}};
        for (int ci = 0; ci < 3; ci++) {
            LoraMat *lm = &ad.mats[checks[ci][0] * LT_COUNT + checks[ci][1]];
            float *ps[2] = {lm->A, lm->B}, *gs[2] = {lm->gA, lm->gB};
            size_t ns[2] = {(size_t)ad.r * lm->in, (size_t)lm->out * ad.r};
            for (int k = 0; k < 2; k++) {
                size_t best = fd_argmax_abs(gs[k], ns[k]);
                float w0 = ps[k][best];
                const double h = wi == 3 ? 1e-2 : 1e-3; // the wide model's loss moves less per step: a longer one
                ps[k][best] = w0 + (float)h;
                double lp = loss_of(&m, &in, &a, targets, 0);
                ps[k][best] = w0 - (float)h;
                double lm_ = loss_of(&m, &in, &a, targets, 0);
                ps[k][best] = w0;
                double fd = (lp - lm_) / (2 * h), an = gs[k][best];
                cr_assert(fabs(an) > 1e-6, "%s: zero gradient", ws[wi]);
                cr_assert(fabs(fd - an) <= 1e-2 * fabs(an) + 2e-5, "%s check %d %s: fd %.7g vs analytic %.7g", ws[wi],
                          ci, k ? "B" : "A", fd, an);
            }
        }
        acts_free(&a);
        lora_free(&ad);
        model_free(&m);
    }
}

// A model tiled for the decode kernels (model_tile_for_decode): the tied lm_head follows its embedding, the
// logits of a GEMM-sized pass (rows read back through weight_packed_row) are the untiled model's bit for bit,
// and model_save refuses it.
Test(quant_model, tiled_for_decode) {
    threads_set(1);
    ModelConfig c = tiny(1);
    c.V = 48; // every matrix whole 16-row tiles, the tied int8 embedding too
    Model a, b, d;
    cr_assert_eq(model_build_random(&a, &c, 0.3f, 11), 0);
    QuantizeOptions o = {.weights = "q4", .embeddings = "int8"};
    QuantizeReport rep;
    cr_assert_eq(quantize_model(&a, &o, NULL, NULL, &rep), 0, "%s", er_last_error());
    char dir[128], dir2[160];
    snprintf(dir, sizeof dir, "%s/tiled", tmp);
    snprintf(dir2, sizeof dir2, "%s/again", dir);
    cr_assert_eq(model_save(&a, dir, 0), 0, "%s", er_last_error());
    cr_assert_eq(model_load(&b, dir, 0), 0, "%s", er_last_error());
    cr_assert_eq(model_load(&d, dir, 0), 0, "%s", er_last_error());
    size_t released = 1;
    cr_assert_eq(model_tile_for_decode(&d, &released, NULL, NULL), 0, "%s", er_last_error());
    if (!d.layers[0].wq.tiled) {
        printf("quant_model: NOTE: this build has no tiled decode kernels (%s): tiling left the model as it was\n",
               quant_simd_name());
        cr_assert(!d.embed.tiled && !d.layers[1].wdown.tiled && released == 0);
    } else {
        cr_assert(d.layers[1].wdown.tiled && d.embed.tiled && d.lm_head.tiled && d.lm_head.data == d.embed.data);
        // the mapped file's matrices were copied: every layer projection and the embedding's rows released
        cr_assert_geq(released, weight_bytes(&d.layers[0].wq) + (size_t)c.V * c.C, "%zu", released);
        float *lb = logits_of(&b), *ld = logits_of(&d);
        cr_assert_eq(memcmp(lb, ld, sizeof(float) * 10 * c.V), 0, "tiling changed the GEMM path's logits");
        cr_assert_lt(model_save(&d, dir2, 0), 0);
        cr_assert(strstr(er_last_error(), "tiled"), "%s", er_last_error());
        free(lb);
        free(ld);
    }
    model_free(&a);
    model_free(&b);
    model_free(&d);
}

// Once tiling releases file pages, a matrix it cannot tile (here the embedding: 40 rows, no whole 16-row tiles) is
// copied out of the file's mapping too (model_tile_for_decode), and the logits stay the untiled model's.
Test(quant_model, tiled_for_decode_copies_the_rest) {
    threads_set(1);
    ModelConfig c = tiny(1);
    c.V = 40;
    Model a, b, d;
    cr_assert_eq(model_build_random(&a, &c, 0.3f, 12), 0);
    QuantizeOptions o = {.weights = "q4", .embeddings = "int8"};
    QuantizeReport rep;
    cr_assert_eq(quantize_model(&a, &o, NULL, NULL, &rep), 0, "%s", er_last_error());
    char dir[128];
    snprintf(dir, sizeof dir, "%s/tiled-rest", tmp);
    cr_assert_eq(model_save(&a, dir, 0), 0, "%s", er_last_error());
    cr_assert_eq(model_load(&b, dir, 0), 0, "%s", er_last_error());
    cr_assert_eq(model_load(&d, dir, 0), 0, "%s", er_last_error());
    cr_assert(!d.embed.owned, "the embedding is read in place from the file");
    size_t released = 0;
    cr_assert_eq(model_tile_for_decode(&d, &released, NULL, NULL), 0, "%s", er_last_error());
    if (!d.layers[0].wq.tiled) {
        printf("quant_model: NOTE: this build has no tiled decode kernels (%s): nothing released, nothing copied\n",
               quant_simd_name());
        cr_assert(released == 0 && !d.embed.owned);
    } else {
        cr_assert(!d.embed.tiled && d.embed.owned, "the untiled embedding was left in the file's mapping");
        cr_assert_geq(released, weight_row_bytes(d.embed.fmt, c.C) * (size_t)c.V, "%zu", released);
        float *lb = logits_of(&b), *ld = logits_of(&d);
        cr_assert_eq(memcmp(lb, ld, sizeof(float) * 10 * c.V), 0, "the copies changed the logits");
        free(lb);
        free(ld);
    }
    model_free(&a);
    model_free(&b);
    model_free(&d);
}
