#include "train/optim.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

int adamw_init(AdamW *opt, size_t n, double lr, double beta1, double beta2, double eps, double weight_decay) {
    memset(opt, 0, sizeof *opt);
    opt->lr = lr;
    opt->beta1 = beta1;
    opt->beta2 = beta2;
    opt->eps = eps;
    opt->weight_decay = weight_decay;
    opt->n = n;
    opt->m = er_calloc(n, sizeof(float));
    opt->v = er_calloc(n, sizeof(float));
    if (!opt->m || !opt->v) {
        adamw_free(opt);
        return er_error(ER_ENOMEM, "AdamW: cannot allocate state for %zu parameters", n);
    }
    return ER_OK;
}

void adamw_free(AdamW *opt) {
    er_free(opt->m);
    er_free(opt->v);
    opt->m = opt->v = NULL;
}

void adamw_step(AdamW *opt, float *params, const float *grads, const unsigned char *decay_mask, double lr) {
    opt->step++;
    float b1 = (float)opt->beta1, b2 = (float)opt->beta2, eps = (float)opt->eps;
    float bc1 = (float)(1.0 - pow(opt->beta1, (double)opt->step));
    float bc2 = (float)(1.0 - pow(opt->beta2, (double)opt->step));
    float lrf = (float)lr, wd = (float)opt->weight_decay;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < opt->n; i++) {
        float g = grads[i];
        float m = opt->m[i] = b1 * opt->m[i] + (1 - b1) * g;
        float v = opt->v[i] = b2 * opt->v[i] + (1 - b2) * g * g;
        float mhat = m / bc1, vhat = v / bc2;
        float decay = (!decay_mask || decay_mask[i]) ? wd * params[i] : 0.0f;
        params[i] -= lrf * (mhat / (sqrtf(vhat) + eps) + decay);
    }
}

// Sums of squares over fixed chunks, added in chunk order: the norm is the same bits for any thread
// count, which bitwise-reproducible runs and resumes rely on.
#define NORM_CHUNK 65536
#define NORM_MAX_CHUNKS 4096

double clip_grad_norm(float *grads, size_t n, double max_norm) {
    size_t chunk = NORM_CHUNK;
    while ((n + chunk - 1) / chunk > NORM_MAX_CHUNKS)
        chunk *= 2;
    long nchunks = (long)((n + chunk - 1) / chunk);
    double part[NORM_MAX_CHUNKS];
#pragma omp parallel for schedule(static)
    for (long c = 0; c < nchunks; c++) {
        size_t end = (size_t)(c + 1) * chunk < n ? (size_t)(c + 1) * chunk : n;
        double ss = 0.0;
        for (size_t i = (size_t)c * chunk; i < end; i++)
            ss += (double)grads[i] * grads[i];
        part[c] = ss;
    }
    double ss = 0.0;
    for (long c = 0; c < nchunks; c++)
        ss += part[c];
    double norm = sqrt(ss);
    if (!isfinite(norm) || max_norm <= 0 || norm <= max_norm)
        return norm;
    float s = (float)(max_norm / (norm + 1e-6));
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        grads[i] *= s;
    return norm;
}

double lr_schedule(long step, long warmup, long total, double max_lr, double min_lr) {
    if (warmup > 0 && step < warmup)
        return max_lr * (double)(step + 1) / (double)warmup;
    if (total <= warmup)
        return max_lr;
    double t = (double)(step - warmup) / (double)(total - warmup);
    if (t > 1)
        t = 1;
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + cos(M_PI * t));
}
