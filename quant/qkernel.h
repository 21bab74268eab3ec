// The SIMD decode kernels the format table (quant/weight.c) points at, one per format that has one,
// built where the compiler targets AVX2 + FMA + F16C; elsewhere the table holds NULL and the portable
// path runs. Only quant/ includes this; everyone else goes through quant_matmul_decode.
#ifndef QUANT_QKERNEL_H
#define QUANT_QKERNEL_H

#include "quant/weight.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QK_SIMD 1
// out (N, rows) = inp (N, cols) · Wᵀ for 1 <= N <= QUANT_DECODE_MAX_N, w in the kernel's format.
// The q4g kernel declines (WEIGHT_DECODE_DECLINED) a group that is not a multiple of 16.
int qk_decode_simd_q8(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_q4(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_q4g(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_q2lut(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_q4lut(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_bf16(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_f16(float *out, const float *inp, const Weight *w, int N);
#define QK_DECODE(name) qk_decode_simd_##name
#else
#define QK_SIMD 0
#define QK_DECODE(name) NULL
#endif

#endif
