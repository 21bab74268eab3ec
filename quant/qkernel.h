// The SIMD kernels of the quantized formats, reached through one table (QkKernels below) that quant/matmul.c picks
// at the first product from what the CPU has. On x86 the Makefile compiles quant/qkernel.c and
// quant/qkernel_blocks.c twice, for AVX2 + FMA + F16C and for AVX512-VNNI (QK_SUFFIX avx2 / avx512 names each
// copy's symbols apart: qk_kernels_avx2, qk_kernels_avx512); on aarch64 once, with quant/qkernel_neon.c (NEON,
// the dot-product extensions chosen inside: qk_kernels). Inside a kernel file the compiler's target macros say what
// it builds (QK_AVX2, QK_AVX512, QK_TILES, QK_GEMM_BLOCKS below). Only quant/ includes this; everyone else goes
// through quant_matmul_decode and weight_matmul_forward.
#ifndef QUANT_QKERNEL_H
#define QUANT_QKERNEL_H

#include <stdint.h>

#include "quant/quant.h"
#include "quant/weight.h"

#ifdef QK_SUFFIX // one x86 copy of the kernel files: its external names end in _avx2 or _avx512
#define QK_CAT2(a, b) a##_##b
#define QK_CAT(a, b) QK_CAT2(a, b)
#define qk_kernels QK_CAT(qk_kernels, QK_SUFFIX)
#define qk_decode_simd_q8 QK_CAT(qk_decode_simd_q8, QK_SUFFIX)
#define qk_decode_simd_q4 QK_CAT(qk_decode_simd_q4, QK_SUFFIX)
#define qk_decode_simd_q4g QK_CAT(qk_decode_simd_q4g, QK_SUFFIX)
#define qk_decode_simd_q2lut QK_CAT(qk_decode_simd_q2lut, QK_SUFFIX)
#define qk_decode_simd_q4lut QK_CAT(qk_decode_simd_q4lut, QK_SUFFIX)
#define qk_decode_simd_bf16 QK_CAT(qk_decode_simd_bf16, QK_SUFFIX)
#define qk_decode_simd_f16 QK_CAT(qk_decode_simd_f16, QK_SUFFIX)
#define qk_decode_simd_f32 QK_CAT(qk_decode_simd_f32, QK_SUFFIX)
#define qk_decode_simd_q8_0 QK_CAT(qk_decode_simd_q8_0, QK_SUFFIX)
#define qk_decode_simd_q4_0 QK_CAT(qk_decode_simd_q4_0, QK_SUFFIX)
#define qk_decode_simd_q4_1 QK_CAT(qk_decode_simd_q4_1, QK_SUFFIX)
#define qk_decode_simd_q5_0 QK_CAT(qk_decode_simd_q5_0, QK_SUFFIX)
#define qk_decode_simd_q5_1 QK_CAT(qk_decode_simd_q5_1, QK_SUFFIX)
#define qk_decode_simd_q4_k QK_CAT(qk_decode_simd_q4_k, QK_SUFFIX)
#define qk_decode_simd_q5_k QK_CAT(qk_decode_simd_q5_k, QK_SUFFIX)
#define qk_decode_simd_q6_k QK_CAT(qk_decode_simd_q6_k, QK_SUFFIX)
#define qk_decode_tiles QK_CAT(qk_decode_tiles, QK_SUFFIX)
#define qk_tile_blocks QK_CAT(qk_tile_blocks, QK_SUFFIX)
#define qk_tile_blocks_rows QK_CAT(qk_tile_blocks_rows, QK_SUFFIX)
#define qk_gemm_blocks QK_CAT(qk_gemm_blocks, QK_SUFFIX)
#define qk_dequant_row_simd QK_CAT(qk_dequant_row_simd, QK_SUFFIX)
#define qk_quant_block QK_CAT(qk_quant_block, QK_SUFFIX)
#define qk_acts_fill QK_CAT(qk_acts_fill, QK_SUFFIX)
#define qk_acts_fill_at QK_CAT(qk_acts_fill_at, QK_SUFFIX)
#endif

