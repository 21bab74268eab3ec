// Training a small head (model/head.h) on fixed feature vectors, the part the switcher
// (switcher_train/) and the verifier (verifier_train/) share: rows of features and labels, binary
// cross-entropy, AdamW (train/optim.h), mini-batches in a seeded order, optional Gaussian feature
// noise, the held-out metrics (ROC-AUC, accuracy at a threshold) and the threshold calibration that
// is stored with the head. Which features, which labels and which head each one trains stay in
// their own folders.
//
// Features are standardised with the training split's per-dimension mean and standard deviation
// while training (so the noise sigma is in units of each feature's spread and one learning rate
// suits any model's hidden-state scale); at the end the standardisation is folded into the first
// layer (w1' = w1 / sd, b1' = b1 - w1' . mean), so the saved head reads raw hidden states.
#ifndef TRAIN_HEAD_FIT_H
#define TRAIN_HEAD_FIT_H

#include <stdint.h>
#include <stdio.h>

#include "core/json.h"
#include "model/head.h"
#include "train/run.h"

typedef struct {
    int epochs;          // passes over the training rows
    int batch;           // rows per AdamW step
    double lr, weight_decay;
    float noise;         // sigma of the Gaussian noise added to standardised features (0 = off)
    uint64_t seed;       // data order, dropout, noise
    const char *label;   // "switcher" | "verifier": metrics lines and progress
    MetricsLog *metrics; // one line per epoch when not NULL
} HeadFitConfig;

void head_fit_config_default(HeadFitConfig *c);

typedef struct {
    double first_loss, last_loss; // training BCE of the first and the last epoch (with noise/dropout)
    double val_loss;              // held-out BCE (NaN without held-out rows)
} HeadFitResult;

// Trains h (initialised, with gradients) on x (n, h->in) and labels y (n) in {0, 1}; with n_val > 0
// the held-out rows xv, yv are scored after every epoch for the metrics lines.
int head_fit(Head *h, const float *x, const float *y, int n, const float *xv, const float *yv, int n_val,
             const HeadFitConfig *c, HeadFitResult *res);

// Area under the ROC curve of scores against labels (ties count half); NaN when one class is absent.
double roc_auc(const float *score, const float *y, int n);
// Share of rows where (score >= t) == (y == 1).
double accuracy_at(const float *score, const float *y, int n, float t);
// The threshold: with 0 < target_recall <= 1 the largest t whose recall (positives with
// score >= t) reaches target_recall; otherwise the t with the best accuracy (ties: the lowest).
// 0.5 when n == 0 (or no positive for a target recall).
float threshold_choose(const float *score, const float *y, int n, double target_recall);

// Feature rows and their labels, grown as examples are collected. A zeroed HeadRows with C set is empty.
typedef struct {
    float *x, *y; // (n, C), (n)
    int n, cap, C;
} HeadRows;

// Room for `more` rows past n.
int head_rows_reserve(HeadRows *r, int more);
void head_rows_free(HeadRows *r);
// Under mpirun (train/dist.h): r becomes every rank's rows, in rank order (each rank collected a
// contiguous block of the records, so the rows stay in record order). A no-op on one rank.
int head_rows_gather(HeadRows *r);

// How head_train fits and calibrates one head.
typedef struct {
    HeadFitConfig fit;    // fit.label names the head in errors, metrics and the report
    double target_recall; // 0: the best-accuracy threshold
    const char *positive; // what label 1 means, for the label counts ("needs reasoning"; NULL: "label 1")
    int allow_one_class;  // write a head whose training rows hold one label (said on log)
    FILE *out;            // the result line (NULL = silent)
    FILE *log;            // the "training on" line and warnings (NULL = silent)
} HeadTrainSpec;

// Fits t->net (initialised, with gradients) on the training rows, calibrates t->threshold on the
// calibration rows (the training rows when none is held out) and measures it on the report rows, which
// come from other records (the calibration rows when there are none: the metrics and the line say
// which split), fills t->metrics, adds a copy of them to results under the head's name and writes
// one result line (held-out ROC-AUC, report accuracy, threshold, losses) to s->out. Training rows
// with one label only are refused (ER_EINVAL, naming the head and the label counts) unless
// s->allow_one_class; calibration or report rows with one label are warned about on s->log. Saving is
// the caller's: a head may refuse its threshold first.
int head_train(TrainedHead *t, const HeadRows *tr, const HeadRows *cal, const HeadRows *rep, const HeadTrainSpec *s,
               cJSON *results);

// trained_head_save, and "<name>: wrote <path>" to out (NULL = silent).
int head_save(const TrainedHead *t, const char *name, const char *path, FILE *out);

#endif
