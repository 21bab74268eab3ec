// The erinfer commands on a tiny random model dir in /tmp: generate --json as a user runs it ($ER_BUILD/erinfer:
// samples, tokens, stats; --samples; the hard budget; --kv int8), the eval and bench runners called directly
// (accuracy, grading through a forced answer, per-item JSONL; the full bench table, exact token counts) and
// erinfer eval's flags, and bad input: one error line on stderr, exit 1, no crash, no partial output file.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "data/synth.h"
#include "data/tokenizer.h"
#include "core/threads.h"
#include "infer/bench.h"
#include "infer/eval.h"
#include "lora/peft.h"
#include "tests/common/helpers.h"

static HelperFixture fx; // per test: the temp dir holding the model dir and outputs, tmp/model, $ER_BUILD/erinfer

static void setup(void) { helper_fixture_open(&fx, "er_cli_", "erinfer"); }
static void teardown(void) { helper_fixture_close(&fx); }
TestSuite(cli, .init = setup, .fini = teardown);

static void need_erinfer(void) { helper_need_program(fx.prog, "erinfer", "erinfer CLI tests"); }

static const char *PROMPT = "Start with 7. Add 5. Multiply by 3. What is the result?";

// Runs generate --json and parses stdout; asserts success.
static cJSON *generate_json(const char *flags) {
    CmdResult r = helper_run(fx.tmp, "'%s' generate --model '%s' --prompt '%s' --json --threads 1 %s", fx.prog,
                             fx.model, PROMPT, flags);
    cr_assert_eq(r.status, 0, "generate %s failed (%d): %s", flags, r.status, r.err);
    cJSON *j = cJSON_Parse(r.out);
    cr_assert(j, "generate --json printed no JSON: %s", r.out);
    helper_result_free(&r);
    return j;
}

static int json_int(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    cr_assert(cJSON_IsNumber(v), "\"%s\" missing or not a number", key);
    return v->valueint;
}

// Checks the shape of one generate --json result and returns its samples array.
static const cJSON *check_result(const cJSON *j, int n_samples, int max_tokens) {
    const cJSON *samples = cJSON_GetObjectItemCaseSensitive(j, "samples");
    cr_assert(cJSON_IsArray(samples), "no \"samples\" array");
    cr_assert_eq(cJSON_GetArraySize(samples), n_samples, "expected %d samples, got %d", n_samples,
                 cJSON_GetArraySize(samples));
    long total = 0;
    for (const cJSON *s = samples->child; s; s = s->next) {
        cr_assert(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(s, "text")), "sample without \"text\"");
        cr_assert(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(s, "finish")), "sample without \"finish\"");
        const cJSON *toks = cJSON_GetObjectItemCaseSensitive(s, "tokens");
        cr_assert(cJSON_IsArray(toks), "sample without \"tokens\"");
        int n = cJSON_GetArraySize(toks);
        cr_assert(n >= 1 && n <= max_tokens, "a sample has %d tokens, expected 1..%d", n, max_tokens);
        for (const cJSON *t = toks->child; t; t = t->next)
            cr_assert(cJSON_IsNumber(t) && t->valueint >= 0 && t->valueint < 512, "bad token id");
        total += n;
    }
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "stats");
    cr_assert(cJSON_IsObject(st), "no \"stats\" object");
    cr_assert_gt(json_int(st, "prompt_tokens"), 5);
    cr_assert_eq(json_int(st, "generated_tokens"), total, "stats.generated_tokens %d != %ld tokens in the samples",
                 json_int(st, "generated_tokens"), total);
    cr_assert_gt(json_int(st, "kv_bytes"), 0);
    cr_assert(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(st, "ttft_s")));
    cr_assert(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(st, "decode_tokens_per_s")));
    return samples;
}

