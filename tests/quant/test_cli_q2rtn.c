// ertrain quantize --weights q2rtn (stored as q2lut with an RTN method) and --weights bf16 (the float
// model as bf16), run as a user runs them on a tiny random model dir in /tmp.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/dtype.h"
#include "core/json.h"
#include "tests/common/helpers.h"

static HelperFixture fx; // per test: the temp dir, tmp/model, $ER_BUILD/ertrain

static void setup(void) { helper_fixture_open(&fx, "er_q2rtn_", "ertrain"); }
static void teardown(void) { helper_fixture_close(&fx); }
TestSuite(quant_cli_q2rtn, .init = setup, .fini = teardown);

static const char *str_of(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    cr_assert(cJSON_IsString(v), "no string \"%s\"", k);
    return v->valuestring;
}

Test(quant_cli_q2rtn, q2rtn_is_q2lut_with_uniform_levels) {
    helper_need_program(fx.prog, "ertrain", "q2rtn CLI tests");
    char out[600];
    snprintf(out, sizeof out, "%s/q2rtn", fx.tmp);
    CmdResult r = helper_run(fx.tmp, "'%s' quantize --model '%s' --out '%s' --weights q2rtn --threads 1", fx.prog,
                             fx.model, out);
    cr_assert_eq(r.status, 0, "quantize failed: %s", r.err);
    helper_result_free(&r);
    cJSON *cfg = helper_read_json(out, "config.json");
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(cfg, "quantization_config");
    cr_assert_str_eq(str_of(q, "weights"), "q2lut");
    cr_assert_str_eq(str_of(q, "method"), "rtn-lp");
    cJSON_Delete(cfg);
    cJSON *run = helper_read_json(out, "run.json");
    cr_assert_str_eq(str_of(run, "weights"), "q2rtn");
    cJSON_Delete(run);
    Model m;
    cr_assert_eq(model_load(&m, out, 0), 0, "%s", er_last_error());
    const Weight *w = &m.layers[0].wup;
    cr_assert_eq(w->fmt, WF_Q2LUT);
    for (int i = 0; i < w->rows; i++) {
        float l[4];
        for (int j = 0; j < 4; j++)
            l[j] = f16_to_f32(w->lut[i * 4 + j]);
        for (int j = 2; j < 4; j++)
            cr_assert(fabsf((l[j] - l[j - 1]) - (l[1] - l[0])) <= 2e-3f * (fabsf(l[0]) + fabsf(l[3])), "row %d", i);
    }
    model_free(&m);
    // The q2lut (k-means) dir of the same model: lower error.
    snprintf(out, sizeof out, "%s/q2lut", fx.tmp);
    r = helper_run(fx.tmp, "'%s' quantize --model '%s' --out '%s' --weights q2lut --threads 1", fx.prog, fx.model, out);
    cr_assert_eq(r.status, 0, "quantize failed: %s", r.err);
    helper_result_free(&r);
    cJSON *a = helper_read_json(out, "run.json");
    snprintf(out, sizeof out, "%s/q2rtn", fx.tmp);
    cJSON *b = helper_read_json(out, "run.json");
    double ea = cJSON_GetObjectItemCaseSensitive(a, "mean_rel_error")->valuedouble,
           eb = cJSON_GetObjectItemCaseSensitive(b, "mean_rel_error")->valuedouble;
    cr_assert(ea < eb, "q2lut error %g not below q2rtn %g", ea, eb);
    cJSON_Delete(a);
    cJSON_Delete(b);
}

Test(quant_cli_q2rtn, bf16_dir) {
    helper_need_program(fx.prog, "ertrain", "q2rtn CLI tests");
    char out[600], calib[600];
    snprintf(out, sizeof out, "%s/bf16", fx.tmp);
    snprintf(calib, sizeof calib, "%s/calib.jsonl", fx.tmp);
    FILE *f = fopen(calib, "w");
    cr_assert(f);
    for (int i = 0; i < 4; i++)
        fprintf(f, "{\"prompt\": \"Start with %d. Add 5.\", \"completion\": \"Answer: %d\"}\n", i, i + 5);
    fclose(f);
    CmdResult r = helper_run(fx.tmp,
                             "'%s' quantize --model '%s' --out '%s' --weights bf16 --calib '%s' --calib-n 2 "
                             "--threads 1", fx.prog, fx.model, out, calib);
    cr_assert_eq(r.status, 0, "bf16 failed: %s", r.err);
    cr_assert(strstr(r.out, "NLL on 2 held-out"), "%s", r.out);
    helper_result_free(&r);
    cJSON *cfg = helper_read_json(out, "config.json");
    cr_assert_null(cJSON_GetObjectItemCaseSensitive(cfg, "quantization_config"));
    cJSON_Delete(cfg);
    Model m, fp;
    cr_assert_eq(model_load(&m, out, 0), 0, "%s", er_last_error());
    cr_assert_eq(m.cfg.dtype, DT_BF16);
    cr_assert_eq(m.layers[1].wq.fmt, WF_BF16);
    cr_assert_eq(model_load(&fp, fx.model, 0), 0, "%s", er_last_error());
    float a[32], b[32];
    weight_row_f32(a, &m.layers[1].wq, 3);
    weight_row_f32(b, &fp.layers[1].wq, 3);
    for (int k = 0; k < 32; k++)
        cr_assert_float_eq(a[k], b[k], 1e-2f * fabsf(b[k]) + 1e-6f);
    model_free(&m);
    model_free(&fp);
    // Refused: Fisher has nothing to weight; --lm-head is for quantized formats.
    snprintf(out, sizeof out, "%s/bad", fx.tmp);
    r = helper_run(fx.tmp, "'%s' quantize --model '%s' --out '%s' --weights bf16 --lm-head q4", fx.prog, fx.model, out);
    cr_assert_eq(r.status, 1);
    cr_assert(strstr(r.err, "--lm-head") && helper_count_lines(r.err) == 1, "%s", r.err);
    helper_result_free(&r);
    r = helper_run(fx.tmp, "'%s' quantize --model '%s' --out '%s' --weights q3", fx.prog, fx.model, out);
    cr_assert_eq(r.status, 1);
    cr_assert(strstr(r.err, "q2rtn") && strstr(r.err, "bf16") && helper_count_lines(r.err) == 1, "%s", r.err);
    helper_result_free(&r);
    cr_assert(!path_exists(out), "a refused run wrote %s", out);
}