// One instruction set's kernels.
typedef struct {
    const char *(*name)(void); // what quant_simd_name says: "AVX2", "AVX512-VNNI", "NEON + dotprod ..."
    QuantDecodeFn decode[WF_COUNT]; // per format (the contract of quant_simd_decode); NULL: the portable path
    int tiles; // quant_tile re-lays q4, q8, q4g32 and the block formats 16 rows at a time for these kernels
    // out (N, rows) = inp (N, cols) · Wᵀ for any N on int8 inputs, scratch: quant_scratch_floats(cols) floats: a
    // tiled weight (non-NULL where tiles is) and an untiled block-format one (NULL: none).
    int (*prefill_tiles)(float *out, const float *inp, const Weight *w, int N, void *scratch);
    int (*prefill_blocks)(float *out, const float *inp, const Weight *w, int N, void *scratch);
    // Row r as fp32, bit for bit weight_row_f32's dense part, for the GEMM path's tiles; 0 (nothing written) for a
    // weight it does not take. NULL: none.
    int (*dequant_row)(float *dst, const Weight *w, int r);
} QkKernels;

#if defined(__x86_64__) && !defined(QK_SUFFIX)
extern const QkKernels qk_kernels_avx2, qk_kernels_avx512;
#else
extern const QkKernels qk_kernels;
#endif

// Asks for the cache line at address a into all cache levels; a may lie past the end of the weight (the
// last block's "next block"): a prefetch never faults, and an integer address is no out-of-bounds pointer.
// (GCC 12 emitted nothing for _mm_prefetch through this function.)
static inline void qk_prefetch(uintptr_t a) { __builtin_prefetch((const void *)a, 0, 3); }

// CALL(args..., N) with the caller's N switched into a constant 1..8.
#define QK_SWITCH_N(CALL, ...)                                                                             \
    switch (N) {                                                                                           \
    case 1: CALL(__VA_ARGS__, 1); break;                                                                   \
    case 2: CALL(__VA_ARGS__, 2); break;                                                                   \
    case 3: CALL(__VA_ARGS__, 3); break;                                                                   \
    case 4: CALL(__VA_ARGS__, 4); break;                                                                   \
    case 5: CALL(__VA_ARGS__, 5); break;                                                                   \
    case 6: CALL(__VA_ARGS__, 6); break;                                                                   \
    case 7: CALL(__VA_ARGS__, 7); break;                                                                   \
    default: CALL(__VA_ARGS__, 8); break;                                                                  \
    }

