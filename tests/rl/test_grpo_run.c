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
#include "tests/infer/helpers.h"
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
    c->quiet = 1;
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
    LoraShape s = {m.cfg.L, m.cfg.C, m.cfg.NH * m.cfg.HS, m.cfg.NKV * m.cfg.HS, m.cfg.FF};
    cr_assert_eq(peft_load(&x, out_a, &s, 0), 0, "%s", er_last_error());
    cr_assert_eq(peft_load(&y, out_b, &s, 0), 0, "%s", er_last_error());
    cr_assert_arr_eq(x.params, y.params, sizeof(float) * x.n_params, "final adapters differ");
    cr_assert_str_eq(x.reasoning_prefix, "<think>\n");
    lora_free(&x);
    lora_free(&y);
    model_free(&m);
}
