// The SIMD decode kernels the format table (quant/weight.c) points at, one per format that has one,
// built where the compiler targets AVX2 + FMA + F16C (quant/qkernel.c) or aarch64 (NEON,
// quant/qkernel_neon.c); elsewhere the table holds NULL and the portable path runs. Only quant/ includes this; everyone else goes through quant_matmul_decode.
#ifndef QUANT_QKERNEL_H
#define QUANT_QKERNEL_H

#include "quant/weight.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QK_SIMD 1
// out (N, rows) = inp (N, cols) · Wᵀ for 1 <= N <= QUANT_DECODE_MAX_N, w in the kernel's format.
// The q4g kernel declines (WEIGHT_DECODE_DECLINED) a group that is not a multiple of 16. q8, q4 and q4g32
// with cols a multiple of 64 round the inputs to int8 (per 32, half a step of max|x| / 127 at most).
int qk_decode_simd_q8(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_q4(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_q4g(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_q2lut(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_q4lut(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_bf16(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_f16(float *out, const float *inp, const Weight *w, int N);
#define QK_DECODE(name) qk_decode_simd_##name
#define QK_AVX2 1
// Row r as fp32 for the GEMM path's tiles, bit for bit weight_row_f32's, for q8, q4 and q4g (group a
// multiple of 16); returns 0, writing nothing, for any other weight.
int qk_dequant_row_simd(float *dst, const Weight *w, int r);
#elif defined(__aarch64__)
#define QK_SIMD 1
// The same contract as the AVX2 kernels above (q4g declines a group that is not a multiple of 16).
int qk_decode_neon_q8(float *out, const float *inp, const Weight *w, int N);
int qk_decode_neon_q4(float *out, const float *inp, const Weight *w, int N);
int qk_decode_neon_q4g(float *out, const float *inp, const Weight *w, int N);
int qk_decode_neon_q2lut(float *out, const float *inp, const Weight *w, int N);
int qk_decode_neon_q4lut(float *out, const float *inp, const Weight *w, int N);
int qk_decode_neon_bf16(float *out, const float *inp, const Weight *w, int N);
int qk_decode_neon_f16(float *out, const float *inp, const Weight *w, int N);
// "NEON", plus the dot-product extensions the CPU reports (getauxval), for quant_simd_name.
const char *qk_neon_features(void);
#define QK_DECODE(name) qk_decode_neon_##name
#else
#define QK_SIMD 0
#define QK_DECODE(name) NULL
#endif

#endif
