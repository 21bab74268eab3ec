// Where erinfer's outputs go, run as a user would: a path is replaced only when it is a regular file (a
// link's target is replaced, the link kept), a fifo and a char device are written in place, "-" is stdout,
// an output that is an input is refused before any work, and a stdout that cannot be written fails the
// command. Device nodes are made with mknod in the test's own temp dir, never the real /dev entries.
#include <criterion/criterion.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "tests/common/helpers.h"

static HelperFixture fx; // per test: the temp dir, tmp/model, $ER_BUILD/erinfer

static void setup(void) { helper_fixture_open(&fx, "er_outcli_", "erinfer"); }
static void teardown(void) { helper_fixture_close(&fx); }
TestSuite(outputs_cli, .init = setup, .fini = teardown, .timeout = 120);

static void need_erinfer(void) { helper_need_program(fx.prog, "erinfer", "erinfer output tests"); }

// FILE in the temp dir, with a few {"problem", "answer"} records: what eval reads.
static char *write_data(const char *name) {
    char *p = path_join(fx.tmp, name);
    const char *text = "{\"problem\": \"Start with 2. Add 3.\", \"answer\": \"5\"}\n"
                       "{\"problem\": \"Start with 4. Add 1.\", \"answer\": \"5\"}\n";
    cr_assert_eq(file_write_atomic(p, text, strlen(text)), 0, "%s", er_last_error());
    return p;
}

static char *read_text(const char *path) {
    char *text;
    size_t n;
    cr_assert_eq(file_read_all(path, 1 << 24, &text, &n), 0, "%s", er_last_error());
    return text;
}

static int is_kind(const char *path, mode_t kind) {
    struct stat st;
    return lstat(path, &st) == 0 && (st.st_mode & S_IFMT) == kind;
}

// eval --output at a char device: written in place (was: eval.tmp.PID renamed over the node, which became a
// regular file). /dev/full's numbers: the write fails, one line, and the node stays a device.
Test(outputs_cli, eval_output_device_link_fifo_and_stdout) {
    need_erinfer();
    char *data = write_data("data.jsonl"), *full = path_join(fx.tmp, "full");
    cr_assert_eq(mknod(full, S_IFCHR | 0666, makedev(1, 7)), 0, "mknod: run the tests as root");
    const char *flags = "--max-new 4 --threads 1";
    CmdResult r = helper_run(fx.tmp, "'%s' eval --model '%s' --data '%s' --output '%s' %s", fx.prog, fx.model, data,
                             full, flags);
    cr_assert(is_kind(full, S_IFCHR), "the char device at --output was replaced by a file");
    helper_expect_error(&r, "eval --output at a full device", "No space left");

    // A link: its target is rewritten, the link stays.
    char *target = path_join(fx.tmp, "records.jsonl"), *link = path_join(fx.tmp, "link.jsonl");
    cr_assert_eq(file_write_atomic(target, "old\n", 4), 0);
    cr_assert_eq(symlink(target, link), 0);
    r = helper_run(fx.tmp, "'%s' eval --model '%s' --data '%s' --output '%s' %s", fx.prog, fx.model, data, link, flags);
    cr_assert_eq(r.status, 0, "%s", r.err);
    helper_result_free(&r);
    cr_assert(is_kind(link, S_IFLNK), "the link at --output was replaced by a file");
    char *text = read_text(target);
    cr_assert_eq(helper_count_lines(text), 2, "the link's target does not hold the records: %s", text);
    free(text);

    // A fifo read by another program: the records go through it.
    char *fifo = path_join(fx.tmp, "fifo"), *got = path_join(fx.tmp, "got.jsonl");
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    r = helper_run(fx.tmp, "(cat '%s' > '%s' & '%s' eval --model '%s' --data '%s' --output '%s' %s; wait)", fifo, got,
                   fx.prog, fx.model, data, fifo, flags);
    cr_assert_eq(r.status, 0, "%s", r.err);
    helper_result_free(&r);
    cr_assert(is_kind(fifo, S_IFIFO), "the fifo was replaced");
    text = read_text(got);
    cr_assert_eq(helper_count_lines(text), 2, "%s", text);
    free(text);

    // "-": the records on stdout, the totals on stderr; a directory is refused up front.
    r = helper_run(fx.tmp, "'%s' eval --model '%s' --data '%s' --output - %s", fx.prog, fx.model, data, flags);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_eq(helper_count_lines(r.out), 2, "stdout is not the two records:\n%s", r.out);
    cr_assert(r.out[0] == '{' && strstr(r.err, "accuracy:"), "out:\n%s\nerr:\n%s", r.out, r.err);
    helper_result_free(&r);
    r = helper_run(fx.tmp, "'%s' eval --model '%s' --data '%s' --output '%s' %s", fx.prog, fx.model, data, fx.tmp,
                   flags);
    helper_expect_error(&r, "eval --output at a directory", "is a directory");
    er_free(data), er_free(full), er_free(target), er_free(link), er_free(fifo), er_free(got);
}

