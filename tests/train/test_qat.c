// Quantization-aware training (train/qat.h): the fake-quantized weights the forward sees, the STE
// gradient (the gradient at Q(W), checked by finite differences through the dequantized model), the
// codebook refresh every K steps, a tiny QAT run beating plain q2lut quantization of the same float
// model, resume, and `ertrain qat` end to end with its bad flags.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/dtype.h"
#include "core/json.h"
#include "core/rng.h"
#include "core/threads.h"
#include "data/synth.h"
#include "quant/quantizer.h"
#include "tests/common/helpers.h"
#include "tests/common/fd.h"
#include "train/qat.h"
#include "train/quantize.h"

// ---- the fake-quantization step and its gradient ----

typedef struct {
    Model m;
    float *master;
    QatState *s;
    Activations a;
    ModelInput in;
    int tokens[2 * 6], targets[2 * 6];
} Fix;

static void fix_init(Fix *f, int K) {
    threads_set(1);
    ModelConfig c = {.arch = ARCH_QWEN2, .C = 16, .FF = 24, .L = 2, .NH = 4, .NKV = 2, .HS = 6, .V = 13,
                     .max_pos = 64, .rope_theta = 10000.0f, .eps = 1e-6f, .tied = 0, .qkv_bias = 1,
                     .dtype = DT_F32, .bos_id = -1, .eos_id = -1};
    cr_assert_eq(model_build_random(&f->m, &c, 0.3f, 5), 0, "%s", er_last_error());
    f->master = malloc(f->m.n_param_floats * sizeof(float));
    memcpy(f->master, f->m.param_mem, f->m.n_param_floats * sizeof(float));
    QuantizeOptions o = {.weights = "q2lut", .embeddings = "int8"};
    cr_assert_eq(qat_state_init(&f->s, &f->m, f->master, &o, NULL, K), 0, "%s", er_last_error());
    cr_assert_eq(acts_alloc(&f->a, &c, 2, 6, ACTS_TRAIN, 0), 0);
    for (int i = 0; i < 12; i++) {
        f->tokens[i] = (i * 5 + 1) % c.V;
        f->targets[i] = (i * 7 + 3) % c.V;
    }
    f->in = (ModelInput){.B = 2, .T = 6, .tokens = f->tokens};
}

static void fix_free(Fix *f) {
    qat_state_free(f->s);
    acts_free(&f->a);
    model_free(&f->m);
    free(f->master);
}

static double loss_of(Fix *f) {
    double L;
    cr_assert_eq(model_forward(&f->m, &f->in, &f->a), 0);
    cr_assert_eq(model_loss(&f->a, f->targets, NULL, 0, &L), 0);
    return L;
}

static double loss_cb(void *f) { return loss_of(f); }

static void grad_of(Fix *f) {
    double L;
    model_zero_grad(&f->m);
    cr_assert_eq(model_forward(&f->m, &f->in, &f->a), 0);
    cr_assert_eq(model_loss(&f->a, f->targets, NULL, 1, &L), 0);
    cr_assert_eq(model_backward(&f->m, &f->in, &f->a), 0);
}

Test(qat, forward_sees_fake_quantized_weights) {
    Fix f;
    fix_init(&f, 1);
    cr_assert_eq(qat_state_apply(f.s, 0), 0, "%s", er_last_error());
    float *want = malloc(f.m.n_param_floats * sizeof(float)), lv[17];
    for (int i = 0; i < f.m.n_params; i++) {
        const ParamTensor *p = &f.m.params[i];
        size_t off = (size_t)(p->data - f.m.param_mem);
        int R = (int)p->shape[0], C = p->ndim == 2 ? (int)p->shape[1] : 0;
        if (p->ndim != 2) { // vectors as they are
            cr_assert_eq(memcmp(p->data, f.master + off, p->numel * sizeof(float)), 0, "%s", p->name);
            continue;
        }
        QuantOptions o;
        int is_layer = strstr(p->name, "layers.") != NULL;
        quant_options_default(&o, is_layer ? WF_Q2LUT : strstr(p->name, "embed") ? WF_Q8 : WF_Q4, 0);
        cr_assert_eq(quant_fake_quant_rows(want, f.master + off, R, C, NULL, &o), 0);
        cr_assert_eq(memcmp(p->data, want, p->numel * sizeof(float)), 0, "%s: not quantize-then-dequantize", p->name);
        if (is_layer)
            for (int r = 0; r < R; r++)
                cr_assert_leq(helper_distinct(p->data + (size_t)r * C, C, lv, 16), 4, "%s row %d", p->name, r);
        cr_assert_neq(memcmp(p->data, f.master + off, p->numel * sizeof(float)), 0, "%s unchanged", p->name);
    }
    free(want);
    fix_free(&f);
}