Test(cli, generate_json_samples_tokens_stats) {
    need_erinfer();
    cJSON *j = generate_json("--max-new 12");
    check_result(j, 1, 12);
    cJSON_Delete(j);
    j = generate_json("--max-new 12 --samples 3 --temperature 1 --seed 4");
    const cJSON *samples = check_result(j, 3, 12);
    // Three samples from streams 0, 1, 2 of the seed: not all the same.
    char *a = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(samples, 0), "tokens"));
    int differ = 0;
    for (int i = 1; i < 3; i++) {
        char *b = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(samples, i), "tokens"));
        differ |= strcmp(a, b) != 0;
        cJSON_free(b);
    }
    cJSON_free(a);
    cr_assert(differ, "--samples 3 at temperature 1 gave three identical samples");
    cJSON_Delete(j);
}

Test(cli, generate_budget_respected) {
    need_erinfer();
    int budget = 6, answer = 16;
    cJSON *j = generate_json("--max-new 80 --samples 4 --temperature 1 --seed 2 --budget 6 --answer-tokens 16");
    const cJSON *samples = check_result(j, 4, budget + answer);
    int cut = 0;
    for (const cJSON *s = samples->child; s; s = s->next) {
        int n = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(s, "tokens"));
        int was_cut = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "budget_cut"));
        const char *text = cJSON_GetObjectItemCaseSensitive(s, "text")->valuestring;
        if (n > budget) {
            cr_assert(was_cut, "a sample ran past the budget (%d tokens) without being cut", n);
            cr_assert(strstr(text, "Final answer: "), "a budget-cut sample lacks the forced suffix: \"%s\"", text);
        }
        cut += was_cut;
    }
    cr_assert_gt(cut, 0, "no sample reached the budget of %d tokens: the test proves nothing", budget);
    cJSON_Delete(j);
}

Test(cli, generate_kv_int8) {
    need_erinfer();
    cJSON *f = generate_json("--max-new 8");
    cJSON *q = generate_json("--max-new 8 --kv int8");
    check_result(f, 1, 8);
    check_result(q, 1, 8);
    int bf = json_int(cJSON_GetObjectItemCaseSensitive(f, "stats"), "kv_bytes");
    int bq = json_int(cJSON_GetObjectItemCaseSensitive(q, "stats"), "kv_bytes");
    cr_assert_lt(bq, bf, "int8 KV uses %d bytes, fp32 %d: int8 must be smaller", bq, bf);
    cJSON_Delete(f);
    cJSON_Delete(q);
}

// Writes n chains records {problem, answer} to path; the first n_twelve get the gold answer 12, the
// others keep theirs (changed to 13 when it happens to be 12).
static void write_chains(const char *path, int n, int n_twelve) {
    ChainsConfig cc;
    chains_config_default(&cc);
    FILE *fp = fopen(path, "w");
    cr_assert(fp);
    for (int i = 0; i < n; i++) {
        SynthExample ex;
        cr_assert_eq(chains_generate(&cc, 9, (uint64_t)i, &ex), 0, "%s", er_last_error());
        const char *gold = i < n_twelve ? "12" : strcmp(ex.answer, "12") == 0 ? "13" : ex.answer;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "problem", ex.problem);
        cJSON_AddStringToObject(o, "answer", gold);
        char *s = cJSON_PrintUnformatted(o);
        fprintf(fp, "%s\n", s);
        cJSON_free(s);
        cJSON_Delete(o);
        synth_example_free(&ex);
    }
    fclose(fp);
}

static long count_lines_in(const char *path) {
    char *text;
    size_t len;
    cr_assert_eq(file_read_all(path, 64u << 20, &text, &len), 0, "%s", er_last_error());
    long n = helper_count_lines(text);
    er_free(text);
    return n;
}