// An output that is the same file as an input (through another spelling or a link) would overwrite it:
// refused before any work, the input untouched (was: eval --output = --data replaced the dataset).
Test(outputs_cli, output_that_is_an_input_is_refused) {
    need_erinfer();
    char *data = write_data("data.jsonl"), *link = path_join(fx.tmp, "alias.jsonl");
    cr_assert_eq(symlink(data, link), 0);
    char *before = read_text(data);
    CmdResult r = helper_run(fx.tmp, "'%s' eval --model '%s' --data '%s' --output '%s' --max-new 4", fx.prog, fx.model,
                             data, link);
    helper_expect_error(&r, "eval --output = --data", "same file as --data");
    r = helper_run(fx.tmp, "'%s' eval --model '%s' --data '%s' --output '%s/./data.jsonl' --max-new 4", fx.prog,
                   fx.model, data, fx.tmp);
    helper_expect_error(&r, "eval --output = --data spelled otherwise", "same file as --data");
    char *in = path_join(fx.tmp, "text.jsonl");
    cr_assert_eq(file_write_atomic(in, "{\"text\": \"Start with 2.\"}\n", 26), 0);
    r = helper_run(fx.tmp, "'%s' score --model '%s' --input '%s' --output '%s'", fx.prog, fx.model, in, in);
    helper_expect_error(&r, "score --output = --input", "same file as --input");
    r = helper_run(fx.tmp, "'%s' tokenize --tokenizer '%s' --input '%s' --output '%s'", fx.prog, fx.model, in, in);
    helper_expect_error(&r, "tokenize --output = --input", "same file as --input");
    char *after = read_text(data);
    cr_assert_str_eq(after, before, "the dataset was overwritten");
    char *cfg = path_join(fx.model, "config.json");
    r = helper_run(fx.tmp, "'%s' score --model '%s' --input '%s' --output '%s'", fx.prog, fx.model, in, cfg);
    helper_expect_error(&r, "score --output in the model dir", "a file of --model");
    free(before), free(after);
    er_free(data), er_free(link), er_free(in), er_free(cfg);
}

// A stdout that cannot be written (a full disk) fails the command with one line (was: exit 0, nothing
// written and nothing said).
Test(outputs_cli, full_stdout_is_an_error) {
    need_erinfer();
    char *data = write_data("data.jsonl");
    CmdResult r = helper_run(fx.tmp, "('%s' generate --model '%s' --prompt hi --max-new 4 --threads 1 >/dev/full)",
                             fx.prog, fx.model);
    helper_expect_error(&r, "generate >/dev/full", "stdout: write failed");
    r = helper_run(fx.tmp, "('%s' eval --model '%s' --data '%s' --max-new 4 --threads 1 >/dev/full)", fx.prog,
                   fx.model, data);
    cr_assert_eq(r.status, 1, "eval >/dev/full exited %d: %s", r.status, r.err);
    cr_assert(strstr(r.err, "stdout: write failed"), "%s", r.err);
    helper_result_free(&r);
    char *in = path_join(fx.tmp, "text.jsonl");
    cr_assert_eq(file_write_atomic(in, "{\"text\": \"Start with 2.\"}\n", 26), 0);
    r = helper_run(fx.tmp, "('%s' tokenize --tokenizer '%s' --input '%s' >/dev/full)", fx.prog, fx.model, in);
    helper_expect_error(&r, "tokenize >/dev/full", "No space left");
    er_free(data), er_free(in);
}