// With importances, the uniform formats' fake quantization is the weighted quantizer the saved model
// gets (quantize_model with the same importances), not the unweighted one.
Test(qat, uniform_fake_quant_uses_the_importance) {
    Model m;
    ModelConfig c = {.arch = ARCH_QWEN2, .C = 16, .FF = 24, .L = 1, .NH = 4, .NKV = 2, .HS = 6, .V = 13,
                     .max_pos = 64, .rope_theta = 10000.0f, .eps = 1e-6f, .qkv_bias = 1, .dtype = DT_F32,
                     .bos_id = -1, .eos_id = -1};
    cr_assert_eq(model_build_random(&m, &c, 0.3f, 6), 0, "%s", er_last_error());
    float *master = malloc(m.n_param_floats * sizeof(float)), *imem = malloc(m.n_param_floats * sizeof(float));
    const float **imp = malloc(sizeof(float *) * m.n_params);
    memcpy(master, m.param_mem, m.n_param_floats * sizeof(float));
    ErRng r;
    rng_seed(&r, 3);
    for (size_t i = 0; i < m.n_param_floats; i++)
        imem[i] = (float)(0.01 + rng_uniform(&r) * rng_uniform(&r) * 10);
    for (int i = 0; i < m.n_params; i++)
        imp[i] = imem + (m.params[i].data - m.param_mem);
    QuantizeOptions o = {.weights = "q4", .embeddings = "int8"};
    QatState *s;
    cr_assert_eq(qat_state_init(&s, &m, master, &o, imp, 1), 0, "%s", er_last_error());
    cr_assert_eq(qat_state_apply(s, 0), 0, "%s", er_last_error());
    const ParamTensor *p = model_find_param(&m, "model.layers.0.mlp.down_proj.weight");
    size_t off = (size_t)(p->data - m.param_mem);
    int R = (int)p->shape[0], C = (int)p->shape[1];
    float *want = malloc(sizeof(float) * p->numel), *plain = malloc(sizeof(float) * p->numel);
    QuantOptions qo;
    quant_options_default(&qo, WF_Q4, 0);
    cr_assert_eq(quant_fake_quant_rows(want, master + off, R, C, imp[p - m.params], &qo), 0);
    cr_assert_eq(quant_fake_quant_rows(plain, master + off, R, C, NULL, &qo), 0);
    cr_assert_neq(memcmp(want, plain, sizeof(float) * p->numel), 0, "the importances changed nothing: no test");
    cr_assert_eq(memcmp(p->data, want, sizeof(float) * p->numel), 0, "qat's fake quantization is not the weighted one");
    qat_state_free(s);
    free(master), free(imem), free(imp), free(want), free(plain);
    model_free(&m);
}

Test(qat, ste_gradient_is_the_gradient_at_the_dequantized_weights) {
    Fix f;
    fix_init(&f, 1);
    size_t n = f.m.n_param_floats;
    // The gradient at the float weights, for contrast.
    grad_of(&f);
    float *g_fp = malloc(n * sizeof(float));
    memcpy(g_fp, f.m.grad_mem, n * sizeof(float));
    cr_assert_eq(qat_state_apply(f.s, 0), 0);
    grad_of(&f); // what QAT hands AdamW for the masters
    double dd = 0, gg = 0;
    for (size_t i = 0; i < n; i++) {
        dd += ((double)f.m.grad_mem[i] - g_fp[i]) * ((double)f.m.grad_mem[i] - g_fp[i]);
        gg += (double)f.m.grad_mem[i] * f.m.grad_mem[i];
    }
    cr_assert(sqrt(dd / gg) > 0.05, "the gradient at Q(W) is barely that at W (%g): the test would not tell", sqrt(dd / gg));

    // Finite differences through the dequantized model (the weights the forward read).
    fd_check_model(&f.m, 3, loss_cb, &f, "STE");
    free(g_fp);
    fix_free(&f);
}

