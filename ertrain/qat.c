// ertrain qat: flags -> QatConfig -> qat_run (train/qat.c).
#include <stdio.h>
#include <string.h>

#include "core/args.h"
#include "core/error.h"
#include "ertrain/cli.h"
#include "train/dist.h"
#include "train/qat.h"

int cmd_qat(int argc, char **argv) {
    QatConfig c;
    memset(&c, 0, sizeof c);
    train_config_default(&c.train, TRAIN_QAT);
    c.q.embeddings = "int8";
    c.q.scale_search = "lp";
    c.q.kmeans_iters = 25;
    c.transforms = "none";
    c.recluster_every = 10;
    c.log = dist_rank() == 0 ? stdout : NULL;
    char list[256], weights_help[320];
    snprintf(weights_help, sizeof weights_help, "target format of the layer projections: %s",
             quantize_weights_list(list, sizeof list, " | ", " | "));
    ArgSpec own[] = {
        {"model", ARG_STR, &c.train.model_dir, "float model dir (HF layout, with its tokenizer)", 1, 0, 0},
        {"data", ARG_STR, &c.train.data_path, "training records (JSONL), rendered with the chat template; loss on every "
         "position", 1, 0, 0},
        {"out", ARG_STR, &c.train.out_dir, "run dir: the quantized model dir (as ertrain quantize writes it), run.json, "
         "metrics.jsonl, checkpoint/", 1, 0, 0},
        {"weights", ARG_STR, &c.q.weights, weights_help, 1, 0, 0},
        {"response-key", ARG_STR, &c.train.response_key, "record field holding the response (e.g. verbose for chains)",
         0, 0, 0},
        {"embeddings", ARG_STR, &c.q.embeddings, "embedding matrix: int8 (fake-quantized too) | fp", 0, 0, 0},
        {"lm-head", ARG_STR, &c.q.lm_head, "lm_head: fp or a --weights format (as ertrain quantize)", 0, 0, 0},
        {"transforms", ARG_STR, &c.transforms, "function-preserving transforms before training: none | rotate | fpt", 0,
         0, 0},
        {"recluster-every", ARG_INT, &c.recluster_every,
         "steps between k-means codebook updates from the master weights (assignments every step)", 0, 1, 1000000},
        {"kmeans-iters", ARG_INT, &c.q.kmeans_iters, "Lloyd iterations of each clustering", 0, 1, 1000},
        {"weight-decay", ARG_FLOAT, &c.train.weight_decay, "AdamW weight decay (matrices only)", 0, 0, 0},
        {"seed", ARG_INT, &c.train.seed, "seed of every random choice (split, data order, transforms)", 0, 0,
         2147483647},
    };
    int rc = train_flags_parse(&c.train, own, (int)(sizeof own / sizeof own[0]), argc, argv,
                               "ertrain qat --model FLOAT_DIR --data FILE.jsonl --out QUANT_DIR --weights q2lut "
                               "[--response-key KEY] [--steps N] [--recluster-every K] [--transforms none|rotate|fpt]");
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0)
        return cli_fail("qat");
    return qat_run(&c, NULL) < 0 ? cli_fail("qat") : 0;
}
