// The rest of core/: JSON getters and JSONL streaming, the flag parser, the RNG (against an
// independent reimplementation of splitmix64 + xoshiro256**), atomic writes and directories,
// allocation and error recording.
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/args.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/gemm.h"
#include "core/json.h"
#include "core/progress.h"
#include "core/rng.h"
#include "tests/core/helpers.h"

// ---------------------------------------------------------------------------------------------
// helpers

static char *tmp_dir(void) {
    char tmpl[] = "/tmp/er_core_XXXXXX";
    cr_assert_not_null(mkdtemp(tmpl), "mkdtemp failed");
    return strdup(tmpl);
}

static char *tmp_text(const char *dir, const char *name, const char *text) {
    char *path = path_join(dir, name);
    cr_assert_not_null(path);
    FILE *fp = fopen(path, "wb");
    cr_assert_not_null(fp);
    fputs(text, fp);
    fclose(fp);
    return path;
}

static void rm_rf(const char *path) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    cr_assert_eq(system(cmd), 0);
}

#define ASSERT_ERR(expr, status, substr)                                                          \
    do {                                                                                          \
        er_clear_error();                                                                         \
        int rc_ = (expr);                                                                         \
        cr_assert_eq(rc_, (status), "%s returned %d, want %d (%s)", #expr, rc_, (status),         \
                     er_last_error());                                                            \
        cr_assert_not_null(strstr(er_last_error(), (substr)), "message lacks \"%s\": %s", (substr), \
                           er_last_error());                                                      \
    } while (0)

// ---------------------------------------------------------------------------------------------
// json

Test(json, getters_values_and_errors) {
    cJSON *j = cJSON_Parse("{\"n\":42,\"neg\":-7,\"x\":2.5,\"s\":\"hi\",\"b\":true,\"nul\":null,\"big\":1e300,"
                           "\"frac\":1.5,\"arr\":[1]}");
    cr_assert_not_null(j);
    int64_t i = 0;
    double d = 0;
    const char *s = NULL;
    int b = 0;
    cr_assert_eq(json_get_int(j, "n", &i, "cfg.json"), ER_OK);
    cr_assert_eq(i, 42);
    cr_assert_eq(json_get_int(j, "neg", &i, "cfg.json"), ER_OK);
    cr_assert_eq(i, -7);
    cr_assert_eq(json_get_double(j, "x", &d, "cfg.json"), ER_OK);
    cr_assert_eq(d, 2.5);
    cr_assert_eq(json_get_double(j, "n", &d, "cfg.json"), ER_OK);
    cr_assert_eq(d, 42.0);
    cr_assert_eq(json_get_string(j, "s", &s, "cfg.json"), ER_OK);
    cr_assert_str_eq(s, "hi");
    cr_assert_eq(json_opt_bool(j, "b", &b, "cfg.json"), ER_OK);
    cr_assert_eq(b, 1);

    ASSERT_ERR(json_get_int(j, "missing", &i, "cfg.json"), ER_EFORMAT, "cfg.json: missing field \"missing\"");
    ASSERT_ERR(json_get_int(j, "s", &i, "cfg.json"), ER_EFORMAT, "field \"s\" must be a number");
    ASSERT_ERR(json_get_int(j, "frac", &i, "cfg.json"), ER_EFORMAT, "field \"frac\" must be an integer");
    ASSERT_ERR(json_get_int(j, "big", &i, "cfg.json"), ER_EFORMAT, "field \"big\" must be an integer");
    ASSERT_ERR(json_get_int(j, "nul", &i, "cfg.json"), ER_EFORMAT, "missing field \"nul\"");
    ASSERT_ERR(json_get_double(j, "s", &d, "x.json:3"), ER_EFORMAT, "x.json:3: field \"s\" must be a number");
    ASSERT_ERR(json_get_double(j, "nope", &d, "cfg.json"), ER_EFORMAT, "missing field \"nope\"");
    ASSERT_ERR(json_get_string(j, "n", &s, "cfg.json"), ER_EFORMAT, "field \"n\" must be a string");
    ASSERT_ERR(json_get_string(j, "nope", &s, "cfg.json"), ER_EFORMAT, "missing field \"nope\"");
    ASSERT_ERR(json_opt_bool(j, "n", &b, "cfg.json"), ER_EFORMAT, "field \"n\" must be true or false");
    ASSERT_ERR(json_opt_int(j, "arr", &i, "cfg.json"), ER_EFORMAT, "field \"arr\" must be a number");
    ASSERT_ERR(json_opt_string(j, "b", &s, "cfg.json"), ER_EFORMAT, "field \"b\" must be a string");
    ASSERT_ERR(json_opt_double(j, "s", &d, "cfg.json"), ER_EFORMAT, "field \"s\" must be a number");

    // optional getters leave the output alone when the key is absent or null
    i = 5;
    d = 6;
    s = "keep";
    b = 7;
    cr_assert_eq(json_opt_int(j, "absent", &i, "c"), ER_OK);
    cr_assert_eq(json_opt_int(j, "nul", &i, "c"), ER_OK);
    cr_assert_eq(json_opt_double(j, "absent", &d, "c"), ER_OK);
    cr_assert_eq(json_opt_string(j, "nul", &s, "c"), ER_OK);
    cr_assert_eq(json_opt_bool(j, "absent", &b, "c"), ER_OK);
    cr_assert(i == 5 && d == 6 && strcmp(s, "keep") == 0 && b == 7);
    cr_assert_eq(json_opt_int(j, "n", &i, "c"), ER_OK);
    cr_assert_eq(i, 42);
    cJSON_Delete(j);
}