Test(qat, codebooks_every_k_steps_assignments_every_step) {
    Fix f;
    fix_init(&f, 3);
    const ParamTensor *p = model_find_param(&f.m, "model.layers.0.mlp.up_proj.weight");
    cr_assert(p);
    int R = (int)p->shape[0], C = (int)p->shape[1];
    size_t off = (size_t)(p->data - f.m.param_mem);
    cr_assert_eq(qat_state_apply(f.s, 0), 0);
    float *lv0 = malloc(sizeof(float) * 17 * R), lv[17];
    for (int r = 0; r < R; r++)
        cr_assert_leq(helper_distinct(p->data + (size_t)r * C, C, lv0 + 17 * r, 16), 4);
    // Move the masters: steps 1 and 2 keep the step-0 codebooks, with new assignments.
    ErRng rng;
    rng_seed(&rng, 9);
    for (size_t i = 0; i < p->numel; i++)
        f.master[off + i] += 0.2f * rng_normal(&rng);
    float *before = malloc(p->numel * sizeof(float));
    memcpy(before, p->data, p->numel * sizeof(float));
    cr_assert_eq(qat_state_apply(f.s, 1), 0);
    cr_assert_neq(memcmp(before, p->data, p->numel * sizeof(float)), 0, "assignments did not follow the masters");
    for (int r = 0; r < R; r++) {
        int m = helper_distinct(p->data + (size_t)r * C, C, lv, 16);
        for (int j = 0; j < m; j++) {
            int found = 0;
            for (int i = 0; i < 4; i++)
                found |= lv[j] == lv0[17 * r + i];
            cr_assert(found, "row %d: level %g is not one of the step-0 codebook", r, lv[j]);
        }
    }
    // Step 3 re-clusters: exactly a fresh quantize-then-dequantize of the current masters.
    cr_assert_eq(qat_state_apply(f.s, 3), 0);
    QuantOptions o;
    quant_options_default(&o, WF_Q2LUT, 0);
    float *want = malloc(p->numel * sizeof(float));
    cr_assert_eq(quant_fake_quant_rows(want, f.master + off, R, C, NULL, &o), 0);
    cr_assert_eq(memcmp(want, p->data, p->numel * sizeof(float)), 0);
    free(want);
    free(before);
    free(lv0);
    fix_free(&f);
}

// ---- runs ----

typedef struct {
    char *root, *fp, *data;
} Runs;

static Runs rx;

static char *join(const char *a, const char *b) {
    char *p = path_join(a, b);
    cr_assert(p);
    return p;
}

// A tiny random model pretrained on chains (direct answers), as a float model dir.
static void runs_setup_steps(int steps) {
    rx.root = helper_tmpdir("er_qat_");
    rx.data = join(rx.root, "chains.jsonl");
    ChainsConfig cc;
    chains_config_default(&cc);
    cc.max_steps = 3;
    cr_assert_eq(chains_write_jsonl(&cc, 48, 11, rx.data, NULL, NULL), 0, "%s", er_last_error());
    char *cfg = join(rx.root, "config.json");
    Tokenizer *tok;
    cr_assert_eq(tok_load(&tok, "data/tiny_tokenizer"), 0);
    ModelConfig mc = helper_tiny_config(tok_vocab_size(tok), 256);
    tok_free(tok);
    cJSON *cj = model_config_to_json(&mc);
    cr_assert_eq(json_write_file(cfg, cj), 0);
    cJSON_Delete(cj);
    rx.fp = join(rx.root, "fp");
    TrainConfig c;
    train_config_default(&c, TRAIN_PRETRAIN);
    c.config_path = cfg;
    c.tokenizer_path = "data/tiny_tokenizer";
    c.data_path = rx.data;
    c.out_dir = rx.fp;
    c.response_key = "direct";
    c.steps = steps;
    c.batch = 8;
    c.lr = 1e-2;
    c.eval_split = 0;
    c.seq_len = 128;
    c.threads = 1;
    cr_assert_eq(train_pretrain(&c, NULL), 0, "%s", er_last_error());
    er_free(cfg);
}

static void runs_setup(void) { runs_setup_steps(20); }
// Trained close to convergence, so that further float training would gain little: what QAT recovers
// is the quantization loss, not extra training.
static void runs_setup_long(void) { runs_setup_steps(200); }

static void runs_teardown(void) {
    helper_rmdir(rx.root);
    er_free(rx.root);
    er_free(rx.fp);
    er_free(rx.data);
}

static QatConfig qat_config(const char *out, int steps) {
    QatConfig q;
    memset(&q, 0, sizeof q);
    train_config_default(&q.train, TRAIN_QAT);
    q.train.model_dir = rx.fp;
    q.train.data_path = rx.data;
    q.train.out_dir = out;
    q.train.response_key = "direct";
    q.train.steps = steps;
    q.train.batch = 8;
    q.train.lr = 1e-3;
    q.train.warmup = 0;
    q.train.eval_split = 0;
    q.train.seq_len = 128;
    q.train.threads = 1;
    q.q.weights = "q2lut";
    q.q.embeddings = "int8";
    q.recluster_every = 2;

    return q;
}

