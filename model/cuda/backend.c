// The CUDA backend (make CUDA=1): buffers in device memory, frozen weights widened to bf16, cuBLAS for
// every product and the kernels of model/cuda/kernels.cu for the rest, all queued in order on one
// stream of the device. The CPU backend is the reference these ops are tested against
// (tests/model/test_backend.c); the semantics are the CPU ops' (model/backend.h names them).
//
// Products. Activations are fp32 in this design. fp32 weights (trainable) multiply in fp32
// (CUDA_R_32F, CUBLAS_COMPUTE_32F, no TF32: the handle keeps the default math mode). bf16 weights
// (the frozen base) multiply against a bf16 copy of the activation made in a scratch buffer of the
// backend: A and B bf16, C fp32, CUBLAS_COMPUTE_32F. Not CUBLAS_COMPUTE_32F_FAST_16BF: that takes
// fp32 A and B (cublasGemmEx wants both inputs of one type), so the weights would have to stay fp32 on
// the device, twice the memory the frozen base is widened to bf16 to save. Rounding the activation to
// bf16 is what bf16 autocast does too; products accumulate in fp32 either way.
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/error.h"
#include "model/backend.h"
#include "model/cuda/kernels.h"
#include "quant/quant.h"

// sumsq's chunks: train/optim.c's rule (NORM_CHUNK elements, doubled until at most 4096 chunks).
#define SUMSQ_CHUNK 65536
// weight_upload widens a quantized matrix on the host this many elements at a time.
#define UPLOAD_TILE_ELEMS ((size_t)1 << 22)
// The bf16 copy of an activation for a bf16 product: this many elements (64 MiB), allocated at open; a
// larger activation goes through in chunks of rows.
#define CAST_ELEMS ((size_t)1 << 25)

typedef struct {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    uint16_t *cast; // CAST_ELEMS: bf16 copy of an activation for the bf16 products
    // The activation cast holds whole (cast_n elements), for the next bf16 product of the same input (q, k
    // and v read one normalised input, gate and up another); NULL once another op may have written it.
    const float *cast_src;
    size_t cast_n;
    int sync_each;  // ER_CUDA_SYNC=1 at open: a synchronisation after every op
    double *red;    // reductions: red[0], red[1] results, then CUDA_SUMSQ_MAX_CHUNKS partial sums
    int attn_simt;  // ER_CUDA_ATTENTION=simt at open: the fp32 SIMT attention kernels, not the tensor cores
    void *attn;     // the tensor-core attention's scratch for one batch row (AttnScratch), grown on demand
    size_t attn_bytes;
} CudaCtx;

static int cuda_check(cudaError_t e, const char *call) {
    if (e == cudaSuccess)
        return ER_OK;
    return er_error(e == cudaErrorMemoryAllocation ? ER_ENOMEM : ER_EIO, "cuda: %s: %s", call, cudaGetErrorString(e));
}

static int blas_check(cublasStatus_t st, const char *call) {
    if (st == CUBLAS_STATUS_SUCCESS)
        return ER_OK;
    return er_error(ER_EIO, "cuda: %s: %s", call, cublasGetStatusString(st));
}

// The message names the call as written.
#define CUDA_TRY(call) ER_TRY(cuda_check((call), #call))
#define BLAS_TRY(call) ER_TRY(blas_check((call), #call))

static CudaCtx *ctx_of(Backend *be) { return (CudaCtx *)be->ctx; }

// ---- memory ----

static void *op_alloc(Backend *be, size_t bytes) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1); // 256-byte aligned
    if (e != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        cudaGetLastError(); // not sticky: clear it
        cudaMemGetInfo(&free_b, &total_b);
        er_error(ER_ENOMEM, "cuda: cudaMalloc of %zu bytes: %s (%zu of %zu bytes free on %s)", bytes,
                 cudaGetErrorString(e), free_b, total_b, be->device);
        return NULL;
    }
    return p;
}

static void op_free(Backend *be, void *p) {
    (void)be;
    if (p)
        cudaFree(p);
}

// Waits for the copy, so the host buffer may be reused or freed on return.
static int op_upload(Backend *be, void *dst, const void *host, size_t bytes) {
    CudaCtx *c = ctx_of(be);
    CUDA_TRY(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, c->stream));
    CUDA_TRY(cudaStreamSynchronize(c->stream));
    return ER_OK;
}

static int op_download(Backend *be, void *host, const void *src, size_t bytes) {
    CudaCtx *c = ctx_of(be);
    CUDA_TRY(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    CUDA_TRY(cudaStreamSynchronize(c->stream));
    return ER_OK;
}

static int op_copy(Backend *be, void *dst, const void *src, size_t bytes) {
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx_of(be)->stream));
    return ER_OK;
}

static int op_zero(Backend *be, void *p, size_t bytes) {
    CUDA_TRY(cudaMemsetAsync(p, 0, bytes, ctx_of(be)->stream));
    return ER_OK;
}

