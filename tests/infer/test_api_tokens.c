// er_tokenize, er_detokenize and er_apply_template: the ids and texts of `erinfer tokenize` / `detokenize` on
// the same tokenizer, the real Qwen tokenizer's known ids (the shared fixture), the prompt er_generate feeds
// the model, snprintf-style sizes (a result that does not fit is cut and its whole size returned), and bad
// input as an error status naming the call and the argument.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/json.h"
#include "data/tokenizer.h"
#include "infer/erinfer.h"
#include "tests/common/api_helpers.h"
#include "tests/common/helpers.h"

static HelperFixture fx; // per test: the temp dir, tmp/model (the tiny tokenizer) and $ER_BUILD/erinfer

static void setup(void) { helper_fixture_open(&fx, "er_api_tokens_", "erinfer"); }
static void teardown(void) { helper_fixture_close(&fx); }
TestSuite(api_tokens, .init = setup, .fini = teardown);

static const char *const texts[] = {"Start with 2. Add 3. What is the result?", "<|im_start|>user\nhi<|im_end|>",
                                    "caf\xc3\xa9 \xe2\x82\xac 12345 don't", "", "  two  spaces\n\nand\ttabs"};
enum { N_TEXTS = sizeof texts / sizeof *texts };

// Runs `erinfer CMD --tokenizer MODEL --input IN [extra]` and returns its output lines parsed (N_TEXTS of them).
static cJSON **run_cli(const char *cmd, const char *in, const char *extra) {
    CmdResult r = helper_run(fx.tmp, "'%s' %s --tokenizer '%s' --input '%s' %s", fx.prog, cmd, fx.model, in, extra);
    cr_assert_eq(r.status, 0, "erinfer %s: %s", cmd, r.err);
    cJSON **lines = calloc(N_TEXTS, sizeof *lines);
    char *save = NULL, *line = strtok_r(r.out, "\n", &save);
    for (int i = 0; i < N_TEXTS; i++, line = strtok_r(NULL, "\n", &save)) {
        cr_assert(line, "erinfer %s wrote %d lines, expected %d", cmd, i, N_TEXTS);
        lines[i] = cJSON_Parse(line);
        cr_assert(lines[i], "not JSON: %s", line);
    }
    helper_result_free(&r);
    return lines;
}

static void free_lines(cJSON **lines) {
    for (int i = 0; i < N_TEXTS; i++)
        cJSON_Delete(lines[i]);
    free(lines);
}

Test(api_tokens, ids_and_texts_are_the_clis) {
    helper_need_program(fx.prog, "erinfer", "er_tokenize against erinfer tokenize");
    char *in = path_join(fx.tmp, "texts.jsonl"), *ids_in = path_join(fx.tmp, "ids.jsonl");
    FILE *f = fopen(in, "w");
    for (int i = 0; i < N_TEXTS; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "text", texts[i]);
        char *s = cJSON_PrintUnformatted(o);
        fprintf(f, "%s\n", s);
        free(s);
        cJSON_Delete(o);
    }
    fclose(f);
    ErModel *m;
    cr_assert_eq(er_model_load(&m, fx.model), ER_OK, "%s", er_last_error());
    for (int special_as_text = 0; special_as_text <= 1; special_as_text++) {
        cJSON **cli = run_cli("tokenize", in, special_as_text ? "--special-as-text" : "");
        f = fopen(ids_in, "w");
        for (int i = 0; i < N_TEXTS; i++) {
            const cJSON *want = cJSON_GetObjectItemCaseSensitive(cli[i], "ids");
            int n = cJSON_GetArraySize(want);
            int32_t ids[256];
            cr_assert_eq(er_tokenize(m, texts[i], ids, 256, !special_as_text), n, "text %d: %s", i, er_last_error());
            for (int k = 0; k < n; k++)
                cr_assert_eq(ids[k], cJSON_GetArrayItem(want, k)->valueint, "text %d, id %d", i, k);
            char *s = cJSON_PrintUnformatted(cli[i]);
            fprintf(f, "%s\n", s);
            free(s);
        }
        fclose(f);
        // And back: er_detokenize's text is erinfer detokenize's.
        cJSON **back = run_cli("detokenize", ids_in, "");
        for (int i = 0; i < N_TEXTS; i++) {
            const cJSON *want = cJSON_GetObjectItemCaseSensitive(back[i], "text");
            int32_t ids[256];
            int n = er_tokenize(m, texts[i], ids, 256, !special_as_text);
            char text[1024];
            cr_assert_eq(er_detokenize(m, ids, n, text, sizeof text), (int)strlen(want->valuestring), "%s",
                         er_last_error());
            cr_assert_str_eq(text, want->valuestring);
            cr_assert_str_eq(text, texts[i], "the tiny tokenizer round-trips text %d", i);
        }
        free_lines(back);
        free_lines(cli);
    }
    er_model_free(m);
    er_free(in);
    er_free(ids_in);
}

