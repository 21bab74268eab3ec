// ertrain grpo end to end on a tiny random model: it runs, writes its outputs, and a run stopped and
// resumed gives the same metrics and adapter as an uninterrupted one.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fileio.h"
#include "core/threads.h"
#include "data/synth.h"
#include "data/tokenizer.h"
#include "lora/peft.h"
#include "model/model.h"
#include "rl/grpo_train.h"
#include "tests/common/helpers.h"
#include "train/run.h"

static char root[] = "/tmp/er_grpo_XXXXXX";
// The inputs every test starts from: the base, its adapter and 12 chain records, under root.
static char base[256], adir[256], data[256];

static void make_inputs(void) {
    cr_assert(mkdtemp(root));
    snprintf(base, sizeof base, "%s/base", root);
    snprintf(adir, sizeof adir, "%s/adapter", root);
    snprintf(data, sizeof data, "%s/data.jsonl", root);
    Tokenizer *tok;
    cr_assert_eq(tok_load(&tok, "data/tiny_tokenizer"), 0);
    ModelConfig c = helper_tiny_config(tok_vocab_size(tok), 512);
    Model m;
    cr_assert_eq(model_build_random(&m, &c, 0.3f, 1), 0);
    cr_assert_eq(model_save(&m, base, 0), 0);
    cr_assert_eq(run_copy_tokenizer("data/tiny_tokenizer", base), 0, "%s", er_last_error());
    LoraAdapter a;
    helper_random_adapter(&a, &c, 0.05f, 3);
    a.reasoning_prefix = strdup("<think>\n");
    cr_assert_eq(peft_save(&a, adir), 0, "%s", er_last_error());
    ChainsConfig cc;
    chains_config_default(&cc);
    cc.max_steps = 2;
    SynthStats cs;
    cr_assert_eq(chains_write_jsonl(&cc, 12, 5, data, NULL, &cs), 0);
    lora_free(&a);
    model_free(&m);
    tok_free(tok);
}

static void remove_root(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
}

// A short run on the inputs, into root/name (written to out).
static void config(GrpoConfig *c, char *out, size_t n, const char *name) {
    grpo_config_default(c);
    snprintf(out, n, "%s/%s", root, name);
    c->model_dir = base;
    c->adapter_dir = adir;
    c->data_path = data;
    c->out_dir = out;
    c->budgets = "8,16";
    c->group = 4;
    c->prompts = 2;
    c->steps = 4;
    c->answer_tokens = 4;
    c->seq_len = 160;
    c->lr = 1e-3;
    c->beta = 0.01;
    c->iterations = 2;
    c->loss_type = LOSS_GRPO;
}

// metrics.jsonl without the timing fields (everything from "rollout_tokens_per_s" on).
static char *metrics_without_timing(const char *dir) {
    char *p = path_join(dir, "metrics.jsonl"), *text;
    size_t n;
    cr_assert_eq(file_read_all(p, 1 << 20, &text, &n), 0);
    free(p);
    char *w = text;
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n'), *cut = strstr(line, ",\"rollout_tokens_per_s\"");
        size_t keep = cut && (!nl || cut < nl) ? (size_t)(cut - line) : (size_t)((nl ? nl : line + strlen(line)) - line);
        memmove(w, line, keep);
        w += keep;
        *w++ = '\n';
        if (!nl)
            break;
        line = nl + 1;
    }
    *w = 0;
    return text;
}

// A reward program gives the groups a spread (the tiny model earns no reward of its own), so the adapter and
// AdamW's moments move every step and the resume has state to carry.
#define PARITY_REWARD "python3 -c 'import sys\nfor l in sys.stdin: print(len(l) % 2, flush=True)'"

