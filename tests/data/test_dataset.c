// JSONL datasets: the four record shapes normalised into Example, file:line errors for bad lines,
// seeded shuffle / split, and length-bucketed batches.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "data/dataset.h"
#include "tests/common/helpers.h"

static char path[64];

static const char *write_jsonl(const char *text) {
    return helper_write_tmp(path, sizeof path, "er_test_dataset", ".jsonl", text);
}

Test(dataset, record_shapes_normalised) {
    const char *p = write_jsonl(
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"2+2?\"}, "
        "{\"role\": \"assistant\", \"content\": \"Answer: 4\"}], \"answer\": \"4\", \"budget\": 64}\n"
        "{\"prompt\": \"Say hi\", \"completion\": \"hi\", \"needs_reasoning\": false}\n"
        "\n"
        "{\"problem\": \"Compute $1+1$.\", \"solution\": \"Clearly $1+1=\\\\boxed{2}$.\", \"level\": 1}\n"
        "{\"problem\": \"P\", \"answer\": 12, \"needs_reasoning\": true}\n"
        "{\"question\": \"Natalia sold 48 clips...\", \"answer\": \"48+24 = <<48+24=72>>72\\n#### 72\"}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"only a prompt\"}]}\n");
    DatasetReader r;
    cr_assert_eq(dataset_open(&r, p, NULL), ER_OK);
    Example ex;

    cr_assert_eq(dataset_next(&r, &ex), 1, "%s", er_last_error());
    cr_assert_eq(ex.n_messages, 2);
    cr_assert_str_eq(ex.messages[0].role, "system");
    cr_assert_str_eq(ex.messages[1].content, "2+2?");
    cr_assert_str_eq(ex.prompt, "2+2?");
    cr_assert_str_eq(ex.response, "Answer: 4");
    cr_assert_str_eq(ex.answer, "4");
    cr_assert_eq(ex.budget, 64);
    cr_assert_eq(ex.needs_reasoning, -1);
    cr_assert_eq(ex.line, 1);
    example_free(&ex);

    cr_assert_eq(dataset_next(&r, &ex), 1, "%s", er_last_error());
    cr_assert_eq(ex.n_messages, 1);
    cr_assert_str_eq(ex.messages[0].role, "user");
    cr_assert_str_eq(ex.messages[0].content, "Say hi");
    cr_assert_str_eq(ex.response, "hi");
    cr_assert_null(ex.answer);
    cr_assert_eq(ex.budget, -1);
    cr_assert_eq(ex.needs_reasoning, 0);
    example_free(&ex);

    cr_assert_eq(dataset_next(&r, &ex), 1, "%s", er_last_error());
    cr_assert_str_eq(ex.prompt, "Compute $1+1$.");
    cr_assert_str_eq(ex.answer, "2", "MATH answer taken from the solution's \\boxed{}");
    cr_assert_eq(ex.line, 4, "blank line 3 skipped but counted");
    example_free(&ex);

    cr_assert_eq(dataset_next(&r, &ex), 1, "%s", er_last_error());
    cr_assert_str_eq(ex.answer, "12", "numeric answer kept as text");
    cr_assert_null(ex.response);
    cr_assert_eq(ex.needs_reasoning, 1);
    example_free(&ex);

    cr_assert_eq(dataset_next(&r, &ex), 1, "%s", er_last_error());
    cr_assert_str_eq(ex.answer, "72");
    cr_assert_str_eq(ex.response, "48+24 = <<48+24=72>>72\n#### 72");
    example_free(&ex);

    cr_assert_eq(dataset_next(&r, &ex), 1, "%s", er_last_error());
    cr_assert_eq(ex.n_messages, 1);
    cr_assert_null(ex.response, "a lone user message is a prompt, not a response");
    example_free(&ex);

    cr_assert_eq(dataset_next(&r, &ex), 0);
    dataset_close(&r);
    unlink(p);
}

