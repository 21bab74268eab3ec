// erinfer: the runtime's command-line front end.
#include <stdio.h>

#include "core/args.h"
#include "core/error.h"
#include "erinfer/cli.h"
#ifndef ER_NO_SERVE
#include "erinfer/server.h"
#endif

static int cmd_version(int argc, char **argv) {
    (void)argc;
    (void)argv;
    printf("erinfer %s\n", er_version());
    return 0;
}

static const ArgCommand commands[] = {
    {"generate", cmd_generate, "generate text: N samples sharing the prompt, hard budget, streaming"},
    {"chat", cmd_chat, "interactive multi-turn chat"},
    {"eval", cmd_eval, "accuracy, length and speed on a JSONL dataset with gold answers"},
    {"bench", cmd_bench, "TTFT and decode tokens/s at N = 1, 2, 4, 8 samples, fp32 vs int8 KV"},
    {"score", cmd_score, "log-probabilities of token sequences under a model (and adapter)"},
    {"embed", cmd_embed, "text -> embedding vectors (mean or last-token pooling, as the model says)"},
    {"tokenize", cmd_tokenize, "text JSONL -> token ids JSONL with a tokenizer.json"},
    {"detokenize", cmd_detokenize, "token ids JSONL -> text JSONL"},
#ifndef ER_NO_MEMORY
    {"memory", cmd_memory, "a local memory store (SQLite): add, search (BM25 + vectors), list, delete, import"},
#endif
#ifndef ER_NO_SERVE
    {"serve", cmd_serve, "OpenAI-compatible HTTP server (chat, completions, tools) over the routed pipeline"},
#endif
    {"version", cmd_version, "print the version"},
};

// The report printed so far goes out first, so in `> log 2>&1` the error line comes after it.
int cli_fail(const char *cmd) {
    fflush(stdout);
    fprintf(stderr, "erinfer %s: %s\n", cmd, args_error_text(cmd, er_last_error()));
    return 1;
}

int main(int argc, char **argv) {
    return args_dispatch("erinfer", commands, sizeof commands / sizeof commands[0], argc, argv);
}
