// The backend seam: where the forward's and backward's buffers live and who runs each of their ops.
// THE forward (model/forward.c) is written once against this table; the CPU backend (model/backend.c)
// is the reference, the CUDA one (model/cuda/, `make CUDA=1`) is tested against it op by op and as a whole
// (tests/model/test_backend.c). No backend keeps a copy of the model code: a model, an adapter and
// activations are *placed* on a backend (model_to_backend, lora_to_backend, acts_alloc with a backend),
// which gives them the same structs with every buffer pointer on that backend.
//
// Pointers given to ops are the backend's (device pointers for CUDA); shapes are those of the CPU ops
// they stand for (model/ops.h, quant/quant.h, lora/lora.h). Every op returns ER_OK or a negative ErStatus
// with er_error set (a kernel launch or library failure on a device). Ops run in order on one stream;
// `download` waits for the work before it. A Backend is used from one thread at a time.
#ifndef MODEL_BACKEND_H
#define MODEL_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "lora/lora.h"
#include "model/kvcache.h"
#include "quant/weight.h"

typedef enum { BACKEND_CPU, BACKEND_CUDA } BackendKind;

typedef struct Backend Backend;

typedef struct {
    // ---- memory (bytes) ----
    void *(*alloc)(Backend *be, size_t bytes); // NULL when it does not fit (er_error says so); 64-byte aligned
    void (*free)(Backend *be, void *p);        // NULL is a no-op
    int (*upload)(Backend *be, void *dst, const void *host, size_t bytes);   // host -> backend
    int (*download)(Backend *be, void *host, const void *src, size_t bytes); // backend -> host, synchronous
    int (*copy)(Backend *be, void *dst, const void *src, size_t bytes);      // within the backend
    int (*zero)(Backend *be, void *p, size_t bytes);
    // A matrix for this backend's products from a host one: *dst gets buffers of its own (dst->owned; free
    // with backend_weight_free). frozen: no gradient reaches it. The CPU backend keeps every format as it
    // is (sharing the host buffers); CUDA keeps a trainable fp32 matrix fp32 and stores every frozen one
    // (the base of LoRA training, any format) in bf16.
    int (*weight_upload)(Backend *be, Weight *dst, const Weight *src, int frozen);
    // The bytes the backend could still allocate now (CPU: the machine's physical memory; 0 = unknown).
    int (*mem_available)(Backend *be, size_t *bytes);

    // ---- the forward's ops ----
    // out (N, C) = rows tokens[n] of the embedding (V, C); tokens on the backend.
    int (*embed_forward)(Backend *be, float *out, const Weight *embed, const int *tokens, int N);
    // out (N, rows) = inp (N, cols) · Wᵀ + bias (rows; NULL = none). scratch: quant_scratch_floats(cols).
    // flags: weight_matmul_forward's (QUANT_INT8_PREFILL: inference passes).
    int (*matmul_forward)(Backend *be, float *out, const float *inp, const Weight *w, const float *bias, int N,
                          float *scratch, int flags);
    int (*rmsnorm_forward)(Backend *be, float *out, float *rstd, const float *x, const float *w, int N, int C,
                           float eps);
    // x (N, nh, HS) rotated in place at positions pos (N); tables (P, HS/2) on the backend.
    int (*rope_forward)(Backend *be, float *x, const int *pos, const float *cos_tab, const float *sin_tab, int N,
                        int nh, int HS);
    int (*swiglu_forward)(Backend *be, float *out, const float *gate, const float *up, int N, int F);
    int (*residual_forward)(Backend *be, float *out, const float *a, const float *b, size_t n);
    // Causal GQA over the pass's own keys (positions 0..T-1 of each row). scores (nthreads, T): CPU scratch.
    int (*attention_forward)(Backend *be, float *out, float *lse, const float *q, const float *k, const float *v,
                             int B, int T, int NH, int NKV, int HS, float *scores, int nthreads);
    // out (N, out) += scale * mask[n] * (x·Aᵀ)·Bᵀ, h (N, r) = x·Aᵀ; mask (N) on the backend, NULL = all on.
    int (*lora_forward)(Backend *be, float *out, float *h, const float *x, const LoraMat *m, int r, float scale,
                        const uint8_t *mask, int N);
    // Masked mean cross-entropy; *loss = sum(mask * nll) / wsum. With grad, logits := dloss/dlogits.
    // targets, mask (N) on the backend (mask NULL = all ones); row_loss (N doubles): backend scratch, row n's
    // mask * nll. wsum <= 0: sum(mask) over these N rows; else the whole batch's, so that N rows of it (a
    // chunk) get the gradient rows of the whole batch's mean, the same bits.
    int (*cross_entropy)(Backend *be, double *loss, float *logits, const int *targets, const float *mask, int N,
                         int V, int grad, double wsum, double *row_loss);
    // logp (N) = log softmax(logits * inv_temp)[target]; the backward overwrites dlogits (may alias logits).
    int (*logprob_forward)(Backend *be, float *logp, const float *logits, const int *targets, int N, int V,
                           float inv_temp);
    int (*logprob_backward)(Backend *be, float *dlogits, const float *logits, const int *targets, const float *coef,
                            int N, int V, float inv_temp);
    // For i < n: logp[i] = log softmax(l * inv_temp)[targets[i]] and ent[i] (ent NULL: none) the entropy (nats) of
    // that distribution, l = row rows[i] of logits (_, V). rows, targets (n) on the backend.
    int (*token_stats)(Backend *be, float *logp, float *ent, const float *logits, const int *rows, const int *targets,
                       int n, int V, float inv_temp);

    // ---- the KV cache's (model/kvcache.h: kv's entries on this backend, its block tables on the host) ----
    // Layer l's cache rows dst[n] (kv_row; < 0: skipped) := k, v (N, NKV*HS), quantised for an int8 cache;
    // dst (N) on the backend.
    int (*kv_store)(Backend *be, KVCache *kv, int l, const float *k, const float *v, const int *dst, int N);
    // out (B, T, NH, HS) = kv_attention_forward's attention of q over the cache (kvcache.h); blocks
    // (B, kv->max_blocks_per_seq), pos0 and len (B) on the backend. scores, nthreads, keys: as attention_forward's.
    int (*kv_attention_forward)(Backend *be, float *out, const float *q, const KVCache *kv, int l, const int *blocks,
                                const int *pos0, const int *len, int B, int T, int NH, float *scores, int nthreads,
                                int keys);

    // ---- the backward's ops (accumulating where the CPU ops accumulate) ----
    // dinp (N, cols) += dout (N, rows) · W, any format the backend holds.
    int (*matmul_backward_input)(Backend *be, float *dinp, const float *dout, const Weight *w, int N, float *scratch);
    // dW (R, K) += doutᵀ (R, N) · inp (N, K) and dbias (R) += Σ_n dout when not NULL (fp32).
    int (*matmul_backward_weight)(Backend *be, float *dW, float *dbias, const float *dout, const float *inp, int N,
                                  int R, int K);
    int (*rmsnorm_backward)(Backend *be, float *dx, float *dw, const float *dout, const float *x, const float *w,
                            const float *rstd, int N, int C);
    int (*rope_backward)(Backend *be, float *dx, const int *pos, const float *cos_tab, const float *sin_tab, int N,
                         int nh, int HS);
    int (*swiglu_backward)(Backend *be, float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                           int N, int F);
    // dq overwritten, dk dv overwritten; dkh, dvh (B, NH, T, HS) scratch.
    int (*attention_backward)(Backend *be, float *dq, float *dk, float *dv, const float *dout, const float *out,
                              const float *lse, const float *q, const float *k, const float *v, int B, int T, int NH,
                              int NKV, int HS, float *dkh, float *dvh);
    // gA, gB accumulate; dx (N, in) += ...; dh (N, r) scratch.
    int (*lora_backward)(Backend *be, float *dx, LoraMat *m, int r, float scale, const float *dout, const float *x,
                         const float *h, const uint8_t *mask, int N, float *dh);
    // dembed (V, C) rows tokens[n] += dres (N, C) rows n.
    int (*embed_backward)(Backend *be, float *dembed, const float *dres, const int *tokens, int N, int C);

    // ---- the optimizer's ----
    // AdamW on n parameters (train/optim.h has the rule): moments m, v; bc1, bc2 the bias corrections.
    int (*adamw_update)(Backend *be, float *params, const float *grads, float *m, float *v,
                        const unsigned char *decay_mask, size_t n, float lr, float b1, float b2, float eps, float wd,
                        float bc1, float bc2);
    // *out = Σ x², summed over fixed chunks in chunk order (the same bits at any thread count).
    int (*sumsq)(Backend *be, double *out, const float *x, size_t n);
    int (*scale)(Backend *be, float *x, size_t n, float s);
} BackendOps;

