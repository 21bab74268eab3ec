// ertrain outliers: a float model dir -> the same function with the outlier channels of real LLMs
// (train/transform_model.h, transform_model_add_outliers): residual channels carrying the stream's
// dominant directions, norm scales amplifying them and loud MLP channels. A seeded test model for
// quantizers and transforms.
#include <stdio.h>

#include "core/alloc.h"
#include "core/args.h"
#include "core/error.h"
#include "core/fileio.h"
#include "ertrain/cli.h"
#include "train/quantize.h"
#include "train/run.h"
#include "train/transform_model.h"

typedef struct {
    const char *model, *out, *calib, *response_key;
    int calib_n, channels, seed;
    double lo, hi;
} OutliersConfig;

static int outliers_write(const OutliersConfig *o) {
    Model m = {0};
    double *S = NULL, *diag = NULL, share = 0, before = 0, after = 0;
    int *idx = NULL;
    cJSON *j = NULL;
    int rc = ER_OK, seq_len = 1024; // longer calibration records are skipped
    char *stage = NULL;
    ER_CHECK(dir_output_not_input(o->out, o->model, "--model"));
    ER_CHECK(dir_output_not_input(o->out, o->calib, "--calib"));
    ER_CHECK(run_dir_check(o->out, RUN_ONCE, NULL));
    ER_CHECK(model_load(&m, o->model, MODEL_LOAD_TRAINABLE));
    if (m.quant.enabled)
        ER_CHECK(er_error(ER_EINVAL, "%s is quantized: outliers are added to a float model", o->model));
    int C = m.cfg.C, N = 2 * m.cfg.L + 1;
    S = er_alloc(sizeof(double) * (size_t)C * C), diag = er_alloc(sizeof(double) * (size_t)N * C);
    idx = er_alloc(sizeof(int) * (size_t)o->channels);
    if (!S || !diag || !idx)
        ER_CHECK(er_error(ER_ENOMEM, "outliers: no memory for the %d x %d second moment", C, C));
    ER_CHECK(quantize_stream_moments(&m, o->model, o->calib, o->response_key, o->calib_n, seq_len, S, diag));
    ER_CHECK(transform_stream_ratio(&m, diag, &before));
    ER_CHECK(transform_model_add_outliers(&m, S, o->channels, (float)o->lo, (float)o->hi, (uint64_t)o->seed, idx,
                                          &share));
    ER_CHECK(quantize_stream_moments(&m, o->model, o->calib, o->response_key, o->calib_n, seq_len, NULL, diag));
    ER_CHECK(transform_stream_ratio(&m, diag, &after));
    // Written beside --out and renamed onto it once whole: a failed write leaves no half a model.
    ER_CHECK(dir_stage_open(o->out, &stage));
    ER_CHECK(quantize_write_dir(&m, o->model, stage, 0, stdout));
    if (!(j = cJSON_CreateObject()))
        ER_CHECK(ER_ENOMEM);
    cJSON_AddStringToObject(j, "command", "outliers");
    cJSON_AddStringToObject(j, "version", ERTRAIN_VERSION);
    run_add_path(j, "model", o->model);
    run_add_path(j, "calib", o->calib);
    RunNumber nums[] = {{"calib_n", o->calib_n}, {"channels", o->channels}, {"min", o->lo}, {"max", o->hi},
                        {"seed", o->seed}, {"dominant_share", share}, {"ratio_before", before},
                        {"norm_ratio", after}};
    run_add_numbers(j, nums, sizeof nums / sizeof nums[0]);
    cJSON *ch = cJSON_AddArrayToObject(j, "residual_channels");
    for (int i = 0; ch && i < o->channels; i++)
        cJSON_AddItemToArray(ch, cJSON_CreateNumber(idx[i]));
    ER_CHECK(run_write_json(stage, j));
    rc = dir_stage_commit(stage, o->out);
    stage = NULL;
    ER_CHECK(rc);
    printf("wrote %s: the residual stream's %d dominant directions (%.1f%% of its energy on %s) rotated onto "
           "channels", o->out, o->channels, 100 * share, o->calib);
    for (int i = 0; i < o->channels; i++)
        printf("%s %d", i ? "," : "", idx[i]);
    printf(", norm scales x%g..%g on them and %d MLP channels per layer; loudest channel of the normalised stream "
           "%.1fx the median (%.1fx before)\n", o->lo, o->hi, o->channels, after, before);
done:
    dir_stage_abort(stage);
    cJSON_Delete(j);
    er_free(S), er_free(diag), er_free(idx);
    model_free(&m);
    return rc;
}

int cmd_outliers(int argc, char **argv) {
    OutliersConfig o = {.calib_n = 16, .channels = 2, .seed = 1, .lo = 4, .hi = 20};
    ArgSpec specs[] = {
        {"model", ARG_STR, &o.model, "float model dir (HF layout; its tokenizer is copied)", 1, 0, 0},
        {"out", ARG_STR, &o.out, "output model dir (absent or empty)", 1, 0, 0},
        {"calib", ARG_STR, &o.calib, "records (JSONL, any dataset record type) the residual stream is measured on", 1,
         0, 0},
        {"calib-n", ARG_INT, &o.calib_n, "records measured", 0, 1, 1 << 20},
        {"response-key", ARG_STR, &o.response_key, "record field holding the response (e.g. verbose for chains)", 0, 0,
         0},
        {"channels", ARG_INT, &o.channels, "residual and MLP outlier channels (per layer for the MLP)", 0, 1,
         OUTLIERS_MAX_ALIGNED},
        {"min", ARG_FLOAT, &o.lo, "smallest norm-scale / MLP factor", 0, 1, 1e6},
        {"max", ARG_FLOAT, &o.hi, "largest factor (factors are log-uniform in [min, max])", 0, 1, 1e6},
        {"seed", ARG_INT, &o.seed, "seed of the channels, the factors and the rotation's completion", 0, 0,
         2147483647},
    };
    int rc = args_parse(argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "ertrain outliers --model DIR --out DIR --calib FILE.jsonl [--calib-n 16] [--channels 2] "
                        "[--min 4 --max 20] [--seed 1]\n"
                        "(the same function with outlier channels: the residual stream rotated so its dominant "
                        "directions are channels, norm scales amplifying those channels, loud MLP channels)");
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0 || outliers_write(&o) < 0)
        return cli_fail("outliers");
    return 0;
}
