// Chat templates: byte-for-byte against jinja2 renderings of the real templates
// (scripts/make_chat_golden.py -> tests/data/golden/), style detection, and bad input.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "data/chat.h"
#include "tests/common/helpers.h"

#define GOLDEN "tests/data/golden/"
#define TINY_CONFIG "data/tiny_tokenizer/tokenizer_config.json"

static cJSON *load_cases(void) {
    if (!path_exists(GOLDEN "chat_cases.json"))
        cr_skip_test("!!! SKIPPED: " GOLDEN "chat_cases.json not found: run the tests from the repository root !!!");
    cJSON *j;
    cr_assert_eq(json_parse_file(GOLDEN "chat_cases.json", 1 << 24, &j), ER_OK, "%s", er_last_error());
    return j;
}

// Index of the first differing byte, or -1.
static long first_diff(const char *a, size_t na, const char *b, size_t nb) {
    size_t n = na < nb ? na : nb;
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i])
            return (long)i;
    return na == nb ? -1 : (long)n;
}

Test(chat, golden_renderings_match_jinja) {
    cJSON *root = load_cases();
    const cJSON *templates = cJSON_GetObjectItem(root, "templates");
    const cJSON *styles = cJSON_GetObjectItem(root, "styles");
    const cJSON *cases = cJSON_GetObjectItem(root, "cases");
    cr_assert(cJSON_IsObject(templates) && cJSON_IsObject(styles) && cJSON_IsArray(cases));
    int checked = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, templates) {
        const char *tname = t->string;
        const cJSON *want = cJSON_GetObjectItem(styles, tname);
        ChatStyle style;
        if (cJSON_IsString(want)) {
            // Detection from the template text must give the style named in the golden file.
            cr_assert_eq(chat_style_parse(want->valuestring, &style), ER_OK);
            cr_assert_eq(chat_style_detect(t->valuestring), style, "template %s detected as %s, want %s", tname,
                         chat_style_name(chat_style_detect(t->valuestring)), want->valuestring);
        } else {
            cr_assert_eq(chat_style_parse(tname, &style), ER_OK, "%s", er_last_error());
        }
        const cJSON *c;
        cJSON_ArrayForEach(c, cases) {
            const char *cname = cJSON_GetObjectItem(c, "name")->valuestring;
            const cJSON *msgs = cJSON_GetObjectItem(c, "messages");
            int n = cJSON_GetArraySize(msgs), i = 0;
            ChatMessage m[16];
            cr_assert(n <= 16);
            const cJSON *e;
            cJSON_ArrayForEach(e, msgs) {
                m[i].role = cJSON_GetObjectItem(e, "role")->valuestring;
                m[i].content = cJSON_GetObjectItem(e, "content")->valuestring;
                i++;
            }
            int flags = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")) ? CHAT_ADD_GENERATION_PROMPT : 0;
            if (cJSON_IsFalse(cJSON_GetObjectItem(c, "enable_thinking")))
                flags |= CHAT_NO_THINKING;
            char *got;
            size_t got_len;
            cr_assert_eq(chat_render(style, m, n, flags, &got, &got_len), ER_OK, "%s", er_last_error());
            char path[256], *exp;
            size_t exp_len;
            snprintf(path, sizeof path, GOLDEN "chat_%s_%s.txt", tname, cname);
            cr_assert_eq(file_read_all(path, 1 << 20, &exp, &exp_len), ER_OK, "%s", er_last_error());
            long d = first_diff(got, got_len, exp, exp_len);
            cr_assert_eq(d, -1L, "%s: differs at byte %ld\n--- C ---\n%s\n--- jinja2 ---\n%s", path, d, got, exp);
            cr_assert_eq(got_len, strlen(got));
            er_free(got);
            er_free(exp);
            checked++;
        }
    }
    cr_assert_geq(checked, 40, "only %d golden renderings checked", checked);
    cJSON_Delete(root);
}