Test(grpo_run, resume_equals_uninterrupted, .init = make_inputs, .fini = remove_root, .timeout = 120) {
    threads_set(2);
    char out_a[256], out_b[256];
    GrpoConfig c;
    GrpoResult res;
    config(&c, out_a, sizeof out_a, "a");
    c.eval_data = data, c.eval_every = 3, c.eval_n = 2, c.log_completions = 1; // resumed with the run
    c.reward_cmd = PARITY_REWARD;
    cr_assert_eq(grpo_train(&c, &res), 0, "%s", er_last_error());
    cr_assert_eq(res.steps, 4);

    config(&c, out_b, sizeof out_b, "b");
    c.eval_data = data, c.eval_every = 3, c.eval_n = 2, c.log_completions = 1, c.reward_cmd = PARITY_REWARD;
    c.stop_after = 2;
    c.save_every = 1;
    cr_assert_eq(grpo_train(&c, &res), 0, "%s", er_last_error());
    cr_assert_eq(res.steps, 2);
    c.stop_after = 0;
    c.resume = 1;
    c.lr = 2e-3;
    cr_assert(grpo_train(&c, &res) < 0, "a resume with another learning rate must be refused");
    cr_assert(strstr(er_last_error(), "lr"), "%s", er_last_error());
    c.lr = 1e-3;
    cr_assert_eq(grpo_train(&c, &res), 0, "%s", er_last_error());
    cr_assert_eq(res.steps, 4);

    char *ma = metrics_without_timing(out_a), *mb = metrics_without_timing(out_b);
    cr_assert_str_eq(mb, ma, "resumed metrics differ from the uninterrupted run");
    cr_assert(strstr(ma, "\"step\":4"), "four steps logged");
    cr_assert(!strstr(ma, "\"grad_norm\":0,"), "a step without a gradient checks nothing:\n%s", ma);
    free(ma);
    free(mb);
    char pa[300], pb[300], *ca, *cb;
    size_t na, nb;
    snprintf(pa, sizeof pa, "%s/completions.jsonl", out_a);
    snprintf(pb, sizeof pb, "%s/completions.jsonl", out_b);
    cr_assert_eq(file_read_all(pa, 1 << 20, &ca, &na), 0);
    cr_assert_eq(file_read_all(pb, 1 << 20, &cb, &nb), 0);
    cr_assert_str_eq(cb, ca, "resumed completions.jsonl differs from the uninterrupted run's");
    free(ca);
    free(cb);
    LoraAdapter x, y;
    Model m;
    cr_assert_eq(model_load(&m, base, 0), 0);
    LoraShape s = model_config_lora_shape(&m.cfg);
    cr_assert_eq(peft_load(&x, out_a, &s, 0), 0, "%s", er_last_error());
    cr_assert_eq(peft_load(&y, out_b, &s, 0), 0, "%s", er_last_error());
    cr_assert_arr_eq(x.params, y.params, sizeof(float) * x.n_params, "final adapters differ");
    cr_assert_str_eq(x.reasoning_prefix, "<think>\n");
    lora_free(&x);
    lora_free(&y);
    model_free(&m);
}

// The device path (train/device.h) on copies placed on the CPU backend: the rollouts through the placed model
// and adapter, the reference's and the update's passes, the gradient's scale and clip and AdamW on the backend,
// the parameters and moments back on the host for the checkpoints, a resume placing them again. Everything
// equals the host run's: metrics (rewards, rollout hashes, losses, norms), completions, the eval's best adapter
// and the final adapter, bit for bit (with the reward program above).
Test(grpo_run, placed_equals_host_through_resume, .init = make_inputs, .fini = remove_root, .timeout = 120) {
    threads_set(2);
    char out_a[256], out_b[256];
    GrpoConfig c;
    GrpoResult res;
    config(&c, out_a, sizeof out_a, "host");
    c.eval_data = data, c.eval_every = 2, c.eval_n = 2, c.log_completions = 1, c.reward_cmd = PARITY_REWARD;
    cr_assert_eq(grpo_train(&c, &res), 0, "%s", er_last_error());
    config(&c, out_b, sizeof out_b, "placed");
    c.eval_data = data, c.eval_every = 2, c.eval_n = 2, c.log_completions = 1, c.reward_cmd = PARITY_REWARD;
    c.place_on_cpu = 1;
    c.stop_after = 3;
    c.save_every = 1;
    cr_assert_eq(grpo_train(&c, &res), 0, "%s", er_last_error());
    c.stop_after = 0;
    c.resume = 1;
    cr_assert_eq(grpo_train(&c, &res), 0, "%s", er_last_error());
    cr_assert_eq(res.steps, 4);
    char *ma = metrics_without_timing(out_a), *mb = metrics_without_timing(out_b);
    cr_assert_str_eq(mb, ma, "the placed run's metrics differ from the host run's");
    cr_assert(!strstr(ma, "\"grad_norm\":0,"), "a step without a gradient checks nothing:\n%s", ma);
    free(ma);
    free(mb);
    const char *files[] = {"completions.jsonl", "adapter_model.safetensors", "best/adapter_model.safetensors"};
    for (int i = 0; i < 3; i++) {
        char pa[300], pb[300], *ca, *cb;
        size_t na, nb;
        snprintf(pa, sizeof pa, "%s/%s", out_a, files[i]);
        snprintf(pb, sizeof pb, "%s/%s", out_b, files[i]);
        cr_assert_eq(file_read_all(pa, 1 << 24, &ca, &na), 0, "%s", er_last_error());
        cr_assert_eq(file_read_all(pb, 1 << 24, &cb, &nb), 0, "%s", er_last_error());
        cr_assert(na == nb && !memcmp(ca, cb, na), "%s: the placed run's differs from the host run's", files[i]);
        free(ca);
        free(cb);
    }
}

