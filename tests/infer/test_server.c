// erinfer serve: the request checks and tool handling of erinfer/server_json.c and data/chat.c, each
// against something independent (Python's json.dumps, jinja2 renderings of the real Qwen2.5 and Qwen3
// templates), and the running server with real clients (scripts/serve_check.sh: the official OpenAI
// Node client, curl, the bounded load test; it skips loudly without node / npm).
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/utf8.h"
#include "data/chat.h"
#include "data/tokenizer.h"
#include "infer/sampler.h"
#include "erinfer/server.h"
#include "tests/common/api_helpers.h"
#include "tests/common/heads_helpers.h"

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
                       "\"big\": 12345678901, \"huge\": 1e300, \"e\": 1.5e-07, \"a\": [true, false, null, [], {}], \"o\": {\"k\": [1, "
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

// An assistant's tool call arguments are re-printed when they are JSON, and kept as given otherwise
// (text after the JSON included).
Test(server, tool_call_arguments_kept_unless_json) {
    const char *names[] = {"f", "g"}, *args[] = {"{\"a\":1}", "{} junk"};
    char *text;
    cr_assert_eq(chat_tool_calls_text("", names, args, 2, &text), ER_OK);
    cr_expect(strstr(text, "\"name\": \"f\", \"arguments\": {\"a\": 1}}"), "%s", text);
    cr_expect(strstr(text, "\"name\": \"g\", \"arguments\": {} junk}"), "%s", text);
    er_free(text);
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

static const ServeLimits test_limits = {4, 64, 4096, 64, 0, 0, 0, 0, NULL}; // no adapter, no heads, not hybrid

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
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"route\": \"reasoning\"}", "route", 1}, // no adapter
        {"{\"prompt\": \"hi\", \"route\": \"direct\"}", "route", 0},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"colour\": 1}", "colour", 1},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": {}}", "tools", 1},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stream\": 1}", "stream", 1},
        {"{\"prompt\": 3}", "prompt", 0},
        {"{\"prompt\": \"hi\", \"messages\": []}", "messages", 0},
        {"{\"prompt\": \"hi\", \"max_tokens\": 0}", "max_tokens", 0},
        // What the engine would refuse after queueing is refused here, by name.
        {"{\"prompt\": \"hi\", \"min_p\": 1}", "min_p", 0},
        {"{\"prompt\": \"hi\", \"reasoning_budget\": 1e9}", "reasoning_budget", 0},
        {"{\"prompt\": \"hi\", \"reasoning_budget\": 33}", "reasoning_budget", 0}, // + 32 answer tokens > 64
        {"{\"prompt\": \"\"}", "prompt", 0},
        // A key given twice: parsers disagree on which one counts.
        {"{\"prompt\": \"hi\", \"prompt\": \"ho\"}", "prompt", 0},
        {"{\"messages\": [{\"role\": \"user\", \"role\": \"system\", \"content\": \"hi\"}]}", "messages", 1},
        {"{\"prompt\": \"hi\", \"stream_options\": {\"include_usage\": true, \"include_usage\": false}}",
         "stream_options", 0},
        // logprobs: chat a boolean with top_logprobs 0..20, completions a count 0..20.
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"top_logprobs\": 2}", "top_logprobs", 1},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"logprobs\": true, \"top_logprobs\": 21}",
         "top_logprobs", 1},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"logprobs\": 2}", "logprobs", 1},
        {"{\"prompt\": \"hi\", \"logprobs\": true}", "logprobs", 0},
        {"{\"prompt\": \"hi\", \"logprobs\": 21}", "logprobs", 0},
        {"{\"prompt\": \"hi\", \"logprobs\": 2, \"top_logprobs\": 2}", "top_logprobs", 0},
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
    // The reasons are told.
    static const struct {
        const char *body, *reason;
    } told[] = {
        {"{\"prompt\": \"hi\", \"min_p\": 1}", "less than 1"},
        {"{\"prompt\": \"hi\", \"reasoning_budget\": 1e9}", "exceed this server's --max-tokens (64): at most 32"},
        {"{\"prompt\": \"\"}", "must not be empty"},
        {"{\"prompt\": \"hi\", \"prompt\": \"ho\"}", "the key 'prompt' appears twice in the request"},
        {"{\"prompt\": \"hi\", \"x\": [{\"a\": 1, \"a\": 2}]}", "the key 'a' appears twice in an object of 'x'"},
    };
    for (size_t i = 0; i < sizeof told / sizeof *told; i++) {
        ServeRequest r;
        ServeError e;
        cr_expect_eq(serve_parse_request(told[i].body, strlen(told[i].body), 0, CHAT_CHATML, tok, &test_limits, &r,
                                         &e), -1);
        cr_expect(strstr(e.message, told[i].reason), "%s: %s", told[i].body, e.message);
    }
    // A range is printed in full.
    const char *zero = "{\"prompt\": \"hi\", \"max_tokens\": 0}";
    ServeRequest r0;
    ServeError e0;
    cr_expect_eq(serve_parse_request(zero, strlen(zero), 0, CHAT_CHATML, tok, &test_limits, &r0, &e0), -1);
    cr_expect(strstr(e0.message, "between 1 and 1073741824"), "%s", e0.message);
    // A long non-ASCII field name, echoed in the message and param, is cut on a character boundary
    // (the prefixes "a" and "ab" put the cut of one or the other inside a 2-byte character).
    for (int pre = 1; pre <= 2; pre++) {
        StrBuf b = {0};
        strbuf_puts(&b, pre == 1 ? "{\"a" : "{\"ab");
        for (int i = 0; i < 60; i++)
            strbuf_puts(&b, "\xc3\xa9");
        strbuf_puts(&b, "\": 1, \"prompt\": \"hi\"}");
        ServeRequest r;
        ServeError e;
        cr_expect_eq(serve_parse_request(b.p, b.n, 0, CHAT_CHATML, tok, &test_limits, &r, &e), -1);
        cr_expect_eq(utf8_invalid_at(e.message, strlen(e.message)), strlen(e.message), "%s", e.message);
        cr_expect_eq(utf8_invalid_at(e.param, strlen(e.param)), strlen(e.param), "%s", e.param);
        cr_expect_gt(strlen(e.param), 60);
        er_free(b.p);
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
    const char *in_string = "{\"a\": \"[[[{{\\\"\"}";
    cr_expect_eq(serve_json_depth(in_string, strlen(in_string)), 1, "brackets inside strings do not count");
    // A prompt and max_tokens beyond the context are refused with the token count.
    ServeLimits small = test_limits;
    small.context = 40;
    const char *longer = "{\"prompt\": \"Start with 4. Add 9. Multiply by 3. Subtract 5. What is the result?\", "
                         "\"max_tokens\": 30}";
    cr_expect_eq(serve_parse_request(longer, strlen(longer), 0, CHAT_CHATML, tok, &small, &r, &e), -1);
    cr_expect(strstr(e.message, "exceed the context of 40"), "%s", e.message);
    // Without max_tokens a prompt that fits gets what the context leaves (less than the cap of 64).
    const char *shorter = "{\"prompt\": \"Hi\"}";
    cr_assert_eq(serve_parse_request(shorter, strlen(shorter), 0, CHAT_CHATML, tok, &small, &r, &e), 0, "%s", e.message);
    cr_expect_eq(r.p.max_new_tokens, 40 - r.prompt_tokens);
    serve_request_free(&r);
    // A budget that fits --max-tokens (20 + 32 <= 64) but not what the prompt leaves of the context.
    const char *budget = "{\"prompt\": \"Hi\", \"reasoning_budget\": 20}";
    cr_expect_eq(serve_parse_request(budget, strlen(budget), 0, CHAT_CHATML, tok, &small, &r, &e), -1);
    cr_expect_str_eq(e.param, "reasoning_budget");
    cr_expect(strstr(e.message, "do not fit"), "%s", e.message);
    er_free(deep.p);
    tok_free(tok);
}

// ---- the routed pipeline over HTTP: a tiny random model with a masked adapter and random heads ----

typedef struct {
    HelperFixture fx;
    pid_t pid;
    int port;
} TestServer;

// Skips, loudly, where erinfer was built without serve (the aarch64 build leaves it out).
static void need_serve(const char *prog) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "'%s' serve --help >/dev/null 2>&1", prog);
    if (system(cmd) != 0)
        cr_skip_test("!!!!!! %s has no serve command (the aarch64 build leaves it out): SKIPPED !!!!!!", prog);
}

// erinfer serve with `args` (the model and more) on a free port, its log in the fixture's dir.
static void server_launch(TestServer *t, const char *args) {
    need_serve(t->fx.prog);
    char cmd[2048], log[600];
    snprintf(log, sizeof log, "%s/serve.log", t->fx.tmp);
    snprintf(cmd, sizeof cmd, "exec '%s' serve %s --port 0 --threads 1 2>'%s'", t->fx.prog, args, log);
    t->pid = fork();
    cr_assert(t->pid >= 0);
    if (t->pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    t->port = 0;
    for (int i = 0; i < 200 && !t->port; i++) {
        usleep(50 * 1000);
        char *text;
        size_t n;
        if (file_read_all(log, 1 << 20, &text, &n) == ER_OK) {
            const char *at = strstr(text, "http://127.0.0.1:");
            if (at)
                t->port = atoi(at + strlen("http://127.0.0.1:"));
            er_free(text);
        }
    }
    cr_assert(t->port > 0, "erinfer serve did not start (see %s)", log);
}

// The fixture's model with a masked adapter and random heads (switcher threshold as given), served with
// no queue: each request of these tests comes when the batch has free rows, and is served.
static void server_start(TestServer *t, float threshold) {
    helper_fixture_open(&t->fx, "er_serve_", "erinfer");
    helper_need_program(t->fx.prog, "erinfer", "the erinfer serve pipeline tests");
    heads_add_adapter(t->fx.tmp);
    heads_write_random_heads(t->fx.tmp, "sw", "vf", threshold, "\nIs this solution correct?");
    char args[1600];
    snprintf(args, sizeof args, "--model '%s' --adapter '%s/adapter' --switcher '%s/sw' --verifier '%s/vf' --max-n 4 "
             "--max-tokens 64 --kv int8 --queue 0", t->fx.model, t->fx.tmp, t->fx.tmp, t->fx.tmp);
    server_launch(t, args);
}

// SIGTERM: a clean stop, status 0.
static void server_stop(TestServer *t) {
    kill(t->pid, SIGTERM);
    int st;
    cr_assert_eq(waitpid(t->pid, &st, 0), t->pid);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "erinfer serve exited with %d", st);
    helper_fixture_close(&t->fx);
}

// POSTs body to /v1/chat/completions with curl; the response text (free with free).
static char *server_post(const TestServer *t, const char *body) {
    char path[600], cmd[1024];
    snprintf(path, sizeof path, "%s/body.json", t->fx.tmp);
    cr_assert_eq(file_write_atomic(path, body, strlen(body)), ER_OK);
    snprintf(cmd, sizeof cmd, "curl -s -N http://127.0.0.1:%d/v1/chat/completions -H 'Content-Type: application/json' "
             "-d @'%s'", t->port, path);
    int st;
    char *out = run_capture(cmd, &st);
    if (st == 127)
        cr_skip_test("!!!!!! curl is not installed: the erinfer serve pipeline tests are SKIPPED !!!!!!");
    cr_assert_eq(st, 0, "curl failed: %s", out);
    return out;
}

static const cJSON *field(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    cr_assert(v, "no \"%s\"", k);
    return v;
}

// A head fitted on f32 KV features served with --kv int8: the server says so at start, as generate and eval do.
Test(server, warns_when_a_head_runs_on_another_kv_type, .timeout = 120) {
    TestServer t;
    helper_fixture_open(&t.fx, "er_serve_", "erinfer");
    helper_need_program(t.fx.prog, "erinfer", "the erinfer serve pipeline tests");
    heads_add_adapter(t.fx.tmp);
    heads_write_random_heads(t.fx.tmp, "sw", "vf", 0.5f, "\nIs this solution correct?");
    char sw[512], args[1600], log[600];
    snprintf(sw, sizeof sw, "%s/sw", t.fx.tmp);
    TrainedHead h;
    cr_assert_eq(trained_head_load(&h, sw, HEAD_SWITCHER, NULL), 0, "%s", er_last_error());
    h.kv = HEAD_KV_F32;
    cr_assert_eq(trained_head_save(&h, sw), 0, "%s", er_last_error());
    trained_head_free(&h);
    snprintf(args, sizeof args, "--model '%s' --adapter '%s/adapter' --switcher '%s' --max-n 2 --max-tokens 16 "
             "--kv int8", t.fx.model, t.fx.tmp, sw);
    server_launch(&t, args);
    snprintf(log, sizeof log, "%s/serve.log", t.fx.tmp);
    char *text;
    size_t n;
    cr_assert_eq(file_read_all(log, 1 << 20, &text, &n), ER_OK);
    cr_expect(strstr(text, "erinfer serve: warning: the switcher ") &&
                  strstr(text, "fitted on f32 KV cache features and runs here on int8"), "%s", text);
    er_free(text);
    server_stop(&t);
}