// Raw text for pretraining: the text only, no conversation, and nothing eval or GRPO could grade
// (they refuse records without an answer); a response key does not apply to it.
Test(dataset, raw_text_records) {
    const char *p = write_jsonl("{\"text\": \"Start with 3.\\n3 + 4 = 7\", \"answer\": \"7\", \"direct\": \"Answer: 7\"}\n"
                                "{\"problem\": \"Start with 3. Add 4. What is the result?\", \"answer\": \"7\", "
                                "\"direct\": \"Answer: 7\"}\n");
    DatasetOptions opt = {"direct"};
    Dataset d;
    cr_assert_eq(dataset_load(p, &opt, 0, &d), ER_OK, "%s", er_last_error());
    cr_assert_eq(d.n, 2);
    cr_assert_str_eq(d.ex[0].text, "Start with 3.\n3 + 4 = 7");
    cr_assert_null(d.ex[0].prompt);
    cr_assert_null(d.ex[0].response, "the response key does not apply to raw text");
    cr_assert_null(d.ex[0].answer, "raw text is never graded");
    cr_assert_null(d.ex[0].messages);
    cr_assert_eq(d.ex[0].n_messages, 0);
    cr_assert_eq(d.ex[0].line, 1);
    cr_assert_null(d.ex[1].text, "other records carry no raw text");
    cr_assert_str_eq(d.ex[1].response, "Answer: 7");
    dataset_free(&d);
    unlink(p);
}

Test(dataset, response_key_selects_completion) {
    const char *p = write_jsonl("{\"problem\": \"Start with 3. Add 4. What is the result?\", \"answer\": \"7\", \"steps\": 1, "
                                "\"needs_reasoning\": false, \"direct\": \"Answer: 7\", \"concise\": \"3 + 4 = 7\\nAnswer: 7\"}\n");
    DatasetOptions opt = {"concise"};
    Dataset d;
    cr_assert_eq(dataset_load(p, &opt, 0, &d), ER_OK, "%s", er_last_error());
    cr_assert_eq(d.n, 1);
    cr_assert_str_eq(d.ex[0].response, "3 + 4 = 7\nAnswer: 7");
    cr_assert_str_eq(d.ex[0].answer, "7");
    dataset_free(&d);
    opt.response_key = "verbose";
    cr_assert_eq(dataset_load(p, &opt, 0, &d), ER_EFORMAT);
    cr_assert_not_null(strstr(er_last_error(), ":1: missing field \"verbose\""), "%s", er_last_error());
    unlink(p);
}

typedef struct {
    const char *line, *expect; // expect: substring of the error after "file:2: "
} BadLine;

