// ertrain synth: synthetic datasets (data/synth.h). `ertrain synth chains` writes the chained-arithmetic
// benchmark, `ertrain synth guess` the guess-and-check one, as JSONL, and prints the mean completion lengths per
// style; `ertrain synth memory` writes the memory store's retrieval task (facts and questions) into a dir.
#include <stdio.h>
#include <string.h>

#include "core/args.h"
#include "core/error.h"
#include "core/fileio.h"
#include "data/synth.h"
#include "ertrain/cli.h"

// Prints the written file's summary: count, mean steps, completion lengths per style.
static void synth_report(const char *out, const SynthStats *st, int with_tokens) {
    int to_stdout = strcmp(out, "-") == 0;
    FILE *rep = to_stdout ? stderr : stdout; // the records own stdout
    const double *m = st->mean_chars, *t = st->mean_tokens;
    fprintf(rep, "wrote %ld examples to %s (mean steps %.2f)\n", st->n, to_stdout ? "stdout" : out, st->mean_steps);
    fprintf(rep, "mean completion length in characters: direct %.1f, terse %.1f, concise %.1f, verbose %.1f\n",
            m[SYNTH_DIRECT], m[SYNTH_TERSE], m[SYNTH_CONCISE], m[SYNTH_VERBOSE]);
    if (with_tokens)
        fprintf(rep, "mean completion length in tokens:     direct %.1f, terse %.1f, concise %.1f, verbose %.1f\n",
                t[SYNTH_DIRECT], t[SYNTH_TERSE], t[SYNTH_CONCISE], t[SYNTH_VERBOSE]);
    fprintf(rep, "ratio verbose/concise: %.2fx characters", m[SYNTH_VERBOSE] / m[SYNTH_CONCISE]);
    if (with_tokens)
        fprintf(rep, ", %.2fx tokens", t[SYNTH_VERBOSE] / t[SYNTH_CONCISE]);
    fprintf(rep, "\n");
}

// The flags every task shares, then the task's own; parses argv into them.
#define SYNTH_COMMON_SPECS(n, seed, out, tok_path)                                                                 \
    {"n", ARG_INT, &n, "number of examples", 1, 1, 100000000},                                                     \
        {"seed", ARG_INT, &seed, "RNG seed (example i depends only on seed, i and the ranges)", 0, 0, 0},          \
        {"out", ARG_STR, &out,                                                                                      \
         "output JSONL file (written atomically), - for stdout (the report then goes to stderr), or a fifo or "     \
         "character device (written in place)",                                                                     \
         1, 0, 0},                                                                                                  \
        {"tokenizer", ARG_STR, &tok_path,                                                                           \
         "also write each record's completion lengths in this tokenizer.json / model dir's tokens", 0, 0, 0}

// Checks the output before any work (a wrong kind of path, or the tokenizer file itself, fails now) and loads
// the tokenizer when one is given.
static int synth_prepare(const char *out, const char *tok_path, Tokenizer **tok) {
    *tok = NULL;
    ER_TRY(file_output_check(out));
    ER_TRY(file_output_not_input(out, tok_path, "--tokenizer"));
    return tok_path ? tok_load(tok, tok_path) : ER_OK;
}

static int synth_chains(int argc, char **argv) {
    ChainsConfig c;
    chains_config_default(&c);
    int n = 0, seed = 0;
    const char *out = NULL, *tok_path = NULL;
    const ArgSpec specs[] = {
        SYNTH_COMMON_SPECS(n, seed, out, tok_path),
        {"min-steps", ARG_INT, &c.min_steps, "fewest chained operations", 0, 1, CHAINS_MAX_STEPS},
        {"max-steps", ARG_INT, &c.max_steps, "most chained operations", 0, 1, CHAINS_MAX_STEPS},
        {"max-start", ARG_INT, &c.max_start, "start value drawn from 1..N", 0, 1, 1000000},
        {"max-operand", ARG_INT, &c.max_operand, "add/subtract by 1..N", 0, 1, 1000000},
        {"max-factor", ARG_INT, &c.max_factor, "multiply/divide by 2..N", 0, 2, 1000000},
        {"max-value", ARG_INT, &c.max_value, "every intermediate result stays in 0..N", 0, 2, 1000000},
    };
    int rc = args_parse(argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "ertrain synth chains --n N --out FILE.jsonl [--seed S] [--min-steps 1 --max-steps 8 ...]");
    if (rc == ARGS_HELP)
        return 0;
    Tokenizer *tok = NULL;
    SynthStats st;
    if (rc < 0 || synth_prepare(out, tok_path, &tok) < 0 ||
        chains_write_jsonl(&c, n, (uint64_t)(unsigned)seed, out, tok, &st) < 0) {
        tok_free(tok);
        return cli_fail("synth chains");
    }
    tok_free(tok);
    synth_report(out, &st, tok_path != NULL);
    return 0;
}

