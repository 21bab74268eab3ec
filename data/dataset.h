// JSONL datasets, normalised into one Example. Accepted records (one JSON object per line):
//   {"messages": [{"role": ..., "content": ...}, ...]}   chat; a final assistant turn is the response
//   {"prompt": ..., "completion": ...}                    completion optional (eval prompts)
//   {"problem": ..., "solution": ..., "answer": ...}      MATH-500 style; solution and answer optional,
//                                                         a missing answer is taken from the solution's
//                                                         last \boxed{} (also the synthetic "chains")
//   {"question": ..., "answer": "... #### 72"}            GSM8K; the gold answer follows "#### ",
//                                                         the whole answer text is the response
//   {"text": ...}                                         raw text for pretraining: no chat template,
//                                                         no prompt, response or answer (so eval and
//                                                         GRPO refuse it); response_key does not apply
// plus, in any but "text", "budget" (int tokens > 0), "needs_reasoning" (bool) and "answer" (string or
// number; the gold answer). DatasetOptions.response_key picks a different string field as the
// response (e.g. "concise" or "verbose" for chains records). Errors name "file:line" and the field.
#ifndef DATA_DATASET_H
#define DATA_DATASET_H

#include <stdint.h>

#include "core/json.h"
#include "core/rng.h"
#include "data/chat.h"

typedef struct {
    ChatMessage *messages; // (n_messages,) the prompt as a conversation; strings owned by the example
    int n_messages;
    char *prompt;          // the text of the last user turn (problem / question / prompt)
    char *response;        // target completion, NULL when the record has none
    char *text;            // raw text of a {"text"} record (then messages, prompt, response are NULL)
    char *answer;          // gold final answer, NULL when unknown
    int budget;            // token budget, -1 when absent
    int needs_reasoning;   // 0 / 1, -1 when absent
    long line;             // 1-based line in the source file
} Example;

typedef struct {
    const char *response_key; // NULL: the record type's own response field
} DatasetOptions;

typedef struct {
    JsonlReader jr;
    DatasetOptions opt;
} DatasetReader;

typedef struct {
    Example *ex; // (n,)
    int n, cap;
} Dataset;

// Streaming: dataset_next returns 1 with *ex filled (free with example_free), 0 at end of file, or a
// negative status with "file:line: ..." recorded. opt may be NULL.
int dataset_open(DatasetReader *r, const char *path, const DatasetOptions *opt);
int dataset_next(DatasetReader *r, Example *ex);
void dataset_close(DatasetReader *r);
void example_free(Example *ex);

// Parses one record (ctx names it in errors, e.g. "train.jsonl:12").
int example_from_json(const cJSON *obj, const DatasetOptions *opt, const char *ctx, Example *ex);

// Whole file in memory (max_examples <= 0: no limit).
int dataset_load(const char *path, const DatasetOptions *opt, int max_examples, Dataset *d);
void dataset_free(Dataset *d);

// Fisher-Yates with the run's RNG.
void shuffle_indices(int *idx, int n, ErRng *rng);
void dataset_shuffle(Dataset *d, ErRng *rng);
// Shuffles d, then moves its last n_eval examples into *eval; d keeps the rest (the training split).
int dataset_split(Dataset *d, int n_eval, ErRng *rng, Dataset *eval);

// Length-bucketed batches: shuffle, cut into buckets of bucket_batches * batch_size examples, sort
// each bucket by length (so a batch pads little), cut into batches, shuffle the batch order.
// Batch b is index[start[b] .. start[b+1]); when batch_size does not divide n, one batch (the
// remainder, wherever the shuffle puts it) is short.
typedef struct {
    int *index;    // (n,) example indices
    int *start;    // (n_batches + 1,)
    int n, n_batches;
} Batches;

int batches_by_length(const int *lengths, int n, int batch_size, int bucket_batches, ErRng *rng, Batches *out);
void batches_free(Batches *b);

#endif
