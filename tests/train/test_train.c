// The training loops end to end on a tiny model (2 layers, hidden 32) and 50 synthetic chains
// records: SFT lowers the loss, pretraining overfits a handful of records, a resumed run writes
// the same metrics and adapter bit for bit as an uninterrupted one, the PEFT adapter loads, and
// bad inputs fail with one-line errors (library and CLI).
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "data/synth.h"
#include "data/tokenizer.h"
#include "lora/peft.h"
#include "model/model.h"
#include "tests/common/helpers.h"
#include "tests/train/train_helpers.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

// ---- fixtures ----

// A random tiny base model dir with the tiny tokenizer next to it.
static void make_model(const char *dir) {
    ModelConfig c = helper_tiny_config(512, 1024);
    Model m;
    cr_assert_eq(model_build_random(&m, &c, 0.3f, 7), ER_OK, "%s", er_last_error());
    cr_assert_eq(model_save(&m, dir, 0), ER_OK, "%s", er_last_error());
    model_free(&m);
    helper_copy_file("data/tiny_tokenizer/tokenizer.json", dir, "tokenizer.json");
    helper_copy_file("data/tiny_tokenizer/tokenizer_config.json", dir, "tokenizer_config.json");
}

static void make_chains(const char *path, long n) {
    ChainsConfig c;
    chains_config_default(&c);
    c.max_steps = 4;
    SynthStats st;
    cr_assert_eq(chains_write_jsonl(&c, n, 11, path, NULL, &st), ER_OK, "%s", er_last_error());
}

typedef struct {
    char *root, *model, *data;
} Fixture;

static Fixture fx;

static void setup(void) {
    fx.root = helper_tmpdir("er_test_train");
    fx.model = join(fx.root, "base");
    fx.data = join(fx.root, "chains.jsonl");
    make_model(fx.model);
    make_chains(fx.data, 50);
}

static void teardown(void) {
    helper_rmdir(fx.root);
    er_free(fx.root);
    er_free(fx.model);
    er_free(fx.data);
}

static TrainConfig sft_config(const char *out) {
    TrainConfig c;
    train_config_default(&c, TRAIN_SFT);
    c.model_dir = fx.model;
    c.data_path = fx.data;
    c.out_dir = out;
    c.response_key = "concise";
    c.rank = 8;
    c.alpha = 16;
    c.seq_len = 128;
    c.batch = 8;
    c.eval_split = 0.1;
    c.threads = 1;
    return c;
}

// metrics.jsonl as an array of lines, each cut before "tokens_per_s" (the one wall-clock field,
// always last) so runs compare byte for byte on everything else.
static int read_metrics(const char *dir, char ***lines) {
    char *p = join(dir, "metrics.jsonl"), *text;
    size_t n;
    cr_assert_eq(file_read_all(p, 1 << 24, &text, &n), ER_OK, "%s", er_last_error());
    er_free(p);
    int count = 0;
    for (size_t i = 0; i < n; i++)
        count += text[i] == '\n';
    *lines = calloc((size_t)count + 1, sizeof(char *));
    int k = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char *cut = strstr(line, ",\"tokens_per_s\"");
        cr_assert(cut, "metrics line without tokens_per_s: %s", line);
        *cut = 0;
        (*lines)[k++] = strdup(line);
    }
    er_free(text);
    cr_assert_eq(k, count);
    return count;
}

static void free_lines(char **lines, int n) {
    for (int i = 0; i < n; i++)
        free(lines[i]);
    free(lines);
}

static double metrics_field(const char *line, const char *key) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s}", line); // the line was cut before tokens_per_s
    cJSON *j = cJSON_Parse(buf);
    cr_assert(j, "bad metrics line %s", line);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    cJSON_Delete(j);
    return d;
}

static void assert_files_equal(const char *a_dir, const char *b_dir, const char *name) {
    char *pa = join(a_dir, name), *pb = join(b_dir, name), *a, *b;
    size_t na, nb;
    cr_assert_eq(file_read_all(pa, 1 << 26, &a, &na), ER_OK, "%s", er_last_error());
    cr_assert_eq(file_read_all(pb, 1 << 26, &b, &nb), ER_OK, "%s", er_last_error());
    cr_assert(na == nb && memcmp(a, b, na) == 0, "%s differs between %s and %s", name, a_dir, b_dir);
    er_free(a);
    er_free(b);
    er_free(pa);
    er_free(pb);
}

// ---- SFT ----

#define SFT_STEPS 40
#define SFT_LR 2e-2

