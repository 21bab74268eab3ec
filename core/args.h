// Command-line flags for the CLIs: `--name value` or `--name=value`, typed, range-checked, with a
// generated --help. Parsing never exits: it returns ARGS_HELP after printing help, or a negative
// status with the problem recorded in er_last_error(). The programs' own code (it prints --help and the
// command list): linked into erinfer, ertrain, the benchmarks and the tests, not into liberinfer.
#ifndef CORE_ARGS_H
#define CORE_ARGS_H

// ARG_TEXT is a string whose escapes \n, \t, \r and \\ become the characters (shells pass them
// literally): every flag that holds text for the model (prefixes, suffixes, templates, stop strings)
// takes it, so all CLIs read "<think>\n" alike. Decoded in place in argv.
typedef enum { ARG_STR, ARG_INT, ARG_FLOAT, ARG_FLAG, ARG_TEXT } ArgType;

typedef struct {
    const char *name;  // without the leading "--"
    ArgType type;
    void *dst;         // const char ** (STR, TEXT) | int * | double * | int * (flag: set to 1)
    const char *help;
    int required;
    double min, max;   // inclusive range for ARG_INT/ARG_FLOAT when min < max
} ArgSpec;

#define ARGS_HELP 1

// `usage` is the one-line synopsis printed first by --help.
int args_parse(int argc, char **argv, const ArgSpec *specs, int nspecs, const char *usage);

// A program of subcommands (erinfer, ertrain): argv[1] names the command, which gets argv from there.
typedef struct {
    const char *name;
    int (*run)(int argc, char **argv); // returns the exit status
    const char *help;
} ArgCommand;

// The error line of a command without the command's own name in front when the message repeats it
// ("quantize: the model ..." under "ertrain quantize:"): msg, or a pointer into it.
const char *args_error_text(const char *cmd, const char *msg);

// A command that succeeded but whose stdout could not be written (a full disk, a closed pipe) fails:
// flushes stdout and, when that or an earlier write failed, prints one line naming stdout and returns 1;
// else returns status.
int args_check_stdout(const char *prog, const char *cmd, int status);

// Runs the named command (its status through args_check_stdout); lists the commands for --help (stdout,
// status 0) or when the command is missing or unknown (stderr, status 1).
int args_dispatch(const char *prog, const ArgCommand *cmds, int n, int argc, char **argv);

#endif
