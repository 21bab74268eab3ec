// Where the trainer runs a job: on the CPU with the job's own model, adapter and trained vector, or on
// a device backend with copies placed there (model/backend.h). Checkpoints and outputs are written
// from the host: train_device_to_host copies the trained parameters back into the job's (and the
// optimizer's moments into a host AdamW), train_device_from_host places a resumed state.
#ifndef TRAIN_DEVICE_H
#define TRAIN_DEVICE_H

#include "train/optim.h"
#include "train/trainer.h"

typedef struct {
    Backend *be;
    Model *model;               // what the passes run: the job's, or dev_model
    LoraAdapter *adapter;       // the job's, dev_adapter, or NULL
    float *params, *grads;      // (n) what the optimizer updates, on be
    unsigned char *decay_mask;  // (n) on be, or NULL
    Model dev_model;            // the placed copies (be is a device)
    LoraAdapter dev_adapter;
    unsigned char *dev_decay;
    AdamW host_opt;             // the moments' host copy for checkpoints (be is a device)
    int placed;
    const char *why_cpu;        // the job runs on the CPU although a device was the default: why
} TrainDevice;

// Opens `device` ("cpu", "cuda", "cuda:N") and places the job there (on the CPU only with `place`: the
// trainer's device path without a device). Jobs that rewrite their weights before each pass (QAT) and
// adapter dropout (its masks are drawn on the host) run on the CPU only: asked for a device they are
// refused; with device NULL (backend_default(), the GPU when there is one) they stay on the CPU and
// why_cpu says why.
int train_device_open(TrainDevice *d, const TrainJob *job, const char *device, int place);
// The trained parameters into job->params; *host gets the optimizer with host moments (opt itself
// when nothing is placed).
int train_device_to_host(TrainDevice *d, const TrainJob *job, AdamW *opt, AdamW **host);
// The optimizer state `host` (from train_device_to_host) and job->params, loaded from a checkpoint,
// placed back.
int train_device_from_host(TrainDevice *d, const TrainJob *job, AdamW *opt, const AdamW *host);
// The gradients summed across the ranks of mpirun (train/dist.h; a no-op on one rank). A device's go
// through the host: MPI reads host memory (unless it is CUDA-aware, which is not assumed).
int train_device_sum_grads(TrainDevice *d, const TrainJob *job);
void train_device_close(TrainDevice *d);

#endif
