// The CUDA kernels of the backend (model/cuda/kernels.cu), one launcher per op, called by
// model/cuda/backend.c. Each launcher queues its kernel(s) on stream s and returns cudaGetLastError():
// cudaSuccess, or the launch's failure (a failure inside a kernel surfaces at the next synchronisation).
// Pointers are device pointers; shapes and semantics are those of the CPU ops in model/ops.h,
// lora/lora.h and train/optim.h, which these kernels reproduce (same accumulations, same overwrites).
// bf16 buffers are uint16_t here (the bits), __nv_bfloat16 inside the kernels.
#ifndef MODEL_CUDA_KERNELS_H
#define MODEL_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

// Attention's per-lane registers hold dims lane, lane + 32, ... of a head: HS up to 4 * 32.
#define CUDA_ATTENTION_MAX_HS 128
// sumsq's chunks (train/optim.c's rule): at most this many partial sums.
#define CUDA_SUMSQ_MAX_CHUNKS 4096

// out (N, C) = rows tokens[n] of embed (V, C), fp32 or bf16 (bf16 != 0).
cudaError_t cuda_embed_forward(cudaStream_t s, float *out, const void *embed, int bf16, const int *tokens, int N,
                               int C);
// dembed (V, C) rows tokens[n] += dres (N, C) rows n, tokens in order (repeats add up, no atomics).
cudaError_t cuda_embed_backward(cudaStream_t s, float *dembed, const float *dres, const int *tokens, int N, int C);
// dst (n) = src rounded to bf16 (nearest even).
cudaError_t cuda_to_bf16(cudaStream_t s, uint16_t *dst, const float *src, size_t n);
// out (N, C) += bias (C) on every row.
cudaError_t cuda_bias_forward(cudaStream_t s, float *out, const float *bias, int N, int C);
// acc (C) += Σ_n a[n, c] * (b ? b[n, c] : 1) * (row_scale ? row_scale[n] : 1), summed in double in a
// fixed order: the bias gradient (b, row_scale NULL) and RMSNorm's weight gradient (b = x, row_scale = rstd).
cudaError_t cuda_column_sum(cudaStream_t s, float *acc, const float *a, const float *b, const float *row_scale, int N,
                            int C);
// out (N, C) = x * rstd * w; rstd (N).
cudaError_t cuda_rmsnorm_forward(cudaStream_t s, float *out, float *rstd, const float *x, const float *w, int N, int C,
                                 float eps);
// dx (N, C) += RMSNorm's input gradient (the weight gradient is cuda_column_sum's).
cudaError_t cuda_rmsnorm_backward(cudaStream_t s, float *dx, const float *dout, const float *x, const float *w,
                                  const float *rstd, int N, int C);
// x (N, nh, HS) rotated in place (inverse != 0: by minus the angles, the backward).
cudaError_t cuda_rope(cudaStream_t s, float *x, const int *pos, const float *cos_tab, const float *sin_tab, int N,
                      int nh, int HS, int inverse);
cudaError_t cuda_swiglu_forward(cudaStream_t s, float *out, const float *gate, const float *up, size_t n);
cudaError_t cuda_swiglu_backward(cudaStream_t s, float *dgate, float *dup, const float *dout, const float *gate,
                                 const float *up, size_t n);
// out (n) = a + b (out may alias a or b).
cudaError_t cuda_residual_forward(cudaStream_t s, float *out, const float *a, const float *b, size_t n);
// Causal GQA attention, q (B, T, NH, HS), k v (B, T, NKV, HS), out (B, T, NH, HS), lse (B, NH, T).
cudaError_t cuda_attention_forward(cudaStream_t s, float *out, float *lse, const float *q, const float *k,
                                   const float *v, int B, int T, int NH, int NKV, int HS);
// dq overwritten (B, T, NH, HS); dk, dv overwritten (B, T, NKV, HS); drow (B, NH, T): scratch.
cudaError_t cuda_attention_backward(cudaStream_t s, float *dq, float *dk, float *dv, const float *dout,
                                    const float *out, const float *lse, const float *q, const float *k, const float *v,
                                    int B, int T, int NH, int NKV, int HS, float *drow);
