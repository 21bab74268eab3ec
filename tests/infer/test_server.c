// erinfer serve: the request checks and tool handling of infer/server_json.c and data/chat.c, each
// against something independent (Python's json.dumps, jinja2 renderings of the real Qwen2.5 and Qwen3
// templates), and the running server with real clients (scripts/serve_check.sh: the official OpenAI
// Node client, curl, the bounded load test; it skips loudly without node / npm).
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "data/chat.h"
#include "data/tokenizer.h"
#include "infer/server.h"
#include "tests/common/helpers.h"

// The stdout of a shell command (exit status in *status), or a loud skip when python3 or jinja2 is missing.
static char *run_capture(const char *cmd, int *status) {
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen failed");
    StrBuf b = {0};
    strbuf_puts(&b, "");
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0)
        strbuf_put(&b, buf, n);
    int st = pclose(p);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return b.p;
}

static char *python_out(const char *script_args) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "python3 %s 2>/dev/null", script_args);
    int st;
    char *out = run_capture(cmd, &st);
    if (st != 0)
        cr_skip_test("!!!!!! python3 (with jinja2) failed on `%s`: the comparison is SKIPPED !!!!!!", script_args);
    return out;
}

Test(server, json_dumps_matches_python) {
    const char *json = "{\"s\": \"tab\\t quote\\\" back\\\\ nl\\n ctl\\u0001 é 日本 😀\", \"i\": -42, \"f\": 0.1, "
                       "\"big\": 12345678901, \"e\": 1.5e-07, \"a\": [true, false, null, [], {}], \"o\": {\"k\": [1, "
                       "2.25]}}";
    char path[256];
    helper_write_tmp(path, sizeof path, "server_dumps", ".json", json);
    char args[512];
    snprintf(args, sizeof args,
             "-c 'import json,sys; sys.stdout.write(json.dumps(json.load(open(sys.argv[1])), ensure_ascii=False))' %s",
             path);
    char *want = python_out(args);
    cJSON *v = cJSON_Parse(json);
    char *got;
    cr_assert_eq(chat_json_dumps(v, &got), ER_OK);
    cr_expect_str_eq(got, want);
    cJSON_Delete(v);
    er_free(got);
    free(want);
    remove(path);
}

// A request with tools, a system message (or not), an assistant's two tool calls and their results.
static const char *tools_request(int with_system) {
    return with_system
               ? "{\"messages\": [{\"role\": \"system\", \"content\": \"You add numbers.\"}, "
                 "{\"role\": \"user\", \"content\": \"What is 4 + 9? Réponds ✓\"}, {\"role\": \"assistant\", "
                 "\"content\": \"\", \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": "
                 "{\"name\": \"add\", \"arguments\": \"{\\\"a\\\":4,\\\"b\\\":9.5,\\\"note\\\":\\\"x\\\\\\\"y\\\\n\\\"}\"}}, "
                 "{\"id\": \"c2\", \"type\": \"function\", \"function\": {\"name\": \"noop\", \"arguments\": \"{}\"}}]}, "
                 "{\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"13.5\"}, {\"role\": \"tool\", "
                 "\"tool_call_id\": \"c2\", \"content\": \"ok\"}], \"tools\": [{\"type\": \"function\", \"function\": "
                 "{\"name\": \"add\", \"description\": \"Adds a and b — exactly\", \"parameters\": {\"type\": "
                 "\"object\", \"properties\": {\"a\": {\"type\": \"number\"}, \"b\": {\"type\": \"number\"}}, "
                 "\"required\": [\"a\", \"b\"]}}}, {\"type\": \"function\", \"function\": {\"name\": \"noop\", "
                 "\"parameters\": {\"type\": \"object\", \"properties\": {}}}}]}"
               : "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}], \"tools\": [{\"type\": "
                 "\"function\", \"function\": {\"name\": \"weather\", \"parameters\": {\"type\": \"object\", "
                 "\"properties\": {\"city\": {\"type\": \"string\", \"enum\": [\"Paris\", \"Köln\"]}}}}}]}";
}

static const ServeLimits test_limits = {4, 64, 4096, 64};

