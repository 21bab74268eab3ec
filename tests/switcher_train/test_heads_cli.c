// ertrain heads, the command: bad flags and bad records fail with one line and write no head. (The run
// itself, called directly: tests/train/test_heads_run.c.)
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "tests/common/heads_helpers.h"

static HelperFixture fx; // per test: the temp dir, tmp/model with tmp/adapter, $ER_BUILD/ertrain

static void setup(void) {
    helper_fixture_open(&fx, "er_heads_", "ertrain");
    heads_add_adapter(fx.tmp);
}
static void teardown(void) { helper_fixture_close(&fx); }
TestSuite(heads_cli, .init = setup, .fini = teardown);

static void need_ertrain(void) { helper_need_program(fx.prog, "ertrain", "ertrain heads tests"); }

Test(heads_cli, bad_inputs_fail_cleanly) {
    need_ertrain();
    char *data = heads_make_data(fx.tmp, "train.jsonl", 4, 3);
    const char *bad_json = "{\"prompt\": \"What is 1 + 1?\", \"answer\": \"2\"}\n{\"prompt\": \"2 + 2?\", \"answer\": 4}\n";
    char bad[512];
    snprintf(bad, sizeof bad, "%s/no_label.jsonl", fx.tmp);
    cr_assert_eq(file_write_atomic(bad, bad_json, strlen(bad_json)), 0);
    struct {
        const char *args, *expect;
    } cases[] = {
        {"--data '%s'", "nothing to train"},
        {"--data '%s' --switcher-out /tmp/never --kv int4", "--kv"},
        {"--data '%s/nope.jsonl' --switcher-out /tmp/never", "nope.jsonl"},
        // refused: one head would overwrite the other; no records to calibrate on
        {"--data '%s' --switcher-out /tmp/er_h_same --verifier-out /tmp/../tmp/er_h_same", "would overwrite"},
        {"--data '%s' --switcher-out /tmp/er_h_same.json --verifier-out /tmp/er_h_same", "would overwrite"},
        {"--data '%s' --switcher-out /tmp/er_h_same.safetensors --verifier-out /tmp/er_h_same.json", "would overwrite"},
        {"--data '%s' --switcher-out /tmp/never --val-split 0", "--val-split"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[1024];
        snprintf(args, sizeof args, cases[i].args, i == 2 ? fx.tmp : data);
        CmdResult r = helper_run(fx.tmp, "'%s' heads --model '%s/model' --adapter '%s/adapter' %s", fx.prog, fx.tmp,
                                 fx.tmp, args);
        helper_expect_error(&r, args, cases[i].expect);
    }
    // A head named by its .json file writes NAME.json and NAME.safetensors: config.json of the model is an input.
    CmdResult r = helper_run(fx.tmp, "'%s' heads --model '%s/model' --adapter '%s/adapter' --data '%s' --switcher-out "
                             "'%s/model/config.json'", fx.prog, fx.tmp, fx.tmp, data, fx.tmp);
    helper_expect_error(&r, "--switcher-out MODEL/config.json", "it would be overwritten");
    r = helper_run(fx.tmp, "'%s' heads --model '%s/model' --adapter '%s/adapter' --data '%s' --switcher-out "
                   "'%s/sw'", fx.prog, fx.tmp, fx.tmp, bad, fx.tmp);
    cr_assert_eq(r.status, 1);
    cr_assert(strstr(r.err, "needs_reasoning") && strstr(r.err, "no_label.jsonl:1"), "%s", r.err);
    snprintf(bad, sizeof bad, "%s/sw.json", fx.tmp);
    cr_assert(!path_exists(bad), "no head written on failure");
    helper_result_free(&r);
    er_free(data);
}

// A head whose rows hold one label is refused, one line naming the head and the label counts, no head
// written (the random model answers every sampled problem wrong: the verifier's labels are all 0);
// --allow-one-class writes it, with a loud warning on stderr.
Test(heads_cli, one_class_head_refused_unless_allowed) {
    need_ertrain();
    char *data = heads_make_data(fx.tmp, "train.jsonl", 10, 3), vf[600];
    snprintf(vf, sizeof vf, "%s/vf.json", fx.tmp);
    const char *cmd = "'%s' heads --model '%s/model' --adapter '%s/adapter' --data '%s' --verifier-out '%s/vf' "
                      "--samples 2 --max-new 8 --verifier-epochs 2 --threads 1 %s";
    CmdResult r = helper_run(fx.tmp, cmd, fx.prog, fx.tmp, fx.tmp, data, fx.tmp, "");
    cr_assert_eq(r.status, 1, "a one-class verifier was not refused (exit %d):\n%s%s", r.status, r.out, r.err);
    const char *last = r.err, *nl;
    while ((nl = strchr(last, '\n')) && nl[1])
        last = nl + 1; // the error is the last line (progress and notes come before it)
    cr_assert(strstr(last, "ertrain heads: verifier: the training rows hold one class (correct in 0 of 16 training "
                           "rows") && strstr(last, "--allow-one-class"), "%s", r.err);
    cr_assert(!path_exists(vf), "no head written when refused");
    helper_result_free(&r);
    r = helper_run(fx.tmp, cmd, fx.prog, fx.tmp, fx.tmp, data, fx.tmp, "--allow-one-class");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.err, "verifier: WARNING: the training rows hold one class"), "%s", r.err);
    cr_assert(path_exists(vf));
    helper_result_free(&r);
    er_free(data);
}

