// The external reward program: real programs (sh, python3) started through /bin/sh -c, answering
// numbers and objects, text arriving byte for byte, and every way such a program goes wrong (slow,
// gone, malformed, NaN, not there), each an error naming the program. No wall-clock assertions: a
// timeout is checked as the error it returns.
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "rl/reward_cmd.h"
#include "tests/common/helpers.h"

static RewardCmd *start_ok(const char *prog, double timeout_s) {
    RewardCmd *r = NULL;
    cr_assert_eq(reward_cmd_start(prog, timeout_s, &r), ER_OK, "%s", er_last_error());
    cr_assert(r);
    return r;
}

// A python3 program in /tmp (the pid keeps parallel tests apart); PROG is "python3 <file>".
static void python_prog(char *prog, size_t cap, const char *stem, const char *src) {
    char path[256];
    helper_write_tmp(path, sizeof path, stem, ".py", src);
    snprintf(prog, cap, "python3 %s", path);
}

static void assert_error_has(int rc, const char *a, const char *b) {
    cr_assert_lt(rc, 0, "expected an error");
    cr_assert(strstr(er_last_error(), a), "error lacks \"%s\": %s", a, er_last_error());
    if (b)
        cr_assert(strstr(er_last_error(), b), "error lacks \"%s\": %s", b, er_last_error());
}

// After free, PROG (our only child) has been reaped: no zombie is left.
static void assert_no_child(void) {
    errno = 0;
    cr_assert_eq(waitpid(-1, NULL, WNOHANG), -1, "a child is left behind");
    cr_assert_eq(errno, ECHILD);
}

Test(reward_cmd, numbers_one_and_batch) {
    char prog[512];
    python_prog(prog, sizeof prog, "rc_num",
                "import sys, json\n"
                "for l in sys.stdin:\n"
                "    q = json.loads(l)\n"
                "    print(q['length'] * 0.5 + q['budget'], flush=True)\n");
    RewardCmd *r = start_ok(prog, 30);
    RewardQuery q = {"p", "c", "a", 100, 7};
    RewardTerms t;
    cr_assert_eq(reward_cmd_score(r, &q, &t), ER_OK, "%s", er_last_error());
    cr_assert_eq(t.n, 1);
    cr_assert_str_eq(t.name[0], "cmd");
    cr_assert_eq(t.value[0], 103.5);
    RewardQuery qs[5];
    RewardTerms ts[5];
    for (int i = 0; i < 5; i++)
        qs[i] = (RewardQuery){"p", "c", NULL, 10 * i, i};
    cr_assert_eq(reward_cmd_score_many(r, qs, 5, ts), ER_OK, "%s", er_last_error());
    for (int i = 0; i < 5; i++)
        cr_assert_eq(ts[i].value[0], 10 * i + 0.5 * i, "reply %d", i);
    reward_cmd_free(r);
    assert_no_child();
    reward_cmd_free(NULL);
}

Test(reward_cmd, sh_numbers) {
    RewardCmd *r = start_ok("while IFS= read -r l; do echo ' -0.25 '; done", 30);
    RewardQuery q = {"p", "c", "a", 1, 1};
    RewardTerms t;
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(reward_cmd_score(r, &q, &t), ER_OK, "%s", er_last_error());
        cr_assert_eq(t.n, 1);
        cr_assert_eq(t.value[0], -0.25);
    }
    reward_cmd_free(r);
    assert_no_child();
}

Test(reward_cmd, object_two_terms) {
    RewardCmd *r = start_ok("while IFS= read -r l; do echo '{\"correct\": 1, \"short\": -0.5e-1}'; done", 30);
    RewardQuery q = {"p", "c", "a", 1, 1};
    RewardTerms t;
    cr_assert_eq(reward_cmd_score(r, &q, &t), ER_OK, "%s", er_last_error());
    cr_assert_eq(t.n, 2);
    cr_assert_str_eq(t.name[0], "correct");
    cr_assert_str_eq(t.name[1], "short");
    cr_assert_eq(t.value[0], 1.0);
    cr_assert_eq(t.value[1], -0.05);
    reward_cmd_free(r);
}