// Five synthetic records, three with the gold answer 12. The hard budget cuts every sample after one
// free token and forces the suffix "\boxed{12}" (plus one token), so exactly those three are right:
// accuracy 3/5, and the per-item file says which.
Test(cli, eval_accuracy_and_output) {
    char *data = path_join(fx.tmp, "chains.jsonl"), *out = path_join(fx.tmp, "out.jsonl");
    write_chains(data, 5, 3);
    Tokenizer *tok;
    cr_assert_eq(tok_load(&tok, "data/tiny_tokenizer"), 0);
    const char *suffix = " \\boxed{12}";
    int *ids, n_suffix;
    cr_assert_eq(tok_encode(tok, suffix, strlen(suffix), &ids, &n_suffix), 0);
    er_free(ids);
    tok_free(tok);
    threads_set(1);
    EvalConfig c;
    eval_config_default(&c);
    c.session.model = fx.model;
    c.data = data;
    c.output = out;
    c.params.max_new_tokens = 40;
    c.params.budget = 1;
    c.params.answer_tokens = n_suffix + 1;
    c.params.budget_suffix = suffix;
    EvalResult res;
    cr_assert_eq(eval_run(&c, &res), 0, "eval failed: %s", er_last_error());
    cr_assert(res.correct == 3 && res.items == 5, "expected accuracy 3/5, got %ld/%ld", res.correct, res.items);
    cr_assert_eq(res.samples, 5, "no mean length: %ld samples", res.samples);
    cr_assert_gt(res.gen_s, 0, "no tokens/s: %g s generating", res.gen_s);

    cr_assert_eq(count_lines_in(out), 5);
    JsonlReader jr;
    cr_assert_eq(jsonl_open(&jr, out), 0);
    cJSON *o;
    long think = 0;
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(jsonl_next(&jr, &o), 1, "%s", er_last_error());
        cr_assert_eq(json_int(o, "line"), i + 1);
        cr_assert(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, "prompt")));
        const cJSON *gold = cJSON_GetObjectItemCaseSensitive(o, "gold");
        cr_assert(cJSON_IsString(gold));
        cr_assert_eq(strcmp(gold->valuestring, "12") == 0, i < 3);
        const cJSON *s0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "samples"), 0);
        cr_assert(cJSON_IsObject(s0), "record %d has no samples", i);
        cr_assert_eq(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s0, "correct")), i < 3, "record %d graded wrong", i);
        const cJSON *ans = cJSON_GetObjectItemCaseSensitive(s0, "answer");
        cr_assert(cJSON_IsString(ans) && strcmp(ans->valuestring, "12") == 0, "record %d: extracted answer", i);
        int n = json_int(s0, "n_tokens");
        cr_assert(n >= 1 && n <= 1 + n_suffix + 1, "record %d: %d tokens", i, n);
        // The suffix holds no </think>: the think length is every token but a final EOS.
        int eos = strcmp(cJSON_GetObjectItemCaseSensitive(s0, "finish")->valuestring, "eos") == 0;
        cr_assert_eq(json_int(s0, "think_len"), n - eos, "record %d", i);
        think += json_int(s0, "think_len");
        cr_assert(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(s0, "unformatted")), "record %d", i);
        cr_assert(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(s0, "text")));
        cr_assert(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(s0, "finish")));
        cJSON_Delete(o);
    }
    cr_assert_eq(jsonl_next(&jr, &o), 0);
    jsonl_close(&jr);
    cr_assert_eq(res.think_tokens, think, "the mean think length sums the samples' think_len");
    cr_assert_eq(res.unformatted, 0);

    // A prefix that opens a think block the suffix never closes: no sample has an answer to grade.
    c.params.response_prefix = "<think>\n";
    c.output = NULL;
    cr_assert_eq(eval_run(&c, &res), 0, "eval failed: %s", er_last_error());
    cr_assert(res.correct == 0 && res.unformatted == 5, "expected 0/5 right, 5 unformatted; got %ld, %ld", res.correct,
              res.unformatted);
    c.output = out;

    // The command's flags: --limit and --samples, two records, two samples each, pass@2 printed.
    need_erinfer();
    CmdResult r = helper_run(fx.tmp,
                             "'%s' eval --model '%s' --data '%s' --output '%s' --max-new 6 --limit 2 --samples 2 "
                             "--temperature 1 --kv int8 --threads 1", fx.prog, fx.model, data, out);
    cr_assert_eq(r.status, 0, "eval failed (%d): %s", r.status, r.err);
    cr_assert(strstr(r.out, "accuracy: ") && strstr(r.out, "/2)"), "%s", r.out);
    cr_assert(strstr(r.out, "pass@2: "), "%s", r.out);
    cr_assert(strstr(r.out, "unformatted: ") && strstr(r.out, "mean think length L: "), "%s", r.out);
    helper_result_free(&r);
    cr_assert_eq(count_lines_in(out), 2);
    er_free(data);
    er_free(out);
}

