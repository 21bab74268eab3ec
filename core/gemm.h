// Dense fp32 matrix multiply, row-major: C = alpha * op(A) * op(B) + beta * C, with op(A) (M, K) and
// op(B) (K, N). OpenBLAS when built with BLAS=1, else a blocked OpenMP kernel (the runtime library
// must build without BLAS). Call from outside OpenMP parallel regions.
#ifndef CORE_GEMM_H
#define CORE_GEMM_H

#include <string.h>

void gemm_f32(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc);

// The fp32 dot product of the project's own kernels: 8 lanes, lane l summing a[k] * b[k] for
// k = l (mod 8) in order, the lanes added pairwise, then the K % 8 tail in order. The decode kernels
// (quant/qkernel.c) and the built-in GEMM both sum this way, so without BLAS a row of a product is bit
// for bit the same whether its call had 1 row or 100 (the KV-sharing rule's bitwise test relies on it).
// GCC's generic vector type: AVX here, whatever the target offers elsewhere. Vectors go through
// pointers: passing one by value changes the ABI on targets without AVX, which GCC warns about.
typedef float gemm_v8f __attribute__((vector_size(32)));
#define GEMM_LOAD8(dst, p) memcpy(&(dst), (p), sizeof(gemm_v8f))

static inline float gemm_lanes_sum(const gemm_v8f *v) {
    return (((*v)[0] + (*v)[1]) + ((*v)[2] + (*v)[3])) + (((*v)[4] + (*v)[5]) + ((*v)[6] + (*v)[7]));
}

static inline float gemm_dot_f32(const float *a, const float *b, int K) {
    gemm_v8f acc = {0}, av, bv;
    int k = 0;
    for (; k + 8 <= K; k += 8) {
        GEMM_LOAD8(av, a + k);
        GEMM_LOAD8(bv, b + k);
        acc += av * bv;
    }
    float s = gemm_lanes_sum(&acc);
    for (; k < K; k++)
        s += a[k] * b[k];
    return s;
}

#endif
