// erinfer: the runtime's command-line front end.
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "infer/cli.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} Command;

static const Command commands[] = {
    {"generate", cmd_generate, "generate text: N samples sharing the prompt, hard budget, streaming"},
    {"chat", cmd_chat, "interactive multi-turn chat"},
    {"eval", cmd_eval, "accuracy on a JSONL dataset with gold answers"},
    {"bench", cmd_bench, "TTFT, decode speed and KV memory for 1-8 samples, KV f32 vs int8"},
    {"score", cmd_score, "log-probabilities of token sequences under a model"},
    {"tokenize", cmd_tokenize, "text JSONL -> token ids JSONL with a tokenizer.json"},
    {"detokenize", cmd_detokenize, "token ids JSONL -> text JSONL"},
};

int cli_fail(const char *cmd) {
    fprintf(stderr, "erinfer %s: %s\n", cmd, er_last_error());
    return 1;
}

static void usage(FILE *out) {
    fprintf(out, "usage: erinfer <command> [flags]   (erinfer <command> --help for its flags)\n\ncommands:\n");
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
    fprintf(stderr, "erinfer: unknown command \"%s\"\n", argv[1]);
    usage(stderr);
    return 1;
}
