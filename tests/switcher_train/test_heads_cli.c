// ertrain heads end to end on a tiny random model, a tiny masked adapter and a few chains records:
// both heads written (safetensors + JSON with threshold, feature spec, fingerprint, metrics),
// ROC-AUC and accuracy printed, run.json and metrics.jsonl written; derived labels; the heads
// load for that model and are refused for another; bad input fails with one line.
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/json.h"
#include "model/head.h"
#include "tests/common/heads_helpers.h"

static char *tmp, *ertrain;

static void setup(void) {
    ertrain = helper_program("ertrain");
    tmp = helper_tmpdir("er_heads_");
    heads_make_model_and_adapter(tmp);
}
static void teardown(void) {
    helper_rmdir(tmp);
    er_free(tmp);
    er_free(ertrain);
}
TestSuite(heads_cli, .init = setup, .fini = teardown);

static void need_ertrain(void) { helper_need_program(ertrain, "ertrain", "ertrain heads tests"); }

static const char *FAST = "--samples 3 --max-new 12 --direct-max-new 6 --switcher-epochs 5 --verifier-epochs 5 "
                          "--threads 1 --seed 3";

Test(heads_cli, trains_both_heads_end_to_end) {
    need_ertrain();
    char *data = heads_make_data(tmp, "train.jsonl", 10, 1);
    CmdResult r = helper_run(tmp,
                             "'%s' heads --model '%s/model' --adapter '%s/adapter' --data '%s' --switcher-out "
                             "'%s/h/switcher.safetensors' --verifier-out '%s/h/verifier.safetensors' %s",
                             ertrain, tmp, tmp, data, tmp, tmp, FAST);
    cr_assert_eq(r.status, 0, "heads failed (%d): %s", r.status, r.err);
    cr_assert(strstr(r.out, "switcher: held-out ROC-AUC"), "%s", r.out);
    cr_assert(strstr(r.out, "verifier: held-out ROC-AUC"), "%s", r.out);
    cr_assert(strstr(r.out, "accuracy") && strstr(r.out, "at threshold"), "%s", r.out);
    const char *files[] = {"switcher.safetensors", "switcher.json", "verifier.safetensors", "verifier.json",
                           "run.json", "metrics.jsonl"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/h/%s", tmp, files[i]);
        cr_assert(path_exists(p), "%s missing", files[i]);
    }
    char p[512];
    snprintf(p, sizeof p, "%s/h/metrics.jsonl", tmp);
    char *text;
    size_t n;
    cr_assert_eq(file_read_all(p, 1 << 20, &text, &n), 0);
    cr_assert_eq(helper_count_lines(text), 10, "5 epochs per head: %s", text);
    cr_assert(strstr(text, "\"head\":\"switcher\"") && strstr(text, "\"head\":\"verifier\""));
    er_free(text);
    snprintf(p, sizeof p, "%s/h/run.json", tmp);
    cJSON *run;
    cr_assert_eq(json_parse_file(p, 1 << 20, &run), 0);
    cr_assert(cJSON_GetObjectItem(run, "config") && cJSON_GetObjectItem(run, "result"));
    cJSON_Delete(run);
    // The heads load for this model, with their feature specs; another model is refused.
    Model m, other;
    snprintf(p, sizeof p, "%s/model", tmp);
    cr_assert_eq(model_load(&m, p, 0), 0);
    TrainedHead sw, vf;
    snprintf(p, sizeof p, "%s/h/switcher.safetensors", tmp);
    cr_assert_eq(trained_head_load(&sw, p, HEAD_SWITCHER, &m), 0, "%s", er_last_error());
    cr_assert_eq(sw.net.kind, HEAD_MLP);
    cr_assert_eq(sw.net.hidden, 8);
    cr_assert_eq(sw.chunk, 128);
    cr_assert(sw.threshold >= 0 && sw.threshold <= 1);
    snprintf(p, sizeof p, "%s/h/verifier.safetensors", tmp);
    cr_assert_eq(trained_head_load(&vf, p, HEAD_VERIFIER, &m), 0, "%s", er_last_error());
    cr_assert_eq(vf.net.kind, HEAD_LINEAR);
    cr_assert_str_eq(vf.verify_prompt, "\nIs this solution correct?");
    cr_assert_eq(vf.adapter_on, 0);
    cr_assert(cJSON_GetObjectItem(vf.metrics, "n_train"));
    ModelConfig c = m.cfg;
    cr_assert_eq(model_build_random(&other, &c, 0.5f, 99), 0);
    TrainedHead x;
    cr_assert_lt(trained_head_load(&x, p, HEAD_VERIFIER, &other), 0);
    cr_assert(strstr(er_last_error(), "another model"), "%s", er_last_error());
    trained_head_free(&sw);
    trained_head_free(&vf);
    model_free(&other);
    model_free(&m);
    helper_result_free(&r);
    er_free(data);
}

