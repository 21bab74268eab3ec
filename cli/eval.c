// erinfer eval: accuracy of a model on a JSONL dataset with gold answers (the runner: infer/eval.h); ertrain
// eval runs the same, split across MPI ranks (ertrain/eval.c).
// Sample 0 decides accuracy; with --samples N > 1 pass@N (any sample right) is printed too.
// With --switcher and/or --verifier a table compares, for each N of --vote-n (default 1,2,4,8): the
// greedy answer, the majority vote and the verifier-weighted vote over the first N samples, tokens
// per query and the share routed to reasoning.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/args.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/progress.h"
#include "core/threads.h"
#include "cli/cli.h"
#include "infer/eval.h"

static int parse_vote_n(const char *s, int *out, int *n) {
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 256 || *n >= EVAL_VOTE_N_MAX || (*end && *end != ','))
            return er_error(ER_EINVAL, "--vote-n: expected up to %d sample counts in 1..256 separated by commas, got "
                            "\"%s\"", EVAL_VOTE_N_MAX, s);
        out[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (*n == 0)
        return er_error(ER_EINVAL, "--vote-n is empty");
    return ER_OK;
}

// The progress bar on stderr, driven by the runner.
static void eval_progress(void *user, long done, long total, double accuracy) {
    Progress *prog = user;
    char extra[64];
    snprintf(extra, sizeof extra, "accuracy %.3f", accuracy);
    if (done == 0)
        progress_begin(prog, stderr, "eval", "item", 0, total);
    else
        progress_update(prog, done, extra);
}

static void print_table(FILE *out, const EvalConfig *c, const EvalResult *r) {
    double items = (double)r->items;
    int has_v = c->session.verifier != NULL;
    const EvalVoteRow *last = &r->rows[r->n_rows - 1];
    fprintf(out, "pipeline: %ld/%ld queries routed to reasoning (%.1f%%)%s%s\n", r->routed, r->items,
           100.0 * r->routed / items,
           c->session.switcher ? "" : " (no switcher: every query reasons when there is an adapter)",
           has_v ? "" : "; no verifier: the weighted column is the plain majority vote");
    fprintf(out, "%5s %9s %9s %9s %13s %10s\n", "N", "greedy", "majority", "weighted", "tokens/query", "reasoning");
    for (int k = 0; k < r->n_rows; k++) {
        const EvalVoteRow *v = &r->rows[k];
        fprintf(out, "%5d %9.4f %9.4f %9.4f %13.1f %10.3f\n", v->n, r->greedy_correct / items, v->majority / items,
               (has_v ? v->weighted : v->majority) / items, v->tokens / items, r->routed / items);
    }
    long right = has_v ? last->weighted : last->majority;
    // The table's last row is the pipeline's own answer when N is the largest and last.
    fprintf(out, "accuracy: %.4f (%ld/%ld) at N = %d\n", right / items, right, r->items, last->n);
}

static void print_totals(FILE *out, const EvalConfig *c, const EvalResult *r) {
    if (r->pipeline) {
        print_table(out, c, r);
    } else {
        fprintf(out, "accuracy: %.4f (%ld/%ld)\n", (double)r->correct / (double)r->items, r->correct, r->items);
        if (c->params.n_samples > 1)
            fprintf(out, "pass@%d: %.4f (%ld/%ld)\n", c->params.n_samples, (double)r->any_correct / (double)r->items,
                   r->any_correct, r->items);
        fprintf(out, "mean generated tokens: %.1f per sample\n", (double)r->tokens / (double)r->samples);
    }
    double ns = r->samples > 0 ? (double)r->samples : 1.0;
    fprintf(out, "unformatted: %.4f (%ld/%ld samples with no answer after the think block)\n", r->unformatted / ns,
            r->unformatted, r->samples);
    fprintf(out, "mean think length L: %.1f tokens per sample\n", r->think_tokens / ns);
    fprintf(out, "tokens/s: %.1f (%ld tokens in %.2f s)\n", r->gen_s > 0 ? (double)r->tokens / r->gen_s : 0.0,
            r->tokens, r->gen_s);
    if (c->output)
        fprintf(out, "wrote %ld records to %s\n", r->items, strcmp(c->output, "-") == 0 ? "stdout" : c->output);
}

