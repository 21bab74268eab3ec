#include "train/device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "train/dist.h"

// Places the job's model, adapter and decay mask on d->be and points d at what the optimizer updates.
static int device_place(TrainDevice *d, const TrainJob *job) {
    Backend *be = d->be;
    const Model *m = job->model;
    d->placed = 1;
    ER_TRY(model_to_backend(&d->dev_model, m, be));
    d->model = &d->dev_model;
    if (job->adapter) {
        ER_TRY(lora_to_backend(&d->dev_adapter, job->adapter, be));
        d->adapter = &d->dev_adapter;
    }
    if (!job->params) { // nothing trained on the device (heads: features from passes through the model)
        d->params = d->grads = NULL;
        return ER_OK;
    }
    if (job->adapter && job->params == job->adapter->params) {
        d->params = d->dev_adapter.params;
        d->grads = d->dev_adapter.grads;
    } else if (job->params == m->param_mem && job->n == m->n_param_floats) {
        d->params = d->dev_model.param_mem;
        d->grads = d->dev_model.grad_mem;
    } else {
        return er_error(ER_EUNSUPPORTED, "%s trains parameters the trainer cannot place on %s", job->label, be->name);
    }
    if (job->decay_mask) {
        d->dev_decay = be->ops->alloc(be, job->n);
        if (!d->dev_decay)
            return ER_ENOMEM;
        ER_TRY(be->ops->upload(be, d->dev_decay, job->decay_mask, job->n));
        d->decay_mask = d->dev_decay;
    }
    return adamw_init(&d->host_opt, backend_cpu(), job->n, 0, 0, 0, 0, 0);
}

// Why the job cannot run on a device (NULL: it can).
static const char *host_only(const TrainJob *job) {
    if (job->before_forward)
        return "it rewrites its weights on the host before every pass";
    if (job->adapter && job->adapter->dropout > 0)
        return "adapter dropout draws its masks on the host";
    return NULL;
}

// The device number of a "cuda:N" request (-1 for "cuda"), or an error naming the flag.
static int parse_request(const char *request, int *n) {
    *n = -1;
    if (!strcmp(request, "cuda"))
        return ER_OK;
    char *end = NULL;
    long v = strncmp(request, "cuda:", 5) == 0 && request[5] ? strtol(request + 5, &end, 10) : -1;
    if (v < 0 || v > 4096 || !end || *end)
        return er_error(ER_EINVAL, "--device '%s': expected cpu, cuda or cuda:N", request);
    *n = (int)v;
    return ER_OK;
}

int train_device_pick(const DeviceAsk *a, int *index, const char **why_cpu) {
    *index = -1;
    *why_cpu = NULL;
    const char *req = a->request;
    int n = -1;
    if (req && !strcmp(req, "cpu"))
        return ER_OK;
    if (req)
        ER_TRY(parse_request(req, &n));
    if (!a->cuda_built) {
        if (req)
            return er_error(ER_EUNSUPPORTED, "--device %s: this build has no CUDA backend (build with make CUDA=1)",
                            req);
        *why_cpu = "this build has no CUDA backend (make CUDA=1 adds it)";
        return ER_OK;
    }
    if (!req && a->host_only) {
        *why_cpu = a->host_only;
        return ER_OK;
    }
    if (a->count_error) // a driver that answers and fails: a GPU is meant to be there
        return er_error(ER_EUNSUPPORTED, "%s%s: %s (--device cpu runs on the CPU)", req ? "--device " : "",
                        req ? req : "the default device (the GPU)", a->count_error);
    if (a->n_gpus < 1) {
        if (req)
            return er_error(ER_EUNSUPPORTED, "--device %s: this machine has no CUDA device (or no driver)", req);
        return ER_OK; // no GPU at all: the CPU, quietly
    }
    if (n >= a->n_gpus)
        return er_error(ER_EINVAL, "--device %s: this node has %d CUDA device%s (cuda:0..cuda:%d)", req, a->n_gpus,
                        a->n_gpus == 1 ? "" : "s", a->n_gpus - 1);
    if (n >= 0 && a->local_size > 1 && !a->share)
        return er_error(ER_EINVAL, "--device %s puts all %d ranks of this node on one GPU: use --device cuda (rank r "
                        "of a node on cuda:r), or ER_SHARE_GPU=1 to share it", req, a->local_size);
    if (n >= 0) {
        *index = n;
        return ER_OK;
    }
    if (a->local_size > a->n_gpus && !a->share)
        return er_error(ER_EINVAL, "%d ranks on this node but %d CUDA device%s: each rank takes its own GPU (rank r of "
                        "a node on cuda:r); start at most %d per node, or set ER_SHARE_GPU=1 to share them (rank r "
                        "on cuda:(r mod %d))", a->local_size, a->n_gpus, a->n_gpus == 1 ? "" : "s", a->n_gpus,
                        a->n_gpus);
    *index = a->local_rank % a->n_gpus;
    return ER_OK;
}

