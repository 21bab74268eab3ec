// ertrain grpo: GRPO with budget forcing on a masked-LoRA adapter (rl/grpo_train.h).
#include <stdio.h>
#include <string.h>

#include "core/args.h"
#include "core/error.h"
#include "core/threads.h"
#include "rl/grpo_train.h"
#include "ertrain/cli.h"
#include "train/dist.h"

// The flags that name a choice, into c.
static int parse_choices(const char *budget_in, const char *scale, const char *loss, const char *kl_ref,
                         GrpoConfig *c) {
    if (strcmp(budget_in, "system") && strcmp(budget_in, "user"))
        return er_error(ER_EINVAL, "--budget-in: expected system or user, got \"%s\"", budget_in);
    c->budget_in = strcmp(budget_in, "user") == 0 ? BUDGET_IN_USER : BUDGET_IN_SYSTEM;
    if (strcmp(kl_ref, "init") && strcmp(kl_ref, "base"))
        return er_error(ER_EINVAL, "--kl-ref: expected init or base, got \"%s\"", kl_ref);
    c->kl_ref = strcmp(kl_ref, "base") == 0 ? KL_REF_BASE : KL_REF_INIT;
    ER_TRY(reward_scale_parse(scale, &c->scale));
    return loss_type_parse(loss, &c->loss_type);
}

