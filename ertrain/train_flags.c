// The flags every training job takes (optimisation, evaluation, checkpoints) and the parse that puts a
// command's own flags after them: ertrain pretrain, sft and qat.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "ertrain/cli.h"
#include "train/dist.h"

static int train_flags_specs(TrainConfig *c, ArgSpec *s) {
    ArgSpec all[] = {
        {"lr", ARG_FLOAT, &c->lr, "peak learning rate", 0, 0, 0},
        {"min-lr", ARG_FLOAT, &c->min_lr, "learning rate at the end of the cosine decay", 0, 0, 0},
        {"epochs", ARG_INT, &c->epochs, "passes over the data (when --steps is not given)", 0, 0, 100000},
        {"steps", ARG_INT, &c->steps, "optimizer steps (overrides --epochs)", 0, 0, 2000000000},
        {"batch", ARG_INT, &c->batch, "sequences per micro-batch", 0, 1, 65536},
        {"seq-len", ARG_INT, &c->seq_len, "most input positions per sequence, longer ones are cut (0 = the model's "
                                         "max_position_embeddings)", 0, 0, 1 << 20},
        {"grad-accum", ARG_INT, &c->grad_accum, "micro-batches per optimizer step", 0, 1, 65536},
        {"warmup", ARG_FLOAT, &c->warmup, "warmup: fraction of the steps (< 1) or steps (>= 1)", 0, 0, 0},
        {"clip", ARG_FLOAT, &c->clip, "global gradient-norm limit (0 = off)", 0, 0, 0},
        {"eval-split", ARG_FLOAT, &c->eval_split, "fraction of the records held out for the eval loss", 0, 0, 0},
        {"eval-max", ARG_INT, &c->eval_max, "at most this many held-out records (0 = no limit)", 0, 0, 2000000000},
        {"eval-every", ARG_INT, &c->eval_every, "steps between held-out evaluations (0 = at the end only)", 0, 0, 2000000000},
        {"save-every", ARG_INT, &c->save_every, "steps between checkpoints (0 = at the end only)", 0, 0, 2000000000},
        {"threads", ARG_INT, &c->threads, "threads (0 = all cores)", 0, 0, 4096},
        {"recompute", ARG_FLAG, &c->recompute, "keep only each layer's input for the backward, which recomputes the "
                                               "rest (activation memory about 1/layers, one more forward)", 0, 0, 0},
        {"device", ARG_STR, &c->device, "where the passes run: cpu, cuda or cuda:N (default and cuda: rank r of a "
                                        "node on cuda:r when built with CUDA=1 and a GPU is there, else cpu; "
                                        "ER_SHARE_GPU=1 lets ranks share GPUs)", 0, 0, 0},
        {"resume", ARG_FLAG, &c->resume, "continue the run in --out from its checkpoint", 0, 0, 0},
    };
    _Static_assert(sizeof all / sizeof all[0] <= TRAIN_FLAGS_MAX, "TRAIN_FLAGS_MAX is too small");
    memcpy(s, all, sizeof all);
    return (int)(sizeof all / sizeof all[0]);
}

int train_flags_parse(TrainConfig *c, const ArgSpec *own, int n_own, int argc, char **argv, const char *usage) {
    ArgSpec specs[TRAIN_FLAGS_MAX + TRAIN_OWN_FLAGS_MAX];
    if (n_own > TRAIN_OWN_FLAGS_MAX)
        return er_error(ER_EINVAL, "train_flags_parse: %d own flags, room for %d", n_own, TRAIN_OWN_FLAGS_MAX);
    int ns = train_flags_specs(c, specs);
    memcpy(specs + ns, own, sizeof *own * (size_t)n_own);
    // Under mpirun rank 0 speaks for the job.
    c->out = dist_rank() == 0 ? stdout : NULL; // the plan and the summary
    c->log = dist_rank() == 0 ? stderr : NULL; // the progress bar
    c->device = NULL; // not given: the GPU when there is one and the job can run there
    c->place_on_cpu = train_flags_place_on_cpu();
    return args_parse(argc, argv, specs, ns + n_own, usage);
}

int train_flags_place_on_cpu(void) {
    const char *place = getenv("ER_TEST_PLACE_ON_CPU");
    return place && !strcmp(place, "1");
}
