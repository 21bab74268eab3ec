// AdamW (decoupled weight decay, bias correction), global-norm gradient clipping, and the
// linear-warmup + cosine learning-rate schedule.
#ifndef TRAIN_OPTIM_H
#define TRAIN_OPTIM_H

#include <stddef.h>

typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    size_t n;     // parameters
    float *m, *v; // first and second moments (n)
    long step;    // updates done
} AdamW;

int adamw_init(AdamW *opt, size_t n, double lr, double beta1, double beta2, double eps, double weight_decay);
void adamw_free(AdamW *opt);
// One update of params (n) from grads (n) at learning rate `lr`. Weight decay applies to entries
// where decay_mask is NULL or non-zero (norms and biases are usually excluded).
void adamw_step(AdamW *opt, float *params, const float *grads, const unsigned char *decay_mask, double lr);

// Scales grads so their global L2 norm is at most max_norm (if max_norm > 0); returns the norm
// before clipping (NaN/inf when the gradient is not finite, in which case nothing is scaled).
double clip_grad_norm(float *grads, size_t n, double max_norm);

// Linear warmup from 0 over `warmup` steps, then cosine decay to min_lr at `total` steps.
double lr_schedule(long step, long warmup, long total, double max_lr, double min_lr);

#endif