Test(train, sft_reduces_loss_and_writes_peft_adapter, .init = setup, .fini = teardown, .timeout = 60) {
    char *out = join(fx.root, "sft");
    TrainConfig c = sft_config(out);
    c.steps = SFT_STEPS;
    c.lr = SFT_LR;
    c.warmup = 2;
    c.eval_every = SFT_STEPS / 2;
    TrainResult r;
    cr_assert_eq(train_sft(&c, &r), ER_OK, "%s", er_last_error());
    cr_assert_eq(r.steps, SFT_STEPS);
    cr_assert_eq(r.n_train + r.n_eval, 50);
    cr_assert_eq(r.n_eval, 5);
    char **lines;
    int n = read_metrics(out, &lines);
    cr_assert_eq(n, SFT_STEPS, "one metrics line per optimizer step");
    double first = 0, last = 0;
    for (int i = 0; i < 3; i++) {
        first += metrics_field(lines[i], "loss") / 3;
        last += metrics_field(lines[n - 1 - i], "loss") / 3;
    }
    cr_assert_lt(last, 0.6 * first, "training loss did not fall: first steps %.3f, last steps %.3f", first, last);
    double eval_mid = metrics_field(lines[SFT_STEPS / 2 - 1], "eval_loss");
    double eval_end = metrics_field(lines[SFT_STEPS - 1], "eval_loss");
    cr_assert(isfinite(eval_mid) && isfinite(eval_end), "eval_loss missing at the middle and the end");
    cr_assert(isnan(metrics_field(lines[3], "eval_loss")), "eval_loss only when evaluated");
    cr_assert_lt(eval_end, first, "held-out loss %.3f did not fall below the first training loss %.3f", eval_end, first);
    cr_assert_float_eq(metrics_field(lines[0], "lr"), SFT_LR / 2, 1e-12, "warmup: step 1 at lr / 2");
    cr_assert_float_eq(metrics_field(lines[1], "lr"), SFT_LR, 1e-12);
    cr_assert_lt(metrics_field(lines[SFT_STEPS - 1], "lr"), SFT_LR / 100, "cosine decay to ~0 at the end");
    free_lines(lines, n);

    // The PEFT adapter loads, says it is masked with the reasoning prefix, and holds the trained weights.
    ModelConfig mc = helper_tiny_config(512, 1024);
    LoraShape s = model_config_lora_shape(&mc);
    LoraAdapter a;
    cr_assert_eq(peft_load(&a, out, &s, 0), ER_OK, "%s", er_last_error());
    cr_assert_eq(a.r, 8);
    cr_assert_float_eq(a.alpha, 16.0f, 0);
    cr_assert_eq(a.targets, LORA_ALL_TARGETS);
    cr_assert_eq(a.masked, 1);
    cr_assert_str_eq(a.reasoning_prefix, "<think>\n");
    TrainState st;
    AdamW opt;
    float *params = er_alloc(sizeof(float) * a.n_params);
    char *ck = join(out, "checkpoint");
    cr_assert_eq(adamw_init(&opt, backend_cpu(), a.n_params, 0, 0.9, 0.999, 1e-8, 0), ER_OK);
    cr_assert_eq(checkpoint_load(ck, &st, params, a.n_params, &opt), ER_OK, "%s", er_last_error());
    cr_assert_eq(st.step, SFT_STEPS);
    cr_assert_eq(opt.step, SFT_STEPS);
    cr_assert_eq(memcmp(params, a.params, sizeof(float) * a.n_params), 0, "adapter != final checkpoint");
    double bnorm = 0;
    for (int l = 0; l < a.L; l++)
        for (int t = 0; t < LT_COUNT; t++) {
            const LoraMat *m = lora_mat(&a, l, (LoraTarget)t);
            for (int i = 0; i < m->out * a.r; i++)
                bnorm += (double)m->B[i] * m->B[i];
        }
    cr_assert_gt(bnorm, 0, "B starts at zero and must have been trained");
    train_state_free(&st);
    adamw_free(&opt);
    er_free(params);
    er_free(ck);
    lora_free(&a);

    // run.json: resolved config, seed, version, counts.
    char *rj = join(out, "run.json");
    cJSON *j;
    cr_assert_eq(json_parse_file(rj, 1 << 20, &j), ER_OK, "%s", er_last_error());
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(j, "config");
    cr_assert_eq(cJSON_GetObjectItemCaseSensitive(cfg, "rank")->valueint, 8);
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(cfg, "response_key")->valuestring, "concise");
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(j, "version")->valuestring, "0.2.0");
    cr_assert_eq(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "counts"), "train")->valueint, 45);
    cr_assert(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j, "result")));
    cJSON_Delete(j);
    er_free(rj);
    er_free(out);
}

