// ertrain sft: flags -> TrainConfig -> train_sft (train/sft.c).
#include "core/args.h"
#include "ertrain/cli.h"
#include "train/trainer.h"

int cmd_sft(int argc, char **argv) {
    TrainConfig c;
    train_config_default(&c, TRAIN_SFT);
    const char *prefix = "<think>\n";
    ArgSpec own[] = {
        {"model", ARG_STR, &c.model_dir, "base model dir (HF layout, with its tokenizer); loaded frozen", 1, 0, 0},
        {"data", ARG_STR, &c.data_path, "training records (JSONL)", 1, 0, 0},
        {"out", ARG_STR, &c.out_dir, "run dir: PEFT adapter, run.json, metrics.jsonl, checkpoint/", 1, 0, 0},
        {"response-key", ARG_STR, &c.response_key, "record field holding the response (e.g. verbose for chains)", 0, 0, 0},
        {"rank", ARG_INT, &c.rank, "LoRA rank", 0, 1, 4096},
        {"alpha", ARG_FLOAT, &c.alpha, "LoRA alpha (scale alpha / rank)", 0, 0, 0},
        {"targets", ARG_STR, &c.targets, "adapted layers: all | q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", 0, 0, 0},
        {"rslora", ARG_FLAG, &c.rslora, "rank-stabilised scale alpha / sqrt(rank)", 0, 0, 0},
        {"dropout", ARG_FLOAT, &c.dropout, "dropout on the adapter's input", 0, 0, 0},
        {"weight-decay", ARG_FLOAT, &c.weight_decay, "AdamW weight decay", 0, 0, 0},
        {"seed", ARG_INT, &c.seed, "seed of every random choice (split, init, data order, dropout)", 0, 0, 2147483647},
        {"no-mask", ARG_FLAG, &c.no_mask, "standard LoRA: adapter on prompt positions too", 0, 0, 0},
        {"prefix", ARG_TEXT, &prefix, "reasoning prefix opening every response, left out of the loss (\"\" = none)", 0,
         0, 0},
    };
    int rc = train_flags_parse(&c, own, (int)(sizeof own / sizeof own[0]), argc, argv,
                               "ertrain sft --model DIR --data FILE.jsonl --out DIR [--response-key KEY] "
                               "[--rank 16 --alpha 32 --lr 2e-4 --steps N | --epochs 1 ...] [--resume]");
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0)
        return cli_fail("sft");
    c.prefix = prefix;
    rc = train_sft(&c, NULL);
    return rc < 0 ? cli_fail("sft") : 0;
}