// Rows of a non-fp32 matrix widened to fp32 on the host (quant_dequant_rows, any format), rounded to
// bf16 and uploaded, a tile of rows at a time.
static int upload_as_bf16(Backend *be, uint16_t *dst, const Weight *src) {
    int rc = ER_OK;
    int tile_rows = (int)(UPLOAD_TILE_ELEMS / (size_t)src->cols);
    tile_rows = tile_rows < 1 ? 1 : (tile_rows > src->rows ? src->rows : tile_rows);
    size_t tile = (size_t)tile_rows * src->cols;
    float *f32 = er_alloc(tile * sizeof(float));
    uint16_t *b16 = er_alloc(tile * sizeof(uint16_t));
    if (!f32 || !b16) {
        rc =
            er_error(ER_ENOMEM, "cuda: weight upload: no host memory for a tile of %d rows x %d", tile_rows, src->cols);
        goto done;
    }
    for (int r0 = 0; r0 < src->rows; r0 += tile_rows) {
        int nr = src->rows - r0 < tile_rows ? src->rows - r0 : tile_rows;
        size_t n = (size_t)nr * src->cols;
        quant_dequant_rows(f32, src, r0, nr);
        ER_CHECK(dtype_from_f32(b16, DT_BF16, f32, n));
        ER_CHECK(op_upload(be, dst + (size_t)r0 * src->cols, b16, n * sizeof(uint16_t)));
    }
done:
    er_free(f32);
    er_free(b16);
    return rc;
}

// A trainable fp32 matrix stays fp32; every frozen one becomes bf16 (a bf16 one is copied as it is).
// dst->owned is the device buffer.
static int op_weight_upload(Backend *be, Weight *dst, const Weight *src, int frozen) {
    memset(dst, 0, sizeof *dst);
    if (src->rows < 1 || src->cols < 1 || !src->data)
        return er_error(ER_EINVAL, "cuda: weight upload: a %d x %d matrix without data", src->rows, src->cols);
    int f32 = src->fmt == WF_F32 && !frozen;
    size_t bytes = (size_t)src->rows * src->cols * (f32 ? sizeof(float) : sizeof(uint16_t));
    void *d = op_alloc(be, bytes);
    if (!d)
        return ER_ENOMEM;
    int rc = f32 || src->fmt == WF_BF16 ? op_upload(be, d, src->data, bytes) : upload_as_bf16(be, d, src);
    if (rc < 0) {
        op_free(be, d);
        return rc;
    }
    dst->fmt = f32 ? WF_F32 : WF_BF16;
    dst->rows = src->rows;
    dst->cols = src->cols;
    dst->data = d;
    dst->owned = d;
    return ER_OK;
}

static int op_mem_available(Backend *be, size_t *bytes) {
    size_t total = 0;
    CUDA_TRY(cudaMemGetInfo(bytes, &total));
    return ER_OK;
}

// ---- products (cuBLAS) ----
//
// cuBLAS is column-major, our matrices are row-major: a row-major (r, c) buffer read column-major is
// its transpose, a (c, r) matrix with leading dimension c. So the forward product
//   out (N, rows) = inp (N, cols) · Wᵀ
// is, column-major, outᵀ (rows, N) = W (rows, cols) · inpᵀ (cols, N), where the W buffer is the
// column-major (cols, rows) matrix Wᵀ, taken transposed (OP_T, lda = cols), and the inp buffer is inpᵀ
// as it is (OP_N, ldb = cols):
//   cublasGemmEx(OP_T, OP_N, m = rows, n = N, k = cols, W, lda = cols, inp, ldb = cols, out, ldc = rows).
// The backward products the same way:
//   dinp (N, cols) += dout (N, rows) · W:  dinpᵀ (cols, N) = Wᵀ (cols, rows) · doutᵀ (rows, N)
//     -> GemmEx(OP_N, OP_N, m = cols, n = N, k = rows, W, cols, dout, rows, dinp, cols)
//   dW (R, K) += doutᵀ (R, N) · inp (N, K):  dWᵀ (K, R) = inpᵀ (K, N) · dout (N, R)
//     -> GemmEx(OP_N, OP_T, m = K, n = R, k = N, inp, K, dout, R, dW, K)

