// ertrain pretrain: flags -> TrainConfig -> train_pretrain (train/pretrain.c).
#include <stdio.h>

#include "core/args.h"
#include "core/error.h"
#include "train/cli.h"
#include "train/trainer.h"

int cmd_pretrain(int argc, char **argv) {
    TrainConfig c;
    train_config_default(&c, TRAIN_PRETRAIN);
    ArgSpec specs[] = {
        {"config", ARG_STR, &c.config_path, "model config.json (qwen2 or llama)", 1, 0, 0},
        {"tokenizer", ARG_STR, &c.tokenizer_path, "tokenizer.json or a dir holding it (copied into --out)", 1, 0, 0},
        {"data", ARG_STR, &c.data_path, "training records (JSONL), rendered with the chat template", 1, 0, 0},
        {"out", ARG_STR, &c.out_dir, "run dir: HF model dir, run.json, metrics.jsonl, checkpoint/", 1, 0, 0},
        {"response-key", ARG_STR, &c.response_key, "record field holding the response (e.g. direct for chains)", 0, 0, 0},
        {"lr", ARG_FLOAT, &c.lr, "peak learning rate", 0, 0, 0},
        {"min-lr", ARG_FLOAT, &c.min_lr, "learning rate at the end of the cosine decay", 0, 0, 0},
        {"epochs", ARG_INT, &c.epochs, "passes over the data (when --steps is not given)", 0, 0, 100000},
        {"steps", ARG_INT, &c.steps, "optimizer steps (overrides --epochs)", 0, 0, 2000000000},
        {"batch", ARG_INT, &c.batch, "sequences per micro-batch", 0, 1, 65536},
        {"seq-len", ARG_INT, &c.seq_len, "most input positions per sequence (longer ones are cut)", 0, 2, 1 << 20},
        {"grad-accum", ARG_INT, &c.grad_accum, "micro-batches per optimizer step", 0, 1, 65536},
        {"warmup", ARG_FLOAT, &c.warmup, "warmup: fraction of the steps (< 1) or steps (>= 1)", 0, 0, 0},
        {"clip", ARG_FLOAT, &c.clip, "global gradient-norm limit (0 = off)", 0, 0, 0},
        {"weight-decay", ARG_FLOAT, &c.weight_decay, "AdamW weight decay (matrices only)", 0, 0, 0},
        {"init-std", ARG_FLOAT, &c.init_std, "std of the random initial matrices", 0, 0, 0},
        {"eval-split", ARG_FLOAT, &c.eval_split, "fraction of the records held out for the eval loss", 0, 0, 0},
        {"eval-max", ARG_INT, &c.eval_max, "at most this many held-out records (0 = no limit)", 0, 0, 2000000000},
        {"eval-every", ARG_INT, &c.eval_every, "steps between held-out evaluations (0 = at the end only)", 0, 0, 2000000000},
        {"save-every", ARG_INT, &c.save_every, "steps between checkpoints (0 = at the end only)", 0, 0, 2000000000},
        {"seed", ARG_INT, &c.seed, "seed of every random choice (init, split, data order)", 0, 0, 2147483647},
        {"threads", ARG_INT, &c.threads, "threads (0 = all cores)", 0, 0, 4096},
        {"resume", ARG_FLAG, &c.resume, "continue the run in --out from its checkpoint", 0, 0, 0},
        {"stop-after", ARG_INT, &c.stop_after, "stop after this step as if interrupted (testing --resume)", 0, 0, 2000000000},
    };
    int rc = args_parse(argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "ertrain pretrain --config CONFIG.json --tokenizer FILE_OR_DIR --data FILE.jsonl --out DIR "
                        "[--response-key KEY] [--steps N | --epochs E] [--resume]");
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0)
        return cli_fail("pretrain");
    return train_pretrain(&c, NULL) < 0 ? cli_fail("pretrain") : 0;
}
