// The training loops of `ertrain sft` (masked LoRA on a frozen base), `ertrain pretrain` (every
// parameter of a randomly initialised model) and `ertrain qat` (every parameter of a float model, seen
// through fake quantization: train/qat.h), sharing one loop: length-bucketed batches,
// gradient accumulation, global-norm clipping, AdamW with linear warmup + cosine decay, held-out
// loss, metrics.jsonl + run.json, and checkpoints a run resumes from bit for bit.
//
// Determinism: every random choice is a function of --seed and of where the run is. The root RNG is
// seeded from --seed; the eval split, the adapter init, the order of epoch e and the dropout masks of
// micro-batch k of step s each fork their own stream from it (rng_fork with a purpose tag and e or
// s, k), so a resumed run draws exactly what the uninterrupted one would.
#ifndef TRAIN_TRAINER_H
#define TRAIN_TRAINER_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "data/chat.h"
#include "data/tokenizer.h"
#include "lora/lora.h"
#include "model/model.h"

typedef enum { TRAIN_SFT, TRAIN_PRETRAIN, TRAIN_QAT } TrainKind;

typedef struct {
    TrainKind kind;
    const char *model_dir;      // sft: the base model dir (loaded frozen; holds the tokenizer); qat: the float model
    const char *config_path;    // pretrain: model config.json
    const char *tokenizer_path; // pretrain: tokenizer.json or a dir holding it
    const char *data_path;
    const char *out_dir;
    const char *response_key;   // NULL: the record type's own response field
    // adapter (sft)
    int rank;
    double alpha;
    const char *targets;        // "all" | "q_proj,v_proj" | ...
    int rslora;
    double dropout;
    int no_mask;                // standard LoRA: the adapter on at every position
    const char *prefix;         // reasoning prefix forced at the start of responses ("" = none)
    // optimisation
    double lr, min_lr;          // peak and final learning rate of the cosine schedule
    double warmup;              // < 1: fraction of the steps; >= 1: steps
    double clip;                // global gradient-norm limit (0 = off)
    double weight_decay;
    double beta1, beta2, eps;
    int epochs;                 // used when steps == 0
    int steps;                  // optimizer steps (0 = from epochs)
    int batch, grad_accum;
    int seq_len;                // most input positions per sequence (longer ones are cut); 0 = the model's
                                // max_position_embeddings. Activations are sized from the longest sequence
    double init_std;            // pretrain: std of the random matrices
    // evaluation, logging, checkpoints
    double eval_split;          // fraction of the records held out
    int eval_max;               // at most this many held out (0 = no limit)
    int eval_every;             // steps between held-out evaluations (0 = only at the end)
    int save_every;             // steps between checkpoints (0 = only at the end)
    int seed, threads, resume;
    int recompute;              // keep only each layer's input; the backward recomputes the rest
    const char *device;         // where the passes run: "cpu", "cuda", "cuda:N"; NULL = the GPU of this rank's
                                // place on its node when built with CUDA=1, one is there and the job can run
                                // there, else cpu (train_device_pick; ertrain's default without --device)
    int stop_after;             // test hook, no flag: stop after this step as if killed (resume tests); 0 = off
    int place_on_cpu;           // test hook (ertrain: ER_TEST_PLACE_ON_CPU=1): run on copies placed on the CPU
                                // backend, as on a device
                                // (checks the device path of the trainer where there is no device)
    FILE *out;                  // the plan and the summary lines (NULL = silent; ertrain: stdout)
    FILE *log;                  // the progress bar (NULL = silent; ertrain: stderr)
} TrainConfig;

// What a run ended with (optional output of the train_* functions).
typedef struct {
    long steps;            // optimizer steps done (total, including resumed ones)
    double first_loss;     // training loss of the first step run by this call
    double last_loss;      // training loss of the last step
    double eval_loss;      // last held-out loss (NAN when none)
    long n_train, n_eval;  // sequences
    long n_skipped;        // records whose prompt does not fit --seq-len
    long n_truncated;      // sequences cut to --seq-len
    double tokens_per_s;
} TrainResult;

