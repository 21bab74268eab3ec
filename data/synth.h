// Synthetic reasoning benchmark "chains": k chained integer operations (k = 1..8), e.g.
//     "Start with 7. Add 5. Multiply by 3. Subtract 4. What is the result?"
// Every intermediate result stays in 0..max_value by construction (an operation is only drawn when
// its result fits, divisions are exact), so no modular wrap-around hides the arithmetic. One step is
// a single small operation a tiny model learns directly; k >= 4 chained in one go is not, while a
// step-by-step trace turns each step into one easy operation.
// Each example carries four completions of the same answer:
//   direct   "Answer: 32"
//   terse    the running values only, on one line ("12 36 32"), then "Answer: 32"
//   concise  one line per step ("7 + 5 = 12" ...), then "Answer: 32"
//   verbose  the concise lines interleaved with restatements, re-checks and second guesses in
//            phrasings drawn from the seeded RNG (several times the concise length).
// Example i depends only on (seed, i, config), not on how many are generated.
#ifndef DATA_SYNTH_H
#define DATA_SYNTH_H

#include <stdint.h>

#include "data/tokenizer.h"

typedef struct {
    int min_steps, max_steps; // k drawn uniformly from [min_steps, max_steps], within 1..8
    int max_start;            // start value from 1..max_start
    int max_operand;          // add / subtract by 1..max_operand
    int max_factor;           // multiply / divide by 2..max_factor
    int max_value;            // every intermediate result stays in 0..max_value
} ChainsConfig;

typedef struct {
    char *problem;
    char *answer; // decimal result
    char *direct, *terse, *concise, *verbose;
    int steps;
    int result;
} ChainsExample;

typedef enum { CHAINS_DIRECT, CHAINS_TERSE, CHAINS_CONCISE, CHAINS_VERBOSE, CHAINS_NSTYLES } ChainsStyle;

typedef struct {
    long n;
    double mean_chars[CHAINS_NSTYLES];  // mean completion length in bytes per style
    double mean_tokens[CHAINS_NSTYLES]; // in tokens; 0 when no tokenizer was given
    double mean_steps;
} ChainsStats;


#define CHAINS_MAX_STEPS 8

void chains_config_default(ChainsConfig *c); // steps 1..8, start 1..20, operand 1..9, factor 2..3, 0..49
int chains_config_check(const ChainsConfig *c);
int chains_generate(const ChainsConfig *c, uint64_t seed, uint64_t index, ChainsExample *ex);
void chains_example_free(ChainsExample *ex);
const char *chains_completion(const ChainsExample *ex, ChainsStyle style);
const char *chains_style_name(ChainsStyle style); // "direct", "terse", "concise", "verbose": the JSONL keys

// Writes n examples as JSONL records {problem, answer, steps, needs_reasoning, direct, terse,
// concise, verbose} atomically to path; with tok each record also holds its completions' lengths in tok's
// tokens, {"tokens": {"direct": n, "terse": n, "concise": n, "verbose": n}}. *stats (if not NULL) gets the
// mean lengths, in tokens too when tok is not NULL.
int chains_write_jsonl(const ChainsConfig *c, long n, uint64_t seed, const char *path, const Tokenizer *tok,
                       ChainsStats *stats);

#endif
