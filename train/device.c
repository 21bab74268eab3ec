#include "train/device.h"

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

int train_device_open(TrainDevice *d, const TrainJob *job, const char *device, int place) {
    memset(d, 0, sizeof *d);
    const char *why = host_only(job);
    if (device) {
        ER_TRY(backend_open(&d->be, device));
    } else { // the GPU when one answers (opened once, not probed first), else the CPU
        if (backend_open(&d->be, "cuda") == ER_OK && why) {
            backend_close(d->be);
            d->be = NULL;
            d->why_cpu = why;
        }
        if (!d->be)
            ER_TRY(backend_open(&d->be, "cpu"));
    }
    d->model = job->model;
    d->adapter = job->adapter;
    d->params = job->params;
    d->grads = job->grads;
    d->decay_mask = (unsigned char *)job->decay_mask;
    if (d->be->kind == BACKEND_CPU && !place)
        return ER_OK;
    if (why && d->be->kind != BACKEND_CPU)
        return er_error(ER_EUNSUPPORTED, "%s runs on the CPU only here (%s), not on %s", job->label, why, d->be->name);
    return device_place(d, job);
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
    Backend *be = d->be;
    size_t bytes = job->n * sizeof(float);
    ER_TRY(be->ops->download(be, job->grads, d->grads, bytes));
    ER_TRY(dist_sum_floats(job->grads, job->n));
    return be->ops->upload(be, d->grads, job->grads, bytes);
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