// Every row of the table (f32 and int8 x N = 1, 2, 4, 8) with exactly N x new-tokens tokens, and
// int8 rows using less KV memory than fp32 ones.
Test(cli, bench_table) {
    threads_set(1);
    BenchConfig c = {.model = fx.model, .prompt_tokens = 40, .new_tokens = 5};
    BenchResult res;
    cr_assert_eq(bench_run(&c, &res), 0, "bench failed: %s", er_last_error());
    double kv[2][4] = {{0}};
    for (int i = 0; i < res.n_rows; i++) {
        const BenchRow *r = &res.rows[i];
        int k = strcmp(r->kv, "int8") == 0, N = r->n;
        cr_assert(k || strcmp(r->kv, "f32") == 0, "unknown KV type \"%s\"", r->kv);
        int j = N == 1 ? 0 : N == 2 ? 1 : N == 4 ? 2 : N == 8 ? 3 : -1;
        cr_assert_geq(j, 0, "unexpected N %d", N);
        cr_assert_eq(r->tokens, 5L * N, "N = %d generated %ld tokens, expected %d", N, r->tokens, 5 * N);
        cr_assert(r->ttft_s > 0 && r->step_s > 0 && r->stream_tps > 0 && r->kv_bytes > 0, "non-positive number in row %d",
                  i);
        kv[k][j] = (double)r->kv_bytes;
    }
    cr_assert_eq(res.n_rows, 8, "expected 8 table rows, got %d", res.n_rows);
    for (int j = 0; j < 4; j++)
        cr_assert_lt(kv[1][j], kv[0][j], "int8 KV not smaller than fp32 for row %d", j);
    // The footprint: the mapping is the weights file (an fp32 model, used in place: only its vectors are
    // copied), and a row's KV allocation holds at least keys and values of every position of N samples.
    struct stat st;
    char *file = path_join(fx.model, "model.safetensors");
    cr_assert_eq(stat(file, &st), 0);
    cr_assert_eq(res.mapped_bytes, (size_t)st.st_size, "mapped %zu bytes, the file has %lld", res.mapped_bytes,
                 (long long)st.st_size);
    cr_assert(res.copied_bytes > 0 && res.copied_bytes < res.weight_bytes / 4, "copied %zu of %zu weight bytes",
              res.copied_bytes, res.weight_bytes);
    cr_assert(res.kernels && res.kernels[0]);
    Model m;
    cr_assert_eq(model_load(&m, fx.model, 0), 0, "%s", er_last_error());
    for (int i = 0; i < res.n_rows; i++) {
        const BenchRow *r = &res.rows[i];
        size_t per_pos = 2 * (size_t)m.cfg.L * m.cfg.NKV * m.cfg.HS * (strcmp(r->kv, "f32") ? 1 : sizeof(float));
        cr_assert_geq(r->kv_alloc_bytes, per_pos * r->n * (c.prompt_tokens + c.new_tokens), "row %d: KV allocated %zu bytes", i, r->kv_alloc_bytes);
        cr_assert_geq(r->kv_alloc_bytes, r->kv_bytes, "row %d: KV in use beyond the allocation", i);
        cr_assert_gt(r->scratch_bytes, (size_t)m.cfg.V * sizeof(float), "row %d: scratch %zu bytes", i, r->scratch_bytes);
    }
    model_free(&m);
    er_free(file);
}

