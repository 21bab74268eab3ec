// Command-line flags for the CLIs: `--name value` or `--name=value`, typed, range-checked, with a
// generated --help. Parsing never exits: it returns ARGS_HELP after printing help, or a negative
// status with the problem recorded in er_last_error().
#ifndef CORE_ARGS_H
#define CORE_ARGS_H

typedef enum { ARG_STR, ARG_INT, ARG_FLOAT, ARG_FLAG } ArgType;

typedef struct {
    const char *name;  // without the leading "--"
    ArgType type;
    void *dst;         // const char ** | int * | double * | int * (flag: set to 1)
    const char *help;
    int required;
    double min, max;   // inclusive range for ARG_INT/ARG_FLOAT when min < max
} ArgSpec;

#define ARGS_HELP 1

// `usage` is the one-line synopsis printed first by --help.
int args_parse(int argc, char **argv, const ArgSpec *specs, int nspecs, const char *usage);
void args_print_help(const ArgSpec *specs, int nspecs, const char *usage);

#endif
