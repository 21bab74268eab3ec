// The products of a Weight (quant/quant.h): quant_matmul_decode (1 <= N <= 8 input rows; fp32 up to
// QUANT_BATCH_MAX_N), weight_matmul_forward and weight_matmul_backward_input, which choose between the SIMD
// decode kernels, the int8 prefill and sgemm over rows widened to fp32; quant_tile; the portable decode path; and
// which SIMD kernels this process runs.
//
// The portable path (the reference every kernel is tested against): a row in a float format is used in place,
// other rows are widened to fp32 a tile at a time into the caller's scratch (the format's dequant_row), then dotted
// 8 columns at a time with GCC's generic vector type (AVX2 or AVX-512 under -march=native here, SSE2 in a portable
// x86 build, NEON on aarch64). fp32 weights take up to QUANT_BATCH_MAX_N rows: a block of weight rows passes over
// the inputs 8 at a time while it is in cache, each output summed as for one row alone (past 8 rows the product is
// bound by the multiply-adds, which this kernel does faster than sgemm here).
//
// The SIMD kernels (quant/qkernel.c, quant/qkernel_blocks.c, quant/qkernel_neon.c) are reached through one table,
// QkKernels (quant/qkernel.h), picked at the first product from what the CPU has (simd_pick below): on x86 the
// Makefile compiles the kernel files once for AVX512-VNNI and once for AVX2 + FMA + F16C whatever ARCH says, so
// that one binary runs the best kernels of any x86-64 CPU, and a CPU with neither runs the portable path.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/gemm.h"
#include "core/threads.h"
#include "quant/blocks.h"
#include "quant/qkernel.h"
#include "quant/quant.h"

// ---- which kernels run ----

#if defined(__x86_64__)
#include <cpuid.h>

// The CPU's features (CPUID leaves 1 and 7) that the OS also saves the registers of (XGETBV: the AVX state, and
// the AVX-512 opmask and upper registers).
static int cpu_has_avx2(void) {
    unsigned a, b, c, d, lo, hi;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !(c & bit_FMA) || !(c & bit_F16C))
        return 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 0x6) == 0x6 && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_AVX2);
}

static int cpu_has_avx512_vnni(void) {
    unsigned a, b, c, d, lo, hi;
    if (!cpu_has_avx2())
        return 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    const unsigned need = bit_AVX512F | bit_AVX512DQ | bit_AVX512BW | bit_AVX512VL;
    return (lo & 0xe6) == 0xe6 && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & need) == need &&
           (c & bit_AVX512VNNI);
}
#endif

static const QkKernels *simd_kernels; // NULL: the portable path
static char simd_name[160] = "portable";
static pthread_once_t simd_once = PTHREAD_ONCE_INIT;

// The best kernels this CPU runs, or those ER_SIMD names (portable, avx2, avx512 on x86; portable, neon on
// aarch64): one the CPU lacks or an unknown name gives the portable path, and quant_simd_name says why.
static void simd_pick(void) {
    const char *want = getenv("ER_SIMD");
    want = want && want[0] ? want : NULL;
    const QkKernels *k = NULL;
#if defined(__x86_64__)
    if (cpu_has_avx512_vnni() && (!want || !strcmp(want, "avx512")))
        k = &qk_kernels_avx512;
    else if (cpu_has_avx2() && (!want || !strcmp(want, "avx2")))
        k = &qk_kernels_avx2;
#elif defined(__aarch64__)
    if (!want || !strcmp(want, "neon"))
        k = &qk_kernels;
#endif
    simd_kernels = k;
    if (k)
        snprintf(simd_name, sizeof simd_name, "%s", k->name());
    else if (want && strcmp(want, "portable"))
        snprintf(simd_name, sizeof simd_name, "portable (ER_SIMD=%.40s: no such kernels on this CPU)", want);
}

static const QkKernels *kernels(void) {
    pthread_once(&simd_once, simd_pick);
    return simd_kernels;
}

int quant_has_simd(void) { return kernels() != NULL; }

const char *quant_simd_name(void) {
    kernels();
    return simd_name;
}

QuantDecodeFn quant_simd_decode(WeightFormat f) {
    const QkKernels *k = kernels();
    return k && f >= 0 && f < WF_COUNT ? k->decode[f] : NULL;
}

int quant_dequant_row_simd(float *dst, const Weight *w, int r) {
    const QkKernels *k = kernels();
    return k && k->dequant_row ? k->dequant_row(dst, w, r) : 0;
}

