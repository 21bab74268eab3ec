// The transformer's element-wise and attention ops, each a *_forward / *_backward pair (llm.c
// style). N = B*T rows. The bodies live once in model/ops_impl.h and are compiled twice: for float
// (used by the model) and for double (suffix _f64, used by the finite-difference tests, so the very
// code the model runs is checked in double precision).
#ifndef MODEL_OPS_H
#define MODEL_OPS_H

#include <stdint.h>

// exp(r) for |r| <= ln(2)/2, the reduced argument: Cephes' degree-6 polynomial. The one polynomial of
// ops_expf and of the sampler's exp over the vocabulary (infer/sampler.c), which reduce differently.
static inline float ops_exp_reduced(float r) {
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    return p * r * r + r + 1.0f;
}

// exp for the float ops: Cody-Waite range reduction and a degree-6 polynomial (about 1 ulp over the
// range that matters), branch-free so `omp simd` loops vectorise it; libm's expf does not. n, the
// nearest integer to x log2 e, comes from adding and subtracting 1.5 * 2^23 (ties to even): floorf
// would keep GCC from vectorising under the default -ftrapping-math.
// Arguments below -87.3 give about 1e-38 instead of a denormal or 0; NaN propagates.
static inline float ops_expf(float x) {
    x = x > 88.7f ? 88.7f : (x < -87.3f ? -87.3f : x);
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = ops_exp_reduced(r);
    // NaN passes the clamps: its exponent comes from 0 (p is NaN already), so the int conversion and the
    // shift stay defined; otherwise n + 127 is in [1, 255].
    n = n == n ? n : 0.0f;
    union {
        int32_t i;
        float f;
    } scale = {.i = (int32_t)((uint32_t)((int32_t)n + 127) << 23)};
    return p * scale.f;
}

#define ER_OPS_DECLARE(REAL, SFX)                                                                            \
    /* out (N,C) = x * rstd * w; rstd (N) kept for the backward */                                             \
    void rmsnorm_forward##SFX(REAL *out, REAL *rstd, const REAL *x, const REAL *w, int N, int C, REAL eps);    \
    /* dx (N,C) += ..., dw (C) += ... */                                                                       \
    void rmsnorm_backward##SFX(REAL *dx, REAL *dw, const REAL *dout, const REAL *x, const REAL *w,             \
                               const REAL *rstd, int N, int C);                                                \
    /* x (N, nh, HS) rotated in place by the NeoX rotate-half rule at position pos[n]; cos_tab/sin_tab         \
       (P, HS/2) */                                                                                            \
    void rope_forward##SFX(REAL *x, const int *pos, const REAL *cos_tab, const REAL *sin_tab, int N, int nh,   \
                           int HS);                                                                            \
    /* dx in place: the transpose rotation */                                                                  \
    void rope_backward##SFX(REAL *dx, const int *pos, const REAL *cos_tab, const REAL *sin_tab, int N, int nh, \
                            int HS);                                                                           \
    /* out (N,F) = silu(gate) * up */                                                                          \
    void swiglu_forward##SFX(REAL *out, const REAL *gate, const REAL *up, int N, int F);                       \
    /* dgate, dup (N,F) = (overwritten) */                                                                     \
    void swiglu_backward##SFX(REAL *dgate, REAL *dup, const REAL *dout, const REAL *gate, const REAL *up,      \
                              int N, int F);                                                                   \
    /* Causal grouped-query attention. q (B,T,NH,HS); k, v (B,Tk,NKV,HS); query t of row b sees keys            \
       s <= qoff[b] + t (qoff NULL = 0). out (B,T,NH,HS); lse (B,NH,T) log-sum-exp of the scaled scores,       \
       kept so the backward recomputes probabilities instead of storing (T, Tk) per head. scores            \
       (nthreads, Tk): the caller's scratch, one row of scores per thread; the op runs on nthreads threads. */ \
    int attention_forward##SFX(REAL *out, REAL *lse, const REAL *q, const REAL *k, const REAL *v,              \
                               const int *qoff, int B, int T, int Tk, int NH, int NKV, int HS, REAL *scores,   \
                               int nthreads);                                                                  \
    /* dq (B,T,NH,HS) overwritten; dk, dv (B,Tk,NKV,HS) overwritten; dkh, dvh (B,NH,Tk,HS): the caller's       \
       scratch for each query head's share before the heads of a KV group are summed */                       \
    int attention_backward##SFX(REAL *dq, REAL *dk, REAL *dv, const REAL *dout, const REAL *out,               \
                                const REAL *lse, const REAL *q, const REAL *k, const REAL *v, const int *qoff, \
                                int B, int T, int Tk, int NH, int NKV, int HS, REAL *dkh, REAL *dvh);          \
    /* Masked mean cross-entropy over N rows of V logits: returns sum(mask * nll) / wsum (0 when the mask      \
       is empty). wsum <= 0: sum(mask) of these rows; else a whole batch's, whose mean these rows are a chunk  \
       of (the gradient rows are then the batch's). With grad != 0, logits are overwritten by dloss/dlogits.  \
       row_loss (N): row n's mask * nll. */                                                                    \
    double cross_entropy_forward_backward##SFX(REAL *logits, const int *targets, const REAL *mask, int N,      \
                                               int V, int grad, double wsum, double *row_loss);                \
    /* logp (N) = log softmax(logits * inv_temp)[target] */                                                    \
    void logprob_forward##SFX(REAL *logp, const REAL *logits, const int *targets, int N, int V, REAL inv_temp);   \
    /* dlogits (N,V) = coef[n] * d logp[n] / d logits = coef[n] * inv_temp * (onehot - softmax(logits*inv_temp)) \
       (overwritten; may alias logits): the backward of a weighted sum of token log-probs */                    \
    void logprob_backward##SFX(REAL *dlogits, const REAL *logits, const int *targets, const REAL *coef, int N,   \
                               int V, REAL inv_temp);

ER_OPS_DECLARE(float, )
ER_OPS_DECLARE(double, _f64)

// cos/sin tables (P, HS/2) for positions 0..P-1, angles computed in double.
void rope_tables(float *cos_tab, float *sin_tab, int P, int HS, double theta);
void rope_tables_f64(double *cos_tab, double *sin_tab, int P, int HS, double theta);

#endif