// Newlines, quotes, backslashes, control bytes and multi-byte UTF-8 arrive as they were; a completion cut
// inside a character arrives with U+FFFD in its place; NULL arrives as null. PROG writes what it decoded
// to a file and answers with the UTF-8 byte lengths.
Test(reward_cmd, text_arrives_intact) {
    char prog[512], out[256];
    snprintf(out, sizeof out, "/tmp/rc_text_%d.out", (int)getpid());
    char src[1024];
    snprintf(src, sizeof src,
             "import sys, json\n"
             "f = open('%s', 'wb')\n"
             "for l in sys.stdin.buffer:\n"
             "    q = json.loads(l.decode('utf-8'))\n"
             "    f.write(q['completion'].encode('utf-8') + b'\\0' + q['prompt'].encode('utf-8') + b'\\0')\n"
             "    f.flush()\n"
             "    print(json.dumps({'clen': len(q['completion'].encode('utf-8')),\n"
             "                      'no_answer': float(q['answer'] is None)}), flush=True)\n",
             out);
    python_prog(prog, sizeof prog, "rc_text", src);
    const char *c[3] = {"line one\nline \"two\"\r\n\ttab \\ back\\slash\x01\x1f end\n\n",
                        "UTF-8: caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xE4\xB8\xAD\xE6\x96\x87 }{\"",
                        "cut inside a character: \xE2\x82"};
    const char *want2 = "cut inside a character: \xEF\xBF\xBD";
    const char *prompt = "What is 2+2?\n<|im_start|>\"quoted\"";
    RewardQuery q[3];
    RewardTerms t[3];
    for (int i = 0; i < 3; i++)
        q[i] = (RewardQuery){prompt, c[i], i == 1 ? "4" : NULL, 64, 10};
    RewardCmd *r = start_ok(prog, 30);
    cr_assert_eq(reward_cmd_score_many(r, q, 3, t), ER_OK, "%s", er_last_error());
    reward_cmd_free(r);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(t[i].n, 2);
        cr_assert_str_eq(t[i].name[0], "clen");
        cr_assert_eq(t[i].value[0], (double)strlen(i == 2 ? want2 : c[i]), "completion %d", i);
        cr_assert_eq(t[i].value[1], i == 1 ? 0.0 : 1.0);
    }
    char *data;
    size_t n;
    cr_assert_eq(file_read_all(out, 1 << 20, &data, &n), ER_OK, "%s", er_last_error());
    size_t off = 0;
    for (int i = 0; i < 3; i++) {
        const char *w = i == 2 ? want2 : c[i];
        cr_assert(off + strlen(w) < n && !memcmp(data + off, w, strlen(w) + 1), "completion %d changed", i);
        off += strlen(w) + 1;
        cr_assert(off + strlen(prompt) < n && !memcmp(data + off, prompt, strlen(prompt) + 1), "prompt changed");
        off += strlen(prompt) + 1;
    }
    cr_assert_eq(off, n);
    er_free(data);
    remove(out);
}

// The example program of docs/cli.md, as printed there.
Test(reward_cmd, docs_example) {
    char prog[512];
    python_prog(prog, sizeof prog, "rc_doc",
                "import sys, json\n"
                "for q in map(json.loads, sys.stdin):\n"
                "    print(float(q[\"answer\"] is not None and q[\"answer\"] in q[\"completion\"]), flush=True)\n");
    RewardQuery q[3] = {{"p", "so it is 42.", "42", 64, 5}, {"p", "41", "42", 64, 1}, {"p", "42", NULL, 64, 1}};
    RewardTerms t[3];
    RewardCmd *r = start_ok(prog, 30);
    cr_assert_eq(reward_cmd_score(r, &q[0], &t[0]), ER_OK, "%s", er_last_error());
    cr_assert_eq(reward_cmd_score_many(r, q + 1, 2, t + 1), ER_OK, "%s", er_last_error());
    reward_cmd_free(r);
    cr_assert(t[0].value[0] == 1.0 && t[1].value[0] == 0.0 && t[2].value[0] == 0.0);
}

// A program that never answers: an error naming it, then free kills it and its process group.
Test(reward_cmd, timeout_no_reply) {
    RewardCmd *r = start_ok("sleep 30", 0.3);
    RewardQuery q = {"p", "c", "a", 1, 1};
    RewardTerms t;
    assert_error_has(reward_cmd_score(r, &q, &t), "reward program \"sleep 30\"", "no reply to query 1 of 1");
    assert_error_has(reward_cmd_score(r, &q, &t), "sleep 30", "earlier error");
    reward_cmd_free(r);
    assert_no_child();
}

// A program that does not read: a query larger than the socket's buffer stops at a write, and that times out.
Test(reward_cmd, timeout_not_reading) {
    enum { N = 2, LEN = 4 << 20 };
    char *text = er_alloc(LEN + 1);
    memset(text, 'x', LEN);
    text[LEN] = 0;
    RewardQuery *q = er_calloc(N, sizeof *q);
    RewardTerms *t = er_calloc(N, sizeof *t);
    for (int i = 0; i < N; i++)
        q[i] = (RewardQuery){"p", text, "a", 1, 1};
    RewardCmd *r = start_ok("sleep 30", 0.3);
    assert_error_has(reward_cmd_score_many(r, q, N, t), "sleep 30", "did not read query");
    reward_cmd_free(r);
    assert_no_child();
    er_free(text), er_free(q), er_free(t);
}