// C (m, n) = alpha · op(A) · op(B) + beta · C, column-major; A and B of type ab, C fp32, fp32 accumulation.
static int gemm(CudaCtx *c, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const void *A,
                int lda, const void *B, int ldb, cudaDataType ab, float beta, float *C, int ldc) {
    if (m <= 0 || n <= 0)
        return ER_OK;
    BLAS_TRY(cublasGemmEx(c->blas, ta, tb, m, n, k, &alpha, A, ab, lda, B, ab, ldb, &beta, C, CUDA_R_32F, ldc,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return ER_OK;
}

// C (n floats) is about to be written: a kept bf16 copy of anything it overlaps would be stale.
static void cast_forget_written(CudaCtx *c, const float *C, size_t n) {
    uintptr_t a = (uintptr_t)C, b = (uintptr_t)c->cast_src;
    if (c->cast_src && a < b + c->cast_n * sizeof(float) && b < a + n * sizeof(float))
        c->cast_src = NULL;
}

// A product with an activation: C (N, m) = alpha · x (N, k) · op(W)ᵀ + beta · C, i.e. column-major
// Cᵀ (m, N) = alpha · op(W) (m, k) · xᵀ (k, N) + beta · Cᵀ, W of type t with leading dimension lda.
// A bf16 W multiplies a bf16 copy of x, made in the cast buffer a chunk of rows at a time: rows of x
// are columns of the column-major product, so each chunk is a product of its own. The stream orders
// a chunk's cast after the previous chunk's product.
static int gemm_act(CudaCtx *c, cublasOperation_t ta, const void *W, cudaDataType t, int lda, const float *x, int N,
                    int k, float *C, int m, float alpha, float beta) {
    if (t == CUDA_R_32F) {
        cast_forget_written(c, C, (size_t)N * m);
        return gemm(c, ta, CUBLAS_OP_N, m, N, k, alpha, W, lda, x, k, t, beta, C, m);
    }
    if ((size_t)k > CAST_ELEMS)
        return er_error(ER_EINVAL, "cuda: a bf16 product over %d inputs (the cast buffer holds %zu)", k, CAST_ELEMS);
    int chunk = CAST_ELEMS / (size_t)k < (size_t)N ? (int)(CAST_ELEMS / (size_t)k) : N;
    size_t n = (size_t)N * k;
    cast_forget_written(c, C, (size_t)N * m);
    int kept = c->cast_src == x && c->cast_n == n; // the previous product's input, cast already
    c->cast_src = NULL;
    for (int n0 = 0; n0 < N; n0 += chunk) {
        int nc = N - n0 < chunk ? N - n0 : chunk;
        if (!kept)
            CUDA_TRY(cuda_to_bf16(c->stream, c->cast, x + (size_t)n0 * k, (size_t)nc * k));
        ER_TRY(gemm(c, ta, CUBLAS_OP_N, m, nc, k, alpha, W, lda, c->cast, k, t, beta, C + (size_t)n0 * m, m));
    }
    if (chunk == N) { // whole in the buffer: the next product of x may take it
        c->cast_src = x;
        c->cast_n = n;
    }
    return ER_OK;
}

// The device formats of a matrix: WF_F32, or WF_BF16 (weight_upload's two).
static int weight_type(const Weight *w, cudaDataType *t) {
    *t = w->fmt == WF_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    if (w->fmt != WF_F32 && w->fmt != WF_BF16)
        return er_error(ER_EINVAL, "cuda: a %s matrix is not a device matrix (weight_upload makes fp32 or bf16)",
                        weight_format_name(w->fmt));
    return ER_OK;
}

// out (N, rows) = alpha · inp (N, cols) · Wᵀ + beta · out; W (rows, cols) of type t.
static int rm_forward(CudaCtx *c, float *out, const float *inp, const void *W, cudaDataType t, int N, int rows,
                      int cols, float alpha, float beta) {
    return gemm_act(c, CUBLAS_OP_T, W, t, cols, inp, N, cols, out, rows, alpha, beta);
}

// dinp (N, cols) = alpha · dout (N, rows) · W + beta · dinp; W (rows, cols) of type t.
static int rm_backward_input(CudaCtx *c, float *dinp, const float *dout, const void *W, cudaDataType t, int N, int rows,
                             int cols, float alpha, float beta) {
    return gemm_act(c, CUBLAS_OP_N, W, t, cols, dout, N, rows, dinp, cols, alpha, beta);
}

// dW (R, K) = alpha · doutᵀ (R, N) · inp (N, K) + beta · dW, all fp32.
static int rm_backward_weight(CudaCtx *c, float *dW, const float *dout, const float *inp, int N, int R, int K,
                              float alpha, float beta) {
    return gemm(c, CUBLAS_OP_N, CUBLAS_OP_T, K, R, N, alpha, inp, K, dout, R, CUDA_R_32F, beta, dW, K);
}

static int op_matmul_forward(Backend *be, float *out, const float *inp, const Weight *w, const float *bias, int N,
                             float *scratch, int flags) {
    (void)scratch; // the CPU's tile scratch; bf16 products use the backend's own cast buffer
    (void)flags;   // the products here are on fp32 inputs always
    CudaCtx *c = ctx_of(be);
    cudaDataType t;
    ER_TRY(weight_type(w, &t));
    ER_TRY(rm_forward(c, out, inp, w->data, t, N, w->rows, w->cols, 1.0f, 0.0f));
    if (bias)
        CUDA_TRY(cuda_bias_forward(c->stream, out, bias, N, w->rows));
    return ER_OK;
}

static int op_matmul_backward_input(Backend *be, float *dinp, const float *dout, const Weight *w, int N,
                                    float *scratch) {
    (void)scratch;
    cudaDataType t;
    ER_TRY(weight_type(w, &t));
    return rm_backward_input(ctx_of(be), dinp, dout, w->data, t, N, w->rows, w->cols, 1.0f, 1.0f);
}

static int op_matmul_backward_weight(Backend *be, float *dW, float *dbias, const float *dout, const float *inp, int N,
                                     int R, int K) {
    CudaCtx *c = ctx_of(be);
    if (dW)
        ER_TRY(rm_backward_weight(c, dW, dout, inp, N, R, K, 1.0f, 1.0f));
    if (dbias) // dbias (R) += Σ_n dout[n, :]
        CUDA_TRY(cuda_column_sum(c->stream, dbias, dout, NULL, NULL, N, R));
    return ER_OK;
}

// ---- masked LoRA (lora/lora.c's products, on cuBLAS; A (r, in), B (out, r) fp32) ----

static int op_lora_forward(Backend *be, float *out, float *h, const float *x, const LoraMat *m, int r, float scale,
                           const uint8_t *mask, int N) {
    CudaCtx *c = ctx_of(be);
    // h (N, r) = x · Aᵀ, masked-off rows zeroed so the backward sees exactly what was used
    ER_TRY(rm_forward(c, h, x, m->A, CUDA_R_32F, N, r, m->in, 1.0f, 0.0f));
    if (mask)
        CUDA_TRY(cuda_zero_masked_rows(c->stream, h, mask, N, r));
    // out (N, out) += scale · h · Bᵀ (rows with h = 0 add nothing)
    return rm_forward(c, out, h, m->B, CUDA_R_32F, N, m->out, r, scale, 1.0f);
}

static int op_lora_backward(Backend *be, float *dx, LoraMat *m, int r, float scale, const float *dout, const float *x,
                            const float *h, const uint8_t *mask, int N, float *dh) {
    CudaCtx *c = ctx_of(be);
    // dh (N, r) = scale · dout · B, zero on masked-off rows
    ER_TRY(rm_backward_input(c, dh, dout, m->B, CUDA_R_32F, N, m->out, r, scale, 0.0f));
    if (mask)
        CUDA_TRY(cuda_zero_masked_rows(c->stream, dh, mask, N, r));
    if (m->gB) // gB (out, r) += scale · doutᵀ · h   (h is zero on masked-off rows)
        ER_TRY(rm_backward_weight(c, m->gB, dout, h, N, m->out, r, scale, 1.0f));
    if (m->gA) // gA (r, in) += dhᵀ · x
        ER_TRY(rm_backward_weight(c, m->gA, dh, x, N, r, m->in, 1.0f, 1.0f));
    if (dx) // dx (N, in) += dh · A
        ER_TRY(rm_backward_input(c, dx, dh, m->A, CUDA_R_32F, N, r, m->in, 1.0f, 1.0f));
    return ER_OK;
}

// ---- the kernels' ops ----

static int op_embed_forward(Backend *be, float *out, const Weight *embed, const int *tokens, int N) {
    cudaDataType t;
    ER_TRY(weight_type(embed, &t));
    CUDA_TRY(cuda_embed_forward(ctx_of(be)->stream, out, embed->data, t == CUDA_R_16BF, tokens, N, embed->cols));
    return ER_OK;
}

static int op_embed_backward(Backend *be, float *dembed, const float *dres, const int *tokens, int N, int C) {
    CUDA_TRY(cuda_embed_backward(ctx_of(be)->stream, dembed, dres, tokens, N, C));
    return ER_OK;
}

static int op_rmsnorm_forward(Backend *be, float *out, float *rstd, const float *x, const float *w, int N, int C,
                              float eps) {
    CUDA_TRY(cuda_rmsnorm_forward(ctx_of(be)->stream, out, rstd, x, w, N, C, eps));
    return ER_OK;
}

static int op_rmsnorm_backward(Backend *be, float *dx, float *dw, const float *dout, const float *x, const float *w,
                               const float *rstd, int N, int C) {
    CudaCtx *c = ctx_of(be);
    CUDA_TRY(cuda_rmsnorm_backward(c->stream, dx, dout, x, w, rstd, N, C));
    if (dw) // dw (C) += Σ_n dout * x * rstd
        CUDA_TRY(cuda_column_sum(c->stream, dw, dout, x, rstd, N, C));
    return ER_OK;
}

static int op_rope_forward(Backend *be, float *x, const int *pos, const float *cos_tab, const float *sin_tab, int N,
                           int nh, int HS) {
    CUDA_TRY(cuda_rope(ctx_of(be)->stream, x, pos, cos_tab, sin_tab, N, nh, HS, 0));
    return ER_OK;
}

static int op_rope_backward(Backend *be, float *dx, const int *pos, const float *cos_tab, const float *sin_tab, int N,
                            int nh, int HS) {
    CUDA_TRY(cuda_rope(ctx_of(be)->stream, dx, pos, cos_tab, sin_tab, N, nh, HS, 1));
    return ER_OK;
}

static int op_swiglu_forward(Backend *be, float *out, const float *gate, const float *up, int N, int F) {
    CUDA_TRY(cuda_swiglu_forward(ctx_of(be)->stream, out, gate, up, (size_t)N * F));
    return ER_OK;
}

static int op_swiglu_backward(Backend *be, float *dgate, float *dup, const float *dout, const float *gate,
                              const float *up, int N, int F) {
    CUDA_TRY(cuda_swiglu_backward(ctx_of(be)->stream, dgate, dup, dout, gate, up, (size_t)N * F));
    return ER_OK;
}

static int op_residual_forward(Backend *be, float *out, const float *a, const float *b, size_t n) {
    CUDA_TRY(cuda_residual_forward(ctx_of(be)->stream, out, a, b, n));
    return ER_OK;
}

static int attention_check(int NH, int NKV, int HS) {
    if (HS < 1 || HS > CUDA_ATTENTION_MAX_HS || NKV < 1 || NH % NKV != 0)
        return er_error(ER_EINVAL,
                        "cuda: attention: %d query heads over %d KV heads of size %d (the kernels take "
                        "head sizes up to %d and NH a multiple of NKV)",
                        NH, NKV, HS, CUDA_ATTENTION_MAX_HS);
    return ER_OK;
}

// ---- the KV cache's ----

static int op_kv_store(Backend *be, KVCache *kv, int l, const float *k, const float *v, const int *dst, int N) {
    CUDA_TRY(cuda_kv_store(ctx_of(be)->stream, kv->k, kv->v, kv->ks, kv->vs, kv->type == KV_INT8, k, v, dst, N,
                           (size_t)l * kv->n_blocks * KV_BLOCK, kv->NKV, kv->HS));
    return ER_OK;
}

static int op_kv_attention_forward(Backend *be, float *out, const float *q, const KVCache *kv, int l,
                                   const int *blocks, const int *pos0, const int *len, int B, int T, int NH,
                                   float *scores, int nthreads, int keys) {
    ER_TRY(attention_check(NH, kv->NKV, kv->HS));
    CUDA_TRY(cuda_kv_attention_forward(ctx_of(be)->stream, out, q, kv->k, kv->v, kv->ks, kv->vs,
                                       kv->type == KV_INT8, (size_t)l * kv->n_blocks * KV_BLOCK, blocks,
                                       kv->max_blocks_per_seq, KV_BLOCK, pos0, len, B, T, NH, kv->NKV, kv->HS));
    return ER_OK;
}

// ---- attention ----
//
// Two paths, picked once at open by ER_CUDA_ATTENTION. The default runs the products on the tensor cores
// through cuBLAS, one batch row at a time: q, k, v (and dout) are cast to bf16 into head-major scratch
// (kernels.cu), so the G = NH / NKV query heads of KV head kh are one contiguous (G * T, HS) matrix and
// each product is one strided-batched GEMM over the NKV KV heads (bf16 in, fp32 out, fp32 accumulation):
//   forward   S = Q_g K_khᵀ (G*T, T); P = causal softmax(S * scale) in bf16, lse fp32; O_g = P V_kh
//   backward  D = Σ dO·O (drow); S again, P = exp(S * scale - lse); dV_kh = P_gᵀ dO_g; dP = dO_g V_khᵀ;
//             dS = P (dP - D) * scale (over P); dQ_g = dS K_kh; dK_kh = dS_gᵀ Q_g
// The inner dimension G*T of dK and dV sums the group's query heads: no atomics. cuBLAS computes the whole
// (T, T) products, the masked half included; the kernels make P and dS exactly 0 there. Scratch: S fp32
// and P bf16 (NH, T, T) each, the bf16 Qh dOh (NH, T, HS) and Kh Vh (NKV, T, HS), and one fp32 (NH + 2 NKV,
// T, HS) for O, or dQ dK dV, before they go back to the (T, heads, HS) layouts. The backward recomputes P
// (one more product) rather than keep it from the forward: NH * T² bf16 per layer and batch row.
// ER_CUDA_ATTENTION=simt runs the fp32 SIMT kernels instead (no scratch, fp32 throughout: the reference).

typedef struct {
    float *S, *F;                     // scores or dP (NH, T, T); O, or dQ dK dV, head-major
    uint16_t *P, *Qh, *Kh, *Vh, *dOh; // P or dS (NH, T, T); the bf16 head-major inputs
} AttnScratch;

#define ATTN_ALIGN 256

static size_t attn_align(size_t n) { return (n + ATTN_ALIGN - 1) / ATTN_ALIGN * ATTN_ALIGN; }

// The scratch for one batch row, grown (never shrunk) on the context; freed at close.
static int attn_scratch(CudaCtx *c, AttnScratch *a, int T, int NH, int NKV, int HS) {
    if ((size_t)(NH / NKV) * T > INT_MAX)
        return er_error(ER_EINVAL, "cuda: attention: %d tokens x %d query heads per KV head is past cuBLAS's int "
                        "dimensions", T, NH / NKV);
    size_t tt = (size_t)NH * T * T, th = (size_t)T * HS;
    size_t sizes[7] = {tt * sizeof(float), (size_t)(NH + 2 * NKV) * th * sizeof(float), tt * sizeof(uint16_t),
                       NH * th * sizeof(uint16_t), NKV * th * sizeof(uint16_t), NKV * th * sizeof(uint16_t),
                       NH * th * sizeof(uint16_t)};
    size_t total = 0;
    for (int i = 0; i < 7; i++)
        total += attn_align(sizes[i]);
    if (total > c->attn_bytes) {
        CUDA_TRY(cudaStreamSynchronize(c->stream)); // earlier ops may still read the old scratch
        cudaFree(c->attn);
        c->attn = NULL;
        c->attn_bytes = 0;
        cudaError_t e = cudaMalloc(&c->attn, total);
        if (e != cudaSuccess) {
            cudaGetLastError();
            c->attn = NULL;
            return er_error(ER_ENOMEM, "cuda: attention: no device memory for %zu bytes of scratch (%d tokens, %d "
                            "heads; ER_CUDA_ATTENTION=simt needs none): %s", total, T, NH, cudaGetErrorString(e));
        }
        c->attn_bytes = total;
    }
    char *p = c->attn;
    void **dst[7] = {(void **)&a->S, (void **)&a->F, (void **)&a->P, (void **)&a->Qh,
                     (void **)&a->Kh, (void **)&a->Vh, (void **)&a->dOh};
    for (int i = 0; i < 7; i++) {
        *dst[i] = p;
        p += attn_align(sizes[i]);
    }
    return ER_OK;
}

// Row-major C (M, N) fp32 = op(X) · op(Y) for each of `batch` matrices (strides in elements), X and Y bf16
// row-major as stored (op = transposed where tX / tY). Column-major that is Cᵀ = op(Y)ᵀ · op(X)ᵀ: a
// row-major matrix is its transpose column-major, with the leading dimension its stored column count.
static int gemm_heads(CudaCtx *c, int tX, int tY, int M, int N, int K, const uint16_t *X, long long sX,
                      const uint16_t *Y, long long sY, float *C, long long sC, int batch) {
    const float one = 1.0f, zero = 0.0f;
    BLAS_TRY(cublasGemmStridedBatchedEx(c->blas, tY ? CUBLAS_OP_T : CUBLAS_OP_N, tX ? CUBLAS_OP_T : CUBLAS_OP_N, N, M,
                                        K, &one, Y, CUDA_R_16BF, tY ? K : N, sY, X, CUDA_R_16BF, tX ? M : K, sX, &zero,
                                        C, CUDA_R_32F, N, sC, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return ER_OK;
}

static int attention_tc_forward(CudaCtx *c, float *out, float *lse, const float *q, const float *k, const float *v,
                                int B, int T, int NH, int NKV, int HS) {
    if (B <= 0 || T <= 0)
        return ER_OK;
    AttnScratch a;
    ER_TRY(attn_scratch(c, &a, T, NH, NKV, HS));
    int G = NH / NKV;
    long long gt = (long long)G * T, th = (long long)T * HS;
    float scale = (float)(1.0 / sqrt((double)HS));
    for (int b = 0; b < B; b++) {
        size_t qo = (size_t)b * T * NH * HS, ko = (size_t)b * T * NKV * HS;
        CUDA_TRY(cuda_attention_to_heads(c->stream, a.Qh, q + qo, T, NH, HS));
        CUDA_TRY(cuda_attention_to_heads(c->stream, a.Kh, k + ko, T, NKV, HS));
        CUDA_TRY(cuda_attention_to_heads(c->stream, a.Vh, v + ko, T, NKV, HS));
        ER_TRY(gemm_heads(c, 0, 1, (int)gt, T, HS, a.Qh, gt * HS, a.Kh, th, a.S, gt * T, NKV)); // S = Q Kᵀ
        CUDA_TRY(cuda_attention_softmax(c->stream, a.P, lse + (size_t)b * NH * T, a.S, NULL, NH, T, scale));
        ER_TRY(gemm_heads(c, 0, 0, (int)gt, HS, T, a.P, gt * T, a.Vh, th, a.F, gt * HS, NKV)); // O = P V
        CUDA_TRY(cuda_attention_from_heads(c->stream, out + qo, a.F, T, NH, HS));
    }
    return ER_OK;
}

static int attention_tc_backward(CudaCtx *c, float *dq, float *dk, float *dv, const float *dout, const float *out,
                                 const float *lse, const float *q, const float *k, const float *v, int B, int T,
                                 int NH, int NKV, int HS, float *drow) {
    if (B <= 0 || T <= 0)
        return ER_OK;
    AttnScratch a;
    ER_TRY(attn_scratch(c, &a, T, NH, NKV, HS));
    int G = NH / NKV;
    long long gt = (long long)G * T, th = (long long)T * HS;
    float scale = (float)(1.0 / sqrt((double)HS));
    float *dQf = a.F, *dKf = a.F + (size_t)NH * th, *dVf = dKf + (size_t)NKV * th;
    CUDA_TRY(cuda_attention_drow(c->stream, drow, dout, out, B, T, NH, HS));
    for (int b = 0; b < B; b++) {
        size_t qo = (size_t)b * T * NH * HS, ko = (size_t)b * T * NKV * HS, lo = (size_t)b * NH * T;
        CUDA_TRY(cuda_attention_to_heads(c->stream, a.Qh, q + qo, T, NH, HS));
        CUDA_TRY(cuda_attention_to_heads(c->stream, a.Kh, k + ko, T, NKV, HS));
        CUDA_TRY(cuda_attention_to_heads(c->stream, a.Vh, v + ko, T, NKV, HS));
        CUDA_TRY(cuda_attention_to_heads(c->stream, a.dOh, dout + qo, T, NH, HS));
        ER_TRY(gemm_heads(c, 0, 1, (int)gt, T, HS, a.Qh, gt * HS, a.Kh, th, a.S, gt * T, NKV)); // S = Q Kᵀ
        CUDA_TRY(cuda_attention_softmax(c->stream, a.P, NULL, a.S, lse + lo, NH, T, scale));
        ER_TRY(gemm_heads(c, 1, 0, T, HS, (int)gt, a.P, gt * T, a.dOh, gt * HS, dVf, th, NKV));  // dV = Pᵀ dO
        ER_TRY(gemm_heads(c, 0, 1, (int)gt, T, HS, a.dOh, gt * HS, a.Vh, th, a.S, gt * T, NKV)); // dP = dO Vᵀ
        CUDA_TRY(cuda_attention_dscores(c->stream, a.P, a.S, drow + lo, NH, T, scale));
        ER_TRY(gemm_heads(c, 0, 0, (int)gt, HS, T, a.P, gt * T, a.Kh, th, dQf, gt * HS, NKV));   // dQ = dS K
        ER_TRY(gemm_heads(c, 1, 0, T, HS, (int)gt, a.P, gt * T, a.Qh, gt * HS, dKf, th, NKV));   // dK = dSᵀ Q
        CUDA_TRY(cuda_attention_from_heads(c->stream, dq + qo, dQf, T, NH, HS));
        CUDA_TRY(cuda_attention_from_heads(c->stream, dk + ko, dKf, T, NKV, HS));
        CUDA_TRY(cuda_attention_from_heads(c->stream, dv + ko, dVf, T, NKV, HS));
    }
    return ER_OK;
}

static int op_attention_forward(Backend *be, float *out, float *lse, const float *q, const float *k, const float *v,
                                int B, int T, int NH, int NKV, int HS, float *scores, int nthreads) {
    (void)scores; // the CPU's per-thread scores; the device keeps its own scratch
    (void)nthreads;
    ER_TRY(attention_check(NH, NKV, HS));
    CudaCtx *c = ctx_of(be);
    if (!c->attn_simt)
        return attention_tc_forward(c, out, lse, q, k, v, B, T, NH, NKV, HS);
    CUDA_TRY(cuda_attention_forward(c->stream, out, lse, q, k, v, B, T, NH, NKV, HS));
    return ER_OK;
}

// dkh (B, NH, T, HS floats) holds the rows' D = Σ dO·O (B, NH, T); no per-head dK/dV is needed (the SIMT
// kernel's warp, or the tensor-core GEMM's inner dimension, sums a KV head's whole group), so dvh is unused.
static int op_attention_backward(Backend *be, float *dq, float *dk, float *dv, const float *dout, const float *out,
                                 const float *lse, const float *q, const float *k, const float *v, int B, int T, int NH,
                                 int NKV, int HS, float *dkh, float *dvh) {
    (void)dvh;
    ER_TRY(attention_check(NH, NKV, HS));
    CudaCtx *c = ctx_of(be);
    if (!c->attn_simt)
        return attention_tc_backward(c, dq, dk, dv, dout, out, lse, q, k, v, B, T, NH, NKV, HS, dkh);
    CUDA_TRY(cuda_attention_backward(c->stream, dq, dk, dv, dout, out, lse, q, k, v, B, T, NH, NKV, HS, dkh));
    return ER_OK;
}

static int op_cross_entropy(Backend *be, double *loss, float *logits, const int *targets, const float *mask, int N,
                            int V, int grad, double wsum, double *row_loss) {
    CudaCtx *c = ctx_of(be);
    *loss = 0.0;
    if (N <= 0)
        return ER_OK;
    CUDA_TRY(cuda_cross_entropy(c->stream, c->red, logits, targets, mask, N, V, grad, wsum, row_loss));
    return op_download(be, loss, c->red + 1, sizeof(double));
}

static int op_logprob_forward(Backend *be, float *logp, const float *logits, const int *targets, int N, int V,
                              float inv_temp) {
    CUDA_TRY(cuda_logprob_forward(ctx_of(be)->stream, logp, logits, targets, N, V, inv_temp));
    return ER_OK;
}

static int op_token_stats(Backend *be, float *logp, float *ent, const float *logits, const int *rows,
                          const int *targets, int n, int V, float inv_temp) {
    CUDA_TRY(cuda_token_stats(ctx_of(be)->stream, logp, ent, logits, rows, targets, n, V, inv_temp));
    return ER_OK;
}

static int op_logprob_backward(Backend *be, float *dlogits, const float *logits, const int *targets, const float *coef,
                               int N, int V, float inv_temp) {
    CUDA_TRY(cuda_logprob_backward(ctx_of(be)->stream, dlogits, logits, targets, coef, N, V, inv_temp));
    return ER_OK;
}

static int op_adamw_update(Backend *be, float *params, const float *grads, float *m, float *v,
                           const unsigned char *decay_mask, size_t n, float lr, float b1, float b2, float eps, float wd,
                           float bc1, float bc2) {
    CUDA_TRY(cuda_adamw_update(ctx_of(be)->stream, params, grads, m, v, decay_mask, n, lr, b1, b2, eps, wd, bc1, bc2));
    return ER_OK;
}

static int op_sumsq(Backend *be, double *out, const float *x, size_t n) {
    CudaCtx *c = ctx_of(be);
    size_t chunk = SUMSQ_CHUNK;
    while ((n + chunk - 1) / chunk > CUDA_SUMSQ_MAX_CHUNKS)
        chunk *= 2;
    CUDA_TRY(cuda_sumsq(c->stream, c->red, c->red + 2, x, n, chunk));
    return op_download(be, out, c->red, sizeof(double));
}

static int op_scale(Backend *be, float *x, size_t n, float s) {
    CUDA_TRY(cuda_scale(ctx_of(be)->stream, x, n, s));
    return ER_OK;
}

static const BackendOps cuda_ops = {
    .alloc = op_alloc,
    .free = op_free,
    .upload = op_upload,
    .download = op_download,
    .copy = op_copy,
    .zero = op_zero,
    .weight_upload = op_weight_upload,
    .mem_available = op_mem_available,
    .embed_forward = op_embed_forward,
    .matmul_forward = op_matmul_forward,
    .rmsnorm_forward = op_rmsnorm_forward,
    .rope_forward = op_rope_forward,
    .swiglu_forward = op_swiglu_forward,
    .residual_forward = op_residual_forward,
    .attention_forward = op_attention_forward,
    .kv_store = op_kv_store,
    .kv_attention_forward = op_kv_attention_forward,
    .lora_forward = op_lora_forward,
    .cross_entropy = op_cross_entropy,
    .logprob_forward = op_logprob_forward,
    .token_stats = op_token_stats,
    .logprob_backward = op_logprob_backward,
    .matmul_backward_input = op_matmul_backward_input,
    .matmul_backward_weight = op_matmul_backward_weight,
    .rmsnorm_backward = op_rmsnorm_backward,
    .rope_backward = op_rope_backward,
    .swiglu_backward = op_swiglu_backward,
    .attention_backward = op_attention_backward,
    .lora_backward = op_lora_backward,
    .embed_backward = op_embed_backward,
    .adamw_update = op_adamw_update,
    .sumsq = op_sumsq,
    .scale = op_scale,
};

// ---- open / close ----

static void ctx_free(CudaCtx *c) {
    if (!c)
        return;
    if (c->stream)
        cudaStreamSynchronize(c->stream);
    cudaFree(c->cast);
    cudaFree(c->red);
    cudaFree(c->attn);
    if (c->blas)
        cublasDestroy(c->blas);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    er_free(c);
}

#define CUDA_CHECK(call) ER_CHECK(cuda_check((call), #call))
#define BLAS_CHECK(call) ER_CHECK(blas_check((call), #call))

// ER_CUDA_ATTENTION: unset, empty or "tensor" = the tensor-core attention; "simt" = the fp32 SIMT kernels.
static int attention_mode(int *simt) {
    const char *mode = getenv("ER_CUDA_ATTENTION");
    *simt = mode && strcmp(mode, "simt") == 0;
    if (mode && *mode && !*simt && strcmp(mode, "tensor") != 0)
        return er_error(ER_EINVAL, "cuda: ER_CUDA_ATTENTION=%s: expected tensor (cuBLAS bf16, the default) or simt "
                        "(the fp32 kernels)", mode);
    return ER_OK;
}

int backend_cuda_count(int *n) {
    int count = 0, driver = 0;
    *n = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaSuccess) {
        *n = count;
        return ER_OK;
    }
    cudaGetLastError();
    // No GPU at all: no device, or no driver installed (then the driver version reads 0).
    if (e == cudaErrorNoDevice || (cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0))
        return ER_OK;
    return er_error(ER_EUNSUPPORTED, "cuda: cudaGetDeviceCount: %s (driver %d.%d)", cudaGetErrorString(e),
                    driver / 1000, driver % 1000 / 10);
}

// After every op (backend_after_each_op). The bf16 copy of a product's input stays valid across the
// products and their LoRA terms, which never write a product's input (matmul_forward writes its output,
// lora_forward its output and h, matmul_backward_input dinp; gemm_act drops the copy when its output
// overlaps it); any other op may write anything, so it drops the copy. Then, under ER_CUDA_SYNC=1: the
// op's kernels finished, or their fault under the op's name. A fault inside a kernel is sticky: the
// backend is unusable after it.
static int after_op(Backend *be, const char *op) {
    CudaCtx *c = ctx_of(be);
    if (strcmp(op, "matmul_forward") != 0 && strcmp(op, "lora_forward") != 0 &&
        strcmp(op, "matmul_backward_input") != 0)
        c->cast_src = NULL;
    if (!c->sync_each)
        return ER_OK;
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (e == cudaSuccess)
        e = cudaGetLastError();
    if (e == cudaSuccess)
        return ER_OK;
    return er_error(e == cudaErrorMemoryAllocation ? ER_ENOMEM : ER_EIO, "cuda: %s: %s (on %s, synchronised after "
                    "the op: ER_CUDA_SYNC=1)", op, cudaGetErrorString(e), be->device);
}

int backend_cuda_open(Backend *be, int device) {
    int rc = ER_OK, count = 0, sync = 0, simt = 0;
    ER_TRY(attention_mode(&simt));
    ER_TRY(backend_env_flag("ER_CUDA_SYNC", getenv("ER_CUDA_SYNC"), &sync));
    ER_TRY(backend_cuda_count(&count));
    if (count < 1)
        return er_error(ER_EUNSUPPORTED, "cuda: no device answers (cudaGetDeviceCount: no device or no driver)");
    if (device < 0 || device >= count)
        return er_error(ER_EUNSUPPORTED, "cuda: no device %d (this machine has %d: cuda:0..cuda:%d)", device, count,
                        count - 1);
    CudaCtx *c = er_calloc(1, sizeof *c);
    if (!c)
        return er_error(ER_ENOMEM, "cuda: no host memory for the backend's state");
    c->device = device;
    c->attn_simt = simt;
    c->sync_each = sync;
    struct cudaDeviceProp prop;
    size_t mem_free = 0, mem_total = 0;
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    BLAS_CHECK(cublasCreate(&c->blas));
    BLAS_CHECK(cublasSetStream(c->blas, c->stream));
    CUDA_CHECK(cudaMalloc((void **)&c->red, (2 + CUDA_SUMSQ_MAX_CHUNKS) * sizeof(double)));
    CUDA_CHECK(cudaMalloc((void **)&c->cast, CAST_ELEMS * sizeof(uint16_t)));
    CUDA_CHECK(cudaMemGetInfo(&mem_free, &mem_total));
    memset(be, 0, sizeof *be);
    be->kind = BACKEND_CUDA;
    be->ops = &cuda_ops;
    be->ctx = c;
    snprintf(be->name, sizeof be->name, "cuda");
    snprintf(be->device, sizeof be->device, "%.127s", prop.name);
    be->mem_total = mem_total;
    be->mem_free = mem_free;
    be->index = device;
    be->queue = c->stream;
    backend_after_each_op(be, after_op);
    return ER_OK;
done:
    ctx_free(c);
    return rc;
}

void backend_cuda_close(Backend *be) {
    ctx_free(ctx_of(be));
    be->ctx = NULL;
}