int cmd_grpo(int argc, char **argv) {
    GrpoConfig c;
    grpo_config_default(&c);
    c.log = dist_rank() == 0 ? stderr : NULL; // under mpirun rank 0 speaks for the job
    const char *scale = "group", *loss = "dapo", *budget_in = "system", *kl_ref = "init";
    double eps_high = -1;
    ArgSpec specs[] = {
        {"model", ARG_STR, &c.model_dir, "base model dir (frozen)", 1, 0, 0},
        {"adapter", ARG_STR, &c.adapter_dir, "masked LoRA adapter to start from (PEFT dir, e.g. from ertrain sft)", 1, 0, 0},
        {"data", ARG_STR, &c.data_path, "JSONL prompts with gold answers (\"budget\" per record optional)", 1, 0, 0},
        {"out", ARG_STR, &c.out_dir, "output dir: adapter, run.json, metrics.jsonl, checkpoint/", 1, 0, 0},
        {"budgets", ARG_STR, &c.budgets, "token budgets, one drawn per prompt", 0, 0, 0},
        {"budget-template", ARG_TEXT, &c.budget_template, "sentence stating the budget ({budget} = the number)", 0, 0,
         0},
        {"budget-in", ARG_STR, &budget_in, "where it goes: system (ends the record's system message, or is one) or "
                                           "user (ends the user turn)", 0, 0, 0},
        {"group", ARG_INT, &c.group, "samples per prompt (G)", 0, 2, 256},
        {"prompts", ARG_INT, &c.prompts, "prompts per step", 0, 1, 256},
        {"steps", ARG_INT, &c.steps, "optimizer steps", 0, 1, 1 << 24},
        {"temperature", ARG_FLOAT, &c.temperature, "rollout temperature", 0, 1e-3, 10},
        {"top-p", ARG_FLOAT, &c.top_p, "rollout nucleus mass", 0, 1e-6, 1},
        {"barrier-m", ARG_FLOAT, &c.barrier_m, "soft barrier half-width m: full reward up to (1-m)B, p from (1+m)B", 0, 0, 0.99},
        {"barrier-p", ARG_FLOAT, &c.barrier_p, "reward of a correct answer beyond (1+m)B", 0, 0, 1},
        {"answer-tokens", ARG_INT, &c.answer_tokens, "tokens allowed beyond (1+m)B for the final answer", 0, 0, 1 << 20},
        {"reward-cmd", ARG_STR, &c.reward_cmd, "external reward program: a JSON line per completion on its stdin, a "
                                               "number or object of named terms per line back (docs/cli.md)", 0, 0, 0},
        {"reward-timeout", ARG_FLOAT, &c.reward_timeout, "seconds the reward program may take per reply", 0, 0.001,
         86400},
        {"scale-rewards", ARG_STR, &scale, "advantage scaling: group, batch or none", 0, 0, 0},
        {"drop-flat", ARG_FLAG, &c.drop_flat, "leave groups with equal rewards out of the loss", 0, 0, 0},
        {"max-draws", ARG_INT, &c.max_draws, "dynamic sampling: draw prompts until --prompts groups have a reward spread, "
                                             "at most this many a step (0 = off)", 0, 0, 4096},
        {"mask-truncated", ARG_FLAG, &c.mask_truncated, "leave completions cut at the token limit out of the loss", 0,
         0, 0},
        {"format-weight", ARG_FLOAT, &c.format_weight, "weight of the format reward (think block closed, an answer "
                                                       "after it)", 0, -100, 100},
        {"epsilon", ARG_FLOAT, &c.eps, "clip range below 1", 0, 0, 1},
        {"epsilon-high", ARG_FLOAT, &eps_high, "clip range above 1 (default: --epsilon)", 0, 0, 10},
        {"beta", ARG_FLOAT, &c.beta, "k3 KL weight against the reference", 0, 0, 100},
        {"kl-ref", ARG_STR, &kl_ref, "KL reference: init (the starting adapter, frozen) or base (adapter off)", 0, 0,
         0},
        {"loss-type", ARG_STR, &loss, "normalisation: grpo, bnpo, dr_grpo or dapo", 0, 0, 0},
        {"iterations", ARG_INT, &c.iterations, "policy updates per rollout batch", 0, 1, 64},
        {"lr", ARG_FLOAT, &c.lr, "peak learning rate", 0, 0, 1},
        {"warmup", ARG_FLOAT, &c.warmup, "warmup: fraction of the steps (< 1) or steps", 0, 0, 1e9},
        {"clip", ARG_FLOAT, &c.clip, "global gradient-norm limit (0 = off)", 0, 0, 1e9},
        {"weight-decay", ARG_FLOAT, &c.weight_decay, "AdamW weight decay", 0, 0, 10},
        {"seq-len", ARG_INT, &c.seq_len, "positions per sequence: prompt + prefix + completion (0 = what the longest "
                                         "prompt at the largest budget needs)", 0, 0, 1 << 20},
        {"eval-data", ARG_STR, &c.eval_data, "held-out JSONL: greedy accuracy, unformatted share, L per budget; the "
                                             "best adapter in OUT/best", 0, 0, 0},
        {"eval-every", ARG_INT, &c.eval_every, "steps between evals (and the last step)", 0, 1, 1 << 24},
        {"eval-n", ARG_INT, &c.eval_n, "eval on the first N records (0 = all)", 0, 0, 1 << 24},
        {"log-completions", ARG_INT, &c.log_completions, "every K steps a few completions to completions.jsonl "
                                                         "(0 = off)", 0, 0, 1 << 24},
        {"save-every", ARG_INT, &c.save_every, "steps between checkpoints (0 = at the end)", 0, 0, 1 << 24},
        {"seed", ARG_INT, &c.seed, "seed of prompt draws and rollouts", 0, 0, 2147483647},
        {"threads", ARG_INT, &c.threads, "threads (0 = all cores)", 0, 0, 4096},
        {"device", ARG_STR, &c.device, "where the rollouts, passes and AdamW run: cpu, cuda or cuda:N (default: rank "
                                       "r of a node on cuda:r when built with CUDA=1 and a GPU is there, else cpu)",
         0, 0, 0},
        {"resume", ARG_FLAG, &c.resume, "continue the run in --out from its checkpoint", 0, 0, 0},
    };
    c.place_on_cpu = train_flags_place_on_cpu();
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof specs[0],
                        "ertrain grpo --model DIR --adapter DIR --data FILE.jsonl --out DIR [flags]");
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0 || parse_choices(budget_in, scale, loss, kl_ref, &c) < 0)
        return cli_fail("grpo");
    c.eps_high = eps_high >= 0 ? eps_high : c.eps;
    threads_set(c.threads);
    GrpoResult res;
    if (grpo_train(&c, &res) < 0)
        return cli_fail("grpo");
    if (dist_rank() == 0)
        printf("grpo: %ld steps, mean reward %.3f -> %.3f, mean length %.1f -> %.1f tokens; adapter in %s\n", res.steps,
               res.first_reward, res.last_reward, res.first_length, res.last_length, c.out_dir);
    return 0;
}