Test(reward_cmd, exits_after_first_line) {
    RewardCmd *r = start_ok("read l; echo 1", 30);
    RewardQuery q = {"p", "c", "a", 1, 1};
    RewardTerms t;
    cr_assert_eq(reward_cmd_score(r, &q, &t), ER_OK, "%s", er_last_error());
    cr_assert_eq(t.value[0], 1.0);
    assert_error_has(reward_cmd_score(r, &q, &t), "reward program \"read l; echo 1\"", "exited with status 0");
    reward_cmd_free(r);
    assert_no_child();
    // In one batch: the second reply never comes.
    r = start_ok("read l; echo 1", 30);
    RewardQuery qs[3] = {q, q, q};
    RewardTerms ts[3];
    assert_error_has(reward_cmd_score_many(r, qs, 3, ts), "read l; echo 1", "exited with status 0");
    reward_cmd_free(r);
}

Test(reward_cmd, killed_by_signal) {
    RewardCmd *r = start_ok("read l; kill -KILL $$", 30);
    RewardQuery q = {"p", "c", "a", 1, 1};
    RewardTerms t;
    assert_error_has(reward_cmd_score(r, &q, &t), "kill -KILL", "killed by signal 9");
    reward_cmd_free(r);
    assert_no_child();
}

// PROG closes its stdin while a big batch is still being written: the write fails with EPIPE, which must
// be an error status, not a SIGPIPE that kills this process.
Test(reward_cmd, closed_stdin_no_sigpipe) {
    enum { N = 600, LEN = 2048 };
    char *text = er_alloc(LEN + 1);
    memset(text, 'y', LEN);
    text[LEN] = 0;
    RewardQuery *q = er_calloc(N, sizeof *q);
    RewardTerms *t = er_calloc(N, sizeof *t);
    for (int i = 0; i < N; i++)
        q[i] = (RewardQuery){"p", text, "a", 1, 1};
    RewardCmd *r = start_ok("exec 0<&-; sleep 30", 30);
    assert_error_has(reward_cmd_score_many(r, q, N, t), "exec 0<&-", "stopped reading its stdin");
    reward_cmd_free(r);
    assert_no_child();
    er_free(text), er_free(q), er_free(t);
}

// One program answering `reply` to one query: the error it gives (the reply quoted) or ER_OK.
static int score_reply(const char *reply, RewardTerms *t) {
    char prog[2048];
    snprintf(prog, sizeof prog, "read l; printf '%%s\\n' '%s'", reply);
    RewardCmd *r = start_ok(prog, 30);
    RewardQuery q = {"p", "c", "a", 1, 1};
    int rc = reward_cmd_score(r, &q, t);
    reward_cmd_free(r);
    return rc;
}

Test(reward_cmd, malformed_replies) {
    RewardTerms t;
    assert_error_has(score_reply("hello", &t), "reply 1 is not a number or a JSON object of numbers", "\"hello\"");
    cr_assert(strstr(er_last_error(), "reward program \"read l;"), "%s", er_last_error());
    assert_error_has(score_reply("0.5 0.25", &t), "is not a number", "\"0.5 0.25\"");
    assert_error_has(score_reply("\"0.5\"", &t), "is not a number", NULL);
    assert_error_has(score_reply("[1]", &t), "is not a number", NULL);
    assert_error_has(score_reply("{}", &t), "is not a number", NULL);
    assert_error_has(score_reply("", &t), "is not a number", NULL);
    assert_error_has(score_reply("{\"a\": \"1\"}", &t), "not a finite number", NULL);
    assert_error_has(score_reply("{\"a\": 1, \"a\": 2}", &t), "twice", NULL);
    assert_error_has(score_reply("{\"a\":1,\"b\":2,\"c\":3,\"d\":4,\"e\":5,\"f\":6,\"g\":7,\"h\":8,\"i\":9}", &t),
                     "more than 8 terms", NULL);
    assert_error_has(score_reply("{\"abcdefghijabcdefghijabcdefghijab\": 1}", &t), "longer than 31 bytes", NULL);
    cr_assert_eq(score_reply("{\"abcdefghijabcdefghijabcdefghija\": 1}", &t), ER_OK, "%s", er_last_error());
    cr_assert_str_eq(t.name[0], "abcdefghijabcdefghijabcdefghija");
    // A long bad line is quoted cut, to about 80 bytes.
    char long_reply[400];
    memset(long_reply, 'z', 300);
    long_reply[300] = 0;
    assert_error_has(score_reply(long_reply, &t), "zzz...\"", NULL);
    cr_assert_lt(strlen(er_last_error()), 300);
    assert_no_child();
}