static double dir_nll(const char *dir) {
    Model m;
    cr_assert_eq(model_load(&m, dir, 0), 0, "%s", er_last_error());
    double nll;
    int n;
    cr_assert_eq(quantize_data_nll(&m, dir, rx.data, "direct", 48, 128, &nll, &n), 0, "%s", er_last_error());
    cr_assert_eq(n, 48);
    model_free(&m);
    return nll;
}

Test(qat_run, lowers_the_loss_of_the_q2lut_model, .init = runs_setup_long, .fini = runs_teardown, .timeout = 60) {
    char *plain = join(rx.root, "q2lut"), *qat = join(rx.root, "qat");
    QuantizeConfig qc = {.model_dir = rx.fp, .out_dir = plain, .q = {.weights = "q2lut", .embeddings = "int8"},
                         .calib_n = 16, .seq_len = 128, .threads = 1}; // .log NULL: quiet
    cr_assert_eq(quantize_run(&qc, NULL), 0, "%s", er_last_error());
    QatConfig q = qat_config(qat, 60);
    q.recluster_every = 1;
    TrainResult res;
    cr_assert_eq(qat_run(&q, &res), 0, "%s", er_last_error());
    double n_fp = dir_nll(rx.fp), n_plain = dir_nll(plain), n_qat = dir_nll(qat);
    cr_log_info("NLL on the training records: fp %.4f, q2lut %.4f, q2lut + QAT %.4f", n_fp, n_plain, n_qat);
    cr_assert_lt(n_fp, n_plain, "2-bit quantization should cost something (fp %.4f, q2lut %.4f)", n_fp, n_plain);
    // QAT recovers a good part of what quantization lost.
    cr_assert_lt(n_qat - n_fp, 0.5 * (n_plain - n_fp), "QAT %.4f did not beat plain q2lut %.4f (fp %.4f)", n_qat,
                 n_plain, n_fp);
    // The output is what ertrain quantize writes, method marked.
    Model m;
    cr_assert_eq(model_load(&m, qat, 0), 0, "%s", er_last_error());
    cr_assert_eq(m.layers[1].wdown.fmt, WF_Q2LUT);
    cr_assert_eq(m.embed.fmt, WF_Q8);
    cr_assert_str_eq(m.quant.method, "kmeans-fisher-qat");
    model_free(&m);
    er_free(plain);
    er_free(qat);
}

static char *read_all(const char *dir, const char *name) {
    char *p = join(dir, name), *d;
    size_t n;
    cr_assert_eq(file_read_all(p, 64u << 20, &d, &n), 0, "%s", er_last_error());
    er_free(p);
    return d;
}

Test(qat_run, resume_equals_uninterrupted, .init = runs_setup, .fini = runs_teardown, .timeout = 60) {
    char *a = join(rx.root, "a"), *b = join(rx.root, "b");
    QatConfig q = qat_config(a, 6);
    q.train.save_every = 2;
    q.train.eval_split = 0.1;
    cr_assert_eq(qat_run(&q, NULL), 0, "%s", er_last_error());
    q.train.out_dir = b;
    q.train.stop_after = 3; // killed after step 3: the checkpoint is at step 2, a multiple of K
    cr_assert_eq(qat_run(&q, NULL), 0, "%s", er_last_error());
    q.train.stop_after = 0;
    q.train.resume = 1;
    cr_assert_eq(qat_run(&q, NULL), 0, "%s", er_last_error());
    char *ma = read_all(a, "model.safetensors"), *mb = read_all(b, "model.safetensors");
    char *la = read_all(a, "metrics.jsonl"), *lb = read_all(b, "metrics.jsonl");
    cr_assert_str_eq(ma, mb);
    cr_assert_eq(helper_count_lines(la), 6);
    cr_assert_eq(helper_count_lines(lb), 6);
    er_free(ma);
    er_free(mb);
    er_free(la);
    er_free(lb);
    // --save-every must be a multiple of --recluster-every.
    q.train.out_dir = join(rx.root, "c");
    q.train.resume = 0;
    q.train.save_every = 3;
    cr_assert_lt(qat_run(&q, NULL), 0);
    cr_assert(strstr(er_last_error(), "--save-every 3 must be a multiple of --recluster-every 2"), "%s", er_last_error());
    cr_assert(!path_exists(q.train.out_dir));
    er_free((char *)q.train.out_dir);
    er_free(a);
    er_free(b);
}

