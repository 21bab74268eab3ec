// The run behind `ertrain heads`, the part both heads share: one base model and its reasoning
// adapter, a JSONL dataset with gold answers, each record's prompt rendered as erinfer eval renders
// it, a seeded split of the records (training; held out: one half calibrates the thresholds, the
// other half measures the heads at them, so no accuracy is reported on the records that chose its
// threshold), and one pass over the records through the runtime engine (the code erinfer runs, with
// the KV cache type erinfer will run the heads on) in which each head collects its rows; then each
// head trains, calibrates and saves itself, and run.json and metrics.jsonl are written.
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
#include "train/device.h"
#include "train/run.h"

typedef struct {
    const char *model_dir;   // base model (HF layout, with its tokenizer): the model the heads read
    const char *adapter_dir; // reasoning adapter (PEFT); NULL on a hybrid-thinking model: the base reasons with
                             // its thinking on
    const char *data_path;   // JSONL records with gold answers
    const char *out_dir;     // run.json and metrics.jsonl (made when missing)
    const char *system;      // system message in front of every prompt (NULL = none added)
    const char *prefix;      // reasoning prefix forced in reasoning responses (NULL = the adapter's)
    KvType kv;               // KV cache while collecting (recorded in each head: the features depend on it)
    int limit;               // only the first N records (0 = all)
    int seed;                // the split (and, through the heads, sampling, init, order, dropout, noise)
    double val_split;        // share of the records held out, leaving two to train on: at least two when > 0
                             // (half calibrate, half report; with one it does both) (0: none, and the
                             // thresholds are calibrated and reported on the training rows)
    int allow_one_class;     // write a head whose training rows hold one label (else refused)
    int max_new;             // tokens per reasoning response
    int budget;              // hard budget on reasoning responses (0 = off)
    int answer_tokens;       // tokens allowed after the budget, suffix included
    const char *device;      // where the passes run: "cpu", "cuda", "cuda:N" (train/device.h); NULL = the CPU, as
                             // erinfer runs by default: the features on a GPU's bf16 base differ a little
    int place_on_cpu;        // test hook (ertrain: ER_TEST_PLACE_ON_CPU=1): copies placed on the CPU backend
    const cJSON *settings;   // recorded as run.json's "config" (the caller's settings; NULL = none)
    FILE *out;               // the report: label counts, each head's result and file (NULL = silent)
    FILE *log;               // progress and notes (NULL = silent)
} HeadsConfig;

void heads_config_default(HeadsConfig *c);

// Where a record's rows go: the fit, the thresholds' calibration, or the metrics reported at those
// thresholds (records disjoint from the other two).
enum { HEADS_TRAIN = 0, HEADS_CALIBRATE = 1, HEADS_REPORT = 2 };

// What the heads read while collecting; loaded and checked by heads_run before any generation.
typedef struct {
    const HeadsConfig *c;
    Dataset d;
    Model m;
    Tokenizer *tok;
    LoraAdapter ad;
    TrainJob job;        // the model and adapter train/device.h places (nothing trained there)
    TrainDevice dev;     // where the engine runs: dev.model and dev.adapter, m and ad or their placed copies
    int **ids, *nids;    // (d.n): each record's prompt tokens
    uint8_t *split;      // (d.n): HEADS_TRAIN, HEADS_CALIBRATE or HEADS_REPORT; a record's rows of every
                         // head go to its split
    int n_cal, n_report; // records held out to calibrate the thresholds and to report the metrics at them
    int n_file;          // records in the file (more than d.n with --limit)
    Engine e;
    GenConfig reasoning; // the reasoning route: adapter (NULL: none, a hybrid base), prefix, budget, max_new
    int hybrid;          // the base thinks natively (chat_style_hybrid): the direct route is its thinking off
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
    int records, calibration, report; // records used, and of those held out to calibrate and to report
    long generated_tokens;
    double seconds;
} HeadsResult;

// Loads and checks everything, collects every job's rows in one pass over the records, trains the
// jobs in order (each adds its metrics under its name to run.json's "result") and writes run.json.
// Under mpirun the ranks split the pass and rank 0 alone trains and writes.
int heads_run(const HeadsConfig *c, HeadJob *jobs, int n_jobs, HeadsResult *res);

#endif