// Every line of lines (a --help text) fits HELP_WIDTH's 120 columns; what names the text in failures.
static void check_width(const char *text, const char *what) {
    int line = 1;
    for (const char *p = text; *p; line++) {
        const char *end = strchr(p, '\n');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        cr_assert_leq(n, 120, "%s: line %d is %zu columns:\n%.*s", what, line, n, (int)n, p);
        p += n + (end != NULL);
    }
}

// The names of the commands a program's --help lists (after "commands:", two spaces in), space-separated.
static void list_commands(const char *help, char *names, size_t cap) {
    names[0] = 0;
    const char *p = strstr(help, "commands:\n");
    cr_assert(p, "no command list:\n%s", help);
    for (p = strchr(p, '\n') + 1; *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : p + strlen(p))
        if (p[0] == ' ' && p[1] == ' ' && p[2] != ' ') {
            size_t n = strcspn(p + 2, " \n");
            snprintf(names + strlen(names), cap - strlen(names), "%.*s ", (int)n, p + 2);
        }
}

// Every usage line and --help of both programs fits 120 columns (quantize's usage line was 352), each
// command found in the program's own list, the subcommands of export and synth too.
Test(outputs_cli, every_help_fits_120_columns) {
    need_erinfer();
    char *ertrain = helper_program("ertrain");
    helper_need_program(ertrain, "ertrain", "--help width test");
    const char *progs[] = {fx.prog, ertrain};
    for (int k = 0; k < 2; k++) {
        CmdResult r = helper_run(fx.tmp, "'%s' --help", progs[k]);
        cr_assert_eq(r.status, 0);
        check_width(r.out, progs[k]);
        char names[2048], *save = NULL;
        list_commands(r.out, names, sizeof names);
        helper_result_free(&r);
        int n = 0;
        for (char *c = strtok_r(names, " ", &save); c; c = strtok_r(NULL, " ", &save), n++) {
            const char *subs[] = {"", " chains", " memory", " gguf", " gguf-lora"};
            for (int s = 0; s < 5; s++) {
                if ((s >= 1 && s <= 2 && strcmp(c, "synth") != 0) || (s >= 3 && strcmp(c, "export") != 0))
                    continue;
                char what[256];
                snprintf(what, sizeof what, "%s %s%s --help", progs[k], c, subs[s]);
                r = helper_run(fx.tmp, "'%s' %s%s --help", progs[k], c, subs[s]);
                cr_assert_eq(r.status, 0, "%s: %s", what, r.err);
                cr_assert(r.out[0], "%s printed nothing", what);
                check_width(r.out, what);
                helper_result_free(&r);
            }
        }
        cr_assert_geq(n, 8, "%s lists only %d commands", progs[k], n);
    }
    er_free(ertrain);
}

// A model dir typed with a slash at its end is printed with one slash before its files (was: "m//config.json").
Test(outputs_cli, no_doubled_slash_in_printed_paths) {
    need_erinfer();
    char *cfg_path = path_join(fx.model, "config.json");
    cJSON *cfg;
    cr_assert_eq(json_parse_file(cfg_path, 1 << 20, &cfg), 0);
    cJSON_ReplaceItemInObject(cfg, "num_hidden_layers", cJSON_CreateNumber(3));
    cr_assert_eq(json_write_file(cfg_path, cfg), 0);
    cJSON_Delete(cfg);
    CmdResult r = helper_run(fx.tmp, "'%s' generate --model '%s/' --prompt hi --max-new 2", fx.prog, fx.model);
    cr_assert(!strstr(r.err, "//"), "a doubled slash: %s", r.err);
    helper_expect_error(&r, "generate --model DIR/", "model/config.json: num_hidden_layers is 3");
    er_free(cfg_path);
}