Test(server, pipeline_extension_and_vote_winner_first, .timeout = 120) {
    TestServer t;
    server_start(&t, 0.0f); // every query reasons
    char *out = server_post(&t, "{\"messages\": [{\"role\": \"user\", \"content\": \"What is 2 + 3?\"}], "
                                "\"n\": 4, \"temperature\": 1.0, \"seed\": 3, \"max_tokens\": 40, "
                                "\"reasoning_budget\": 6}");
    cJSON *j = cJSON_Parse(out);
    cr_assert(j, "%s", out);
    const cJSON *x = field(j, "erinfer"), *choices = field(j, "choices");
    cr_assert_str_eq(field(x, "route")->valuestring, "reasoning");
    cr_assert(cJSON_IsNumber(field(x, "switcher_score")));
    const cJSON *samples = field(x, "samples"), *order = field(x, "choice_samples");
    cr_assert_eq(cJSON_GetArraySize(samples), 4);
    cr_assert_eq(cJSON_GetArraySize(choices), 4);
    for (const cJSON *s = samples->child; s; s = s->next) {
        double v = field(s, "verifier_score")->valuedouble;
        cr_expect(v > 0 && v < 1);
        cr_expect_leq(field(s, "n_tokens")->valueint, 6 + 32, "the reasoning budget holds");
    }
    // Choice 0 is the vote's winner: its sample's answer is the winning answer, and no other answer's
    // summed verifier score beats it.
    const cJSON *answer = field(x, "answer");
    cr_assert(cJSON_IsString(answer), "no winning answer: %s", out);
    int w = cJSON_GetArrayItem(order, 0)->valueint;
    const cJSON *wa = field(cJSON_GetArrayItem(samples, w), "answer");
    cr_expect(cJSON_IsString(wa) && strcmp(wa->valuestring, answer->valuestring) == 0);
    double best = 0;
    for (const cJSON *v = field(x, "votes")->child; v; v = v->next)
        if (strcmp(field(v, "answer")->valuestring, answer->valuestring) == 0)
            best = field(v, "weight")->valuedouble;
    for (const cJSON *v = field(x, "votes")->child; v; v = v->next)
        cr_expect_leq(field(v, "weight")->valuedouble, best);
    // Each choice's text is its sample's (the order is a permutation of the samples).
    int seen = 0;
    for (const cJSON *c = order->child; c; c = c->next)
        seen |= 1 << c->valueint;
    cr_expect_eq(seen, 15);
    cJSON_Delete(j);
    free(out);

    // route "direct": the base answers, one greedy sample, whatever n asks.
    out = server_post(&t, "{\"messages\": [{\"role\": \"user\", \"content\": \"What is 2 + 3?\"}], \"n\": 3, "
                          "\"route\": \"direct\", \"max_tokens\": 8}");
    j = cJSON_Parse(out);
    cr_assert(j, "%s", out);
    cr_expect_str_eq(field(field(j, "erinfer"), "route")->valuestring, "direct");
    cr_expect_eq(cJSON_GetArraySize(field(j, "choices")), 1);
    cJSON_Delete(j);
    free(out);

    // A stream carries the extension on its last finish chunk, in sample order.
    out = server_post(&t, "{\"messages\": [{\"role\": \"user\", \"content\": \"What is 2 + 3?\"}], \"n\": 2, "
                          "\"seed\": 3, \"max_tokens\": 20, \"reasoning_budget\": 6, \"stream\": true}");
    const char *last = NULL;
    for (const char *p = strstr(out, "data: {"); p; p = strstr(p + 1, "data: {"))
        last = p;
    cr_assert(last && strstr(out, "data: [DONE]"), "%s", out);
    char *end = strstr(last, "\n\n");
    cr_assert(end);
    *end = 0;
    j = cJSON_Parse(last + 6);
    cr_assert(j, "%s", last);
    cr_expect_str_eq(field(field(j, "erinfer"), "route")->valuestring, "reasoning");
    cJSON_Delete(j);
    free(out);
    server_stop(&t);
}

// The text of choice 0 and the reported seed of a non-streamed response.
static char *reply_text(const char *out, double *seed) {
    cJSON *j = cJSON_Parse(out);
    cr_assert(j, "%s", out);
    const cJSON *m = field(cJSON_GetArrayItem(field(j, "choices"), 0), "message");
    char *text = er_strdup(field(m, "content")->valuestring);
    *seed = field(field(j, "erinfer"), "seed")->valuedouble;
    cJSON_Delete(j);
    return text;
}

// A request without a seed gets a fresh one (reported), so unseeded requests differ; sending the
// reported seed back gives the same text.
Test(server, unseeded_requests_draw_and_report_a_seed, .timeout = 120) {
    TestServer t;
    helper_fixture_open(&t.fx, "er_serve_", "erinfer");
    helper_need_program(t.fx.prog, "erinfer", "the erinfer serve seed tests");
    char args[700];
    snprintf(args, sizeof args, "--model '%s' --max-tokens 24", t.fx.model);
    server_launch(&t, args);
    const char *body = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 24}";
    double s1, s2, s3;
    // A 16-digit seed is reported digit for digit (a double printed to 15 digits would drop the last one).
    char *o0 = server_post(&t, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 2, "
                               "\"seed\": 9007199254740991}");
    cr_expect(strstr(o0, "\"seed\":9007199254740991}"), "the seed is not reported exactly: %s", o0);
    free(o0);
    // Two unseeded requests draw different seeds. Their texts may still agree by chance (the tiny base says
    // "Start with 6. Divide by 3. What is the result?" often enough), so a third one is drawn before calling
    // the texts one.
    char *o1 = server_post(&t, body), *o2 = server_post(&t, body), *o4 = server_post(&t, body);
    double s4;
    char *a = reply_text(o1, &s1), *b = reply_text(o2, &s2), *d = reply_text(o4, &s4);
    cr_expect_neq(s1, s2, "two unseeded requests got the same seed");
    cr_expect(strcmp(a, b) || strcmp(a, d), "three unseeded requests at temperature 1 gave the same text: %s", a);
    char again[256];
    snprintf(again, sizeof again, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 24, "
             "\"seed\": %.0f}", s1);
    char *o3 = server_post(&t, again), *c = reply_text(o3, &s3);
    cr_expect_eq(s3, s1);
    cr_expect_str_eq(c, a, "the reported seed does not reproduce its text");
    free(o1);
    free(o2);
    free(o3);
    free(o4);
    er_free(a);
    er_free(b);
    er_free(c);
    er_free(d);
    server_stop(&t);
}

// ---- a model that always calls a tool ----

// A bigram edge of a chain model: after the last token of `after` comes `next` (one token).
typedef struct {
    const char *after, *next;
} ChainEdge;

// dir: a tiny model that writes chains of pieces. The tokenizer is the tiny one with `pieces` as added
// tokens. The blocks add nothing (attention and MLP output projections zero), so the last hidden state is
// the current token's embedding after the final norm, and the untied LM head is a bigram table: per edge,
// row `next` gets 10 x the normalised embedding of the last token of `after`.
static void make_chain_model(const char *dir, const char *const *pieces, int n_pieces, const ChainEdge *edges,
                             int n_edges) {
    cJSON *tj;
    cr_assert_eq(json_parse_file("data/tiny_tokenizer/tokenizer.json", 1 << 24, &tj), ER_OK, "%s", er_last_error());
    cJSON *added = cJSON_GetObjectItemCaseSensitive(tj, "added_tokens");
    Tokenizer *tok;
    cr_assert_eq(tok_load(&tok, "data/tiny_tokenizer"), ER_OK);
    int base = tok_vocab_size(tok);
    tok_free(tok);
    for (int i = 0; i < n_pieces; i++) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddNumberToObject(t, "id", base + i);
        cJSON_AddStringToObject(t, "content", pieces[i]);
        cJSON_AddFalseToObject(t, "single_word");
        cJSON_AddFalseToObject(t, "lstrip");
        cJSON_AddFalseToObject(t, "rstrip");
        cJSON_AddFalseToObject(t, "normalized");
        cJSON_AddFalseToObject(t, "special");
        cJSON_AddItemToArray(added, t);
    }
    cr_assert_eq(mkdir(dir, 0755), 0);
    char *tp = path_join(dir, "tokenizer.json");
    cr_assert_eq(json_write_file(tp, tj), ER_OK, "%s", er_last_error());
    cJSON_Delete(tj);
    er_free(tp);
    helper_copy_file("data/tiny_tokenizer/tokenizer_config.json", dir, "tokenizer_config.json");
    cr_assert_eq(tok_load(&tok, dir), ER_OK, "%s", er_last_error());
    int from[16], to[16];
    cr_assert_leq(n_edges, 16);
    for (int k = 0; k < n_edges; k++) {
        int *ids, n;
        cr_assert_eq(tok_encode(tok, edges[k].after, strlen(edges[k].after), &ids, &n), ER_OK);
        from[k] = ids[n - 1];
        er_free(ids);
        cr_assert_eq(tok_encode(tok, edges[k].next, strlen(edges[k].next), &ids, &n), ER_OK);
        cr_assert_eq(n, 1, "\"%s\" is not one token", edges[k].next);
        to[k] = ids[0];
        er_free(ids);
    }
    ModelConfig c = helper_tiny_config(tok_vocab_size(tok), 4096); // room for the tools' system text
    tok_free(tok);
    c.tied = 0;
    Model m;
    cr_assert_eq(model_build_random(&m, &c, 0.5f, 3), ER_OK, "%s", er_last_error());
    const int C = c.C;
    for (int l = 0; l < c.L; l++) {
        memset((void *)m.layers[l].wo.data, 0, sizeof(float) * (size_t)C * c.NH * c.HS);
        memset((void *)m.layers[l].wdown.data, 0, sizeof(float) * (size_t)C * c.FF);
    }
    for (int i = 0; i < C; i++)
        m.norm[i] = 1.0f;
    float *head = (float *)m.lm_head.data; // (V, C)
    const float *emb = m.embed.data;      // (V, C)
    memset(head, 0, sizeof(float) * (size_t)c.V * C);
    for (int k = 0; k < n_edges; k++) {
        const float *e = emb + (size_t)from[k] * C;
        double ss = 0;
        for (int i = 0; i < C; i++)
            ss += (double)e[i] * e[i];
        float inv = (float)(1.0 / sqrt(ss / C + c.eps));
        for (int i = 0; i < C; i++)
            head[(size_t)to[k] * C + i] += 10.0f * e[i] * inv;
    }
    cr_assert_eq(model_save(&m, dir, 0), ER_OK, "%s", er_last_error());
    model_free(&m);
}

#define TOOL_CALL_JSON "{\"name\": \"add\", \"arguments\": {\"a\": 4, \"b\": 9}}"

// dir: a tiny model whose every chat answer is "<tool_call>" TOOL_CALL_JSON "</tool_call>" then <|im_end|>:
// "\n" (the end of "<|im_start|>assistant\n") -> <tool_call> -> the JSON -> </tool_call> -> <|im_end|>.
static void make_tool_model(const char *dir) {
    const char *pieces[] = {"<tool_call>", TOOL_CALL_JSON, "</tool_call>"};
    const ChainEdge edges[] = {{"<|im_start|>assistant\n", "<tool_call>"}, {"<tool_call>", TOOL_CALL_JSON},
                               {TOOL_CALL_JSON, "</tool_call>"}, {"</tool_call>", "<|im_end|>"}};
    make_chain_model(dir, pieces, 3, edges, 4);
}

// The tool-calling model's output becomes tool_calls, non-streamed and streamed; without tools it is text.
Test(server, tool_calls_parsed_and_streamed, .timeout = 120) {
    TestServer t;
    helper_fixture_open(&t.fx, "er_serve_", "erinfer");
    helper_need_program(t.fx.prog, "erinfer", "the erinfer serve tool tests");
    char model[600], args[700];
    snprintf(model, sizeof model, "%s/toolmodel", t.fx.tmp);
    make_tool_model(model);
    snprintf(args, sizeof args, "--model '%s'", model);
    server_launch(&t, args);
    const char *tools = "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"add\", \"parameters\": "
                        "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"number\"}}}}}]";
    char body[1024];
    snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"4 + 9?\"}], %s, "
             "\"temperature\": 0.7, \"max_tokens\": 16}", tools);
    char *out = server_post(&t, body);
    cJSON *j = cJSON_Parse(out);
    cr_assert(j, "%s", out);
    const cJSON *c0 = cJSON_GetArrayItem(field(j, "choices"), 0), *msg = field(c0, "message");
    cr_expect_str_eq(field(c0, "finish_reason")->valuestring, "tool_calls", "%s", out);
    cr_expect(cJSON_IsNull(field(msg, "content")), "%s", out);
    const cJSON *call = cJSON_GetArrayItem(field(msg, "tool_calls"), 0);
    cr_assert(call, "%s", out);
    cr_expect_str_eq(field(call, "type")->valuestring, "function");
    cr_expect(strncmp(field(call, "id")->valuestring, "call_", 5) == 0);
    cr_expect_str_eq(field(field(call, "function"), "name")->valuestring, "add");
    cr_expect_str_eq(field(field(call, "function"), "arguments")->valuestring, "{\"a\":4,\"b\":9}");
    cJSON_Delete(j);
    free(out);
    // Streamed: no byte of the call leaks into content; the call comes as a tool_calls delta.
    snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"4 + 9?\"}], %s, "
             "\"max_tokens\": 16, \"stream\": true}", tools);
    out = server_post(&t, body);
    cr_expect(strstr(out, "\"tool_calls\":[{\"index\":0,\"id\":\"call_") != NULL, "%s", out);
    cr_expect(strstr(out, "\"finish_reason\":\"tool_calls\"") != NULL, "%s", out);
    cr_expect(strstr(out, "<tool_call>") == NULL, "the call leaked into content: %s", out);
    free(out);
    // Without tools the same output is text.
    out = server_post(&t, "{\"messages\": [{\"role\": \"user\", \"content\": \"4 + 9?\"}], \"max_tokens\": 16}");
    j = cJSON_Parse(out);
    cr_assert(j, "%s", out);
    msg = field(cJSON_GetArrayItem(field(j, "choices"), 0), "message");
    cr_expect_str_eq(field(msg, "content")->valuestring, "<tool_call>" TOOL_CALL_JSON "</tool_call>");
    cJSON_Delete(j);
    free(out);
    server_stop(&t);
}

#define MEMORY_SEARCH_CALL "{\"name\": \"memory_search\", \"arguments\": {\"query\": \"glassblower\", \"k\": 2}}"
static void make_call_model(const char *dir, const char *call);

// The running server with real clients: scripts/serve_check.sh on $ER_BUILD's erinfer (ASan under make SAN=1).
Test(server, openai_client_curl_and_load, .timeout = 600) {
    char *prog = helper_program("erinfer");
    helper_need_program(prog, "erinfer", "the erinfer serve client tests");
    need_serve(prog);
    char *tmp = helper_tmpdir("er_serve_tools_"), *model = path_join(tmp, "model"), *mem = path_join(tmp, "mem");
    char cmd[1400];
    make_tool_model(model);
    make_call_model(mem, MEMORY_SEARCH_CALL);
    snprintf(cmd, sizeof cmd, "TOOL_MODEL='%s' MEMORY_MODEL='%s' bash scripts/serve_check.sh 1>&2", model, mem);
    int st = system(cmd);
    helper_rmdir(tmp);
    er_free(model);
    er_free(mem);
    er_free(tmp);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77)
        cr_skip_test("!!!!!! node / npm / curl or the openai package unavailable: erinfer serve's client tests are "
                     "SKIPPED !!!!!!");
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "scripts/serve_check.sh failed (status %d, see its output)", st);
    er_free(prog);
}

