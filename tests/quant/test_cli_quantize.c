// ertrain quantize run as a user runs it ($ER_BUILD/ertrain on a tiny random model dir in /tmp): the
// output dir (packed tensors, quantization_config, tokenizer, run.json) loads, erinfer generates from
// it, ertrain sft trains an adapter on it; Fisher sensitivity with --calib reports NLL before/after;
// bad flags give one error line and exit 1 without writing anything.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "tests/common/helpers.h"

static HelperFixture fx; // per test: the temp dir, tmp/model, $ER_BUILD/ertrain
static char *erinfer, *calib;

static void setup(void) {
    helper_fixture_open(&fx, "er_qcli_", "ertrain");
    erinfer = helper_program("erinfer");
    calib = path_join(fx.tmp, "calib.jsonl");
    FILE *f = fopen(calib, "w");
    cr_assert(f);
    for (int i = 0; i < 6; i++)
        fprintf(f, "{\"prompt\": \"Start with %d. Add 5. What is the result?\", \"completion\": \"%d + 5 = %d\\nAnswer: %d\"}\n",
                i, i, i + 5, i + 5);
    fclose(f);
}

static void teardown(void) {
    helper_fixture_close(&fx);
    er_free(calib);
    er_free(erinfer);
}

TestSuite(quant_cli, .init = setup, .fini = teardown);

static void need_programs(void) {
    if (!fx.prog || !erinfer)
        cr_skip_test("!!!!!! %s/ertrain or erinfer is MISSING: run `make` (or set ER_BUILD) - quantize CLI tests SKIPPED !!!!!!",
                     helper_build_dir());
}

Test(quant_cli, quantize_generate_and_sft) {
    need_programs();
    char out[600];
    snprintf(out, sizeof out, "%s/q4g32", fx.tmp);
    CmdResult r = helper_run(fx.tmp, "'%s' quantize --model '%s' --out '%s' --weights q4g32 --threads 1", fx.prog,
                             fx.model, out);
    cr_assert_eq(r.status, 0, "quantize failed: %s", r.err);
    cr_assert(strstr(r.out, "bits per weight: 5.000"), "%s", r.out);
    cr_assert(strstr(r.out, "layer   1"), "per-layer errors expected: %s", r.out);
    helper_result_free(&r);
    cJSON *cfg = helper_read_json(out, "config.json");
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(cfg, "quantization_config");
    cr_assert(cJSON_IsObject(q));
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(q, "weights")->valuestring, "q4g32");
    cr_assert_eq(cJSON_GetObjectItemCaseSensitive(q, "group_size")->valueint, 32);
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(q, "embeddings")->valuestring, "int8");
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(q, "lm_head")->valuestring, "q8"); // tied: the embedding
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(q, "transforms")->valuestring, "none");
    cr_assert_float_eq(cJSON_GetObjectItemCaseSensitive(q, "bits_per_weight")->valuedouble, 5.0, 1e-9);
    cJSON_Delete(cfg);
    cJSON_Delete(helper_read_json(out, "run.json"));
    char *tj = path_join(out, "tokenizer.json");
    cr_assert(path_exists(tj));
    er_free(tj);

    Model m;
    cr_assert_eq(model_load(&m, out, 0), 0, "%s", er_last_error());
    cr_assert_eq(m.layers[0].wgate.fmt, WF_Q4G);
    cr_assert_eq(m.embed.fmt, WF_Q8);
    model_free(&m);

    r = helper_run(fx.tmp,
                   "'%s' generate --model '%s' --prompt 'Start with 7. Add 5.' --max-new 6 --samples 2 --json "
                   "--threads 1", erinfer, out);
    cr_assert_eq(r.status, 0, "erinfer on the quantized dir failed: %s", r.err);
    cJSON *g = cJSON_Parse(r.out);
    cr_assert(g, "no JSON: %s", r.out);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(g, "samples")), 2);
    cJSON_Delete(g);
    helper_result_free(&r);

    r = helper_run(fx.tmp,
                   "'%s' sft --model '%s' --data '%s' --out '%s/sft' --steps 2 --batch 2 --seq-len 64 --threads 1",
                   fx.prog, out, calib, fx.tmp);
    cr_assert_eq(r.status, 0, "sft on the quantized base failed: %s", r.err);
    helper_result_free(&r);
    char *ad = path_join(fx.tmp, "sft/adapter_model.safetensors");
    cr_assert(path_exists(ad), "no adapter written");
    er_free(ad);
}

