// The embedding example ($ER_BUILD/example, built by `make` from infer/examples/example.c, which uses
// only infer/erinfer.h): it streams a reply from a tiny model dir, its streamed token count agrees
// with the sample and the stats, and a bad model path is one clear error line with exit 1. The
// Makefile links it from example.o and the shipped liberinfer.a alone, so its running proves the runtime library
// needs nothing of the training tier; here the header also compiles alone, as C99 and as C++.
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "tests/common/helpers.h"

static HelperFixture fx; // per test: the temp dir, tmp/model, $ER_BUILD/example

static void setup(void) { helper_fixture_open(&fx, "er_example_", "example"); }
static void teardown(void) { helper_fixture_close(&fx); }
TestSuite(example, .init = setup, .fini = teardown);

static void need_example(void) { helper_need_program(fx.prog, "example", "example tests"); }

Test(example, streams_and_reports_stats) {
    need_example();
    CmdResult r = helper_run(fx.tmp, "'%s' '%s' 'Start with 2. Add 3. What is the result?'", fx.prog, fx.model);
    cr_assert_eq(r.status, 0, "example exited %d: %s", r.status, r.err);
    cr_assert_str_empty(r.err, "example wrote to stderr: %s", r.err);
    cr_assert(strncmp(r.out, "prompt: Start with 2. Add 3. What is the result?\nreply: ", 56) == 0,
              "unexpected start of output:\n%s", r.out);
    const char *s = strstr(r.out, "\nstreamed ");
    cr_assert(s, "no \"streamed\" line:\n%s", r.out);
    long streamed = -1, generated = -1;
    size_t bytes = 0;
    int sample_tokens = -1, prompt = -1;
    char finish[16] = "";
    cr_assert_eq(sscanf(s, "\nstreamed %ld tokens, %zu bytes", &streamed, &bytes), 2, "%s", s);
    s = strstr(s, "\nsample: ");
    cr_assert(s, "no \"sample\" line:\n%s", r.out);
    cr_assert_eq(sscanf(s, "\nsample: %d tokens, finish %15s", &sample_tokens, finish), 2, "%s", s);
    s = strstr(s, "\nstats: ");
    cr_assert(s, "no \"stats\" line:\n%s", r.out);
    cr_assert_eq(sscanf(s, "\nstats: prompt %d tokens, generated %ld tokens", &prompt, &generated), 2, "%s", s);
    cr_assert(sample_tokens >= 1 && sample_tokens <= 48, "%d tokens, expected 1..48 (max_new_tokens)", sample_tokens);
    cr_assert_eq(streamed, sample_tokens, "the callback ran %ld times for %d tokens", streamed, sample_tokens);
    cr_assert_eq(generated, sample_tokens);
    cr_assert_gt(prompt, 10, "the chat-templated prompt has only %d tokens", prompt);
    cr_assert(strcmp(finish, "eos") == 0 || strcmp(finish, "length") == 0, "finish \"%s\"", finish);
    cr_assert_eq(strcmp(finish, "length") == 0, sample_tokens == 48, "finish %s with %d tokens", finish,
                 sample_tokens);
    // The streamed bytes sit between "reply: " and the "streamed" line.
    const char *reply = r.out + 56, *end = strstr(r.out, "\nstreamed ");
    cr_assert_eq((size_t)(end - reply), bytes, "streamed %zu bytes but printed %zu", bytes, (size_t)(end - reply));
    helper_result_free(&r);
}

Test(example, bad_model_path_is_one_error_line) {
    need_example();
    CmdResult r = helper_run(fx.tmp, "'%s' '%s/no_such_model'", fx.prog, fx.tmp);
    cr_assert_eq(r.status, 1, "exit status %d, expected 1; stderr: %s", r.status, r.err);
    cr_assert_eq(helper_count_lines(r.err), 1, "expected one line on stderr, got:\n%s", r.err);
    cr_assert(strncmp(r.err, "example: loading the model: ", 28) == 0, "%s", r.err);
    cr_assert(strstr(r.err, "no_such_model"), "the error does not name the path: %s", r.err);
    helper_result_free(&r);

    r = helper_run(fx.tmp, "'%s'", fx.prog);
    cr_assert_eq(r.status, 1, "no arguments: exit status %d, expected 1", r.status);
    cr_assert(strstr(r.err, "usage:"), "no arguments: no usage line: %s", r.err);
    helper_result_free(&r);
}

// A copy of infer/erinfer.h alone on the include path, as make install puts it (include/erinfer.h): the
// example compiles as strict C99, and a C++ file using the header compiles too (extern "C", no C-only
// constructs).
Test(example, header_compiles_alone_as_c_and_cpp) {
    if (access("infer/examples/example.c", R_OK) != 0)
        cr_skip_test("not run from the repository root");
    CmdResult r = helper_run(fx.tmp, "command -v c++");
    if (r.status != 0)
        cr_skip_test("!!!!!! no c++ compiler - header test SKIPPED !!!!!!");
    helper_result_free(&r);
    r = helper_run(fx.tmp, "mkdir -p '%s/inc' && cp infer/erinfer.h '%s/inc/'", fx.tmp, fx.tmp);
    cr_assert_eq(r.status, 0, "%s", r.err);
    helper_result_free(&r);

    r = helper_run(fx.tmp, "${CC:-cc} -std=c99 -pedantic -Wall -Wextra -Werror -fsyntax-only -I'%s/inc' "
                        "infer/examples/example.c", fx.tmp);
    cr_assert_eq(r.status, 0, "the example does not compile with erinfer.h alone:\n%s", r.err);
    helper_result_free(&r);

    char *cpp = path_join(fx.tmp, "use.cpp");
    FILE *f = fopen(cpp, "w");
    cr_assert(f);
    fputs("#include \"erinfer.h\"\n"
          "int main() {\n"
          "    ErGenParams p;\n"
          "    er_gen_params_init(&p);\n"
          "    static const char *const stops[] = {\"\\n\"};\n"
          "    p.stop = stops;\n"
          "    p.n_stop = 1;\n"
          "    return er_status_name(ER_EINVAL)[0] == 0 || er_version()[0] == 0;\n"
          "}\n",
          f);
    cr_assert_eq(fclose(f), 0);
    r = helper_run(fx.tmp, "c++ -std=c++11 -pedantic -Wall -Wextra -Werror -fsyntax-only -I'%s/inc' '%s'", fx.tmp, cpp);
    cr_assert_eq(r.status, 0, "erinfer.h does not compile as C++:\n%s", r.err);
    helper_result_free(&r);
    er_free(cpp);
}
