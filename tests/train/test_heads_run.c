// heads_run (train/heads.h) end to end with the switcher and the verifier as its jobs, on a tiny
// random model, a tiny masked adapter and a few chains records: both heads written (safetensors +
// JSON with threshold, feature spec, fingerprint, metrics), ROC-AUC and accuracy reported, run.json
// and metrics.jsonl written; derived labels; the heads load for that model and are refused for
// another; the held-out records split into calibration and report halves; heads of one class refused;
// the records used and the pace said; the KV type recorded. (The flags and their one-line errors:
// tests/switcher_train/test_heads_cli.c.)
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "core/fileio.h"
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

// What one run trains and how: a head is trained when its path is given.
typedef struct {
    const char *sw_out, *vf_out, *out_dir;
    int derive, allow_one_class, limit;
    double target_recall;
    KvType kv;
    int place; // the device path on copies placed on the CPU (HeadsConfig.place_on_cpu)
} RunOpts;

// One run on tmp/model and tmp/adapter, small and quick (samples 3, max_new 12, direct_max_new 6,
// 5 epochs per head, one thread, seed 3). *report gets what the run reports (the CLI's stdout), *log
// (when not NULL) its progress and notes (the CLI's stderr).
static int run(const char *data, const RunOpts *o, char **report, char **log) {
    threads_set(1);
    char *model = path_join(fx.tmp, "model"), *adapter = path_join(fx.tmp, "adapter");
    HeadsConfig c;
    heads_config_default(&c);
    c.model_dir = model;
    c.adapter_dir = adapter;
    c.data_path = data;
    c.out_dir = o->out_dir;
    c.seed = 3;
    c.max_new = 12;
    c.allow_one_class = o->allow_one_class;
    c.limit = o->limit;
    c.kv = o->kv;
    c.place_on_cpu = o->place;
    cJSON *settings = cJSON_CreateObject();
    cJSON_AddNumberToObject(settings, "seed", 3);
    c.settings = settings;
    size_t n, nl;
    c.out = open_memstream(report, &n);
    c.log = log ? open_memstream(log, &nl) : NULL;
    SwitcherConfig sc;
    switcher_config_default(&sc);
    sc.out = o->sw_out;
    sc.derive_labels = o->derive;
    sc.target_recall = o->target_recall;
    sc.direct_max_new = 6;
    sc.fit.epochs = 5;
    VerifierConfig vc;
    verifier_config_default(&vc);
    vc.out = o->vf_out;
    vc.samples = 3;
    vc.fit.epochs = 5;
    HeadJob jobs[2] = {0};
    int n_jobs = 0;
    if (o->sw_out)
        cr_assert_eq(switcher_job(&sc, &jobs[n_jobs++]), 0);
    if (o->vf_out)
        cr_assert_eq(verifier_job(&vc, &jobs[n_jobs++]), 0);
    HeadsResult res;
    int rc = heads_run(&c, jobs, n_jobs, &res);
    fclose(c.out);
    if (c.log)
        fclose(c.log);
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
    // A wiring check: on a random model every sampled response is wrong (one class for the verifier).
    RunOpts o = {.sw_out = sw_p, .vf_out = vf_p, .out_dir = out, .allow_one_class = 1};
    cr_assert_eq(run(data, &o, &report, NULL), 0, "heads failed: %s", er_last_error());
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

// The device path (train/device.h, the engine over the backend seam) on copies placed on the CPU: both heads'
// features come from the placed model and adapter, and the heads written equal the host run's, byte for byte
// (derived labels: the base's direct answers and the adapter's sampled ones both count).
Test(heads_run, placed_equals_host) {
    char *data = heads_make_data(fx.tmp, "train.jsonl", 8, 2), *report[2];
    const char *name[2] = {"a_host", "placed"};
    for (int k = 0; k < 2; k++) {
        char sw_p[512], vf_p[512], out[512];
        snprintf(sw_p, sizeof sw_p, "%s/%s/switcher.safetensors", fx.tmp, name[k]);
        snprintf(vf_p, sizeof vf_p, "%s/%s/verifier.safetensors", fx.tmp, name[k]);
        snprintf(out, sizeof out, "%s/%s", fx.tmp, name[k]);
        RunOpts o = {.sw_out = sw_p, .vf_out = vf_p, .out_dir = out, .allow_one_class = 1, .derive = 1,
                     .target_recall = 0.9, .place = k};
        cr_assert_eq(run(data, &o, &report[k], NULL), 0, "heads (%s) failed: %s", name[k], er_last_error());
    }
    for (char *at = report[1]; (at = strstr(at, "/placed/"));) // the paths it wrote, named alike
        memcpy(at, "/a_host/", 8);
    cr_assert_str_eq(report[1], report[0], "the placed run's report differs from the host run's");
    const char *files[] = {"switcher.safetensors", "verifier.safetensors"};
    for (int i = 0; i < 2; i++) {
        char pa[512], pb[512], *a, *b;
        size_t na, nb;
        snprintf(pa, sizeof pa, "%s/a_host/%s", fx.tmp, files[i]);
        snprintf(pb, sizeof pb, "%s/placed/%s", fx.tmp, files[i]);
        cr_assert_eq(file_read_all(pa, 1 << 24, &a, &na), 0);
        cr_assert_eq(file_read_all(pb, 1 << 24, &b, &nb), 0);
        cr_assert(na == nb && !memcmp(a, b, na), "%s: the placed run's differs from the host run's", files[i]);
        er_free(a);
        er_free(b);
    }
    free(report[0]);
    free(report[1]);
    er_free(data);
}

Test(heads_run, derived_labels_and_target_recall) {
    char *data = heads_make_data(fx.tmp, "train.jsonl", 8, 2), *report, sw_p[512], out[512];
    snprintf(sw_p, sizeof sw_p, "%s/sw", fx.tmp);
    snprintf(out, sizeof out, "%s/run", fx.tmp);
    RunOpts o = {.sw_out = sw_p, .out_dir = out, .derive = 1, .target_recall = 0.9, .allow_one_class = 1};
    cr_assert_eq(run(data, &o, &report, NULL), 0, "heads failed: %s", er_last_error());
    cr_assert(strstr(report, "switcher labels: base direct right"), "%s", report);
    char p[512];
    snprintf(p, sizeof p, "%s/sw.json", fx.tmp);
    cr_assert(path_exists(p));
    snprintf(p, sizeof p, "%s/run/run.json", fx.tmp);
    cr_assert(path_exists(p));
    free(report);
    er_free(data);
}

static cJSON *read_json(const char *path) {
    cJSON *j;
    cr_assert_eq(json_parse_file(path, 1 << 20, &j), 0, "%s", er_last_error());
    return j;
}

static double num_at(const cJSON *j, const char *a, const char *b) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, a);
    if (b)
        v = cJSON_GetObjectItemCaseSensitive(v, b);
    cr_assert(cJSON_IsNumber(v), "no number at %s%s%s", a, b ? "." : "", b ? b : "");
    return v->valuedouble;
}