// The server's prompt for the request against jinja2's rendering of the real template.
static void check_tools_prompt(ChatStyle style, const char *template_name, int with_system) {
    Tokenizer *tok;
    cr_assert_eq(tok_load(&tok, "data/tiny_tokenizer"), ER_OK, "%s", er_last_error());
    const char *body = tools_request(with_system);
    char path[256], args[512];
    helper_write_tmp(path, sizeof path, "server_tools", ".json", body);
    snprintf(args, sizeof args, "scripts/chat_tools_golden.py %s %s", template_name, path);
    char *want = python_out(args);
    ServeRequest r;
    ServeError e;
    cr_assert_eq(serve_parse_request(body, strlen(body), 1, style, tok, &test_limits, &r, &e), 0, "%s", e.message);
    cr_assert(r.tools);
    cr_expect_str_eq(r.prompt, want, "%s (system: %d)", template_name, with_system);
    serve_request_free(&r);
    free(want);
    remove(path);
    tok_free(tok);
}

Test(server, tools_prompt_matches_jinja_qwen25) {
    check_tools_prompt(CHAT_QWEN25, "qwen25", 1);
    check_tools_prompt(CHAT_QWEN25, "qwen25", 0);
}

Test(server, tools_prompt_matches_jinja_qwen3) {
    check_tools_prompt(CHAT_QWEN3, "qwen3", 1);
    check_tools_prompt(CHAT_QWEN3, "qwen3", 0);
}

static int parse_calls(const char *text, ChatToolCall **c, int *n, size_t *clen) {
    return chat_parse_tool_calls(text, strlen(text), c, n, clen);
}

Test(server, tool_calls_parse) {
    ChatToolCall *c;
    int n;
    size_t clen;
    cr_assert_eq(parse_calls("plain answer", &c, &n, &clen), ER_OK);
    cr_expect(n == 0 && clen == 12 && !c);
    const char *two = "Let me see.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 4, \"b\": [1, 2]}}\n"
                      "</tool_call>\n<tool_call>{\"name\": \"noop\", \"arguments\": {}}</tool_call>\n";
    cr_assert_eq(parse_calls(two, &c, &n, &clen), ER_OK, "%s", er_last_error());
    cr_assert_eq(n, 2);
    cr_expect_eq(clen, strlen("Let me see.\n"));
    cr_expect_str_eq(c[0].name, "add");
    cr_expect_str_eq(c[0].arguments, "{\"a\":4,\"b\":[1,2]}");
    cr_expect_str_eq(c[1].name, "noop");
    cr_expect_str_eq(c[1].arguments, "{}");
    chat_tool_calls_free(c, n);
    // Malformed calls are refused whole (the server then returns the text, flagged), nothing allocated.
    const char *bad[] = {
        "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 4}</tool_call>",  // JSON cut short
        "<tool_call>{\"arguments\": {}}</tool_call>",                          // no name
        "<tool_call>{\"name\": \"add\", \"arguments\": \"a=4\"}</tool_call>",    // arguments not an object
        "<tool_call>{\"name\": \"add\", \"arguments\": {}}",                     // not closed
        "<tool_call>{\"name\": \"add\", \"arguments\": {}}</tool_call> and more", // text after
        "<tool_call>[1, 2]</tool_call>",                                        // not an object
        "<tool_call>{\"name\": \"a\", \"arguments\": {}} {}</tool_call>",         // two values
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        c = (ChatToolCall *)1;
        cr_expect_eq(parse_calls(bad[i], &c, &n, &clen), ER_EFORMAT, "case %zu accepted", i);
        cr_expect(c == NULL && n == 0, "case %zu left something", i);
    }
}

