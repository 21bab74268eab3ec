// ertrain subcommands. Each takes argv with argv[0] = the subcommand name, prints its own
// --help, and returns the process exit status (0 ok, 1 error with one line on stderr).
#ifndef TRAIN_CLI_H
#define TRAIN_CLI_H

#include "core/args.h"
#include "train/trainer.h"

int cmd_synth(int argc, char **argv);    // train/cli_synth.c
int cmd_init(int argc, char **argv);     // train/cli_init.c
int cmd_pretrain(int argc, char **argv); // train/cli_pretrain.c
int cmd_sft(int argc, char **argv);      // train/cli_sft.c
int cmd_grpo(int argc, char **argv);     // rl/cli_grpo.c
int cmd_heads(int argc, char **argv);    // switcher_train/cli_heads.c
int cmd_quantize(int argc, char **argv); // train/cli_quantize.c
int cmd_qat(int argc, char **argv);      // train/cli_qat.c

#define TRAIN_FLAGS_MAX 20
int train_flags_specs(TrainConfig *c, ArgSpec *s); // train/cli_train_flags.c

// Prints "ertrain <cmd>: <er_last_error()>" and returns 1.
int cli_fail(const char *cmd);

#endif