// ---- tool_choice "required" and a named function: the call's start is forced ----

#define FORCED_REQUIRED "<tool_call>\n"
#define FORCED_NAMED(name) "<tool_call>\n{\"name\": \"" name "\", \"arguments\":"
#define CHOICE_TOOLS "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"add\"}}, {\"type\": " \
                     "\"function\", \"function\": {\"name\": \"noop\"}}, {\"type\": \"function\", \"function\": " \
                     "{\"name\": \"a\\\"b\"}}]"
#define CHOICE_USER "{\"messages\": [{\"role\": \"user\", \"content\": \"4 + 9?\"}]"

// The forced bytes are those the real templates write for a call (jinja2 renders tools_request(1)'s
// assistant turn): the named prefix is followed there by the arguments' " {".
Test(server, tool_choice_forces_the_templates_call_start) {
    Tokenizer *tok;
    cr_assert_eq(tok_load(&tok, "data/tiny_tokenizer"), ER_OK, "%s", er_last_error());
    static const struct {
        const char *choice, *prefix; // prefix NULL: nothing forced
        int tools;
    } cases[] = {
        {"\"required\"", FORCED_REQUIRED, 1},
        {"{\"type\": \"function\", \"function\": {\"name\": \"noop\"}}", FORCED_NAMED("noop"), 1},
        {"{\"type\": \"function\", \"function\": {\"name\": \"a\\\"b\"}}", FORCED_NAMED("a\\\"b"), 1}, // JSON-escaped
        {"\"auto\"", NULL, 1},
        {"null", NULL, 1},
        {"\"none\"", NULL, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char body[1024];
        snprintf(body, sizeof body, CHOICE_USER ", " CHOICE_TOOLS ", \"tool_choice\": %s}", cases[i].choice);
        ServeRequest r;
        ServeError e;
        cr_assert_eq(serve_parse_request(body, strlen(body), 1, CHAT_QWEN25, tok, &test_limits, &r, &e), 0, "%s: %s",
                     cases[i].choice, e.message);
        cr_expect_eq(r.tools, cases[i].tools, "%s", cases[i].choice);
        if (cases[i].prefix) {
            cr_expect_str_eq(r.tool_prefix, cases[i].prefix, "%s", cases[i].choice);
            cr_expect(r.p.response_prefix == r.tool_prefix, "%s: the prefix is not forced", cases[i].choice);
        } else {
            cr_expect(!r.tool_prefix && !r.p.response_prefix, "%s forces something", cases[i].choice);
        }
        serve_request_free(&r);
    }
    tok_free(tok);
    const char *body = tools_request(1);
    char path[256], args[512];
    helper_write_tmp(path, sizeof path, "server_choice", ".json", body);
    for (int k = 0; k < 2; k++) {
        snprintf(args, sizeof args, "scripts/chat_tools_golden.py %s %s", k ? "qwen3" : "qwen25", path);
        char *want = python_out(args);
        cr_expect(strstr(want, FORCED_REQUIRED "{\"name\": \"add\"") != NULL, "%s", want);
        cr_expect(strstr(want, FORCED_NAMED("add") " {\"a\": 4") != NULL, "%s", want);
        cr_expect(strstr(want, FORCED_NAMED("noop") " {}") != NULL, "%s", want);
        free(want);
    }
    remove(path);
}

Test(server, bad_tool_choice_is_refused) {
    Tokenizer *tok;
    cr_assert_eq(tok_load(&tok, "data/tiny_tokenizer"), ER_OK, "%s", er_last_error());
    static const struct {
        const char *rest; // after CHOICE_USER
        int routed;
    } cases[] = {
        {", \"tool_choice\": \"required\"}", 0},                                             // no tools
        {", \"tools\": [], \"tool_choice\": \"required\"}", 0},                              // no tools
        {", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"add\"}}}", 0}, // no tools
        {", " CHOICE_TOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"mul\"}}}", 0},
        {", " CHOICE_TOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"\"}}}", 0},
        {", " CHOICE_TOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": 3}}}", 0},
        {", " CHOICE_TOOLS ", \"tool_choice\": {\"type\": \"function\"}}", 0},
        {", " CHOICE_TOOLS ", \"tool_choice\": {\"type\": \"code\", \"function\": {\"name\": \"add\"}}}", 0},
        {", " CHOICE_TOOLS ", \"tool_choice\": {\"function\": {\"name\": \"add\"}}}", 0},
        {", " CHOICE_TOOLS ", \"tool_choice\": \"always\"}", 0},
        {", " CHOICE_TOOLS ", \"tool_choice\": 1}", 0},
        {", " CHOICE_TOOLS ", \"tool_choice\": [\"required\"]}", 0},
        {", " CHOICE_TOOLS ", \"tool_choice\": \"required\", \"reasoning_budget\": 8}", 0}, // suffix in the call
        {", " CHOICE_TOOLS ", \"tool_choice\": \"required\"}", 1}, // an adapter or heads: the route decides
        {", " CHOICE_TOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"add\"}}}", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char body[1024];
        snprintf(body, sizeof body, CHOICE_USER "%s", cases[i].rest);
        ServeLimits lim = test_limits;
        lim.adapter = lim.routed = cases[i].routed;
        ServeRequest r;
        ServeError e;
        cr_expect_eq(serve_parse_request(body, strlen(body), 1, CHAT_QWEN25, tok, &lim, &r, &e), -1, "accepted: %s",
                     body);
        cr_expect_eq(e.status, 400, "%s", body);
        cr_expect_str_eq(e.param, "tool_choice", "%s", body);
        cr_expect(e.message[0] && !strchr(e.message, '/'), "%s: \"%s\"", body, e.message);
    }
    // "auto" and "none" stay accepted with an adapter or heads (nothing is forced).
    ServeLimits lim = test_limits;
    lim.adapter = lim.routed = 1;
    const char *autob = CHOICE_USER ", " CHOICE_TOOLS ", \"tool_choice\": \"auto\"}";
    ServeRequest r;
    ServeError e;
    cr_expect_eq(serve_parse_request(autob, strlen(autob), 1, CHAT_QWEN25, tok, &lim, &r, &e), 0, "%s", e.message);
    serve_request_free(&r);
    tok_free(tok);
}

// Choice 0 of a response as one string: finish reason, the invalid_tool_call flag, content and each call's
// name(arguments); a stream's chunks joined (content deltas, tool_calls deltas, the finish chunk), so a
// streamed and a non-streamed response compare as strings.
static char *choice_summary(const char *out, int stream) {
    StrBuf content = {0}, calls = {0}, s = {0};
    strbuf_puts(&content, "");
    strbuf_puts(&calls, "");
    const char *finish = "?";
    int invalid = 0;
    cJSON *keep[64];
    int n_keep = 0;
    for (const char *p = stream ? strstr(out, "data: {") : out; p; p = stream ? strstr(p + 1, "data: {") : NULL) {
        const char *at = stream ? p + 6 : p, *end = stream ? strstr(at, "\n\n") : at + strlen(at);
        cr_assert(end, "%s", out);
        cJSON *j = cJSON_ParseWithLength(at, (size_t)(end - at));
        cr_assert(j && n_keep < 64, "%s", out);
        keep[n_keep++] = j;
        const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
        if (!c)
            continue;
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(c, stream ? "delta" : "message");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(m, "content"), *call;
        if (cJSON_IsString(text))
            strbuf_puts(&content, text->valuestring);
        cJSON_ArrayForEach(call, cJSON_GetObjectItemCaseSensitive(m, "tool_calls")) {
            const cJSON *f = field(call, "function");
            strbuf_puts(&calls, field(f, "name")->valuestring);
            strbuf_puts(&calls, "(");
            strbuf_puts(&calls, field(f, "arguments")->valuestring);
            strbuf_puts(&calls, ")");
        }
        const cJSON *fr = cJSON_GetObjectItemCaseSensitive(c, "finish_reason");
        if (cJSON_IsString(fr))
            finish = fr->valuestring;
        invalid |= cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "invalid_tool_call"));
    }
    strbuf_puts(&s, finish);
    strbuf_puts(&s, invalid ? " invalid_tool_call\n" : "\n");
    strbuf_puts(&s, content.p);
    strbuf_puts(&s, "\n");
    strbuf_puts(&s, calls.p);
    for (int k = 0; k < n_keep; k++)
        cJSON_Delete(keep[k]);
    er_free(content.p);
    er_free(calls.p);
    return s.p;
}

// Posts the request non-streamed and streamed (`rest` ends the body after CHOICE_USER), expects the
// same choice both ways and returns its summary.
static char *post_both(const TestServer *t, const char *rest) {
    char body[2048];
    snprintf(body, sizeof body, CHOICE_USER ", \"seed\": 5, \"max_tokens\": 24%s", rest);
    char *out = server_post(t, body), *a = choice_summary(out, 0);
    free(out);
    snprintf(body, sizeof body, CHOICE_USER ", \"seed\": 5, \"max_tokens\": 24, \"stream\": true%s", rest);
    out = server_post(t, body);
    char *b = choice_summary(out, 1);
    cr_expect(strstr(out, "data: [DONE]"), "%s", out);
    free(out);
    cr_expect_str_eq(b, a, "streamed and non-streamed differ for %s", rest);
    er_free(b);
    return a;
}

// POSTs body to /v1/chat/completions; the HTTP status, the error's param in *param (free with er_free).
static int post_status_at(const TestServer *t, const char *url, const char *body, char **param) {
    char path[600], cmd[1024];
    snprintf(path, sizeof path, "%s/body.json", t->fx.tmp);
    cr_assert_eq(file_write_atomic(path, body, strlen(body)), ER_OK);
    snprintf(cmd, sizeof cmd, "curl -s -w '\\n%%{http_code}' http://127.0.0.1:%d%s "
             "-H 'Content-Type: application/json' -d @'%s'",
             t->port, url, path);
    int st;
    char *out = run_capture(cmd, &st);
    cr_assert_eq(st, 0, "curl failed: %s", out);
    char *nl = strrchr(out, '\n');
    cr_assert(nl, "%s", out);
    int status = atoi(nl + 1);
    *nl = 0;
    cJSON *j = cJSON_Parse(out);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "error"), "param");
    *param = er_strdup(cJSON_IsString(p) ? p->valuestring : "");
    cJSON_Delete(j);
    free(out);
    return status;
}

static int post_status(const TestServer *t, const char *body, char **param) {
    return post_status_at(t, "/v1/chat/completions", body, param);
}

static void expect_refused(const TestServer *t, const char *body) {
    char *param;
    cr_expect_eq(post_status(t, body, &param), 400, "%s", body);
    cr_expect_str_eq(param, "tool_choice", "%s", body);
    er_free(param);
}

#define ARGS_JSON "{\"a\": 4, \"b\": 9}"

// A model that never calls a tool by itself but writes a call's rest when its start is forced: after the
// generation prompt's "\n" it writes the JSON of add(4, 9) and "</tool_call>" without the opening tag
// (plain text); after the forced "<tool_call>\n" that is the whole call; after a named prefix's
// "arguments": it writes " " ARGS_JSON "}\n</tool_call>".
static void make_forced_call_model(const char *dir) {
    const char *full = "{\"name\": \"add\", \"arguments\": " ARGS_JSON "}\n", *args = " " ARGS_JSON "}\n";
    const char *pieces[] = {full, args, "</tool_call>"};
    const ChainEdge edges[] = {{"<|im_start|>assistant\n", full}, {FORCED_NAMED("noop"), args},
                               {full, "</tool_call>"}, {args, "</tool_call>"}, {"</tool_call>", "<|im_end|>"}};
    make_chain_model(dir, pieces, 3, edges, 5);
}

// A server on the model make() writes into the fixture (make NULL: the fixture's random model).
static void launch_model(TestServer *t, void (*make)(const char *dir)) {
    helper_fixture_open(&t->fx, "er_serve_", "erinfer");
    helper_need_program(t->fx.prog, "erinfer", "the erinfer serve tool_choice tests");
    char model[600], args[700];
    snprintf(model, sizeof model, "%s/chainmodel", t->fx.tmp);
    if (make)
        make(model);
    snprintf(args, sizeof args, "--model '%s' --max-tokens 64", make ? model : t->fx.model);
    server_launch(t, args);
}

// "required" and a named function yield that call, streamed and not, on a model that never calls by itself;
// "auto" leaves it to the model; bad values are HTTP 400 naming tool_choice.
Test(server, tool_choice_enforced_on_a_model_that_never_calls, .timeout = 120) {
    TestServer t;
    launch_model(&t, make_forced_call_model);
    char *s = post_both(&t, ", " CHOICE_TOOLS "}");
    cr_expect_str_eq(s, "stop\n{\"name\": \"add\", \"arguments\": " ARGS_JSON "}\n</tool_call>\n");
    er_free(s);
    s = post_both(&t, ", " CHOICE_TOOLS ", \"tool_choice\": \"auto\"}");
    cr_expect_str_eq(s, "stop\n{\"name\": \"add\", \"arguments\": " ARGS_JSON "}\n</tool_call>\n");
    er_free(s);
    s = post_both(&t, ", " CHOICE_TOOLS ", \"tool_choice\": \"required\"}");
    cr_expect_str_eq(s, "tool_calls\n\nadd({\"a\":4,\"b\":9})");
    er_free(s);
    s = post_both(&t, ", " CHOICE_TOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": "
                      "\"noop\"}}}");
    cr_expect_str_eq(s, "tool_calls\n\nnoop({\"a\":4,\"b\":9})");
    er_free(s);
    // n = 2: every sample starts with the forced bytes.
    char *out = server_post(&t, CHOICE_USER ", " CHOICE_TOOLS ", \"tool_choice\": \"required\", \"n\": 2, "
                                "\"max_tokens\": 24}");
    cJSON *j = cJSON_Parse(out);
    cr_assert(j, "%s", out);
    const cJSON *c;
    cJSON_ArrayForEach(c, field(j, "choices")) {
        cr_expect_str_eq(field(c, "finish_reason")->valuestring, "tool_calls", "%s", out);
        const cJSON *call = cJSON_GetArrayItem(field(field(c, "message"), "tool_calls"), 0);
        cr_expect(call && strcmp(field(field(call, "function"), "name")->valuestring, "add") == 0, "%s", out);
    }
    cJSON_Delete(j);
    free(out);
    expect_refused(&t, CHOICE_USER ", \"tool_choice\": \"required\"}");
    expect_refused(&t, CHOICE_USER ", " CHOICE_TOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": "
                                   "{\"name\": \"mul\"}}}");
    expect_refused(&t, CHOICE_USER ", " CHOICE_TOOLS ", \"tool_choice\": \"sometimes\"}");
    server_stop(&t);
}