// Accumulation averages micro-batches: with one batch per epoch, 2 micro-batches hold the same four
// sequences (rows in another order), so step 1 must see the same loss and gradient norm as one
// micro-batch; an unscaled sum would double the norm.
Test(train, grad_accum_averages_micro_batches, .init = setup, .fini = teardown, .timeout = 60) {
    char *four = join(fx.root, "four.jsonl");
    make_chains(four, 4);
    double loss[2], norm[2];
    for (int k = 0; k < 2; k++) {
        char name[32];
        snprintf(name, sizeof name, "acc%d", k + 1);
        char *out = join(fx.root, name);
        TrainConfig c = sft_config(out);
        c.data_path = four;
        c.eval_split = 0;
        c.batch = 4;
        c.grad_accum = k + 1;
        c.steps = 1;
        c.clip = 0;
        cr_assert_eq(train_sft(&c, NULL), ER_OK, "%s", er_last_error());
        char **lines;
        int n = read_metrics(out, &lines);
        cr_assert_eq(n, 1);
        loss[k] = metrics_field(lines[0], "loss");
        norm[k] = metrics_field(lines[0], "grad_norm");
        cr_assert_eq(metrics_field(lines[0], "epoch"), k + 1, "a step of %d micro-batches ends epoch %d", k + 1, k + 1);
        free_lines(lines, n);
        er_free(out);
    }
    cr_assert_gt(norm[0], 0);
    cr_assert_float_eq(loss[1], loss[0], 1e-6 * loss[0], "loss %.9g vs %.9g", loss[1], loss[0]);
    cr_assert_float_eq(norm[1], norm[0], 1e-4 * norm[0], "grad norm %.9g with 2 micro-batches vs %.9g with one", norm[1],
                       norm[0]);
    er_free(four);
}

// Runs `c` interrupted after stop1 steps (and stop2 if > 0), resumed to the end, and compares with
// an uninterrupted run: metrics lines and the final output file `final_file`.
static void check_resume(TrainConfig c, int (*train)(const TrainConfig *, TrainResult *), int stop1, int stop2,
                         const char *final_file) {
    char *full = join(fx.root, "full"), *part = join(fx.root, "part");
    c.out_dir = full;
    cr_assert_eq(train(&c, NULL), ER_OK, "%s", er_last_error());

    c.out_dir = part;
    c.stop_after = stop1;
    cr_assert_eq(train(&c, NULL), ER_OK, "%s", er_last_error());
    char **lines;
    int n = read_metrics(part, &lines);
    cr_assert_eq(n, stop1, "the interrupted run logged %d steps", n);
    free_lines(lines, n);
    char *fin = join(part, final_file);
    cr_assert(!path_exists(fin), "an interrupted run must not write its final output");
    c.resume = 1;
    if (stop2 > 0) {
        c.stop_after = stop2;
        cr_assert_eq(train(&c, NULL), ER_OK, "%s", er_last_error());
    }
    c.stop_after = 0;
    cr_assert_eq(train(&c, NULL), ER_OK, "%s", er_last_error());
    cr_assert(path_exists(fin));

    char **a, **b;
    int na = read_metrics(full, &a), nb = read_metrics(part, &b);
    cr_assert_eq(na, c.steps);
    cr_assert_eq(nb, na, "resumed run has %d lines, uninterrupted %d", nb, na);
    for (int i = 0; i < na; i++)
        cr_assert_str_eq(b[i], a[i], "metrics line %d differs after resume", i + 1);
    assert_files_equal(full, part, final_file);
    free_lines(a, na);
    free_lines(b, nb);
    er_free(fin);
    er_free(full);
    er_free(part);
}

Test(train, sft_resume_is_bit_exact, .init = setup, .fini = teardown, .timeout = 60) {
    TrainConfig c = sft_config(NULL);
    // dropout and grad-accum draw per micro-batch; 45 sequences = 6 batches per epoch, so 9 steps of 2
    // micro-batches cross two epoch boundaries (one inside a step).
    c.steps = 9;
    c.grad_accum = 2;
    c.dropout = 0.1;
    c.lr = 5e-3;
    c.save_every = 3;
    c.eval_every = 4;
    c.threads = 1; // (two threads: the pretraining resume test below; one keeps this one fast on a busy machine)
    // killed after step 5 (checkpoint at 3: steps 4-5 are logged twice), then after step 7 (checkpoint 6)
    check_resume(c, train_sft, 5, 7, "adapter_model.safetensors");
}

