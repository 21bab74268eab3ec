// ertrain init: a randomly initialised model dir from a config.json (the starting point of
// pretraining, and of tests and benchmarks that need a model of a given shape).
#include <stdio.h>

#include "core/args.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/threads.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "ertrain/cli.h"
#include "train/run.h"

// A vocabulary smaller than the tokenizer's would give ids with no embedding row: checked first.
static int check_vocab(const char *config, const ModelConfig *c, const char *tokenizer) {
    if (!tokenizer)
        return ER_OK;
    Tokenizer *tok;
    ER_TRY(tok_load(&tok, tokenizer));
    int tv = tok_vocab_size(tok);
    tok_free(tok);
    if (tv > c->V)
        return er_error(ER_EINVAL, "%s: vocab_size %d is smaller than the %d ids of the tokenizer %s", config, c->V, tv,
                        tokenizer);
    return ER_OK;
}

static int write_model(const Model *m, const char *out, int bf16, const char *tokenizer) {
    ER_TRY(model_save(m, out, bf16));
    return tokenizer ? run_copy_tokenizer(tokenizer, out) : ER_OK;
}

int cmd_init(int argc, char **argv) {
    const char *config = NULL, *out = NULL, *tokenizer = NULL;
    int seed = 0, bf16 = 0, threads = 0;
    double std = 0.02;
    ArgSpec specs[] = {
        {"config", ARG_STR, &config, "Hugging Face config.json (qwen2, qwen3 or llama)", 1, 0, 0},
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
    // The output dir is checked before any work: a link to nothing, a file in the way, or an input dir.
    if (rc < 0 || dir_output_check(out) < 0 || dir_output_not_input(out, config, "--config") < 0 ||
        dir_output_not_input(out, tokenizer, "--tokenizer") < 0)
        return cli_fail("init");
    threads_set(threads);
    ModelConfig c;
    Model m;
    if (model_config_load(&c, config) < 0 || check_vocab(config, &c, tokenizer) < 0 ||
        model_build_random(&m, &c, (float)std, (uint64_t)seed) < 0)
        return cli_fail("init");
    rc = write_model(&m, out, bf16, tokenizer);
    model_free(&m);
    if (rc < 0)
        return cli_fail("init");
    printf("wrote %s: %zu parameters (%s)\n", out, model_config_num_params(&c), bf16 ? "bf16" : "fp32");
    return 0;
}