// Where the model's own continuation is no call, the forced start and what follows come back as content
// flagged invalid_tool_call, the same streamed and not. The always-calling model writes its own
// "<tool_call>" after the forced one, and a named start is followed by whatever its bigram table gives.
Test(server, tool_choice_on_the_always_calling_model, .timeout = 120) {
    TestServer t;
    launch_model(&t, make_tool_model);
    char *s = post_both(&t, ", " CHOICE_TOOLS ", \"tool_choice\": \"required\"}");
    cr_expect_str_eq(s, "stop invalid_tool_call\n" FORCED_REQUIRED "<tool_call>" TOOL_CALL_JSON "</tool_call>\n");
    er_free(s);
    s = post_both(&t, ", " CHOICE_TOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": "
                      "\"add\"}}}");
    cr_expect(strstr(s, " invalid_tool_call\n" FORCED_NAMED("add")) != NULL, "%s", s);
    er_free(s);
    server_stop(&t);
}

// The random fixture model writes random tokens after the forced start (a random continuation that
// closed a valid call would be parsed; it does not at this seed).
Test(server, tool_choice_on_a_random_model, .timeout = 120) {
    TestServer t;
    launch_model(&t, NULL);
    const char *rest[] = {", " CHOICE_TOOLS ", \"tool_choice\": \"required\"}",
                          ", " CHOICE_TOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": "
                          "\"noop\"}}}"};
    const char *start[] = {FORCED_REQUIRED, FORCED_NAMED("noop")};
    for (int k = 0; k < 2; k++) {
        char *s = post_both(&t, rest[k]), want[128];
        snprintf(want, sizeof want, " invalid_tool_call\n%s", start[k]);
        cr_expect(strstr(s, want) != NULL, "%s", s);
        er_free(s);
    }
    server_stop(&t);
}

// With an adapter and heads the route decides how an answer starts: forcing is refused, "auto" served.
Test(server, tool_choice_refused_on_a_routed_server, .timeout = 120) {
    TestServer t;
    server_start(&t, 0.0f);
    expect_refused(&t, CHOICE_USER ", " CHOICE_TOOLS ", \"tool_choice\": \"required\", \"max_tokens\": 8}");
    char *param;
    cr_expect_eq(post_status(&t, CHOICE_USER ", " CHOICE_TOOLS ", \"tool_choice\": \"auto\", \"max_tokens\": 8}",
                             &param), 200);
    er_free(param);
    server_stop(&t);
}

// The forced start takes context positions: without max_tokens the answer gets what is left after it,
// and a max_tokens that does not fit with it is refused.
Test(server, tool_choice_forced_start_counts_in_the_context) {
    Tokenizer *tok;
    cr_assert_eq(tok_load(&tok, "data/tiny_tokenizer"), ER_OK, "%s", er_last_error());
    const char *autob = CHOICE_USER ", " CHOICE_TOOLS "}";
    const char *req = CHOICE_USER ", " CHOICE_TOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": "
                      "{\"name\": \"add\"}}}";
    ServeRequest r;
    ServeError e;
    cr_assert_eq(serve_parse_request(autob, strlen(autob), 1, CHAT_QWEN25, tok, &test_limits, &r, &e), 0, "%s",
                 e.message);
    int prompt = r.prompt_tokens, *ids, forced;
    serve_request_free(&r);
    cr_assert_eq(tok_encode(tok, FORCED_NAMED("add"), strlen(FORCED_NAMED("add")), &ids, &forced), ER_OK);
    er_free(ids);
    cr_assert_gt(forced, 1);
    ServeLimits lim = test_limits;
    lim.context = prompt + forced + 10;
    cr_assert_eq(serve_parse_request(req, strlen(req), 1, CHAT_QWEN25, tok, &lim, &r, &e), 0, "%s", e.message);
    cr_expect_eq(r.p.max_new_tokens, 10);
    serve_request_free(&r);
    char body[1024];
    snprintf(body, sizeof body, "%.*s, \"max_tokens\": 11}", (int)strlen(req) - 1, req);
    cr_expect_eq(serve_parse_request(body, strlen(body), 1, CHAT_QWEN25, tok, &lim, &r, &e), -1, "%s", body);
    cr_expect(strstr(e.message, "forced tool call start included"), "%s", e.message);
    tok_free(tok);
}

// 1 when the tokens of `prefix` are the first tokens of `text` (the real tokenizer's own split of the call).
static int tokens_prefix(const Tokenizer *tok, const char *prefix, const char *text) {
    int *a, *b, na, nb;
    cr_assert_eq(tok_encode(tok, prefix, strlen(prefix), &a, &na), ER_OK);
    cr_assert_eq(tok_encode(tok, text, strlen(text), &b, &nb), ER_OK);
    int same = na <= nb && memcmp(a, b, sizeof(int) * (size_t)na) == 0;
    er_free(a);
    er_free(b);
    return same;
}

// With the real Qwen tokenizer the forced start ends on a token boundary of the call the template writes,
// so the model continues with the tokens it was trained on; with the space after "arguments": it would not
// (the call's next token is " {\"").
Test(server, tool_choice_forced_start_ends_on_a_qwen_token_boundary) {
    const char *fx = getenv("ER_FIXTURES");
    char *dir = path_join(fx && *fx ? fx : "../shared/fixtures", "qwen-tokenizer");
    char *tj = path_join(dir, "tokenizer.json");
    if (!path_exists(tj))
        cr_skip_test("!!!!!! %s is MISSING (set ER_FIXTURES): the token boundary check is SKIPPED !!!!!!", tj);
    Tokenizer *tok;
    cr_assert_eq(tok_load(&tok, dir), ER_OK, "%s", er_last_error());
    const char *call = FORCED_NAMED("get_weather") " {\"city\": \"Paris\"}}\n</tool_call>";
    cr_expect(tokens_prefix(tok, FORCED_REQUIRED, call));
    cr_expect(tokens_prefix(tok, FORCED_NAMED("get_weather"), call));
    cr_expect(!tokens_prefix(tok, FORCED_NAMED("get_weather") " ", call), "the space is a token of its own here");
    int *ids, n;
    cr_assert_eq(tok_encode(tok, "<tool_call>", 11, &ids, &n), ER_OK);
    cr_expect_eq(n, 1, "<tool_call> is one (added) token");
    er_free(ids);
    tok_free(tok);
    er_free(tj);
    er_free(dir);
}

// ---- the HTTP layer: slow clients, cross-site requests, the API key ----

// A bounded slowloris on 127.0.0.1 (scripts/serve_slowloris.py: 300 connections dribbling header lines and
// 20 dribbling a body, for about 15 s) against a server with room for 4 x (4 + 1) + 256 = 276 connections, a
// quarter of them per address: at most 69 stay open, /health, a chat request and a slow but timely client
// are answered during the attack, and every attacking connection is closed at its request's deadline
// although it never stops sending.
Test(server, slowloris_cannot_hold_the_server, .timeout = 120) {
    TestServer t;
    helper_fixture_open(&t.fx, "er_serve_", "erinfer");
    helper_need_program(t.fx.prog, "erinfer", "the erinfer serve slowloris test");
    char args[700], cmd[256];
    snprintf(args, sizeof args, "--model '%s' --max-tokens 16 --queue 4", t.fx.model);
    server_launch(&t, args);
    snprintf(cmd, sizeof cmd, "python3 scripts/serve_slowloris.py %d --conns 300 --per-address 69 1>&2", t.port);
    int st = system(cmd);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
        cr_skip_test("!!!!!! python3 is not installed: the slowloris test is SKIPPED !!!!!!");
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the server did not hold up under the slowloris (see above)");
    server_stop(&t);
}

// curl with `args` (the URL included): the HTTP status, the response's headers and body in *out (free).
static int curl_run(const char *args, char **out) {
    char cmd[12288 + 64];
    snprintf(cmd, sizeof cmd, "curl -s -D - -w '\\n%%{http_code}' %s", args);
    int st;
    char *o = run_capture(cmd, &st);
    if (st == 127)
        cr_skip_test("!!!!!! curl is not installed: the erinfer serve HTTP tests are SKIPPED !!!!!!");
    cr_assert_eq(st, 0, "curl failed: %s", o);
    char *nl = strrchr(o, '\n');
    cr_assert(nl, "%s", o);
    int status = atoi(nl + 1);
    *nl = 0;
    *out = o;
    return status;
}

// Expects status `want` for curl `args` on the server (the path and options follow the base URL's
// "http://127.0.0.1:PORT"), and each of the NULL-terminated strings in the answer.
static void expect_http(const TestServer *t, int want, const char *args, ...) {
    char full[12288];
    snprintf(full, sizeof full, "http://127.0.0.1:%d%s", t->port, args);
    char *out;
    int got = curl_run(full, &out);
    cr_expect_eq(got, want, "%s -> %d, expected %d: %.300s", args, got, want, out);
    va_list ap;
    va_start(ap, args);
    for (const char *s; (s = va_arg(ap, const char *));)
        cr_expect(strstr(out, s), "%.200s: no \"%s\" in %.400s", args, s, out);
    va_end(ap);
    // No permissive CORS: a browser must not let another site's page read any answer.
    cr_expect(!strcasestr(out, "Access-Control-Allow"), "%.200s: CORS headers in %.400s", args, out);
    free(out);
}

#define CHAT_JSON "-d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 2}'"
#define CHAT_URL "/v1/chat/completions " CHAT_JSON

// A POST body must be declared JSON (a browser sends a cross-site form or text/plain request without a
// preflight, never application/json); the Host must be one of the server's (DNS rebinding); no answer
// carries CORS headers; a URL over 8 KiB is a JSON 414.
Test(server, cross_site_requests_are_refused, .timeout = 120) {
    TestServer t;
    helper_fixture_open(&t.fx, "er_serve_", "erinfer");
    helper_need_program(t.fx.prog, "erinfer", "the erinfer serve header tests");
    char args[700];
    snprintf(args, sizeof args, "--model '%s' --max-tokens 8 --allowed-hosts 'api.example.test, other.test'",
             t.fx.model);
    server_launch(&t, args);
    const char *json = " -H 'Content-Type: application/json'";
    char a[1024];
    // curl -d sends application/x-www-form-urlencoded, the type of a cross-site form.
    expect_http(&t, 415, CHAT_URL, "unsupported_media_type", "application/x-www-form-urlencoded", NULL);
    expect_http(&t, 415, CHAT_URL " -H 'Content-Type: text/plain'", "text/plain", NULL);
    expect_http(&t, 415, CHAT_URL " -H 'Content-Type: application/json; charset=latin1'", "charset=latin1", NULL);
    expect_http(&t, 415, CHAT_URL " -H 'Content-Type: application/jsonp'", NULL);
    expect_http(&t, 415, CHAT_URL " -H 'Content-Type:'", "no Content-Type header", NULL);
    expect_http(&t, 200, CHAT_URL " -H 'Content-Type: application/json; charset=utf-8'", "chat.completion", NULL);
    expect_http(&t, 200, CHAT_URL " -H 'Content-Type: Application/JSON ; Charset=\"UTF-8\"'", NULL);
    expect_http(&t, 200, "/v1/completions -H 'Content-Type: application/json' -d '{\"prompt\": \"Hi\", "
                "\"max_tokens\": 2}'", NULL);
    // Host: the server's own names and address, and the list's, any port; nothing else.
    static const char *const good[] = {"localhost", "LocalHost:1", "127.0.0.1", "[::1]:8080", "api.example.test:8443",
                                       "API.Example.Test", "other.test"};
    static const char *const bad[] = {"evil.example", "evil.example:80", "api.example.test.evil.example",
                                      "localhost.evil.example", "example.test", "127.0.0.2", "a b"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        snprintf(a, sizeof a, "/health -H 'Host: %s'", good[i]);
        expect_http(&t, 200, a, NULL);
    }
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(a, sizeof a, "/health -H 'Host: %s'", bad[i]);
        expect_http(&t, 403, a, "host_not_allowed", NULL);
        snprintf(a, sizeof a, CHAT_URL "%s -H 'Host: %s'", json, bad[i]);
        expect_http(&t, 403, a, "host_not_allowed", NULL);
    }
    expect_http(&t, 403, "/health --http1.0 -H 'Host:'", "(none)", NULL);
    // Another site's page: answered as any client (a JSON POST needs a preflight, refused), but without CORS
    // headers the browser keeps the answer from the page.
    snprintf(a, sizeof a, CHAT_URL "%s -H 'Origin: http://evil.example'", json);
    expect_http(&t, 200, a, NULL);
    expect_http(&t, 405, "/v1/chat/completions -X OPTIONS -H 'Origin: http://evil.example' "
                "-H 'Access-Control-Request-Method: POST' -H 'Access-Control-Request-Headers: content-type'", NULL);
    // A URL over 8 KiB: a JSON 414, path or query.
    StrBuf u = {0};
    strbuf_puts(&u, "/health?x=");
    for (int i = 0; i < 9000; i++)
        strbuf_puts(&u, "a");
    expect_http(&t, 414, u.p, "uri_too_long", NULL);
    u.p[1] = 'v', u.p[7] = '/'; // "/vealth/x=aaa...": a long path
    expect_http(&t, 414, u.p, "uri_too_long", NULL);
    er_free(u.p);
    server_stop(&t);
}