Test(quant_cli, fisher_calibration_and_nll) {
    need_programs();
    const char *ws[] = {"q2lut", "q8"};
    for (int i = 0; i < 2; i++) {
        char out[600];
        snprintf(out, sizeof out, "%s/%s", fx.tmp, ws[i]);
        CmdResult r = helper_run(fx.tmp,
                                 "'%s' quantize --model '%s' --out '%s' --weights %s --embeddings fp --calib '%s' "
                                 "--calib-n 3 --seq-len 64 --threads 1",
                                 fx.prog, fx.model, out, ws[i], calib);
        cr_assert_eq(r.status, 0, "quantize %s failed: %s", ws[i], r.err);
        cr_assert(strstr(r.out, "fisher: squared gradients over 3"), "%s", r.out);
        cr_assert(strstr(r.out, "NLL on 3 held-out calibration sequences"), "%s", r.out);
        helper_result_free(&r);
        cJSON *cfg = helper_read_json(out, "config.json");
        const cJSON *q = cJSON_GetObjectItemCaseSensitive(cfg, "quantization_config");
        cr_assert(strstr(cJSON_GetObjectItemCaseSensitive(q, "method")->valuestring, "fisher"));
        cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(q, "embeddings")->valuestring, "fp");
        cJSON_Delete(cfg);
        cJSON *run = helper_read_json(out, "run.json");
        double before = cJSON_GetObjectItemCaseSensitive(run, "nll_before")->valuedouble;
        double after = cJSON_GetObjectItemCaseSensitive(run, "nll_after")->valuedouble;
        cr_assert(before > 0 && after > 0, "NLL %g -> %g", before, after);
        cJSON_Delete(run);
        Model m;
        cr_assert_eq(model_load(&m, out, 0), 0, "%s", er_last_error());
        cr_assert_eq(m.embed.fmt, WF_F32);
        model_free(&m);
    }
}

// A tied model with --lm-head q4 next to int8 embeddings is untied: its own packed lm_head.
Test(quant_cli, tied_model_w4_lm_head) {
    need_programs();
    char out[600];
    snprintf(out, sizeof out, "%s/w4head", fx.tmp);
    CmdResult r = helper_run(fx.tmp, "'%s' quantize --model '%s' --out '%s' --weights q4 --lm-head q4 --threads 1",
                             fx.prog, fx.model, out);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "untied"), "%s", r.out);
    helper_result_free(&r);
    cJSON *cfg = helper_read_json(out, "config.json");
    cr_assert(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(cfg, "tie_word_embeddings")));
    cJSON_Delete(cfg);
    Model m;
    cr_assert_eq(model_load(&m, out, 0), 0, "%s", er_last_error());
    cr_assert_eq(m.embed.fmt, WF_Q8);
    cr_assert_eq(m.lm_head.fmt, WF_Q4);
    model_free(&m);
    r = helper_run(fx.tmp, "'%s' generate --model '%s' --prompt 'Start with 7.' --max-new 4 --threads 1", erinfer, out);
    cr_assert_eq(r.status, 0, "%s", r.err);
    helper_result_free(&r);
}

