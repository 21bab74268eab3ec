// ertrain subcommands. Each takes argv with argv[0] = the subcommand name, prints its own
// --help, and returns the process exit status (0 ok, 1 error with one line on stderr).
#ifndef TRAIN_CLI_H
#define TRAIN_CLI_H

// Prints "ertrain <cmd>: <er_last_error()>" and returns 1.
int cli_fail(const char *cmd);

int cmd_synth(int argc, char **argv);

#endif