Test(server, content_type_and_host_checks) {
    cr_expect(serve_content_type_ok("application/json"));
    cr_expect(serve_content_type_ok("  APPLICATION/JSON;charset=utf8"));
    cr_expect(serve_content_type_ok("application/json; charset=\"utf-8\"; foo=bar"));
    cr_expect(!serve_content_type_ok(NULL));
    cr_expect(!serve_content_type_ok("application/json5"));
    cr_expect(!serve_content_type_ok("text/json"));
    cr_expect(!serve_content_type_ok("application/json; charset=utf-16"));
    cr_expect(!serve_content_type_ok("application/json; charset"));
    cr_expect(!serve_content_type_ok("application/json, text/plain"));
    ServeHosts hs;
    cr_assert_eq(serve_hosts_init(&hs, NULL, 1), ER_OK);
    cr_expect(serve_host_allowed("localhost:8080", &hs, "127.0.0.1"));
    cr_expect(serve_host_allowed("10.1.2.3:8080", &hs, "10.1.2.3"), "the connection's own address");
    cr_expect(!serve_host_allowed("10.1.2.3:8080", &hs, "10.1.2.4"));
    cr_expect(!serve_host_allowed("localhost:", &hs, NULL), "an empty port");
    cr_expect(!serve_host_allowed("localhost:80x", &hs, NULL));
    cr_expect(!serve_host_allowed("[::1", &hs, NULL));
    cr_expect(!serve_host_allowed(NULL, &hs, "127.0.0.1"));
    serve_hosts_free(&hs);
    cr_assert_eq(serve_hosts_init(&hs, " a.test ,B.test,*", 0), ER_OK);
    cr_expect(hs.any && hs.n == 2 && strcmp(hs.names[1], "b.test") == 0);
    cr_expect(serve_host_allowed("anything", &hs, NULL) && serve_host_allowed(NULL, &hs, NULL));
    serve_hosts_free(&hs);
    static const char *const bad[] = {"a.test:80", "", "a,,b", "a b", "http://a"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_expect_eq(serve_hosts_init(&hs, bad[i], 1), ER_EINVAL, "--allowed-hosts \"%s\" accepted", bad[i]);
        cr_expect(strstr(er_last_error(), "--allowed-hosts"), "%s", er_last_error());
    }
}

// erinfer serve with `args` run to its failure at start: its exit status, stderr in *err (free).
static int serve_fails(const TestServer *t, const char *args, char **err) {
    char cmd[1600];
    snprintf(cmd, sizeof cmd, "timeout 60 '%s' serve --model '%s' --port 0 %s 2>&1 >/dev/null", t->fx.prog,
             t->fx.model, args);
    int st;
    *err = run_capture(cmd, &st);
    return st;
}

// The status of GET /v1/models with the key (NULL: none).
static int models_status(const TestServer *t, const char *key) {
    char a[512], *out;
    snprintf(a, sizeof a, "http://127.0.0.1:%d/v1/models %s%s%s", t->port, key ? "-H 'Authorization: Bearer " : "",
             key ? key : "", key ? "'" : "");
    int st = curl_run(a, &out);
    free(out);
    return st;
}

// The key out of ps's sight: --api-key-file (its first line, the line end cut) or ERINFER_API_KEY, which
// either flag overrides; both flags at once, an empty or unreadable file and an empty variable are refused
// at start with a line naming them.
Test(server, api_key_from_a_file_or_the_environment, .timeout = 120) {
    TestServer t;
    helper_fixture_open(&t.fx, "er_serve_", "erinfer");
    helper_need_program(t.fx.prog, "erinfer", "the erinfer serve API key tests");
    need_serve(t.fx.prog);
    char file[600], args[1400], *err;
    snprintf(file, sizeof file, "%s/key.txt", t.fx.tmp);
    cr_assert_eq(file_write_atomic(file, "file-key-123\r\nsecond line\n", 27), ER_OK);
    setenv("ERINFER_API_KEY", "env-key-456", 1);
    snprintf(args, sizeof args, "--model '%s' --max-tokens 8 --api-key-file '%s'", t.fx.model, file);
    server_launch(&t, args);
    cr_expect_eq(models_status(&t, "file-key-123"), 200);
    cr_expect_eq(models_status(&t, "env-key-456"), 401, "the file's key goes before the environment's");
    cr_expect_eq(models_status(&t, NULL), 401);
    char proc[64], cmdline[4096];
    snprintf(proc, sizeof proc, "/proc/%d/cmdline", (int)t.pid);
    FILE *pf = fopen(proc, "rb"); // what ps shows
    cr_assert(pf);
    size_t n = fread(cmdline, 1, sizeof cmdline - 1, pf);
    fclose(pf);
    for (size_t i = 0; i < n; i++)
        cmdline[i] = cmdline[i] ? cmdline[i] : ' ';
    cmdline[n] = 0;
    cr_expect(!strstr(cmdline, "file-key-123") && strstr(cmdline, "key.txt"), "%s", cmdline);
    kill(t.pid, SIGTERM);
    waitpid(t.pid, NULL, 0);
    snprintf(args, sizeof args, "--model '%s' --max-tokens 8", t.fx.model);
    server_launch(&t, args);
    cr_expect_eq(models_status(&t, "env-key-456"), 200);
    cr_expect_eq(models_status(&t, "file-key-123"), 401);
    kill(t.pid, SIGTERM);
    waitpid(t.pid, NULL, 0);
    snprintf(args, sizeof args, "--api-key-file '%s' --api-key x", file);
    cr_expect_neq(serve_fails(&t, args, &err), 0);
    cr_expect(strstr(err, "not both"), "%s", err);
    free(err);
    snprintf(file, sizeof file, "%s/empty.txt", t.fx.tmp);
    cr_assert_eq(file_write_atomic(file, "\nkey on the second line\n", 24), ER_OK);
    snprintf(args, sizeof args, "--api-key-file '%s'", file);
    cr_expect_neq(serve_fails(&t, args, &err), 0);
    cr_expect(strstr(err, "empty.txt: the first line (the API key) is empty"), "%s", err);
    free(err);
    cr_expect_neq(serve_fails(&t, "--api-key-file /nonexistent/key", &err), 0);
    cr_expect(strstr(err, "/nonexistent/key: cannot open"), "%s", err);
    free(err);
    setenv("ERINFER_API_KEY", "", 1);
    cr_expect_neq(serve_fails(&t, "", &err), 0);
    cr_expect(strstr(err, "ERINFER_API_KEY must not be empty"), "%s", err);
    free(err);
    unsetenv("ERINFER_API_KEY");
    helper_fixture_close(&t.fx);
}

// ---- logprobs ----

// The JSON array of n ints as text appended to b.
static void put_ints(StrBuf *b, const int *v, int n) {
    for (int i = 0; i < n; i++) {
        if (i)
            strbuf_puts(b, ", ");
        strbuf_int(b, v[i]);
    }
}

// The sampler's log-probs, the drawn token's and the top k's, are log softmax of the raw logits (temperature
// 1, no filter) whatever it samples with: each within 1e-6 of a log-softmax recomputed in double, the top k
// the k largest logits (ties: the lower id) most probable first, the drawn token's entry among them bitwise its
// own log-prob.
Test(server, sampler_logprobs_are_the_log_softmax) {
    enum { V = 1000, K = ER_TOP_LOGPROBS_MAX };
    static float logits[V];
    ErRng rng;
    rng_seed(&rng, 11);
    for (int i = 0; i < V; i++)
        logits[i] = i % 97 == 5 ? -INFINITY : (float)(rng_uniform_f64(&rng) * 16 - 8);
    logits[17] = logits[18] = logits[400] = 9.5f; // ties at the top
    double m = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++)
        m = logits[i] > m ? logits[i] : m;
    for (int i = 0; i < V; i++)
        sum += exp((double)logits[i] - m);
    double lse = m + log(sum);
    int order[V];
    for (int i = 0; i < V; i++) // the ids by logit, most probable first, ties by id (insertion sort: stable)
        for (int j = order[i] = i; j > 0 && logits[order[j]] > logits[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    Sampler s;
    cr_assert_eq(sampler_init(&s, V), ER_OK);
    const SamplerParams params[] = {{1, 0, 1, 0}, {0.8f, 20, 0.9f, 0}, {0, 0, 1, 0}, {1.3f, 0, 1, 0.05f}};
    for (size_t c = 0; c < sizeof params / sizeof *params; c++)
        for (int draw = 0; draw < 50; draw++) {
            int tok, ids[K];
            float lp, tl[K];
            cr_assert_eq(sampler_sample(&s, &params[c], logits, &rng, &tok, &lp), ER_OK);
            cr_assert_eq(sampler_top_logprobs(&s, logits, K, ids, tl), ER_OK);
            cr_expect_leq(fabs(lp - ((double)logits[tok] - lse)), 1e-6, "params %zu: token %d", c, tok);
            for (int j = 0; j < K; j++) {
                cr_expect_eq(ids[j], order[j], "params %zu: top %d is %d, expected %d", c, j, ids[j], order[j]);
                cr_expect_leq(fabs(tl[j] - ((double)logits[ids[j]] - lse)), 1e-6);
                if (ids[j] == tok)
                    cr_expect_eq(tl[j], lp, "the drawn token's two log-probs differ");
            }
        }
    int ids[1];
    float tl[1];
    cr_expect_eq(sampler_top_logprobs(&s, logits, V + 1, ids, tl), ER_EINVAL);
    sampler_free(&s);
}

// The log-probs an ErBatch reports (what the server streams and returns) are the model's own: log softmax
// of the raw logits, whatever the sampling parameters (here temperature 0.8, top-k 20, top-p 0.9, and a
// reasoning budget whose forced suffix tokens are not drawn at all). Each drawn token's, and each top-5
// alternative's at the first steps, equal what `erinfer score` computes over the same tokens to 1e-5 (of the
// log-prob's size past 1: a forced token 15 nats down differs by 1.6e-5). Score runs a full forward of the
// sequence where the batch decoded token by token, summing in another order (float32): their logits drift
// apart with the position, by about 1e-6 of themselves per 10 positions on the random model, so the samples
// stay short (16 tokens; the log-softmax itself is checked to 1e-6 above). The alternatives come most probable
// first, the drawn token's entry among them bitwise equal to its own log-prob.
Test(server, logprobs_are_the_models_log_softmax, .timeout = 120) {
    HelperFixture fx;
    helper_fixture_open(&fx, "er_serve_lp_", "erinfer");
    helper_need_program(fx.prog, "erinfer", "the logprobs test");
    ErModel *m;
    ErBatch *b;
    ErRequest *rq;
    cr_assert_eq(er_model_load(&m, fx.model), ER_OK, "%s", er_last_error());
    cr_assert_eq(helper_batch_open(&b, m, 4, 256, 0), ER_OK, "%s", er_last_error());
    ErGenParams p;
    er_gen_params_init(&p);
    p.n_samples = 2, p.temperature = 0.8f, p.top_k = 20, p.top_p = 0.9f, p.seed = 7, p.max_new_tokens = 16;
    p.budget = 4, p.answer_tokens = 12, p.top_logprobs = 5;
    const char *prompt = "Start with 4. Add 9. What is the result?";
    cr_assert_eq(er_batch_submit(b, prompt, &p, NULL, NULL, &rq), ER_OK, "%s", er_last_error());
    while (er_request_status(rq) == 1)
        cr_assert_geq(er_batch_step(b), 0);
    cr_assert_eq(er_request_status(rq), ER_OK, "%s", er_last_error());
    Tokenizer *tok;
    cr_assert_eq(tok_load(&tok, fx.model), ER_OK);
    int *ids, n_ids;
    cr_assert_eq(tok_encode(tok, prompt, strlen(prompt), &ids, &n_ids), ER_OK);
    // One score record per sample (the prompt and all its tokens), then one per alternative at the first
    // three steps of sample 0 (the prompt, the tokens before the step, the alternative).
    enum { STEPS = 3 };
    StrBuf in = {0};
    const ErSample *x0 = er_request_sample(rq, 0);
    for (int i = 0; i < 2; i++) {
        const ErSample *x = er_request_sample(rq, i);
        cr_assert(x->logprobs && x->top_tokens && x->top_logprobs && x->n_top == 5 && x->n_tokens > STEPS);
        cr_expect(x->budget_cut, "the budget forced its suffix");
        strbuf_puts(&in, "{\"tokens\": [");
        put_ints(&in, ids, n_ids);
        strbuf_puts(&in, ", ");
        put_ints(&in, x->tokens, x->n_tokens);
        strbuf_puts(&in, "]}\n");
        for (int k = 0; k < x->n_tokens; k++) {
            const int *top = x->top_tokens + k * 5;
            const float *tl = x->top_logprobs + k * 5;
            for (int j = 0; j < 5; j++) {
                cr_expect(tl[j] <= 0 && (j == 0 || tl[j] <= tl[j - 1]), "step %d: not most probable first", k);
                if (top[j] == x->tokens[k])
                    cr_expect_eq(tl[j], x->logprobs[k], "step %d: the drawn token's two log-probs differ", k);
            }
            cr_expect_geq(tl[0], x->logprobs[k], "step %d: a token more probable than the top one", k);
        }
    }
    for (int k = 0; k < STEPS; k++)
        for (int j = 0; j < 5; j++) {
            strbuf_puts(&in, "{\"tokens\": [");
            put_ints(&in, ids, n_ids);
            strbuf_puts(&in, ", ");
            put_ints(&in, x0->tokens, k);
            strbuf_puts(&in, k ? ", " : "");
            strbuf_int(&in, x0->top_tokens[k * 5 + j]);
            strbuf_puts(&in, "]}\n");
        }
    char *inp = path_join(fx.tmp, "score_in.jsonl"), *outp = path_join(fx.tmp, "score_out.jsonl");
    cr_assert_eq(file_write_atomic(inp, in.p, in.n), ER_OK);
    CmdResult res = helper_run(fx.tmp, "'%s' score --model '%s' --input '%s' --output '%s' --threads 1", fx.prog,
                               fx.model, inp, outp);
    cr_assert_eq(res.status, 0, "erinfer score: %s", res.err);
    char *text;
    size_t n;
    cr_assert_eq(file_read_all(outp, 1 << 24, &text, &n), ER_OK);
    double worst = 0;
    int line = 0, checked = 0;
    for (char *s = strtok(text, "\n"); s; s = strtok(NULL, "\n"), line++) {
        cJSON *j = cJSON_Parse(s);
        const cJSON *lps = cJSON_GetObjectItemCaseSensitive(j, "logprobs");
        cr_assert(cJSON_IsArray(lps), "%s", s);
        int len = cJSON_GetArraySize(lps); // logprobs[i] = log p(token i + 1 | tokens 0..i)
        if (line < 2) {
            const ErSample *x = er_request_sample(rq, line);
            cr_assert_eq(len, n_ids + x->n_tokens - 1);
            for (int k = 0; k < x->n_tokens; k++, checked++) {
                double d = fabs(cJSON_GetArrayItem(lps, n_ids - 1 + k)->valuedouble - x->logprobs[k]);
                d /= fabs(x->logprobs[k]) > 1 ? fabs(x->logprobs[k]) : 1;
                worst = d > worst ? d : worst;
                cr_expect_leq(d, 1e-5, "sample %d token %d: %g from score's %g", line, k, d, x->logprobs[k]);
            }
        } else {
            int k = (line - 2) / 5, jj = (line - 2) % 5;
            double d = fabs(cJSON_GetArrayItem(lps, len - 1)->valuedouble - x0->top_logprobs[k * 5 + jj]);
            d /= fabs(x0->top_logprobs[k * 5 + jj]) > 1 ? fabs(x0->top_logprobs[k * 5 + jj]) : 1;
            worst = d > worst ? d : worst;
            checked++;
            cr_expect_leq(d, 1e-5, "step %d alternative %d: %g from the recomputed log-softmax", k, jj, d);
        }
        cJSON_Delete(j);
    }
    cr_expect_eq(line, 2 + STEPS * 5);
    fprintf(stderr, "logprobs: %d log-probs within %.2g (relative past 1) of erinfer score's\n", checked, worst);
    er_free(text);
    helper_result_free(&res);
    er_free(inp);
    er_free(outp);
    er_free(in.p);
    er_free(ids);
    tok_free(tok);
    er_request_free(rq);
    er_batch_free(b);
    er_model_free(m);
    helper_fixture_close(&fx);
}

// POSTs body (JSON) to path with curl; the response text (free with free).
static char *post_path(const TestServer *t, const char *path, const char *body) {
    char file[600], cmd[1200];
    snprintf(file, sizeof file, "%s/body.json", t->fx.tmp);
    cr_assert_eq(file_write_atomic(file, body, strlen(body)), ER_OK);
    snprintf(cmd, sizeof cmd, "curl -s -N http://127.0.0.1:%d%s -H 'Content-Type: application/json' -d @'%s'",
             t->port, path, file);
    int st;
    char *out = run_capture(cmd, &st);
    if (st == 127)
        cr_skip_test("!!!!!! curl is not installed: the erinfer serve logprobs tests are SKIPPED !!!!!!");
    cr_assert_eq(st, 0, "curl failed: %s", out);
    return out;
}

// The choices of a response, streamed or not, gathered per index: {"text": the content (or completion text),
// "logprobs": the chat entries, or the completions arrays, joined over the chunks}. A new array.
static cJSON *gather_choices(const char *out, int stream, int chat) {
    cJSON *all = cJSON_CreateArray();
    cJSON *resp = stream ? NULL : cJSON_Parse(out);
    cr_assert(stream || resp, "%s", out);
    for (const char *p = out; p;) {
        cJSON *j = resp;
        if (stream) {
            const char *ev = strstr(p, "data: {");
            if (!ev)
                break;
            const char *end = strstr(ev, "\n\n");
            cr_assert(end);
            j = cJSON_ParseWithLength(ev + 6, (size_t)(end - ev - 6));
            p = end;
        } else {
            p = NULL;
        }
        const cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(j, "choices")) {
            int i = cJSON_GetObjectItemCaseSensitive(c, "index")->valueint;
            while (cJSON_GetArraySize(all) <= i) {
                cJSON *g = cJSON_CreateObject();
                cJSON_AddStringToObject(g, "text", "");
                cJSON *lp = cJSON_AddObjectToObject(g, "logprobs");
                const char *const keys[] = {"content", "tokens", "token_logprobs", "top_logprobs", "text_offset"};
                for (int k = chat ? 0 : 1; k < (chat ? 1 : 5); k++)
                    cJSON_AddArrayToObject(lp, keys[k]);
                cJSON_AddItemToArray(all, g);
            }
            cJSON *g = cJSON_GetArrayItem(all, i);
            const cJSON *m = cJSON_GetObjectItemCaseSensitive(c, chat ? (stream ? "delta" : "message") : "text");
            const cJSON *text = chat ? cJSON_GetObjectItemCaseSensitive(m, "content") : m;
            if (cJSON_IsString(text)) {
                StrBuf b = {0};
                strbuf_puts(&b, cJSON_GetObjectItemCaseSensitive(g, "text")->valuestring);
                strbuf_puts(&b, text->valuestring);
                cJSON_ReplaceItemInObject(g, "text", cJSON_CreateString(b.p));
                er_free(b.p);
            }
            const cJSON *lp = cJSON_GetObjectItemCaseSensitive(c, "logprobs"), *arr;
            cJSON_ArrayForEach(arr, lp) {
                cJSON *into = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(g, "logprobs"),
                                                               arr->string);
                const cJSON *e;
                cJSON_ArrayForEach(e, arr) cJSON_AddItemToArray(into, cJSON_Duplicate(e, 1));
            }
        }
        if (stream)
            cJSON_Delete(j);
    }
    cJSON_Delete(resp);
    return all;
}