// The trainer's device path (the job placed on a backend, checkpoints and outputs copied back to the
// host) on copies placed on the CPU: the same metrics and adapter bit for bit as the plain run, through
// an interruption and a resume.
Test(train, sft_placed_copy_matches_and_resumes, .init = setup, .fini = teardown, .timeout = 60) {
    TrainConfig c = sft_config(NULL);
    c.steps = 6;
    c.lr = 5e-3;
    c.save_every = 2;
    c.eval_every = 3;
    char *plain = join(fx.root, "plain");
    c.out_dir = plain;
    cr_assert_eq(train_sft(&c, NULL), ER_OK, "%s", er_last_error());
    c.place_on_cpu = 1;
    check_resume(c, train_sft, 3, 0, "adapter_model.safetensors");
    char *full = join(fx.root, "full");
    assert_files_equal(plain, full, "adapter_model.safetensors");
    char **a, **b;
    int na = read_metrics(plain, &a), nb = read_metrics(full, &b);
    cr_assert_eq(na, nb);
    for (int i = 0; i < na; i++)
        cr_assert_str_eq(b[i], a[i], "metrics line %d: placed copy vs plain run", i + 1);
    free_lines(a, na);
    free_lines(b, nb);
    er_free(full);
    er_free(plain);
}

// ---- pretraining ----

Test(train, pretrain_overfits_and_resumes, .init = setup, .fini = teardown, .timeout = 60) {
    // Four records, one batch: the model memorises them.
    char *small = join(fx.root, "four.jsonl");
    make_chains(small, 4);
    char *cfg_path = join(fx.root, "config.json");
    ModelConfig mc = helper_tiny_config(512, 1024);
    cJSON *cj = model_config_to_json(&mc);
    cr_assert_eq(json_write_file(cfg_path, cj), ER_OK);
    cJSON_Delete(cj);
    char *out = join(fx.root, "pre");
    TrainConfig c;
    train_config_default(&c, TRAIN_PRETRAIN);
    c.config_path = cfg_path;
    c.tokenizer_path = "data/tiny_tokenizer";
    c.data_path = small;
    c.out_dir = out;
    c.response_key = "direct";
    c.steps = 150;
    c.batch = 4;
    c.lr = 1e-2;
    c.warmup = 5;
    c.weight_decay = 0;
    c.eval_split = 0;
    c.seq_len = 128;
    c.threads = 1;
    TrainResult r;
    cr_assert_eq(train_pretrain(&c, &r), ER_OK, "%s", er_last_error());
    cr_assert_gt(r.first_loss, 5.0, "random init starts near ln(512) = 6.2, got %.3f", r.first_loss);
    cr_assert_lt(r.last_loss, 1.0, "did not overfit four records: loss %.3f -> %.3f", r.first_loss, r.last_loss);

    // The output is a model dir the rest of the stack loads: weights, config, tokenizer; SFT runs on it.
    Model m;
    cr_assert_eq(model_load(&m, out, 0), ER_OK, "%s", er_last_error());
    cr_assert_eq(m.cfg.C, 32);
    model_free(&m);
    Tokenizer *tok;
    cr_assert_eq(tok_load(&tok, out), ER_OK, "%s", er_last_error());
    tok_free(tok);
    char *sft_out = join(fx.root, "sft_on_pre");
    TrainConfig s = sft_config(sft_out);
    s.model_dir = out;
    s.data_path = small;
    s.steps = 2;
    s.batch = 4;
    s.eval_split = 0;
    cr_assert_eq(train_sft(&s, NULL), ER_OK, "%s", er_last_error());

    // Continued pretraining (--init): the run starts from the trained weights, so its first loss is the
    // memorised one, not a random model's; --config with --init, or neither, is refused.
    char *cont = join(fx.root, "pre-cont");
    TrainConfig ci = c;
    ci.config_path = NULL;
    ci.model_dir = out;
    ci.out_dir = cont;
    ci.steps = 2;
    TrainResult rc2;
    cr_assert_eq(train_pretrain(&ci, &rc2), ER_OK, "%s", er_last_error());
    cr_assert_lt(rc2.first_loss, 1.0, "--init started at loss %.3f, not from the trained weights", rc2.first_loss);
    ci.config_path = cfg_path;
    cr_assert_eq(train_pretrain(&ci, NULL), ER_EINVAL);
    cr_assert_not_null(strstr(er_last_error(), "--init"), "%s", er_last_error());
    ci.config_path = ci.model_dir = NULL;
    cr_assert_eq(train_pretrain(&ci, NULL), ER_EINVAL);
    er_free(cont);

    // Resume of a full-parameter run: model weights and metrics bit for bit.
    c.data_path = fx.data;
    c.steps = 6;
    c.save_every = 2;
    c.eval_split = 0.1;
    c.eval_every = 3;
    c.weight_decay = 0.1;
    c.threads = 2;
    check_resume(c, train_pretrain, 3, 0, "model.safetensors");
    // The same run on a copy placed on the CPU (the trainer's device path, every parameter trained there).
    char *placed = join(fx.root, "placed"), *full = join(fx.root, "full");
    c.out_dir = placed;
    c.place_on_cpu = 1;
    cr_assert_eq(train_pretrain(&c, NULL), ER_OK, "%s", er_last_error());
    assert_files_equal(full, placed, "model.safetensors");
    er_free(placed);
    er_free(full);
    er_free(sft_out);
    er_free(out);
    er_free(cfg_path);
    er_free(small);
}

