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

static void make_inputs(void) {
    cr_assert(mkdtemp(root));
    char dir[256], adir[256], data[256];
    snprintf(dir, sizeof dir, "%s/base", root);
    snprintf(adir, sizeof adir, "%s/adapter", root);
    snprintf(data, sizeof data, "%s/data.jsonl", root);
    Tokenizer *tok;
    cr_assert_eq(tok_load(&tok, "data/tiny_tokenizer"), 0);
    ModelConfig c = helper_tiny_config(tok_vocab_size(tok), 512);
    Model m;
    cr_assert_eq(model_build_random(&m, &c, 0.3f, 1), 0);
    cr_assert_eq(model_save(&m, dir, 0), 0);
    cr_assert_eq(run_copy_tokenizer("data/tiny_tokenizer", dir), 0, "%s", er_last_error());
    LoraAdapter a;
    helper_random_adapter(&a, &c, 0.05f, 3);
    a.reasoning_prefix = strdup("<think>\n");
    cr_assert_eq(peft_save(&a, adir), 0, "%s", er_last_error());
    ChainsConfig cc;
    chains_config_default(&cc);
    cc.max_steps = 2;
    ChainsStats cs;
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

static void config(GrpoConfig *c, char *out, size_t n, const char *name, char *paths[3]) {
    grpo_config_default(c);
    snprintf(out, n, "%s/%s", root, name);
    c->model_dir = paths[0];
    c->adapter_dir = paths[1];
    c->data_path = paths[2];
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

Test(grpo_run, resume_equals_uninterrupted, .init = make_inputs, .fini = remove_root, .timeout = 120) {
    threads_set(2);
    char base[256], adir[256], data[256], out_a[256], out_b[256];
    snprintf(base, sizeof base, "%s/base", root);
    snprintf(adir, sizeof adir, "%s/adapter", root);
    snprintf(data, sizeof data, "%s/data.jsonl", root);
    char *paths[3] = {base, adir, data};
    GrpoConfig c;
    GrpoResult res;
    config(&c, out_a, sizeof out_a, "a", paths);
    cr_assert_eq(grpo_train(&c, &res), 0, "%s", er_last_error());
    cr_assert_eq(res.steps, 4);

    config(&c, out_b, sizeof out_b, "b", paths);
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
    free(ma);
    free(mb);
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

static void paths_in(char base[256], char adir[256], char data[256]) {
    snprintf(base, 256, "%s/base", root);
    snprintf(adir, 256, "%s/adapter", root);
    snprintf(data, 256, "%s/data.jsonl", root);
}

// An adapter saved with lora_dropout > 0 (sft --dropout, PEFT's usual 0.05) trains: dropout is off in
// GRPO, and the adapter keeps its lora_dropout.
Test(grpo_run, adapter_with_dropout_trains, .init = make_inputs, .fini = remove_root, .timeout = 120) {
    threads_set(2);
    char base[256], adir[256], data[256], drop[256], out[256];
    paths_in(base, adir, data);
    snprintf(drop, sizeof drop, "%s/adapter-dropout", root);
    Model m;
    cr_assert_eq(model_load(&m, base, 0), 0);
    LoraShape s = model_config_lora_shape(&m.cfg);
    LoraAdapter a;
    cr_assert_eq(peft_load(&a, adir, &s, 0), 0, "%s", er_last_error());
    a.dropout = 0.05f;
    cr_assert_eq(peft_save(&a, drop), 0, "%s", er_last_error());
    lora_free(&a);
    char *paths[3] = {base, drop, data};
    GrpoConfig c;
    GrpoResult res;
    config(&c, out, sizeof out, "d", paths);
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
    char base[256], adir[256], data[256], out[256];
    paths_in(base, adir, data);
    char *paths[3] = {base, adir, data};
    GrpoConfig c;
    GrpoResult res;
    config(&c, out, sizeof out, "t", paths);
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
    char *bad_paths[3] = {base, adir, bad};
    config(&c, out, sizeof out, "u", bad_paths);
    cr_assert(grpo_train(&c, &res) < 0, "the long record was accepted");
    cr_assert(strstr(er_last_error(), "bad.jsonl:13") && strstr(er_last_error(), "--seq-len 160"), "%s",
              er_last_error());
    cr_assert(!path_exists(out), "a refused run left %s behind", out);

    // --seq-len 0 (the default) sizes the sequences from the budgets: 1000 and 3000 need about 3.6K
    // positions, which a fixed 1024 would refuse; the model's 512 positions still refuse them.
    config(&c, out, sizeof out, "v", paths);
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
    config(&c, out, sizeof out, "w", paths);
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
