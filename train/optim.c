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

double clip_grad_norm(float *grads, size_t n, double max_norm) {
    double ss = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : ss)
    for (size_t i = 0; i < n; i++)
        ss += (double)grads[i] * grads[i];
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