// The trainer's passes never hold the whole (rows x T, V) logits: at V = 2^18 a 64 MiB chunk holds 64 rows,
// and 8 sequences of up to 32 positions would need up to 256 MiB of logits. The plan's activations stay
// below a chunk plus the rest (a few MiB at hidden 32), where the whole logits of 8 sequences of more than
// 9 positions would already pass 72 MiB.
Test(train, passes_keep_a_chunk_of_logits, .init = setup, .fini = teardown, .timeout = 120) {
    char *cfg_path = join(fx.root, "big_vocab.json"), *out = join(fx.root, "big_vocab"), *said = join(fx.root, "said");
    ModelConfig mc = helper_tiny_config(1 << 18, 64);
    cJSON *cj = model_config_to_json(&mc);
    cr_assert_eq(json_write_file(cfg_path, cj), ER_OK);
    cJSON_Delete(cj);
    TrainConfig c;
    train_config_default(&c, TRAIN_PRETRAIN);
    c.config_path = cfg_path;
    c.tokenizer_path = "data/tiny_tokenizer";
    c.data_path = fx.data;
    c.out_dir = out;
    c.response_key = "direct";
    c.steps = 1;
    c.batch = 8;
    c.eval_split = 0;
    c.seq_len = 32;
    c.threads = 2;
    FILE *fp = fopen(said, "w");
    cr_assert(fp);
    c.out = fp;
    TrainResult r;
    int rc = train_pretrain(&c, &r);
    fclose(fp);
    cr_assert_eq(rc, ER_OK, "%s", er_last_error());
    cr_assert(isfinite(r.first_loss) && r.first_loss > 10.0, "random init near ln(2^18) = 12.5, got %g", r.first_loss);
    char *text;
    size_t n;
    cr_assert_eq(file_read_all(said, 1 << 20, &text, &n), ER_OK);
    const char *at = strstr(text, "activations ");
    double mib = 0;
    cr_assert(at && sscanf(at, "activations %lf MiB", &mib) == 1, "no activations in the plan: %s", text);
    cr_assert_lt(mib, 72.0, "activations %.1f MiB: the whole logits are kept", mib);
    cr_assert_gt(mib, 64.0, "activations %.1f MiB: less than one chunk of 64 rows", mib);
    er_free(text);
    er_free(cfg_path);
    er_free(out);
    er_free(said);
}

// ---- bad inputs ----