// The adapter-after-base-prefill row: a masked adapter reuses every prompt position the base
// prefilled, an unmasked one recomputes them all; the result carries the table's rows too.
Test(cli, bench_adapter_after_base_prefill) {
    Model m;
    cr_assert_eq(model_load(&m, fx.model, 0), 0, "%s", er_last_error());
    LoraShape s = model_config_lora_shape(&m.cfg);
    model_free(&m);
    threads_set(1);
    for (int masked = 0; masked <= 1; masked++) {
        LoraAdapter a;
        cr_assert_eq(lora_init(&a, &s, 4, 8.0f, 0, 0.0f, LORA_ALL_TARGETS, 0, 3), 0);
        for (size_t i = 0; i < a.n_params; i++)
            a.params[i] = 0.01f * (float)((i * 7919) % 13) - 0.06f;
        a.masked = masked;
        char *dir = path_join(fx.tmp, masked ? "masked" : "unmasked");
        cr_assert_eq(peft_save(&a, dir), 0, "%s", er_last_error());
        lora_free(&a);
        BenchConfig c = {.model = fx.model, .adapter = dir, .prompt_tokens = 24, .new_tokens = 3};
        BenchResult res;
        cr_assert_eq(bench_run(&c, &res), 0, "bench failed: %s", er_last_error());
        cr_assert_eq(res.n_rows, 8);
        cr_assert_gt(res.weight_bytes, 0);
        cr_assert(res.has_adapter, "no adapter-after-base-prefill row");
        cr_assert_eq(res.adapter_row.prompt_reused, masked ? 24 : 0, "%s adapter reused %d prompt positions",
                     masked ? "masked" : "unmasked", res.adapter_row.prompt_reused);
        cr_assert_eq(res.adapter_masked, masked);
        er_free(dir);
    }
}

// The command's own output: --json prints one object with the table's rows (make demo reads it), and
// the table prints a line per row.
Test(cli, bench_prints_json_and_table) {
    need_erinfer();
    CmdResult r = helper_run(fx.tmp, "'%s' bench --model '%s' --prompt-tokens 16 --new-tokens 2 --threads 1 --json",
                             fx.prog, fx.model);
    cr_assert_eq(r.status, 0, "bench --json failed (%d): %s", r.status, r.err);
    cJSON *j = cJSON_Parse(r.out);
    cr_assert(j, "bench --json printed no JSON object:\n%s", r.out);
    const cJSON *rows = cJSON_GetObjectItem(j, "rows");
    cr_assert_eq(cJSON_GetArraySize(rows), 8);
    cr_assert_gt(cJSON_GetObjectItem(j, "weight_bytes")->valuedouble, 0);
    const cJSON *row = cJSON_GetArrayItem(rows, 7);
    cr_assert_eq((int)cJSON_GetObjectItem(row, "n")->valuedouble * 2, (int)cJSON_GetObjectItem(row, "tokens")->valuedouble);
    cJSON_Delete(j);
    helper_result_free(&r);
    r = helper_run(fx.tmp, "'%s' bench --model '%s' --prompt-tokens 16 --new-tokens 2 --threads 1", fx.prog, fx.model);
    cr_assert_eq(r.status, 0, "bench failed (%d): %s", r.status, r.err);
    cr_assert(strstr(r.out, "int8"), "no int8 row in the table:\n%s", r.out);
    cr_assert_geq(helper_count_lines(r.out), 9, "expected a header and 8 rows:\n%s", r.out);
    helper_result_free(&r);
}

// A bad invocation: exit status 1 (not a crash), exactly one line on stderr naming the problem.
static void expect_error(const char *args, const char *needle) {
    CmdResult r = helper_run(fx.tmp, "'%s' %s", fx.prog, args);
    cr_assert_eq(r.status, 1, "`erinfer %s` exited %d (expected 1); stderr:\n%s", args, r.status, r.err);
    cr_assert_eq(helper_count_lines(r.err), 1, "`erinfer %s`: expected one line on stderr, got:\n%s", args, r.err);
    cr_assert(strncmp(r.err, "erinfer ", 8) == 0, "stderr does not start with \"erinfer \": %s", r.err);
    cr_assert(strstr(r.err, needle), "`erinfer %s`: stderr \"%s\" does not mention \"%s\"", args, r.err, needle);
    helper_result_free(&r);
}