// Picks the rank's device and opens it (d->be, d->where, d->why_cpu, d->shared).
static int device_choose(TrainDevice *d, const TrainJob *job, const char *device) {
    DeviceAsk a = {.request = device, .local_rank = dist_local_rank(), .local_size = dist_local_size(),
                   .host_only = host_only(job)};
    ER_TRY(backend_env_flag("ER_SHARE_GPU", getenv("ER_SHARE_GPU"), &a.share));
#ifdef ER_CUDA
    a.cuda_built = 1;
#endif
    char count_error[256] = "";
    if (a.cuda_built && !(device && !strcmp(device, "cpu")) && backend_cuda_devices(&a.n_gpus) < 0) {
        snprintf(count_error, sizeof count_error, "%s", er_last_error());
        a.count_error = count_error;
    }
    int index;
    ER_TRY(train_device_pick(&a, &index, &d->why_cpu));
    d->shared = a.share;
    if (index < 0) {
        snprintf(d->where, sizeof d->where, "cpu");
        return backend_open(&d->be, "cpu");
    }
    snprintf(d->where, sizeof d->where, "cuda:%d", index);
    int rc = backend_open(&d->be, d->where);
    if (rc < 0)
        return er_error_prefix(rc, "%s%s (--device cpu runs on the CPU)", device ? "--device " : "the default device ",
                               d->where);
    return ER_OK;
}

// Every rank sums its gradients the same way (train_device_sum_grads: a placed rank's collectives are
// not an unplaced one's), so the ranks are all placed or none: say so rather than hang. Collective.
static int ranks_agree(const TrainDevice *d) {
    if (dist_size() < 2)
        return ER_OK;
    double placed = d->placed;
    ER_TRY(dist_sum_doubles(&placed, 1));
    if (placed != 0 && placed != dist_size())
        return er_error(ER_EUNSUPPORTED, "%d of %d ranks run on a device and the others on the CPU (this one on %s): "
                        "every rank must run on the same kind (give each node a GPU, or --device cpu)", (int)placed,
                        dist_size(), d->where);
    return ER_OK;
}

int train_device_open(TrainDevice *d, const TrainJob *job, const char *device, int place) {
    memset(d, 0, sizeof *d);
    const char *why = host_only(job);
    ER_TRY(device_choose(d, job, device));
    d->model = job->model;
    d->adapter = job->adapter;
    d->params = job->params;
    d->grads = job->grads;
    d->decay_mask = (unsigned char *)job->decay_mask;
    if (d->be->kind != BACKEND_CPU || place) {
        if (why && d->be->kind != BACKEND_CPU)
            return er_error(ER_EUNSUPPORTED, "%s runs on the CPU only here (%s), not on %s", job->label, why,
                            d->be->name);
        ER_TRY(device_place(d, job));
    }
    return ranks_agree(d);
}

int train_device_to_host(TrainDevice *d, const TrainJob *job, AdamW *opt, AdamW **host) {
    *host = opt;
    if (!d->placed)
        return ER_OK;
    Backend *be = d->be;
    size_t bytes = job->n * sizeof(float);
    ER_TRY(be->ops->download(be, job->params, d->params, bytes));
    ER_TRY(be->ops->download(be, d->host_opt.m, opt->m, bytes));
    ER_TRY(be->ops->download(be, d->host_opt.v, opt->v, bytes));
    d->host_opt.step = opt->step;
    *host = &d->host_opt;
    return ER_OK;
}

int train_device_from_host(TrainDevice *d, const TrainJob *job, AdamW *opt, const AdamW *host) {
    if (!d->placed)
        return ER_OK;
    Backend *be = d->be;
    size_t bytes = job->n * sizeof(float);
    ER_TRY(be->ops->upload(be, d->params, job->params, bytes));
    ER_TRY(be->ops->upload(be, opt->m, host->m, bytes));
    ER_TRY(be->ops->upload(be, opt->v, host->v, bytes));
    opt->step = host->step;
    return ER_OK;
}

int train_device_sum_grads(TrainDevice *d, const TrainJob *job) {
    if (!d->placed || dist_size() < 2)
        return dist_sum_floats(job->grads, job->n);
    return dist_sum_device_floats(d->be, d->grads, job->grads, job->n, d->shared);
}

void train_device_close(TrainDevice *d) {
    if (d->placed) {
        model_free(&d->dev_model);
        if (d->dev_adapter.mats)
            lora_backend_free(&d->dev_adapter, d->be);
        d->be->ops->free(d->be, d->dev_decay);
        adamw_free(&d->host_opt);
    }
    backend_close(d->be);
    memset(d, 0, sizeof *d);
}