// An adapter saved with lora_dropout > 0 (sft --dropout, PEFT's usual 0.05) trains: dropout is off in
// GRPO, and the adapter keeps its lora_dropout.
Test(grpo_run, adapter_with_dropout_trains, .init = make_inputs, .fini = remove_root, .timeout = 120) {
    threads_set(2);
    char drop[256], out[256];
    snprintf(drop, sizeof drop, "%s/adapter-dropout", root);
    Model m;
    cr_assert_eq(model_load(&m, base, 0), 0);
    LoraShape s = model_config_lora_shape(&m.cfg);
    LoraAdapter a;
    cr_assert_eq(peft_load(&a, adir, &s, 0), 0, "%s", er_last_error());
    a.dropout = 0.05f;
    cr_assert_eq(peft_save(&a, drop), 0, "%s", er_last_error());
    lora_free(&a);
    GrpoConfig c;
    GrpoResult res;
    config(&c, out, sizeof out, "d");
    c.adapter_dir = drop;
    c.steps = 2;
    cr_assert_eq(grpo_train(&c, &res), 0, "%s", er_last_error());
    cr_assert_eq(res.steps, 2);
    cr_assert_eq(peft_load(&a, out, &s, 0), 0, "%s", er_last_error());
    cr_assert_float_eq(a.dropout, 0.05f, 1e-7, "the saved adapter lost its lora_dropout (%g)", a.dropout);
    lora_free(&a);
    model_free(&m);
}

// Found by a new user: a template without {budget}; a bad record late in the file, found only at the
// step that drew it; the default --seq-len 1024 that could not hold the README's budgets; --resume
// refused for the same model dir spelled another way; and a finished run that could not be extended.
Test(grpo_run, inputs_checked_before_step_one, .init = make_inputs, .fini = remove_root, .timeout = 120) {
    threads_set(2);
    char out[256];
    GrpoConfig c;
    GrpoResult res;
    config(&c, out, sizeof out, "t");
    c.budget_template = "Think briefly.";
    cr_assert(grpo_train(&c, &res) < 0);
    cr_assert(strstr(er_last_error(), "{budget}"), "%s", er_last_error());

    // Line 13 of the data does not fit --seq-len: refused before any rollout, naming the line.
    char bad[256];
    snprintf(bad, sizeof bad, "%s/bad.jsonl", root);
    char *text;
    size_t n;
    cr_assert_eq(file_read_all(data, 1 << 20, &text, &n), 0);
    FILE *fp = fopen(bad, "w");
    fputs(text, fp);
    fputs("{\"problem\": \"", fp);
    for (int i = 0; i < 300; i++)
        fputs("Add 1. ", fp);
    fputs("\", \"answer\": \"1\"}\n", fp);
    fclose(fp);
    free(text);
    config(&c, out, sizeof out, "u");
    c.data_path = bad;
    cr_assert(grpo_train(&c, &res) < 0, "the long record was accepted");
    cr_assert(strstr(er_last_error(), "bad.jsonl:13") && strstr(er_last_error(), "--seq-len 160"), "%s",
              er_last_error());
    cr_assert(!path_exists(out), "a refused run left %s behind", out);

    // --seq-len 0 (the default) sizes the sequences from the budgets: 1000 and 3000 need about 3.6K
    // positions, which a fixed 1024 would refuse; the model's 512 positions still refuse them.
    config(&c, out, sizeof out, "v");
    c.seq_len = 0;
    c.budgets = "1000,3000";
    cr_assert(grpo_train(&c, &res) < 0);
    cr_assert(strstr(er_last_error(), "max_position_embeddings") && strstr(er_last_error(), "--budgets"), "%s",
              er_last_error());
    c.budgets = "100,300";
    c.steps = 1;
    c.group = 2;
    c.prompts = 1;
    cr_assert_eq(grpo_train(&c, &res), 0, "%s", er_last_error());

    // Resume with the model dir spelled differently, then extend the finished run.
    config(&c, out, sizeof out, "w");
    c.steps = 2;
    c.stop_after = 1;
    c.save_every = 1;
    cr_assert_eq(grpo_train(&c, &res), 0, "%s", er_last_error());
    char other[300];
    snprintf(other, sizeof other, "%s/../%s/./base", root, strrchr(root, '/') + 1);
    c.model_dir = other;
    c.stop_after = 0;
    c.resume = 1;
    cr_assert_eq(grpo_train(&c, &res), 0, "resume with %s: %s", other, er_last_error());
    cr_assert_eq(res.steps, 2);
    c.steps = 3;
    cr_assert_eq(grpo_train(&c, &res), 0, "extending to 3 steps: %s", er_last_error());
    cr_assert_eq(res.steps, 3);
    char *metrics = path_join(out, "metrics.jsonl");
    cr_assert_eq(file_read_all(metrics, 1 << 20, &text, &n), 0);
    cr_assert_eq(helper_count_lines(text), 3, "metrics:\n%s", text);
    free(text);
    free(metrics);
    c.steps = 2;
    cr_assert(grpo_train(&c, &res) < 0, "shortening a run must be refused");
    cr_assert(strstr(er_last_error(), "extended, not shortened"), "%s", er_last_error());
}

