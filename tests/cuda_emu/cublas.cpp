// Test-only (make CUDA_EMU=1; docs/gpu.md "Emulated CUDA"): the cuBLAS calls of model/cuda/backend.c as a plain
// column-major reference with cuBLAS's argument checks. Built with ASan, unlike emu.cpp: a product whose
// shape or leading dimension reaches past its matrices is reported where it reads or writes.
#include <stdlib.h>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

struct cublasContext {
    cudaStream_t stream;
};

namespace {

// Element (r, c) of a column-major matrix with leading dimension ld, as float.
float elem(const void *M, cudaDataType t, long long ld, long long r, long long c) {
    size_t i = (size_t)(r + c * ld);
    return t == CUDA_R_32F ? ((const float *)M)[i] : __bfloat162float(((const __nv_bfloat16 *)M)[i]);
}

// C (m, n) = alpha op(A) op(B) + beta C (beta == 0: C is not read, as in cuBLAS). op(A) is packed by
// rows and op(B) by columns into fp32, then each entry is a dot product in fp32 over 8 interleaved
// partial sums (so it vectorises; cuBLAS's order differs, and so do the last bits).
void gemm_ref(bool ta, bool tb, int m, int n, int k, float alpha, const void *A, cudaDataType at, int lda,
              const void *B, int ldb, float beta, float *C, int ldc, float *pa, float *pb) {
    for (int i = 0; i < m; i++)
        for (int l = 0; l < k; l++)
            pa[(size_t)i * k + l] = ta ? elem(A, at, lda, l, i) : elem(A, at, lda, i, l);
    for (int j = 0; j < n; j++)
        for (int l = 0; l < k; l++)
            pb[(size_t)j * k + l] = tb ? elem(B, at, ldb, j, l) : elem(B, at, ldb, l, j);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            const float *a = pa + (size_t)i * k, *b = pb + (size_t)j * k;
            float acc[8] = {0};
            int l = 0;
            for (; l + 8 <= k; l += 8)
                for (int u = 0; u < 8; u++)
                    acc[u] += a[l + u] * b[l + u];
            for (; l < k; l++)
                acc[0] += a[l] * b[l];
            float dot = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
            float *c = C + (size_t)i + (size_t)j * ldc;
            *c = beta == 0.0f ? alpha * dot : alpha * dot + beta * *c;
        }
}

// cuBLAS's checks, in its order: the handle, the shapes and leading dimensions, then the types.
cublasStatus_t gemm_check(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                          cudaDataType at, int lda, cudaDataType bt, int ldb, cudaDataType ct, int ldc,
                          cublasComputeType_t compute, int batch) {
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    auto op_ok = [](cublasOperation_t o) { return o == CUBLAS_OP_N || o == CUBLAS_OP_T || o == CUBLAS_OP_C; };
    int rows_a = ta == CUBLAS_OP_N ? m : k, rows_b = tb == CUBLAS_OP_N ? k : n;
    if (!op_ok(ta) || !op_ok(tb) || m < 0 || n < 0 || k < 0 || batch < 0 || lda < (rows_a > 1 ? rows_a : 1) ||
        ldb < (rows_b > 1 ? rows_b : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    bool f32 = at == CUDA_R_32F && bt == CUDA_R_32F, bf16 = at == CUDA_R_16BF && bt == CUDA_R_16BF;
    if (!(f32 || bf16) || ct != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}

} // namespace

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t *handle) {
    *handle = new cublasContext();
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t s) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t *s) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    *s = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t st) {
    switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    }
    return "unknown error";
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m,
                                          int n, int k, const void *alpha, const void *A, cudaDataType at, int lda,
                                          long long stride_a, const void *B, cudaDataType bt, int ldb,
                                          long long stride_b, const void *beta, void *C, cudaDataType ct, int ldc,
                                          long long stride_c, int batch, cublasComputeType_t compute,
                                          cublasGemmAlgo_t algo) {
    cublasStatus_t st = gemm_check(handle, ta, tb, m, n, k, at, lda, bt, ldb, ct, ldc, compute, batch);
    if (st != CUBLAS_STATUS_SUCCESS || m == 0 || n == 0 || batch == 0)
        return st;
    if (cudaDeviceSynchronize() != cudaSuccess) // a kernel fault is sticky: the device is gone
        return CUBLAS_STATUS_EXECUTION_FAILED;
    float *pa = (float *)malloc((size_t)m * k * sizeof(float) + 1);
    float *pb = (float *)malloc((size_t)n * k * sizeof(float) + 1);
    if (!pa || !pb) {
        free(pa);
        free(pb);
        return CUBLAS_STATUS_ALLOC_FAILED;
    }
    size_t esize = at == CUDA_R_32F ? 4 : 2;
    for (int b = 0; b < batch; b++)
        gemm_ref(ta != CUBLAS_OP_N, tb != CUBLAS_OP_N, m, n, k, *(const float *)alpha,
                 (const char *)A + b * stride_a * esize, at, lda, (const char *)B + b * stride_b * esize, ldb,
                 *(const float *)beta, (float *)C + b * stride_c, ldc, pa, pb);
    free(pa);
    free(pb);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt,
                            int ldb, const void *beta, void *C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo) {
    return cublasGemmStridedBatchedEx(handle, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc,
                                      0, 1, compute, algo);
}

} // extern "C"