Test(qat_cli, end_to_end_and_bad_flags, .init = runs_setup, .fini = runs_teardown, .timeout = 60) {
    char *ertrain = helper_program("ertrain");
    helper_need_program(ertrain, "ertrain", "ertrain qat CLI tests");
    char *out = join(rx.root, "cli");
    CmdResult r = helper_run(rx.root,
                             "'%s' qat --model '%s' --data '%s' --out '%s' --weights q2lut --response-key direct "
                             "--steps 4 --batch 4 --seq-len 128 --eval-split 0.1 --recluster-every 2 --threads 1",
                             ertrain, rx.fp, rx.data, out);
    cr_assert_eq(r.status, 0, "qat failed: %s", r.err);
    cr_assert(strstr(r.out, "qat: 4 steps, final train loss"), "%s", r.out);
    cr_assert(strstr(r.out, "layer   1"), "per-layer errors of the export expected: %s", r.out);
    helper_result_free(&r);
    char *txt = read_all(out, "config.json");
    cJSON *cfg = cJSON_Parse(txt);
    const cJSON *qc = cJSON_GetObjectItemCaseSensitive(cfg, "quantization_config");
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(qc, "weights")->valuestring, "q2lut");
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(qc, "method")->valuestring, "kmeans-fisher-qat");
    cJSON_Delete(cfg);
    er_free(txt);
    txt = read_all(out, "run.json");
    cJSON *run = cJSON_Parse(txt);
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(run, "command")->valuestring, "qat");
    const cJSON *rc = cJSON_GetObjectItemCaseSensitive(run, "config");
    cr_assert_eq(cJSON_GetObjectItemCaseSensitive(rc, "recluster_every")->valueint, 2);
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(rc, "weights")->valuestring, "q2lut");
    const cJSON *mi = cJSON_GetObjectItemCaseSensitive(run, "model");
    cr_assert(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(mi, "quantization_config")));
    cr_assert(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(mi, "quantization"), "bits_per_weight"));
    cJSON_Delete(run);
    er_free(txt);
    txt = read_all(out, "metrics.jsonl");
    cr_assert_eq(helper_count_lines(txt), 4);
    cr_assert(strstr(txt, "\"eval_loss\""));
    er_free(txt);
    Model m;
    cr_assert_eq(model_load(&m, out, 0), 0, "%s", er_last_error());
    model_free(&m);
    r = helper_run(rx.root, "'%s' qat --help", ertrain);
    cr_assert_eq(r.status, 0);
    cr_assert(strstr(r.out, "--recluster-every"));
    helper_result_free(&r);

    // Bad flags: one line on stderr, exit 1, nothing written.
    char *bad = join(rx.root, "bad");
    struct {
        const char *flags, *expect;
    } cases[] = {
        {"--weights q3", "--weights \"q3\""},
        {"--weights bf16", "--weights \"bf16\""},
        {"--weights q2lut --recluster-every 0", "--recluster-every"},
        {"--weights q2lut --save-every 3", "multiple of --recluster-every"},
        {"--weights q2lut --transforms spin", "--transforms \"spin\""},
        {"--weights q2lut --embeddings fp16", "--embeddings \"fp16\""},
        {"--weights q2lut --lr -1", "--lr"},
        {"--steps 2", "--weights"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        r = helper_run(rx.root, "'%s' qat --model '%s' --data '%s' --out '%s' --steps 2 --threads 1 %s", ertrain, rx.fp,
                       rx.data, bad, cases[i].flags);
        cr_assert_eq(r.status, 1, "%s: exit %d", cases[i].flags, r.status);
        cr_assert(strstr(r.err, cases[i].expect), "%s: %s", cases[i].flags, r.err);
        cr_assert_eq(helper_count_lines(r.err), 1, "%s: %s", cases[i].flags, r.err);
        cr_assert(!path_exists(bad), "%s: wrote %s", cases[i].flags, bad);
        helper_result_free(&r);
    }
    // A quantized model is not a float model; an existing run dir is not overwritten.
    r = helper_run(rx.root, "'%s' qat --model '%s' --data '%s' --out '%s' --weights q2lut --steps 2", ertrain, out, rx.data,
                   bad);
    cr_assert_eq(r.status, 1);
    cr_assert(strstr(r.err, "quantized model") && helper_count_lines(r.err) == 1, "%s", r.err);
    helper_result_free(&r);
    r = helper_run(rx.root, "'%s' qat --model '%s' --data '%s' --out '%s' --weights q2lut --steps 2", ertrain, rx.fp,
                   rx.data, out);
    cr_assert_eq(r.status, 1);
    cr_assert_eq(helper_count_lines(r.err), 1, "%s", r.err);
    helper_result_free(&r);
    er_free(bad);
    er_free(out);
    er_free(ertrain);
}