// The lines of dir/name, parsed (NULL-terminated array; free with free_lines).
static cJSON **read_lines(const char *dir, const char *name, int *n) {
    char *p = path_join(dir, name), *text;
    size_t len;
    cr_assert_eq(file_read_all(p, 1 << 24, &text, &len), 0, "%s: %s", p, er_last_error());
    free(p);
    cJSON **lines = calloc(4096, sizeof(cJSON *));
    *n = 0;
    for (char *line = strtok(text, "\n"); line && *n < 4095; line = strtok(NULL, "\n")) {
        lines[*n] = cJSON_Parse(line);
        cr_assert(lines[*n], "%s: unparsable line %d", name, *n + 1);
        (*n)++;
    }
    free(text);
    return lines;
}

static void free_lines(cJSON **lines) {
    for (int i = 0; lines[i]; i++)
        cJSON_Delete(lines[i]);
    free(lines);
}

static double num(const cJSON *j, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    cr_assert(cJSON_IsNumber(v), "metrics line has no number \"%s\"", key);
    return v->valuedouble;
}

// The KL reference is the policy GRPO started from (TRL, DeepSeekMath): with one update per rollout batch
// step 1's policy is that reference, so its KL is exactly 0; against the base with the adapter off it is not.
Test(grpo_run, kl_reference_is_the_starting_adapter, .init = make_inputs, .fini = remove_root, .timeout = 120) {
    threads_set(2);
    char out[256];
    GrpoConfig c;
    GrpoResult res;
    double kl[2];
    for (int k = 0; k < 2; k++) {
        config(&c, out, sizeof out, k ? "kl-base" : "kl-init");
        c.steps = 1;
        c.iterations = 1;
        c.kl_ref = k ? KL_REF_BASE : KL_REF_INIT;
        cr_assert_eq(grpo_train(&c, &res), 0, "%s", er_last_error());
        int n;
        cJSON **m = read_lines(out, "metrics.jsonl", &n);
        kl[k] = num(m[0], "kl");
        free_lines(m);
    }
    cr_assert_eq(kl[0], 0.0, "step 1 KL against the starting adapter: %g", kl[0]);
    cr_assert(kl[1] > 1e-6, "step 1 KL against the base: %g", kl[1]);
    // The reference travels with the checkpoint: a resume reads it back, not --adapter.
    char ref[300];
    snprintf(ref, sizeof ref, "%s/kl-init/checkpoint/reference/adapter_model.safetensors", root);
    cr_assert(path_exists(ref), "no %s", ref);
}

