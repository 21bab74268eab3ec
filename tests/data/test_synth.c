// The "chains" benchmark: arithmetic recomputed from the problem text, ranges, determinism, the
// four completion styles (they grade correct, terse lists the running values, verbose >= 2.5x concise in
// characters and in tiny-tokenizer tokens), JSONL output read back by data/dataset, and the tiny tokenizer
// itself. The "memory" task: facts and questions that paraphrase them, names unique, the dir read back, and
// `ertrain synth memory`'s errors.
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "data/chat.h"
#include "data/dataset.h"
#include "data/grade.h"
#include "data/synth.h"
#include "data/tokenizer.h"
#include "tests/common/helpers.h"

#define TINY_TOKENIZER "data/tiny_tokenizer/tokenizer.json"

// Re-derives the chain from the problem text alone and checks every completion against it.
static void check_example(const ChainsConfig *c, const SynthExample *ex) {
    const char *p = ex->problem;
    int v, n;
    cr_assert_eq(sscanf(p, "Start with %d.%n", &v, &n), 1, "problem: %s", p);
    cr_assert(v >= 1 && v <= c->max_start, "start %d", v);
    p += n;
    char want_concise[1024] = "", want_terse[256] = "";
    size_t wl = 0, tl = 0;
    int steps = 0;
    for (;;) {
        char verb[16];
        int b, r, a = v;
        if (sscanf(p, " %15s %n", verb, &n) != 1 || strcmp(verb, "What") == 0)
            break;
        p += n;
        char sym = 0;
        if (strcmp(verb, "Add") == 0 || strcmp(verb, "Subtract") == 0) {
            sym = verb[0] == 'A' ? '+' : '-';
            cr_assert_eq(sscanf(p, "%d.%n", &b, &n), 1, "%s", ex->problem);
            r = sym == '+' ? a + b : a - b;
        } else if (strcmp(verb, "Multiply") == 0 || strcmp(verb, "Divide") == 0) {
            sym = verb[0] == 'M' ? '*' : '/';
            cr_assert_eq(sscanf(p, "by %d.%n", &b, &n), 1, "%s", ex->problem);
            if (sym == '/')
                cr_assert(b >= 2 && a % b == 0, "inexact division %d / %d in %s", a, b, ex->problem);
            r = sym == '*' ? a * b : a / b;
        } else {
            cr_assert_fail("unknown operation \"%s\" in %s", verb, ex->problem);
        }
        p += n;
        if (sym == '+' || sym == '-')
            cr_assert(b >= 1 && b <= c->max_operand, "operand %d", b);
        else
            cr_assert(b >= 2 && b <= c->max_factor, "factor %d", b);
        cr_assert(r >= 0 && r <= c->max_value, "intermediate %d out of 0..%d in %s", r, c->max_value, ex->problem);
        wl += (size_t)snprintf(want_concise + wl, sizeof want_concise - wl, "%d %c %d = %d\n", a, sym, b, r);
        tl += (size_t)snprintf(want_terse + tl, sizeof want_terse - tl, "%s%d", steps ? " " : "", r);
        v = r;
        steps++;
    }
    cr_assert_str_eq(p, " What is the result?");
    cr_assert_eq(steps, ex->steps);
    cr_assert(steps >= c->min_steps && steps <= c->max_steps);
    cr_assert_eq(v, ex->result);
    char ans[16];
    snprintf(ans, sizeof ans, "%d", v);
    cr_assert_str_eq(ex->answer, ans);
    snprintf(want_concise + wl, sizeof want_concise - wl, "Answer: %d", v);
    cr_assert_str_eq(ex->concise, want_concise);
    snprintf(want_terse + tl, sizeof want_terse - tl, "\nAnswer: %d", v);
    cr_assert_str_eq(ex->terse, want_terse);
    char direct[32];
    snprintf(direct, sizeof direct, "Answer: %d", v);
    cr_assert_str_eq(ex->direct, direct);

    // Verbose holds every concise line as a line of its own, and ends with the same answer line.
    char line[64];
    const char *q = want_concise;
    for (int i = 0; i < steps; i++) {
        const char *e = strchr(q, '\n');
        snprintf(line, sizeof line, "\n%.*s\n", (int)(e - q), q);
        cr_assert_not_null(strstr(ex->verbose, line), "verbose lacks \"%.*s\":\n%s", (int)(e - q), q, ex->verbose);
        q = e + 1;
    }
    size_t vl = strlen(ex->verbose), dl = strlen(direct);
    cr_assert(vl > dl && strcmp(ex->verbose + vl - dl, direct) == 0 && ex->verbose[vl - dl - 1] == '\n');

    // All four grade correct; a wrong gold does not; and nothing before the last line of the
    // verbose trace looks like a final answer to the grader.
    char wrong[16];
    snprintf(wrong, sizeof wrong, "%d", v + 1);
    for (int s = 0; s < SYNTH_NSTYLES; s++) {
        const char *t = synth_completion(ex, (SynthStyle)s);
        cr_assert_eq(grade_response(t, -1, 0, ex->answer, NULL), 1, "style %d does not grade correct:\n%s", s, t);
        cr_assert_eq(grade_response(t, -1, 0, wrong, NULL), 0);
    }
    char *body = er_strdup(ex->verbose), *got;
    body[vl - dl] = 0;
    cr_assert_eq(grade_extract(body, &got), ER_OK);
    cr_assert_null(got, "verbose trace has an early final answer \"%s\":\n%s", got, ex->verbose);
    er_free(body);
}

