// ertrain merge: flags -> MergeConfig -> merge_run (train/merge.c).
#include <stdio.h>

#include "core/args.h"
#include "ertrain/cli.h"
#include "train/merge.h"

int cmd_merge(int argc, char **argv) {
    MergeConfig c = {0};
    ArgSpec specs[] = {
        {"model", ARG_STR, &c.model_dir, "fp32 base model dir (HF layout; its tokenizer is copied)", 1, 0, 0},
        {"adapter", ARG_STR, &c.adapter_dir, "LoRA adapter dir (PEFT) for that base, merged as on at every position: "
         "a masked adapter (off on the prompt at run time) then changes the prompt positions too", 1, 0, 0},
        {"out", ARG_STR, &c.out_dir, "output model dir (absent or empty)", 1, 0, 0},
        {"threads", ARG_INT, &c.threads, "threads (0 = all cores)", 0, 0, 4096},
    };
    int rc = args_parse(argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "ertrain merge --model BASE_DIR --adapter ADAPTER_DIR --out DIR");
    if (rc == ARGS_HELP)
        return 0;
    MergeResult res;
    if (rc < 0 || merge_run(&c, &res) < 0)
        return cli_fail("merge");
    printf("wrote %s: %d projections merged, %zu parameters (fp32)%s\n", c.out_dir, res.merged, res.parameters,
           res.masked ? "; the adapter was trained masked, the merged model applies it at every position" : "");
    return 0;
}
