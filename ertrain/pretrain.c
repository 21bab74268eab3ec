// ertrain pretrain: flags -> TrainConfig -> train_pretrain (train/pretrain.c).
#include "core/args.h"
#include "ertrain/cli.h"
#include "train/trainer.h"

int cmd_pretrain(int argc, char **argv) {
    TrainConfig c;
    train_config_default(&c, TRAIN_PRETRAIN);
    ArgSpec own[] = {
        {"config", ARG_STR, &c.config_path, "model config.json (qwen2, qwen3 or llama): a randomly initialised model", 0, 0, 0},
        {"init", ARG_STR, &c.model_dir,
         "an fp32 model dir whose weights start the run instead (continued pretraining; not with --config)", 0, 0, 0},
        {"tokenizer", ARG_STR, &c.tokenizer_path, "tokenizer.json or a dir holding it (copied into --out)", 1, 0, 0},
        {"data", ARG_STR, &c.data_path, "training records (JSONL), rendered with the chat template", 1, 0, 0},
        {"out", ARG_STR, &c.out_dir, "run dir: HF model dir, run.json, metrics.jsonl, checkpoint/", 1, 0, 0},
        {"response-key", ARG_STR, &c.response_key, "record field holding the response (e.g. direct for chains)", 0, 0, 0},
        {"weight-decay", ARG_FLOAT, &c.weight_decay, "AdamW weight decay (matrices only)", 0, 0, 0},
        {"init-std", ARG_FLOAT, &c.init_std, "std of the random initial matrices", 0, 0, 0},
        {"seed", ARG_INT, &c.seed, "seed of every random choice (init, split, data order)", 0, 0, 2147483647},
    };
    int rc = train_flags_parse(&c, own, (int)(sizeof own / sizeof own[0]), argc, argv,
                               "ertrain pretrain (--config CONFIG.json | --init MODEL_DIR) --tokenizer FILE_OR_DIR "
                               "--data FILE.jsonl --out DIR [--response-key KEY] [--steps N | --epochs E] [--resume]");
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0)
        return cli_fail("pretrain");
    return train_pretrain(&c, NULL) < 0 ? cli_fail("pretrain") : 0;
}