Test(synth, chains_arithmetic_and_completions) {
    ChainsConfig c;
    chains_config_default(&c);
    int hist[CHAINS_MAX_STEPS + 1] = {0};
    double chars[SYNTH_NSTYLES] = {0};
    for (int i = 0; i < 3000; i++) {
        SynthExample ex;
        cr_assert_eq(chains_generate(&c, 42, (uint64_t)i, &ex), ER_OK, "%s", er_last_error());
        check_example(&c, &ex);
        hist[ex.steps]++;
        for (int s = 0; s < SYNTH_NSTYLES; s++)
            chars[s] += (double)strlen(synth_completion(&ex, (SynthStyle)s));
        synth_example_free(&ex);
    }
    for (int k = 1; k <= CHAINS_MAX_STEPS; k++)
        cr_assert_gt(hist[k], 250, "k = %d drawn %d times of 3000", k, hist[k]);
    cr_assert_geq(chars[SYNTH_VERBOSE], 2.5 * chars[SYNTH_CONCISE], "verbose/concise = %.2f in characters",
                  chars[SYNTH_VERBOSE] / chars[SYNTH_CONCISE]);
    cr_assert_lt(chars[SYNTH_DIRECT], chars[SYNTH_TERSE]);
    cr_assert_lt(chars[SYNTH_TERSE], chars[SYNTH_CONCISE]);

    // Other ranges are honoured too.
    ChainsConfig d = {4, 4, 9, 9, 3, 50};
    for (int i = 0; i < 500; i++) {
        SynthExample ex;
        cr_assert_eq(chains_generate(&d, 7, (uint64_t)i, &ex), ER_OK, "%s", er_last_error());
        check_example(&d, &ex);
        synth_example_free(&ex);
    }
}

Test(synth, deterministic_per_seed_and_index) {
    ChainsConfig c;
    chains_config_default(&c);
    SynthExample a, b, o;
    int differ = 0;
    for (int i = 0; i < 50; i++) {
        cr_assert_eq(chains_generate(&c, 3, (uint64_t)i, &a), ER_OK);
        cr_assert_eq(chains_generate(&c, 3, (uint64_t)i, &b), ER_OK);
        cr_assert_eq(chains_generate(&c, 4, (uint64_t)i, &o), ER_OK);
        cr_assert_str_eq(a.problem, b.problem);
        cr_assert_str_eq(a.verbose, b.verbose);
        differ += strcmp(a.problem, o.problem) != 0;
        synth_example_free(&a);
        synth_example_free(&b);
        synth_example_free(&o);
    }
    cr_assert_gt(differ, 40, "another seed must give other problems");

    // Example i does not depend on how many are written.
    char p1[64], p2[64];
    snprintf(p1, sizeof p1, "/tmp/er_test_synth_a_%d.jsonl", (int)getpid());
    snprintf(p2, sizeof p2, "/tmp/er_test_synth_b_%d.jsonl", (int)getpid());
    SynthStats st;
    cr_assert_eq(chains_write_jsonl(&c, 20, 9, p1, NULL, &st), ER_OK, "%s", er_last_error());
    cr_assert_eq(st.n, 20);
    cr_assert_eq(st.mean_tokens[SYNTH_VERBOSE], 0.0);
    cr_assert_eq(chains_write_jsonl(&c, 40, 9, p2, NULL, NULL), ER_OK);
    char *t1, *t2;
    size_t n1, n2;
    cr_assert_eq(file_read_all(p1, 1 << 24, &t1, &n1), ER_OK);
    cr_assert_eq(file_read_all(p2, 1 << 24, &t2, &n2), ER_OK);
    cr_assert(n2 > n1 && memcmp(t1, t2, n1) == 0, "the first 20 records must be identical");
    er_free(t1);
    er_free(t2);
    unlink(p1);
    unlink(p2);
}

Test(synth, jsonl_reads_back_through_dataset) {
    ChainsConfig c;
    chains_config_default(&c);
    char path[64];
    snprintf(path, sizeof path, "/tmp/er_test_synth_%d.jsonl", (int)getpid());
    SynthStats st;
    cr_assert_eq(chains_write_jsonl(&c, 300, 1, path, NULL, &st), ER_OK, "%s", er_last_error());
    cr_assert_geq(st.mean_chars[SYNTH_VERBOSE], 2.5 * st.mean_chars[SYNTH_CONCISE]);
    cr_assert(st.mean_steps > 3.5 && st.mean_steps < 5.5, "mean steps %.2f", st.mean_steps);
    for (int s = 0; s < SYNTH_NSTYLES; s++) {
        DatasetOptions opt = {synth_style_name((SynthStyle)s)};
        Dataset d;
        cr_assert_eq(dataset_load(path, &opt, 0, &d), ER_OK, "%s", er_last_error());
        cr_assert_eq(d.n, 300);
        for (int i = 0; i < d.n; i++) {
            SynthExample ex;
            cr_assert_eq(chains_generate(&c, 1, (uint64_t)i, &ex), ER_OK);
            cr_assert_str_eq(d.ex[i].prompt, ex.problem);
            cr_assert_str_eq(d.ex[i].answer, ex.answer);
            cr_assert_str_eq(d.ex[i].response, synth_completion(&ex, (SynthStyle)s));
            cr_assert_eq(d.ex[i].needs_reasoning, ex.steps > 1);
            cr_assert_eq(grade_response(d.ex[i].response, -1, 0, d.ex[i].answer, NULL), 1);
            synth_example_free(&ex);
        }
        dataset_free(&d);
    }
    unlink(path);
}

Test(synth, bad_configs_refused) {
    ChainsConfig c;
    SynthExample ex;
    chains_config_default(&c);
    c.max_steps = 9;
    cr_assert_eq(chains_generate(&c, 1, 0, &ex), ER_ERANGE);
    cr_assert_not_null(strstr(er_last_error(), "steps"), "%s", er_last_error());
    chains_config_default(&c);
    c.min_steps = 5, c.max_steps = 4;
    cr_assert_eq(chains_config_check(&c), ER_ERANGE);
    chains_config_default(&c);
    c.max_factor = 1;
    cr_assert_eq(chains_config_check(&c), ER_ERANGE);
    chains_config_default(&c);
    c.max_start = 200;
    cr_assert_eq(chains_config_check(&c), ER_ERANGE);
    chains_config_default(&c);
    cr_assert_eq(chains_write_jsonl(&c, 0, 1, "/tmp/never_written.jsonl", NULL, NULL), ER_ERANGE);
    cr_assert_lt(chains_write_jsonl(&c, 5, 1, "/nonexistent/dir/x.jsonl", NULL, NULL), 0);
    cr_assert_not_null(strstr(er_last_error(), "/nonexistent/dir/x.jsonl"), "%s", er_last_error());
}