// ertrain synth --out at a char device, a fifo, a link and "-" (was: synth's temporary file renamed over
// the device node, the link replaced by a file).
Test(outputs_cli, synth_out_by_kind_of_path) {
    char *ertrain = helper_program("ertrain");
    helper_need_program(ertrain, "ertrain", "synth output test");
    char *full = path_join(fx.tmp, "full"), *null = path_join(fx.tmp, "null");
    cr_assert_eq(mknod(full, S_IFCHR | 0666, makedev(1, 7)), 0, "mknod: run the tests as root");
    cr_assert_eq(mknod(null, S_IFCHR | 0666, makedev(1, 3)), 0);
    CmdResult r = helper_run(fx.tmp, "'%s' synth chains --n 5 --out '%s'", ertrain, full);
    cr_assert(is_kind(full, S_IFCHR), "the char device at --out was replaced by a file");
    helper_expect_error(&r, "synth --out at a full device", "No space left");
    r = helper_run(fx.tmp, "'%s' synth chains --n 5 --out '%s'", ertrain, null);
    cr_assert_eq(r.status, 0, "%s", r.err);
    helper_result_free(&r);
    cr_assert(is_kind(null, S_IFCHR), "the char device at --out was replaced by a file");

    char *target = path_join(fx.tmp, "chains.jsonl"), *link = path_join(fx.tmp, "link.jsonl");
    cr_assert_eq(file_write_atomic(target, "old\n", 4), 0);
    cr_assert_eq(symlink(target, link), 0);
    r = helper_run(fx.tmp, "'%s' synth chains --n 5 --out '%s'", ertrain, link);
    cr_assert_eq(r.status, 0, "%s", r.err);
    helper_result_free(&r);
    cr_assert(is_kind(link, S_IFLNK), "the link at --out was replaced by a file");
    char *text = read_text(target);
    cr_assert_eq(helper_count_lines(text), 5, "%s", text);
    free(text);

    char *fifo = path_join(fx.tmp, "fifo"), *got = path_join(fx.tmp, "got.jsonl");
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    r = helper_run(fx.tmp, "(cat '%s' > '%s' & '%s' synth chains --n 5 --out '%s'; wait)", fifo, got, ertrain, fifo);
    cr_assert_eq(r.status, 0, "%s", r.err);
    helper_result_free(&r);
    text = read_text(got);
    cr_assert_eq(helper_count_lines(text), 5, "%s", text);
    free(text);

    r = helper_run(fx.tmp, "'%s' synth chains --n 5 --out -", ertrain);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(helper_count_lines(r.out) == 5 && r.out[0] == '{', "stdout is not the 5 records:\n%s", r.out);
    cr_assert(strstr(r.err, "wrote 5 examples to stdout"), "the report is not on stderr: %s", r.err);
    helper_result_free(&r);
    r = helper_run(fx.tmp, "'%s' synth chains --n 5 --out '%s'", ertrain, fx.tmp);
    helper_expect_error(&r, "synth --out at a directory", "is a directory");
    er_free(ertrain), er_free(full), er_free(null), er_free(target), er_free(link), er_free(fifo), er_free(got);
}

// A library error that starts with the command's own name is printed once (was: "erinfer generate:
// generate: sample 0, ..."): here logits that overflow, from a final norm of 3e38.
Test(outputs_cli, command_name_said_once) {
    need_erinfer();
    Model m;
    cr_assert_eq(model_load(&m, fx.model, MODEL_LOAD_TRAINABLE), 0, "%s", er_last_error());
    ParamTensor *p = (ParamTensor *)model_find_param(&m, "model.norm.weight");
    cr_assert(p);
    for (int i = 0; i < (int)p->shape[0]; i++)
        p->data[i] = 3e38f;
    char *huge = path_join(fx.tmp, "huge");
    cr_assert_eq(model_save(&m, huge, 0), 0, "%s", er_last_error());
    model_free(&m);
    helper_copy_file("data/tiny_tokenizer/tokenizer.json", huge, "tokenizer.json");
    helper_copy_file("data/tiny_tokenizer/tokenizer_config.json", huge, "tokenizer_config.json");
    CmdResult r = helper_run(fx.tmp, "'%s' generate --model '%s' --prompt hi --max-new 2 --threads 1", fx.prog, huge);
    cr_assert(!strstr(r.err, "generate: generate:"), "the command's name is said twice: %s", r.err);
    helper_expect_error(&r, "generate with overflowing logits", "erinfer generate: sample 0");
    er_free(huge);
}