Test(train, bad_inputs_give_one_line_errors, .init = setup, .fini = teardown, .timeout = 60) {
    char *out = join(fx.root, "bad");
    TrainConfig c = sft_config(out);
    c.steps = 1;

    c.data_path = "/tmp/er_test_no_such_file.jsonl";
    cr_assert_lt(train_sft(&c, NULL), 0);
    assert_one_line_error("/tmp/er_test_no_such_file.jsonl");
    cr_assert(!path_exists(out), "a failed start must not leave a run dir behind");

    char *bad = join(fx.root, "bad.jsonl");
    const char *text = "{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": \"c\", \"completion\": \"d\"}\n{\"prompt\": \"e\",\n";
    cr_assert_eq(file_write_atomic(bad, text, strlen(text)), ER_OK);
    c.data_path = bad;
    c.response_key = NULL;
    cr_assert_lt(train_sft(&c, NULL), 0);
    char where[512];
    snprintf(where, sizeof where, "%s:3", bad);
    assert_one_line_error(where);

    c.data_path = fx.data; // chains records have no default response field
    cr_assert_lt(train_sft(&c, NULL), 0);
    assert_one_line_error("--response-key");
    c.response_key = "concise";

    c.rank = 0;
    cr_assert_lt(train_sft(&c, NULL), 0);
    assert_one_line_error("--rank");
    c.rank = 8;

    c.targets = "q_proj,nonsense";
    cr_assert_lt(train_sft(&c, NULL), 0);
    assert_one_line_error("nonsense");
    c.targets = "all";

    cr_assert_eq(train_sft(&c, NULL), ER_OK, "%s", er_last_error());
    cr_assert_lt(train_sft(&c, NULL), 0, "an existing run dir is not overwritten");
    assert_one_line_error("--resume");

    c.resume = 1; // a finished run resumes to nothing new; changed settings are refused
    c.lr = 1e-3;
    cr_assert_lt(train_sft(&c, NULL), 0);
    assert_one_line_error("lr");
    c.lr = 2e-4;
    cr_assert_eq(train_sft(&c, NULL), ER_OK, "%s", er_last_error());

    TrainConfig p;
    train_config_default(&p, TRAIN_PRETRAIN);
    p.config_path = "/tmp/er_test_no_such_config.json";
    p.tokenizer_path = "data/tiny_tokenizer";
    p.data_path = fx.data;
    char *pout = join(fx.root, "bad_pre");
    p.out_dir = pout;
    p.steps = 1;
    cr_assert_lt(train_pretrain(&p, NULL), 0);
    assert_one_line_error("no_such_config");
    er_free(pout);
    er_free(bad);
    er_free(out);
}