Test(json, parse_and_write_files) {
    char *dir = tmp_dir();
    char *good = tmp_text(dir, "good.json", "{\"a\": [1, 2], \"b\": \"x\"}\n");
    char *bad = tmp_text(dir, "bad.json", "{\"a\": [1, 2}");
    cJSON *j = NULL;
    cr_assert_eq(json_parse_file(good, 1 << 20, &j), ER_OK, "%s", er_last_error());
    cr_assert_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "a")), 2);
    cJSON *back = NULL;
    char *out = path_join(dir, "out.json");
    cr_assert_eq(json_write_file(out, j), ER_OK, "%s", er_last_error());
    cr_assert_eq(json_parse_file(out, 1 << 20, &back), ER_OK);
    cr_assert(cJSON_Compare(j, back, 1), "written JSON differs");
    cJSON_Delete(back);
    cJSON_Delete(j);
    cr_assert_eq(dir_entries(dir), 3, "temporary file left behind");

    j = (cJSON *)1;
    ASSERT_ERR(json_parse_file(bad, 1 << 20, &j), ER_EFORMAT, "not valid JSON");
    cr_assert_not_null(strstr(er_last_error(), bad));
    cr_assert_null(j);
    ASSERT_ERR(json_parse_file(good, 4, &j), ER_ERANGE, good);
    char *trail = tmp_text(dir, "trail.json", "{\"a\": 1}  \n x");
    ASSERT_ERR(json_parse_file(trail, 1 << 20, &j), ER_EFORMAT, "unexpected data after the value");
    cr_assert_null(j);
    free(trail);
    char *missing = path_join(dir, "missing.json");
    ASSERT_ERR(json_parse_file(missing, 1 << 20, &j), ER_EIO, missing);
    free(good);
    free(bad);
    free(out);
    free(missing);
    rm_rf(dir);
    free(dir);
}

// JSONL text whose first `good` lines read and whose next one fails with "<file>:<where>" in the
// message; returns what jsonl_next left in its object.
static cJSON *expect_jsonl_error(const char *dir, const char *name, const char *text, int good, const char *where) {
    char *path = tmp_text(dir, name, text);
    JsonlReader r;
    cJSON *o;
    cr_assert_eq(jsonl_open(&r, path), ER_OK);
    for (int i = 0; i < good; i++) {
        cr_assert_eq(jsonl_next(&r, &o), 1);
        cJSON_Delete(o);
    }
    char want[512];
    snprintf(want, sizeof want, "%s:%s", path, where);
    ASSERT_ERR(jsonl_next(&r, &o), ER_EFORMAT, want);
    jsonl_close(&r);
    free(path);
    return o;
}

Test(json, jsonl_lines_blank_and_errors) {
    char *dir = tmp_dir();
    char *path = tmp_text(dir, "d.jsonl",
                          "{\"i\":1}\n"
                          "\n"
                          "   \n"
                          "{\"i\":2}\r\n"
                          "\t\n"
                          "{\"i\":3}" // no final newline
    );
    JsonlReader r;
    cr_assert_eq(jsonl_open(&r, path), ER_OK);
    cJSON *o;
    for (int want = 1; want <= 3; want++) {
        cr_assert_eq(jsonl_next(&r, &o), 1, "line for i=%d: %s", want, er_last_error());
        cr_assert_eq(cJSON_GetObjectItem(o, "i")->valueint, want);
        cJSON_Delete(o);
    }
    cr_assert_eq(r.lineno, 6);
    cr_assert_eq(jsonl_next(&r, &o), 0);
    cr_assert_null(o);
    cr_assert_eq(jsonl_next(&r, &o), 0, "end of file is sticky");
    jsonl_close(&r);
    free(path);

    // malformed line 3 (after a blank line): the error names file:3
    cr_assert_null(expect_jsonl_error(dir, "bad.jsonl", "{\"i\":1}\n\n{\"i\":\n{\"i\":4}\n", 1, "3: not valid JSON"));

    // text that is not UTF-8 is refused by the reader, with its line and column (it reached the
    // tokenizer, whose message named no file)
    expect_jsonl_error(dir, "utf8.jsonl", "{\"t\":\"ok\"}\n{\"t\":\"a\xff b\"}\n", 1, "2: not valid UTF-8 (column 8)");
    path = tmp_text(dir, "utf8.json", "{\"t\": \"\xc3\x28\"}");
    ASSERT_ERR(json_parse_file(path, 1 << 10, &o), ER_EFORMAT, "not valid UTF-8 (byte 7)");
    free(path);

    // a valid JSON value that is not an object is refused, with its line
    expect_jsonl_error(dir, "arr.jsonl", "{\"i\":1}\n[1,2]\n", 1, "2: each line must be a JSON object");

    // trailing garbage after an object on the same line
    expect_jsonl_error(dir, "trail.jsonl", "{\"i\":1} x\n", 0, "1:");

    char *missing = path_join(dir, "none.jsonl");
    ASSERT_ERR(jsonl_open(&r, missing), ER_EIO, missing);
    jsonl_close(&r); // safe after a failed open
    free(missing);
    rm_rf(dir);
    free(dir);
}

// ---------------------------------------------------------------------------------------------
// args

typedef struct {
    const char *name;
    int n;
    double lr;
    int verbose;
    const char *out;
} Opts;

static int parse(Opts *o, int argc, char **argv) {
    ArgSpec specs[] = {
        {"name", ARG_STR, &o->name, "model name", 0, 0, 0},
        {"n", ARG_INT, &o->n, "count", 0, 1, 64},
        {"lr", ARG_FLOAT, &o->lr, "learning rate", 0, 0, 1},
        {"verbose", ARG_FLAG, &o->verbose, "talk more", 0, 0, 0},
        {"out", ARG_STR, &o->out, "output dir", 1, 0, 0},
    };
    return args_parse(argc, argv, specs, 5, "test [flags]");
}