// The text the raw bytes of the first n chat entries make (converted as the engine converts).
static char *entries_text(const cJSON *content, int n) {
    StrBuf raw = {0};
    strbuf_puts(&raw, "");
    for (int k = 0; k < n; k++) {
        const cJSON *b;
        cJSON_ArrayForEach(b, cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(content, k), "bytes")) {
            char c = (char)b->valueint;
            strbuf_put(&raw, &c, 1);
        }
    }
    char *t;
    size_t tl;
    cr_assert_eq(tok_text_from_bytes(raw.p, raw.n, &t, &tl), ER_OK);
    er_free(raw.p);
    return t;
}

// A chat choice's logprobs cover exactly the tokens its text shows: the first n entries' bytes make a text
// that starts with it, the first n - 1 a shorter one (or the last token starts inside the text's last
// character: its bytes are all continuation bytes); each entry has top alternatives, most probable first.
static void check_chat_choice(const cJSON *g, int n_top) {
    const char *text = cJSON_GetObjectItemCaseSensitive(g, "text")->valuestring;
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(g, "logprobs"),
                                                            "content");
    int n = cJSON_GetArraySize(content);
    cr_assert_gt(n, 0);
    char *all = entries_text(content, n), *less = entries_text(content, n - 1);
    cr_expect(strncmp(all, text, strlen(text)) == 0, "the tokens' text \"%s\" does not start with \"%s\"", all, text);
    int inside = 1;
    const cJSON *b;
    cJSON_ArrayForEach(b, cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(content, n - 1), "bytes"))
        inside &= (b->valueint & 0xc0) == 0x80;
    cr_expect(strlen(less) < strlen(text) || inside, "a token after the text: \"%s\" covers \"%s\"", less, text);
    er_free(all);
    er_free(less);
    const cJSON *e;
    cJSON_ArrayForEach(e, content) {
        const cJSON *top = cJSON_GetObjectItemCaseSensitive(e, "top_logprobs");
        cr_assert(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "token")));
        cr_expect_leq(cJSON_GetObjectItemCaseSensitive(e, "logprob")->valuedouble, 0);
        cr_expect_eq(cJSON_GetArraySize(top), n_top);
        for (int j = 1; j < n_top; j++)
            cr_expect_leq(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(top, j), "logprob")->valuedouble,
                          cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(top, j - 1), "logprob")->valuedouble);
    }
}

static char *print_json(const cJSON *j) { return cJSON_PrintUnformatted(j); }

// logprobs over HTTP, chat and completions, streamed and not, on the random model (whose bytes are often not
// UTF-8: the tokens' start in the text is walked through the same conversion): streamed and joined they equal
// the non-streamed ones; they cover the tokens the text shows (not a final EOS, not past a stop string);
// completions' text_offset counts code points. Bad values are refused by name.
Test(server, logprobs_over_http, .timeout = 120) {
    TestServer t;
    helper_fixture_open(&t.fx, "er_serve_", "erinfer");
    helper_need_program(t.fx.prog, "erinfer", "the erinfer serve logprobs tests");
    char args[700], body[1024];
    snprintf(args, sizeof args, "--model '%s' --max-tokens 32", t.fx.model);
    server_launch(&t, args);
    const char *chat = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 24, \"seed\": 3, "
                       "\"n\": 2, \"logprobs\": true, \"top_logprobs\": 3";
    snprintf(body, sizeof body, "%s}", chat);
    for (int with_stop = 0; with_stop < 2; with_stop++) {
        char *out = post_path(&t, "/v1/chat/completions", body);
        cJSON *a = gather_choices(out, 0, 1);
        free(out);
        if (with_stop) { // a stop string from the middle of choice 0's text: the logprobs end where it starts
            const char *text = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(a, 0), "text")->valuestring;
            size_t at = strlen(text) / 2;
            while (at > 0 && ((unsigned char)text[at] & 0xc0) == 0x80)
                at--;
            char stop[3] = {text[at], (text[at + 1] & 0x80) ? 0 : text[at + 1], 0};
            cJSON *js = cJSON_CreateString(stop);
            char *q = print_json(js);
            snprintf(body, sizeof body, "%s, \"stop\": %s}", chat, q);
            er_free(q);
            cJSON_Delete(js);
            cJSON_Delete(a);
            out = post_path(&t, "/v1/chat/completions", body);
            a = gather_choices(out, 0, 1);
            free(out);
            cr_expect(strstr(body, "\"stop\""), "%s", body);
        }
        char sbody[1100];
        snprintf(sbody, sizeof sbody, "%.*s, \"stream\": true}", (int)strlen(body) - 1, body);
        out = post_path(&t, "/v1/chat/completions", sbody);
        cJSON *s = gather_choices(out, 1, 1);
        free(out);
        cr_assert_eq(cJSON_GetArraySize(a), 2);
        char *pa = print_json(a), *ps = print_json(s);
        cr_expect_str_eq(ps, pa, "streamed and joined, the choices differ");
        er_free(pa);
        er_free(ps);
        for (int i = 0; i < 2; i++)
            check_chat_choice(cJSON_GetArrayItem(a, i), 3);
        cJSON_Delete(a);
        cJSON_Delete(s);
    }
    // Completions: the legacy shape, text_offset in code points of the text.
    const char *cmpl = "{\"prompt\": \"Hi\", \"max_tokens\": 24, \"seed\": 4, \"logprobs\": 2";
    char *out = post_path(&t, "/v1/completions", (snprintf(body, sizeof body, "%s}", cmpl), body));
    cJSON *a = gather_choices(out, 0, 0);
    free(out);
    out = post_path(&t, "/v1/completions", (snprintf(body, sizeof body, "%s, \"stream\": true}", cmpl), body));
    cJSON *s = gather_choices(out, 1, 0);
    free(out);
    char *pa = print_json(a), *ps = print_json(s);
    cr_expect_str_eq(ps, pa, "completions streamed and joined differ");
    er_free(pa);
    er_free(ps);
    const cJSON *g = cJSON_GetArrayItem(a, 0), *lp = cJSON_GetObjectItemCaseSensitive(g, "logprobs");
    const cJSON *tokens = cJSON_GetObjectItemCaseSensitive(lp, "tokens");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(lp, "text_offset");
    const cJSON *tops = cJSON_GetObjectItemCaseSensitive(lp, "top_logprobs");
    int n = cJSON_GetArraySize(tokens);
    cr_assert_gt(n, 0);
    cr_expect_eq(cJSON_GetArraySize(offs), n);
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(lp, "token_logprobs")), n);
    const char *text = cJSON_GetObjectItemCaseSensitive(g, "text")->valuestring;
    long chars = 0, len = (long)strlen(text);
    for (long i = 0; i < len; i++)
        chars += ((unsigned char)text[i] & 0xc0) != 0x80;
    cr_expect_eq(cJSON_GetArrayItem(offs, 0)->valueint, 0);
    for (int k = 1; k < n; k++)
        cr_expect_geq(cJSON_GetArrayItem(offs, k)->valueint, cJSON_GetArrayItem(offs, k - 1)->valueint);
    cr_expect_lt(cJSON_GetArrayItem(offs, n - 1)->valueint, chars, "the last token starts inside the text");
    for (int k = 0; k < n; k++) { // two alternatives, and the drawn token when it is not one of them
        int m = cJSON_GetArraySize(cJSON_GetArrayItem(tops, k));
        cr_expect(m >= 1 && m <= 3, "step %d: %d entries", k, m);
    }
    cJSON_Delete(a);
    cJSON_Delete(s);
    server_stop(&t);
}

// The JSON-escaped text of the first "text" field in s from `from` on (its bytes between the quotes, *n of
// them), NULL when none is left.
static const char *escaped_text(const char *s, size_t *n, const char **next) {
    const char *p = strstr(s, "\"text\":\"");
    if (!p)
        return NULL;
    p += strlen("\"text\":\"");
    const char *q = p;
    while (*q && *q != '"')
        q += *q == '\\' ? 2 : 1;
    *n = (size_t)(q - p);
    *next = q;
    return p;
}

