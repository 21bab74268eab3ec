// ertrain eval: erinfer eval (cli/eval.c, linked in) with the records split across the ranks of
// mpirun (train/dist.h): rank r evaluates block r of the records, then the totals are summed and
// rank 0 writes every rank's per-item records in record order and prints the report. With one rank
// it is erinfer eval.
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "ertrain/cli.h"
#include "cli/cli.h"
#include "train/dist.h"

// Every rank's totals, summed; gen_s becomes the ranks' mean, so tokens/s is theirs together.
static int sum_totals(EvalResult *r) {
    double v[10 + 3 * EVAL_VOTE_N_MAX] = {
        (double)r->items, (double)r->correct, (double)r->any_correct, (double)r->tokens,
        (double)r->samples, r->gen_s, (double)r->routed, (double)r->greedy_correct,
        (double)r->unformatted, (double)r->think_tokens,
    };
    for (int k = 0; k < r->n_rows; k++) {
        v[10 + 3 * k] = (double)r->rows[k].majority;
        v[11 + 3 * k] = (double)r->rows[k].weighted;
        v[12 + 3 * k] = (double)r->rows[k].tokens;
    }
    ER_TRY(dist_sum_doubles(v, (int)(sizeof v / sizeof v[0])));
    r->items = (long)v[0], r->correct = (long)v[1], r->any_correct = (long)v[2], r->tokens = (long)v[3];
    r->samples = (long)v[4], r->gen_s = v[5] / dist_size(), r->routed = (long)v[6], r->greedy_correct = (long)v[7];
    r->unformatted = (long)v[8], r->think_tokens = (long)v[9];
    for (int k = 0; k < r->n_rows; k++) {
        r->rows[k].majority = (long)v[10 + 3 * k];
        r->rows[k].weighted = (long)v[11 + 3 * k];
        r->rows[k].tokens = (long)v[12 + 3 * k];
    }
    return ER_OK;
}

// The ranks' part files (each on its own machine's disk), in rank order, into output on rank 0.
static int join_records(const char *part, const char *output) {
    char *text = NULL;
    void *all = NULL;
    size_t n = 0, n_all;
    AtomicFile af = {0};
    int rc = ER_OK;
    ER_CHECK(file_read_all(part, (size_t)1 << 31, &text, &n));
    unlink(part);
    ER_CHECK(dist_gather(text, n, 1, &all, &n_all));
    if (dist_rank() == 0) {
        ER_CHECK(atomic_open(&af, output));
        if (fwrite(all, 1, n_all, af.fp) != n_all)
            ER_CHECK(er_error(ER_EIO, "%s: write failed", output));
        ER_CHECK(atomic_commit(&af));
    }
done:
    atomic_abort(&af);
    er_free(text);
    er_free(all);
    return rc;
}

static int gather(const EvalConfig *c, EvalResult *r, const char *part, const char *output) {
    ER_TRY(sum_totals(r));
    return part ? join_records(part, output) : ER_OK;
}

int cmd_eval_split(int argc, char **argv) {
    EvalSplit split = {dist_rank(), dist_size(), gather};
    return eval_command(argc, argv, &split);
}
