// ertrain grpo: GRPO with the budget-forcing reward on a masked-LoRA adapter. Each step draws prompts,
// states a token budget in each (a system line, or the end of the user turn), rolls out G samples per
// prompt with the runtime (shared prompt prefix, batched decode, adapter on after the prefill),
// rewards correct x soft_barrier(L, budget) (plus the optional format and external-program terms), and
// takes clipped policy-gradient steps with a k3 KL penalty against the policy it started from (the
// initial adapter, frozen; or the base with the adapter off). Adapter dropout is off (lora_dropout > 0 adapters,
// e.g. from `sft --dropout` or PEFT's usual 0.05, train as if it were 0 and are saved with it unchanged):
// the rollouts, the update's log-probs and the ratio between them must come from one function.
#ifndef RL_GRPO_TRAIN_H
#define RL_GRPO_TRAIN_H

#include <stdio.h>

#include "data/chat.h"
#include "data/dataset.h"
#include "infer/engine.h"
#include "rl/grpo.h"

// Where the budget statement goes: the system message (appended to the record's own on a line of its
// own, or a system message of its own when the record has none), or appended to the last user message
// (closer to the response: a masked adapter reads it from the base's prompt states more easily).
typedef enum { BUDGET_IN_SYSTEM, BUDGET_IN_USER } BudgetIn;

// The KL reference: the policy GRPO started from (TRL's frozen copy of the initial adapter,
// DeepSeekMath's initial SFT policy), or the base model with the adapter off.
typedef enum { KL_REF_INIT, KL_REF_BASE } KlRef;

typedef struct {
    const char *model_dir, *adapter_dir, *data_path, *out_dir;
    const char *budgets;          // "64,128,256": one drawn per prompt unless the record has "budget"
    const char *budget_template;  // the statement; {budget} is replaced by the number
    BudgetIn budget_in;
    int group;                    // G samples per prompt
    int prompts;                  // prompts per step
    int steps;
    double temperature, top_p;
    double barrier_m, barrier_p;
    int answer_tokens;            // allowance after (1+m)·budget for the final answer
    RewardScale scale;
    int drop_flat;                // leave groups with equal rewards out of the loss
    int max_draws;                // dynamic sampling (DAPO): draw prompts until `prompts` groups have a reward
                                  // spread, at most this many a step; flat groups leave the loss (0 = off)
    int mask_truncated;           // completions cut at the token limit leave the loss (TRL's mask_truncated_completions)
    double format_weight;         // weight of the format term (think block closed, an answer after it)
    const char *reward_cmd;       // external reward program (rl/reward_cmd.h); NULL = none
    double reward_timeout;        // seconds it may take per reply
    double eps, eps_high, beta;
    KlRef kl_ref;
    LossType loss_type;
    int iterations;               // policy updates per rollout batch (old log-probs stored)
    double lr, warmup, clip, weight_decay;
    int seq_len;                  // positions per sequence (prompt + prefix + completion); 0 = what the
                                  // longest prompt at its largest budget needs
    const char *eval_data;        // held-out records: greedy accuracy, unformatted share and L per budget
    int eval_every, eval_n;       // every K steps (and the last), on the first N records (0 = all)
    int log_completions;          // every K steps a few completions with their rewards to completions.jsonl (0 = off)
    int seed, threads, save_every, resume;
    FILE *log;                    // the progress bar and where the run goes (NULL = silent; ertrain grpo: stderr)
    const char *device;           // where the rollouts, passes and AdamW run: "cpu", "cuda", "cuda:N"; NULL = the
                                  // GPU of this rank's place on its node when there is one (train/device.h)
    int place_on_cpu;             // test hook (ertrain: ER_TEST_PLACE_ON_CPU=1): copies placed on the CPU backend
    int stop_after;               // test hook, no flag: stop after this step as if killed (resume tests); 0 = off
} GrpoConfig;

void grpo_config_default(GrpoConfig *c);

typedef struct {
    long steps;
    double first_reward, last_reward;   // mean reward of the first and last step run
    double first_length, last_length;   // mean completion length
} GrpoResult;

int grpo_train(const GrpoConfig *c, GrpoResult *res);

// The reward of one rollout: graded on the answer after its think block (data/grade.h; think_open: the
// reasoning prefix opened one), its length L the tokens through </think> (GenSample.think_len), then
//   reward = correct x barrier(L, budget) + format_weight x format   (the external program's terms apart)
typedef struct {
    int correct, unformatted, length;
    double budget_term, format_term, reward;
} GrpoSampleReward;
int grpo_sample_reward(const GrpoConfig *c, const GenSample *s, int think_open, int budget, const char *gold,
                       GrpoSampleReward *r);

// The chat text of one GRPO prompt (generation prompt added): the record's conversation with the
// budget statement where c->budget_in puts it.
int grpo_prompt_text(const GrpoConfig *c, ChatStyle style, const Example *ex, int budget, char **text);

#endif