#define QK_L1_INPUTS 16384 // bytes of decode inputs that stay in L1 beside the weight stream
#define QK_ACT_BYTES 40960 // N * cols codes on the caller's stack: cols up to 5120 at N = 8
// 1 when the int8-activation kernels take w at N input rows: q8, q4 or q4g with groups of 32 or a multiple of 64
// (64, 128: a chunk of 64 inputs lies in one group), cols a multiple of 64 and N * cols <= QK_ACT_BYTES.
static inline int qk_i8_takes(const Weight *w, int N) {
    if ((size_t)N * (size_t)w->cols > QK_ACT_BYTES || w->cols % 64)
        return 0;
    return w->fmt == WF_Q8 || w->fmt == WF_Q4 || (w->fmt == WF_Q4G && (w->group == 32 || w->group % 64 == 0));
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QK_SIMD 1
// out (N, rows) = inp (N, cols) · Wᵀ for 1 <= N <= QUANT_DECODE_MAX_N, w in the kernel's format.
// The q4g kernel declines (WEIGHT_DECODE_DECLINED) a group that is not a multiple of 16. q8, q4 and q4g (as
// qk_i8_takes says) round the inputs to int8 (per 32, half a step of max|x| / 127 at most).
int qk_decode_simd_q8(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_q4(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_q4g(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_q2lut(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_q4lut(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_bf16(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_f16(float *out, const float *inp, const Weight *w, int N);
// The GGUF block formats (quant/qkernel_blocks.c): int8 inputs as for q8 above, cols up to QK_ACT_BYTES.
int qk_decode_simd_q8_0(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_q4_0(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_q4_1(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_q5_0(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_q5_1(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_q4_k(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_q5_k(float *out, const float *inp, const Weight *w, int N);
int qk_decode_simd_q6_k(float *out, const float *inp, const Weight *w, int N);
#define QK_DECODE(name) qk_decode_simd_##name
#define QK_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
// Prefill of the block formats (quant/qkernel_blocks.c): out (N, rows) = inp (N, cols) · Wᵀ for any N on int8
// inputs, 16 input rows per register; scratch: quant_scratch_floats(cols) floats.
#define QK_GEMM_BLOCKS 1
int qk_gemm_blocks(float *out, const float *inp, const Weight *w, int N, void *scratch);
#endif
#include <immintrin.h>
// Σ u * x over 32 byte pairs, u unsigned (< 128), x signed, as 8 int32 lanes (each the sum of 4 pairs), added to acc.
static inline __m256i qk_dot_u8(__m256i acc, __m256i u, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, x);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
#endif
}
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
// The tiled kernels (q4, q8, q4g32 in quant/qkernel.c, the block formats in quant/qkernel_blocks.c), on weights
// quant_tile laid out; make TILES=0 keeps the kernels and tiles nothing.
#ifdef ER_NO_TILES
#define QK_TILES 0
#else
#define QK_TILES 1
#endif
// The tiles ask for their bytes QK_TILE_PREFETCH ahead (a thread's tiles are one contiguous run): the hardware
// prefetcher alone leaves the loads waiting, at every N (one stream of the 0.5B shape steps 15-30% faster with it).
// 16 KiB ahead pays more than 1-4 KiB.
#define QK_TILE_PREFETCH 16384
// Smaller tiled products run on one thread: handing half of one to a second thread (the region, and the inputs
// crossing to the other core) costs more than the half saved below about 192 KiB of weights (896-column q4:
// between 384 and 512 rows; the 0.5B shape's k and v projections are 128 rows, 57 KB).
#define QK_TILES_PARALLEL_BYTES (192 << 10)
// N <= 8 input rows quantized for the tiled kernels: codes q, scales dv, fp32 block sums xs and row sums xsum laid out
// as QkActs's fields (below), and the integer offset sums z of the formats whose codes are stored offset (q8, q8_0:
// plus 128; q6_K: plus 32), quant/qkernel.c's qk_in_fill.
typedef struct {
    const int8_t *q;
    const float *dv, *xs, *xsum;
    const int32_t *z;
} QkIn;
// out (N, rows) = inp (N, cols) · Wᵀ on a tiled weight (any tiled format), 1 <= N <= QUANT_DECODE_MAX_N.
int qk_decode_tiles(float *out, const float *inp, const Weight *w, int N);
// Tile r0 / 16 of a tiled block-format weight against the N <= 8 inputs: out[n * R + r0 + i] (quant/qkernel_blocks.c).
void qk_tile_blocks(float *out, int R, int r0, const Weight *w, const QkIn *in, int N);
// The same against np input rows quantized in groups of 8 (group k at in->q + 8 k cols, in->dv + k cols, in->xs +
// k cols / 4, in->z + k cols / 2), each sub-block of the tile unpacked once for all: the prefill's. acc: np * 16 floats.
void qk_tile_blocks_rows(float *out, int R, int r0, const Weight *w, const QkIn *in, int np, float *acc);
// acc + Σ u * x per int32 lane, the 4 input codes at x broadcast to every lane from memory (GCC 12 loads a
// _mm512_set1_epi32 into a register first: one more instruction per vpdpbusd).
static inline __m512i qk_dpbusd_bcst(__m512i acc, __m512i u, const int32_t *x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*x));
    return acc;
}
#endif
#if defined(__AVX512F__) && defined(__AVX512DQ__)
// fp32 (and bf16) with AVX-512: two weight rows per 16-lane register, bit for bit the portable path.
#define QK_AVX512 1
int qk_decode_simd_f32(float *out, const float *inp, const Weight *w, int N);
#define QK_DECODE_F32 qk_decode_simd_f32
#endif
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
// The GGUF block formats (quant/qkernel_blocks.c).
int qk_decode_neon_q8_0(float *out, const float *inp, const Weight *w, int N);
int qk_decode_neon_q4_0(float *out, const float *inp, const Weight *w, int N);
int qk_decode_neon_q4_1(float *out, const float *inp, const Weight *w, int N);
int qk_decode_neon_q5_0(float *out, const float *inp, const Weight *w, int N);
int qk_decode_neon_q5_1(float *out, const float *inp, const Weight *w, int N);
int qk_decode_neon_q4_k(float *out, const float *inp, const Weight *w, int N);
int qk_decode_neon_q5_k(float *out, const float *inp, const Weight *w, int N);
int qk_decode_neon_q6_k(float *out, const float *inp, const Weight *w, int N);
#define QK_DECODE(name) qk_decode_neon_##name
#else
#define QK_SIMD 0
#define QK_DECODE(name) NULL
#endif

#ifndef QK_DECODE_F32 // elsewhere fp32 weights go to the portable path (nothing to unpack)
#define QK_DECODE_F32 NULL
#endif

#if QK_SIMD
// int8 activations (the q8, q4 and q4g kernels of both CPUs, W8A8 / W4A8 like llama.cpp's CPU path):
// the N input rows quantized once per product, one scale per 32 inputs (max|x| / 127, codes rounded to
// nearest), by one portable routine, so that x86 and aarch64 get the same codes and, the integer dot
// products being exact, the same products up to the order of the fp32 block sums. Each chunk of 64 inputs
// (blocks 2c, 2c+1) is stored in the order the kernels read it:
//   - QK_ORDER_Q4: 4-bit rows (quant/weight.h): 32 bytes hold 64 codes, their low nibbles elements 0-7,
//     16-23, 32-39, 48-55 and their high nibbles 8-15, 24-31, 40-47, 56-63, so the inputs go in that order
//     and the codes need only a mask and a shift;
//   - QK_ORDER_Q8: elements 0-15 and 32-47 of the row in one 32-byte register, 16-31 and 48-63 in another;
//   - QK_ORDER_Q4_TILES, QK_ORDER_Q8_TILES: for the tiled kernels, chunk-major: chunk c of input n at
//     q + 64 * (c * N + n), its scales at dv + 8 * (c * N + n); each chunk in QK_ORDER_Q4's order (q4) or in
//     the row's (q8).
typedef enum { QK_ORDER_Q4, QK_ORDER_Q8, QK_ORDER_Q4_TILES, QK_ORDER_Q8_TILES } QkOrder;

typedef struct {
    int8_t q[QK_ACT_BYTES];         // (N, K) input codes, each chunk of 64 in the kernel's order (above)
    float dv[QK_ACT_BYTES / 8];     // (N, K / 64, 8) the scales of blocks 2c, 2c+1 four times each (see above)
    float xs[QK_ACT_BYTES / 32];    // (N, K / 32) the fp32 sum of each block's inputs (q4g's zeros)
    float xsum[QUANT_DECODE_MAX_N]; // (N) the sum of each input row (q4's -8)
} QkActs;

// q4g with groups of G > 32: the N input rows' block sums xs (N, K / 32) folded in place into group sums, the first
// K / G of each row's (what the groups' zeros multiply; groups of 32 are the blocks already).
static inline void qk_group_sums(float *xs, int K, int N, int G) {
    for (int n = 0; G > 32 && n < N; n++) {
        float *x = xs + (size_t)n * (K / 32);
        for (int g = 0; g < K / G; g++) { // reads blocks g * G / 32 on, past the sums written so far
            float t = 0.0f;
            for (int b = g * (G / 32); b < (g + 1) * (G / 32); b++)
                t += x[b];
            x[g] = t;
        }
    }
}
// The N input rows (N, K), K a multiple of 64, as codes and scales in the order given.
void qk_acts_fill(QkActs *a, const float *inp, int K, int N, QkOrder order);
// The same into arrays laid out as QkActs's fields: codes (N * K), scales (N * K / 8), sums (N * K / 32), xsum (N).
void qk_acts_fill_at(int8_t *codes, float *scales, float *sums, float *xsum, const float *inp, int K, int N,
                     QkOrder order);
// 32 inputs x as int8 codes (elements 8j .. 8j + 7 at q + at[j]), their scale *d = max|x| / 127 and fp32 sum *xs
// (the rounding qk_acts_fill applies to every block).
void qk_quant_block(int8_t *q, const int at[4], float *d, float *xs, const float *x);
#endif

#endif