void train_config_default(TrainConfig *c, TrainKind kind);
int train_sft(const TrainConfig *c, TrainResult *res);     // train/sft.c
int train_pretrain(const TrainConfig *c, TrainResult *res); // train/pretrain.c

// ---- shared by the jobs: sft.c, pretrain.c, qat.c (train/trainer.c) ----

// Purposes of the RNG streams forked from the root RNG.
enum { TRAIN_STREAM_SPLIT = 1, TRAIN_STREAM_INIT = 2 };
// A seed for purpose `stream`, derived from --seed.
uint64_t train_derived_seed(int seed, uint64_t stream);

// The chat style of the tokenizer_config.json next to a tokenizer (a model dir, a tokenizer dir or a
// tokenizer.json); plain ChatML when there is none.
int train_chat_style(const char *tokenizer_path_or_dir, ChatStyle *out);

// A resumed run must have the settings the checkpoint was made with, except threads, eval_every and
// save_every (they do not change the trajectory) and its length: --steps (or --epochs) may extend a
// run, finished or not. The learning-rate schedule is a function of the step and the total, so the
// steps after the resume follow the schedule of the new total (warmup included when it is a
// fraction); a run resumed with its own length continues bit for bit. Paths compare resolved
// (run_add_path). `saved` and `now` are resolved-config objects.
int train_config_check_resume(const cJSON *saved, const cJSON *now, const char *ckpt_dir);

// Checks the settings every job shares (one-line errors naming the flag).
int train_config_check(const TrainConfig *c);
// The output dir, before any work: run_dir_check (a stopped run's files cleared, the line on c->out), and
// no input (model, config, tokenizer, data) that is the output dir or lies inside it.
int train_out_check(const TrainConfig *c);

// run.json "model": {key: path, hidden_size, num_hidden_layers, vocab_size, parameters}. NULL when out
// of memory.
cJSON *train_model_info(const char *key, const char *path, const ModelConfig *mc, size_t params);

// Weight decay on matrices only, norms and biases left alone: (m->n_param_floats) flags laid out like
// m->param_mem. NULL when out of memory.
unsigned char *train_decay_mask(const Model *m);

// What one run trains; set up by sft.c / pretrain.c / qat.c, run by trainer_run.
typedef struct {
    const TrainConfig *cfg;
    const char *label;                 // "sft" | "pretrain" | "qat"
    Model *model;
    LoraAdapter *adapter;              // sft: the trained adapter; NULL trains the model itself
    float *params, *grads;             // (n) what the optimizer updates
    size_t n;
    const unsigned char *decay_mask;   // (n) weight decay where non-zero; NULL = everywhere
    const Tokenizer *tok;
    ChatStyle style;
    const char *prefix;                // reasoning prefix of the sequences ("" = none)
    cJSON *model_info;                 // run.json "model" (owned by the caller)
    // Writes the result into the output dir at the end (adapter or model dir).
    int (*save_final)(void *ctx, const char *out_dir);
    void *save_ctx;
    // Optional (QAT): called before the forward passes of each optimizer step and of each held-out
    // evaluation, with the optimizer steps done so far; it may rewrite the weights the forward reads
    // (params then hold master weights the optimizer updates with the gradients at those weights).
    int (*before_forward)(void *ctx, long step);
    void *hook_ctx;
    const cJSON *extra_config;         // more resolved settings for run.json "config" (checked on resume)
} TrainJob;

// The fields every job has, the rest zero; params, grads and n are all of m's parameters (pretraining:
// SFT points them at the adapter, QAT params at its master weights).
void train_job_init(TrainJob *job, const TrainConfig *c, const char *label, Model *m, const Tokenizer *tok,
                    ChatStyle style, cJSON *model_info, int (*save_final)(void *ctx, const char *out_dir),
                    void *save_ctx);

// Loads the data, creates or resumes the run dir, trains, checkpoints, and saves the result.
int trainer_run(TrainJob *job, TrainResult *res);

#endif