// Two heads in two new dirs: both are made before the work, and both heads are written.
Test(heads_cli, heads_in_two_new_dirs) {
    need_ertrain();
    char *data = heads_make_data(fx.tmp, "train.jsonl", 10, 3), sw[600], vf[600];
    CmdResult r = helper_run(fx.tmp, "'%s' heads --model '%s/model' --adapter '%s/adapter' --data '%s' --switcher-out "
                             "'%s/a/sw' --verifier-out '%s/b/c/vf' --samples 2 --max-new 8 --verifier-epochs 2 "
                             "--switcher-epochs 2 --threads 1 --allow-one-class", fx.prog, fx.tmp, fx.tmp, data, fx.tmp,
                             fx.tmp);
    cr_assert_eq(r.status, 0, "%s", r.err);
    snprintf(sw, sizeof sw, "%s/a/sw.json", fx.tmp);
    snprintf(vf, sizeof vf, "%s/b/c/vf.json", fx.tmp);
    cr_assert(path_exists(sw) && path_exists(vf), "%s", r.err);
    helper_result_free(&r);
    er_free(data);
}

// No adapter: refused on a model that is not hybrid (it has no reasoning route); on a hybrid-thinking model
// (Qwen3's template) the base reasons with its thinking on, and both heads are trained on it.
Test(heads_cli, hybrid_model_without_adapter) {
    need_ertrain();
    char *data = heads_make_data(fx.tmp, "train.jsonl", 10, 3), hybrid[600], sw[600], vf[600];
    CmdResult r = helper_run(fx.tmp, "'%s' heads --model '%s/model' --data '%s' --switcher-out '%s/sw'", fx.prog, fx.tmp,
                             data, fx.tmp);
    helper_expect_error(&r, "no --adapter, plain model", "hybrid-thinking");
    snprintf(hybrid, sizeof hybrid, "%s/hybrid", fx.tmp);
    helper_make_hybrid_model(hybrid);
    r = helper_run(fx.tmp, "'%s' heads --model '%s' --data '%s' --switcher-out '%s/sw' --verifier-out '%s/vf' "
                   "--samples 2 --max-new 8 --verifier-epochs 2 --switcher-epochs 2 --threads 1 --allow-one-class",
                   fx.prog, hybrid, data, fx.tmp, fx.tmp);
    cr_assert_eq(r.status, 0, "%s", r.err);
    snprintf(sw, sizeof sw, "%s/sw.json", fx.tmp);
    snprintf(vf, sizeof vf, "%s/vf.json", fx.tmp);
    cr_assert(path_exists(sw) && path_exists(vf), "%s", r.err);
    helper_result_free(&r);
    er_free(data);
}
