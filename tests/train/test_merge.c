// ertrain merge on a tiny random model: the merged model's logits are the base's with the adapter on at
// every position (the mask all on, not the masked runtime), the output is a model dir the stack loads,
// and bad inputs (missing adapter, wrong shape, existing --out, bf16 or quantized base) fail with one line.
#include <criterion/criterion.h>
#include <math.h>

#include "lora/peft.h"
#include "tests/common/helpers.h"
#include "tests/train/train_helpers.h"
#include "train/merge.h"

typedef struct {
    char *root, *base, *adapter;
    ModelConfig cfg;
} MergeFixture;

static MergeFixture fx;

// A tiny fp32 base dir and a random masked adapter for it (B perturbed away from 0, so it changes the logits).
static void setup(void) {
    threads_set(2);
    fx.root = helper_tmpdir("er_test_merge");
    fx.base = join(fx.root, "base");
    fx.adapter = join(fx.root, "adapter");
    helper_make_model(fx.base);
    Model m;
    cr_assert_eq(model_load(&m, fx.base, 0), ER_OK, "%s", er_last_error());
    fx.cfg = m.cfg;
    model_free(&m);
    LoraAdapter a;
    helper_random_adapter(&a, &fx.cfg, 0.1f, 3);
    a.masked = 1;
    cr_assert_eq(peft_save(&a, fx.adapter), ER_OK, "%s", er_last_error());
    lora_free(&a);
}

static void teardown(void) {
    helper_rmdir(fx.root);
    er_free(fx.root);
    er_free(fx.base);
    er_free(fx.adapter);
}

// Logits (B, T, V) of m on tokens, with adapter a at every position (a NULL: none), into out.
static void logits_of(Model *m, const LoraAdapter *a, const int *tokens, int B, int T, float *out) {
    Activations acts;
    cr_assert_eq(acts_alloc(&acts, &m->cfg, B, T, ACTS_SCORE, 0), ER_OK, "%s", er_last_error());
    ModelInput in = {.B = B, .T = T, .tokens = tokens, .adapter = a, .adapter_mask = NULL};
    cr_assert_eq(model_forward(m, &in, &acts), ER_OK, "%s", er_last_error());
    memcpy(out, acts.logits, sizeof(float) * (size_t)B * T * m->cfg.V);
    acts_free(&acts);
}

Test(merge, merged_logits_equal_the_adapter_on_every_position, .init = setup, .fini = teardown, .timeout = 60) {
    char *out = join(fx.root, "merged");
    MergeConfig c = {.model_dir = fx.base, .adapter_dir = fx.adapter, .out_dir = out, .threads = 2};
    MergeResult res;
    cr_assert_eq(merge_run(&c, &res), ER_OK, "%s", er_last_error());
    cr_assert_eq(res.merged, fx.cfg.L * LT_COUNT, "every projection of every layer is adapted");
    cr_assert_eq(res.masked, 1);

    enum { B = 2, T = 24 };
    int tokens[B * T];
    ErRng r;
    rng_seed(&r, 5);
    for (int i = 0; i < B * T; i++)
        tokens[i] = (int)rng_below(&r, (uint32_t)fx.cfg.V);
    size_t n = (size_t)B * T * fx.cfg.V;
    float *with = er_alloc(n * sizeof(float)), *merged = er_alloc(n * sizeof(float)), *plain = er_alloc(n * sizeof(float));
    Model base, mm;
    LoraShape s = model_config_lora_shape(&fx.cfg);
    LoraAdapter a;
    cr_assert_eq(model_load(&base, fx.base, 0), ER_OK, "%s", er_last_error());
    cr_assert_eq(peft_load(&a, fx.adapter, &s, 0), ER_OK, "%s", er_last_error());
    cr_assert_eq(model_load(&mm, out, 0), ER_OK, "%s", er_last_error());
    logits_of(&base, &a, tokens, B, T, with);
    logits_of(&base, NULL, tokens, B, T, plain);
    logits_of(&mm, NULL, tokens, B, T, merged);
    double worst = 0, moved = 0;
    for (size_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)merged[i] - with[i]) / (1.0 + fabs((double)with[i])));
        moved = fmax(moved, fabs((double)plain[i] - with[i]));
    }
    cr_assert_gt(moved, 1e-2, "the adapter must change the logits for the comparison to mean something");
    cr_assert_lt(worst, 1e-4, "merged logits differ from base + adapter by %g (relative)", worst);

    // A model dir like its base: config, fp32 weights, the tokenizer, run.json naming the command.
    cr_assert_eq(mm.quant.enabled, 0);
    for (int i = 0; i < mm.n_params; i++)
        cr_assert(!mm.params[i].w || mm.params[i].w->fmt == WF_F32, "%s is not fp32", mm.params[i].name);
    Tokenizer *tok;
    cr_assert_eq(tok_load(&tok, out), ER_OK, "%s", er_last_error());
    tok_free(tok);
    cJSON *j = helper_read_json(out, "run.json");
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(j, "command")->valuestring, "merge");
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "adapter_masked")));
    cJSON_Delete(j);
    model_free(&mm);
    lora_free(&a);
    model_free(&base);
    er_free(with);
    er_free(merged);
    er_free(plain);
    er_free(out);
}

