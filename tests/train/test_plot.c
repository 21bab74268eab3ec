// ertrain plot, run as a user runs it on synthetic run dirs (metrics.jsonl of GRPO- and SFT-shaped lines) in
// /tmp: the PNG it writes (signature, IHDR size from the panels drawn), its default outputs, and one error line
// with exit status 1 for each kind of bad input, gnuplot missing or failing included.
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tests/common/helpers.h"

static char *tmp, *prog; // per test: the temp dir, $ER_BUILD/ertrain (absolute, NULL when not built)

static void setup(void) {
    tmp = helper_tmpdir("er_plot_");
    char *p = helper_program("ertrain");
    prog = p ? path_resolve(p) : NULL;
    er_free(p);
}
static void teardown(void) {
    helper_rmdir(tmp);
    er_free(tmp);
    er_free(prog);
}
TestSuite(train_plot, .init = setup, .fini = teardown);

static void need_ertrain(void) { helper_need_program(prog, "ertrain", "ertrain plot tests"); }

static void need_gnuplot(void) {
    need_ertrain();
    if (system("command -v gnuplot >/dev/null 2>&1") != 0)
        cr_skip_test("!!!!!! gnuplot is MISSING: run scripts/deps.sh - ertrain plot image tests SKIPPED !!!!!!");
}

// tmp/name/metrics.jsonl holding text (the dir made first).
static char *write_run(const char *name, const char *text) {
    char *dir = path_join(tmp, name);
    cr_assert_eq(dir_make(dir), 0, "%s", er_last_error());
    char *m = path_join(dir, "metrics.jsonl");
    cr_assert_eq(file_write_atomic(m, text, strlen(text)), 0, "%s", er_last_error());
    er_free(m);
    return dir;
}

// n GRPO-shaped steps: budgets 64 and 128, eval_accuracy every 10th step when eval; kl null at null_at.
static char *grpo_run(const char *name, int n, int eval, int null_at, double offset) {
    char *text = er_alloc((size_t)n * 400 + 1);
    cr_assert(text);
    size_t k = 0;
    for (int s = 1; s <= n; s++) {
        k += (size_t)sprintf(text + k, "{\"step\":%d,\"reward\":%.3f,\"accuracy\":%.3f,\"length\":%d,"
                             "\"length_by_budget\":{\"64\":%d,\"128\":%d},\"loss\":%.3f,", s, offset + s * 0.01,
                             offset + s * 0.008, 150 - s, 90 - s / 2, 140 - s / 2, 0.5 - s * 0.002);
        if (s == null_at)
            k += (size_t)sprintf(text + k, "\"kl\":null");
        else
            k += (size_t)sprintf(text + k, "\"kl\":%.5f", s * 1e-4);
        if (eval && s % 10 == 0)
            k += (size_t)sprintf(text + k, ",\"eval_accuracy\":%.3f", offset + s * 0.005);
        k += (size_t)sprintf(text + k, ",\"lr\":1e-5}\n");
    }
    char *dir = write_run(name, text);
    er_free(text);
    return dir;
}

// The PNG at path: its signature and the IHDR chunk's width and height.
static void check_png(const char *path, uint32_t w, uint32_t h) {
    char *data;
    size_t n;
    cr_assert_eq(file_read_all(path, 64u << 20, &data, &n), 0, "%s", er_last_error());
    const unsigned char *p = (const unsigned char *)data;
    cr_assert_geq(n, 33, "%s: %zu bytes is no PNG", path, n);
    cr_assert_eq(memcmp(p, "\x89PNG\r\n\x1a\n", 8), 0, "%s: no PNG signature", path);
    cr_assert_eq(memcmp(p + 12, "IHDR", 4), 0, "%s: the first chunk is not IHDR", path);
    uint32_t gw = (uint32_t)p[16] << 24 | (uint32_t)p[17] << 16 | (uint32_t)p[18] << 8 | p[19];
    uint32_t gh = (uint32_t)p[20] << 24 | (uint32_t)p[21] << 16 | (uint32_t)p[22] << 8 | p[23];
    cr_assert_eq(gw, w, "%s: width %u, expected %u", path, gw, w);
    cr_assert_eq(gh, h, "%s: height %u, expected %u", path, gh, h);
    er_free(data);
}

// The entries of dir whose name starts with prefix (a temporary file left behind would be one).
static int count_entries(const char *dir, const char *prefix) {
    CmdResult r = helper_run(tmp, "(ls -a '%s' | grep -c '^%s'; true)", dir, prefix);
    int n = atoi(r.out);
    helper_result_free(&r);
    return n;
}