size_t quant_scratch_floats(int max_cols) { return (size_t)QUANT_TILE_ROWS * (size_t)(max_cols > 0 ? max_cols : 0); }

// ---- the portable decode path ----

typedef gemm_v8f v8f;
#define LOAD8 GEMM_LOAD8


// acc[n] += w[k] * x_n[k] over k0 <= k < k1 (a multiple of 8 apart) in 8 lanes, for n < N (N a compile-time
// constant after inlining), one weight load serving the N rows (x_n at inp + n * K).
static inline __attribute__((always_inline)) void dot_rows_part(v8f *acc_io, const float *w, const float *inp, int K,
                                                                int k0, int k1, const int N) {
    v8f acc[QUANT_DECODE_MAX_N];
#pragma GCC unroll 8
    for (int n = 0; n < N; n++)
        acc[n] = acc_io[n];
    for (int k = k0; k < k1; k += 8) {
        v8f wv, xv;
        LOAD8(wv, w + k);
#pragma GCC unroll 8
        for (int n = 0; n < N; n++) {
            LOAD8(xv, inp + (size_t)n * K + k);
            acc[n] += wv * xv;
        }
    }
#pragma GCC unroll 8
    for (int n = 0; n < N; n++)
        acc_io[n] = acc[n];
}

// out[n * R + r] = the lanes of acc[n] plus the columns past the last multiple of 8: each dot summed exactly as
// gemm_dot_f32 sums (core/gemm.h).
static inline __attribute__((always_inline)) void dot_rows_end(float *out, int R, int r, const v8f *acc,
                                                               const float *w, const float *inp, int K, const int N) {
    float s[QUANT_DECODE_MAX_N];
    int n = 0;
    for (; n + 4 <= N; n += 4)
        gemm_lanes_sum4(acc + n, s + n);
    for (; n < N; n++)
        s[n] = gemm_lanes_sum(&acc[n]);
    for (n = 0; n < N; n++) {
        for (int j = K & ~7; j < K; j++)
            s[n] += w[j] * inp[(size_t)n * K + j];
        out[(size_t)n * R + r] = s[n];
    }
}

// Rows r0 .. r0 + nr - 1 (nr <= QK_TILE_ROWS; row r0 + i at W + i * K) of an fp32 weight against the N
// inputs, `tile` columns of every row at a time (a multiple of 8, or the whole row). dot_f32 takes the inputs
// (up to 8 per pass, the block's rows then read back from cache for the next 8) over whole rows when they all
// fit in L1 beside the weight stream (one row per block), otherwise
//   - K <= QK_SPLIT_COLS: the inputs in groups of 4 over the block, whose rows the second group reads back
//     from L2 (8 rows of 896 inputs are 28 KiB, more than L1 keeps while the weights stream past);
//   - wider (the 4864-wide down projection): QK_TILE_COLS columns of every row of the block at a time, the
//     partial sums kept in memory between tiles.
// The same sums in the same order either way.
#define QK_SPLIT_COLS 2048
#define QK_TILE_ROWS 16
#define QK_TILE_COLS 128
static inline __attribute__((always_inline)) void dot_block(float *out, int R, int r0, int nr, const float *W,
                                                            const float *inp, int K, int tile, const int N) {
    v8f acc[QK_TILE_ROWS][QUANT_DECODE_MAX_N];
    int K8 = K & ~7;
    for (int i = 0; i < nr; i++)
#pragma GCC unroll 8
        for (int n = 0; n < N; n++)
            acc[i][n] = (v8f){0};
    for (int k0 = 0; k0 < K8; k0 += tile)
        for (int i = 0; i < nr; i++)
            dot_rows_part(acc[i], W + (size_t)i * K, inp, K, k0, k0 + tile < K8 ? k0 + tile : K8, N);
    for (int i = 0; i < nr; i++)
        dot_rows_end(out, R, r0 + i, acc[i], W + (size_t)i * K, inp, K, N);
}

static void dot_block_n(float *out, int R, int r0, int nr, const float *W, const float *inp, int K, int tile,
                        int N) {
    switch (N) {
    case 1: dot_block(out, R, r0, nr, W, inp, K, tile, 1); break;
    case 2: dot_block(out, R, r0, nr, W, inp, K, tile, 2); break;
    case 3: dot_block(out, R, r0, nr, W, inp, K, tile, 3); break;
    case 4: dot_block(out, R, r0, nr, W, inp, K, tile, 4); break;
    case 5: dot_block(out, R, r0, nr, W, inp, K, tile, 5); break;
    case 6: dot_block(out, R, r0, nr, W, inp, K, tile, 6); break;
    case 7: dot_block(out, R, r0, nr, W, inp, K, tile, 7); break;
    default: dot_block(out, R, r0, nr, W, inp, K, tile, 8); break;
    }
}

