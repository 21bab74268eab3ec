// erinfer subcommands. Each takes argv with argv[0] = the subcommand name, prints its own
// --help, and returns the process exit status (0 ok, 1 error with one line on stderr).
#ifndef INFER_CLI_H
#define INFER_CLI_H

#include "core/args.h"
#include "infer/erinfer.h"

int cmd_score(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_bench(int argc, char **argv);

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
