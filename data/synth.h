// Synthetic reasoning tasks, each example with a problem, its answer and four completions of that answer
// (direct / terse / concise / verbose). Two families:
//
// "chains": k chained integer operations (k = 1..8), e.g.
//     "Start with 7. Add 5. Multiply by 3. Subtract 4. What is the result?"
// Every intermediate result stays in 0..max_value by construction (an operation is only drawn when
// its result fits, divisions are exact), so no modular wrap-around hides the arithmetic. One step is
// a single small operation a tiny model learns directly; k >= 4 chained in one go is not, while a
// step-by-step trace turns each step into one easy operation.
//   direct   "Answer: 32"
//   terse    the running values only, on one line ("12 36 32"), then "Answer: 32"
//   concise  one line per step ("7 + 5 = 12" ...), then "Answer: 32"
//   verbose  the concise lines interleaved with restatements, re-checks and second guesses in
//            phrasings drawn from the seeded RNG (several times the concise length).
//
// "guess": guess and check, e.g. "Find x from 1 to 12 such that x * 4 + 3 = 31." The trace tries consecutive
// candidates from a random start (wrapping from max_x to 1), computes each one's check and its difference from the
// target, and says whether it holds:
//   concise  "try 6: 6 * 4 + 3 = 27, 27 - 31 = -4, no\ntry 7: 7 * 4 + 3 = 31, 31 - 31 = 0, yes\nAnswer: 7"
// and stops at the first that holds or after max_tries; when none held it answers the candidate whose check came
// closest ("closest: 9"), which is then wrong. The start carries no information about the answer, so one greedy pass
// finds it only as often as max_tries / max_x, while independent samples start elsewhere: this is the family where
// sampling several traces and keeping the one whose check held pays, and where a wrong trace is visible in the text
// ("no" on every line, "closest"). The verdict reads one token (the difference is 0 or not), and no candidate
// repeats within a trace.
//   direct   "Answer: 7"
//   terse    the tried candidates with their verdicts ("6 no 7 yes"), then "Answer: 7"
//   verbose  the concise lines with talk around every try (several times the concise length).
// `steps` is the number of tries in the trace.
//
// Example i depends only on (seed, i, config), not on how many are generated.
//
// "memory" is a retrieval task, not a reasoning one: facts about made-up people for erinfer memory's store and one
// question per fact that paraphrases it, to measure whether a search finds the fact (recall@k; scripts/
// memory_recall.sh). A fact tells one attribute of one person:
//     fact      "Zorvin Quenbim works as a glassblower."
//     question  "What does Zorvin Quenbim do for a living?"   answer "glassblower"
// The names are built from syllables (two words, each unique to its person: no knowledge of the world helps), and
// each person has facts_per_entity of the ten attributes (job, city, pet, colour, age, lucky number, instrument,
// food, sport, language), so the name alone leaves several candidates: with more than k facts per person a search
// that matches only the name misses at k. A question names the person but says its attribute in other words than
// the fact (no word of four letters or more of the fact but the name is in its question), in one of several
// phrasings drawn from the seeded RNG. Answers are one word or number. Fact i is about person i / facts_per_entity
// and depends only on (seed, i, config).
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
    int max_x;                    // the answer x from 1..max_x
    int min_factor, max_factor;   // x * a + b = c with a from min_factor..max_factor
    int max_offset;               // and b from 0..max_offset
    int max_tries;                // the trace stops after this many candidates
} GuessConfig;

typedef struct {
    char *problem;
    char *answer; // decimal result
    char *direct, *terse, *concise, *verbose;
    int steps;
    int result;
} SynthExample;

typedef enum { SYNTH_DIRECT, SYNTH_TERSE, SYNTH_CONCISE, SYNTH_VERBOSE, SYNTH_NSTYLES } SynthStyle;

typedef struct {
    long n;
    double mean_chars[SYNTH_NSTYLES];  // mean completion length in bytes per style
    double mean_tokens[SYNTH_NSTYLES]; // in tokens; 0 when no tokenizer was given
    double mean_steps;
} SynthStats;


#define CHAINS_MAX_STEPS 8

void chains_config_default(ChainsConfig *c); // steps 1..8, start 1..20, operand 1..9, factor 2..3, 0..49
int chains_config_check(const ChainsConfig *c);
int chains_generate(const ChainsConfig *c, uint64_t seed, uint64_t index, SynthExample *ex);

void guess_config_default(GuessConfig *c); // x 1..12, factor 2..5, offset 0..9, 3 tries
int guess_config_check(const GuessConfig *c);
int guess_generate(const GuessConfig *c, uint64_t seed, uint64_t index, SynthExample *ex);

#define MEMORY_TASK_NATTRS 10
#define MEMORY_TASK_MAX_ENTITIES 160000 // distinct names: 400 first words x 400 last words

typedef struct {
    int facts_per_entity; // distinct attributes told about each person, 1..MEMORY_TASK_NATTRS
} MemoryTaskConfig;

// One fact and its question. attribute is static ("job", "city", ...); the rest is owned: memory_fact_free.
typedef struct {
    char *entity;          // "Zorvin Quenbim"
    const char *attribute;
    char *text;            // the fact sentence
    char *question;        // a paraphrase asking for the attribute
    char *answer;          // one word or number, in text and not in question
} MemoryFact;

void memory_task_config_default(MemoryTaskConfig *c); // 8 facts per person
int memory_task_config_check(const MemoryTaskConfig *c);
int memory_task_generate(const MemoryTaskConfig *c, uint64_t seed, uint64_t index, MemoryFact *f);
void memory_fact_free(MemoryFact *f);
// Writes n facts into dir (made when missing; both files appear together, an older pair is replaced):
//   facts.jsonl      {"text", "metadata": {"entity", "attribute", "fact"}}   erinfer memory import's records
//   questions.jsonl  {"problem", "answer", "fact", "attribute"}              a dataset (data/dataset.h) for eval
// with "fact" the fact's index i, 0-based, in both.
int memory_task_write_dir(const MemoryTaskConfig *c, long n, uint64_t seed, const char *dir);

void synth_example_free(SynthExample *ex);
const char *synth_completion(const SynthExample *ex, SynthStyle style);
const char *synth_style_name(SynthStyle style); // "direct", "terse", "concise", "verbose": the JSONL keys

// Writes n examples as JSONL records {problem, answer, steps, needs_reasoning, direct, terse,
// concise, verbose} atomically to path; with tok each record also holds its completions' lengths in tok's
// tokens, {"tokens": {"direct": n, "terse": n, "concise": n, "verbose": n}}. *stats (if not NULL) gets the
// mean lengths, in tokens too when tok is not NULL.
int chains_write_jsonl(const ChainsConfig *c, long n, uint64_t seed, const char *path, const Tokenizer *tok,
                       SynthStats *stats);
// The same for the guess family: needs_reasoning is true on every record (no one-step form).
int guess_write_jsonl(const GuessConfig *c, long n, uint64_t seed, const char *path, const Tokenizer *tok,
                      SynthStats *stats);

#endif
