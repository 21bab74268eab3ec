// erinfer subcommands. This folder is the erinfer program and sits above the runtime library (infer/ and
// below never include it). Each command takes argv with argv[0] = the subcommand name, prints its own
// --help, and returns the process exit status (0 ok, 1 error with one line on stderr).
#ifndef ERINFER_CLI_H
#define ERINFER_CLI_H

#include "cli/cli.h"

int cmd_score(int argc, char **argv);      // erinfer/score.c
int cmd_generate(int argc, char **argv);   // erinfer/generate.c
int cmd_chat(int argc, char **argv);       // erinfer/chat.c
int cmd_tokenize(int argc, char **argv);   // erinfer/tokenize.c
int cmd_detokenize(int argc, char **argv); // erinfer/tokenize.c
int cmd_eval(int argc, char **argv);       // cli/eval.c
int cmd_bench(int argc, char **argv);      // erinfer/bench.c
int cmd_embed(int argc, char **argv);      // erinfer/embed.c
int cmd_memory(int argc, char **argv);     // erinfer/memory_cmd.c (not in the aarch64 build: ER_NO_MEMORY)

#endif