static Opts defaults(void) { return (Opts){.name = "base", .n = 8, .lr = 0.1, .verbose = 0, .out = NULL}; }

Test(args, types_and_forms) {
    Opts o = defaults();
    char *argv[] = {"prog", "--name", "qwen", "--n=32", "--lr", "2.5e-3", "--verbose", "--out", "/tmp/x"};
    cr_assert_eq(parse(&o, 9, argv), ER_OK, "%s", er_last_error());
    cr_assert_str_eq(o.name, "qwen");
    cr_assert_eq(o.n, 32);
    cr_assert_eq(o.lr, 2.5e-3);
    cr_assert_eq(o.verbose, 1);
    cr_assert_str_eq(o.out, "/tmp/x");
    // defaults stay when flags are absent; the range is inclusive; "--x=" gives an empty string
    o = defaults();
    char *argv2[] = {"prog", "--out=", "--n", "64", "--lr=1"};
    cr_assert_eq(parse(&o, 5, argv2), ER_OK, "%s", er_last_error());
    cr_assert_str_eq(o.out, "");
    cr_assert_str_eq(o.name, "base");
    cr_assert_eq(o.n, 64);
    cr_assert_eq(o.lr, 1.0);
    cr_assert_eq(o.verbose, 0);
}

// Text flags decode \n \t \r \\ (shells pass them literally); other backslashes and plain string
// flags stay as typed.
Test(args, text_flags_decode_escapes) {
    const char *text = NULL, *plain = NULL;
    ArgSpec specs[] = {
        {"prefix", ARG_TEXT, &text, "text", 0, 0, 0},
        {"path", ARG_STR, &plain, "path", 0, 0, 0},
    };
    char a1[] = "--prefix", a2[] = "<think>\\n\\tx\\\\y\\q\\r", a3[] = "--path=a\\nb";
    char *argv[] = {"prog", a1, a2, a3};
    cr_assert_eq(args_parse(4, argv, specs, 2, "prog"), ER_OK, "%s", er_last_error());
    cr_assert_str_eq(text, "<think>\n\tx\\y\\q\r");
    cr_assert_str_eq(plain, "a\\nb");
    char b1[] = "--prefix=end\\n";
    char *argv2[] = {"prog", b1};
    cr_assert_eq(args_parse(2, argv2, specs, 2, "prog"), ER_OK, "%s", er_last_error());
    cr_assert_str_eq(text, "end\n");
}