// Two GRPO runs overlaid: reward, accuracy, length per budget, KL, eval accuracy and loss = 6 panels in 3 rows
// of 420 pixels, 1400 wide; the null kl is left out and counted.
Test(train_plot, two_runs_make_one_png_of_six_panels) {
    need_gnuplot();
    char *a = grpo_run("b64_m0.2", 40, 1, 7, 0.0), *b = grpo_run("b128_m0.2", 40, 0, 0, 0.1);
    char *out = path_join(tmp, "cmp.png");
    CmdResult r = helper_run(tmp, "'%s' plot '%s' '%s' --out '%s' --smooth 5", prog, a, b, out);
    cr_assert_eq(r.status, 0, "plot failed: %s", r.err);
    cr_assert(strstr(r.out, "2 runs, 80 steps, 6 panels (1400x1260); 1 null value left out"), "report: %s", r.out);
    helper_result_free(&r);
    check_png(out, 1400, 1260);
    cr_assert_eq(count_entries(tmp, "cmp.png"), 1, "a temporary file was left beside cmp.png");
    er_free(a), er_free(b), er_free(out);
}

// One run: RUN/curves.png; several: curves.png in the current dir.
Test(train_plot, default_outputs) {
    need_gnuplot();
    char *a = grpo_run("a", 12, 1, 0, 0.0), *b = grpo_run("b", 12, 1, 0, 0.2);
    CmdResult r = helper_run(tmp, "'%s' plot '%s'", prog, a);
    cr_assert_eq(r.status, 0, "plot failed: %s", r.err);
    helper_result_free(&r);
    char *one = path_join(a, "curves.png"), *two = path_join(tmp, "curves.png");
    check_png(one, 1400, 1260);
    r = helper_run(tmp, "cd '%s' && '%s' plot a b", tmp, prog);
    cr_assert_eq(r.status, 0, "plot failed: %s", r.err);
    cr_assert(strstr(r.out, "wrote curves.png: 2 runs"), "report: %s", r.out);
    helper_result_free(&r);
    check_png(two, 1400, 1260);
    er_free(a), er_free(b), er_free(one), er_free(two);
}

// An SFT run has loss and eval loss (two panels, one row); a GRPO run with a reward and nothing else gets its
// eval accuracy panel anyway, saying "no eval"; an end-of-run "stage": "eval" line's loss is an eval loss.
Test(train_plot, panels_follow_the_keys_present) {
    need_gnuplot();
    char *sft = write_run("sft", "{\"step\":1,\"loss\":2.5,\"lr\":1e-4}\n{\"step\":2,\"loss\":2.1,\"eval_loss\":2.3}\n"
                                 "{\"step\":3,\"loss\":1.9}\n");
    char *out = path_join(tmp, "sft.png");
    CmdResult r = helper_run(tmp, "'%s' plot '%s' --out '%s'", prog, sft, out);
    cr_assert_eq(r.status, 0, "plot failed: %s", r.err);
    cr_assert(strstr(r.out, "1 run, 3 steps, 2 panels (1400x420)"), "report: %s", r.out);
    helper_result_free(&r);
    check_png(out, 1400, 420);
    char *lm = write_run("lm", "{\"step\":1,\"loss\":2.5}\n{\"step\":1,\"stage\":\"eval\",\"loss\":2.7}\n");
    r = helper_run(tmp, "'%s' plot '%s' --out '%s'", prog, lm, out);
    cr_assert_eq(r.status, 0, "plot failed: %s", r.err);
    cr_assert(strstr(r.out, "1 run, 1 step, 2 panels (1400x420)"), "report: %s", r.out);
    helper_result_free(&r);
    char *rw = write_run("rw", "{\"step\":1,\"reward\":0.25}\n{\"step\":2,\"reward\":0.5}\n");
    r = helper_run(tmp, "'%s' plot '%s' --out '%s' --smooth 1", prog, rw, out);
    cr_assert_eq(r.status, 0, "plot failed: %s", r.err);
    cr_assert(strstr(r.out, "1 run, 2 steps, 2 panels (1400x420)"), "report: %s", r.out);
    helper_result_free(&r);
    check_png(out, 1400, 420);
    er_free(sft), er_free(lm), er_free(rw), er_free(out);
}

