// ertrain outliers: a float model dir -> the same model with outlier channels (train/transform_model.h,
// transform_model_add_outliers): a seeded test model for quantizers. Not for transforms: the outliers
// are the inverses of the norm folding and the closed-form T_u that rotate / fpt / fpt-trained start
// with, which undo them exactly (q4 + fpt reports the tiny base's relative error and NLL).
#include <stdio.h>

#include "core/args.h"
#include "core/error.h"
#include "ertrain/cli.h"
#include "train/quantize.h"
#include "train/run.h"
#include "train/transform_model.h"

static int outliers_write(const char *model_dir, const char *out_dir, int channels, double lo, double hi, int seed) {
    Model m = {0};
    double ratio = 0;
    cJSON *j = NULL;
    int rc = ER_OK;
    ER_CHECK(run_dir_check(out_dir, RUN_ONCE));
    ER_CHECK(model_load(&m, model_dir, MODEL_LOAD_TRAINABLE));
    if (m.quant.enabled)
        ER_CHECK(er_error(ER_EINVAL, "%s is quantized: outliers are added to a float model", model_dir));
    ER_CHECK(transform_model_add_outliers(&m, channels, (float)lo, (float)hi, (uint64_t)seed, &ratio));
    ER_CHECK(quantize_write_dir(&m, model_dir, out_dir, 0, stdout));
    if (!(j = cJSON_CreateObject()))
        ER_CHECK(ER_ENOMEM);
    cJSON_AddStringToObject(j, "command", "outliers");
    cJSON_AddStringToObject(j, "version", ERTRAIN_VERSION);
    run_add_path(j, "model", model_dir);
    RunNumber nums[] = {{"channels", channels}, {"min", lo}, {"max", hi}, {"seed", seed}, {"norm_ratio", ratio}};
    run_add_numbers(j, nums, sizeof nums / sizeof nums[0]);
    ER_CHECK(run_write_json(out_dir, j));
    printf("wrote %s: %d residual and %d MLP outlier channels per layer, factors %g..%g; loudest normalised channel "
           "%.1fx the median\n", out_dir, channels, channels, lo, hi, ratio);
done:
    cJSON_Delete(j);
    model_free(&m);
    return rc;
}

int cmd_outliers(int argc, char **argv) {
    const char *model = NULL, *out = NULL;
    int channels = 4, seed = 1;
    double lo = 20, hi = 100;
    ArgSpec specs[] = {
        {"model", ARG_STR, &model, "float model dir (HF layout; its tokenizer is copied)", 1, 0, 0},
        {"out", ARG_STR, &out, "output model dir (absent or empty)", 1, 0, 0},
        {"channels", ARG_INT, &channels, "residual and MLP outlier channels per layer", 0, 1, 1 << 20},
        {"min", ARG_FLOAT, &lo, "smallest outlier factor", 0, 1, 1e6},
        {"max", ARG_FLOAT, &hi, "largest outlier factor (factors are log-uniform in [min, max])", 0, 1, 1e6},
        {"seed", ARG_INT, &seed, "seed of the channels and factors", 0, 0, 2147483647},
    };
    int rc = args_parse(argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "ertrain outliers --model DIR --out DIR [--channels 4] [--min 20 --max 100] [--seed 1]\n"
                        "(a test of quantizers without transforms: rotate / fpt / fpt-trained fold the norms and "
                        "balance up/down first, which undoes these outliers exactly)");
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0 || outliers_write(model, out, channels, lo, hi, seed) < 0)
        return cli_fail("outliers");
    return 0;
}