Test(heads_cli, derived_labels_and_target_recall) {
    need_ertrain();
    char *data = heads_make_data(tmp, "train.jsonl", 8, 2);
    CmdResult r = helper_run(tmp,
                             "'%s' heads --model '%s/model' --adapter '%s/adapter' --data '%s' --switcher-out "
                             "'%s/sw' --derive-labels --target-recall 0.9 --out '%s/run' %s",
                             ertrain, tmp, tmp, data, tmp, tmp, FAST);
    cr_assert_eq(r.status, 0, "heads failed (%d): %s", r.status, r.err);
    cr_assert(strstr(r.out, "switcher labels: base direct right"), "%s", r.out);
    char p[512];
    snprintf(p, sizeof p, "%s/sw.json", tmp);
    cr_assert(path_exists(p));
    snprintf(p, sizeof p, "%s/run/run.json", tmp);
    cr_assert(path_exists(p));
    helper_result_free(&r);
    er_free(data);
}

Test(heads_cli, bad_inputs_fail_cleanly) {
    need_ertrain();
    char *data = heads_make_data(tmp, "train.jsonl", 4, 3);
    const char *bad_json = "{\"prompt\": \"What is 1 + 1?\", \"answer\": \"2\"}\n{\"prompt\": \"2 + 2?\", \"answer\": 4}\n";
    char bad[512];
    snprintf(bad, sizeof bad, "%s/no_label.jsonl", tmp);
    cr_assert_eq(file_write_atomic(bad, bad_json, strlen(bad_json)), 0);
    struct {
        const char *args, *expect;
    } cases[] = {
        {"--data '%s'", "nothing to train"},
        {"--data '%s' --switcher-out /tmp/never --kv int4", "--kv"},
        {"--data '%s/nope.jsonl' --switcher-out /tmp/never", "nope.jsonl"},
        // accepted silently before: one head overwriting the other, no records to calibrate on
        {"--data '%s' --switcher-out /tmp/er_h_same --verifier-out /tmp/../tmp/er_h_same", "would overwrite"},
        {"--data '%s' --switcher-out /tmp/never --val-split 0", "--val-split"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[1024];
        snprintf(args, sizeof args, cases[i].args, i == 2 ? tmp : data);
        CmdResult r = helper_run(tmp, "'%s' heads --model '%s/model' --adapter '%s/adapter' %s", ertrain, tmp, tmp,
                                 args);
        helper_expect_error(&r, args, cases[i].expect);
    }
    CmdResult r = helper_run(tmp, "'%s' heads --model '%s/model' --adapter '%s/adapter' --data '%s' --switcher-out "
                                  "'%s/sw'", ertrain, tmp, tmp, bad, tmp);
    cr_assert_eq(r.status, 1);
    cr_assert(strstr(r.err, "needs_reasoning") && strstr(r.err, "no_label.jsonl:1"), "%s", r.err);
    snprintf(bad, sizeof bad, "%s/sw.json", tmp);
    cr_assert(!path_exists(bad), "no head written on failure");
    helper_result_free(&r);
    er_free(data);
}