static Tokenizer *load_tiny(void) {
    if (!path_exists(TINY_TOKENIZER))
        cr_skip_test("!!! SKIPPED: %s not found: run the tests from the repository root !!!", TINY_TOKENIZER);
    Tokenizer *tok;
    cr_assert_eq(tok_load(&tok, TINY_TOKENIZER), ER_OK, "%s", er_last_error());
    return tok;
}

static int count_tokens(const Tokenizer *tok, const char *text) {
    int *ids, n;
    cr_assert_eq(tok_encode(tok, text, strlen(text), &ids, &n), ER_OK, "%s", er_last_error());
    er_free(ids);
    return n;
}

Test(synth, tiny_tokenizer_round_trips_and_splits_digits) {
    Tokenizer *tok = load_tiny();
    cr_assert_eq(tok_vocab_size(tok), 512);
    cr_assert_eq(tok_token_id(tok, "<|endoftext|>"), 507);
    cr_assert_eq(tok_eos_id(tok), tok_token_id(tok, "<|im_end|>"));
    cr_assert_eq(tok_pad_id(tok), 507);
    cr_assert_geq(tok_token_id(tok, "<think>"), 0);
    cr_assert_geq(tok_token_id(tok, "</think>"), 0);

    ChainsConfig c;
    chains_config_default(&c);
    for (int i = 0; i < 200; i++) {
        SynthExample ex;
        cr_assert_eq(chains_generate(&c, 77, (uint64_t)i, &ex), ER_OK);
        ChatMessage m[] = {{"user", ex.problem}, {"assistant", ex.verbose}};
        char *chat;
        cr_assert_eq(chat_render(CHAT_CHATML, m, 2, 0, &chat, NULL), ER_OK);
        const char *texts[] = {ex.problem, ex.terse, ex.concise, ex.verbose, chat};
        for (int t = 0; t < 5; t++) {
            int *ids, n;
            cr_assert_eq(tok_encode(tok, texts[t], strlen(texts[t]), &ids, &n), ER_OK, "%s", er_last_error());
            char *back;
            size_t blen;
            cr_assert_eq(tok_decode(tok, ids, n, &back, &blen), ER_OK, "%s", er_last_error());
            cr_assert_str_eq(back, texts[t], "round trip");
            // Every digit is a token of its own.
            for (int k = 0; k < n; k++) {
                size_t len;
                const char *b = tok_token_bytes(tok, ids[k], &len);
                int digits = 0;
                for (size_t j = 0; j < len; j++)
                    digits += isdigit((unsigned char)b[j]) != 0;
                cr_assert(digits == 0 || (digits == 1 && len == 1), "token %d \"%.*s\" mixes a digit with other bytes",
                          ids[k], (int)len, b);
            }
            if (t == 4) {
                cr_assert_eq(ids[0], tok_token_id(tok, "<|im_start|>"));
                cr_assert_eq(ids[n - 2], tok_token_id(tok, "<|im_end|>"));
            }
            er_free(ids);
            er_free(back);
        }
        er_free(chat);
        synth_example_free(&ex);
    }
    tok_free(tok);
}

// Runs scripts/budget_records.py IN OUT ARGS and returns its records as a cJSON array of exactly n (each line
// parses, none missing, none extra).
static cJSON *budget_records(const char *in, const char *out, const char *args, int n) {
    char cmd[512], *text;
    size_t len;
    snprintf(cmd, sizeof cmd, "python3 scripts/budget_records.py %s %s %s > /dev/null", in, out, args);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    cr_assert_eq(file_read_all(out, 1 << 24, &text, &len), ER_OK, "%s", er_last_error());
    cJSON *records = cJSON_CreateArray();
    char *line = text;
    for (int i = 0; i < n; i++) {
        char *end = strchr(line, '\n');
        cr_assert_not_null(end, "record %d missing", i + 1);
        *end = 0;
        cJSON *r = cJSON_Parse(line);
        cr_assert_not_null(r, "record %d: %s", i + 1, line);
        cJSON_AddItemToArray(records, r);
        line = end + 1;
    }
    cr_assert_eq(*line, 0, "more records than problems");
    er_free(text);
    unlink(out);
    return records;
}

// Runs it expecting a refusal: a non-zero exit, no output (nor its .tmp), and one line on stderr, returned.
static char *budget_records_refused(const char *in, const char *out, const char *args) {
    char cmd[512], *text;
    size_t len;
    snprintf(cmd, sizeof cmd, "python3 scripts/budget_records.py %s %s %s 2> %s.err", in, out, args, out);
    cr_assert_neq(system(cmd), 0, "%s", cmd);
    snprintf(cmd, sizeof cmd, "%s.tmp", out);
    cr_assert(access(out, F_OK) != 0 && access(cmd, F_OK) != 0, "output written despite the error");
    snprintf(cmd, sizeof cmd, "%s.err", out);
    cr_assert_eq(file_read_all(cmd, 4096, &text, &len), ER_OK);
    cr_assert(strchr(text, '\n') == text + len - 1, "%s", text);
    unlink(cmd);
    return text;
}

// The assistant's reply of an SFT record {"messages": [system, user, assistant], ...}.
static const char *record_reply(const cJSON *r) {
    const cJSON *msgs = cJSON_GetObjectItem(r, "messages");
    cr_assert_eq(cJSON_GetArraySize(msgs), 3);
    return cJSON_GetObjectItem(cJSON_GetArrayItem(msgs, 2), "content")->valuestring;
}

// A chain completion as budget_records writes it: the thinking closed before the last answer line
// ("...\nAnswer: 5" -> "...\n</think>\n\nAnswer: 5"; a direct answer closes an empty think block).
static int reply_is(const char *reply, const char *completion) {
    const char *ans = strstr(completion, "Answer: "), *next;
    while (ans && (next = strstr(ans + 1, "Answer: ")))
        ans = next;
    if (!ans)
        return 0;
    size_t head = (size_t)(ans - completion);
    return strncmp(reply, completion, head) == 0 && strncmp(reply + head, "</think>\n\n", 10) == 0 &&
           strcmp(reply + head + 10, ans) == 0;
}