// Bad runs, flags and outputs: one line naming the file (and line) or the flag, exit status 1, no output.
Test(train_plot, bad_input_is_one_error_line) {
    need_ertrain();
    char *good = grpo_run("good", 3, 0, 0, 0.0);
    char *nodata = path_join(tmp, "nodata");
    cr_assert_eq(dir_make(nodata), 0);
    char *bad = write_run("bad", "{\"step\":1,\"reward\":0.5}\n{\"step\":2,\"reward\":\n");
    char *empty = write_run("empty", "\n\n");
    char *str = write_run("str", "{\"step\":1,\"reward\":0.5}\n\n{\"step\":2,\"reward\":\"high\"}\n");
    char *nostep = write_run("nostep", "{\"reward\":0.5}\n");
    char *nan = write_run("nan", "{\"step\":1,\"reward\":NaN}\n");
    char *lb = write_run("lb", "{\"step\":1,\"reward\":0.5,\"length_by_budget\":[64]}\n");
    char *none = write_run("none", "{\"step\":1,\"tokens\":5}\n");
    char *out = path_join(tmp, "o.png");
    struct {
        const char *args, *needle;
    } cases[] = {
        {nodata, "nodata: no metrics.jsonl"},
        {"/nonexistent/run", "/nonexistent/run: not a run dir"},
        {bad, "bad/metrics.jsonl:2: not valid JSON"},
        {empty, "empty/metrics.jsonl: no steps"},
        {str, "str/metrics.jsonl:3: \"reward\" must be a number or null (got a string)"},
        {nostep, "nostep/metrics.jsonl:1: no \"step\""},
        {nan, "nan/metrics.jsonl:1: not valid JSON"},
        {lb, "lb/metrics.jsonl:1: \"length_by_budget\" must be an object (got an array)"},
        {none, "none/metrics.jsonl: none of the plotted keys"},
        {"", "no RUN given"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CmdResult r = helper_run(tmp, "'%s' plot %s%s%s --out '%s'", prog, cases[i].args[0] ? "'" : "", cases[i].args,
                                 cases[i].args[0] ? "'" : "", out);
        helper_expect_error(&r, cases[i].args, cases[i].needle);
    }
    CmdResult r = helper_run(tmp, "'%s' plot '%s' --smooth 0", prog, good);
    helper_expect_error(&r, "--smooth 0", "--smooth: 0 is out of range");
    r = helper_run(tmp, "'%s' plot '%s' --out '%s'", prog, good, tmp);
    helper_expect_error(&r, "--out a dir", "is a directory");
    r = helper_run(tmp, "'%s' plot '%s' --out '%s/metrics.jsonl'", prog, good, good);
    helper_expect_error(&r, "--out the run's metrics", "is the same file as");
    cr_assert_eq(count_entries(tmp, "o.png"), 0, "an output was written by a failed plot");
    er_free(good), er_free(nodata), er_free(bad), er_free(empty), er_free(str), er_free(nostep), er_free(nan);
    er_free(lb), er_free(none), er_free(out);
}

// No gnuplot on PATH, or a gnuplot that fails (a stand-in script): one line saying so, and an existing output
// is left as it was, with no temporary file beside it.
Test(train_plot, gnuplot_missing_or_failing) {
    need_ertrain();
    char *run = grpo_run("run", 5, 0, 0, 0.0);
    char *out = path_join(tmp, "keep.png");
    cr_assert_eq(file_write_atomic(out, "old", 3), 0);
    CmdResult r = helper_run(tmp, "PATH=/nonexistent '%s' plot '%s' --out '%s'", prog, run, out);
    helper_expect_error(&r, "no gnuplot", "ertrain plot: gnuplot not found: install it (scripts/deps.sh)");
    char *bin = path_join(tmp, "bin");
    cr_assert_eq(dir_make(bin), 0);
    char *fake = path_join(bin, "gnuplot");
    const char *script = "#!/bin/sh\n/bin/cat >/dev/null\necho 'gnuplot> plot' >&2\necho '         line 3: boom' >&2\n"
                         "exit 3\n";
    cr_assert_eq(file_write_atomic(fake, script, strlen(script)), 0);
    r = helper_run(tmp, "chmod +x '%s' && PATH='%s' '%s' plot '%s' --out '%s'", fake, bin, prog, run, out);
    helper_expect_error(&r, "failing gnuplot", "ertrain plot: gnuplot failed (exit status 3): line 3: boom");
    const char *silent = "#!/bin/sh\n/bin/cat >/dev/null\nexit 0\n";
    cr_assert_eq(file_write_atomic(fake, silent, strlen(silent)), 0);
    r = helper_run(tmp, "chmod +x '%s' && PATH='%s' '%s' plot '%s' --out '%s'", fake, bin, prog, run, out);
    helper_expect_error(&r, "silent gnuplot", "gnuplot exited without writing an image");
    char *data;
    size_t n;
    cr_assert_eq(file_read_all(out, 1 << 20, &data, &n), 0);
    cr_assert(n == 3 && memcmp(data, "old", 3) == 0, "the existing output was changed by a failed plot");
    cr_assert_eq(count_entries(tmp, "keep.png"), 1, "a temporary file was left beside keep.png");
    er_free(data), er_free(run), er_free(out), er_free(bin), er_free(fake);
}
