// ertrain: the training stack's command-line front end.
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "core/threads.h"
#include "train/cli.h"

static int cmd_version(int argc, char **argv);

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} Command;

static const Command commands[] = {
    {"version", cmd_version, "print the build configuration"},
    {"synth", cmd_synth, "generate synthetic datasets (chains)"},
};

int cli_fail(const char *cmd) {
    fprintf(stderr, "ertrain %s: %s\n", cmd, er_last_error());
    return 1;
}

static int cmd_version(int argc, char **argv) {
    (void)argc;
    (void)argv;
    printf("ertrain 0.1.0\n");
#ifdef ER_BLAS
    printf("blas: OpenBLAS\n");
#else
    printf("blas: built-in GEMM\n");
#endif
    printf("threads: %d\n", threads_get());
    return 0;
}

static void usage(FILE *out) {
    fprintf(out, "usage: ertrain <command> [flags]   (ertrain <command> --help for its flags)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-12s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 1;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "ertrain: unknown command \"%s\"\n", argv[1]);
    usage(stderr);
    return 1;
}