// The KV cache's (model/kvcache.h; layouts in kernels.cu): cache rows dst[n] (< 0: skipped) of the layer whose
// rows start at row0 := k, v (N, NKV, HS), quantised to int8 with one scale per row and KV head when i8.
cudaError_t cuda_kv_store(cudaStream_t s, void *kc, void *vc, float *ks, float *vs, int i8, const float *k,
                          const float *v, const int *dst, int N, size_t row0, int NKV, int HS);
// out (B, T, NH, HS) rows t < len[b] = causal GQA of q over cached positions 0..pos0[b] + t, found through
// blocks (B, max_blocks) of `block` positions each.
cudaError_t cuda_kv_attention_forward(cudaStream_t s, float *out, const float *q, const void *kc, const void *vc,
                                      const float *ks, const float *vs, int i8, size_t row0, const int *blocks,
                                      int max_blocks, int block, const int *pos0, const int *len, int B, int T,
                                      int NH, int NKV, int HS);
// The tensor-core attention's kernels (backend.c runs the products; scratch layouts in kernels.cu):
// dst (nh, T, HS) bf16 = src (T, nh, HS) fp32, and back to fp32 (T, nh, HS) overwritten.
cudaError_t cuda_attention_to_heads(cudaStream_t s, uint16_t *dst, const float *src, int T, int nh, int HS);
cudaError_t cuda_attention_from_heads(cudaStream_t s, float *dst, const float *src, int T, int nh, int HS);
// P (NH, T, T) bf16 = causal softmax of S (NH, T, T) * scale: lse_in NULL computes lse_out (NH, T), else
// P = exp(S * scale - lse_in) (the backward's recomputation). Masked entries exactly 0.
cudaError_t cuda_attention_softmax(cudaStream_t s, uint16_t *P, float *lse_out, const float *S, const float *lse_in,
                                   int NH, int T, float scale);
// P (NH, T, T) := P * (dP - D) * scale, D (NH, T) per row; masked entries exactly 0.
cudaError_t cuda_attention_dscores(cudaStream_t s, uint16_t *P, const float *dP, const float *D, int NH, int T,
                                   float scale);
// drow (B, NH, T) = Σ dout · out per head row, dout out (B, T, NH, HS).
cudaError_t cuda_attention_drow(cudaStream_t s, float *drow, const float *dout, const float *out, int B, int T,
                                int NH, int HS);
// Rows n of x (N, C) with mask[n] == 0 set to 0.
cudaError_t cuda_zero_masked_rows(cudaStream_t s, float *x, const uint8_t *mask, int N, int C);
// Masked mean cross-entropy: result[0] = sum(mask) (or wsum when > 0: a whole batch's, these N rows a
// chunk of it), result[1] = the loss (0 when the mask is empty); row_loss (N) in double, summed in row
// order. grad: logits := dloss/dlogits. mask NULL = ones.
cudaError_t cuda_cross_entropy(cudaStream_t s, double *result, float *logits, const int *targets, const float *mask,
                               int N, int V, int grad, double wsum, double *row_loss);
cudaError_t cuda_logprob_forward(cudaStream_t s, float *logp, const float *logits, const int *targets, int N, int V,
                                 float inv_temp);
// For i < n: the log-prob of targets[i] and (ent not NULL) the entropy of row rows[i] of logits, tempered.
cudaError_t cuda_token_stats(cudaStream_t s, float *logp, float *ent, const float *logits, const int *rows,
                             const int *targets, int n, int V, float inv_temp);
// dlogits may alias logits.
cudaError_t cuda_logprob_backward(cudaStream_t s, float *dlogits, const float *logits, const int *targets,
                                  const float *coef, int N, int V, float inv_temp);
cudaError_t cuda_adamw_update(cudaStream_t s, float *params, const float *grads, float *m, float *v,
                              const unsigned char *decay_mask, size_t n, float lr, float b1, float b2, float eps,
                              float wd, float bc1, float bc2);
// result[0] = Σ x² over chunks of `chunk` elements (partials: CUDA_SUMSQ_MAX_CHUNKS doubles), chunks added in order.
cudaError_t cuda_sumsq(cudaStream_t s, double *result, double *partials, const float *x, size_t n, size_t chunk);
cudaError_t cuda_scale(cudaStream_t s, float *x, size_t n, float scale);

#ifdef __cplusplus
}
#endif

#endif
