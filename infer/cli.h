// erinfer subcommands. Each takes argv with argv[0] = the subcommand name, prints its own
// --help, and returns the process exit status (0 ok, 1 error with one line on stderr).
#ifndef INFER_CLI_H
#define INFER_CLI_H

#include "core/args.h"
#include "infer/erinfer.h"
#include "infer/eval.h"

int cmd_score(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_bench(int argc, char **argv);

// erinfer eval's parse, run and report, split across processes when `split` is given (ertrain eval
// under mpirun, which links this file): this process evaluates block `shard` of n_shards (per-item
// records into `part`, a file of its own), then `gather` makes r the whole run's totals and writes
// every process's records in order to `output`; only shard 0 shows progress and prints. NULL: the
// whole run in this process (erinfer eval).
typedef struct {
    int shard, n_shards;
    int (*gather)(const EvalConfig *c, EvalResult *r, const char *part, const char *output);
} EvalSplit;
int eval_command(int argc, char **argv, const EvalSplit *split);

// Prints "erinfer <cmd>: <er_last_error()>" and returns 1.
int cli_fail(const char *cmd);

// Generation flags shared by generate, chat and eval (infer/cli_flags.c).
typedef struct {
    const char *model, *adapter, *system, *kv, *stop, *prefix, *suffix, *switcher, *verifier;
    int max_new, top_k, samples, budget, answer_tokens, seed, threads, context;
    int default_max_new; // --max-new 0: this, or budget + answer tokens when that is more
    double temperature, top_p, min_p;
} GenFlags;

#define GEN_FLAGS_MAX 24
void gen_flags_default(GenFlags *f);
// Writes the shared flag specs into s (room for GEN_FLAGS_MAX); returns how many.
int gen_flags_specs(GenFlags *f, ArgSpec *s);
int gen_flags_params(const GenFlags *f, ErGenParams *p, int *kv_int8);
// New tokens per sample: --max-new, or its default (see GenFlags.default_max_new).
int gen_flags_max_new(const GenFlags *f);
// Loads the model (and adapter) and opens a session for max_samples samples.
int gen_flags_open(const GenFlags *f, int max_samples, ErModel **m, ErSession **s);

#endif