Test(merge, bad_inputs_give_one_line_errors, .init = setup, .fini = teardown, .timeout = 60) {
    char *out = join(fx.root, "out");
    MergeConfig c = {.model_dir = fx.base, .adapter_dir = "/tmp/er_test_no_such_adapter", .out_dir = out};
    cr_assert_lt(merge_run(&c, NULL), 0);
    assert_one_line_error("er_test_no_such_adapter");
    cr_assert(!path_exists(out), "a failed merge must not leave an output dir");

    // An adapter for another shape (hidden 16, not 32).
    ModelConfig other = fx.cfg;
    other.C = 16;
    other.HS = 4;
    LoraAdapter a;
    helper_random_adapter(&a, &other, 0.1f, 3);
    char *wrong = join(fx.root, "wrong");
    cr_assert_eq(peft_save(&a, wrong), ER_OK, "%s", er_last_error());
    lora_free(&a);
    c.adapter_dir = wrong;
    cr_assert_lt(merge_run(&c, NULL), 0);
    assert_one_line_error(wrong);
    cr_assert(!path_exists(out));

    // A bf16 base.
    Model m;
    char *bf16 = join(fx.root, "bf16");
    cr_assert_eq(model_load(&m, fx.base, 0), ER_OK, "%s", er_last_error());
    cr_assert_eq(model_save(&m, bf16, 1), ER_OK, "%s", er_last_error());
    model_free(&m);
    c.model_dir = bf16;
    c.adapter_dir = fx.adapter;
    cr_assert_lt(merge_run(&c, NULL), 0);
    assert_one_line_error("fp32 base");
    cr_assert(!path_exists(out));

    // An existing, non-empty --out is not overwritten.
    c.model_dir = fx.base;
    cr_assert_eq(dir_make(out), ER_OK);
    char *marker = join(out, "keep");
    cr_assert_eq(file_write_atomic(marker, "x", 1), ER_OK);
    cr_assert_lt(merge_run(&c, NULL), 0);
    assert_one_line_error("already exists");
    cr_assert(path_exists(marker));
    er_free(marker);
    er_free(bf16);
    er_free(wrong);
    er_free(out);
}

Test(merge, cli_help_errors_and_quantized_base, .init = setup, .fini = teardown, .timeout = 60) {
    char *prog = helper_program("ertrain");
    helper_need_program(prog, "ertrain", "ertrain merge CLI tests");
    CmdResult r = helper_run(fx.root, "%s merge --help", prog);
    cr_assert_eq(r.status, 0);
    cr_assert(strstr(r.out, "every position"), "--help says the merge applies the adapter everywhere: %s", r.out);
    helper_result_free(&r);

    r = helper_run(fx.root, "%s merge --model %s --adapter %s/missing --out %s/o1", prog, fx.base, fx.root, fx.root);
    helper_expect_error(&r, "missing adapter", "ertrain merge: ");
    r = helper_run(fx.root, "%s merge --model %s --out %s/o1", prog, fx.base, fx.root);
    helper_expect_error(&r, "no --adapter", "--adapter");

    r = helper_run(fx.root, "%s quantize --model %s --out %s/q8 --weights q8", prog, fx.base, fx.root);
    cr_assert_eq(r.status, 0, "quantize: %s", r.err);
    helper_result_free(&r);
    r = helper_run(fx.root, "%s merge --model %s/q8 --adapter %s --out %s/o2", prog, fx.root, fx.adapter, fx.root);
    helper_expect_error(&r, "quantized base", "quantized");

    r = helper_run(fx.root, "%s merge --model %s --adapter %s --out %s/o3", prog, fx.base, fx.adapter, fx.root);
    cr_assert_eq(r.status, 0, "merge: %s", r.err);
    cr_assert(strstr(r.out, "14 projections merged"), "%s", r.out);
    helper_result_free(&r);
    er_free(prog);
}