// out (N, R) = inp (N, K) · Wᵀ for fp32 W: blocks of rows as dot_block says.
static void dot_f32(float *out, const float *W, const float *inp, int R, int K, int N) {
    int fits = (size_t)N * K * sizeof(float) <= QK_L1_INPUTS, split = !fits && K <= QK_SPLIT_COLS;
    int G = split ? 4 : N < QUANT_DECODE_MAX_N ? N : QUANT_DECODE_MAX_N; // inputs per pass over a block
    int tile = fits || split ? K & ~7 : QK_TILE_COLS;       // columns per pass
    int RB = fits ? 1 : split ? (int)(2 * QK_L1_INPUTS / ((size_t)K * sizeof(float))) : QK_TILE_ROWS;
    RB = RB < 1 ? 1 : RB > QK_TILE_ROWS ? QK_TILE_ROWS : RB;
#pragma omp parallel for schedule(static) if ((long)R * K * N >= THREADS_MIN_WORK)
    for (int r0 = 0; r0 < R; r0 += RB)
        for (int n0 = 0; n0 < N; n0 += G)
            dot_block_n(out + (size_t)n0 * R, R, r0, R - r0 < RB ? R - r0 : RB, W + (size_t)r0 * K,
                        inp + (size_t)n0 * K, K, tile, N - n0 < G ? N - n0 : G);
}

// Row r (at w) alone, whole.
static void dot_rows_n(float *out, int R, int r, const float *w, const float *inp, int K, int N) {
    dot_block_n(out, R, r, 1, w, inp, K, K & ~7, N);
}

// The most rows the decode kernels take for a weight of this format.
static int decode_max_n(WeightFormat fmt) { return fmt == WF_F32 ? QUANT_BATCH_MAX_N : QUANT_DECODE_MAX_N; }

static int check_decode(const Weight *w, int N, const float *scratch) {
    if (N < 1 || N > decode_max_n(w->fmt))
        return er_error(ER_EINVAL, "quant_matmul_decode: N = %d outside 1..%d for a %s weight", N,
                        decode_max_n(w->fmt), weight_format_name(w->fmt));
    if (!scratch && w->fmt != WF_F32)
        return er_error(ER_EINVAL, "quant_matmul_decode: a %s weight needs a scratch of quant_scratch_floats(%d) floats",
                        weight_format_name(w->fmt), w->cols);
    return ER_OK;
}

int quant_matmul_decode_portable(float *out, const float *inp, const Weight *w, int N, float *scratch) {
    ER_TRY(check_decode(w, N, scratch));
    int R = w->rows, K = w->cols;
    if (w->fmt == WF_F32) {
        dot_f32(out, (const float *)w->data, inp, R, K, N);
        return ER_OK;
    }
    for (int r0 = 0; r0 < R; r0 += QUANT_TILE_ROWS) {
        int nr = R - r0 < QUANT_TILE_ROWS ? R - r0 : QUANT_TILE_ROWS;
#pragma omp parallel for schedule(static) if ((long)nr * K * N >= THREADS_MIN_WORK)
        for (int i = 0; i < nr; i++) {
            float *row = scratch + (size_t)i * K;
            weight_row_f32(row, w, r0 + i);
            dot_rows_n(out, R, r0 + i, row, inp, K, N);
        }
    }
    return ER_OK;
}

// out (N, rows) += inp (N, cols) · Sᵀ, S the sparse corrections of a dense-and-sparse weight (the decode
// kernels compute the dense product only).
static void sparse_matmul(float *out, const float *inp, const Weight *w, int N) {
    if (!w->sparse)
        return;
    int R = w->rows, K = w->cols;
#pragma omp parallel for schedule(static) if ((long)R * w->sparse * N >= THREADS_MIN_WORK)
    for (int r = 0; r < R; r++) {
        const uint16_t *c = w->sp_cols + (size_t)r * w->sparse, *v = w->sp_vals + (size_t)r * w->sparse;
        for (int j = 0; j < w->sparse; j++) {
            float val = f16_to_f32(v[j]);
            for (int n = 0; n < N; n++)
                out[(size_t)n * R + r] += val * inp[(size_t)n * K + c[j]];
        }
    }
}

