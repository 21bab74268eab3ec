#include "core/gemm.h"

#ifdef ER_BLAS
#include <cblas.h>

void gemm_f32(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
                alpha, A, lda, B, ldb, beta, C, ldc);
}

#else

// Built-in kernel: rows of C in parallel; for each row, K blocked so a panel of B stays in cache.
// op(B) is read row by row (k, :) so the inner loop is a contiguous axpy the compiler vectorises.
void gemm_f32(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
    if (trans_b) {
        // C[i, j] = sum_k A[i, k] B[j, k]: dot products over contiguous rows of B, summed as the
        // decode kernels sum (gemm_dot_f32).
#pragma omp parallel for schedule(static)
        for (int i = 0; i < M; i++) {
            float *c = C + (long)i * ldc;
            for (int j = 0; j < N; j++) {
                const float *b = B + (long)j * ldb;
                float acc = 0.0f;
                if (trans_a)
                    for (int k = 0; k < K; k++)
                        acc += A[(long)k * lda + i] * b[k];
                else
                    acc = gemm_dot_f32(A + (long)i * lda, b, K);
                c[j] = beta == 0.0f ? (alpha == 1.0f ? acc : alpha * acc) : alpha * acc + beta * c[j];
            }
        }
        return;
    }
#pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++) {
        float *c = C + (long)i * ldc;
        for (int j = 0; j < N; j++)
            c[j] = beta == 0.0f ? 0.0f : beta * c[j];
        for (int k0 = 0; k0 < K; k0 += 256) {
            int k1 = k0 + 256 < K ? k0 + 256 : K;
            for (int k = k0; k < k1; k++) {
                float a = alpha * (trans_a ? A[(long)k * lda + i] : A[(long)i * lda + k]);
                const float *b = B + (long)k * ldb;
                for (int j = 0; j < N; j++)
                    c[j] += a * b[j];
            }
        }
    }
}

#endif
