// The score runner: per-token log-probabilities under a model, optionally with a LoRA adapter.
//   {"tokens": [...]} or {"text": "..."}: logprobs[i] = log p(x[i+1] | x[..i]), adapter at every position.
//   {"prompt": "...", "completion": "..."} or {"prompt_tokens": [...], "completion_tokens": [...]}:
//   one log-prob per completion token, log p(c[j] | prompt, c[<j]); the adapter is on at completion
//   positions only (the masked rule), so prompt positions are the base model's.
#ifndef INFER_SCORE_H
#define INFER_SCORE_H

#include <stdio.h>

typedef struct {
    const char *model;   // model dir; text records need its tokenizer.json
    const char *adapter; // LoRA adapter dir (PEFT layout); NULL = none
    const char *input;   // JSONL records as above ("-" = stdin)
    FILE *out;           // one {"logprobs", "nll", "n"} line per record; NULL = none
} ScoreConfig;

typedef struct {
    long records;
    long tokens; // log-probs computed
} ScoreResult;

int score_run(const ScoreConfig *c, ScoreResult *res);

#endif