// The block formats: block g of the 16 rows of tile r0 / 16 at 16 * blocks_bytes * g in it (quant/blocks.h).
static int tile_blocks(Weight *w) {
    int K = w->cols, R = w->rows;
    size_t rb = weight_row_bytes(w->fmt, K), bb = (size_t)blocks_bytes(w->fmt), bytes = (size_t)R * rb;
    size_t nb = (size_t)K / (size_t)blocks_elems(w->fmt);
    uint8_t *t = er_alloc(bytes);
    if (!t)
        return er_error(ER_ENOMEM, "tiling a %d x %d %s weight: %zu bytes", R, K, weight_format_name(w->fmt), bytes);
    er_hint_huge_pages(t, bytes);
    const uint8_t *src = w->data;
#pragma omp parallel for schedule(static)
    for (int r0 = 0; r0 < R; r0 += QUANT_TILE)
        for (size_t g = 0; g < nb; g++) {
            const uint8_t *blk[QUANT_TILE];
            for (int i = 0; i < QUANT_TILE; i++)
                blk[i] = src + (size_t)(r0 + i) * rb + bb * g;
            blocks_tile(t + (size_t)r0 * rb + QUANT_TILE * bb * g, blk, w->fmt);
        }
    if (w->owned) {
        memcpy((void *)w->data, t, bytes);
        er_free(t);
    } else {
        w->data = w->owned = t;
    }
    w->tiled = 1;
    return 1;
}

int quant_tile(Weight *w) {
    int K = w->cols, R = w->rows, grouped = w->fmt == WF_Q4G;
    const QkKernels *k = kernels();
    if (!k || !k->tiles || w->tiled || w->sparse || R % QUANT_TILE || K % 64 || K > QUANT_TILE_MAX_COLS)
        return 0;
    if (blocks_format(w->fmt))
        return tile_blocks(w);
    if (w->fmt != WF_Q4 && w->fmt != WF_Q8 && !(grouped && w->group == 32))
        return 0;
    size_t rb = weight_row_bytes(w->fmt, K), cb = w->fmt == WF_Q8 ? 64 : 32, bytes = (size_t)R * rb;
    size_t ng = (size_t)K / 32, gbytes = grouped ? 2 * (size_t)R * ng : 0; // q4g: scales and zeros, fp16 each
    uint8_t *t = er_alloc(bytes + 2 * gbytes);
    if (!t)
        return er_error(ER_ENOMEM, "tiling a %d x %d %s weight: %zu bytes", R, K, weight_format_name(w->fmt),
                        bytes + 2 * gbytes);
    er_hint_huge_pages(t, bytes + 2 * gbytes);
    const uint8_t *src = w->data;
    uint32_t flip = w->fmt == WF_Q8 ? 0x80808080u : 0; // q8 stored plus 128
    // Bytes 4j .. 4j + 3 of row r0 + i's chunk c to 16c * cb + 64j + 4i in tile r0 / 16, written in order.
#pragma omp parallel for schedule(static)
    for (int r0 = 0; r0 < R; r0 += QUANT_TILE) {
        uint8_t *o = t + (size_t)r0 * rb;
        for (size_t c = 0; c < rb / cb; c++)
            for (size_t j = 0; j < cb / 4; j++)
                for (int i = 0; i < QUANT_TILE; i++, o += 4) {
                    uint32_t v;
                    memcpy(&v, src + (size_t)(r0 + i) * rb + cb * c + 4 * j, 4);
                    v ^= flip;
                    memcpy(o, &v, 4);
                }
    }
    uint16_t *gs = (uint16_t *)(t + bytes), *gz = (uint16_t *)(t + bytes + gbytes);
    for (int r = 0; grouped && r < R; r++)
        for (size_t g = 0; g < ng; g++) {
            size_t to = ((size_t)(r / QUANT_TILE) * ng + g) * QUANT_TILE + (size_t)(r % QUANT_TILE);
            gs[to] = w->gscale[(size_t)r * ng + g];
            gz[to] = w->gzero[(size_t)r * ng + g];
        }
    if (w->owned) { // the bytes back in the weight's own block (which may hold its scales too)
        memcpy((void *)w->data, t, bytes);
        if (grouped) {
            memcpy((void *)w->gscale, gs, gbytes);
            memcpy((void *)w->gzero, gz, gbytes);
        }
        er_free(t);
    } else {
        w->data = w->owned = t;
        if (grouped) {
            w->gscale = gs;
            w->gzero = gz;
        }
    }
    w->tiled = 1;
    return 1;
}

