#include "train/optim.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

int adamw_init(AdamW *opt, Backend *be, size_t n, double lr, double beta1, double beta2, double eps,
               double weight_decay) {
    memset(opt, 0, sizeof *opt);
    opt->be = be;
    opt->lr = lr;
    opt->beta1 = beta1;
    opt->beta2 = beta2;
    opt->eps = eps;
    opt->weight_decay = weight_decay;
    opt->n = n;
    opt->m = be->ops->alloc(be, n * sizeof(float));
    opt->v = be->ops->alloc(be, n * sizeof(float));
    if (!opt->m || !opt->v) {
        adamw_free(opt);
        return er_error(ER_ENOMEM, "AdamW: cannot allocate state for %zu parameters on %s", n, be->name);
    }
    ER_TRY(be->ops->zero(be, opt->m, n * sizeof(float)));
    return be->ops->zero(be, opt->v, n * sizeof(float));
}

void adamw_free(AdamW *opt) {
    if (opt->be) {
        opt->be->ops->free(opt->be, opt->m);
        opt->be->ops->free(opt->be, opt->v);
    }
    opt->m = opt->v = NULL;
}

int adamw_step(AdamW *opt, float *params, const float *grads, const unsigned char *decay_mask, double lr) {
    opt->step++;
    float bc1 = (float)(1.0 - pow(opt->beta1, (double)opt->step));
    float bc2 = (float)(1.0 - pow(opt->beta2, (double)opt->step));
    return opt->be->ops->adamw_update(opt->be, params, grads, opt->m, opt->v, decay_mask, opt->n, (float)lr,
                                      (float)opt->beta1, (float)opt->beta2, (float)opt->eps,
                                      (float)opt->weight_decay, bc1, bc2);
}

int clip_grad_norm(Backend *be, float *grads, size_t n, double max_norm, double *norm) {
    double ss = 0.0;
    ER_TRY(be->ops->sumsq(be, &ss, grads, n));
    *norm = sqrt(ss);
    if (!isfinite(*norm) || max_norm <= 0 || *norm <= max_norm)
        return ER_OK;
    return be->ops->scale(be, grads, n, (float)(max_norm / (*norm + 1e-6)));
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
