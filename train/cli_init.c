// ertrain init: a randomly initialised model dir from a config.json (the starting point of
// pretraining, and of tests and benchmarks that need a model of a given shape).
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/args.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/threads.h"
#include "model/model.h"
#include "train/cli.h"

// Copies the tokenizer files found in `src` (a dir, or a tokenizer.json whose dir is used) into `dst`.
static int copy_tokenizer(const char *src, const char *dst) {
    static const char *files[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json"};
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", src);
    if (!path_is_dir(dir)) {
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(dir, sizeof dir, ".");
    }
    int copied = 0;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char *from = path_join(dir, files[i]), *to = path_join(dst, files[i]);
        int rc = ER_OK;
        if (!from || !to) {
            rc = ER_ENOMEM;
        } else if (path_exists(from)) {
            char *buf;
            size_t n;
            rc = file_read_all(from, (size_t)1 << 30, &buf, &n);
            if (rc == ER_OK) {
                rc = file_write_atomic(to, buf, n);
                er_free(buf);
                copied += rc == ER_OK;
            }
        }
        er_free(from);
        er_free(to);
        ER_TRY(rc);
    }
    if (!copied)
        return er_error(ER_EIO, "%s: no tokenizer.json found", src);
    return ER_OK;
}

int cmd_init(int argc, char **argv) {
    const char *config = NULL, *out = NULL, *tokenizer = NULL;
    int seed = 0, bf16 = 0, threads = 0;
    double std = 0.02;
    ArgSpec specs[] = {
        {"config", ARG_STR, &config, "Hugging Face config.json (qwen2 or llama)", 1, 0, 0},
        {"out", ARG_STR, &out, "output model dir", 1, 0, 0},
        {"tokenizer", ARG_STR, &tokenizer, "tokenizer.json or a dir holding it, copied into the model dir", 0, 0, 0},
        {"seed", ARG_INT, &seed, "initialisation seed", 0, 0, 2147483647},
        {"std", ARG_FLOAT, &std, "standard deviation of the matrices (norms start at 1, biases at 0)", 0, 1e-6, 10},
        {"bf16", ARG_FLAG, &bf16, "store the weights as bf16", 0, 0, 0},
        {"threads", ARG_INT, &threads, "threads (0 = all cores)", 0, 0, 4096},
    };
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof specs[0],
                        "ertrain init --config CONFIG.json --out DIR [--tokenizer FILE_OR_DIR] [--seed S]");
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0)
        return cli_fail("init");
    threads_set(threads);
    ModelConfig c;
    Model m;
    if (model_config_load(&c, config) < 0 || model_build_random(&m, &c, (float)std, (uint64_t)seed) < 0)
        return cli_fail("init");
    rc = model_save(&m, out, bf16);
    if (rc == ER_OK && tokenizer)
        rc = copy_tokenizer(tokenizer, out);
    if (rc == ER_OK)
        printf("wrote %s: %zu parameters (%s)\n", out, model_config_num_params(&c), bf16 ? "bf16" : "fp32");
    model_free(&m);
    return rc < 0 ? cli_fail("init") : 0;
}