// --mask-truncated (TRL's mask_truncated_completions): completions cut at the token limit leave the
// loss. The tiny random model never stops by itself, so every completion here is truncated: masked, the
// step has no token in the loss (loss and gradient 0); unmasked, it has (the KL to the base gives a
// gradient where the flat groups' advantages give none).
Test(grpo_run, mask_truncated_leaves_cut_completions_out, .init = make_inputs, .fini = remove_root,
     .timeout = 120) {
    threads_set(2);
    char out[256];
    GrpoConfig c;
    GrpoResult res;
    double gnorm[2], trunc[2];
    for (int k = 0; k < 2; k++) {
        config(&c, out, sizeof out, k ? "masked" : "unmasked");
        c.steps = 1;
        c.mask_truncated = k;
        c.kl_ref = KL_REF_BASE;
        cr_assert_eq(grpo_train(&c, &res), 0, "%s", er_last_error());
        int n;
        cJSON **m = read_lines(out, "metrics.jsonl", &n);
        gnorm[k] = num(m[0], "grad_norm");
        trunc[k] = num(m[0], "truncated");
        free_lines(m);
    }
    cr_assert_eq(trunc[0], 1.0, "truncated share %g: the case needs every completion cut", trunc[0]);
    cr_assert_eq(trunc[1], 1.0);
    cr_assert(gnorm[0] > 0, "unmasked gradient norm %g", gnorm[0]);
    cr_assert_eq(gnorm[1], 0.0, "masked gradient norm %g", gnorm[1]);
}

// Prompts are drawn without replacement within an epoch (a seeded shuffle, as TRL's sampler): 12
// records, 4 prompts a step, 3 steps draw every record once. completions.jsonl names each draw's record.
Test(grpo_run, prompts_drawn_without_replacement, .init = make_inputs, .fini = remove_root, .timeout = 120) {
    threads_set(2);
    char out[256];
    GrpoConfig c;
    GrpoResult res;
    config(&c, out, sizeof out, "order");
    c.prompts = 4;
    c.steps = 3;
    c.iterations = 1;
    c.log_completions = 1;
    cr_assert_eq(grpo_train(&c, &res), 0, "%s", er_last_error());
    int n, seen[64] = {0};
    cJSON **lines = read_lines(out, "completions.jsonl", &n);
    cr_assert_eq(n, 12, "completions.jsonl: %d lines, expected one per group", n);
    for (int i = 0; i < n; i++) {
        int line = (int)num(lines[i], "record_line");
        cr_assert(line >= 1 && line <= 12, "record line %d", line);
        cr_assert_eq(seen[line]++, 0, "record %d drawn twice in one epoch", line);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(lines[i], "rewards");
        cr_assert(cJSON_IsObject(t) && cJSON_GetObjectItemCaseSensitive(t, "budget"), "no reward terms");
        cr_assert(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(lines[i], "completion")));
    }
    free_lines(lines);
}

// Dynamic sampling (DAPO): with --max-draws a step draws more prompts while fewer than --prompts groups
// have a reward spread. The tiny random model answers nothing right, so every group is flat: each step
// draws --max-draws prompts and trains on none of them.
Test(grpo_run, dynamic_sampling_draws_until_spread, .init = make_inputs, .fini = remove_root, .timeout = 120) {
    threads_set(2);
    char out[256];
    GrpoConfig c;
    GrpoResult res;
    config(&c, out, sizeof out, "dyn");
    c.steps = 2;
    c.max_draws = 5;
    cr_assert_eq(grpo_train(&c, &res), 0, "%s", er_last_error());
    int n;
    cJSON **m = read_lines(out, "metrics.jsonl", &n);
    cr_assert_eq(n, 2);
    for (int i = 0; i < n; i++) {
        cr_assert_eq(num(m[i], "flat_groups"), 1.0, "the case needs flat groups");
        cr_assert_eq(num(m[i], "prompts_drawn"), 5, "step %d drew %g prompts", i + 1, num(m[i], "prompts_drawn"));
        cr_assert_eq(num(m[i], "groups_in_loss"), 0);
    }
    free_lines(m);
    config(&c, out, sizeof out, "dyn-bad");
    c.max_draws = 1; // fewer than --prompts
    cr_assert(grpo_train(&c, &res) < 0);
    cr_assert(strstr(er_last_error(), "--max-draws"), "%s", er_last_error());
}

