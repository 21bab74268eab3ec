// erinfer subcommands. Each takes argv with argv[0] = the subcommand name, prints its own
// --help, and returns the process exit status (0 ok, 1 error with one line on stderr).
#ifndef INFER_CLI_H
#define INFER_CLI_H

int cmd_score(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_bench(int argc, char **argv);

// Prints "erinfer <cmd>: <er_last_error()>" and returns 1.
int cli_fail(const char *cmd);

#endif
