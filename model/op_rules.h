// Element rules that both backends compile, the CPU's C (model/backend.c) and the CUDA kernels
// (model/cuda/kernels.cu), so each formula is written once.
#ifndef MODEL_OP_RULES_H
#define MODEL_OP_RULES_H

#include <math.h>

#ifdef __CUDACC__
#define OP_RULE static inline __host__ __device__
#else
#define OP_RULE static inline
#endif

// AdamW on parameter p with gradient g and moments *m, *v (train/optim.h has the rule); bc1, bc2 the
// bias corrections, wd applied where decay is non-zero. Returns the updated parameter.
OP_RULE float adamw_rule(float p, float g, float *m, float *v, int decay, float lr, float b1, float b2, float eps,
                         float wd, float bc1, float bc2) {
    float mi = *m = b1 * *m + (1 - b1) * g;
    float vi = *v = b2 * *v + (1 - b2) * g * g;
    float mhat = mi / bc1, vhat = vi / bc2;
    return p - lr * (mhat / (sqrtf(vhat) + eps) + (decay ? wd * p : 0.0f));
}

#endif
