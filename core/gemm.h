// Dense fp32 matrix multiply, row-major: C = alpha * op(A) * op(B) + beta * C, with op(A) (M, K) and
// op(B) (K, N). OpenBLAS when built with BLAS=1, else a blocked OpenMP kernel (the runtime library
// must build without BLAS). Call from outside OpenMP parallel regions.
#ifndef CORE_GEMM_H
#define CORE_GEMM_H

void gemm_f32(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc);

#endif
