// ertrain qat: quantization-aware training. A float model dir is fine-tuned (every parameter, loss on
// every position like pretraining, the shared loop of train/trainer.h) while its forward sees the
// weights it will be stored with, then written as `ertrain quantize` writes it (train/quantize.h).
//
// Fake quantization with the straight-through estimator:
//   - fp32 master weights W are what AdamW updates (the trainer's params, checkpointed);
//   - before each step's forward, Q(W) is written into the weights the forward reads: each matrix
//     quantized and dequantized to its target format. For the k-means codebook formats (q2lut, q4lut)
//     the codebook of every row is recomputed from the current W every --recluster-every K steps (the
//     quantizer of `ertrain quantize`), and every step each weight takes its row's nearest level
//     (quant_fake_quant_lut), the k-means weighted by Fisher sensitivities (squared gradients over the
//     first 16 training records at the start, as ertrain quantize --calib weights it); the other formats (RTN, q2rtn) are re-quantized every step
//     (quant_fake_quant_rows). Vectors (norms, biases) are used as they are;
//   - the backward gives dL/dQ(W) in the model's gradient buffers; STE takes it as dL/dW, so AdamW
//     applies it to W;
//   - at the end W is quantized once more by quantize_model (a fresh k-means, the same weighting) and
//     saved with quantize_write_dir; quantization_config.method gets "-fisher-qat" appended.
// Held-out evaluations see Q(W) too, so the eval loss in metrics.jsonl is that of the quantized model.
// --resume is exact when the checkpoint's step is a multiple of K (qat_run requires --save-every to be
// one): the resumed run re-clusters where the uninterrupted one did.
#ifndef TRAIN_QAT_H
#define TRAIN_QAT_H

#include <stdio.h>

#include "model/model.h"
#include "train/quantize.h"
#include "train/trainer.h"

typedef struct {
    TrainConfig train;      // train_config_default(&train, TRAIN_QAT); train.model_dir = the float model dir
    QuantizeOptions q;      // the target, as ertrain quantize takes it (weights, embeddings, lm_head, kmeans_iters)
    const char *transforms; // none | rotate | fpt | a list, applied before training (NULL = none)
    int recluster_every;    // K >= 1
    FILE *log;              // qat's notes and quantization report (NULL = silent; ertrain qat: stdout)
} QatConfig;

int qat_run(const QatConfig *c, TrainResult *res);

// ---- the fake-quantization step, exposed for tests ----

typedef struct QatState QatState;
// State for a trainable model m whose master weights are master (m->n_param_floats, the layout of
// m->param_mem; kept by the caller). o, its plan and importance (per parameter, NULL = unweighted; kept
// by the caller) as in quantize_model: every matrix (k-means codebooks and uniform scales) is weighted as
// ertrain quantize and qat's save weight it, so training sees the quantizer that is deployed.
int qat_state_init(QatState **s, Model *m, const float *master, const QuantizeOptions *o,
                   const float *const *importance, int recluster_every);
// Writes the master weights into m->param_mem, matrices as Q(master) (see above); `step` is the optimizer
// steps done (codebooks re-clustered when it is a multiple of K, and on the first call). Calling it
// again with the same step and unchanged masters does nothing. A negative step (an evaluation, not
// an optimizer step) writes Q(master) on every call and re-clusters when it differs from the last
// call's: m->param_mem may have been overwritten in between.
int qat_state_apply(QatState *s, long step);
void qat_state_free(QatState *s);

#endif