// A model may write a NUL byte (a random configs/tiny.json model, as serve_check.sh makes it, does every few
// answers): it is escaped as \u0000, not the end of the text (a C string's end, which cut the rest of a
// non-streamed answer and of a streamed chunk). The text streamed and joined equals the non-streamed one,
// escapes and all.
Test(server, a_nul_byte_in_the_output_is_escaped, .timeout = 120) {
    TestServer t;
    helper_fixture_open(&t.fx, "er_serve_", "erinfer");
    helper_need_program(t.fx.prog, "erinfer", "the erinfer serve NUL byte test");
    char *ertrain = helper_program("ertrain");
    helper_need_program(ertrain, "ertrain", "the erinfer serve NUL byte test");
    char args[700], body[256];
    CmdResult init = helper_run(t.fx.tmp, "'%s' init --config configs/tiny.json --out '%s/tiny' --tokenizer "
                                "data/tiny_tokenizer --seed 1 --threads 1", ertrain, t.fx.tmp);
    cr_assert_eq(init.status, 0, "ertrain init: %s", init.err);
    helper_result_free(&init);
    er_free(ertrain);
    snprintf(args, sizeof args, "--model '%s/tiny' --max-tokens 40", t.fx.tmp);
    server_launch(&t, args);
    int seed = 0;
    char *out = NULL;
    for (int s = 1; s <= 100 && !seed; s++) { // the first seed whose answer holds a NUL byte
        free(out);
        snprintf(body, sizeof body, "{\"prompt\": \"Hi\", \"max_tokens\": 40, \"seed\": %d}", s);
        out = post_path(&t, "/v1/completions", body);
        seed = strstr(out, "\\u0000") ? s : 0;
    }
    cr_assert(seed, "no answer in 100 seeds holds a NUL byte (last: %s)", out);
    size_t n, m;
    const char *next, *whole = escaped_text(out, &n, &next);
    cr_assert(whole);
    snprintf(body, sizeof body, "{\"prompt\": \"Hi\", \"max_tokens\": 40, \"seed\": %d, \"stream\": true}", seed);
    char *st = post_path(&t, "/v1/completions", body);
    StrBuf joined = {0};
    strbuf_puts(&joined, "");
    for (const char *p = st, *piece; (piece = escaped_text(p, &m, &next)); p = next)
        strbuf_put(&joined, piece, m);
    cr_expect_eq(joined.n, n, "streamed: %s\nwhole: %.*s", joined.p, (int)n, whole);
    cr_expect(joined.n == n && memcmp(joined.p, whole, n) == 0, "streamed: %s\nwhole: %.*s", joined.p, (int)n, whole);
    cJSON *j = cJSON_Parse(out);
    cr_expect(j, "the answer is not valid JSON: %s", out);
    cJSON_Delete(j);
    er_free(joined.p);
    free(st);
    free(out);
    server_stop(&t);
}

// ---- the thinking switch: "reasoning": {"enabled"} and "chat_template_kwargs": {"enable_thinking"} ----

// serve_parse_request's route (NULL: none) for body under lim, or the refused field (param) when it is refused.
static void parse_route_case(const ServeLimits *lim, int chat, const char *body, const char *route,
                             const char *param) {
    Tokenizer *tok;
    cr_assert_eq(tok_load(&tok, "data/tiny_tokenizer"), ER_OK, "%s", er_last_error());
    ServeRequest r;
    ServeError e;
    int rc = serve_parse_request(body, strlen(body), chat, lim->hybrid ? CHAT_QWEN3 : CHAT_CHATML, tok, lim, &r, &e);
    if (param) {
        cr_expect_eq(rc, -1, "accepted: %s", body);
        cr_expect_eq(e.status, 400, "%s", body);
        cr_expect_str_eq(e.param, param, "%s: %s", body, e.message);
    } else {
        cr_assert_eq(rc, 0, "%s: %s", body, e.message);
        if (route)
            cr_expect(r.p.route && strcmp(r.p.route, route) == 0, "%s: route %s", body, r.p.route);
        else
            cr_expect_null(r.p.route, "%s", body);
        serve_request_free(&r);
    }
    tok_free(tok);
}

#define MSG "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "

Test(server, thinking_fields_map_onto_the_route) {
    ServeLimits hybrid = test_limits, adapter = test_limits;
    hybrid.hybrid = 1;
    adapter.adapter = adapter.routed = 1;
    // A hybrid model: each field forces its route; fields that agree are fine, fields that disagree are not.
    parse_route_case(&hybrid, 1, MSG "\"chat_template_kwargs\": {\"enable_thinking\": false}}", "direct", NULL);
    parse_route_case(&hybrid, 1, MSG "\"chat_template_kwargs\": {\"enable_thinking\": true}}", "reasoning", NULL);
    parse_route_case(&hybrid, 1, MSG "\"reasoning\": {\"enabled\": false}}", "direct", NULL);
    parse_route_case(&hybrid, 0, "{\"prompt\": \"hi\", \"reasoning\": {\"enabled\": true}}", "reasoning", NULL);
    parse_route_case(&hybrid, 1, MSG "\"route\": \"reasoning\"}", "reasoning", NULL); // no adapter needed
    parse_route_case(&hybrid, 1, MSG "\"reasoning\": {\"enabled\": true}, \"chat_template_kwargs\": "
                                     "{\"enable_thinking\": true}, \"route\": \"reasoning\"}", "reasoning", NULL);
    parse_route_case(&hybrid, 1, MSG "\"reasoning\": null, \"chat_template_kwargs\": null}", NULL, NULL);
    parse_route_case(&hybrid, 1, MSG "\"reasoning\": {\"enabled\": true}, \"chat_template_kwargs\": "
                                     "{\"enable_thinking\": false}}", NULL, "chat_template_kwargs");
    parse_route_case(&hybrid, 1, MSG "\"route\": \"direct\", \"reasoning\": {\"enabled\": true}}", NULL, "reasoning");
    parse_route_case(&hybrid, 1, MSG "\"route\": \"auto\", \"chat_template_kwargs\": {\"enable_thinking\": true}}",
                     NULL, "chat_template_kwargs");
    // Malformed: the field named.
    parse_route_case(&hybrid, 1, MSG "\"reasoning\": true}", NULL, "reasoning");
    parse_route_case(&hybrid, 1, MSG "\"reasoning\": {\"enabled\": \"yes\"}}", NULL, "reasoning.enabled");
    parse_route_case(&hybrid, 1, MSG "\"reasoning\": {\"effort\": \"high\"}}", NULL, "reasoning.effort");
    parse_route_case(&hybrid, 1, MSG "\"chat_template_kwargs\": [1]}", NULL, "chat_template_kwargs");
    parse_route_case(&hybrid, 1, MSG "\"chat_template_kwargs\": {\"enable_thinking\": 0}}", NULL,
                     "chat_template_kwargs.enable_thinking");
    parse_route_case(&hybrid, 1, MSG "\"chat_template_kwargs\": {\"tools_mode\": 1}}", NULL,
                     "chat_template_kwargs.tools_mode");
    parse_route_case(&hybrid, 0, "{\"prompt\": \"hi\", \"chat_template_kwargs\": {\"enable_thinking\": true}}", NULL,
                     "chat_template_kwargs"); // a completion has no chat template
    // A forced call start and a forced think block cannot both start the answer.
    parse_route_case(&hybrid, 1, MSG "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], "
                                     "\"tool_choice\": \"required\", \"chat_template_kwargs\": {\"enable_thinking\": "
                                     "false}}", NULL, "tool_choice");
    // Not hybrid, with an adapter: the switch is the adapter's route.
    parse_route_case(&adapter, 1, MSG "\"chat_template_kwargs\": {\"enable_thinking\": true}}", "reasoning", NULL);
    parse_route_case(&adapter, 1, MSG "\"reasoning\": {\"enabled\": false}}", "direct", NULL);
    // Neither: thinking off is what the model does anyway (accepted, nothing forced); on is refused.
    parse_route_case(&test_limits, 1, MSG "\"chat_template_kwargs\": {\"enable_thinking\": false}}", NULL, NULL);
    parse_route_case(&test_limits, 1, MSG "\"chat_template_kwargs\": {\"enable_thinking\": true}}", NULL,
                     "chat_template_kwargs.enable_thinking");
    parse_route_case(&test_limits, 1, MSG "\"reasoning\": {\"enabled\": true}}", NULL, "reasoning.enabled");
}

// The erinfer extension of a non-streamed response, or of a stream's last chunk (a new object).
static cJSON *reply_extension(const char *out, int stream) {
    const char *at = out;
    if (stream) {
        at = NULL;
        for (const char *p = strstr(out, "data: {"); p; p = strstr(p + 1, "data: {"))
            at = p + 6;
        cr_assert(at && strstr(out, "data: [DONE]"), "%s", out);
    }
    cJSON *j = cJSON_ParseWithOpts(at, NULL, 0);
    cr_assert(j, "%s", out);
    cJSON *x = cJSON_DetachItemFromObject(j, "erinfer");
    cr_assert(x, "no erinfer extension: %s", out);
    cJSON_Delete(j);
    return x;
}

// A hybrid-thinking model served without adapter or heads: each way of asking for thinking on or off runs
// that route, streamed and not, with its think block forced after the prompt; a conflict is a 400.
Test(server, thinking_switch_on_a_hybrid_model, .timeout = 120) {
    TestServer t;
    helper_fixture_open(&t.fx, "er_serve_", "erinfer");
    helper_need_program(t.fx.prog, "erinfer", "the erinfer serve pipeline tests");
    char dir[600], args[1600];
    snprintf(dir, sizeof dir, "%s/hybrid", t.fx.tmp);
    helper_make_hybrid_model(dir);
    snprintf(args, sizeof args, "--model '%s' --max-n 2 --max-tokens 16 --queue 0", dir);
    server_launch(&t, args);
    static const struct {
        const char *field;
        int on;
    } asks[] = {
        {"\"chat_template_kwargs\": {\"enable_thinking\": false}", 0},
        {"\"chat_template_kwargs\": {\"enable_thinking\": true}", 1},
        {"\"reasoning\": {\"enabled\": false}", 0},
        {"\"reasoning\": {\"enabled\": true}", 1},
        {"\"route\": \"direct\"", 0},
        {"\"route\": \"reasoning\"", 1},
    };
    for (size_t i = 0; i < sizeof asks / sizeof *asks; i++)
        for (int stream = 0; stream < 2; stream++) {
            char body[512];
            snprintf(body, sizeof body, MSG "\"max_tokens\": 6, \"stream\": %s, %s}", stream ? "true" : "false",
                     asks[i].field);
            char *out = server_post(&t, body);
            cJSON *x = reply_extension(out, stream);
            cr_expect_str_eq(field(x, "route")->valuestring, asks[i].on ? "reasoning" : "direct", "%s", body);
            cr_expect_str_eq(field(x, "response_prefix")->valuestring, asks[i].on ? CHAT_THINK_ON : CHAT_THINK_OFF,
                             "%s", body);
            cJSON_Delete(x);
            free(out);
        }
    char *out = server_post(&t, MSG "\"reasoning\": {\"enabled\": false}, \"route\": \"reasoning\"}");
    cJSON *j = cJSON_Parse(out);
    cr_assert(j, "%s", out);
    cr_expect_str_eq(field(field(j, "error"), "param")->valuestring, "reasoning", "%s", out);
    cJSON_Delete(j);
    free(out);
    server_stop(&t);
}
#undef MSG

// ---- /v1/embeddings ----

// base64 (RFC 4648) -> bytes; the count, or -1 on a bad character.
static int base64_decode(const char *s, unsigned char *out, int cap) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    int n = 0, bits = 0;
    unsigned v = 0;
    for (; *s && *s != '='; s++) {
        const char *at = strchr(abc, *s);
        if (!at)
            return -1;
        v = v << 6 | (unsigned)(at - abc);
        if ((bits += 6) >= 8 && n < cap)
            out[n++] = (unsigned char)(v >> (bits -= 8));
    }
    return n;
}