Test(args, errors) {
    struct {
        int argc;
        char *argv[6];
        int status;
        const char *msg;
    } cases[] = {
        {3, {"p", "--out", "o"}, ER_OK, ""},
        {5, {"p", "--out", "o", "--n", "1.5"}, ER_EINVAL, "--n: expected an integer"},
        {5, {"p", "--out", "o", "--n", "abc"}, ER_EINVAL, "--n: expected a number, got \"abc\""},
        {5, {"p", "--out", "o", "--n", "12x"}, ER_EINVAL, "--n: expected a number"},
        {5, {"p", "--out", "o", "--n", "0"}, ER_ERANGE, "--n: 0 is out of range [1, 64]"},
        {5, {"p", "--out", "o", "--n", "65"}, ER_ERANGE, "out of range"},
        {5, {"p", "--out", "o", "--lr", "-0.5"}, ER_ERANGE, "--lr: -0.5 is out of range"},
        {5, {"p", "--out", "o", "--lr", "nan"}, ER_EINVAL, "--lr: expected a number"},
        {5, {"p", "--out", "o", "--n", "99999999999"}, ER_EINVAL, "expected an integer"},
        {5, {"p", "--out", "o", "--bogus", "1"}, ER_EINVAL, "unknown flag \"--bogus\""},
        {4, {"p", "--out", "o", "--nn=3"}, ER_EINVAL, "unknown flag \"--nn\""},
        {4, {"p", "--out", "o", "--n"}, ER_EINVAL, "--n needs a value"},
        {2, {"p", "--out"}, ER_EINVAL, "--out needs a value"},
        {4, {"p", "--out", "o", "--verbose=1"}, ER_EINVAL, "--verbose takes no value"},
        {4, {"p", "--out", "o", "stray"}, ER_EINVAL, "unexpected argument \"stray\""},
        {3, {"p", "--n", "3"}, ER_EINVAL, "missing required flag --out"},
        {1, {"p"}, ER_EINVAL, "missing required flag --out"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        Opts o = defaults();
        er_clear_error();
        int rc = parse(&o, cases[i].argc, cases[i].argv);
        cr_assert_eq(rc, cases[i].status, "case %zu: got %d (%s)", i, rc, er_last_error());
        if (rc < 0)
            cr_assert_not_null(strstr(er_last_error(), cases[i].msg), "case %zu: message \"%s\" lacks \"%s\"", i,
                               er_last_error(), cases[i].msg);
    }
}

Test(args, help_returns_args_help) {
    char *dir = tmp_dir();
    char *cap = path_join(dir, "stdout.txt");
    const char *forms[] = {"--help", "-h"};
    for (int k = 0; k < 2; k++) {
        Opts o = defaults();
        char *argv[] = {"prog", "--n", "3", (char *)forms[k], "--bogus"}; // help wins over later errors
        fflush(stdout);
        int saved = dup(1);
        FILE *fp = fopen(cap, "w");
        dup2(fileno(fp), 1);
        int rc = parse(&o, 5, argv);
        fflush(stdout);
        dup2(saved, 1);
        close(saved);
        fclose(fp);
        cr_assert_eq(rc, ARGS_HELP, "%s returned %d", forms[k], rc);
        cr_assert_eq(o.n, 3);
        char text[4096] = {0};
        fp = fopen(cap, "r");
        size_t n = fread(text, 1, sizeof text - 1, fp);
        fclose(fp);
        cr_assert_gt(n, 0, "help printed nothing");
        cr_assert_not_null(strstr(text, "usage: test [flags]"), "%s", text);
        cr_assert_not_null(strstr(text, "--lr X"), "%s", text);
        cr_assert_not_null(strstr(text, "learning rate"), "%s", text);
        cr_assert_not_null(strstr(text, "(required)"), "%s", text);
        cr_assert_not_null(strstr(text, "--help"), "%s", text);
    }
    free(cap);
    rm_rf(dir);
    free(dir);
}

// A library message that starts with the command's own name loses it under the command's prefix.
Test(args, error_text_drops_the_repeated_command_name) {
    cr_assert_str_eq(args_error_text("quantize", "quantize: the model is already quantized"),
                     "the model is already quantized");
    cr_assert_str_eq(args_error_text("synth chains", "chains: n must be >= 1"), "n must be >= 1");
    cr_assert_str_eq(args_error_text("generate", "fpt: not this one"), "fpt: not this one");
    cr_assert_str_eq(args_error_text("eval", "evaluation: x"), "evaluation: x");
}

// ---------------------------------------------------------------------------------------------
// rng

Test(rng, matches_reference_xoshiro256starstar) {
    // Computed with an independent Python implementation of splitmix64 seeding + xoshiro256**
    // (splitmix64 from 0 gives 0xe220a8397b1dcdaf, the published first value).
    static const uint64_t want0[4] = {0x99ec5f36cb75f2b4ULL, 0xbf6e1f784956452aULL, 0x1a5f849d4933e6e0ULL,
                                      0x6aa594f1262d2d2cULL};
    static const uint64_t want42[4] = {0x15780b2e0c2ec716ULL, 0x6104d9866d113a7eULL, 0xae17533239e499a1ULL,
                                       0xecb8ad4703b360a1ULL};
    ErRng r;
    rng_seed(&r, 0);
    cr_assert_eq(r.s[0], 0xe220a8397b1dcdafULL);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(rng_u64(&r), want0[i], "seed 0 draw %d", i);
    rng_seed(&r, 42);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(rng_u64(&r), want42[i], "seed 42 draw %d", i);
}

Test(rng, determinism_and_forks) {
    ErRng a, b, c;
    rng_seed(&a, 7);
    rng_seed(&b, 7);
    rng_seed(&c, 8);
    int same_c = 0;
    for (int i = 0; i < 1000; i++) {
        uint64_t x = rng_u64(&a);
        cr_assert_eq(x, rng_u64(&b));
        same_c += x == rng_u64(&c);
    }
    cr_assert_eq(same_c, 0, "seeds 7 and 8 collide");
    // state is plain data: a copy continues identically (what checkpoints rely on)
    ErRng saved = a;
    uint64_t next = rng_u64(&a);
    cr_assert_eq(rng_u64(&saved), next);
    // forks: deterministic, distinct per stream, and they do not advance the parent
    ErRng p, f1, f1b, f2;
    rng_seed(&p, 123);
    ErRng p0 = p;
    rng_fork(&f1, &p, 1);
    rng_fork(&f1b, &p, 1);
    rng_fork(&f2, &p, 2);
    cr_assert_eq(memcmp(&p, &p0, sizeof p), 0);
    int same12 = 0, same1p = 0;
    for (int i = 0; i < 1000; i++) {
        uint64_t x1 = rng_u64(&f1), x2 = rng_u64(&f2), xp = rng_u64(&p);
        cr_assert_eq(x1, rng_u64(&f1b));
        same12 += x1 == x2;
        same1p += x1 == xp;
    }
    cr_assert_eq(same12, 0);
    cr_assert_eq(same1p, 0);
}

Test(rng, below_range_and_uniformity) {
    ErRng r;
    rng_seed(&r, 2024);
    const uint32_t ns[] = {1, 2, 3, 7, 10, 1000, 0x80000001u, 0xc0000000u, 0xffffffffu};
    for (size_t k = 0; k < sizeof ns / sizeof *ns; k++)
        for (int i = 0; i < 20000; i++) {
            uint32_t v = rng_below(&r, ns[k]);
            cr_assert_lt(v, ns[k], "rng_below(%u) gave %u", ns[k], v);
        }
    // chi-square over 10 buckets, 100k draws: df = 9, P(chi2 > 40) < 1e-5
    int counts[10] = {0};
    const int N = 100000;
    for (int i = 0; i < N; i++)
        counts[rng_below(&r, 10)]++;
    double chi2 = 0;
    for (int b = 0; b < 10; b++)
        chi2 += (counts[b] - N / 10.0) * (counts[b] - N / 10.0) / (N / 10.0);
    cr_assert_lt(chi2, 40.0, "chi-square %.1f: rng_below(10) is not uniform", chi2);
    // a range where a plain modulo would be badly biased: n = 3 * 2^30. Unbiased, the fraction of
    // draws below 2^31 is 2/3; (32 random bits) mod n would give 3/4.
    int low = 0;
    for (int i = 0; i < N; i++)
        low += rng_below(&r, 0xc0000000u) < 0x80000000u;
    cr_assert(fabs(low / (double)N - 2.0 / 3.0) < 0.01, "fraction below 2^31: %.4f", low / (double)N);
    // every value of a small range shows up
    int seen[7] = {0};
    for (int i = 0; i < 1000; i++)
        seen[rng_below(&r, 7)] = 1;
    for (int b = 0; b < 7; b++)
        cr_assert(seen[b], "value %d never drawn", b);
}

Test(rng, uniform_and_normal) {
    ErRng r;
    rng_seed(&r, 5);
    const int N = 200000;
    double sum = 0, sum2 = 0, nsum = 0, nsum2 = 0;
    for (int i = 0; i < N; i++) {
        float u = rng_uniform(&r);
        double ud = rng_uniform_f64(&r);
        cr_assert(u >= 0.0f && u < 1.0f, "rng_uniform gave %g", u);
        cr_assert(ud >= 0.0 && ud < 1.0, "rng_uniform_f64 gave %g", ud);
        sum += u;
        sum2 += (double)u * u;
        float z = rng_normal(&r);
        cr_assert(isfinite(z));
        nsum += z;
        nsum2 += (double)z * z;
    }
    double mean = sum / N, var = sum2 / N - mean * mean;
    cr_assert(fabs(mean - 0.5) < 0.005, "uniform mean %.4f", mean);
    cr_assert(fabs(var - 1.0 / 12) < 0.002, "uniform variance %.4f", var);
    double nmean = nsum / N, nvar = nsum2 / N - nmean * nmean;
    cr_assert(fabs(nmean) < 0.01, "normal mean %.4f", nmean);
    cr_assert(fabs(nvar - 1.0) < 0.02, "normal variance %.4f", nvar);
}

// ---------------------------------------------------------------------------------------------
// fileio

Test(fileio, atomic_write_and_read) {
    char *dir = tmp_dir();
    char *path = path_join(dir, "f.bin");
    const char data[] = "hello\0world";
    cr_assert_eq(file_write_atomic(path, data, sizeof data), ER_OK, "%s", er_last_error());
    cr_assert_eq(dir_entries(dir), 1, "temporary file left behind");
    char *back = NULL;
    size_t n = 0;
    cr_assert_eq(file_read_all(path, 1 << 20, &back, &n), ER_OK);
    cr_assert_eq(n, sizeof data);
    cr_assert_eq(memcmp(back, data, n), 0);
    cr_assert_eq(back[n], 0, "not NUL-terminated");
    er_free(back);
    // overwrite with something shorter, then with nothing
    cr_assert_eq(file_write_atomic(path, "ab", 2), ER_OK);
    cr_assert_eq(file_read_all(path, 1 << 20, &back, &n), ER_OK);
    cr_assert(n == 2 && memcmp(back, "ab", 2) == 0);
    er_free(back);
    cr_assert_eq(file_write_atomic(path, NULL, 0), ER_OK);
    cr_assert_eq(file_read_all(path, 1 << 20, &back, &n), ER_OK);
    cr_assert_eq(n, 0);
    er_free(back);
    cr_assert_eq(dir_entries(dir), 1);
    // size limit
    cr_assert_eq(file_write_atomic(path, "0123456789", 10), ER_OK);
    back = (char *)1;
    ASSERT_ERR(file_read_all(path, 9, &back, &n), ER_ERANGE, path);
    cr_assert_null(back);
    ASSERT_ERR(file_read_all(dir, 1 << 20, &back, &n), ER_EIO, "not a regular file");
    free(path);
    rm_rf(dir);
    free(dir);
}

Test(fileio, atomic_abort_and_failure_leave_nothing) {
    char *dir = tmp_dir();
    char *path = path_join(dir, "g.txt");
    // an existing file survives an aborted rewrite untouched
    cr_assert_eq(file_write_atomic(path, "old", 3), ER_OK);
    AtomicFile af;
    cr_assert_eq(atomic_open(&af, path), ER_OK);
    fputs("new contents", af.fp);
    cr_assert_eq(dir_entries(dir), 2, "the temporary file should exist while writing");
    atomic_abort(&af);
    cr_assert_eq(dir_entries(dir), 1);
    char *back;
    size_t n;
    cr_assert_eq(file_read_all(path, 100, &back, &n), ER_OK);
    cr_assert(n == 3 && memcmp(back, "old", 3) == 0);
    er_free(back);
    // commit replaces it
    cr_assert_eq(atomic_open(&af, path), ER_OK);
    fputs("new", af.fp);
    cr_assert_eq(atomic_commit(&af), ER_OK);
    cr_assert_null(af.fp);
    cr_assert_eq(file_read_all(path, 100, &back, &n), ER_OK);
    cr_assert(n == 3 && memcmp(back, "new", 3) == 0);
    er_free(back);
    cr_assert_eq(dir_entries(dir), 1);
    // a missing directory: an I/O error naming the path, nothing created
    char *bad = path_join(dir, "no/such/file");
    ASSERT_ERR(file_write_atomic(bad, "x", 1), ER_EIO, bad);
    cr_assert_eq(dir_entries(dir), 1);
    free(bad);
    free(path);
    rm_rf(dir);
    free(dir);
}

Test(fileio, dir_make_nested_and_paths) {
    char *dir = tmp_dir();
    char *deep = path_join(dir, "a/b/c");
    cr_assert_eq(dir_make(deep), ER_OK, "%s", er_last_error());
    cr_assert(path_is_dir(deep));
    cr_assert_eq(dir_make(deep), ER_OK, "existing directory should be fine");
    char *slash = path_join(dir, "x/y/");
    cr_assert_eq(dir_make(slash), ER_OK, "%s", er_last_error());
    cr_assert(path_is_dir(slash));
    // a file in the way
    char *file = tmp_text(dir, "afile", "x");
    cr_assert(path_exists(file));
    cr_assert(!path_is_dir(file));
    ASSERT_ERR(dir_make(file), ER_EIO, "not a directory");
    char *under = path_join(file, "sub");
    ASSERT_ERR(dir_make(under), ER_EIO, "cannot create directory");
    cr_assert(!path_exists(under));
    ASSERT_ERR(dir_make(""), ER_EINVAL, "empty");
    // path_join
    char *j1 = path_join("a", "b"), *j2 = path_join("a/", "b"), *j3 = path_join("", "b");
    cr_assert_str_eq(j1, "a/b");
    cr_assert_str_eq(j2, "a/b");
    cr_assert_str_eq(j3, "b");
    free(j1);
    free(j2);
    free(j3);
    free(deep);
    free(slash);
    free(file);
    free(under);
    rm_rf(dir);
    free(dir);
}

// A child that reads the fifo at path into out (the fifo's other end, as a pipe's reader would be).
static pid_t fifo_reader(const char *path, const char *out) {
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "cat '%s' > '%s'", path, out);
        _exit(system(cmd) == 0 ? 0 : 1);
    }
    return pid;
}