static int synth_guess(int argc, char **argv) {
    GuessConfig c;
    guess_config_default(&c);
    int n = 0, seed = 0;
    const char *out = NULL, *tok_path = NULL;
    const ArgSpec specs[] = {
        SYNTH_COMMON_SPECS(n, seed, out, tok_path),
        {"max-x", ARG_INT, &c.max_x, "the answer x drawn from 1..N", 0, 2, 1000},
        {"min-factor", ARG_INT, &c.min_factor, "x * a + b = c with a drawn from min..max factor", 0, 1, 1000},
        {"max-factor", ARG_INT, &c.max_factor, "largest factor a", 0, 1, 1000},
        {"max-offset", ARG_INT, &c.max_offset, "b drawn from 1..N", 0, 1, 1000},
        {"max-tries", ARG_INT, &c.max_tries, "the trace stops after this many candidates", 0, 1, 1000},
    };
    int rc = args_parse(argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "ertrain synth guess --n N --out FILE.jsonl [--seed S] [--max-x 12 --max-tries 4 ...]");
    if (rc == ARGS_HELP)
        return 0;
    Tokenizer *tok = NULL;
    SynthStats st;
    if (rc < 0 || synth_prepare(out, tok_path, &tok) < 0 ||
        guess_write_jsonl(&c, n, (uint64_t)(unsigned)seed, out, tok, &st) < 0) {
        tok_free(tok);
        return cli_fail("synth guess");
    }
    tok_free(tok);
    synth_report(out, &st, tok_path != NULL);
    return 0;
}

// `ertrain synth memory`: facts and questions into a dir, not records into a file, so its own flags and report.
static int synth_memory(int argc, char **argv) {
    MemoryTaskConfig c;
    memory_task_config_default(&c);
    int n = 0, seed = 0;
    const char *out = NULL;
    const ArgSpec specs[] = {
        {"n", ARG_INT, &n, "number of facts (and of questions, one per fact)", 1, 1, 100000000},
        {"seed", ARG_INT, &seed, "RNG seed (fact i depends only on seed, i and --facts-per-entity)", 0, 0, 0},
        {"out", ARG_STR, &out, "output dir (made when missing): facts.jsonl and questions.jsonl, written together", 1,
         0, 0},
        {"facts-per-entity", ARG_INT, &c.facts_per_entity,
         "facts about each made-up person, each of another attribute (more than a search's k: the name alone does "
         "not find the fact)", 0, 1, MEMORY_TASK_NATTRS},
    };
    int rc = args_parse(argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "ertrain synth memory --n N --out DIR [--seed S] [--facts-per-entity 8]\n"
                        "  facts.jsonl: erinfer memory import's records; questions.jsonl: one paraphrasing question "
                        "per fact,\n  {problem, answer, fact}, an eval dataset");
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0 || memory_task_write_dir(&c, n, (uint64_t)(unsigned)seed, out) < 0)
        return cli_fail("synth memory");
    long people = (n + c.facts_per_entity - 1) / c.facts_per_entity;
    int dl = path_dir_len(out);
    printf("wrote %d facts about %ld made-up people (%d each) to %.*s/facts.jsonl and their questions to "
           "%.*s/questions.jsonl\n", n, people, c.facts_per_entity, dl, out, dl, out);
    return 0;
}

int cmd_synth(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "chains") == 0)
        return synth_chains(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "guess") == 0)
        return synth_guess(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "memory") == 0)
        return synth_memory(argc - 1, argv + 1);
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: ertrain synth <task> [flags]   (ertrain synth <task> --help for its flags)\n\ntasks:\n"
               "  chains       chained integer arithmetic (direct / terse / concise / verbose completions)\n"
               "  guess        guess and check: try candidates for x in x * a + b = c until one holds\n"
               "  memory       facts about made-up people and questions that paraphrase them (retrieval recall)\n");
        return 0;
    }
    er_error(ER_EINVAL, "expected a task (chains, guess or memory), got \"%s\"", argc >= 2 ? argv[1] : "nothing");
    return cli_fail("synth");
}