// scripts/budget_records.py (SFT records for make paper) with short forms tied to a budget: a key with @B is drawn
// only where the record's budget is B, near its weight; each response is its record's completion of that key,
// its thinking closed before the answer line.
Test(synth, budget_records_tie_short_forms_to_budgets) {
    ChainsConfig c;
    chains_config_default(&c);
    char in[64], out[64];
    snprintf(in, sizeof in, "/tmp/er_test_br_%d.jsonl", (int)getpid());
    snprintf(out, sizeof out, "/tmp/er_test_br_out_%d.jsonl", (int)getpid());
    cr_assert_eq(chains_write_jsonl(&c, 3000, 5, in, NULL, NULL), ER_OK, "%s", er_last_error());
    cJSON *records =
        budget_records(in, out, "--key terse@32:10,concise@64:10,direct:5,verbose:85 --budgets 32,64 --seed 3", 3000);
    long count[2][SYNTH_NSTYLES] = {{0}}; // [budget 32, 64][style]
    for (int i = 0; i < 3000; i++) {
        const cJSON *r = cJSON_GetArrayItem(records, i);
        int b = cJSON_GetObjectItem(r, "budget")->valueint;
        cr_assert(b == 32 || b == 64, "budget %d", b);
        const char *reply = record_reply(r);
        SynthExample ex;
        cr_assert_eq(chains_generate(&c, 5, (uint64_t)i, &ex), ER_OK);
        int k = 0;
        while (k < SYNTH_NSTYLES && !reply_is(reply, synth_completion(&ex, (SynthStyle)k)))
            k++;
        cr_assert_lt(k, SYNTH_NSTYLES, "record %d: the response is none of its completions: %s", i + 1, reply);
        count[b == 64][k]++;
        synth_example_free(&ex);
    }
    cJSON_Delete(records);
    cr_assert_eq(count[0][SYNTH_CONCISE], 0, "concise is tied to 64, drawn at 32");
    cr_assert_eq(count[1][SYNTH_TERSE], 0, "terse is tied to 32, drawn at 64");
    for (int b = 0; b < 2; b++) {
        long n = count[b][0] + count[b][1] + count[b][2] + count[b][3];
        double shorts = (double)count[b][b ? SYNTH_CONCISE : SYNTH_TERSE] / (double)n;
        double direct = (double)count[b][SYNTH_DIRECT] / (double)n;
        cr_assert(n > 1300 && shorts > 0.07 && shorts < 0.13 && direct > 0.03 && direct < 0.07,
                  "budget %d: %ld records, short form %.3f, direct %.3f", b ? 64 : 32, n, shorts, direct);
    }
    // An @budget outside --budgets is refused with one line, before any output.
    char *err = budget_records_refused(in, out, "--key terse@16:4,verbose --budgets 32,64");
    cr_assert(strstr(err, "--key terse@16:4,verbose") != NULL, "%s", err);
    er_free(err);
    unlink(in);
}

// budget_records' fit key: the longest short form that fits the record's budget, by the token lengths
// ertrain synth chains --tokenizer writes, each recounted here with the tokenizer itself; records without
// those lengths are refused with one line.
Test(synth, budget_records_fit_takes_the_longest_short_form_within_budget) {
    Tokenizer *tok = load_tiny();
    ChainsConfig c;
    chains_config_default(&c);
    char in[64], out[64];
    snprintf(in, sizeof in, "/tmp/er_test_fit_%d.jsonl", (int)getpid());
    snprintf(out, sizeof out, "/tmp/er_test_fit_out_%d.jsonl", (int)getpid());
    cr_assert_eq(chains_write_jsonl(&c, 400, 6, in, tok, NULL), ER_OK, "%s", er_last_error());
    cJSON *records = budget_records(in, out, "--key fit --budgets 8,16,32", 400);
    long count[SYNTH_NSTYLES] = {0};
    for (int i = 0; i < 400; i++) {
        const cJSON *r = cJSON_GetArrayItem(records, i);
        int b = cJSON_GetObjectItem(r, "budget")->valueint;
        SynthExample ex;
        cr_assert_eq(chains_generate(&c, 6, (uint64_t)i, &ex), ER_OK);
        SynthStyle want = count_tokens(tok, ex.concise) <= b ? SYNTH_CONCISE
                           : count_tokens(tok, ex.terse) <= b ? SYNTH_TERSE
                                                              : SYNTH_DIRECT;
        cr_assert(reply_is(record_reply(r), synth_completion(&ex, want)), "record %d, budget %d: %s", i + 1, b,
                  record_reply(r));
        cr_assert_null(cJSON_GetObjectItem(r, "tokens"), "the lengths travel into the SFT record");
        count[want]++;
        synth_example_free(&ex);
    }
    cJSON_Delete(records);
    cr_assert(count[SYNTH_CONCISE] > 20 && count[SYNTH_TERSE] > 20 && count[SYNTH_DIRECT] > 20,
              "direct %ld terse %ld concise %ld: every branch taken", count[SYNTH_DIRECT], count[SYNTH_TERSE],
              count[SYNTH_CONCISE]);
    // Records written without a tokenizer have no lengths: one line naming the file and record, no output.
    cr_assert_eq(chains_write_jsonl(&c, 5, 6, in, NULL, NULL), ER_OK, "%s", er_last_error());
    char *err = budget_records_refused(in, out, "--key fit --budgets 32");
    cr_assert(strstr(err, in) && strstr(err, "--tokenizer"), "%s", err);
    er_free(err);
    unlink(in);
    tok_free(tok);
}