Test(reward_cmd, nan_and_inf_replies) {
    RewardTerms t;
    assert_error_has(score_reply("nan", &t), "reply 1 is not a finite number", "\"nan\"");
    assert_error_has(score_reply("NaN", &t), "not a finite number", NULL);
    assert_error_has(score_reply("-inf", &t), "not a finite number", NULL);
    assert_error_has(score_reply("1e999", &t), "not a finite number", NULL);
    assert_error_has(score_reply("{\"ok\": 1, \"len\": 1e999}", &t), "not a finite number", NULL);
}

// A reply over 1 MiB without a newline is refused (read no further than the limit).
Test(reward_cmd, line_too_long) {
    RewardCmd *r = start_ok("read l; head -c 2000000 /dev/zero | tr '\\0' 7", 30);
    RewardQuery q = {"p", "c", "a", 1, 1};
    RewardTerms t;
    assert_error_has(reward_cmd_score(r, &q, &t), "reply 1 is longer than 1 MiB", "\"777");
    reward_cmd_free(r);
}

// Both lines in one write (printf is one write of 4 bytes, atomic on a pipe), so they arrive together.
Test(reward_cmd, more_replies_than_queries) {
    RewardCmd *r = start_ok("while read l; do printf '1\\n2\\n'; done", 30);
    RewardQuery q = {"p", "c", "a", 1, 1};
    RewardTerms t;
    int rc = reward_cmd_score(r, &q, &t);
    if (rc == ER_OK) // the second line had not arrived yet: the next call finds it
        rc = reward_cmd_score(r, &q, &t);
    assert_error_has(rc, "not asked for", "\"2\"");
    reward_cmd_free(r);
}

Test(reward_cmd, program_not_found) {
    RewardCmd *r = NULL;
    int rc = reward_cmd_start("/nonexistent/er_reward_prog --flag", 30, &r);
    if (rc == ER_OK) { // /bin/sh had not failed yet within start's grace: the first score tells
        RewardQuery q = {"p", "c", "a", 1, 1};
        RewardTerms t;
        rc = reward_cmd_score(r, &q, &t);
        reward_cmd_free(r);
    } else {
        cr_assert_null(r);
    }
    assert_error_has(rc, "reward program \"/nonexistent/er_reward_prog --flag\"", "status 127");
    assert_no_child();
}

Test(reward_cmd, bad_arguments) {
    RewardCmd *r = (RewardCmd *)1;
    assert_error_has(reward_cmd_start("", 1, &r), "command is empty", NULL);
    cr_assert_null(r);
    assert_error_has(reward_cmd_start("cat", 0, &r), "timeout", "\"cat\"");
    assert_error_has(reward_cmd_start("cat", NAN, &r), "timeout", NULL);
    assert_error_has(reward_cmd_score_many(NULL, NULL, 1, NULL), "NULL", NULL);
}

// 5000 completions of 2 KiB in one call, each reply ~200 bytes: about 10 MB in and 1 MB out, far past
// both pipes' buffers, so writing everything before reading anything would deadlock.
Test(reward_cmd, many_queries_one_batch) {
    enum { N = 5000, LEN = 2048 };
    char prog[512];
    python_prog(prog, sizeof prog, "rc_many",
                "import sys, json\n"
                "for l in sys.stdin:\n"
                "    q = json.loads(l)\n"
                "    print(json.dumps({'n': len(q['completion']), 'i': q['length'], 'pad': 0.0}) + ' ' * 160,\n"
                "          flush=True)\n");
    char *text = er_alloc(LEN + 1);
    for (int i = 0; i < LEN; i++)
        text[i] = (char)('a' + i % 26);
    text[LEN] = 0;
    RewardQuery *q = er_calloc(N, sizeof *q);
    RewardTerms *t = er_calloc(N, sizeof *t);
    for (int i = 0; i < N; i++)
        q[i] = (RewardQuery){"p", text + i % 100, "a", 1, i}; // lengths LEN - i % 100
    RewardCmd *r = start_ok(prog, 60);
    cr_assert_eq(reward_cmd_score_many(r, q, N, t), ER_OK, "%s", er_last_error());
    for (int i = 0; i < N; i++) {
        cr_assert_eq(t[i].n, 3);
        cr_assert_eq(t[i].value[0], LEN - i % 100, "reply %d", i);
        cr_assert_eq(t[i].value[1], i, "reply %d answers another query", i);
    }
    reward_cmd_free(r);
    assert_no_child();
    er_free(text), er_free(q), er_free(t);
}