// Function-preserving transforms before quantizing: recorded in quantization_config, the float NLL is
// unchanged by them, and the result loads and runs.
Test(quant_cli, transforms_then_quantize) {
    need_programs();
    const char *modes[] = {"none", "rotate", "fpt"};
    double nll_none = 0;
    for (int i = 0; i < 3; i++) {
        char out[600];
        snprintf(out, sizeof out, "%s/t_%s", fx.tmp, modes[i]);
        CmdResult r = helper_run(fx.tmp,
                                 "'%s' quantize --model '%s' --out '%s' --weights q4 --transforms %s --seed 3 --calib '%s' "
                                 "--calib-n 3 --sensitivity none --seq-len 64 --threads 1",
                                 fx.prog, fx.model, out, modes[i], calib);
        cr_assert_eq(r.status, 0, "quantize --transforms %s failed: %s", modes[i], r.err);
        if (i > 0)
            cr_assert(strstr(r.out, "transforms"), "%s", r.out);
        helper_result_free(&r);
        cJSON *cfg = helper_read_json(out, "config.json");
        const cJSON *q = cJSON_GetObjectItemCaseSensitive(cfg, "quantization_config");
        cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(q, "transforms")->valuestring, modes[i]);
        cJSON_Delete(cfg);
        cJSON *run = helper_read_json(out, "run.json");
        double nll = cJSON_GetObjectItemCaseSensitive(run, "nll_before")->valuedouble;
        cJSON_Delete(run);
        if (i == 0)
            nll_none = nll;
        cr_assert(fabs(nll - nll_none) < 1e-4 * (1 + nll_none), "%s changed the float model's NLL: %.7g vs %.7g",
                  modes[i], nll, nll_none);
        Model m;
        cr_assert_eq(model_load(&m, out, 0), 0, "%s", er_last_error());
        cr_assert_eq(m.layers[0].wq.fmt, WF_Q4);
        model_free(&m);
        r = helper_run(fx.tmp, "'%s' generate --model '%s' --prompt 'Start with 7.' --max-new 4 --threads 1", erinfer,
                       out);
        cr_assert_eq(r.status, 0, "%s", r.err);
        helper_result_free(&r);
    }
}

// Runs ertrain quantize on the fixture model with `flags` into fx.tmp/name (asserting success; its
// stdout into *out_text when not NULL) and returns that dir (static buffer).
static const char *quantize_ok(const char *name, const char *flags, char **out_text) {
    static char out[600];
    snprintf(out, sizeof out, "%s/%s", fx.tmp, name);
    CmdResult r = helper_run(fx.tmp, "'%s' quantize --model '%s' --out '%s' %s --calib '%s' --calib-n 3 --seq-len 64 "
                             "--threads 1", fx.prog, fx.model, out, flags, calib);
    cr_assert_eq(r.status, 0, "quantize %s failed: %s", flags, r.err);
    if (out_text)
        *out_text = strdup(r.out);
    helper_result_free(&r);
    return out;
}