Test(synth, verbose_longer_in_tokens) {
    Tokenizer *tok = load_tiny();
    ChainsConfig c;
    chains_config_default(&c);
    char path[64];
    snprintf(path, sizeof path, "/tmp/er_test_synth_tok_%d.jsonl", (int)getpid());
    SynthStats st;
    cr_assert_eq(chains_write_jsonl(&c, 1000, 2024, path, tok, &st), ER_OK, "%s", er_last_error());
    unlink(path);
    double r = st.mean_tokens[SYNTH_VERBOSE] / st.mean_tokens[SYNTH_CONCISE];
    cr_log_info("chains tokens: direct %.1f concise %.1f verbose %.1f (x%.2f)", st.mean_tokens[SYNTH_DIRECT],
                st.mean_tokens[SYNTH_CONCISE], st.mean_tokens[SYNTH_VERBOSE], r);
    cr_assert_geq(r, 2.5, "verbose/concise = %.2f in tokens", r);
    // The BPE learned the corpus: words merge, so the text is much shorter in tokens than bytes.
    cr_assert_lt(st.mean_tokens[SYNTH_VERBOSE] * 1.6, st.mean_chars[SYNTH_VERBOSE]);
    // Recount one example by hand against the stats' tokenizer path.
    SynthExample ex;
    cr_assert_eq(chains_generate(&c, 2024, 0, &ex), ER_OK);
    cr_assert_gt(count_tokens(tok, ex.verbose), count_tokens(tok, ex.concise));
    synth_example_free(&ex);
    tok_free(tok);
}

// Re-derives a guess example from its problem text: every try line's arithmetic and verdict, the stop rule (at
// the answer or after max_tries), consecutive candidates in 1..max_x (wrapping), none repeated, the closest candidate answered when none held,
// and the four completions agreeing. Returns the first candidate tried.
static int check_guess(const GuessConfig *c, const SynthExample *ex) {
    int max_x, a, b, target, n;
    cr_assert_eq(sscanf(ex->problem, "Find x from 1 to %d such that x * %d + %d = %d.%n", &max_x, &a, &b, &target, &n),
                 4, "problem: %s", ex->problem);
    cr_assert_eq(ex->problem[n], 0, "%s", ex->problem);
    cr_assert_eq(max_x, c->max_x);
    cr_assert(a >= c->min_factor && a <= c->max_factor && b >= 1 && b <= c->max_offset, "%s", ex->problem);
    int x = (target - b) / a;
    cr_assert(x >= 1 && x <= max_x && x * a + b == target, "%s", ex->problem);
    cr_assert_eq(ex->result, x);
    char want[4096] = "", terse[512] = "", num[16];
    size_t wl = 0, tl = 0;
    const char *p = ex->concise;
    int seen[1001] = {0}, tries = 0, first = 0, closest = 0, found = 0, prev = 0;
    for (;;) {
        int g, g2, a2, b2, v, v2, tgt, d, m = 0;
        char verdict[4];
        if (sscanf(p, "try %d: %d * %d + %d = %d, %d - %d = %d, %3[a-z]\n%n", &g, &g2, &a2, &b2, &v, &v2, &tgt, &d,
                   verdict, &m) != 9 ||
            !m)
            break;
        cr_assert(g == g2 && a2 == a && b2 == b && v == g * a + b && v2 == v && tgt == target && d == v - target,
                  "wrong check line in\n%s", ex->concise);
        if (tries)
            cr_assert_eq(g, prev % max_x + 1, "not the candidate after %d:\n%s", prev, ex->concise);
        prev = g;
        cr_assert_str_eq(verdict, g == x ? "yes" : "no", "%s", ex->concise);
        cr_assert(g >= 1 && g <= max_x && !seen[g], "candidate %d repeated or out of range:\n%s", g, ex->concise);
        seen[g] = 1;
        if (!tries++)
            first = g;
        if (!closest || abs(g - x) < abs(closest - x))
            closest = g;
        wl += (size_t)snprintf(want + wl, sizeof want - wl, "try %d: %d * %d + %d = %d, %d - %d = %d, %s\n", g, g, a,
                               b, v, v, target, v - target, verdict);
        tl += (size_t)snprintf(terse + tl, sizeof terse - tl, "%d %s", g, g == x ? "yes" : "no ");
        p += m;
        if ((found = g == x))
            break;
    }
    cr_assert(tries >= 1 && tries == ex->steps && (found || tries == c->max_tries) && tries <= c->max_tries,
              "%d tries, found %d:\n%s", tries, found, ex->concise);
    int said = found ? x : closest;
    if (!found) {
        wl += (size_t)snprintf(want + wl, sizeof want - wl, "closest: %d\n", said);
        tl += (size_t)snprintf(terse + tl, sizeof terse - tl, "closest %d", said);
    }
    snprintf(want + wl, sizeof want - wl, "Answer: %d", said);
    snprintf(terse + tl, sizeof terse - tl, "\nAnswer: %d", said);
    cr_assert_str_eq(ex->concise, want);
    cr_assert_str_eq(ex->terse, terse);
    snprintf(num, sizeof num, "%d", x);
    cr_assert_str_eq(ex->answer, num);
    char direct[32];
    snprintf(direct, sizeof direct, "Answer: %d", x);
    cr_assert_str_eq(ex->direct, direct);
    // The verbose trace holds every try line and answers as the concise one; the traces grade right exactly when
    // a check held.
    for (const char *q = want; strncmp(q, "try", 3) == 0;) {
        const char *e = strchr(q, '\n');
        char line[96];
        snprintf(line, sizeof line, "\n%.*s\n", (int)(e - q), q);
        cr_assert_not_null(strstr(ex->verbose, line), "verbose lacks \"%.*s\":\n%s", (int)(e - q), q, ex->verbose);
        q = e + 1;
    }
    snprintf(direct, sizeof direct, "\nAnswer: %d", said);
    size_t vl = strlen(ex->verbose), dl = strlen(direct);
    cr_assert(vl > dl && strcmp(ex->verbose + vl - dl, direct) == 0, "%s", ex->verbose);
    cr_assert_eq(grade_response(ex->direct, -1, 0, ex->answer, NULL), 1);
    for (int s = SYNTH_TERSE; s < SYNTH_NSTYLES; s++)
        cr_assert_eq(grade_response(synth_completion(ex, (SynthStyle)s), -1, 0, ex->answer, NULL), found,
                     "style %d, found %d:\n%s", s, found, synth_completion(ex, (SynthStyle)s));
    return first;
}