Test(server, tool_call_held_back_while_streaming) {
    static const struct {
        const char *text;
        size_t safe;
    } cases[] = {{"abc", 3}, {"abc<", 3}, {"abc<tool_c", 3}, {"abc<tool_call>{\"na", 3}, {"a<b", 3},
                 {"<tool_call>", 0}, {"", 0}, {"x <tool_call", 2}, {"a<tool_calx", 11}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        cr_expect_eq(serve_tool_safe_prefix(cases[i].text, strlen(cases[i].text)), cases[i].safe, "\"%s\"",
                     cases[i].text);
    // Streaming chunk by chunk never releases a byte of the call, whatever the split.
    const char *text = "Sure.<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
    for (size_t cut = 0; cut <= strlen(text); cut++)
        cr_expect_leq(serve_tool_safe_prefix(text, cut), 5);
}

// Bad requests: the status, the parameter named, and a message without internals.
Test(server, bad_requests_are_refused) {
    Tokenizer *tok;
    cr_assert_eq(tok_load(&tok, "data/tiny_tokenizer"), ER_OK, "%s", er_last_error());
    static const struct {
        const char *body, *param;
        int chat;
    } cases[] = {
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}", "", 1},
        {"[1]", "", 1},
        {"{\"messages\": []}", "messages", 1},
        {"{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", "messages", 1},
        {"{\"messages\": [{\"role\": \"robot\", \"content\": \"hi\"}]}", "messages", 1},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"temperature\": \"warm\"}", "temperature", 1},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"temperature\": 7}", "temperature", 1},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"n\": 5}", "n", 1},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"n\": 1.5}", "n", 1},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stop\": [\"a\", 3]}", "stop", 1},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stop\": [\"\"]}", "stop", 1},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"route\": \"fast\"}", "route", 1},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"colour\": 1}", "colour", 1},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": {}}", "tools", 1},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stream\": 1}", "stream", 1},
        {"{\"prompt\": 3}", "prompt", 0},
        {"{\"prompt\": \"hi\", \"messages\": []}", "messages", 0},
        {"{\"prompt\": \"hi\", \"max_tokens\": 0}", "max_tokens", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ServeRequest r;
        ServeError e;
        const char *b = cases[i].body;
        cr_expect_eq(serve_parse_request(b, strlen(b), cases[i].chat, CHAT_CHATML, tok, &test_limits, &r, &e), -1,
                     "accepted: %s", b);
        cr_expect_eq(e.status, 400, "%s", b);
        cr_expect_str_eq(e.param, cases[i].param, "%s", b);
        cr_expect(e.message[0] && !strchr(e.message, '/'), "%s: \"%s\"", b, e.message);
    }
    // Nesting beyond the limit is refused before parsing; 10k levels cost nothing.
    StrBuf deep = {0};
    strbuf_puts(&deep, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"x\": ");
    for (int i = 0; i < 10000; i++)
        strbuf_puts(&deep, "[");
    for (int i = 0; i < 10000; i++)
        strbuf_puts(&deep, "]");
    strbuf_puts(&deep, "}");
    cr_assert_eq(serve_json_depth(deep.p, deep.n), 10001);
    ServeRequest r;
    ServeError e;
    cr_expect_eq(serve_parse_request(deep.p, deep.n, 1, CHAT_CHATML, tok, &test_limits, &r, &e), -1);
    cr_expect_eq(e.status, 400);
    cr_expect_eq(serve_json_depth("{\"a\": \"[[[{{\\\"\"}", 18), 1, "brackets inside strings do not count");
    // A prompt longer than the context is refused with its token count.
    ServeLimits small = test_limits;
    small.context = 40;
    const char *longer = "{\"prompt\": \"Start with 4. Add 9. Multiply by 3. Subtract 5. What is the result?\"}";
    cr_expect_eq(serve_parse_request(longer, strlen(longer), 0, CHAT_CHATML, tok, &small, &r, &e), -1);
    cr_expect(strstr(e.message, "exceed the context of 40"), "%s", e.message);
    er_free(deep.p);
    tok_free(tok);
}

// The running server with real clients: scripts/serve_check.sh on $ER_BUILD's erinfer (ASan under make SAN=1).
Test(server, openai_client_curl_and_load, .timeout = 600) {
    char *prog = helper_program("erinfer");
    helper_need_program(prog, "erinfer", "the erinfer serve client tests");
    int st = system("bash scripts/serve_check.sh 1>&2");
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77)
        cr_skip_test("!!!!!! node / npm / curl or the openai package unavailable: erinfer serve's client tests are "
                     "SKIPPED !!!!!!");
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "scripts/serve_check.sh failed (status %d, see its output)", st);
    er_free(prog);
}