// --transforms fpt-trained: the transforms trained (metrics.jsonl, checkpoint/, run.json's "fpt") and
// merged without changing the float model's NLL; q2lut with --calib gets GPTQ codes ("-gptq" method), and
// with --sparse its corrections.
Test(quant_cli, fpt_trained_and_gptq_codes) {
    need_programs();
    cJSON *none = helper_read_json(quantize_ok("f_none", "--weights q4", NULL), "run.json");
    const char *dir = quantize_ok("f_tr", "--weights q4 --transforms fpt-trained --fpt-steps 3 --fpt-local-steps 2 "
                                  "--save-every 2", NULL);
    cJSON *run = helper_read_json(dir, "run.json"), *cfg = helper_read_json(dir, "config.json");
    double n0 = cJSON_GetObjectItemCaseSensitive(none, "nll_before")->valuedouble,
           n1 = cJSON_GetObjectItemCaseSensitive(run, "nll_before")->valuedouble;
    cr_assert(fabs(n1 - n0) < 1e-4 * (1 + n0), "the merged transforms changed the float NLL: %.7g vs %.7g", n1, n0);
    cr_assert_null(cJSON_GetObjectItemCaseSensitive(none, "fpt"));
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(run, "fpt");
    cr_assert(cJSON_IsObject(f) && cJSON_GetObjectItemCaseSensitive(f, "kl_before")->valuedouble > 0);
    char *metrics = path_join(dir, "metrics.jsonl"), *state = path_join(dir, "checkpoint/state.json");
    cr_assert(path_exists(metrics) && path_exists(state), "metrics.jsonl and checkpoint/ expected in %s", dir);
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(cfg, "quantization_config");
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(q, "transforms")->valuestring, "fpt-trained");
    cJSON_Delete(none), cJSON_Delete(run), cJSON_Delete(cfg);
    er_free(metrics), er_free(state);
    // Resuming with another seed (other rotations: another result), or after the calibration file changed,
    // is refused, naming the setting.
    for (int k = 0; k < 2; k++) {
        if (k == 1) {
            FILE *cf = fopen(calib, "a");
            cr_assert(cf);
            fprintf(cf, "{\"prompt\": \"Start with 9. Add 5.\", \"completion\": \"Answer: 14\"}\n");
            fclose(cf);
        }
        CmdResult rr = helper_run(fx.tmp, "'%s' quantize --model '%s' --out '%s' --weights q4 --transforms fpt-trained "
                                  "--fpt-steps 3 --fpt-local-steps 2 --save-every 2 --calib '%s' --calib-n 3 "
                                  "--seq-len 64 --threads 1 --resume --seed %d", fx.prog, fx.model, dir, calib,
                                  k ? 0 : 7);
        cr_assert_eq(rr.status, 1, "resume with another %s: status %d", k ? "calibration file" : "seed", rr.status);
        cr_assert(strstr(rr.err, k ? "calib.jsonl: the file changed since the checkpoint" : "seed = 0"), "%s", rr.err);
        helper_result_free(&rr);
    }
    char *text = NULL;
    dir = quantize_ok("g", "--weights q2lut", &text);
    cfg = helper_read_json(dir, "config.json");
    cJSON *dense = helper_read_json(dir, "run.json");
    cr_assert(strstr(text, "gptq:"), "%s", text);
    q = cJSON_GetObjectItemCaseSensitive(cfg, "quantization_config");
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(q, "method")->valuestring, "kmeans-fisher-gptq");
    cr_assert_null(cJSON_GetObjectItemCaseSensitive(q, "sparse_per_row"));
    cJSON_Delete(cfg);
    free(text);
    // Dense-and-sparse: the corrections are in the dir and cost their 32 bits each (what they buy is
    // quantizer::dense_and_sparse_corrections'; on this random model the NLL moves either way).
    dir = quantize_ok("gs", "--weights q2lut --sparse 4", NULL);
    cfg = helper_read_json(dir, "config.json"), run = helper_read_json(dir, "run.json");
    q = cJSON_GetObjectItemCaseSensitive(cfg, "quantization_config");
    cr_assert_eq(cJSON_GetObjectItemCaseSensitive(q, "sparse_per_row")->valueint, 4);
    double bits0 = cJSON_GetObjectItemCaseSensitive(dense, "bits_per_weight")->valuedouble,
           bits1 = cJSON_GetObjectItemCaseSensitive(run, "bits_per_weight")->valuedouble,
           nll0 = cJSON_GetObjectItemCaseSensitive(dense, "nll_after")->valuedouble,
           nll1 = cJSON_GetObjectItemCaseSensitive(run, "nll_after")->valuedouble;
    fprintf(stderr, "quant_cli: q2lut %.3f bits/weight, NLL %.4f; with 4 sparse per row %.3f, %.4f\n", bits0, nll0,
            bits1, nll1);
    cr_assert(bits1 > bits0 && isfinite(nll1), "sparse: %.3f bits, NLL %.4f; dense %.3f, %.4f", bits1, nll1, bits0,
              nll0);
    cJSON_Delete(cfg), cJSON_Delete(run), cJSON_Delete(dense);
}

