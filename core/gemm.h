// Dense fp32 matrix multiply, row-major: C = alpha * op(A) * op(B) + beta * C, with op(A) (M, K) and
// op(B) (K, N). OpenBLAS when built with BLAS=1, else a blocked OpenMP kernel (the runtime library
// must build without BLAS). Call from outside OpenMP parallel regions.
#ifndef CORE_GEMM_H
#define CORE_GEMM_H

#include <stdint.h>
#include <string.h>

void gemm_f32(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc);

// The fp32 dot product of the project's own kernels: 8 lanes, lane l summing a[k] * b[k] for
// k = l (mod 8) in order, the lanes added pairwise, then the K % 8 tail in order. The decode kernels
// (quant/qkernel.c) and the built-in GEMM both sum this way, so without BLAS a row of a product is bit
// for bit the same whether its call had 1 row or 100 (the KV-sharing rule's bitwise test relies on it).
// With BLAS, fp32 weight products stay on the decode kernels up to QUANT_BATCH_MAX_N rows (quant/quant.h),
// so a row's bits are the same at every N up to there; past it sgemm rounds its own way.
// GCC's generic vector type: AVX here, whatever the target offers elsewhere. Vectors go through
// pointers: passing one by value changes the ABI on targets without AVX, which GCC warns about.
typedef float gemm_v8f __attribute__((vector_size(32)));
#define GEMM_LOAD8(dst, p) memcpy(&(dst), (p), sizeof(gemm_v8f))

static inline float gemm_lanes_sum(const gemm_v8f *v) {
    return (((*v)[0] + (*v)[1]) + ((*v)[2] + (*v)[3])) + (((*v)[4] + (*v)[5]) + ((*v)[6] + (*v)[7]));
}

// out[c] = gemm_lanes_sum(&v[c]) for c < 4, the same sums in the same order, by lane shuffles (two rounds of
// adjacent pairs, then the halves) instead of 28 lane extractions. GEMM_EVEN / GEMM_ODD pick lanes 0, 2, 4, 6
// / 1, 3, 5, 7 of each 4-lane half of a and b: (a0 a2 b0 b2 a4 a6 b4 b6) and (a1 a3 b1 b3 a5 a7 b5 b7). Clang
// (the fuzz build) spells GCC's __builtin_shuffle with constant indices.
typedef int32_t gemm_v8i __attribute__((vector_size(32)));
#if defined(__clang__)
#define GEMM_EVEN(a, b) __builtin_shufflevector(a, b, 0, 2, 8, 10, 4, 6, 12, 14)
#define GEMM_ODD(a, b) __builtin_shufflevector(a, b, 1, 3, 9, 11, 5, 7, 13, 15)
#else
#define GEMM_EVEN(a, b) __builtin_shuffle(a, b, (gemm_v8i){0, 2, 8, 10, 4, 6, 12, 14})
#define GEMM_ODD(a, b) __builtin_shuffle(a, b, (gemm_v8i){1, 3, 9, 11, 5, 7, 13, 15})
#endif
static inline void gemm_lanes_sum4(const gemm_v8f v[4], float out[4]) {
    // p01 = (v0[0]+v0[1], v0[2]+v0[3], v1[0]+v1[1], v1[2]+v1[3], then lanes 4-7 likewise), p23 the same
    gemm_v8f p01 = GEMM_EVEN(v[0], v[1]) + GEMM_ODD(v[0], v[1]);
    gemm_v8f p23 = GEMM_EVEN(v[2], v[3]) + GEMM_ODD(v[2], v[3]);
    // q[c] = (v_c[0]+v_c[1]) + (v_c[2]+v_c[3]), q[4 + c] the same of lanes 4-7
    gemm_v8f q = GEMM_EVEN(p01, p23) + GEMM_ODD(p01, p23);
    for (int c = 0; c < 4; c++)
        out[c] = q[c] + q[4 + c];
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