struct Backend {
    BackendKind kind;
    const BackendOps *ops;
    void *ctx;          // the backend's own state (CUDA: stream, cuBLAS handle, scratch)
    char name[16];      // "cpu", "cuda"
    char device[128];   // "x86-64, 2 threads", "NVIDIA H200"
    size_t mem_total;   // bytes of backend memory (CPU: 0 = not tracked)
    size_t mem_free;    // at open
    int index;          // CUDA: the device number (cuda:N); 0 on the CPU
    void *queue;        // CUDA: the cudaStream_t every op runs on, in order (NCCL joins it); NULL on the CPU
    // backend_after_each_op: the table the ops forward to, and what each is followed by.
    const BackendOps *inner;
    int (*after)(Backend *be, const char *op);
};

// The CPU backend: a process-wide table, always there; its buffers are host memory.
Backend *backend_cpu(void);
// Opens the backend a `--device` flag names: "cpu", "cuda" (device 0) or "cuda:N". "cuda" fails with a
// clear message in a build without CUDA=1 or on a machine without a usable device.
int backend_open(Backend **be, const char *name);
// Releases a backend backend_open gave (the CPU one is never released).
void backend_close(Backend *be);
// The device a command runs on when --device is not given: "cuda" when built with CUDA=1 and a device
// answers, else "cpu".
const char *backend_default(void);
// The CUDA devices this machine has: *n >= 1, or 0 when there is none, no driver, or the build has no CUDA
// backend. An error (er_error: cudaGetDeviceCount's reason) when a driver answers but fails (too old for
// this build's runtime, a device in a bad state): a GPU is there and it does not work.
int backend_cuda_devices(int *n);
// A 0/1 switch from the environment (ER_CUDA_SYNC, ER_SHARE_GPU), `value` its getenv: NULL, "" and "0" are
// off, "1" on, anything else an error naming the variable.
int backend_env_flag(const char *name, const char *value, int *on);
// Every op of be but alloc and free is followed by after(be, "<op name>") once it returned ER_OK, and
// returns what that returns (an error naming the op). The CUDA backend's: the bf16 copy of a product's
// input kept for the next product only while products run, and under ER_CUDA_SYNC=1 a synchronisation
// per op (slow), so a fault inside a device's queued work is named by the op that launched it.
void backend_after_each_op(Backend *be, int (*after)(Backend *be, const char *op));
// A Weight that weight_upload filled.
void backend_weight_free(Backend *be, Weight *w);

// A copy of adapter src placed on be: the same fields, params and grads (when src has them; zeroed)
// the backend's, mats pointing into them at src's offsets, no reasoning prefix or base model name.
// Free it with lora_backend_free, never lora_free.
int lora_to_backend(LoraAdapter *dst, const LoraAdapter *src, Backend *be);
void lora_backend_free(LoraAdapter *a, Backend *be);

#ifdef ER_CUDA
// model/cuda/backend.c: opens CUDA device `device` (stream, cuBLAS); ER_EUNSUPPORTED when none answers.
// ER_CUDA_SYNC=1 in the environment (read here, once): every op is followed by a synchronisation, and a
// fault inside a kernel is reported by the op that launched it ("cuda: rmsnorm_forward: an illegal
// memory access ...") instead of by whatever synchronised next.
int backend_cuda_open(Backend *be, int device);
// backend_cuda_devices' CUDA side.
int backend_cuda_count(int *n);
void backend_cuda_close(Backend *be);
#endif

#endif