// Activations that overflow (a v_proj of huge finite weights) make GPTQ's input second moments of the
// o_proj Inf: one error line naming that matrix, not codes fitted to garbage.
Test(quant_cli, non_finite_second_moments_name_the_matrix) {
    need_programs();
    Model m;
    cr_assert_eq(model_load(&m, fx.model, MODEL_LOAD_TRAINABLE), 0, "%s", er_last_error());
    const ParamTensor *v = model_find_param(&m, "model.layers.0.self_attn.v_proj.weight");
    cr_assert(v);
    for (size_t i = 0; i < v->numel; i++)
        v->data[i] = 3e38f;
    char dir[600], out[600];
    snprintf(dir, sizeof dir, "%s/huge", fx.tmp);
    snprintf(out, sizeof out, "%s/huge_q2", fx.tmp);
    cr_assert_eq(model_save(&m, dir, 0), 0, "%s", er_last_error());
    model_free(&m);
    helper_copy_file("data/tiny_tokenizer/tokenizer.json", dir, "tokenizer.json");
    helper_copy_file("data/tiny_tokenizer/tokenizer_config.json", dir, "tokenizer_config.json");
    CmdResult r = helper_run(fx.tmp, "'%s' quantize --model '%s' --out '%s' --weights q2lut --sensitivity none --calib "
                             "'%s' --calib-n 3 --seq-len 64 --threads 1", fx.prog, dir, out, calib);
    cr_assert_eq(r.status, 1, "status %d: %s", r.status, r.err);
    cr_assert(strstr(r.err, "model.layers.0.o_proj are not finite"), "%s", r.err);
    cr_assert_eq(helper_count_lines(r.err), 1, "%s", r.err);
    helper_result_free(&r);
}