// The family sampling pays on: the start of the candidates says nothing about the answer, so a trace finds it
// about max_tries / max_x of the time, and the first candidate is the answer about 1 / max_x of the time.
Test(synth, guess_traces_check_every_candidate) {
    GuessConfig c;
    guess_config_default(&c);
    int n = 4000, found = 0, first_right = 0;
    double chars[SYNTH_NSTYLES] = {0};
    for (int i = 0; i < n; i++) {
        SynthExample ex;
        cr_assert_eq(guess_generate(&c, 5, (uint64_t)i, &ex), ER_OK, "%s", er_last_error());
        first_right += check_guess(&c, &ex) == ex.result;
        found += grade_response(ex.concise, -1, 0, ex.answer, NULL);
        for (int s = 0; s < SYNTH_NSTYLES; s++)
            chars[s] += (double)strlen(synth_completion(&ex, (SynthStyle)s));
        synth_example_free(&ex);
    }
    double p_found = (double)c.max_tries / c.max_x, p_first = 1.0 / c.max_x;
    cr_assert(fabs((double)found / n - p_found) < 0.03, "found %.3f, expected %.3f", (double)found / n, p_found);
    cr_assert(fabs((double)first_right / n - p_first) < 0.02, "first try right %.3f, expected %.3f",
              (double)first_right / n, p_first);
    cr_assert_geq(chars[SYNTH_VERBOSE], 2.0 * chars[SYNTH_CONCISE]);
    cr_assert_lt(chars[SYNTH_TERSE], chars[SYNTH_CONCISE]);

    GuessConfig d = {30, 1, 2, 3, 30}; // every candidate may be tried: the trace always finds it
    for (int i = 0; i < 300; i++) {
        SynthExample ex;
        cr_assert_eq(guess_generate(&d, 8, (uint64_t)i, &ex), ER_OK, "%s", er_last_error());
        check_guess(&d, &ex);
        cr_assert_eq(grade_response(ex.verbose, -1, 0, ex.answer, NULL), 1);
        synth_example_free(&ex);
    }
    d = (GuessConfig){12, 2, 5, 9, 13};
    cr_assert_eq(guess_config_check(&d), ER_ERANGE);
    cr_assert_not_null(strstr(er_last_error(), "tries"), "%s", er_last_error());
    d = (GuessConfig){12, 4, 3, 9, 4};
    cr_assert_eq(guess_generate(&d, 1, 0, &(SynthExample){0}), ER_ERANGE);
}

Test(synth, guess_jsonl_reads_back_as_reasoning_records) {
    GuessConfig c;
    guess_config_default(&c);
    char path[64];
    snprintf(path, sizeof path, "/tmp/er_test_guess_%d.jsonl", (int)getpid());
    SynthStats st;
    cr_assert_eq(guess_write_jsonl(&c, 100, 3, path, NULL, &st), ER_OK, "%s", er_last_error());
    cr_assert(st.n == 100 && st.mean_steps > 1 && st.mean_steps <= c.max_tries, "mean tries %.2f", st.mean_steps);
    DatasetOptions opt = {"verbose"};
    Dataset d;
    cr_assert_eq(dataset_load(path, &opt, 0, &d), ER_OK, "%s", er_last_error());
    cr_assert_eq(d.n, 100);
    for (int i = 0; i < d.n; i++) {
        SynthExample ex;
        cr_assert_eq(guess_generate(&c, 3, (uint64_t)i, &ex), ER_OK);
        cr_assert_str_eq(d.ex[i].prompt, ex.problem);
        cr_assert_str_eq(d.ex[i].answer, ex.answer);
        cr_assert_str_eq(d.ex[i].response, ex.verbose);
        cr_assert(d.ex[i].needs_reasoning, "every guess record needs reasoning");
        synth_example_free(&ex);
    }
    dataset_free(&d);
    unlink(path);
}

// ---- the memory task ----

// 1 when word occurs in text as a whole word (not inside a longer run of letters and digits), case-insensitively.
static int has_word(const char *text, const char *word) {
    size_t n = strlen(word);
    for (const char *p = text; *p; p++)
        if (strncasecmp(p, word, n) == 0 && (p == text || !isalnum((unsigned char)p[-1])) && !isalnum((unsigned char)p[n]))
            return 1;
    return 0;
}

// The fact's words of four letters or more that are not the person's name, each in the question: none may be.
static void check_paraphrase(const MemoryFact *f) {
    for (const char *p = f->text; *p;) {
        size_t n = 0;
        while (isalnum((unsigned char)p[n]))
            n++;
        if (n >= 4) {
            char w[64];
            snprintf(w, sizeof w, "%.*s", (int)n, p);
            cr_assert(has_word(f->entity, w) || !has_word(f->question, w),
                      "the question \"%s\" shares \"%s\" with its fact \"%s\"", f->question, w, f->text);
        }
        p += n ? n : 1;
    }
}