// The prompt er_generate feeds: er_apply_template's text, as many tokens as the call reports.
Test(api_tokens, the_template_is_what_generate_feeds) {
    ErModel *m;
    ErSession *s;
    cr_assert_eq(er_model_load(&m, fx.model), ER_OK, "%s", er_last_error());
    cr_assert_eq(helper_session_open(&s, m, 1, 256, 0), ER_OK, "%s", er_last_error());
    ErMessage msgs[] = {{"system", "Be brief."}, {"user", "Start with 2. Add 3. What is the result?"}};
    char text[1024];
    int len = er_apply_template(m, msgs, 2, 1, text, sizeof text);
    cr_assert_gt(len, 0, "%s", er_last_error());
    cr_assert_str_eq(text, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nStart with 2. Add 3. What is "
                           "the result?<|im_end|>\n<|im_start|>assistant\n");
    cr_assert_eq(er_apply_template(m, msgs, 2, 0, text, sizeof text), len - (int)strlen("<|im_start|>assistant\n"));
    cr_assert_eq(er_apply_template(m, msgs, 2, 1, text, sizeof text), len);
    int n = er_tokenize(m, text, NULL, 0, 1);
    cr_assert_gt(n, 0, "%s", er_last_error());
    ErGenParams p;
    er_gen_params_init(&p);
    p.max_new_tokens = 2;
    cr_assert_eq(er_generate(s, msgs, 2, &p, NULL, NULL), ER_OK, "%s", er_last_error());
    cr_assert_eq(er_result_stats(s)->prompt_tokens, n, "er_generate's prompt has %d tokens, er_tokenize counted %d",
                 er_result_stats(s)->prompt_tokens, n);
    er_session_free(s);
    er_model_free(m);
}

// The Qwen tokenizer (151,669 ids) under a tiny random model of that vocabulary.
static char *qwen_model(void) {
    const char *fxd = getenv("ER_FIXTURES");
    char *dir = path_join(fxd && *fxd ? fxd : "../shared/fixtures", "qwen-tokenizer");
    char *json = path_join(dir, "tokenizer.json");
    if (!path_exists(json))
        cr_skip_test("!!!!!! %s is MISSING (set ER_FIXTURES): er_tokenize on the Qwen tokenizer is SKIPPED !!!!!!",
                     json);
    Tokenizer *tok;
    cr_assert_eq(tok_load(&tok, dir), ER_OK, "%s", er_last_error());
    ModelConfig c = helper_tiny_config(tok_vocab_size(tok), 256);
    c.C = 8, c.FF = 16, c.L = 1, c.NH = 2, c.NKV = 1, c.HS = 4;
    tok_free(tok);
    Model mm;
    char *out = path_join(fx.tmp, "qwen");
    cr_assert_eq(model_build_random(&mm, &c, 0.5f, 3), ER_OK, "%s", er_last_error());
    cr_assert_eq(model_save(&mm, out, 0), ER_OK, "%s", er_last_error());
    model_free(&mm);
    helper_copy_file(json, out, "tokenizer.json");
    char *cfg = path_join(dir, "tokenizer_config.json");
    helper_copy_file(cfg, out, "tokenizer_config.json");
    er_free(cfg);
    er_free(json);
    er_free(dir);
    return out;
}

Test(api_tokens, the_qwen_tokenizers_known_ids) {
    char *dir = qwen_model();
    ErModel *m;
    cr_assert_eq(er_model_load(&m, dir), ER_OK, "%s", er_last_error());
    // The fixture's README: ids from the JavaScript port of Hugging Face tokenizers.
    const int32_t want[] = {9707, 1879, 0, 220, 16, 17, 18, 19, 20, 1513, 944};
    int32_t ids[32];
    cr_assert_eq(er_tokenize(m, "Hello world! 12345 don't", ids, 32, 1), 11, "%s", er_last_error());
    cr_assert_arr_eq(ids, want, sizeof want);
    cr_assert_eq(er_tokenize(m, "<think><|im_end|>", ids, 32, 1), 2);
    cr_assert(ids[0] == 151667 && ids[1] == 151645, "<think> and <|im_end|> are added tokens 151667 and 151645");
    // As plain text <|im_end|> is "<", "|", "im", "_end", "|", ">" (erinfer tokenize --special-as-text); <think>
    // is not a special token: one token either way.
    const int32_t plain[] = {151667, 27, 91, 318, 6213, 91, 29};
    cr_assert_eq(er_tokenize(m, "<think><|im_end|>", ids, 32, 0), 7);
    cr_assert_arr_eq(ids, plain, sizeof plain);
    char text[64];
    cr_assert_eq(er_detokenize(m, want, 11, text, sizeof text), 24);
    cr_assert_str_eq(text, "Hello world! 12345 don't");
    ErMessage msg = {"user", "hi"};
    cr_assert_gt(er_apply_template(m, &msg, 1, 1, text, sizeof text), 0, "%s", er_last_error());
    cr_assert_str_eq(text, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "Qwen3's template");
    er_model_free(m);
    er_free(dir);
}

