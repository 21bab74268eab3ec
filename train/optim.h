// AdamW (decoupled weight decay, bias correction), global-norm gradient clipping, and the
// linear-warmup + cosine learning-rate schedule.
#ifndef TRAIN_OPTIM_H
#define TRAIN_OPTIM_H

#include <stddef.h>

#include "model/backend.h"

typedef struct {
    Backend *be;  // where the moments live, next to the parameters they update
    double lr, beta1, beta2, eps, weight_decay;
    size_t n;     // parameters
    float *m, *v; // first and second moments (n)
    long step;    // updates done
} AdamW;

// Moments on backend be (zeroed), where the parameters and gradients it will update live.
int adamw_init(AdamW *opt, Backend *be, size_t n, double lr, double beta1, double beta2, double eps,
               double weight_decay);
void adamw_free(AdamW *opt);
// One update of params (n) from grads (n) at learning rate `lr`, on the optimizer's backend:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g²;  p -= lr (m/bc1 / (sqrt(v/bc2) + eps) + wd p)
// with bc = 1 - b^step. Weight decay applies to entries where decay_mask is NULL or non-zero (norms
// and biases are usually excluded); decay_mask lives on the backend too.
int adamw_step(AdamW *opt, float *params, const float *grads, const unsigned char *decay_mask, double lr);

// Scales grads (on backend be) so their global L2 norm is at most max_norm (if max_norm > 0); *norm
// gets the norm before clipping (NaN/inf when the gradient is not finite, and nothing is scaled).
int clip_grad_norm(Backend *be, float *grads, size_t n, double max_norm, double *norm);

// Linear warmup from 0 over `warmup` steps, then cosine decay to min_lr at `total` steps.
double lr_schedule(long step, long warmup, long total, double max_lr, double min_lr);

#endif