Test(quant_cli, bad_flags_are_one_line_errors) {
    need_programs();
    struct {
        const char *flags, *expect;
    } cases[] = {
        {"--weights q3", "--weights \"q3\""},
        {"--weights q4 --embeddings int4", "--embeddings"},
        {"--weights q4 --transforms spin", "--transforms"},
        {"--weights q4 --sensitivity fisher", "--calib"},
        {"--weights q4 --sensitivity magic --calib x.jsonl", "--sensitivity"},
        {"--weights q4 --scale-search best", "--scale-search"},
        {"--weights q4g128", "does not divide"},
        {"--weights q4 --lm-head q9", "--lm-head"},
        {"--weights q4 --transforms fpt-trained", "--calib"},
        {"--weights bf16 --transforms fpt-trained", "bf16"},
        {"--weights q4 --resume", "--resume"},
        {"--weights q2lut --error-feedback gptq", "--calib"},
        {"--weights q4 --error-feedback gptq --calib x.jsonl", "k-means codebook"},
        {"--weights q2lut --error-feedback more --calib x.jsonl", "--error-feedback"},
        {"--weights q4 --sparse 2", "--sparse 2"},
        {"--weights q2rtn --sparse 1", "k-means codebook"},
        {"--weights bf16 --sparse 1", "k-means codebook"},
        {"--weights q2lut --sparse 65536", "do not fit"},
        {"", "--weights"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[600];
        snprintf(out, sizeof out, "%s/bad%zu", fx.tmp, i);
        CmdResult r = helper_run(fx.tmp, "'%s' quantize --model '%s' --out '%s' %s --threads 1", fx.prog, fx.model, out,
                                 cases[i].flags);
        cr_assert_eq(r.status, 1, "%s: status %d", cases[i].flags, r.status);
        cr_assert(strstr(r.err, cases[i].expect), "%s: stderr \"%s\" should mention %s", cases[i].flags, r.err,
                  cases[i].expect);
        cr_assert_eq(helper_count_lines(r.err), 1, "%s: one error line expected: %s", cases[i].flags, r.err);
        char *cfg = path_join(out, "config.json");
        cr_assert(!path_exists(cfg), "%s: output written despite the error", cases[i].flags);
        er_free(cfg);
        helper_result_free(&r);
    }
    // an already quantized model is refused as input
    char q[600], again[600];
    snprintf(q, sizeof q, "%s/q8", fx.tmp);
    snprintf(again, sizeof again, "%s/again", fx.tmp);
    CmdResult r = helper_run(fx.tmp, "'%s' quantize --model '%s' --out '%s' --weights q8 --threads 1", fx.prog,
                             fx.model, q);
    cr_assert_eq(r.status, 0, "%s", r.err);
    helper_result_free(&r);
    r = helper_run(fx.tmp, "'%s' quantize --model '%s' --out '%s' --weights q4 --threads 1", fx.prog, q, again);
    cr_assert_eq(r.status, 1);
    cr_assert(strstr(r.err, "already quantized"), "%s", r.err);
    helper_result_free(&r);
    r = helper_run(fx.tmp, "'%s' quantize --help", fx.prog);
    cr_assert_eq(r.status, 0);
    cr_assert(strstr(r.out, "--weights") && strstr(r.out, "--calib") && strstr(r.out, "--sensitivity"), "%s", r.out);
    helper_result_free(&r);
}

// An output dir that is in the way is refused without pointing at a --resume quantize does not have;
// a NaN in the float model is refused by name before anything is written (it hid in a q4 model that
// then generated).
Test(quant_cli, nonempty_out_and_nan_weights) {
    need_programs();
    char out[600];
    snprintf(out, sizeof out, "%s/busy", fx.tmp);
    cr_assert_eq(dir_make(out), 0);
    char *f = path_join(out, "keep.txt");
    cr_assert_eq(file_write_atomic(f, "x", 1), 0);
    er_free(f);
    CmdResult r = helper_run(fx.tmp, "'%s' quantize --model '%s' --out '%s' --weights q4", fx.prog, fx.model, out);
    cr_assert(!strstr(r.err, "--resume"), "quantize has no --resume: %s", r.err);
    helper_expect_error(&r, "quantize, non-empty out", "not empty");

    Model m;
    cr_assert_eq(model_load(&m, fx.model, MODEL_LOAD_TRAINABLE), 0, "%s", er_last_error());
    ((ParamTensor *)model_find_param(&m, "model.layers.1.mlp.gate_proj.weight"))->data[11] = NAN;
    char *nan_dir = path_join(fx.tmp, "nan");
    cr_assert_eq(model_save(&m, nan_dir, 0), 0, "%s", er_last_error());
    model_free(&m);
    helper_copy_file("data/tiny_tokenizer/tokenizer.json", nan_dir, "tokenizer.json");
    snprintf(out, sizeof out, "%s/q4nan", fx.tmp);
    r = helper_run(fx.tmp, "'%s' quantize --model '%s' --out '%s' --weights q4", fx.prog, nan_dir, out);
    helper_expect_error(&r, "quantize of a NaN model", "model.layers.1.mlp.gate_proj.weight");
    cr_assert(!path_exists(out), "a refused quantize wrote %s", out);
    er_free(nan_dir);
}

// Token-weighted mean NLL erinfer score gives model dir `model` on the calibration records.
static double score_nll(const char *model) {
    CmdResult r = helper_run(fx.tmp, "'%s' score --model '%s' --input '%s' --threads 1", erinfer, model, calib);
    cr_assert_eq(r.status, 0, "score failed: %s", r.err);
    double s = 0, n = 0;
    for (char *line = strtok(r.out, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        cr_assert(j, "not JSON: %s", line);
        double k = cJSON_GetObjectItemCaseSensitive(j, "n")->valuedouble;
        s += cJSON_GetObjectItemCaseSensitive(j, "nll")->valuedouble * k, n += k;
        cJSON_Delete(j);
    }
    helper_result_free(&r);
    cr_assert(n > 0);
    return s / n;
}

// ertrain outliers: the same function (erinfer score's NLL), louder outlier channels measured on the
// calibration records (run.json); bad flags refused before anything is written.
Test(quant_cli, outlier_model) {
    need_programs();
    char out[600];
    snprintf(out, sizeof out, "%s/outliers", fx.tmp);
    CmdResult r = helper_run(fx.tmp, "'%s' outliers --model '%s' --out '%s' --calib '%s' --calib-n 6 --seed 3",
                             fx.prog, fx.model, out, calib);
    cr_assert_eq(r.status, 0, "outliers failed: %s", r.err);
    cr_assert(strstr(r.out, "loudest channel of the normalised stream"), "%s", r.out);
    helper_result_free(&r);
    double n0 = score_nll(fx.model), n1 = score_nll(out);
    cr_assert(fabs(n1 - n0) <= 1e-4 * n0, "the outlier model changed the NLL: %.7g vs %.7g", n1, n0);
    cJSON *run = helper_read_json(out, "run.json");
    double before = cJSON_GetObjectItemCaseSensitive(run, "ratio_before")->valuedouble,
           after = cJSON_GetObjectItemCaseSensitive(run, "norm_ratio")->valuedouble,
           share = cJSON_GetObjectItemCaseSensitive(run, "dominant_share")->valuedouble;
    cr_assert(after >= 4 && after > before, "loudest channel %gx the median (%gx before)", after, before);
    cr_assert(share > 0 && share < 1, "dominant share %g", share);
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(run, "residual_channels")), 2);
    cJSON_Delete(run);
    const char *bad[][2] = {
        {"", "--calib"},                            // no calibration data: nothing to align the stream with
        {"--calib-n 0", "--calib-n"},               // out of range
        {"--channels 65", "--channels"},            // more dominant directions than the command aligns
        {"--min 20 --max 4", "1 <= lo <= hi"},      // an empty range
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(out, sizeof out, "%s/outliers-bad%zu", fx.tmp, i);
        r = helper_run(fx.tmp, "'%s' outliers --model '%s' --out '%s' %s%s%s %s", fx.prog, fx.model, out,
                       i ? "--calib '" : "", i ? calib : "", i ? "'" : "", bad[i][0]);
        cr_assert_eq(r.status, 1, "%s: status %d", bad[i][0], r.status);
        cr_assert(strstr(r.err, bad[i][1]), "%s: %s", bad[i][0], r.err);
        cr_assert(!path_exists(out), "%s: %s was written", bad[i][0], out);
        helper_result_free(&r);
    }
}