Test(api_tokens, results_that_do_not_fit_are_cut_and_sized) {
    ErModel *m;
    cr_assert_eq(er_model_load(&m, fx.model), ER_OK, "%s", er_last_error());
    const char *t = texts[0];
    int n = er_tokenize(m, t, NULL, 0, 1);
    cr_assert_gt(n, 3, "%s", er_last_error());
    int32_t all[64], part[64];
    cr_assert_eq(er_tokenize(m, t, all, 64, 1), n);
    for (int i = 0; i < 64; i++)
        part[i] = -7;
    cr_assert_eq(er_tokenize(m, t, part, 3, 1), n, "the needed count, not the written one");
    cr_assert_arr_eq(part, all, 3 * sizeof(int32_t));
    cr_assert_eq(part[3], -7, "nothing written past cap");

    size_t len = strlen(t);
    char buf[128];
    memset(buf, 'x', sizeof buf);
    cr_assert_eq(er_detokenize(m, all, n, buf, 5), (int)len);
    cr_assert_str_eq(buf, "Star", "cap - 1 bytes and the NUL");
    cr_assert_eq(buf[5], 'x');
    cr_assert_eq(er_detokenize(m, all, n, buf, len), (int)len);
    cr_assert_eq(strlen(buf), len - 1, "a return of cap or more: cut");
    cr_assert_eq(er_detokenize(m, all, n, buf, len + 1), (int)len);
    cr_assert_str_eq(buf, t);
    cr_assert_eq(er_detokenize(m, all, n, NULL, 0), (int)len);
    cr_assert_eq(er_detokenize(m, all, 0, buf, sizeof buf), 0);
    cr_assert_str_eq(buf, "");

    ErMessage msg = {"user", "hi"};
    int need = er_apply_template(m, &msg, 1, 1, NULL, 0);
    cr_assert_gt(need, 0, "%s", er_last_error());
    char small[8];
    cr_assert_eq(er_apply_template(m, &msg, 1, 1, small, sizeof small), need);
    cr_assert_str_eq(small, "<|im_st");
    er_model_free(m);
}

// A failed call: the status, and one line naming the call and the argument.
static void expect_error(int rc, int status, const char *fn, const char *needle) {
    cr_assert_eq(rc, status, "%s: returned %d, expected %d (%s)", fn, rc, status, er_last_error());
    cr_assert(strstr(er_last_error(), fn) && strstr(er_last_error(), needle), "%s: \"%s\" does not say \"%s\"", fn,
              er_last_error(), needle);
}

Test(api_tokens, bad_input_is_an_error) {
    ErModel *m;
    cr_assert_eq(er_model_load(&m, fx.model), ER_OK, "%s", er_last_error());
    int32_t ids[8];
    char buf[16];
    expect_error(er_tokenize(NULL, "x", ids, 8, 1), ER_EINVAL, "er_tokenize", "NULL");
    expect_error(er_tokenize(m, NULL, ids, 8, 1), ER_EINVAL, "er_tokenize", "NULL");
    expect_error(er_tokenize(m, "x", ids, -1, 1), ER_EINVAL, "er_tokenize", "cap");
    expect_error(er_tokenize(m, "x", NULL, 8, 1), ER_EINVAL, "er_tokenize", "NULL");
    expect_error(er_tokenize(m, "ab\xff", ids, 8, 1), ER_EINVAL, "er_tokenize", "UTF-8");
    const int32_t bad_ids[] = {5, 100000}, neg[] = {-1};
    expect_error(er_detokenize(NULL, bad_ids, 1, buf, sizeof buf), ER_EINVAL, "er_detokenize", "NULL");
    expect_error(er_detokenize(m, bad_ids, 2, buf, sizeof buf), ER_ERANGE, "er_detokenize", "tokens[1] is 100000");
    expect_error(er_detokenize(m, neg, 1, buf, sizeof buf), ER_ERANGE, "er_detokenize", "tokens[0] is -1");
    expect_error(er_detokenize(m, bad_ids, -1, buf, sizeof buf), ER_EINVAL, "er_detokenize", "-1 tokens");
    expect_error(er_detokenize(m, NULL, 2, buf, sizeof buf), ER_EINVAL, "er_detokenize", "NULL");
    expect_error(er_detokenize(m, bad_ids, 1, NULL, 4), ER_EINVAL, "er_detokenize", "NULL");
    ErMessage ok = {"user", "hi"}, no_role = {NULL, "hi"}, bad_role = {"wizard", "hi"};
    expect_error(er_apply_template(NULL, &ok, 1, 1, buf, sizeof buf), ER_EINVAL, "er_apply_template", "NULL");
    expect_error(er_apply_template(m, NULL, 1, 1, buf, sizeof buf), ER_EINVAL, "er_apply_template", "NULL");
    expect_error(er_apply_template(m, &ok, -2, 1, buf, sizeof buf), ER_EINVAL, "er_apply_template", "-2 messages");
    expect_error(er_apply_template(m, &no_role, 1, 1, buf, sizeof buf), ER_EINVAL, "er_apply_template", "role");
    expect_error(er_apply_template(m, &bad_role, 1, 1, buf, sizeof buf), ER_EUNSUPPORTED, "er_apply_template",
                 "wizard");
    expect_error(er_apply_template(m, &ok, 1, 1, NULL, 4), ER_EINVAL, "er_apply_template", "NULL");
    er_model_free(m);
}
