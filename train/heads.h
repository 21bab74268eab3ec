// The run behind `ertrain heads`, the part both heads share: one base model and its reasoning
// adapter, a JSONL dataset with gold answers, each record's prompt rendered as erinfer eval renders
// it, a seeded split of the records (the held-out ones calibrate and measure), and one pass over the
// records through the runtime engine (the code erinfer runs) in which each head collects its rows;
// then each head trains, calibrates and saves itself, and run.json and metrics.jsonl are written.
//
// The heads are not this layer's: the switcher (switcher_train/) and the verifier (verifier_train/)
// each plug in as a HeadJob that says what it needs and how it collects and trains, so neither head's
// folder owns the other's code and this one names neither.
#ifndef TRAIN_HEADS_H
#define TRAIN_HEADS_H

#include <stdint.h>
#include <stdio.h>

#include "core/json.h"
#include "data/chat.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "infer/engine.h"
#include "train/run.h"

typedef struct {
    const char *model_dir;   // base model (HF layout, with its tokenizer): the model the heads read
    const char *adapter_dir; // reasoning adapter (PEFT)
    const char *data_path;   // JSONL records with gold answers
    const char *out_dir;     // run.json and metrics.jsonl (made when missing)
    const char *system;      // system message in front of every prompt (NULL = none added)
    const char *prefix;      // reasoning prefix forced in reasoning responses (NULL = the adapter's)
    KvType kv;               // KV cache while collecting
    int limit;               // only the first N records (0 = all)
    int seed;                // the split (and, through the heads, sampling, init, order, dropout, noise)
    double val_split;        // share of the records held out: at least one when > 0, leaving two to train on
                             // (0: none, and the thresholds are calibrated on the training rows)
    int max_new;             // tokens per reasoning response
    int budget;              // hard budget on reasoning responses (0 = off)
    int answer_tokens;       // tokens allowed after the budget, suffix included
    const cJSON *settings;   // recorded as run.json's "config" (the caller's settings; NULL = none)
    FILE *out;               // the report: label counts, each head's result and file (NULL = silent)
    FILE *log;               // progress and notes (NULL = silent)
} HeadsConfig;

void heads_config_default(HeadsConfig *c);

// What the heads read while collecting; loaded and checked by heads_run before any generation.
typedef struct {
    const HeadsConfig *c;
    Dataset d;
    Model m;
    Tokenizer *tok;
    LoraAdapter ad;
    int **ids, *nids;    // (d.n): each record's prompt tokens
    uint8_t *is_val;     // (d.n): 1 = held out; a held-out record's rows of every head stay held out
    int n_val;
    Engine e;
    GenConfig reasoning; // the reasoning route: adapter, prefix, budget, max_new
    long gen_tokens;     // tokens generated so far (the heads add theirs)
} HeadsData;

// One head in heads_run, made by the head's folder (switcher_job, verifier_job) with its state in
// `self`. Every callback gets `self`; check, prepare, report and (one rank) gather may be NULL.
typedef struct {
    const char *what;   // how the start line names it: "switcher (derived labels)"
    int need_gold;      // every record must have a gold answer
    int n_seqs;         // engine sequences it decodes at once
    int max_new;        // its longest generation when longer than the reasoning responses
    void *self;
    int (*check)(void *self, const HeadsData *d, const Example *ex); // one record, before anything loads
    // Once the tokenizer is loaded, before the engine is sized: returns the positions the head appends
    // after a response (>= 0), or a negative status.
    int (*prepare)(void *self, HeadsData *d);
    int (*collect)(void *self, HeadsData *d, int i);                 // record i's rows
    // Under mpirun each rank collects a contiguous block of the records (train/dist.h); then every
    // rank's rows and counts are gathered (head_rows_gather, dist_sum_doubles) before the report.
    int (*gather)(void *self, HeadsData *d);
    void (*report)(void *self, const HeadsData *d, FILE *out);       // after the pass (out may be NULL)
    int (*train)(void *self, const HeadsData *d, MetricsLog *ml, cJSON *results); // fit, calibrate, save
    void (*free)(void *self);
} HeadJob;

// Frees the job's state; safe on a zeroed job.
void head_job_free(HeadJob *j);

typedef struct {
    int records, held_out;
    long generated_tokens;
    double seconds;
} HeadsResult;

// Loads and checks everything, collects every job's rows in one pass over the records, trains the
// jobs in order (each adds its metrics under its name to run.json's "result") and writes run.json.
// Under mpirun the ranks split the pass and rank 0 alone trains and writes.
int heads_run(const HeadsConfig *c, HeadJob *jobs, int n_jobs, HeadsResult *res);

#endif
