// erinfer score: per-token log-probabilities under a model, optionally with a LoRA adapter (the
// runner and the record kinds: infer/score.h).
#include <stdio.h>
#include <string.h>

#include "core/args.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/threads.h"
#include "erinfer/cli.h"
#include "infer/score.h"

int cmd_score(int argc, char **argv) {
    ScoreConfig c = {0};
    const char *output = "-";
    int threads = 0;
    ArgSpec specs[] = {
        {"model", ARG_STR, &c.model, "Hugging Face model dir (config.json + safetensors) or .gguf file", 1, 0, 0},
        {"adapter", ARG_STR, &c.adapter, "LoRA adapter dir (PEFT layout)", 0, 0, 0},
        {"input", ARG_STR, &c.input, "JSONL of {\"tokens\"}, {\"text\"} or {\"prompt\", \"completion\"} lines (- = stdin)", 1, 0, 0},
        {"output", ARG_STR, &output, "JSONL output, one {\"logprobs\", \"nll\", \"n\"} line per input: a file "
         "(written atomically), - for stdout, or a fifo or character device (written in place)", 0, 0, 0},
        {"threads", ARG_INT, &threads, "threads (0 = all cores)", 0, 0, 4096},
    };
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof specs[0],
                        "erinfer score --model DIR --input FILE.jsonl [--adapter DIR] [--output FILE.jsonl]");
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0)
        return cli_fail("score");
    // Checked before any work; "-" is stdout (atomic_open: a stream of its own on file descriptor 1).
    if (file_output_check(output) < 0 || file_output_not_input(output, c.input, "--input") < 0 ||
        file_output_not_input(output, c.model, "--model") < 0 ||
        file_output_not_input(output, c.adapter, "--adapter") < 0)
        return cli_fail("score");
    threads_set(threads);
    AtomicFile af = {0};
    fflush(stdout);
    if (atomic_open(&af, output) < 0)
        return cli_fail("score");
    c.out = af.fp;
    ScoreResult res;
    ER_CHECK(score_run(&c, &res));
    ER_CHECK(atomic_commit(&af));
done:
    atomic_abort(&af); // nothing left to remove after a commit
    return rc < 0 ? cli_fail("score") : 0;
}