static char *read_text(const char *path) {
    char *text;
    size_t n;
    cr_assert_eq(file_read_all(path, 1 << 20, &text, &n), ER_OK, "%s", er_last_error());
    return text;
}

// Writing a path replaces only a regular file: a link's target is replaced (the link kept), a fifo and a
// char device are written in place (was: <path>.tmp.PID renamed over them, a device node turned into a
// regular file), a directory and a link to nothing are refused up front, "-" is stdout.
Test(fileio, outputs_by_kind_of_path) {
    char *dir = tmp_dir();
    char *file = tmp_text(dir, "target.txt", "old"), *link = path_join(dir, "link.txt");
    cr_assert_eq(symlink(file, link), 0);
    cr_assert_eq(file_write_atomic(link, "new", 3), ER_OK, "%s", er_last_error());
    struct stat st;
    cr_assert(lstat(link, &st) == 0 && S_ISLNK(st.st_mode), "the link was replaced by a file");
    char *text = read_text(file);
    cr_assert_str_eq(text, "new", "the link's target was not rewritten");
    er_free(text);

    char *fifo = path_join(dir, "fifo"), *got = path_join(dir, "got.txt");
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    pid_t pid = fifo_reader(fifo, got);
    cr_assert_eq(file_write_atomic(fifo, "through a pipe\n", 15), ER_OK, "%s", er_last_error());
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(lstat(fifo, &st) == 0 && S_ISFIFO(st.st_mode), "the fifo was replaced");
    text = read_text(got);
    cr_assert_str_eq(text, "through a pipe\n");
    er_free(text);

    // Char devices made here (never the real /dev entries): /dev/null's and /dev/full's numbers.
    char *null = path_join(dir, "null"), *full = path_join(dir, "full");
    cr_assert_eq(mknod(null, S_IFCHR | 0666, makedev(1, 3)), 0, "mknod: run the tests as root");
    cr_assert_eq(mknod(full, S_IFCHR | 0666, makedev(1, 7)), 0);
    cr_assert_eq(file_output_check(null), ER_OK, "%s", er_last_error());
    cr_assert_eq(file_write_atomic(null, "gone", 4), ER_OK, "%s", er_last_error());
    cr_assert(lstat(null, &st) == 0 && S_ISCHR(st.st_mode), "the device node was replaced");
    ASSERT_ERR(file_write_atomic(full, "x", 1), ER_EIO, "No space left");
    cr_assert(lstat(full, &st) == 0 && S_ISCHR(st.st_mode), "the device node was replaced");

    char *sub = path_join(dir, "sub"), *dangling = path_join(dir, "dangling");
    cr_assert_eq(dir_make(sub), ER_OK);
    cr_assert_eq(symlink("nowhere", dangling), 0);
    ASSERT_ERR(file_output_check(sub), ER_EIO, "is a directory");
    ASSERT_ERR(file_write_atomic(sub, "x", 1), ER_EIO, sub);
    ASSERT_ERR(file_output_check(dangling), ER_EIO, "symbolic link to nothing");
    ASSERT_ERR(file_write_atomic(dangling, "x", 1), ER_EIO, dangling);
    cr_assert(lstat(dangling, &st) == 0 && S_ISLNK(st.st_mode));
    int before = dir_entries(dir);

    // "-": file descriptor 1, here pointed at a file for the test.
    char *cap = path_join(dir, "stdout.txt");
    fflush(stdout);
    int saved = dup(1), fd = open(cap, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert(saved >= 0 && fd >= 0);
    dup2(fd, 1);
    close(fd);
    int rc = file_write_atomic("-", "to stdout\n", 10);
    dup2(saved, 1);
    close(saved);
    cr_assert_eq(rc, ER_OK, "%s", er_last_error());
    text = read_text(cap);
    cr_assert_str_eq(text, "to stdout\n");
    er_free(text);
    cr_assert_eq(dir_entries(dir), before + 1, "a temporary file was left behind");
    free(file), free(link), free(fifo), free(got), free(null), free(full), free(sub), free(dangling), free(cap);
    rm_rf(dir);
    free(dir);
}

// An output that is an input (the same file however it is spelled, a link included) is refused, and so is
// a model dir's own file; an output dir may not be, or hold, an input.
Test(fileio, outputs_never_overwrite_inputs) {
    char *dir = tmp_dir();
    char *data = tmp_text(dir, "data.jsonl", "{}\n"), *link = path_join(dir, "link.jsonl");
    cr_assert_eq(symlink(data, link), 0);
    char other[1200];
    snprintf(other, sizeof other, "%s/./data.jsonl", dir);
    ASSERT_ERR(file_output_not_input(other, data, "--data"), ER_EINVAL, "same file as --data");
    ASSERT_ERR(file_output_not_input(link, data, "--data"), ER_EINVAL, link);
    cr_assert_eq(file_output_not_input("-", "-", "--input"), ER_OK);
    char *fresh = path_join(dir, "out.jsonl");
    cr_assert_eq(file_output_not_input(fresh, data, "--data"), ER_OK);
    cr_assert_eq(file_output_not_input(fresh, NULL, "--adapter"), ER_OK);
    char *model = path_join(dir, "model");
    cr_assert_eq(dir_make(model), ER_OK);
    char *cfg = tmp_text(model, "config.json", "{}");
    ASSERT_ERR(file_output_not_input(cfg, model, "--model"), ER_EINVAL, "a file of --model");
    char *gguf = path_join(model, "model.gguf");
    cr_assert_eq(file_output_not_input(gguf, model, "--model"), ER_OK, "a new file beside the model's is fine");
    ASSERT_ERR(dir_output_not_input(model, model, "--model"), ER_EINVAL, "--model");
    ASSERT_ERR(dir_output_not_input(dir, data, "--data"), ER_EINVAL, "holds --data");
    cr_assert_eq(dir_output_not_input(model, data, "--data"), ER_OK);
    free(data), free(link), free(fresh), free(model), free(cfg), free(gguf);
    rm_rf(dir);
    free(dir);
}

// Output dirs are checked before any work; a staged dir appears whole or not at all.
Test(fileio, output_dirs_checked_and_staged) {
    char *dir = tmp_dir();
    char *dangling = path_join(dir, "dangling"), *file = tmp_text(dir, "file", "x");
    cr_assert_eq(symlink("nowhere", dangling), 0);
    ASSERT_ERR(dir_output_check(dangling), ER_EIO, "symbolic link to nothing");
    ASSERT_ERR(dir_output_check(file), ER_EIO, "not a directory");
    char *under = path_join(file, "a/b");
    ASSERT_ERR(dir_output_check(under), ER_EIO, "is not a directory");
    char *out = path_join(dir, "new/out");
    cr_assert_eq(dir_output_check(out), ER_OK, "%s", er_last_error());
    char *stage;
    cr_assert_eq(dir_stage_open(out, &stage), ER_OK, "%s", er_last_error());
    char *f = tmp_text(stage, "config.json", "{}");
    cr_assert(!path_exists(out), "the output appeared before it was whole");
    cr_assert_eq(dir_stage_commit(stage, out), ER_OK, "%s", er_last_error());
    char *g = path_join(out, "config.json");
    cr_assert(path_exists(g));
    char *empty = path_join(dir, "empty");
    cr_assert_eq(dir_make(empty), ER_OK);
    cr_assert_eq(dir_stage_open(empty, &stage), ER_OK);
    dir_stage_abort(stage);
    cr_assert_eq(dir_entries(empty), 0);
    free(dangling), free(file), free(under), free(out), free(f), free(g), free(empty);
    rm_rf(dir);
    free(dir);
}

// Paths are printed with one slash between a dir and a name, however the dir was typed.
Test(fileio, no_doubled_slashes) {
    char *a = path_join("runs//", "x"), *b = path_join("runs/", "/x");
    cr_assert_str_eq(a, "runs/x");
    cr_assert_str_eq(b, "runs/x");
    cr_assert_eq(path_dir_len("runs//"), 4);
    cr_assert_eq(path_dir_len("/"), 0);
    free(a), free(b);
}

// ---------------------------------------------------------------------------------------------
// alloc and error

Test(alloc, aligned_zeroed_and_overflow_checked) {
    for (size_t n = 0; n < 300; n += 37) {
        unsigned char *p = er_alloc(n);
        cr_assert_not_null(p);
        cr_assert_eq((uintptr_t)p % 64, 0, "er_alloc(%zu) not 64-byte aligned", n);
        memset(p, 0xcd, n);
        er_free(p);
    }
    int *z = er_calloc(1000, sizeof *z);
    cr_assert_not_null(z);
    cr_assert_eq((uintptr_t)z % 64, 0);
    for (int i = 0; i < 1000; i++)
        cr_assert_eq(z[i], 0);
    er_free(z);
    er_clear_error();
    cr_assert_null(er_calloc(SIZE_MAX / 2, 3));
    cr_assert_eq(er_last_status(), ER_ENOMEM);
    cr_assert_not_null(strstr(er_last_error(), "overflows"));
    er_clear_error();
    cr_assert_null(er_alloc(SIZE_MAX - 10));
    cr_assert_eq(er_last_status(), ER_ENOMEM);
    er_clear_error();
    cr_assert_null(er_realloc_array(NULL, SIZE_MAX / 4, 8));
    cr_assert_eq(er_last_status(), ER_ENOMEM);
    int *g = er_realloc_array(NULL, 10, sizeof *g);
    cr_assert_not_null(g);
    for (int i = 0; i < 10; i++)
        g[i] = i;
    g = er_realloc_array(g, 1000, sizeof *g);
    cr_assert_not_null(g);
    cr_assert_eq(g[9], 9);
    er_free(g);
    size_t out;
    cr_assert_eq(er_mul_size(SIZE_MAX / 2 + 1, 2, &out), -1);
    cr_assert_eq(er_mul_size(1u << 20, 1u << 20, &out), 0);
    cr_assert_eq(out, (size_t)1 << 40);
    cr_assert_eq(er_add_size(SIZE_MAX, 1, &out), -1);
    cr_assert_eq(er_add_size(SIZE_MAX - 1, 1, &out), 0);
    cr_assert_eq(out, SIZE_MAX);
    char *s = er_strdup("copy me");
    cr_assert_str_eq(s, "copy me");
    er_free(s);
}

Test(error, record_and_clear) {
    er_clear_error();
    cr_assert_str_eq(er_last_error(), "no error");
    cr_assert_eq(er_last_status(), ER_OK);
    cr_assert_eq(er_error(ER_EFORMAT, "%s: field \"%s\" bad (%d)", "f.json", "x", 3), ER_EFORMAT);
    cr_assert_str_eq(er_last_error(), "f.json: field \"x\" bad (3)");
    cr_assert_eq(er_last_status(), ER_EFORMAT);
    er_clear_error();
    cr_assert_str_eq(er_last_error(), "no error");
    const int all[] = {ER_OK, ER_EINVAL, ER_EIO, ER_ENOMEM, ER_EFORMAT, ER_EUNSUPPORTED, ER_ERANGE, ER_EABORTED};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        cr_assert_str_neq(er_status_name(all[i]), "unknown status");
    cr_assert_str_eq(er_status_name(-99), "unknown status");
    // long messages are cut, never overflow
    char big[3000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    er_error(ER_EIO, "%s", big);
    cr_assert_lt(strlen(er_last_error()), sizeof big - 1);
}

// Adding context to the message being replaced: the arguments point into the error buffer itself.
Test(error, context_from_the_last_message) {
    er_error(ER_ERANGE, "not finite (nan)");
    cr_assert_eq(er_error(er_last_status(), "step %d: %s", 1, er_last_error()), ER_ERANGE);
    cr_assert_str_eq(er_last_error(), "step 1: not finite (nan)");
    er_error(ER_EINVAL, "text is not valid UTF-8");
    cr_assert_eq(er_error_prefix(ER_EINVAL, "%s:%d", "data.jsonl", 7), ER_EINVAL);
    cr_assert_str_eq(er_last_error(), "data.jsonl:7: text is not valid UTF-8");
    cr_assert_eq(er_last_status(), ER_EINVAL);
    er_clear_error();
    er_error_prefix(ER_ENOMEM, "loading");
    cr_assert_str_eq(er_last_error(), "loading: out of memory");
}

// A resumed run's progress counts the run's own steps (41/60, not 1/20), its rate from where it began.
Test(progress, resumed_run_counts_the_runs_steps) {
    char path[] = "/tmp/er_progress_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    cr_assert_eq(dup2(fd, 2), 2);
    Progress p;
    progress_begin(&p, stderr, "sft", "step", 40, 60);
    cr_assert_eq(p.done, 40);
    progress_update(&p, 45, NULL);
    progress_end(&p, NULL);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    char *text;
    size_t n;
    cr_assert_eq(file_read_all(path, 1 << 16, &text, &n), ER_OK);
    unlink(path);
    cr_assert(strstr(text, "sft: 45/60 step"), "progress line: %s", text);
    er_free(text);
}

// The make the tests start must not inherit the caller's: under a parent `make -j2` a child make reads
// its jobserver from MAKEFLAGS and prints "make[2]: warning: jobserver unavailable" before anything else.
#define MAKE_ALONE "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make"

// The first line a shell command prints (empty when it prints nothing).
static void first_line_of(const char *cmd, char *line, size_t size) {
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen failed: %s", cmd);
    if (!fgets(line, (int)size, p))
        line[0] = 0;
    while (fgetc(p) != EOF) {
    }
    pclose(p);
}

// `make test` on a fresh machine failed at once (cjson/cJSON.h missing): test, bench, demo and fuzz
// must run scripts/deps.sh before anything else (a dry run shows what each would run first).
Test(build, make_targets_install_their_packages_first) {
    const char *targets[] = {"test", "bench", "demo", "fuzz"};
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        char cmd[128], line[512];
        snprintf(cmd, sizeof cmd, MAKE_ALONE " -n --no-print-directory %s 2>&1", targets[i]);
        first_line_of(cmd, line, sizeof line);
        const char *cmd0 = line; // past leading NAME=value settings (MPI=1 bash scripts/deps.sh)
        while (strchr(cmd0, '=') && strchr(cmd0, ' ') && strchr(cmd0, '=') < strchr(cmd0, ' '))
            cmd0 = strchr(cmd0, ' ') + 1;
        cr_assert(strncmp(cmd0, "bash scripts/deps.sh", 20) == 0, "`make %s` first runs: %s", targets[i], line);
    }
}

// A bare `make` builds the programs and libraries and nothing else: it once took the first rule of the
// Makefile, test-aarch64, which installs a cross toolchain and runs the suites under qemu.
Test(build, bare_make_builds_all) {
    char line[512];
    first_line_of(MAKE_ALONE " -pnq 2>/dev/null | grep '^\\.DEFAULT_GOAL'", line, sizeof line);
    cr_assert_str_eq(line, ".DEFAULT_GOAL := all\n", "the default goal: %s", line);
}

// The shuffled four-way lane sum is the scalar one bit for bit (the attention kernels' dots rely on it):
// random values of mixed magnitudes, where any other order of the additions rounds differently.
Test(gemm, lanes_sum4_equals_lanes_sum) {
    ErRng r;
    rng_seed(&r, 5);
    int differ_if_reordered = 0;
    for (int it = 0; it < 20000; it++) {
        gemm_v8f v[4];
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 8; l++)
                v[c][l] = (float)(rng_normal(&r) * pow(10.0, (double)(rng_below(&r, 13)) - 6));
        float got[4];
        gemm_lanes_sum4(v, got);
        for (int c = 0; c < 4; c++) {
            float want = gemm_lanes_sum(&v[c]);
            cr_assert(memcmp(&got[c], &want, sizeof want) == 0, "case %d vector %d: %.9g, scalar order %.9g", it,
                      c, got[c], want);
            float seq = 0.0f;
            for (int l = 0; l < 8; l++)
                seq += v[c][l];
            differ_if_reordered += seq != want;
        }
    }
    cr_assert_gt(differ_if_reordered, 1000, "the inputs must tell summation orders apart");
}
