// ertrain subcommands. This folder is the entry point and sits above every training folder: no header
// below it declares a command. Each command takes argv with argv[0] = the subcommand name, prints its own
// --help, and returns the process exit status (0 ok, 1 error with one line on stderr).
#ifndef ERTRAIN_CLI_H
#define ERTRAIN_CLI_H

#include "cli/cli.h"
#include "core/args.h"
#include "train/trainer.h"

int cmd_synth(int argc, char **argv);    // ertrain/synth.c
int cmd_init(int argc, char **argv);     // ertrain/init.c
int cmd_pretrain(int argc, char **argv); // ertrain/pretrain.c
int cmd_sft(int argc, char **argv);      // ertrain/sft.c
int cmd_grpo(int argc, char **argv);     // ertrain/grpo.c
int cmd_heads(int argc, char **argv);    // ertrain/heads.c
int cmd_quantize(int argc, char **argv); // ertrain/quantize.c
int cmd_qat(int argc, char **argv);      // ertrain/qat.c
int cmd_merge(int argc, char **argv);    // ertrain/merge.c
int cmd_outliers(int argc, char **argv); // ertrain/outliers.c
int cmd_export(int argc, char **argv);   // ertrain/export.c
int cmd_eval_split(int argc, char **argv); // ertrain/eval.c
int cmd_plot(int argc, char **argv);     // ertrain/plot.c

// ertrain/train_flags.c: args_parse over the flags every training job takes (optimisation, evaluation,
// checkpoints) followed by the command's own (at most TRAIN_OWN_FLAGS_MAX); points c->out at stdout and
// c->log at stderr. ER_OK, ARGS_HELP after printing --help, or a negative status.
#define TRAIN_FLAGS_MAX 20
#define TRAIN_OWN_FLAGS_MAX 24
int train_flags_parse(TrainConfig *c, const ArgSpec *own, int n_own, int argc, char **argv, const char *usage);
// The test hook ER_TEST_PLACE_ON_CPU=1 (tests/train/test_mpi.py): the device path of sft, pretrain, qat, grpo
// and heads, the gradient sum of a placed backend included, on copies placed on the CPU backend.
int train_flags_place_on_cpu(void);

// cli_fail (cli/cli.h) is ertrain/main.c's: "ertrain <cmd>: <er_last_error()>", naming the rank under mpirun.

#endif
