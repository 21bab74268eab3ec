// heads_run (train/heads.h) end to end with the switcher and the verifier as its jobs, on a tiny
// random model, a tiny masked adapter and a few chains records: both heads written (safetensors +
// JSON with threshold, feature spec, fingerprint, metrics), ROC-AUC and accuracy reported, run.json
// and metrics.jsonl written; derived labels; the heads load for that model and are refused for
// another. (The flags and their one-line errors: tests/switcher_train/test_heads_cli.c.)
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/json.h"
#include "core/threads.h"
#include "model/head.h"
#include "switcher_train/switcher.h"
#include "tests/common/heads_helpers.h"
#include "train/heads.h"
#include "verifier_train/verifier.h"

static HelperFixture fx; // per test: the temp dir, tmp/model with tmp/adapter

static void setup(void) {
    helper_fixture_open(&fx, "er_heads_run_", NULL);
    heads_add_adapter(fx.tmp);
}
static void teardown(void) { helper_fixture_close(&fx); }
TestSuite(heads_run, .init = setup, .fini = teardown);

// One run on tmp/model and tmp/adapter, small and quick (samples 3, max_new 12, direct_max_new 6,
// 5 epochs per head, one thread, seed 3); a head is trained when its path is given. *report gets
// what the run reports (the CLI's stdout).
static int run(const char *data, const char *sw_out, const char *vf_out, int derive, double target_recall,
               const char *out_dir, char **report) {
    threads_set(1);
    char *model = path_join(fx.tmp, "model"), *adapter = path_join(fx.tmp, "adapter");
    HeadsConfig c;
    heads_config_default(&c);
    c.model_dir = model;
    c.adapter_dir = adapter;
    c.data_path = data;
    c.out_dir = out_dir;
    c.seed = 3;
    c.max_new = 12;
    cJSON *settings = cJSON_CreateObject();
    cJSON_AddNumberToObject(settings, "seed", 3);
    c.settings = settings;
    size_t n;
    c.out = open_memstream(report, &n);
    SwitcherConfig sc;
    switcher_config_default(&sc);
    sc.out = sw_out;
    sc.derive_labels = derive;
    sc.target_recall = target_recall;
    sc.direct_max_new = 6;
    sc.fit.epochs = 5;
    VerifierConfig vc;
    verifier_config_default(&vc);
    vc.out = vf_out;
    vc.samples = 3;
    vc.fit.epochs = 5;
    HeadJob jobs[2] = {0};
    int n_jobs = 0;
    if (sw_out)
        cr_assert_eq(switcher_job(&sc, &jobs[n_jobs++]), 0);
    if (vf_out)
        cr_assert_eq(verifier_job(&vc, &jobs[n_jobs++]), 0);
    HeadsResult res;
    int rc = heads_run(&c, jobs, n_jobs, &res);
    fclose(c.out);
    cJSON_Delete(settings);
    for (int j = 0; j < n_jobs; j++)
        head_job_free(&jobs[j]);
    er_free(model);
    er_free(adapter);
    return rc;
}

Test(heads_run, trains_both_heads_end_to_end) {
    char *data = heads_make_data(fx.tmp, "train.jsonl", 10, 1), *report, sw_p[512], vf_p[512], out[512];
    snprintf(sw_p, sizeof sw_p, "%s/h/switcher.safetensors", fx.tmp);
    snprintf(vf_p, sizeof vf_p, "%s/h/verifier.safetensors", fx.tmp);
    snprintf(out, sizeof out, "%s/h", fx.tmp);
    cr_assert_eq(run(data, sw_p, vf_p, 0, 0, out, &report), 0, "heads failed: %s", er_last_error());
    cr_assert(strstr(report, "switcher: held-out ROC-AUC"), "%s", report);
    cr_assert(strstr(report, "verifier: held-out ROC-AUC"), "%s", report);
    cr_assert(strstr(report, "accuracy") && strstr(report, "at threshold"), "%s", report);
    const char *files[] = {"switcher.safetensors", "switcher.json", "verifier.safetensors", "verifier.json",
                           "run.json", "metrics.jsonl"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/h/%s", fx.tmp, files[i]);
        cr_assert(path_exists(p), "%s missing", files[i]);
    }
    char p[512];
    snprintf(p, sizeof p, "%s/h/metrics.jsonl", fx.tmp);
    char *text;
    size_t n;
    cr_assert_eq(file_read_all(p, 1 << 20, &text, &n), 0);
    cr_assert_eq(helper_count_lines(text), 10, "5 epochs per head: %s", text);
    cr_assert(strstr(text, "\"head\":\"switcher\"") && strstr(text, "\"head\":\"verifier\""));
    er_free(text);
    snprintf(p, sizeof p, "%s/h/run.json", fx.tmp);
    cJSON *runj;
    cr_assert_eq(json_parse_file(p, 1 << 20, &runj), 0);
    cr_assert(cJSON_GetObjectItem(runj, "config") && cJSON_GetObjectItem(runj, "result"));
    cJSON_Delete(runj);
    // The heads load for this model, with their feature specs; another model is refused.
    Model m, other;
    snprintf(p, sizeof p, "%s/model", fx.tmp);
    cr_assert_eq(model_load(&m, p, 0), 0);
    TrainedHead sw, vf;
    cr_assert_eq(trained_head_load(&sw, sw_p, HEAD_SWITCHER, &m), 0, "%s", er_last_error());
    cr_assert_eq(sw.net.kind, HEAD_MLP);
    cr_assert_eq(sw.net.hidden, 8);
    cr_assert_eq(sw.chunk, 128);
    cr_assert(sw.threshold >= 0 && sw.threshold <= 1);
    cr_assert_eq(trained_head_load(&vf, vf_p, HEAD_VERIFIER, &m), 0, "%s", er_last_error());
    cr_assert_eq(vf.net.kind, HEAD_LINEAR);
    cr_assert_str_eq(vf.verify_prompt, "\nIs this solution correct?");
    cr_assert_eq(vf.adapter_on, 0);
    cr_assert(cJSON_GetObjectItem(vf.metrics, "n_train"));
    ModelConfig c = m.cfg;
    cr_assert_eq(model_build_random(&other, &c, 0.5f, 99), 0);
    TrainedHead x;
    cr_assert_lt(trained_head_load(&x, vf_p, HEAD_VERIFIER, &other), 0);
    cr_assert(strstr(er_last_error(), "another model"), "%s", er_last_error());
    trained_head_free(&sw);
    trained_head_free(&vf);
    model_free(&other);
    model_free(&m);
    free(report);
    er_free(data);
}

Test(heads_run, derived_labels_and_target_recall) {
    char *data = heads_make_data(fx.tmp, "train.jsonl", 8, 2), *report, sw_p[512], out[512];
    snprintf(sw_p, sizeof sw_p, "%s/sw", fx.tmp);
    snprintf(out, sizeof out, "%s/run", fx.tmp);
    cr_assert_eq(run(data, sw_p, NULL, 1, 0.9, out, &report), 0, "heads failed: %s", er_last_error());
    cr_assert(strstr(report, "switcher labels: base direct right"), "%s", report);
    char p[512];
    snprintf(p, sizeof p, "%s/sw.json", fx.tmp);
    cr_assert(path_exists(p));
    snprintf(p, sizeof p, "%s/run/run.json", fx.tmp);
    cr_assert(path_exists(p));
    free(report);
    er_free(data);
}