// The vectors er_embed gives in this process, as floats and as base64 (little-endian float32), truncated by
// dimensions; one 400 naming the field for each bad request.
Test(server, embeddings_over_http, .timeout = 120) {
    TestServer t;
    helper_fixture_open(&t.fx, "er_serve_emb_", "erinfer");
    helper_need_program(t.fx.prog, "erinfer", "the erinfer serve embeddings tests");
    char args[700];
    snprintf(args, sizeof args, "--model '%s' --max-tokens 16", t.fx.model);
    server_launch(&t, args);
    const char *texts[2] = {"Start with 3. Add 4.", "a"};
    ErModel *m;
    ErSession *s;
    ErSessionParams sp;
    cr_assert_eq(er_model_load(&m, t.fx.model), 0, "%s", er_last_error());
    er_session_params_init(&sp);
    cr_assert_eq(er_session_open(&s, m, &sp), 0, "%s", er_last_error());
    int C = er_model_embedding_size(m);
    float *want = malloc(sizeof(float) * 2 * C), got[4096 / 4];
    ErEmbedParams p;
    er_embed_params_init(&p);
    int tokens = er_embed(s, texts, 2, &p, want, (size_t)2 * C);
    cr_assert_gt(tokens, 0, "%s", er_last_error());
    for (int b64 = 0; b64 <= 1; b64++) {
        char body[300];
        snprintf(body, sizeof body, "{\"model\": \"x\", \"input\": [\"%s\", \"%s\"]%s}", texts[0], texts[1],
                 b64 ? ", \"encoding_format\": \"base64\"" : "");
        char *out = post_path(&t, "/v1/embeddings", body);
        cJSON *j = cJSON_Parse(out);
        cr_assert(j, "%s", out);
        const cJSON *data = field(j, "data");
        cr_assert_eq(cJSON_GetArraySize(data), 2, "%s", out);
        cr_expect_eq(field(field(j, "usage"), "prompt_tokens")->valueint, tokens);
        for (int i = 0; i < 2; i++) {
            const cJSON *e = field(cJSON_GetArrayItem(data, i), "embedding");
            if (b64) {
                cr_assert(cJSON_IsString(e));
                cr_assert_eq(base64_decode(e->valuestring, (unsigned char *)got, sizeof got), 4 * C);
            } else {
                cr_assert_eq(cJSON_GetArraySize(e), C);
                for (int k = 0; k < C; k++)
                    got[k] = (float)cJSON_GetArrayItem(e, k)->valuedouble;
            }
            for (int k = 0; k < C; k++)
                cr_expect_float_eq(got[k], want[(size_t)i * C + k], 1e-6, "text %d value %d (base64 %d)", i, k, b64);
        }
        cJSON_Delete(j);
        free(out);
    }
    char *out = post_path(&t, "/v1/embeddings", "{\"input\": \"a\", \"dimensions\": 8}");
    cJSON *j = cJSON_Parse(out);
    cr_expect_eq(cJSON_GetArraySize(field(cJSON_GetArrayItem(field(j, "data"), 0), "embedding")), 8, "%s", out);
    cJSON_Delete(j);
    free(out);
    static const struct {
        const char *body, *param;
    } bad[] = {{"{\"input\": [1, 2]}", "input"},
               {"{\"input\": []}", "input"},
               {"{\"model\": \"x\"}", "input"},
               {"{\"input\": \"a\", \"dimensions\": 0}", "dimensions"},
               {"{\"input\": \"a\", \"dimensions\": 100000}", "dimensions"},
               {"{\"input\": \"a\", \"encoding_format\": \"int8\"}", "encoding_format"},
               {"{\"input\": \"a\", \"pooling\": \"mean\"}", "pooling"},
               {"{\"input\": \"\"}", "input"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *param;
        cr_expect_eq(post_status_at(&t, "/v1/embeddings", bad[i].body, &param), 400, "%s", bad[i].body);
        cr_expect_str_eq(param, bad[i].param, "%s", bad[i].body);
        er_free(param);
    }
    free(want);
    er_session_free(s);
    er_model_free(m);
    server_stop(&t);
}

// ---- the memory (erinfer serve --memory) ----

// The server's memory tools as ServeLimits.memory_tools holds them (names are what the parser checks).
#define MEMORY_TOOLS "[{\"type\": \"function\", \"function\": {\"name\": \"memory_search\"}}, {\"type\": \"function\", " \
                     "\"function\": {\"name\": \"memory_add\"}}]"

#define MEM_MSG "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "

static int parse_with(const ServeLimits *lim, const char *body, ServeRequest *r, char *param, size_t cap) {
    Tokenizer *tok;
    cr_assert_eq(tok_load(&tok, "data/tiny_tokenizer"), ER_OK, "%s", er_last_error());
    ServeError e;
    int rc = serve_parse_request(body, strlen(body), 1, CHAT_QWEN25, tok, lim, r, &e);
    snprintf(param, cap, "%s", rc < 0 ? e.param : "");
    tok_free(tok);
    return rc;
}

// "memory" is refused by a server without a store and checked field by field by one with it; the memory tools
// are announced for one sample with tool_choice "auto" (not for n > 1, "none", or "memory": {"tools": false}),
// a client's tool may not take their names, and the recalled block ends the system message (after the tools).
Test(server, memory_options_and_the_tools_offered) {
    cJSON *tools = cJSON_Parse(MEMORY_TOOLS);
    ServeLimits with = test_limits, rounds0 = test_limits;
    with.memory = rounds0.memory = 1;
    with.memory_tools = tools;
    ServeRequest r;
    char param[80];
    static const struct {
        const char *rest;
        int memory; // the server has a store
    } refused[] = {{"\"memory\": {\"save\": true}", 0},        {"\"memory\": {\"save\": 1}", 1},
                   {"\"memory\": {\"forget\": true}", 1},      {"\"memory\": true", 1},
                   {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"memory_add\"}}]", 1}};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        char body[512];
        snprintf(body, sizeof body, MEM_MSG "%s}", refused[i].rest);
        cr_expect_lt(parse_with(refused[i].memory ? &with : &test_limits, body, &r, param, sizeof param), 0, "%s",
                     body);
        cr_expect(strcmp(param, "memory") == 0 || strcmp(param, "tools") == 0, "%s: param %s", body, param);
    }
    static const struct {
        const char *rest;
        int offered, recall, save;
    } cases[] = {{"\"n\": 1", 1, 1, 0},
                 {"\"n\": 2", 0, 1, 0},
                 {"\"tool_choice\": \"none\", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]", 0,
                  1, 0},
                 {"\"memory\": {\"tools\": false, \"save\": true}", 0, 1, 1},
                 {"\"memory\": {\"recall\": false}", 1, 0, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char body[512];
        snprintf(body, sizeof body, MEM_MSG "%s}", cases[i].rest);
        cr_assert_eq(parse_with(&with, body, &r, param, sizeof param), 0, "%s: %s", body, param);
        cr_expect_eq(r.memory_tools, cases[i].offered, "%s", body);
        cr_expect_eq(strstr(r.prompt, "\"memory_search\"") != NULL, cases[i].offered, "%s: %s", body, r.prompt);
        cr_expect_eq(r.tools, cases[i].offered, "%s", body);
        cr_expect_eq(r.memory_recall, cases[i].recall, "%s", body);
        cr_expect_eq(r.memory_save, cases[i].save, "%s", body);
        serve_request_free(&r);
    }
    // --memory-rounds 0: a store without tools; the options still apply.
    cr_assert_eq(parse_with(&rounds0, MEM_MSG "\"memory\": {\"recall\": false, \"save\": true}}", &r, param,
                            sizeof param), 0, "%s", param);
    cr_expect(!r.memory_tools && !r.memory_recall && r.memory_save && !strstr(r.prompt, "memory_search"));
    serve_request_free(&r);
    // Without a store nothing is offered.
    cr_assert_eq(parse_with(&test_limits, MEM_MSG "\"n\": 1}", &r, param, sizeof param), 0);
    cr_expect(!r.memory_tools && !r.memory_recall && !strstr(r.prompt, "memory_search"));
    serve_request_free(&r);
    // The recalled block goes after the request's system text, in the system turn that announces the tools.
    const char *body = "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
                       "\"content\": \"hi\"}]}";
    cr_assert_eq(parse_with(&with, body, &r, param, sizeof param), 0);
    int before = r.prompt_tokens;
    r.memory_block = er_strdup("# Memory\n[3] tea");
    Tokenizer *tok;
    cr_assert_eq(tok_load(&tok, "data/tiny_tokenizer"), ER_OK);
    ServeError e;
    cr_assert_eq(serve_render(&r, CHAT_QWEN25, tok, &with, &e), 0, "%s", e.message);
    cr_expect(strncmp(r.prompt, "<|im_start|>system\nBe brief.\n\n# Tools", 34) == 0, "%s", r.prompt);
    cr_expect(strstr(r.prompt, "</tool_call><|im_end|>") == NULL, "%s", r.prompt);
    cr_expect(strstr(r.prompt, "</tool_call>\n\n# Memory\n[3] tea<|im_end|>\n<|im_start|>user\nhi") != NULL, "%s",
              r.prompt);
    cr_expect_gt(r.prompt_tokens, before);
    tok_free(tok);
    serve_request_free(&r);
    cJSON_Delete(tools);
}

#define MEMORY_ADD_CALL "{\"name\": \"memory_add\", \"arguments\": {\"text\": \"The user drinks green tea.\"}}"

// Models whose every chat answer is one call of a memory tool (as make_tool_model's is of add).
static void make_call_model(const char *dir, const char *call) {
    const char *pieces[] = {"<tool_call>", call, "</tool_call>"};
    const ChainEdge edges[] = {{"<|im_start|>assistant\n", "<tool_call>"}, {"<tool_call>", call},
                               {call, "</tool_call>"}, {"</tool_call>", "<|im_end|>"}};
    make_chain_model(dir, pieces, 3, edges, 4);
}

// A model that always calls `call` (the fixture's callmodel) and a memory store of three notes (text only).
static void memory_fixture(TestServer *t, const char *call, char *db, size_t cap) {
    helper_fixture_open(&t->fx, "er_serve_mem_", "erinfer");
    helper_need_program(t->fx.prog, "erinfer", "the erinfer memory tests");
    need_serve(t->fx.prog); // the aarch64 build has neither serve nor the memory store
    char model[600], cmd[1400];
    snprintf(model, sizeof model, "%s/callmodel", t->fx.tmp);
    make_call_model(model, call);
    snprintf(db, cap, "%s/memory.db", t->fx.tmp);
    const char *notes[] = {"Zorblat Quenn works as a glassblower in Veltrin.", "The wifi password is tangerine42.",
                           "Mira keeps a glassblower pipe on the shelf."};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "'%s' memory add --db '%s' --text '%s' >/dev/null", t->fx.prog, db, notes[i]);
        cr_assert_eq(system(cmd), 0, "%s", cmd);
    }
}

// A server on memory_fixture's model and store.
static void memory_server(TestServer *t, const char *call, const char *flags, char *db, size_t cap) {
    memory_fixture(t, call, db, cap);
    char args[1600];
    snprintf(args, sizeof args, "--model '%s/callmodel' --max-tokens 64 --context 4096 --memory '%s' %s", t->fx.tmp,
             db, flags);
    server_launch(t, args);
}

// The model calls memory_search each round: the server runs it (BM25 finds the two glassblower notes), feeds the
// results back and, after --memory-rounds 2, withdraws the tools, so the third round's call is the answer's text.
// The rounds are in erinfer.memory, the same streamed and not; usage counts every round's tokens.
Test(server, memory_tools_run_by_the_server, .timeout = 120) {
    TestServer t;
    char db[600];
    memory_server(&t, MEMORY_SEARCH_CALL, "--memory-rounds 2", db, sizeof db);
    char *s = post_both(&t, "}");
    cr_expect_str_eq(s, "stop\n<tool_call>" MEMORY_SEARCH_CALL "</tool_call>\n");
    er_free(s);
    for (int stream = 0; stream < 2; stream++) {
        char *out = server_post(&t, stream ? CHOICE_USER ", \"max_tokens\": 24, \"stream\": true}"
                                           : CHOICE_USER ", \"max_tokens\": 24}");
        cJSON *x = reply_extension(out, stream);
        const cJSON *rounds = field(field(x, "memory"), "tool_rounds"), *round;
        cr_assert_eq(cJSON_GetArraySize(rounds), 2, "%s", out);
        cJSON_ArrayForEach(round, rounds) {
            const cJSON *call = cJSON_GetArrayItem(field(round, "tool_calls"), 0);
            cr_expect_str_eq(field(call, "name")->valuestring, "memory_search");
            cr_expect_str_eq(field(call, "arguments")->valuestring, "{\"query\":\"glassblower\",\"k\":2}");
            cJSON *res = cJSON_Parse(cJSON_GetArrayItem(field(round, "results"), 0)->valuestring);
            const cJSON *hits = field(res, "results");
            cr_expect_eq(cJSON_GetArraySize(hits), 2, "%s", out);
            cJSON *h;
            cJSON_ArrayForEach(h, (cJSON *)hits) cr_expect(strstr(field(h, "text")->valuestring, "glassblower"));
            cJSON_Delete(res);
        }
        cJSON_Delete(x);
        if (!stream) {
            cJSON *j = cJSON_Parse(out);
            int done = (int)field(field(j, "usage"), "completion_tokens")->valuedouble;
            cr_expect_eq(done, 3 * 4, "three rounds of <tool_call> call </tool_call> <|im_end|>: %s", out);
            cJSON_Delete(j);
        }
        free(out);
    }
    // "memory": {"tools": false}: no round, the call is the answer's text at once.
    char *out = server_post(&t, CHOICE_USER ", \"max_tokens\": 24, \"memory\": {\"tools\": false}}");
    cJSON *x = reply_extension(out, 0);
    cr_expect(!cJSON_GetObjectItemCaseSensitive(x, "memory"), "no round and nothing recalled for \"4 + 9?\": %s",
              out);
    cJSON_Delete(x);
    free(out);
    server_stop(&t);
}

// The number of entries erinfer memory list prints for db (one JSON line each), and whether one holds `text` (as
// JSON escapes it).
static int memory_entries(const TestServer *t, const char *db, const char *text, int *found) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "'%s' memory list --db '%s' --json", t->fx.prog, db);
    int st, n = 0;
    char *out = run_capture(cmd, &st);
    cr_assert_eq(st, 0, "%s", out);
    for (const char *p = out; *p; p++)
        n += *p == '\n';
    *found = strstr(out, text) != NULL;
    free(out);
    return n;
}

// memory_add stores the model's note; "memory": {"save": true} stores the conversation with its answer, the
// recall puts the notes the user's message matches into the prompt, and both ids are in erinfer.memory.
Test(server, memory_add_and_saving_a_conversation, .timeout = 120) {
    TestServer t;
    char db[600];
    memory_server(&t, MEMORY_ADD_CALL, "--memory-rounds 1", db, sizeof db);
    char *out = server_post(&t, "{\"messages\": [{\"role\": \"user\", \"content\": \"Which glassblower?\"}], "
                                "\"max_tokens\": 24, \"memory\": {\"save\": true}}");
    cJSON *x = reply_extension(out, 0);
    const cJSON *mem = field(x, "memory");
    cr_expect_eq(cJSON_GetArraySize(field(mem, "recalled")), 2, "the two glassblower notes: %s", out);
    cr_expect_eq(cJSON_GetArraySize(field(mem, "tool_rounds")), 1, "%s", out);
    cr_assert(cJSON_IsNumber(field(mem, "saved")), "%s", out);
    int saved = (int)field(mem, "saved")->valuedouble;
    cJSON_Delete(x);
    free(out);
    int found;
    cr_expect_eq(memory_entries(&t, db, "The user drinks green tea.", &found), 5, "3 notes, the model's, the chat");
    cr_expect(found, "the model's memory_add is not in the store");
    char want[128];
    snprintf(want, sizeof want, "{\"id\":%d,\"text\":\"user: Which glassblower?\\nassistant: <tool_call>", saved);
    memory_entries(&t, db, want, &found);
    cr_expect(found, "the saved conversation is not in the store");
    server_stop(&t);
}

// erinfer chat --memory: the turn recalls the glassblower notes, the model's memory_search runs (said on stderr)
// and, its one round spent, the model answers; /save keeps the conversation (the final answer, not the rounds).
Test(server, memory_in_erinfer_chat, .timeout = 120) {
    TestServer t;
    char db[600];
    memory_fixture(&t, MEMORY_SEARCH_CALL, db, sizeof db);
    char cmd[2400], in[700];
    snprintf(in, sizeof in, "%s/chat.in", t.fx.tmp);
    const char *lines = "Which glassblower?\n/save\n";
    cr_assert_eq(file_write_atomic(in, lines, strlen(lines)), ER_OK);
    snprintf(cmd, sizeof cmd, "'%s' chat --model '%s/callmodel' --memory '%s' --memory-rounds 1 --max-new 16 "
             "--threads 1 <'%s' 2>&1", t.fx.prog, t.fx.tmp, db, in);
    int st;
    char *out = run_capture(cmd, &st);
    cr_expect_eq(st, 0, "%s", out);
    cr_expect(strstr(out, "[memory: recalled 1 3]") || strstr(out, "[memory: recalled 3 1]"), "%s", out);
    cr_expect(strstr(out, "[memory_search {\"query\":\"glassblower\",\"k\":2} -> {\"results\":[{\"id\":"), "%s", out);
    cr_expect(strstr(out, "(saved as memory entry 4)"), "%s", out);
    free(out);
    int found;
    cr_expect_eq(memory_entries(&t, db, "\"user: Which glassblower?\\nassistant: <tool_call>", &found), 4);
    cr_expect(found, "the saved chat is not in the store");
    helper_fixture_close(&t.fx);
}