Test(cli, bad_inputs_fail_cleanly) {
    need_erinfer();
    char args[2048];
    expect_error("generate --prompt hi", "--model");
    snprintf(args, sizeof args, "generate --model '%s' --prompt hi --kv fp16", fx.model);
    expect_error(args, "--kv");
    snprintf(args, sizeof args, "generate --model '%s' --prompt hi --temperature -1", fx.model);
    expect_error(args, "--temperature");
    snprintf(args, sizeof args, "generate --model '%s/nonexistent' --prompt hi", fx.tmp);
    expect_error(args, "nonexistent");
    snprintf(args, sizeof args, "bench --model '%s/nonexistent'", fx.tmp);
    expect_error(args, "nonexistent");
    snprintf(args, sizeof args, "eval --data x.jsonl --max-new 4");
    expect_error(args, "--model");
    snprintf(args, sizeof args, "eval --model '%s' --data '%s/none.jsonl'", fx.model, fx.tmp);
    expect_error(args, "none.jsonl");
    snprintf(args, sizeof args, "eval --model '%s' --data x.jsonl --kv q4", fx.model);
    expect_error(args, "--kv");

    // Malformed third line: the error names file:3 and no output file is left behind.
    char *bad = path_join(fx.tmp, "bad.jsonl"), *out = path_join(fx.tmp, "bad_out.jsonl");
    const char *text = "{\"problem\": \"Start with 1. Add 2. What is the result?\", \"answer\": \"3\"}\n"
                       "{\"problem\": \"Start with 2. Add 2. What is the result?\", \"answer\": \"4\"}\n"
                       "{\"problem\": \"Start with 3. Add 2.\", \n";
    cr_assert_eq(file_write_atomic(bad, text, strlen(text)), 0);
    snprintf(args, sizeof args, "eval --model '%s' --data '%s' --output '%s'", fx.model, bad, out);
    expect_error(args, "bad.jsonl:3");
    cr_assert(!path_exists(out), "a failed eval left %s behind", out);

    // A record without a gold answer is an error too, named by its line.
    text = "{\"problem\": \"Start with 1. Add 2. What is the result?\", \"answer\": \"3\"}\n"
           "{\"prompt\": \"Say hi\"}\n";
    cr_assert_eq(file_write_atomic(bad, text, strlen(text)), 0);
    expect_error(args, "bad.jsonl:2");
    cr_assert(!path_exists(out), "a failed eval left %s behind", out);
    er_free(bad);
    er_free(out);
}

// What a new user and a fuzzer ran into: a budget above the default --max-new that never applied, a
// budget --max-new cannot hold, an --output that is a directory (found after the whole eval), score
// past the model's positions, text that is not UTF-8 reported without its file, non-finite weights,
// and text flags (\n in --budget-suffix, --prefix, --stop) read literally.
Test(cli, budgets_outputs_positions_and_text_flags) {
    need_erinfer();
    // --budget 300 with the default --max-new: the limit follows the budget, so the budget applies.
    cJSON *j = generate_json("--budget 300 --samples 4 --temperature 1 --seed 3");
    int cut = 0;
    for (const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "samples")->child; s; s = s->next)
        cut += cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "budget_cut"));
    cr_assert_gt(cut, 0, "--budget 300 never cut a sample: the default --max-new still applied");
    cJSON_Delete(j);
    char args[2048];
    snprintf(args, sizeof args, "generate --model '%s' --prompt hi --budget 300 --max-new 100", fx.model);
    expect_error(args, "budget of 300 tokens");

    // Text flags: "\n" typed in a shell is a newline.
    j = generate_json("--budget 2 --answer-tokens 12 --budget-suffix 'X\\nY: ' --temperature 1 --seed 4");
    const cJSON *s0 = cJSON_GetObjectItemCaseSensitive(j, "samples")->child;
    const char *text = cJSON_GetObjectItemCaseSensitive(s0, "text")->valuestring;
    cr_assert(strstr(text, "X\nY: "), "the suffix was not decoded: \"%s\"", text);
    cJSON_Delete(j);
    CmdResult r = helper_run(fx.tmp, "'%s' generate --help", fx.prog);
    cr_assert(strstr(r.out, "--prefix TEXT") && strstr(r.out, "--budget-suffix TEXT") && strstr(r.out, "--stop TEXT"),
              "text flags are not TEXT:\n%s", r.out);
    helper_result_free(&r);

    // --output that is a directory: refused before any generation.
    char *data = path_join(fx.tmp, "chains.jsonl");
    write_chains(data, 3, 1);
    snprintf(args, sizeof args, "eval --model '%s' --data '%s' --output '%s'", fx.model, data, fx.tmp);
    expect_error(args, "is a directory");

    // Past max_position_embeddings (the tiny model has 4096): score refuses instead of extrapolating.
    char *longf = path_join(fx.tmp, "long.jsonl");
    FILE *fp = fopen(longf, "w");
    cr_assert(fp);
    fputs("{\"tokens\": [", fp);
    for (int i = 0; i < 5000; i++)
        fprintf(fp, "%s%d", i ? ", " : "", 40 + i % 50);
    fputs("]}\n", fp);
    fclose(fp);
    snprintf(args, sizeof args, "score --model '%s' --input '%s'", fx.model, longf);
    expect_error(args, "max_position_embeddings");
    snprintf(args, sizeof args, "generate --model '%s' --prompt hi --context 5000", fx.model);
    expect_error(args, "max_position_embeddings");
    // A token id far outside int: refused by its range (converting it to int first is undefined).
    char *huge = path_join(fx.tmp, "huge.jsonl");
    const char *huge_line = "{\"tokens\": [1, 1e300]}\n";
    cr_assert_eq(file_write_atomic(huge, huge_line, strlen(huge_line)), 0);
    snprintf(args, sizeof args, "score --model '%s' --input '%s'", fx.model, huge);
    expect_error(args, "integer id");
    er_free(huge);

    // Not UTF-8: the message names the file.
    char *msgs = path_join(fx.tmp, "msgs.json");
    const char *bad = "[{\"role\": \"user\", \"content\": \"a\xff b\"}]";
    cr_assert_eq(file_write_atomic(msgs, bad, strlen(bad)), 0);
    snprintf(args, sizeof args, "generate --model '%s' --messages '%s'", fx.model, msgs);
    expect_error(args, "msgs.json");
    er_free(data);
    er_free(longf);
    er_free(msgs);
}

