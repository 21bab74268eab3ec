// The eval runner: accuracy of a model on a JSONL dataset with gold answers, generated through the
// public API (infer/erinfer.h) and graded with data/grade.h. Sample 0 decides accuracy; any sample
// right counts for pass@N.
// With a switcher and/or a verifier the routed pipeline answers (see er_model_load_switcher), and for
// each N of vote_n the runner counts: the greedy answer (the direct answer, or one greedy reasoning
// sample), the majority vote and the verifier-weighted vote over the first N samples, tokens and
// the queries routed to reasoning. The largest N is generated once and smaller N take its first
// samples: sample i draws from stream i of the seed whatever the sample count (infer/engine.h), so
// these are exactly the N-sample runs.
// The runner never prints: totals come back in EvalResult, per-item records go to cfg->output,
// warnings to cfg->log and progress to cfg->on_progress (each NULL = none).
#ifndef INFER_EVAL_H
#define INFER_EVAL_H

#include <stdio.h>

#include "infer/erinfer.h"
#include "infer/runner.h"

#define EVAL_VOTE_N_MAX 16

typedef struct {
    SessionSpec session;
    ErGenParams params;     // n_samples: samples per item (with heads: the largest of vote_n instead)
    const char *system;     // replaces each record's own system message; NULL = keep it
    const char *data;       // JSONL with gold answers (data/dataset.h)
    int limit;              // only the first N records (0 = all)
    int shard, n_shards;    // only block `shard` of n_shards equal blocks of the records, in order (one
                            // process's share of a split run: ertrain eval under mpirun); 0 of 1 = all
    const char *output;     // per-item JSONL, written atomically; NULL = none
    int vote_n[EVAL_VOTE_N_MAX]; // with heads: the sample counts compared, in any order
    int n_vote_n;
    FILE *log;              // warnings; NULL = silent
    // Called before the first item (done = 0) and after each, with the running accuracy.
    void (*on_progress)(void *user, long done, long total, double accuracy);
    void *user;
} EvalConfig;

// One N of vote_n: items right by majority and by verifier-weighted vote over the first N samples,
// and the tokens of those samples.
typedef struct {
    int n;
    long majority, weighted, tokens;
} EvalVoteRow;

typedef struct {
    int pipeline;                // ran with heads: routed, greedy_correct and rows are set
    long items, correct, any_correct, tokens, samples;
    long unformatted;            // samples with no answer to read (data/grade.h: a think block never closed, ...)
    long think_tokens;           // the samples' think lengths L (GenSample.think_len) summed
    double gen_s;                // seconds in generate calls
    long routed;                 // items routed to reasoning
    long greedy_correct;
    EvalVoteRow rows[EVAL_VOTE_N_MAX]; // ascending N; the last is the pipeline's own answer
    int n_rows;
} EvalResult;

// The defaults of erinfer eval (params as er_gen_params_init, vote_n 1, 2, 4, 8).
void eval_config_default(EvalConfig *c);
// Reads and checks the whole dataset before any generation (a bad record fails in seconds), then
// generates and grades every item. A failing item's error names data:line.
int eval_run(const EvalConfig *c, EvalResult *res);
// What the progress reports: the largest N's weighted vote with heads, else sample 0.
double eval_accuracy(const EvalResult *res);

#endif
