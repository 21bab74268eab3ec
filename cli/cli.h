// Command-line code both programs use (erinfer/ and ertrain/ include it; the libraries never do):
// erinfer eval's parse, run and report (cli/eval.c), which ertrain eval splits across MPI ranks, and
// the generation flags of erinfer generate, chat and eval (cli/gen_flags.c).
#ifndef CLI_CLI_H
#define CLI_CLI_H

#include "core/args.h"
#include "infer/erinfer.h"
#include "infer/eval.h"

// erinfer eval's parse, run and report, split across processes when `split` is given (ertrain eval
// under mpirun): this process evaluates block `shard` of n_shards (per-item records into `part`, a file
// of its own), then `gather` makes r the whole run's totals and writes every process's records in order
// to `output`; only shard 0 shows progress and prints. NULL: the whole run in this process (erinfer eval).
typedef struct {
    int shard, n_shards;
    int (*gather)(const EvalConfig *c, EvalResult *r, const char *part, const char *output);
} EvalSplit;
int eval_command(int argc, char **argv, const EvalSplit *split);

// Prints "<program> <cmd>: <er_last_error()>" and returns 1. Each program defines its own (erinfer/main.c,
// ertrain/main.c: under mpirun the line names the rank and ends the job).
int cli_fail(const char *cmd);

// Generation flags shared by generate, chat and eval (cli/gen_flags.c).
typedef struct {
    const char *model, *adapter, *system, *kv, *stop, *prefix, *suffix, *switcher, *verifier, *device;
    const char *route, *think; // --route auto|direct|reasoning, --think on|off (a hybrid model's switch)
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