// A NaN in the weights is refused by name at load: score printed "nan" (not JSON) and exited 0.
Test(cli, non_finite_weights_refused) {
    need_erinfer();
    Model m;
    cr_assert_eq(model_load(&m, fx.model, MODEL_LOAD_TRAINABLE), 0, "%s", er_last_error());
    ParamTensor *p = (ParamTensor *)model_find_param(&m, "model.layers.0.self_attn.v_proj.weight");
    p->data[3] = NAN;
    char *bad = path_join(fx.tmp, "nan_model");
    cr_assert_eq(model_save(&m, bad, 0), 0, "%s", er_last_error());
    model_free(&m);
    helper_copy_file("data/tiny_tokenizer/tokenizer.json", bad, "tokenizer.json");
    char *in = path_join(fx.tmp, "in.jsonl");
    cr_assert_eq(file_write_atomic(in, "{\"text\": \"Start with 2.\"}\n", 26), 0);
    char args[2048];
    snprintf(args, sizeof args, "score --model '%s' --input '%s'", bad, in);
    expect_error(args, "model.layers.0.self_attn.v_proj.weight");
    snprintf(args, sizeof args, "generate --model '%s' --prompt hi", bad);
    expect_error(args, "at index 3");
    er_free(bad);
    er_free(in);
}

// erinfer chat with a small --context (the committed tiny base): a conversation that outgrows it drops its
// oldest turns and says so; a message too long on its own is refused with a line, and the chat goes on
// (the next question is answered, /exit leaves with status 0). (Ctrl-C: tests/infer/test_chat_pty.c.)
Test(cli, chat_context_overflow_keeps_the_chat) {
    need_erinfer();
    char longline[2048] = "";
    for (int i = 0; i < 40; i++)
        strcat(longline, "Start with 7. Add 5. ");
    CmdResult r = helper_run(fx.tmp,
                             "(printf 'Start with 7. Add 5. What is the result?\\nStart with 2. Add 5. What is the "
                             "result?\\nStart with 3. Add 1. What is the result?\\n%s\\nStart with 4. Add 4. What is "
                             "the result?\\n/exit\\n' | '%s' chat --model models/tiny-base --context 64 --max-new 8 "
                             "--threads 1)", longline, fx.prog);
    cr_assert_eq(r.status, 0, "chat exited %d: %s", r.status, r.err);
    cr_assert(strstr(r.err, "[dropped the oldest turn"), "no turn dropped:\n%s", r.err);
    cr_assert(strstr(r.err, "[not sent: the message does not fit") && strstr(r.err, "the 64 positions"),
              "the long message was not refused with its sizes:\n%s", r.err);
    cr_assert_eq(helper_count_lines(r.out), 4, "four questions answered, the long one not sent:\n%s", r.out);
    helper_result_free(&r);
}