// The held-out records split in two: one half calibrates the threshold, the other reports the metrics
// at it. The verifier's rows (3 per record) follow their records: its calibration and report rows come
// from as many records as run.json counts, and the head's JSON says which split each figure is on.
Test(heads_run, calibration_and_report_records_are_disjoint) {
    char *data = heads_make_data(fx.tmp, "train.jsonl", 20, 1), *report, vf_p[512], out[512], p[600];
    snprintf(vf_p, sizeof vf_p, "%s/h/verifier", fx.tmp);
    snprintf(out, sizeof out, "%s/h", fx.tmp);
    RunOpts o = {.vf_out = vf_p, .out_dir = out, .allow_one_class = 1}; // random model: every response wrong
    cr_assert_eq(run(data, &o, &report, NULL), 0, "heads failed: %s", er_last_error());
    snprintf(p, sizeof p, "%s/run.json", out);
    cJSON *runj = read_json(p);
    const cJSON *counts = cJSON_GetObjectItem(runj, "counts");
    int records = (int)num_at(counts, "records", NULL), n_cal = (int)num_at(counts, "calibration", NULL),
        n_rep = (int)num_at(counts, "report", NULL);
    cr_assert_eq(records, 20);
    cr_assert_eq(n_cal + n_rep, 4, "val_split 0.2 of 20 records: 4 held out, got %d + %d", n_cal, n_rep);
    cr_assert(n_cal == 2 && n_rep == 2, "the held-out records halve: %d calibrate, %d report", n_cal, n_rep);
    snprintf(p, sizeof p, "%s.json", vf_p);
    cJSON *vf = read_json(p);
    const cJSON *m = cJSON_GetObjectItem(vf, "metrics");
    cr_assert_eq(num_at(m, "n_train", NULL), 3 * (records - n_cal - n_rep));
    cr_assert_eq(num_at(m, "n_calibration", NULL), 3 * n_cal);
    cr_assert_eq(num_at(m, "n_report", NULL), 3 * n_rep);
    cr_assert_eq(num_at(cJSON_GetObjectItem(m, "labels"), "report", "rows"), 3 * n_rep);
    cr_assert_str_eq(cJSON_GetObjectItem(m, "report_split")->valuestring, "report");
    cr_assert_str_eq(cJSON_GetObjectItem(m, "threshold_split")->valuestring, "calibration");
    cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(m, "report_accuracy")));
    char want[64];
    snprintf(want, sizeof want, "on the %d report rows", 3 * n_rep);
    cr_assert(strstr(report, want) && strstr(report, "chosen on the 6 calibration rows"), "%s", report);
    cJSON_Delete(vf);
    cJSON_Delete(runj);
    free(report);
    er_free(data);
}

