// ertrain init: a randomly initialised model dir from a config.json (the starting point of
// pretraining, and of tests and benchmarks that need a model of a given shape).
#include <stdio.h>

#include "core/args.h"
#include "core/error.h"
#include "core/threads.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "ertrain/cli.h"
#include "train/run.h"

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
    if (model_config_load(&c, config) < 0)
        return cli_fail("init");
    // A vocabulary smaller than the tokenizer's would give ids with no embedding row: checked first.
    if (tokenizer) {
        Tokenizer *tok;
        if (tok_load(&tok, tokenizer) < 0)
            return cli_fail("init");
        int tv = tok_vocab_size(tok);
        tok_free(tok);
        if (tv > c.V) {
            er_error(ER_EINVAL, "%s: vocab_size %d is smaller than the %d ids of the tokenizer %s", config, c.V, tv,
                     tokenizer);
            return cli_fail("init");
        }
    }
    if (model_build_random(&m, &c, (float)std, (uint64_t)seed) < 0)
        return cli_fail("init");
    rc = model_save(&m, out, bf16);
    if (rc == ER_OK && tokenizer)
        rc = run_copy_tokenizer(tokenizer, out);
    if (rc == ER_OK)
        printf("wrote %s: %zu parameters (%s)\n", out, model_config_num_params(&c), bf16 ? "bf16" : "fp32");
    model_free(&m);
    return rc < 0 ? cli_fail("init") : 0;
}
