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
    int shared;                 // ER_SHARE_GPU=1: ranks of this node may share a GPU (the gradients then go
                                // through the host: NCCL takes one GPU once)
    char where[24];             // "cpu" or "cuda:N"
    const char *why_cpu;        // on the CPU although no --device asked for it and a GPU could have been
                                // meant: why (NULL: the CPU was asked for, or no GPU is here at all)
} TrainDevice;

// Where one rank runs: train_device_pick's inputs, everything that is not pure gathered beforehand.
typedef struct {
    const char *request;   // --device: NULL (the default), "cpu", "cuda", "cuda:N"
    int cuda_built;        // the build has the CUDA backend (make CUDA=1)
    int n_gpus;            // CUDA devices on this node (backend_cuda_devices: 0 = none, or no driver)
    const char *count_error; // the count failed (a driver that answers but does not work): why; else NULL
    int local_rank, local_size; // this rank among the ranks of its node (0 of 1 without mpirun)
    int share;             // ER_SHARE_GPU=1: more ranks of a node than GPUs may share them
    const char *host_only; // why the job runs on the CPU only (NULL: it can run on a device)
} DeviceAsk;

// The device a rank takes: *index the CUDA device, or -1 for the CPU, and *why_cpu (see TrainDevice).
// Without --device: the GPU of the rank's local rank (rank r of a node on cuda:r), or the CPU quietly
// when there is no GPU at all, or the CPU with a reason when the build has no CUDA or the job is
// host-only; a driver that fails is an error (a GPU is there: a run on the CPU would crawl). More ranks
// on a node than GPUs is an error unless `share` (then rank r on cuda:(r mod n)); so is cuda:N for all the
// ranks of a node. `--device cuda` refuses where the default would go to the CPU. Pure: unit-tested.
int train_device_pick(const DeviceAsk *a, int *index, const char **why_cpu);

// Opens `device` ("cpu", "cuda", "cuda:N"; NULL: the default, train_device_pick's rules, with the rank's
// place on its node from train/dist.h and ER_SHARE_GPU from the environment) and places the job there (on
// the CPU only with `place`: the trainer's device path without a device). A job without params (heads) only
// runs passes: its model and adapter are placed, nothing else. Jobs that rewrite their weights
// before each pass (QAT) and adapter dropout (its masks are drawn on the host) run on the CPU only: asked
// for a device they are refused; with device NULL they stay on the CPU and why_cpu says why. A device
// that was picked and fails to open is an error (with --device cpu as the way out).
int train_device_open(TrainDevice *d, const TrainJob *job, const char *device, int place);
// The trained parameters into job->params; *host gets the optimizer with host moments (opt itself
// when nothing is placed).
int train_device_to_host(TrainDevice *d, const TrainJob *job, AdamW *opt, AdamW **host);
// The optimizer state `host` (from train_device_to_host) and job->params, loaded from a checkpoint,
// placed back.
int train_device_from_host(TrainDevice *d, const TrainJob *job, AdamW *opt, const AdamW *host);
// The gradients summed across the ranks of mpirun (train/dist.h; a no-op on one rank). A device's by
// dist_sum_device_floats: NCCL on the GPUs where the build has it, else through the host (MPI reads host
// memory: CUDA-aware MPI is not assumed).
int train_device_sum_grads(TrainDevice *d, const TrainJob *job);
void train_device_close(TrainDevice *d);

#endif