// Resuming a finished fpt-trained run writes its outputs again and logs the end-of-run eval once (was: a
// second "eval" line appended to metrics.jsonl each time).
Test(quant_cli, resumed_finished_fpt_run_logs_its_eval_once) {
    need_programs();
    const char *flags = "--weights q4 --transforms fpt-trained --fpt-steps 2 --fpt-local-steps 1";
    char dir[600];
    snprintf(dir, sizeof dir, "%s", quantize_ok("fr", flags, NULL));
    char resume[256];
    snprintf(resume, sizeof resume, "%s --resume", flags);
    quantize_ok("fr", resume, NULL);
    char *metrics = path_join(dir, "metrics.jsonl"), *text;
    size_t n;
    cr_assert_eq(file_read_all(metrics, 1 << 20, &text, &n), 0, "%s", er_last_error());
    int evals = 0;
    for (const char *p = text; (p = strstr(p, "\"stage\":\"eval\"")); p++)
        evals++;
    cr_assert_eq(evals, 1, "metrics.jsonl holds %d eval lines:\n%s", evals, text);
    cr_assert_eq(helper_count_lines(text), 4, "3 steps and the eval expected:\n%s", text);
    er_free(text);
    er_free(metrics);
}

// Outputs are checked before any work: a --out that is a link to nothing, or under a file, is refused
// before the model loads (was: refused at the rename, after quantizing).
Test(quant_cli, bad_out_refused_before_any_work) {
    need_programs();
    char *dangling = path_join(fx.tmp, "dangling"), *file = path_join(fx.tmp, "file"), *under = path_join(file, "q");
    cr_assert_eq(symlink("nowhere", dangling), 0);
    cr_assert_eq(file_write_atomic(file, "x", 1), 0);
    const char *outs[] = {dangling, under};
    const char *why[] = {"symbolic link to nothing", "not a directory"};
    for (int i = 0; i < 2; i++) {
        CmdResult r = helper_run(fx.tmp, "'%s' quantize --model '%s' --out '%s' --weights q4 --threads 1", fx.prog,
                                 fx.model, outs[i]);
        cr_assert(!strstr(r.out, "quantizing"), "%s was refused only after the work:\n%s", outs[i], r.out);
        helper_expect_error(&r, outs[i], why[i]);
    }
    er_free(dangling), er_free(file), er_free(under);
}