// Runs `cmd` through the shell; returns the exit status and the number of lines on stderr.
static int run_cli(const char *cmd, int *stderr_lines, char *first_line, size_t cap) {
    char err_path[] = "/tmp/er_test_cli_errXXXXXX";
    int fd = mkstemp(err_path);
    cr_assert_geq(fd, 0);
    close(fd);
    char full[4096];
    snprintf(full, sizeof full, "%s >/dev/null 2>%s", cmd, err_path);
    int st = system(full);
    char *text;
    size_t n;
    cr_assert_eq(file_read_all(err_path, 1 << 20, &text, &n), ER_OK);
    *stderr_lines = 0;
    for (size_t i = 0; i < n; i++)
        *stderr_lines += text[i] == '\n';
    snprintf(first_line, cap, "%s", text);
    er_free(text);
    unlink(err_path);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(train, cli_errors_are_one_line, .init = setup, .fini = teardown, .timeout = 60) {
    char *prog = helper_program("ertrain");
    helper_need_program(prog, "ertrain", "ertrain sft/pretrain CLI tests");
    char *out = join(fx.root, "cli");
    struct {
        const char *args, *expect;
    } cases[] = {
        {"sft --model %s --data /tmp/er_test_missing.jsonl --out %s", "er_test_missing.jsonl"},
        {"sft --model %s --data %s.nope --out %s --rank 0", "--rank"},
        {"sft --model %s --data MISSING --out %s --bogus", "--bogus"},
        {"pretrain --config %s/config.json --tokenizer data/tiny_tokenizer --data /tmp/er_test_missing.jsonl --out %s",
         "er_test_missing.jsonl"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[2048], cmd[3072], first[1024];
        if (i == 1)
            snprintf(args, sizeof args, cases[i].args, fx.model, fx.data, out);
        else
            snprintf(args, sizeof args, cases[i].args, fx.model, out);
        snprintf(cmd, sizeof cmd, "%s %s", prog, args);
        int lines, rc = run_cli(cmd, &lines, first, sizeof first);
        cr_assert_eq(rc, 1, "`%s` exited with %d", cmd, rc);
        cr_assert_eq(lines, 1, "`%s` wrote %d lines on stderr: %s", cmd, lines, first);
        cr_assert(strstr(first, cases[i].expect), "`%s`: \"%s\" does not mention %s", cmd, first, cases[i].expect);
    }
    // A vocabulary smaller than the tokenizer's (512 ids) was written without a word.
    char *cfg = join(fx.root, "small-vocab.json"), *small = join(fx.root, "small-vocab");
    const char *js = "{\"model_type\": \"qwen2\", \"hidden_size\": 32, \"intermediate_size\": 64, "
                     "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"vocab_size\": 300}";
    cr_assert_eq(file_write_atomic(cfg, js, strlen(js)), ER_OK);
    {
        char cmd[3072], first[1024];
        snprintf(cmd, sizeof cmd, "%s init --config %s --tokenizer data/tiny_tokenizer --out %s", prog, cfg, small);
        int lines, rc = run_cli(cmd, &lines, first, sizeof first);
        cr_assert_eq(rc, 1, "`%s` exited with %d", cmd, rc);
        cr_assert(lines == 1 && strstr(first, "smaller than the 512 ids"), "%s", first);
        cr_assert(!path_exists(small), "init wrote %s anyway", small);
    }
    er_free(cfg);
    er_free(small);
    // An existing run dir (one with a checkpoint) without --resume.
    char *marker = join(out, "checkpoint/state.json");
    cr_assert_eq(dir_make(out), ER_OK);
    cr_assert_eq(dir_make(marker), ER_OK); // only its existence counts here
    cr_assert_eq(rmdir(marker), 0);
    cr_assert_eq(file_write_atomic(marker, "{}", 2), ER_OK);
    char cmd[3072], first[1024];
    snprintf(cmd, sizeof cmd, "%s sft --model %s --data %s --response-key concise --out %s --steps 1", prog, fx.model,
             fx.data, out);
    int lines, rc = run_cli(cmd, &lines, first, sizeof first);
    cr_assert_eq(rc, 1);
    cr_assert_eq(lines, 1, "%s", first);
    cr_assert(strstr(first, "--resume"), "%s", first);
    er_free(marker);
    er_free(out);
    er_free(prog);
}

// The plan line names the device and, on the CPU by default, why not a GPU; --device cuda refuses in
// one line where no GPU can be used (this build without CUDA, or a machine without a device).
Test(train, cli_plan_names_the_device, .init = setup, .fini = teardown, .timeout = 60) {
    char *prog = helper_program("ertrain");
    helper_need_program(prog, "ertrain", "ertrain sft CLI tests");
    char *out = join(fx.root, "plan");
    CmdResult r = helper_run(fx.root, "%s sft --model %s --data %s --response-key concise --out %s --steps 1", prog,
                             fx.model, fx.data, out);
    cr_assert_eq(r.status, 0, "%s", r.err);
#ifdef ER_CUDA
    cr_expect(strstr(r.out, "sft: running on cpu (") || strstr(r.out, "sft: running on cuda:0 ("), "%s", r.out);
#else
    cr_expect(strstr(r.out, "sft: running on cpu (") && strstr(r.out, "): this build has no CUDA backend (make CUDA=1 "
                                                                 "adds it)\n"), "%s", r.out);
    helper_result_free(&r);
    r = helper_run(fx.root, "%s sft --model %s --data %s --response-key concise --out %s.cuda --steps 1 --device cuda",
                   prog, fx.model, fx.data, out);
    helper_expect_error(&r, "sft --device cuda", "--device cuda: this build has no CUDA backend");
#endif
    helper_result_free(&r);
    er_free(out);
    er_free(prog);
}

// --resume of an SFT run with the model dir spelled differently (was refused: the paths were compared
// as strings), then extending the finished run with a larger --steps (was refused as a warmup_steps
// change): it continues from the checkpoint and logs the new steps only.
Test(train, sft_resume_same_dir_other_spelling_and_extension, .init = setup, .fini = teardown, .timeout = 60) {
    char *out = join(fx.root, "ext");
    TrainConfig c = sft_config(out);
    c.steps = 6;
    c.save_every = 2;
    c.stop_after = 3;
    TrainResult r;
    cr_assert_eq(train_sft(&c, &r), ER_OK, "%s", er_last_error());
    char other[512];
    snprintf(other, sizeof other, "%s/../%s/./base", fx.root, strrchr(fx.root, '/') + 1);
    c.model_dir = other;
    c.stop_after = 0;
    c.resume = 1;
    cr_assert_eq(train_sft(&c, &r), ER_OK, "resume with %s: %s", other, er_last_error());
    cr_assert_eq(r.steps, 6);
    c.steps = 10;
    cr_assert_eq(train_sft(&c, &r), ER_OK, "extending to 10 steps: %s", er_last_error());
    cr_assert_eq(r.steps, 10);
    char **lines;
    int n = read_metrics(out, &lines);
    cr_assert_eq(n, 10, "%d metrics lines", n);
    cr_assert_eq(metrics_field(lines[9], "step"), 10);
    free_lines(lines, n);
    c.steps = 8;
    cr_assert_neq(train_sft(&c, &r), ER_OK, "shortening a run must be refused");
    assert_one_line_error("extended, not shortened");
    er_free(out);
}

// A run killed before its first checkpoint (the stop_after hook) left run.json and metrics.jsonl: the rerun
// starts afresh and --resume starts from step 0, each saying so in one line (were: "already exists and is not
// empty: pass --resume", then "nothing to resume"; only rm -rf helped). Files no stopped run leaves are
// still refused.
Test(train, run_stopped_before_its_first_checkpoint_restarts, .init = setup, .fini = teardown, .timeout = 60) {
    char *out = join(fx.root, "stopped"), *said = join(fx.root, "said.txt");
    TrainConfig c = sft_config(out);
    c.steps = 3;
    c.save_every = 0; // the only checkpoint would be the last
    for (int resume = 0; resume < 2; resume++) {
        c.stop_after = 1;
        c.resume = 0;
        if (resume)
            helper_rmdir(out);
        cr_assert_eq(train_sft(&c, NULL), ER_OK, "%s", er_last_error());
        char *ck = join(out, "checkpoint/state.json"), *run = join(out, "run.json");
        cr_assert(!path_exists(ck) && path_exists(run), "expected a run stopped before its first checkpoint");
        c.stop_after = 0;
        c.resume = resume;
        FILE *fp = fopen(said, "w");
        cr_assert(fp);
        c.out = fp;
        int rc = train_sft(&c, NULL);
        fclose(fp);
        c.out = NULL;
        cr_assert_eq(rc, ER_OK, "%s rerun refused: %s", resume ? "--resume" : "plain", er_last_error());
        char *text;
        size_t n;
        cr_assert_eq(file_read_all(said, 1 << 20, &text, &n), ER_OK);
        cr_assert(strstr(text, resume ? "nothing to resume" : "starting afresh"), "%s", text);
        er_free(text);
        char **lines;
        int k = read_metrics(out, &lines);
        cr_assert_eq(k, 3, "the restarted run logs its 3 steps once each, got %d lines", k);
        free_lines(lines, k);
        cr_assert(path_exists(ck), "no checkpoint at the end");
        er_free(ck), er_free(run);
    }
    // A dir holding something else (a file of the user's) is still refused.
    helper_rmdir(out);
    cr_assert_eq(dir_make(out), ER_OK);
    char *mine = join(out, "notes.txt");
    cr_assert_eq(file_write_atomic(mine, "x", 1), ER_OK);
    c.resume = 0;
    cr_assert_lt(train_sft(&c, NULL), 0);
    assert_one_line_error("notes.txt");
    cr_assert(path_exists(mine));
    er_free(mine), er_free(out), er_free(said);
}

// run.json and the checkpoint record a fingerprint of --data: a resume after the file changed at the same
// path is refused naming it (was: resumed on other data without a word); unchanged data resumes as before.
Test(train, resume_refuses_changed_data, .init = setup, .fini = teardown, .timeout = 60) {
    char *out = join(fx.root, "fp"), *data = join(fx.root, "mine.jsonl"), *text;
    size_t n;
    cr_assert_eq(file_read_all(fx.data, 1 << 24, &text, &n), ER_OK);
    cr_assert_eq(file_write_atomic(data, text, n), ER_OK);
    TrainConfig c = sft_config(out);
    c.data_path = data;
    c.steps = 4;
    c.save_every = 1;
    c.stop_after = 2;
    cr_assert_eq(train_sft(&c, NULL), ER_OK, "%s", er_last_error());
    cJSON *run = helper_read_json(out, "run.json");
    const cJSON *fp = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(run, "config"),
                                                       "data_fingerprint");
    cr_assert(cJSON_IsString(fp) && strchr(fp->valuestring, ':'), "run.json has no data fingerprint");
    cJSON_Delete(run);
    // The same bytes with one record changed (same length): refused, naming the file.
    char *p = strstr(text, "Start with ");
    cr_assert(p);
    char was = p[11];
    p[11] = was == '1' ? '2' : '1';
    cr_assert_eq(file_write_atomic(data, text, n), ER_OK);
    c.stop_after = 0;
    c.resume = 1;
    cr_assert_lt(train_sft(&c, NULL), 0);
    assert_one_line_error("mine.jsonl: the file changed since the checkpoint");
    p[11] = was; // back as it was: the resume goes on
    cr_assert_eq(file_write_atomic(data, text, n), ER_OK);
    cr_assert_eq(train_sft(&c, NULL), ER_OK, "%s", er_last_error());
    er_free(text), er_free(out), er_free(data);
}