static void check_fact(const MemoryFact *f) {
    cr_assert(f->entity && f->text && f->question && f->answer && f->attribute);
    cr_assert(has_word(f->text, f->answer), "answer \"%s\" not in its fact \"%s\"", f->answer, f->text);
    cr_assert(!has_word(f->question, f->answer), "the question \"%s\" gives away \"%s\"", f->question, f->answer);
    cr_assert(strstr(f->text, f->entity) && strstr(f->question, f->entity), "%s / %s", f->text, f->question);
    cr_assert(!strstr(f->question, f->text), "the question holds its fact verbatim: %s", f->question);
    check_paraphrase(f);
    // One word or number, which the grader reads back from an "Answer:" line.
    for (const char *p = f->answer; *p; p++)
        cr_assert(isalnum((unsigned char)*p), "answer \"%s\" is not one word", f->answer);
    char resp[128];
    snprintf(resp, sizeof resp, "Answer: %s", f->answer);
    cr_assert_eq(grade_response(resp, -1, 0, f->answer, NULL), 1, "%s", f->answer);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// The phrasing t was drawn from: t with the person's name as {n} and the answer as {v}. Added to shapes (n of them)
// when new.
static void add_shape(char shapes[][128], int *n, int cap, const char *t, const MemoryFact *f) {
    char shape[128] = "";
    for (const char *p = t; *p;) {
        size_t ne = strlen(f->entity), na = strlen(f->answer);
        const char *put = strncmp(p, f->entity, ne) == 0 ? "{n}" : strncmp(p, f->answer, na) == 0 ? "{v}" : NULL;
        snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%.*s", put ? 3 : 1, put ? put : p);
        p += put ? (put[1] == 'n' ? ne : na) : 1;
    }
    for (int k = 0; k < *n; k++)
        if (!strcmp(shapes[k], shape))
            return;
    cr_assert_lt(*n, cap, "more than %d phrasings: %s", cap, shape);
    snprintf(shapes[(*n)++], 128, "%s", shape);
}

Test(synth, memory_questions_paraphrase_their_facts) {
    MemoryTaskConfig c;
    memory_task_config_default(&c);
    int fpe = c.facts_per_entity, n = 200 * fpe, nq = 0, nf = 0;
    static char qshapes[64][128], fshapes[64][128];
    for (int i = 0; i < n; i += fpe) {
        const char *attrs[MEMORY_TASK_NATTRS];
        char entity[64] = "";
        for (int j = 0; j < fpe; j++) {
            MemoryFact f;
            cr_assert_eq(memory_task_generate(&c, 5, (uint64_t)(i + j), &f), ER_OK, "%s", er_last_error());
            check_fact(&f);
            if (j == 0)
                snprintf(entity, sizeof entity, "%s", f.entity);
            cr_assert_str_eq(f.entity, entity, "fact %d is about another person than fact %d", i + j, i);
            attrs[j] = f.attribute; // static strings
            for (int k = 0; k < j; k++)
                cr_assert_neq(strcmp(attrs[k], attrs[j]), 0, "person %d has two %s facts", i / fpe, attrs[j]);
            add_shape(qshapes, &nq, 64, f.question, &f);
            add_shape(fshapes, &nf, 64, f.text, &f);
            memory_fact_free(&f);
        }
    }
    // Several phrasings per attribute, drawn by the RNG: every attribute's questions and facts in more than one.
    cr_assert_geq(nq, 3 * MEMORY_TASK_NATTRS, "only %d question phrasings in %d facts", nq, n);
    cr_assert_geq(nf, 2 * MEMORY_TASK_NATTRS, "only %d fact phrasings in %d facts", nf, n);
}

// Every person of a seed has a name of their own (two capitalised words), even over many people.
Test(synth, memory_names_unique) {
    MemoryTaskConfig c = {1};
    int n = 20000;
    char **names = er_calloc((size_t)n, sizeof *names);
    for (int i = 0; i < n; i++) {
        MemoryFact f;
        cr_assert_eq(memory_task_generate(&c, 11, (uint64_t)i, &f), ER_OK, "%s", er_last_error());
        char first[32], last[32], rest;
        cr_assert_eq(sscanf(f.entity, "%31s %31s %c", first, last, &rest), 2, "name \"%s\"", f.entity);
        cr_assert(isupper((unsigned char)first[0]) && isupper((unsigned char)last[0]), "name \"%s\"", f.entity);
        names[i] = f.entity;
        f.entity = NULL;
        memory_fact_free(&f);
    }
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    for (int i = 1; i < n; i++)
        cr_assert_neq(strcmp(names[i - 1], names[i]), 0, "two people named %s", names[i]);
    for (int i = 0; i < n; i++)
        er_free(names[i]);
    er_free(names);
}

Test(synth, memory_deterministic_per_seed_and_index) {
    MemoryTaskConfig c;
    memory_task_config_default(&c);
    int differ = 0;
    for (int i = 0; i < 60; i++) {
        MemoryFact a, b, o;
        cr_assert_eq(memory_task_generate(&c, 3, (uint64_t)i, &a), ER_OK);
        cr_assert_eq(memory_task_generate(&c, 3, (uint64_t)i, &b), ER_OK);
        cr_assert_eq(memory_task_generate(&c, 4, (uint64_t)i, &o), ER_OK);
        cr_assert_str_eq(a.text, b.text);
        cr_assert_str_eq(a.question, b.question);
        cr_assert_str_eq(a.answer, b.answer);
        differ += strcmp(a.text, o.text) != 0;
        memory_fact_free(&a), memory_fact_free(&b), memory_fact_free(&o);
    }
    cr_assert_gt(differ, 55, "another seed must give other facts");

    // Fact i does not depend on how many are written: the shorter dir's files begin the longer's.
    char *tmp = helper_tmpdir("er_test_memtask"), *d1 = path_join(tmp, "a"), *d2 = path_join(tmp, "b");
    cr_assert_eq(memory_task_write_dir(&c, 20, 9, d1), ER_OK, "%s", er_last_error());
    cr_assert_eq(memory_task_write_dir(&c, 45, 9, d2), ER_OK, "%s", er_last_error());
    const char *files[] = {"facts.jsonl", "questions.jsonl"};
    for (int k = 0; k < 2; k++) {
        char *p1 = path_join(d1, files[k]), *p2 = path_join(d2, files[k]), *t1, *t2;
        size_t n1, n2;
        cr_assert_eq(file_read_all(p1, 1 << 24, &t1, &n1), ER_OK, "%s", er_last_error());
        cr_assert_eq(file_read_all(p2, 1 << 24, &t2, &n2), ER_OK, "%s", er_last_error());
        cr_assert_eq(helper_count_lines(t1), 20);
        cr_assert_eq(helper_count_lines(t2), 45);
        cr_assert(n2 > n1 && memcmp(t1, t2, n1) == 0, "%s: the first 20 records must be identical", files[k]);
        er_free(t1), er_free(t2), er_free(p1), er_free(p2);
    }
    helper_rmdir(tmp);
    er_free(d1), er_free(d2), er_free(tmp);
}

// questions.jsonl is a dataset (problem, answer) and every question's fact is in facts.jsonl, in the store's
// import format, with the answer in its text.
Test(synth, memory_dir_reads_back) {
    MemoryTaskConfig c;
    memory_task_config_default(&c);
    int n = 60;
    char *tmp = helper_tmpdir("er_test_memtask"), *dir = path_join(tmp, "task");
    cr_assert_eq(memory_task_write_dir(&c, n, 2, dir), ER_OK, "%s", er_last_error());
    char *qpath = path_join(dir, "questions.jsonl"), *fpath = path_join(dir, "facts.jsonl");
    Dataset d;
    cr_assert_eq(dataset_load(qpath, NULL, 0, &d), ER_OK, "%s", er_last_error());
    cr_assert_eq(d.n, n);
    char *text;
    size_t len;
    cr_assert_eq(file_read_all(fpath, 1 << 24, &text, &len), ER_OK, "%s", er_last_error());
    cJSON *facts[60] = {0};
    char *line, *save = NULL;
    int lines = 0;
    for (; (line = strtok_r(lines ? NULL : text, "\n", &save)); lines++) {
        cr_assert_lt(lines, n);
        cJSON *o = cJSON_Parse(line), *m = cJSON_GetObjectItem(o, "metadata");
        cr_assert(cJSON_IsString(cJSON_GetObjectItem(o, "text")) && cJSON_IsObject(m), "%s", line);
        cr_assert(cJSON_IsString(cJSON_GetObjectItem(m, "entity")), "%s", line);
        cr_assert(cJSON_IsString(cJSON_GetObjectItem(m, "attribute")), "%s", line);
        cJSON *id = cJSON_GetObjectItem(m, "fact");
        cr_assert(cJSON_IsNumber(id) && id->valueint >= 0 && id->valueint < n && !facts[id->valueint], "%s", line);
        facts[id->valueint] = o;
    }
    cr_assert_eq(lines, n);
    char *qtext;
    cr_assert_eq(file_read_all(qpath, 1 << 24, &qtext, &len), ER_OK);
    save = NULL;
    for (int i = 0; (line = strtok_r(i ? NULL : qtext, "\n", &save)); i++) {
        cJSON *q = cJSON_Parse(line);
        cJSON *id = cJSON_GetObjectItem(q, "fact");
        cr_assert(cJSON_IsNumber(id) && id->valueint >= 0 && id->valueint < n && facts[id->valueint],
                  "question %d names no fact: %s", i, line);
        const cJSON *f = facts[id->valueint];
        MemoryFact want;
        cr_assert_eq(memory_task_generate(&c, 2, (uint64_t)id->valueint, &want), ER_OK);
        cr_assert_str_eq(cJSON_GetObjectItem(f, "text")->valuestring, want.text);
        cr_assert_str_eq(d.ex[i].prompt, want.question);
        cr_assert_str_eq(d.ex[i].answer, want.answer);
        cr_assert(has_word(cJSON_GetObjectItem(f, "text")->valuestring, d.ex[i].answer), "%s", line);
        cr_assert_str_eq(cJSON_GetObjectItem(q, "attribute")->valuestring,
                         cJSON_GetObjectItem(cJSON_GetObjectItem(f, "metadata"), "attribute")->valuestring);
        memory_fact_free(&want);
        cJSON_Delete(q);
    }
    for (int i = 0; i < n; i++)
        cJSON_Delete(facts[i]);
    dataset_free(&d);
    er_free(text), er_free(qtext), er_free(qpath), er_free(fpath);
    helper_rmdir(tmp);
    er_free(dir), er_free(tmp);
}

Test(synth, memory_bad_configs_and_flags_refused) {
    MemoryTaskConfig c = {0};
    MemoryFact f;
    cr_assert_eq(memory_task_generate(&c, 1, 0, &f), ER_ERANGE);
    cr_assert_not_null(strstr(er_last_error(), "facts per person"), "%s", er_last_error());
    c.facts_per_entity = MEMORY_TASK_NATTRS + 1;
    cr_assert_eq(memory_task_config_check(&c), ER_ERANGE);
    c.facts_per_entity = 1;
    cr_assert_eq(memory_task_generate(&c, 1, MEMORY_TASK_MAX_ENTITIES, &f), ER_ERANGE);
    cr_assert_eq(memory_task_write_dir(&c, 0, 1, "/tmp/never_written"), ER_ERANGE);
    cr_assert_eq(memory_task_write_dir(&c, MEMORY_TASK_MAX_ENTITIES + 1L, 1, "/tmp/never_written"), ER_ERANGE);
    cr_assert(!path_exists("/tmp/never_written"));

    char *ertrain = helper_program("ertrain");
    helper_need_program(ertrain, "ertrain", "the ertrain synth memory command tests are");
    char *tmp = helper_tmpdir("er_test_memtask"), *file = path_join(tmp, "file");
    cr_assert_eq(file_write_atomic(file, "x\n", 2), ER_OK);
    CmdResult r = helper_run(tmp, "'%s' synth memory --n 0 --out '%s/o'", ertrain, tmp);
    helper_expect_error(&r, "--n 0", "--n");
    r = helper_run(tmp, "'%s' synth memory --n -3 --out '%s/o'", ertrain, tmp);
    helper_expect_error(&r, "--n -3", "--n");
    r = helper_run(tmp, "'%s' synth memory --n 5 --out '%s'", ertrain, file);
    helper_expect_error(&r, "--out at a file", "not a directory");
    r = helper_run(tmp, "'%s' synth memory --n 5 --out '%s/sub'", ertrain, file);
    helper_expect_error(&r, "--out below a file", "file");
    r = helper_run(tmp, "'%s' synth memory --n 5 --out '%s/o' --facts-per-entity 11", ertrain, tmp);
    helper_expect_error(&r, "--facts-per-entity 11", "--facts-per-entity");
    r = helper_run(tmp, "'%s' synth memory --n 12 --out '%s/o/' --seed 4", ertrain, tmp);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "wrote 12 facts about 2 made-up people"), "%s", r.out);
    cr_assert(strstr(r.out, "/o/facts.jsonl") && !strstr(r.out, "//"), "%s", r.out);
    helper_result_free(&r);
    helper_rmdir(tmp);
    er_free(file), er_free(tmp), er_free(ertrain);
}