// A quantize whose last write fails (the source's tokenizer.json cannot be read) leaves no output dir,
// so the same command runs again once the cause is gone (was: config.json and model.safetensors without
// tokenizer.json, erinfer then saying only "tokenizer.json: cannot open", and the rerun refused as a
// non-empty --out). In `> log 2>&1` the error comes after the report it ends (was: first, stdout being
// flushed at exit).
Test(quant_cli, failed_write_leaves_no_partial_dir_and_error_comes_last) {
    need_programs();
    char *tj = path_join(fx.model, "tokenizer.json"), *out = path_join(fx.tmp, "q"), *log = path_join(fx.tmp, "log");
    cr_assert_eq(unlink(tj), 0);
    cr_assert_eq(dir_make(tj), 0); // a directory where the tokenizer file should be
    CmdResult r = helper_run(fx.tmp, "('%s' quantize --model '%s' --out '%s' --weights q4 --threads 1 > '%s' 2>&1)",
                             fx.prog, fx.model, out, log);
    cr_assert_eq(r.status, 1, "%s", r.err);
    helper_result_free(&r);
    char *text;
    size_t n;
    cr_assert_eq(file_read_all(log, 1 << 20, &text, &n), 0);
    cr_assert(strstr(text, "quantizing to q4"), "%s", text);
    const char *last = text + n - 1;
    while (last > text && last[-1] != '\n')
        last--;
    cr_assert(strncmp(last, "ertrain quantize: ", 18) == 0 && strstr(last, "tokenizer.json"),
              "the error is not the log's last line:\n%s", text);
    er_free(text);
    cr_assert(!path_exists(out), "a failed quantize left %s behind", out);
    r = helper_run(fx.tmp, "ls -a '%s' | grep -c tmp", fx.tmp);
    cr_assert_str_eq(r.out, "0\n", "a staging dir was left behind");
    helper_result_free(&r);
    cr_assert_eq(rmdir(tj), 0);
    helper_copy_file("data/tiny_tokenizer/tokenizer.json", fx.model, "tokenizer.json");
    r = helper_run(fx.tmp, "'%s' quantize --model '%s' --out '%s' --weights q4 --threads 1", fx.prog, fx.model, out);
    cr_assert_eq(r.status, 0, "the rerun failed: %s", r.err);
    helper_result_free(&r);
    r = helper_run(fx.tmp, "'%s' generate --model '%s' --prompt hi --max-new 2 --threads 1", erinfer, out);
    cr_assert_eq(r.status, 0, "%s", r.err);
    helper_result_free(&r);
    er_free(tj), er_free(out), er_free(log);
}