int quant_matmul_decode(float *out, const float *inp, const Weight *w, int N, float *scratch) {
    ER_TRY(check_decode(w, N, scratch));
    QuantDecodeFn decode = quant_simd_decode(w->fmt);
    if (decode) {
        int rc = decode(out, inp, w, N);
        if (rc == ER_OK)
            sparse_matmul(out, inp, w, N);
        if (rc != WEIGHT_DECODE_DECLINED)
            return rc;
    }
    return quant_matmul_decode_portable(out, inp, w, N, scratch);
}

// ---- the products ----

static void add_bias(float *out, const float *bias, int N, int rows) {
    if (!bias)
        return;
#pragma omp parallel for schedule(static) if ((long)N * rows >= THREADS_MIN_WORK)
    for (int n = 0; n < N; n++)
        for (int r = 0; r < rows; r++)
            out[(size_t)n * rows + r] += bias[r];
}

// Input rows per product that w's int8-input decode kernels take at once (up to QUANT_DECODE_MAX_N, fewer for rows
// wider than QK_ACT_BYTES / 8); 0 when w has none. Past the decode sizes these run the prompt too: integer dot
// products on the packed rows outrun sgemm over rows widened to fp32 several times over (docs/performance.md).
static int i8_rows(const Weight *w) {
    int n = QK_ACT_BYTES / w->cols;
    n = n > QUANT_DECODE_MAX_N ? QUANT_DECODE_MAX_N : n;
    if (n >= 1 && quant_simd_decode(w->fmt) && (qk_i8_takes(w, n) || blocks_format(w->fmt)))
        return n;
    return 0;
}

int weight_matmul_forward(float *out, const float *inp, const Weight *w, const float *bias, int N, float *scratch,
                          int flags) {
    int R = w->rows, K = w->cols, nc;
    const QkKernels *k = kernels();
    if (N <= decode_max_n(w->fmt)) {
        ER_TRY(quant_matmul_decode(out, inp, w, N, scratch));
    } else if ((flags & QUANT_INT8_PREFILL) && w->tiled && scratch) { // tiled: k has the prefill
        ER_TRY(k->prefill_tiles(out, inp, w, N, scratch));
    } else if ((flags & QUANT_INT8_PREFILL) && blocks_format(w->fmt) && scratch && k && k->prefill_blocks) {
        ER_TRY(k->prefill_blocks(out, inp, w, N, scratch));
    } else if ((flags & QUANT_INT8_PREFILL) && (nc = i8_rows(w)) > 0) { // nc input rows at a time
        for (int n0 = 0; n0 < N; n0 += nc)
            ER_TRY(quant_matmul_decode(out + (size_t)n0 * R, inp + (size_t)n0 * K, w, N - n0 < nc ? N - n0 : nc,
                                       scratch));
    } else if (weight_format_info(w->fmt)->gemm_in_place) {
        gemm_f32(0, 1, N, R, K, 1.0f, inp, K, (const float *)w->data, K, 0.0f, out, R);
    } else {
        if (!scratch)
            return er_error(ER_EINVAL, "weight_matmul_forward: a %s weight needs a scratch", weight_format_name(w->fmt));
        for (int r0 = 0; r0 < R; r0 += QUANT_TILE_ROWS) {
            int nr = R - r0 < QUANT_TILE_ROWS ? R - r0 : QUANT_TILE_ROWS;
            quant_dequant_rows(scratch, w, r0, nr);
            gemm_f32(0, 1, N, nr, K, 1.0f, inp, K, scratch, K, 0.0f, out + r0, R);
        }
    }
    add_bias(out, bias, N, R);
    return ER_OK;
}

int weight_matmul_backward_input(float *dinp, const float *dout, const Weight *w, int N, float *scratch) {
    int R = w->rows, K = w->cols;
    if (weight_format_info(w->fmt)->gemm_in_place) {
        gemm_f32(0, 0, N, K, R, 1.0f, dout, R, (const float *)w->data, K, 1.0f, dinp, K);
        return ER_OK;
    }
    if (!scratch)
        return er_error(ER_EINVAL, "weight_matmul_backward_input: a %s weight needs a scratch", weight_format_name(w->fmt));
    for (int r0 = 0; r0 < R; r0 += QUANT_TILE_ROWS) {
        int nr = R - r0 < QUANT_TILE_ROWS ? R - r0 : QUANT_TILE_ROWS;
        quant_dequant_rows(scratch, w, r0, nr);
        gemm_f32(0, 0, N, K, nr, 1.0f, dout + r0, R, scratch, K, 1.0f, dinp, K);
    }
    return ER_OK;
}