// --eval-data: greedy accuracy, unformatted share and L per budget every --eval-every steps and at the
// last, in metrics.jsonl; the best adapter by eval accuracy in OUT/best with its step. The per-step logs
// carry TRL's names beside today's.
Test(grpo_run, eval_best_and_logs, .init = make_inputs, .fini = remove_root, .timeout = 120) {
    threads_set(2);
    char out[256];
    GrpoConfig c;
    GrpoResult res;
    config(&c, out, sizeof out, "eval");
    c.steps = 3;
    c.eval_data = data;
    c.eval_every = 2;
    c.eval_n = 3;
    c.format_weight = 0.5;
    cr_assert_eq(grpo_train(&c, &res), 0, "%s", er_last_error());
    int n;
    cJSON **m = read_lines(out, "metrics.jsonl", &n);
    cr_assert_eq(n, 3);
    cr_assert_null(cJSON_GetObjectItemCaseSensitive(m[0], "eval_accuracy"), "step 1 is no eval step");
    for (int i = 1; i < 3; i++) {
        double acc = num(m[i], "eval_accuracy"), unf = num(m[i], "eval_unformatted");
        cr_assert(acc >= 0 && acc <= 1 && unf >= 0 && unf <= 1);
        const cJSON *lb = cJSON_GetObjectItemCaseSensitive(m[i], "eval_length_by_budget");
        cr_assert(cJSON_IsObject(lb) && cJSON_GetObjectItemCaseSensitive(lb, "8") &&
                  cJSON_GetObjectItemCaseSensitive(lb, "16"), "eval L per budget missing");
    }
    const char *keys[] = {"reward_std", "rewards/budget/mean", "rewards/format/mean", "clip_ratio/low_mean",
                          "clip_ratio/high_mean", "clip_ratio/region_mean", "truncated", "unformatted",
                          "prompts_drawn", "entropy", "grad_norm", "lr", "kl", "rollout_tokens_per_s",
                          "train_tokens_per_s"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
        num(m[0], keys[k]);
    // The total is the sum of the weighted terms.
    double want = num(m[0], "rewards/budget/mean") + 0.5 * num(m[0], "rewards/format/mean");
    cr_assert_float_eq(num(m[0], "reward"), want, 1e-6);
    cr_assert(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(m[0], "length_max_by_budget")));
    free_lines(m);
    char best[300];
    snprintf(best, sizeof best, "%s/best/eval.json", out);
    cr_assert(path_exists(best), "no %s", best);
    snprintf(best, sizeof best, "%s/best/adapter_model.safetensors", out);
    cr_assert(path_exists(best), "no %s", best);
}

// --reward-cmd: the program's terms are added to the reward and logged by name; with a reward spread from
// it, dynamic sampling fills the step with groups that have one. A program that dies is an error naming
// the step and the record.
Test(grpo_run, reward_cmd_terms_and_errors, .init = make_inputs, .fini = remove_root, .timeout = 120) {
    threads_set(2);
    char out[256];
    GrpoConfig c;
    GrpoResult res;
    config(&c, out, sizeof out, "cmd");
    c.steps = 2;
    c.max_draws = 8;
    // Two terms from the query line: its length's parity (a spread within most groups) and a constant.
    c.reward_cmd = "python3 -c 'import sys\nfor l in sys.stdin: print(\"{\\\"parity\\\": %d, \\\"half\\\": 0.5}\" "
                   "% (len(l) % 2), flush=True)'";
    cr_assert_eq(grpo_train(&c, &res), 0, "%s", er_last_error());
    int n;
    cJSON **m = read_lines(out, "metrics.jsonl", &n);
    for (int i = 0; i < n; i++) {
        cr_assert_eq(num(m[i], "groups_in_loss"), 2, "step %d: %g groups in the loss", i + 1,
                     num(m[i], "groups_in_loss"));
        cr_assert(num(m[i], "prompts_drawn") >= 2);
        cr_assert_eq(num(m[i], "rewards/half/mean"), 0.5);
        double want = num(m[i], "rewards/budget/mean") + num(m[i], "rewards/parity/mean") + 0.5;
        cr_assert_float_eq(num(m[i], "reward"), want, 1e-6);
    }
    free_lines(m);
    config(&c, out, sizeof out, "cmd-dies");
    c.reward_cmd = "read line; echo 1; exit 3";
    cr_assert(grpo_train(&c, &res) < 0, "a dying reward program was not noticed");
    cr_assert(strstr(er_last_error(), "grpo step 1") && strstr(er_last_error(), "data.jsonl:") &&
              strstr(er_last_error(), "status 3"), "%s", er_last_error());
}
