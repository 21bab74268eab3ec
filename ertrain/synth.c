// ertrain synth: synthetic datasets. `ertrain synth chains` writes the chained-arithmetic benchmark
// (data/synth.h) as JSONL and prints the mean completion lengths per style.
#include <stdio.h>
#include <string.h>

#include "core/args.h"
#include "core/error.h"
#include "core/fileio.h"
#include "data/synth.h"
#include "ertrain/cli.h"

static int synth_chains(int argc, char **argv) {
    ChainsConfig c;
    chains_config_default(&c);
    int n = 0, seed = 0;
    const char *out = NULL, *tok_path = NULL;
    const ArgSpec specs[] = {
        {"n", ARG_INT, &n, "number of examples", 1, 1, 100000000},
        {"seed", ARG_INT, &seed, "RNG seed (example i depends only on seed, i and the ranges)", 0, 0, 0},
        {"out", ARG_STR, &out, "output JSONL file (written atomically), - for stdout (the report then goes to "
                               "stderr), or a fifo or character device (written in place)", 1, 0, 0},
        {"min-steps", ARG_INT, &c.min_steps, "fewest chained operations", 0, 1, CHAINS_MAX_STEPS},
        {"max-steps", ARG_INT, &c.max_steps, "most chained operations", 0, 1, CHAINS_MAX_STEPS},
        {"max-start", ARG_INT, &c.max_start, "start value drawn from 1..N", 0, 1, 1000000},
        {"max-operand", ARG_INT, &c.max_operand, "add/subtract by 1..N", 0, 1, 1000000},
        {"max-factor", ARG_INT, &c.max_factor, "multiply/divide by 2..N", 0, 2, 1000000},
        {"max-value", ARG_INT, &c.max_value, "every intermediate result stays in 0..N", 0, 2, 1000000},
        {"tokenizer", ARG_STR, &tok_path,
         "also write each record's completion lengths in this tokenizer.json / model dir's tokens", 0, 0, 0},
    };
    int rc = args_parse(argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "ertrain synth chains --n N --out FILE.jsonl [--seed S] [--min-steps 1 --max-steps 8 ...]");
    if (rc == ARGS_HELP)
        return 0;
    // The output is checked before any work: a wrong kind of path, or the tokenizer file itself, fails now.
    if (rc < 0 || file_output_check(out) < 0 || file_output_not_input(out, tok_path, "--tokenizer") < 0)
        return cli_fail("synth chains");
    Tokenizer *tok = NULL;
    if (tok_path && tok_load(&tok, tok_path) < 0)
        return cli_fail("synth chains");
    ChainsStats st;
    rc = chains_write_jsonl(&c, n, (uint64_t)(unsigned)seed, out, tok, &st);
    tok_free(tok);
    if (rc < 0)
        return cli_fail("synth chains");
    int to_stdout = strcmp(out, "-") == 0;
    FILE *rep = to_stdout ? stderr : stdout; // the records own stdout
    const double *m = st.mean_chars, *t = st.mean_tokens;
    fprintf(rep, "wrote %ld examples to %s (mean steps %.2f)\n", st.n, to_stdout ? "stdout" : out, st.mean_steps);
    fprintf(rep, "mean completion length in characters: direct %.1f, terse %.1f, concise %.1f, verbose %.1f\n",
            m[CHAINS_DIRECT], m[CHAINS_TERSE], m[CHAINS_CONCISE], m[CHAINS_VERBOSE]);
    if (tok_path)
        fprintf(rep, "mean completion length in tokens:     direct %.1f, terse %.1f, concise %.1f, verbose %.1f\n",
                t[CHAINS_DIRECT], t[CHAINS_TERSE], t[CHAINS_CONCISE], t[CHAINS_VERBOSE]);
    fprintf(rep, "ratio verbose/concise: %.2fx characters", m[CHAINS_VERBOSE] / m[CHAINS_CONCISE]);
    if (tok_path)
        fprintf(rep, ", %.2fx tokens", t[CHAINS_VERBOSE] / t[CHAINS_CONCISE]);
    fprintf(rep, "\n");
    return 0;
}

int cmd_synth(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "chains") == 0)
        return synth_chains(argc - 1, argv + 1);
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: ertrain synth <task> [flags]   (ertrain synth <task> --help for its flags)\n\ntasks:\n"
               "  chains       chained integer arithmetic (direct / terse / concise / verbose completions)\n");
        return 0;
    }
    er_error(ER_EINVAL, "expected a task (chains), got \"%s\"", argc >= 2 ? argv[1] : "nothing");
    return cli_fail("synth");
}