Test(chat, default_system_only_for_qwen25) {
    ChatMessage user[] = {{"user", "Hi"}};
    ChatMessage sys_user[] = {{"system", "Be terse."}, {"user", "Hi"}};
    char *s;
    cr_assert_eq(chat_render(CHAT_QWEN25, user, 1, CHAT_ADD_GENERATION_PROMPT, &s, NULL), ER_OK);
    cr_assert_str_eq(s, "<|im_start|>system\n" CHAT_QWEN25_DEFAULT_SYSTEM "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                        "<|im_start|>assistant\n");
    er_free(s);
    cr_assert_eq(chat_render(CHAT_QWEN25, sys_user, 2, 0, &s, NULL), ER_OK);
    cr_assert_null(strstr(s, "Alibaba"), "a given system message must replace the default: %s", s);
    cr_assert_str_eq(s, "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
    er_free(s);
    ChatStyle no_default[] = {CHAT_QWEN3, CHAT_CHATML};
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(chat_render(no_default[i], user, 1, CHAT_ADD_GENERATION_PROMPT, &s, NULL), ER_OK);
        cr_assert_str_eq(s, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "%s", chat_style_name(no_default[i]));
        er_free(s);
    }
    cr_assert_eq(chat_render(CHAT_PLAIN, sys_user, 2, CHAT_ADD_GENERATION_PROMPT, &s, NULL), ER_OK);
    cr_assert_str_eq(s, "system: Be terse.\nuser: Hi\nassistant: ");
    er_free(s);
}

// A given system message goes in front and replaces the record's own; none given keeps the record as it is.
Test(chat, set_system_replaces_the_records_own) {
    ChatMessage sys_user[] = {{"system", "Be terse."}, {"user", "Hi"}};
    ChatMessage out[3];
    cr_assert_eq(chat_set_system(out, 3, sys_user, 2, "Think."), 2);
    cr_assert_str_eq(out[0].content, "Think.");
    cr_assert_str_eq(out[1].role, "user");
    cr_assert_eq(chat_set_system(out, 3, sys_user + 1, 1, "Think."), 2);
    cr_assert_str_eq(out[0].role, "system");
    cr_assert_eq(chat_set_system(out, 3, sys_user, 2, NULL), 2);
    cr_assert_str_eq(out[0].content, "Be terse.");
    cr_assert_eq(chat_set_system(out, 1, sys_user + 1, 1, "Think."), 1, "messages past cap are left off");
}

Test(chat, qwen3_strips_reasoning_from_earlier_turns) {
    ChatMessage m[] = {{"user", "q1"}, {"assistant", "<think>\nsecret\n</think>\n\nA1"}, {"user", "q2"}};
    char *s;
    cr_assert_eq(chat_render(CHAT_QWEN3, m, 3, CHAT_ADD_GENERATION_PROMPT | CHAT_NO_THINKING, &s, NULL), ER_OK);
    cr_assert_null(strstr(s, "secret"), "%s", s);
    cr_assert_str_eq(s, "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n"
                        "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    er_free(s);
    // The other styles keep the content verbatim.
    cr_assert_eq(chat_render(CHAT_QWEN25, m, 3, 0, &s, NULL), ER_OK);
    cr_assert_not_null(strstr(s, "<think>\nsecret\n</think>\n\nA1"), "%s", s);
    er_free(s);
}

Test(chat, detect_from_config_files) {
    ChatStyle st;
    // The real Qwen tokenizer_config.json, from the fixtures (ER_FIXTURES, else ../shared/fixtures).
    const char *fx = getenv("ER_FIXTURES");
    char *qwen3 = path_join(fx && *fx ? fx : "../shared/fixtures", "qwen-tokenizer/tokenizer_config.json");
    cr_assert_not_null(qwen3);
    if (path_exists(qwen3)) {
        cr_assert_eq(chat_style_from_config(qwen3, &st), ER_OK, "%s", er_last_error());
        cr_assert_eq(st, CHAT_QWEN3, "fixture detected as %s", chat_style_name(st));
    } else {
        cr_log_warn("!!! fixture %s missing (set ER_FIXTURES): Qwen3 config detection NOT checked !!!", qwen3);
    }
    er_free(qwen3);
    if (!path_exists(TINY_CONFIG))
        cr_skip_test("!!! SKIPPED: %s not found: run the tests from the repository root !!!", TINY_CONFIG);
    cr_assert_eq(chat_style_from_config(TINY_CONFIG, &st), ER_OK, "%s", er_last_error());
    cr_assert_eq(st, CHAT_CHATML, "tiny tokenizer detected as %s", chat_style_name(st));
    st = CHAT_PLAIN;
    cr_assert_eq(chat_style_from_config("data/tiny_tokenizer", &st), ER_OK, "a model dir: %s", er_last_error());
    cr_assert_eq(st, CHAT_CHATML);
    cr_assert_eq(chat_style_detect(NULL), CHAT_CHATML);
    cr_assert_eq(chat_style_detect("{{ 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}"), CHAT_QWEN25);
}

static char tmp_path[64];

static const char *write_tmp(const char *text) {
    return helper_write_tmp(tmp_path, sizeof tmp_path, "er_test_chat", ".json", text);
}

Test(chat, config_variants_and_errors) {
    ChatStyle st = CHAT_PLAIN;
    cr_assert_eq(chat_style_from_config(write_tmp("{\"eos_token\": \"x\"}"), &st), ER_OK);
    cr_assert_eq(st, CHAT_CHATML, "no template -> chatml");
    cr_assert_eq(chat_style_from_config(write_tmp("{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"x\"}, "
                                                  "{\"name\": \"default\", \"template\": \"{{ '</think>' }}\"}]}"),
                                        &st),
                 ER_OK, "%s", er_last_error());
    cr_assert_eq(st, CHAT_QWEN3);
    int rc = chat_style_from_config(write_tmp("{\"chat_template\": [{\"name\": \"rag\", \"template\": \"x\"}]}"), &st);
    cr_assert_eq(rc, ER_EFORMAT);
    cr_assert_not_null(strstr(er_last_error(), tmp_path), "%s", er_last_error());
    rc = chat_style_from_config(write_tmp("{\"chat_template\": 42}"), &st);
    cr_assert_eq(rc, ER_EFORMAT);
    cr_assert_not_null(strstr(er_last_error(), "chat_template"), "%s", er_last_error());
    rc = chat_style_from_config(write_tmp("{\"chat_template\": \"abc\""), &st);
    cr_assert_eq(rc, ER_EFORMAT, "truncated JSON: %s", er_last_error());
    cr_assert_not_null(strstr(er_last_error(), tmp_path), "%s", er_last_error());
    unlink(tmp_path);
    rc = chat_style_from_config("/nonexistent/tokenizer_config.json", &st);
    cr_assert_eq(rc, ER_EIO);
    cr_assert_not_null(strstr(er_last_error(), "/nonexistent/tokenizer_config.json"), "%s", er_last_error());
}

Test(chat, names_and_bad_messages) {
    ChatStyle st;
    const char *names[] = {"chatml", "qwen2.5", "qwen3", "plain"};
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(chat_style_parse(names[i], &st), ER_OK);
        cr_assert_str_eq(chat_style_name(st), names[i]);
    }
    cr_assert_eq(chat_style_parse("llama3", &st), ER_EINVAL);
    cr_assert_not_null(strstr(er_last_error(), "llama3"), "%s", er_last_error());

    char *s = (char *)1;
    ChatMessage bad_role[] = {{"user", "hi"}, {"narrator", "once upon a time"}};
    cr_assert_eq(chat_render(CHAT_CHATML, bad_role, 2, 0, &s, NULL), ER_EUNSUPPORTED);
    cr_assert_null(s);
    cr_assert_not_null(strstr(er_last_error(), "narrator"), "%s", er_last_error());
    ChatMessage no_content[] = {{"user", NULL}};
    cr_assert_eq(chat_render(CHAT_QWEN3, no_content, 1, 0, &s, NULL), ER_EINVAL);
    cr_assert_eq(chat_render((ChatStyle)99, bad_role, 1, 0, &s, NULL), ER_EINVAL);
    cr_assert_eq(chat_render(CHAT_CHATML, NULL, 0, CHAT_ADD_GENERATION_PROMPT, &s, NULL), ER_OK);
    cr_assert_str_eq(s, "<|im_start|>assistant\n");
    er_free(s);
}