Test(dataset, malformed_lines_report_file_and_line) {
    static const BadLine bad[] = {
        {"{\"prompt\": \"x\"", "not valid JSON"},
        {"[1, 2]", "must be a JSON object"},
        {"{\"txt\": \"hello\"}", "expected a \"messages\", \"prompt\", \"problem\", \"question\" or \"text\" field"},
        {"{\"text\": 5}", "field \"text\" must be a string"},
        {"{\"text\": \"\"}", "field \"text\" is empty"},
        {"{\"prompt\": 5}", "field \"prompt\" must be a string"},
        {"{\"prompt\": \"p\", \"completion\": [1]}", "field \"completion\" must be a string"},
        {"{\"messages\": \"hi\"}", "field \"messages\" must be a non-empty list"},
        {"{\"messages\": []}", "field \"messages\" must be a non-empty list"},
        {"{\"messages\": [5]}", "messages[0] must be an object"},
        {"{\"messages\": [{\"content\": \"x\"}]}", "messages[0].role is missing"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": 3}]}", "messages[0].content must be a string"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"robot\", \"content\": \"b\"}]}",
         "messages[1].role is \"robot\""},
        {"{\"messages\": [{\"role\": \"system\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}]}",
         "no user message"},
        {"{\"question\": \"q\"}", "missing field \"answer\""},
        {"{\"question\": \"q\", \"answer\": \"72\"}", "no \"#### <final answer>\" line"},
        {"{\"question\": \"q\", \"answer\": \"x\\n####  \"}", "empty \"####\" final answer"},
        {"{\"problem\": \"p\", \"answer\": {\"a\": 1}}", "field \"answer\" must be a string or a number"},
        {"{\"prompt\": \"p\", \"budget\": \"many\"}", "field \"budget\" must be a number"},
        {"{\"prompt\": \"p\", \"budget\": 1.5}", "field \"budget\" must be an integer"},
        {"{\"prompt\": \"p\", \"budget\": 0}", "field \"budget\" must be a positive number of tokens"},
        {"{\"prompt\": \"p\", \"budget\": -1}", "field \"budget\" must be a positive number of tokens"},
        {"{\"prompt\": \"p\", \"needs_reasoning\": 1}", "field \"needs_reasoning\" must be true or false"},
        // gold answers no response can equal (found by fuzzing): refused instead of graded wrong forever
        {"{\"prompt\": \"p\", \"answer\": \"\"}", "the gold answer \"\" is empty"},
        {"{\"question\": \"q\", \"answer\": \"x\\n#### $ $\"}", "is empty"},
        {"{\"problem\": \"p\", \"solution\": \"so \\\\boxed{}\"}", "is empty"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[512];
        snprintf(text, sizeof text, "{\"prompt\": \"fine\"}\n%s\n{\"prompt\": \"never reached\"}\n", bad[i].line);
        const char *p = write_jsonl(text);
        DatasetReader r;
        cr_assert_eq(dataset_open(&r, p, NULL), ER_OK);
        Example ex;
        cr_assert_eq(dataset_next(&r, &ex), 1);
        example_free(&ex);
        int rc = dataset_next(&r, &ex);
        cr_assert_lt(rc, 0, "line \"%s\" accepted", bad[i].line);
        char where[96];
        snprintf(where, sizeof where, "%s:2:", p);
        cr_assert_not_null(strstr(er_last_error(), where), "\"%s\": error \"%s\" does not name %s", bad[i].line,
                           er_last_error(), where);
        cr_assert_not_null(strstr(er_last_error(), bad[i].expect), "\"%s\": error \"%s\" lacks \"%s\"", bad[i].line,
                           er_last_error(), bad[i].expect);
        cr_assert_null(strchr(er_last_error(), '\n'), "error must be one line: %s", er_last_error());
        dataset_close(&r);
        Dataset d;
        cr_assert_lt(dataset_load(p, NULL, 0, &d), 0);
        cr_assert_eq(d.n, 0);
        cr_assert_null(d.ex);
        unlink(p);
    }
    Dataset d;
    cr_assert_eq(dataset_load("/nonexistent/train.jsonl", NULL, 0, &d), ER_EIO);
    cr_assert_not_null(strstr(er_last_error(), "/nonexistent/train.jsonl"), "%s", er_last_error());
}

static void make_prompts(int n) {
    size_t cap = (size_t)n * 48 + 1;
    char *text = er_alloc(cap);
    size_t k = 0;
    for (int i = 0; i < n; i++)
        k += (size_t)snprintf(text + k, cap - k, "{\"prompt\": \"p%d\", \"answer\": \"%d\"}\n", i, i);
    write_jsonl(text);
    er_free(text);
}

Test(dataset, shuffle_and_split_are_seeded) {
    make_prompts(50);
    Dataset a, b, ea, eb;
    cr_assert_eq(dataset_load(path, NULL, 0, &a), ER_OK, "%s", er_last_error());
    cr_assert_eq(dataset_load(path, NULL, 0, &b), ER_OK);
    Dataset lim;
    cr_assert_eq(dataset_load(path, NULL, 7, &lim), ER_OK);
    cr_assert_eq(lim.n, 7, "max_examples");
    dataset_free(&lim);
    unlink(path);
    ErRng r1, r2;
    rng_seed(&r1, 11);
    rng_seed(&r2, 11);
    cr_assert_eq(dataset_split(&a, 10, &r1, &ea), ER_OK);
    cr_assert_eq(dataset_split(&b, 10, &r2, &eb), ER_OK);
    cr_assert_eq(a.n, 40);
    cr_assert_eq(ea.n, 10);
    int seen[50] = {0}, moved = 0;
    for (int i = 0; i < 40; i++) {
        cr_assert_str_eq(a.ex[i].prompt, b.ex[i].prompt, "same seed, same order");
        seen[atoi(a.ex[i].answer)]++;
        moved += atoi(a.ex[i].answer) != i;
    }
    for (int i = 0; i < 10; i++) {
        cr_assert_str_eq(ea.ex[i].prompt, eb.ex[i].prompt);
        seen[atoi(ea.ex[i].answer)]++;
    }
    for (int i = 0; i < 50; i++)
        cr_assert_eq(seen[i], 1, "example %d appears %d times", i, seen[i]);
    cr_assert_gt(moved, 20, "the split must be shuffled");
    dataset_free(&eb);
    cr_assert_eq(dataset_split(&a, 41, &r1, &eb), ER_ERANGE);
    cr_assert_eq(eb.n, 0);
    dataset_free(&a);
    dataset_free(&b);
    dataset_free(&ea);
}

Test(dataset, length_bucketed_batches) {
    enum { N = 103, BS = 8 };
    int len[N];
    ErRng rng;
    rng_seed(&rng, 5);
    for (int i = 0; i < N; i++)
        len[i] = 1 + (int)rng_below(&rng, 500);
    Batches b, c;
    rng_seed(&rng, 9);
    cr_assert_eq(batches_by_length(len, N, BS, 4, &rng, &b), ER_OK);
    cr_assert_eq(b.n_batches, 13);
    cr_assert_eq(b.start[0], 0);
    cr_assert_eq(b.start[b.n_batches], N);
    int seen[N] = {0}, short_batches = 0;
    for (int k = 0; k < b.n_batches; k++) {
        int sz = b.start[k + 1] - b.start[k];
        cr_assert(sz == BS || sz == N % BS, "batch %d has %d examples", k, sz);
        short_batches += sz != BS;
        for (int i = b.start[k]; i < b.start[k + 1]; i++) {
            seen[b.index[i]]++;
            if (i > b.start[k])
                cr_assert_leq(len[b.index[i - 1]], len[b.index[i]], "batch %d not sorted by length", k);
        }
    }
    cr_assert_eq(short_batches, 1);
    for (int i = 0; i < N; i++)
        cr_assert_eq(seen[i], 1, "example %d in %d batches", i, seen[i]);

    // One bucket holding everything: batches tile the sorted order, so padding is minimal.
    rng_seed(&rng, 9);
    cr_assert_eq(batches_by_length(len, N, BS, 1000, &rng, &c), ER_OK);
    long spread_sorted = 0, spread_random = 0;
    for (int k = 0; k < c.n_batches; k++) {
        int lo = 1 << 30, hi = 0;
        for (int i = c.start[k]; i < c.start[k + 1]; i++) {
            lo = len[c.index[i]] < lo ? len[c.index[i]] : lo;
            hi = len[c.index[i]] > hi ? len[c.index[i]] : hi;
        }
        spread_sorted += hi - lo;
    }
    for (int k = 0; k * BS < N; k++) {
        int lo = 1 << 30, hi = 0;
        for (int i = k * BS; i < N && i < (k + 1) * BS; i++) {
            lo = len[i] < lo ? len[i] : lo;
            hi = len[i] > hi ? len[i] : hi;
        }
        spread_random += hi - lo;
    }
    cr_assert_lt(spread_sorted * 5, spread_random, "sorted spread %ld vs unsorted %ld", spread_sorted, spread_random);

    // Same seed -> same batches; another seed -> another order.
    Batches d;
    rng_seed(&rng, 9);
    cr_assert_eq(batches_by_length(len, N, BS, 4, &rng, &d), ER_OK);
    cr_assert_eq(memcmp(b.index, d.index, sizeof(int) * N), 0);
    batches_free(&d);
    rng_seed(&rng, 10);
    cr_assert_eq(batches_by_length(len, N, BS, 4, &rng, &d), ER_OK);
    cr_assert_neq(memcmp(b.index, d.index, sizeof(int) * N), 0);
    batches_free(&d);
    batches_free(&b);
    batches_free(&c);

    cr_assert_eq(batches_by_length(len, N, 0, 4, &rng, &d), ER_EINVAL);
    cr_assert_eq(batches_by_length(NULL, 0, 4, 4, &rng, &d), ER_OK);
    cr_assert_eq(d.n_batches, 0);
    batches_free(&d);
}

// Every prefix of a valid file (a crash mid-write, a truncated download) loads or fails cleanly.
Test(dataset, truncated_files_never_crash) {
    const char *full =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"2+2?\"}, {\"role\": \"assistant\", \"content\": \"4\"}]}\n"
        "{\"question\": \"q\", \"answer\": \"a\\n#### 1,000\", \"budget\": 12, \"needs_reasoning\": true}\n"
        "{\"problem\": \"p \\u00e9\", \"solution\": \"\\\\boxed{\\\\frac{1}{2}}\"}\n";
    size_t n = strlen(full);
    int ok = 0, failed = 0;
    for (size_t cut = 0; cut <= n; cut++) {
        char text[512];
        memcpy(text, full, cut);
        text[cut] = 0;
        write_jsonl(text);
        Dataset d;
        int rc = dataset_load(path, NULL, 0, &d);
        if (rc == ER_OK) {
            ok++;
            dataset_free(&d);
        } else {
            failed++;
            cr_assert_eq(rc, ER_EFORMAT, "cut %zu: %s", cut, er_last_error());
            cr_assert_not_null(strstr(er_last_error(), path), "cut %zu: %s", cut, er_last_error());
        }
    }
    unlink(path);
    cr_assert_geq(ok, 4);
    cr_assert_gt(failed, 100);
}