// On a random model every sampled response is wrong: the verifier's rows hold one class. Refused with the
// head and the label counts, nothing written; --allow-one-class writes it with a warning.
Test(heads_run, one_class_head_refused_unless_allowed) {
    char *data = heads_make_data(fx.tmp, "train.jsonl", 10, 1), *report, *log, vf_p[512], out[512], p[600];
    snprintf(vf_p, sizeof vf_p, "%s/vf", fx.tmp);
    snprintf(out, sizeof out, "%s/run", fx.tmp);
    RunOpts o = {.vf_out = vf_p, .out_dir = out};
    cr_assert_eq(run(data, &o, &report, &log), ER_EINVAL, "a one-class verifier was written:\n%s", report);
    const char *e = er_last_error();
    cr_assert(strstr(e, "verifier: the training rows hold one class (correct in 0 of 24 training rows, 0 of 3 "
                        "calibration rows, 0 of 3 report rows)") && strstr(e, "--allow-one-class"), "%s", e);
    snprintf(p, sizeof p, "%s.json", vf_p);
    cr_assert(!path_exists(p), "nothing written when refused");
    free(report);
    free(log);
    o.allow_one_class = 1;
    cr_assert_eq(run(data, &o, &report, &log), 0, "%s", er_last_error());
    cr_assert(strstr(log, "verifier: WARNING: the training rows hold one class"), "%s", log);
    cr_assert(path_exists(p));
    free(report);
    free(log);
    er_free(data);
}

// The records used, of how many in the file, and the split, before the pass; after the first 8 records
// the pace per record and what is left.
Test(heads_run, says_records_used_and_the_pace) {
    char *data = heads_make_data(fx.tmp, "train.jsonl", 14, 1), *report, *log, vf_p[512], out[512];
    snprintf(vf_p, sizeof vf_p, "%s/vf", fx.tmp);
    snprintf(out, sizeof out, "%s/run", fx.tmp);
    RunOpts o = {.vf_out = vf_p, .out_dir = out, .allow_one_class = 1, .limit = 12};
    cr_assert_eq(run(data, &o, &report, &log), 0, "%s", er_last_error());
    cr_assert(strstr(log, "heads: using 12 of the 14 records in ") &&
                  strstr(log, "(--limit 12): 10 to train, 1 to calibrate the thresholds, 1 to report"),
              "%s", log);
    cr_assert(strstr(log, " s per record so far: about ") && strstr(log, " more for the 4 left"), "%s", log);
    free(report);
    free(log);
    o.limit = 0;
    cr_assert_eq(run(data, &o, &report, &log), 0, "%s", er_last_error());
    cr_assert(strstr(log, "heads: using all 14 records of ") && strstr(log, "(--limit N uses the first N)"), "%s", log);
    free(report);
    free(log);
    er_free(data);
}

// The KV cache the features were computed on is recorded in each head (erinfer warns when it runs a
// head on another; tests/infer/test_pipeline_cli.c).
Test(heads_run, heads_record_their_kv_type) {
    char *data = heads_make_data(fx.tmp, "train.jsonl", 10, 1), *report, sw_p[512], vf_p[512], out[512];
    snprintf(sw_p, sizeof sw_p, "%s/sw", fx.tmp);
    snprintf(vf_p, sizeof vf_p, "%s/vf", fx.tmp);
    snprintf(out, sizeof out, "%s/run", fx.tmp);
    for (int kv = KV_F32; kv <= KV_INT8; kv++) {
        RunOpts o = {.sw_out = sw_p, .vf_out = vf_p, .out_dir = out, .allow_one_class = 1, .kv = (KvType)kv};
        cr_assert_eq(run(data, &o, &report, NULL), 0, "%s", er_last_error());
        free(report);
        TrainedHead sw, vf;
        cr_assert_eq(trained_head_load(&sw, sw_p, HEAD_SWITCHER, NULL), 0, "%s", er_last_error());
        cr_assert_eq(trained_head_load(&vf, vf_p, HEAD_VERIFIER, NULL), 0, "%s", er_last_error());
        HeadKv want = kv == KV_INT8 ? HEAD_KV_INT8 : HEAD_KV_F32;
        cr_assert(sw.kv == want && vf.kv == want, "kv %d: the heads record %d and %d", kv, sw.kv, vf.kv);
        trained_head_free(&sw);
        trained_head_free(&vf);
        char p[600];
        snprintf(p, sizeof p, "%s.json", vf_p);
        cJSON *j = read_json(p);
        const cJSON *k = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "features"), "kv");
        cr_assert(cJSON_IsString(k) && strcmp(k->valuestring, kv == KV_INT8 ? "int8" : "f32") == 0);
        cJSON_Delete(j);
    }
    er_free(data);
}