// erinfer chat as a user types it: a banner, /help, an unknown /command said so (not sent to the
// model), /reset, // to send a line starting with '/', and /exit.
Test(cli, chat_commands) {
    need_erinfer();
    CmdResult r = helper_run(fx.tmp,
                             "(printf 'hello\\n/help\\n/bogus\\n/reset\\n//slash\\n/exit\\nnever\\n' | '%s' chat "
                             "--model '%s' --max-new 4 --threads 1)", fx.prog, fx.model);
    cr_assert_eq(r.status, 0, "chat exited %d: %s", r.status, r.err);
    cr_assert(strstr(r.err, "erinfer chat: ") && strstr(r.err, "/help"), "no banner: %s", r.err);
    cr_assert_eq(helper_count_lines(r.err), 1, "stderr: %s", r.err);
    cr_assert(strstr(r.out, "commands: /help"), "no /help text:\n%s", r.out);
    cr_assert(strstr(r.out, "unknown command /bogus"), "unknown command not reported:\n%s", r.out);
    cr_assert(strstr(r.out, "(new conversation)"), "/reset not acknowledged:\n%s", r.out);
    helper_result_free(&r);
}

// --think on|off is the hybrid model's thinking switch (--route reasoning|direct): the pipeline object says which
// route ran and what it forced; bad or disagreeing values are one line; a plain model refuses thinking on.
Test(cli, think_flag_is_the_thinking_switch) {
    need_erinfer();
    char hybrid[600];
    snprintf(hybrid, sizeof hybrid, "%s/hybrid", fx.tmp);
    helper_make_hybrid_model(hybrid);
    static const char *const flags[2] = {"--think off", "--think on"};
    for (int k = 0; k < 2; k++) {
        CmdResult r = helper_run(fx.tmp, "'%s' generate --model '%s' --prompt '%s' --json --threads 1 --max-new 4 %s",
                                 fx.prog, hybrid, PROMPT, flags[k]);
        cr_assert_eq(r.status, 0, "%s: %s", flags[k], r.err);
        cJSON *j = cJSON_Parse(r.out);
        cr_assert(j, "%s", r.out);
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "pipeline");
        cr_assert(p, "%s", r.out);
        cr_expect_str_eq(cJSON_GetObjectItemCaseSensitive(p, "route")->valuestring, k ? "reasoning" : "direct");
        cr_expect_str_eq(cJSON_GetObjectItemCaseSensitive(p, "response_prefix")->valuestring,
                         k ? "<think>\n" : "<think>\n\n</think>\n\n");
        cJSON_Delete(j);
        helper_result_free(&r);
    }
    CmdResult r = helper_run(fx.tmp, "'%s' generate --model '%s' --prompt hi --think maybe", fx.prog, hybrid);
    helper_expect_error(&r, "--think maybe", "--think must be on or off");
    r = helper_run(fx.tmp, "'%s' generate --model '%s' --prompt hi --think on --route direct", fx.prog, hybrid);
    helper_expect_error(&r, "--think on --route direct", "disagree");
    r = helper_run(fx.tmp, "'%s' generate --model '%s' --prompt hi --route fast", fx.prog, hybrid);
    helper_expect_error(&r, "--route fast", "--route must be");
    r = helper_run(fx.tmp, "'%s' generate --model '%s' --prompt hi --think on", fx.prog, fx.model);
    helper_expect_error(&r, "--think on, plain model", "hybrid-thinking");
}