int cmd_eval(int argc, char **argv) {
    return eval_command(argc, argv, NULL);
}

// This shard's run (records into a part file of its own, in the temporary dir: the output may be stdout or
// a device) and the split's gather into the whole run.
static int eval_shard(EvalConfig *c, const EvalSplit *split, EvalResult *r) {
    const char *output = c->output, *tmp = getenv("TMPDIR");
    char part[4096];
    c->shard = split->shard;
    c->n_shards = split->n_shards;
    if (output) {
        snprintf(part, sizeof part, "%s/ertrain-eval.%ld.part%d", tmp && tmp[0] ? tmp : "/tmp", (long)getpid(),
                 split->shard);
        c->output = part;
    }
    int rc = eval_run(c, r);
    c->output = output;
    return rc < 0 ? rc : split->gather(c, r, output ? part : NULL, output);
}

int eval_command(int argc, char **argv, const EvalSplit *split) {
    GenFlags f;
    gen_flags_default(&f);
    EvalConfig c;
    eval_config_default(&c);
    const char *vote_n = "1,2,4,8";
    ArgSpec specs[GEN_FLAGS_MAX + 5];
    int ns = gen_flags_specs(&f, specs);
    specs[ns++] = (ArgSpec){"data", ARG_STR, &c.data, "JSONL dataset with gold answers (see data/dataset.h)", 1, 0, 0};
    specs[ns++] = (ArgSpec){"output", ARG_STR, &c.output, "per-item JSONL results: a file (written atomically), - "
                            "for stdout (the totals then go to stderr), or a fifo or character device (written in "
                            "place)", 0, 0, 0};
    specs[ns++] = (ArgSpec){"limit", ARG_INT, &c.limit, "evaluate only the first N records (0 = all)", 0, 0, 1 << 30};
    specs[ns++] = (ArgSpec){"samples", ARG_INT, &f.samples, "parallel samples per item (sample 0 is graded for accuracy)",
                            0, 1, 256};
    specs[ns++] = (ArgSpec){"vote-n", ARG_STR, &vote_n, "with --switcher/--verifier: sample counts compared in the "
                            "table (the largest is generated, in place of --samples)", 0, 0, 0};
    int rc = args_parse(argc, argv, specs, ns,
                        "erinfer eval --model DIR --data FILE.jsonl [--output FILE.jsonl] [--limit N] [flags]");
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0 || ((f.switcher || f.verifier) && parse_vote_n(vote_n, c.vote_n, &c.n_vote_n) < 0) ||
        gen_flags_params(&f, &c.params, &c.session.kv_int8) < 0)
        return cli_fail("eval");
    // The output is checked before any work: a wrong kind of path, or the dataset itself, fails now.
    if (c.output && (file_output_check(c.output) < 0 || file_output_not_input(c.output, c.data, "--data") < 0 ||
                     file_output_not_input(c.output, f.model, "--model") < 0 ||
                     file_output_not_input(c.output, f.adapter, "--adapter") < 0))
        return cli_fail("eval");
    threads_set(f.threads);
    c.session = (SessionSpec){f.model, f.adapter, f.switcher, f.verifier, c.session.kv_int8, f.context, f.device};
    c.system = f.system;
    int quiet = split && split->shard != 0;
    c.log = quiet ? NULL : stderr;
    Progress prog = {0};
    c.on_progress = quiet ? NULL : eval_progress;
    c.user = &prog;
    EvalResult r;
    if ((split ? eval_shard(&c, split, &r) : eval_run(&c, &r)) < 0) {
        if (prog.tty && prog.t_last_print > prog.t_start)
            fputc('\n', stderr); // leave the bar's line before the error line
        return cli_fail("eval");
    }
    if (quiet)
        return 0;
    char extra[64];
    snprintf(extra, sizeof extra, "accuracy %.3f", eval_accuracy(&r));
    progress_end(&prog, extra);
    print_totals(c.output && strcmp(c.output, "-") == 0 ? stderr : stdout, &c, &r);
    return 0;
}
