// Every matmul path of every format against dequantize-then-multiply in double: the decode kernels
// (N = 1..8; SIMD and portable; fp32 up to QUANT_BATCH_MAX_N), the tile + GEMM path (N = 33, more rows than
// one tile; fp32 past QUANT_BATCH_MAX_N), the backward through a frozen quantized weight, and that backward
// against finite differences.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/threads.h"
#include "quant/blocks.h"
#include "quant/quant.h"

// A weight with random codes, scales, zeros and codebooks (every code value shows up), and `sparse`
// random corrections per row (codebook formats; columns may repeat).
static void random_weight(Weight *w, WeightFormat f, int R, int K, int group, int sparse, uint64_t seed) {
    cr_assert_eq(quant_weight_alloc(w, f, R, K, group, sparse), 0, "%s", er_last_error());
    ErRng r;
    rng_seed(&r, seed);
    for (int i = 0; i < R * sparse; i++) {
        ((uint16_t *)w->sp_cols)[i] = (uint16_t)rng_below(&r, (uint64_t)K);
        ((uint16_t *)w->sp_vals)[i] = f32_to_f16(rng_normal(&r) * 0.5f);
    }
    size_t nb = (size_t)R * weight_row_bytes(f, K);
    uint8_t *d = (uint8_t *)w->data;
    for (size_t i = 0; i < nb; i++)
        d[i] = (uint8_t)rng_below(&r, 256);
    if (f == WF_Q8)
        for (size_t i = 0; i < nb; i++)
            if (d[i] == 0x80)
                d[i] = 0x81; // -128 is not a code
    if (f == WF_Q8 || f == WF_Q4)
        for (int i = 0; i < R; i++)
            ((float *)w->scale)[i] = 0.01f + 0.05f * rng_uniform(&r);
    if (f == WF_Q4G)
        for (int i = 0; i < R * (K / group); i++) {
            ((uint16_t *)w->gscale)[i] = f32_to_f16(0.01f + 0.05f * rng_uniform(&r));
            ((uint16_t *)w->gzero)[i] = f32_to_f16(-0.4f + 0.1f * rng_uniform(&r));
        }
    if (f == WF_Q2LUT || f == WF_Q4LUT)
        for (int i = 0; i < R * (f == WF_Q2LUT ? 4 : 16); i++)
            ((uint16_t *)w->lut)[i] = f32_to_f16(rng_normal(&r) * 0.3f);
    // Block formats: random codes and sub-block scales, sane fp16 block scales (and mins) in place of random bits.
    if (blocks_format(f)) {
        static const struct {
            WeightFormat f;
            int at[2];
        } scales[] = {{WF_Q8_0, {0, -1}}, {WF_Q4_0, {0, -1}}, {WF_Q4_1, {0, 2}}, {WF_Q5_0, {0, -1}},
                      {WF_Q5_1, {0, 2}},  {WF_Q4_K, {0, 2}},  {WF_Q5_K, {0, 2}}, {WF_Q6_K, {208, -1}}};
        size_t B = (size_t)blocks_bytes(f);
        for (size_t b = 0; b < nb / B; b++)
            for (int i = 0; i < (int)(sizeof scales / sizeof scales[0]); i++)
                for (int j = 0; j < 2 && scales[i].f == f; j++)
                    if (scales[i].at[j] >= 0) { // d: 1e-3 .. 5e-3 (x 6-bit or 8-bit sub-scales), m: +-0.2
                        float v = j ? 0.4f * (rng_uniform(&r) - 0.5f) : 0.001f + 0.004f * rng_uniform(&r);
                        if (f == WF_Q8_0 || f == WF_Q4_0 || f == WF_Q5_0)
                            v *= 10.0f;
                        if (j && (f == WF_Q4_K || f == WF_Q5_K))
                            v = 0.003f * rng_uniform(&r);
                        uint16_t h = f32_to_f16(v);
                        memcpy(d + b * B + scales[i].at[j], &h, 2);
                    }
    }
    // Zero the padding of packed rows (unpack, pack) so dequantization is the only reader of real codes.
    if (f == WF_Q4 || f == WF_Q4G || f == WF_Q2LUT || f == WF_Q4LUT) {
        uint8_t *codes = malloc((size_t)K);
        for (int i = 0; i < R; i++) {
            uint8_t *row = d + (size_t)i * weight_row_bytes(f, K);
            if (f == WF_Q2LUT) {
                quant_unpack2(codes, row, K);
                quant_pack2(row, codes, K);
            } else {
                quant_unpack4(codes, row, K);
                quant_pack4(row, codes, K);
            }
        }
        free(codes);
    }
}

static float *random_vec(size_t n, uint64_t seed) {
    float *v = malloc(n * sizeof(float));
    ErRng r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++)
        v[i] = rng_normal(&r);
    return v;
}

// Inputs for a product with f: random, or for the block formats random multiples of 2^-6 in [-127, 127] x 2^-6
// with 127 x 2^-6 in every block of 32, which the int8 rounding of their kernels (scale max|x| / 127 = 2^-6)
// keeps exactly, so that their products are checked to fp32 rounding (n a multiple of 32 there).
static float *input_vec(WeightFormat f, size_t n, uint64_t seed) {
    float *v = random_vec(n, seed);
    if (!blocks_format(f))
        return v;
    ErRng r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++)
        v[i] = i % 32 == 5 ? 127.0f / 64.0f : (float)((int)rng_below(&r, 255) - 127) / 64.0f;
    return v;
}

// W as fp32 from the reference rows (weight_row_f32 of the dense part), not from quant_dequant_rows' SIMD
// ones; the sparse corrections added here, apart from the library's code for them.
static float *dequant_all(const Weight *w) {
    float *d = malloc(sizeof(float) * (size_t)w->rows * w->cols);
    Weight dense = *w;
    dense.sparse = 0;
    for (int r = 0; r < w->rows; r++)
        weight_row_f32(d + (size_t)r * w->cols, &dense, r);
    for (int i = 0; i < w->rows * w->sparse; i++)
        d[(size_t)(i / w->sparse) * w->cols + w->sp_cols[i]] += f16_to_f32(w->sp_vals[i]);
    return d;
}

// The error the int8-activation kernels of q8, q4 and q4g (quant/qkernel.c) may add to out[n, r]: each
// input rounded to a multiple of d_b = max|x_b| / 127 over its block b of 32 (half a step at most),
// times the weight's multiplier of that input (q8: W; q4: W + 8 * scale, the -8 uses the exact input sum;
// q4g: W - zero, the zeros use the exact group sums). 0 for every other format.
static double act_round_bound(const Weight *w, const float *W, const float *inp, int n, int r) {
    if (w->fmt != WF_Q8 && w->fmt != WF_Q4 && w->fmt != WF_Q4G)
        return 0.0;
    int K = w->cols;
    const float *x = inp + (size_t)n * K;
    double e = 0;
    for (int b = 0; b < K; b += 32) {
        float amax = 0;
        for (int k = b; k < K && k < b + 32; k++)
            amax = fabsf(x[k]) > amax ? fabsf(x[k]) : amax;
        for (int k = b; k < K && k < b + 32; k++) {
            double m = W[(size_t)r * K + k];
            if (w->fmt == WF_Q4)
                m += 8.0 * w->scale[r];
            if (w->fmt == WF_Q4G)
                m -= f16_to_f32(w->gzero[(size_t)r * (K / w->group) + k / w->group]);
            e += fabs(m) * (amax / 127.0) * 0.5;
        }
    }
    return e * 1.0001;
}

// out (N, R) against inp · Wᵀ + bias in double; tolerance relative to Σ|w x|, plus the int8 rounding of
// the inputs where w is a format whose SIMD kernel quantizes them (w NULL: none).
static void check_forward(const float *out, const float *inp, const float *W, const float *bias, int N, int R, int K,
                          const Weight *w, const char *what) {
    for (int n = 0; n < N; n++)
        for (int r = 0; r < R; r++) {
            double s = bias ? bias[r] : 0, a = fabs(s);
            for (int k = 0; k < K; k++) {
                s += (double)inp[(size_t)n * K + k] * W[(size_t)r * K + k];
                a += fabs((double)inp[(size_t)n * K + k] * W[(size_t)r * K + k]);
            }
            double tol = 1e-5 * a + 1e-6 + (w ? act_round_bound(w, W, inp, n, r) : 0.0);
            cr_assert(fabs(out[(size_t)n * R + r] - s) <= tol, "%s: out[%d,%d] = %.8g, want %.8g", what, n, r,
                      out[(size_t)n * R + r], s);
        }
}

typedef struct {
    WeightFormat f;
    int K, group, sparse;
} Case;

// Odd widths exercise the scalar tails; group 6 exercises the portable fallback of q4g; fp32 at 1027
// columns takes the inputs in groups of four over blocks of weight rows (more than 16 KiB of inputs), at
// 2053 columns 128 at a time; q4 and q4g32 go two rows per register where AVX512-VNNI is there, q8 from N = 2
// (at 2112 columns two rows at a time from N = 6 with AVX-512 alone; 19 rows: the last one alone).
static const Case cases[] = {
    {WF_Q8, 40, 0, 0}, {WF_Q8, 37, 0, 0}, {WF_Q4, 48, 0, 0}, {WF_Q4, 37, 0, 0}, {WF_Q4G, 64, 32, 0},
    {WF_Q4G, 96, 8, 0}, {WF_Q4G, 36, 6, 0}, {WF_Q4G, 48, 16, 0}, {WF_Q2LUT, 40, 0, 0}, {WF_Q2LUT, 39, 0, 0},
    {WF_BF16, 24, 0, 0}, {WF_F16, 21, 0, 0}, {WF_F32, 19, 0, 0}, {WF_Q4, 200, 0, 0}, {WF_Q2LUT, 203, 0, 0},
    {WF_Q4G, 256, 128, 0}, {WF_Q8, 100, 0, 0}, {WF_Q4LUT, 48, 0, 0}, {WF_Q4LUT, 37, 0, 0}, {WF_Q4LUT, 200, 0, 0},
    {WF_BF16, 203, 0, 0}, {WF_F16, 200, 0, 0}, {WF_F32, 1027, 0, 0}, {WF_F32, 2053, 0, 0}, {WF_Q4, 2112, 0, 0},
    {WF_Q4G, 2112, 32, 0}, {WF_Q8, 128, 0, 0}, {WF_Q8, 2112, 0, 0},
    {WF_Q2LUT, 40, 0, 3}, {WF_Q2LUT, 203, 0, 5}, {WF_Q4LUT, 37, 0, 2}, {WF_Q4LUT, 1, 0, 1}, // dense-and-sparse
    {WF_Q8_0, 64, 0, 0}, {WF_Q4_1, 96, 0, 0}, {WF_Q5_0, 32, 0, 0}, {WF_Q5_1, 160, 0, 0}, // GGUF blocks
    {WF_Q4_0, 96, 0, 0}, {WF_Q4_K, 256, 0, 0}, {WF_Q5_K, 512, 0, 0}, {WF_Q6_K, 256, 0, 0}, {WF_Q6_K, 768, 0, 0},
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

// Float formats for the same harness (random bits would make NaNs: fill from floats instead).
static void make_weight(Weight *w, const Case *c, int R, uint64_t seed, void **own) {
    *own = NULL;
    if (weight_is_quantized(c->f)) {
        random_weight(w, c->f, R, c->K, c->group, c->sparse, seed);
        return;
    }
    float *v = random_vec((size_t)R * c->K, seed);
    memset(w, 0, sizeof *w);
    w->fmt = c->f;
    w->rows = R;
    w->cols = c->K;
    if (c->f == WF_F32) {
        w->data = *own = v;
        return;
    }
    uint16_t *h = malloc((size_t)R * c->K * 2);
    dtype_from_f32(h, c->f == WF_BF16 ? DT_BF16 : DT_F16, v, (size_t)R * c->K);
    free(v);
    w->data = *own = h;
}

// The products' scratch, sized for every case here (K <= 768).
static float scratch[QUANT_TILE_ROWS * 768];

static void free_weight(Weight *w, void *own) {
    weight_free(w);
    free(own);
}

Test(quant_kernels, decode_n1_to_8_simd_and_portable) {
    threads_set(2);
    for (int ci = 0; ci < N_CASES; ci++) {
        const Case *c = &cases[ci];
        const int R = 19;
        Weight w;
        void *own;
        make_weight(&w, c, R, 100 + ci, &own);
        float *W = dequant_all(&w), *inp = input_vec(c->f, (size_t)8 * c->K, 7 + ci), *bias = random_vec(R, 3);
        float out[8 * 19];
        for (int portable = 0; portable < 2; portable++) {
            for (int N = 1; N <= 8; N++) {
                char what[64];
                snprintf(what, sizeof what, "%s K=%d g=%d N=%d %s", weight_format_name(c->f), c->K, c->group, N,
                         portable ? "portable" : "simd");
                memset(out, 0, sizeof out);
                if (portable) { // the reference path, called by name; the bias as weight_matmul_forward adds it
                    cr_assert_eq(quant_matmul_decode_portable(out, inp, &w, N, scratch), 0);
                    for (int n = 0; n < N; n++)
                        for (int r = 0; r < R; r++)
                            out[n * R + r] += bias[r];
                } else {
                    cr_assert_eq(weight_matmul_forward(out, inp, &w, bias, N, scratch, QUANT_INT8_PREFILL), 0);
                }
                check_forward(out, inp, W, bias, N, R, c->K, portable ? NULL : &w, what);
            }
        }
        free(W);
        free(inp);
        free(bias);
        free_weight(&w, own);
    }
}

Test(quant_kernels, tile_path_n33) {
    threads_set(2);
    for (int ci = 0; ci < N_CASES; ci++) {
        const Case *c = &cases[ci];
        // one case larger than a 256-row tile; fp32 takes the decode kernel up to QUANT_BATCH_MAX_N rows
        const int R = ci == 4 ? 300 : 21, N = c->f == WF_F32 ? QUANT_BATCH_MAX_N + 1 : 33;
        Weight w;
        void *own;
        make_weight(&w, c, R, 200 + ci, &own);
        float *W = dequant_all(&w), *inp = input_vec(c->f, (size_t)N * c->K, 11 + ci);
        float *out = calloc((size_t)N * R, sizeof(float));
        cr_assert_eq(weight_matmul_forward(out, inp, &w, NULL, N, scratch, QUANT_INT8_PREFILL), 0);
        check_forward(out, inp, W, NULL, N, R, c->K, &w, weight_format_name(c->f));
        free(out);
        free(W);
        free(inp);
        free_weight(&w, own);
    }
}

Test(quant_kernels, backward_input_accumulates) {
    threads_set(2);
    for (int ci = 0; ci < N_CASES; ci++) {
        const Case *c = &cases[ci];
        const int R = ci == 7 ? 270 : 17;
        int Ns[] = {3, 33};
        Weight w;
        void *own;
        make_weight(&w, c, R, 300 + ci, &own);
        float *W = dequant_all(&w);
        for (int t = 0; t < 2; t++) {
            int N = Ns[t];
            float *dout = random_vec((size_t)N * R, 5 + ci), *dinp = random_vec((size_t)N * c->K, 9 + ci);
            float *d0 = malloc(sizeof(float) * (size_t)N * c->K);
            memcpy(d0, dinp, sizeof(float) * (size_t)N * c->K);
            cr_assert_eq(weight_matmul_backward_input(dinp, dout, &w, N, scratch), 0);
            for (int n = 0; n < N; n++)
                for (int k = 0; k < c->K; k++) {
                    double s = d0[(size_t)n * c->K + k], a = fabs(s);
                    for (int r = 0; r < R; r++) {
                        s += (double)dout[(size_t)n * R + r] * W[(size_t)r * c->K + k];
                        a += fabs((double)dout[(size_t)n * R + r] * W[(size_t)r * c->K + k]);
                    }
                    cr_assert(fabs(dinp[(size_t)n * c->K + k] - s) <= 1e-5 * a + 1e-6, "%s N=%d dinp[%d,%d]",
                              weight_format_name(c->f), N, n, k);
                }
            free(dout);
            free(dinp);
            free(d0);
        }
        free(W);
        free_weight(&w, own);
    }
}

// L(x) = Σ g ⊙ (x · Wᵀ): dL/dx from backward_input against central differences of the forward
// (the portable decode product for N = 2, tile path for N = 9) of the packed weight. The SIMD decode of
// q8 / q4 / q4g32 rounds its inputs to int8 (a step function of x, checked against its rounding bound
// above), so for it backward_input is the straight-through gradient of the exact product.
Test(quant_kernels, backward_matches_finite_differences) {
    threads_set(1);
    WeightFormat fs[] = {WF_Q8, WF_Q4, WF_Q4G, WF_Q2LUT, WF_Q4LUT};
    int Ns[] = {2, 9};
    for (int fi = 0; fi < 5; fi++)
        for (int t = 0; t < 2; t++) {
            const int R = 11, K = 32, N = Ns[t];
            Weight w;
            random_weight(&w, fs[fi], R, K, 16, fs[fi] == WF_Q2LUT || fs[fi] == WF_Q4LUT ? 2 : 0, 40 + fi);
            float *x = random_vec((size_t)N * K, 1), *g = random_vec((size_t)N * R, 2);
            float *dx = calloc((size_t)N * K, sizeof(float)), *out = malloc(sizeof(float) * (size_t)N * R);
            cr_assert_eq(weight_matmul_backward_input(dx, g, &w, N, scratch), 0);
            for (int i = 0; i < N * K; i += 5) {
                double L[2];
                float x0 = x[i];
                const float h = 0.125f;
                for (int s = 0; s < 2; s++) {
                    x[i] = x0 + (s ? -h : h);
                    if (N <= QUANT_DECODE_MAX_N)
                        cr_assert_eq(quant_matmul_decode_portable(out, x, &w, N, scratch), 0);
                    else
                        cr_assert_eq(weight_matmul_forward(out, x, &w, NULL, N, scratch, 0), 0);
                    L[s] = 0;
                    for (int j = 0; j < N * R; j++)
                        L[s] += (double)g[j] * out[j];
                }
                x[i] = x0;
                double fd = (L[0] - L[1]) / (2.0 * h);
                cr_assert(fabs(fd - dx[i]) <= 1e-3 * (1 + fabs(fd)), "%s N=%d dx[%d]: fd %.7g vs %.7g",
                          weight_format_name(fs[fi]), N, i, fd, dx[i]);
            }
            free(x);
            free(g);
            free(dx);
            free(out);
            weight_free(&w);
        }
}

Test(quant_kernels, decode_rejects_bad_n) {
    Weight w;
    random_weight(&w, WF_Q8, 2, 8, 0, 0, 1);
    float x[9 * 8] = {0}, out[18];
    cr_assert_lt(quant_matmul_decode(out, x, &w, 9, scratch), 0);
    cr_assert_lt(quant_matmul_decode(out, x, &w, 0, scratch), 0);
    weight_free(&w);
    // fp32 takes up to QUANT_BATCH_MAX_N rows, no more
    float *W = random_vec(2 * 8, 5), *xs = calloc((size_t)(QUANT_BATCH_MAX_N + 1) * 8, sizeof(float));
    float *outs = malloc(sizeof(float) * 2 * (QUANT_BATCH_MAX_N + 1));
    Weight f = {.fmt = WF_F32, .rows = 2, .cols = 8, .data = W};
    cr_assert_eq(quant_matmul_decode(outs, xs, &f, QUANT_BATCH_MAX_N, NULL), 0, "%s", er_last_error());
    cr_assert_lt(quant_matmul_decode(outs, xs, &f, QUANT_BATCH_MAX_N + 1, NULL), 0);
    cr_assert(strstr(er_last_error(), "outside 1..") && strstr(er_last_error(), "f32"), "%s", er_last_error());
    free(W);
    free(xs);
    free(outs);
}

// The kernels ER_SIMD asks for are the ones that run (make test-simd runs the kernel suites under each x86 set: a
// CPU without the one asked for must fail here, not pass on the portable path).
Test(quant_kernels, simd_choice_follows_er_simd) {
    const char *want = getenv("ER_SIMD"), *name = quant_simd_name();
    printf("quant_kernels: ER_SIMD=%s: %s\n", want ? want : "(unset)", name);
    if (!want || !want[0]) {
        cr_assert_eq(quant_has_simd(), strcmp(name, "portable") != 0, "%s", name);
        return;
    }
    static const char *const names[][2] = {{"avx512", "AVX-512 VNNI"}, {"avx2", "AVX2"}, {"neon", "NEON"},
                                           {"portable", "portable"}};
    int i = 0;
    while (i < 4 && strcmp(want, names[i][0]))
        i++;
    cr_assert_lt(i, 4, "ER_SIMD=%s is none of avx512, avx2, neon, portable", want);
    cr_assert(!strncmp(name, names[i][1], strlen(names[i][1])), "ER_SIMD=%s runs %s", want, name);
    cr_assert_eq(quant_has_simd(), i < 3);
}

// The SIMD kernel of every format (quant_simd_decode: AVX-512 VNNI or AVX2 on x86, NEON on aarch64), called directly, against the
// portable path on random weights and inputs: widths around the 8-, 16-, 32- and 64-element steps of the
// kernels (every tail), q4g groups 16..128, N = 1..8; the block formats at 13 and 14 rows by turns (their i8mm
// kernel takes the rows two at a time, an odd count's last one alone). Where the build has SIMD kernels every
// format but f32 must have one (so this cannot pass by finding none).
Test(quant_kernels, table_kernels_match_portable) {
    threads_set(2);
    static const int widths[] = {1, 7, 8, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 96, 127, 128, 129, 200, 257};
    static const int block_widths[] = {32, 64, 96, 256, 288, 512, 768}; // the K-quants take the multiples of 256
    static const int groups[] = {16, 32, 64, 128};
    int checked = 0;
    for (int f = WF_BF16; f < WF_COUNT; f++) {
        const WeightFormatInfo *fi = weight_format_info((WeightFormat)f);
        QuantDecodeFn decode = quant_simd_decode((WeightFormat)f);
        cr_assert(!quant_has_simd() || decode, "%s has no SIMD kernel in %s", fi->name, quant_simd_name());
        if (!decode)
            continue;
        for (int wi = 0; wi < (int)(sizeof widths / sizeof widths[0]); wi++)
            for (int gi = 0; gi < (f == WF_Q4G ? 4 : 1); gi++) {
                int K = widths[wi], G = f == WF_Q4G ? groups[gi] : 0, E = blocks_elems((WeightFormat)f);
                if (G)
                    K = G * (1 + wi % 3);
                if (E && (wi >= (int)(sizeof block_widths / sizeof block_widths[0]) || block_widths[wi] % E))
                    continue;
                if (E)
                    K = block_widths[wi];
                const int R = E ? 13 + wi % 2 : 13;
                Case c = {(WeightFormat)f, K, G, 0};
                Weight w;
                void *own;
                make_weight(&w, &c, R, 500 + 7 * wi + gi, &own);
                float *inp = input_vec((WeightFormat)f, (size_t)8 * K, 900 + wi), out[8 * 14], ref[8 * 14];
                for (int N = 1; N <= 8; N++) {
                    cr_assert_eq(decode(out, inp, &w, N), 0, "%s K=%d g=%d N=%d declined", fi->name, K, G, N);
                    cr_assert_eq(quant_matmul_decode_portable(ref, inp, &w, N, scratch), 0);
                    float *W = dequant_all(&w);
                    for (int i = 0; i < N * R; i++) {
                        double a = 0;
                        for (int k = 0; k < K; k++)
                            a += fabs((double)inp[(size_t)(i / R) * K + k] * W[(size_t)(i % R) * K + k]);
                        double tol = 1e-6 * a + 1e-7 + act_round_bound(&w, W, inp, i / R, i % R);
                        cr_assert(fabs(out[i] - ref[i]) <= tol, "%s K=%d g=%d N=%d out[%d] = %.9g, portable %.9g",
                                  fi->name, K, G, N, i, out[i], ref[i]);
                    }
                    free(W);
                    checked++;
                }
                free(inp);
                free_weight(&w, own);
            }
    }
    printf("quant_kernels: %s kernels matched the portable path in %d (format, width, N) cases\n", quant_simd_name(),
           checked);
}

// A value no product of the unit-scale random inputs comes near, written past a product's outputs: still
// there afterwards, nothing was stored beyond them.
#define CANARY (-12345.75f)
static void canary_fill(float *p, int n) {
    for (int i = 0; i < n; i++)
        p[i] = CANARY;
}
static int canary_kept(const float *p, int n) {
    for (int i = 0; i < n; i++)
        if (p[i] != CANARY)
            return 0;
    return 1;
}

// fp32 products are the same bits on every path and at every N: the decode product (AVX-512's two rows per
// register where the build has it) against the portable one, and each input row's outputs against those of
// the row alone (N = 1), which batched decoding relies on (tests/infer/test_decode_batch.c). Row counts
// around the kernel's blocks of 6 rows (one row left over, a pair, a block and a half), widths around
// the 8-column steps and the portable path's tiling (1027, 2053 columns). With AVX-512, bf16 from N = 2
// too (N = 1 runs its own kernel, checked within a tolerance by table_kernels_match_portable).
Test(quant_kernels, f32_products_bit_for_bit_at_every_n) {
    threads_set(2);
    static const int rows[] = {1, 2, 5, 6, 7, 13, 19};
    static const int widths[] = {1, 7, 8, 9, 64, 203, 1027, 2053};
    int bf16_bitwise = strstr(quant_simd_name(), "AVX-512") != NULL, checked = 0;
    for (int f = 0; f < 1 + bf16_bitwise; f++)
        for (int ri = 0; ri < (int)(sizeof rows / sizeof rows[0]); ri++)
            for (int wi = 0; wi < (int)(sizeof widths / sizeof widths[0]); wi++) {
                int R = rows[ri], K = widths[wi];
                Case c = {f ? WF_BF16 : WF_F32, K, 0, 0};
                Weight w;
                void *own;
                make_weight(&w, &c, R, 40 + 9 * ri + wi, &own);
                // out and alone one row past the outputs: a canary there catches a store past N x R
                float *inp = random_vec((size_t)8 * K, 60 + wi), out[8 * 19 + 19], ref[8 * 19], alone[19 + 19];
                float *tile = malloc(sizeof(float) * QUANT_TILE_ROWS * K);
                for (int N = 1 + f; N <= 8; N++) {
                    canary_fill(out + N * R, R);
                    cr_assert_eq(quant_matmul_decode(out, inp, &w, N, tile), 0, "%s", er_last_error());
                    cr_assert(canary_kept(out + N * R, R), "%s R=%d K=%d N=%d: the product wrote past its outputs",
                              weight_format_name(c.f), R, K, N);
                    cr_assert_eq(quant_matmul_decode_portable(ref, inp, &w, N, tile), 0);
                    cr_assert(!memcmp(out, ref, sizeof(float) * N * R), "%s R=%d K=%d N=%d: decode != portable",
                              weight_format_name(c.f), R, K, N);
                    for (int n = 0; n < N && !f; n++) {
                        canary_fill(alone + R, R);
                        cr_assert_eq(quant_matmul_decode(alone, inp + (size_t)n * K, &w, 1, tile), 0);
                        cr_assert(canary_kept(alone + R, R), "f32 R=%d K=%d N=1: the product wrote past its outputs",
                                  R, K);
                        cr_assert(!memcmp(alone, out + (size_t)n * R, sizeof(float) * R),
                                  "f32 R=%d K=%d: input %d of %d differs from the same input alone", R, K, n, N);
                    }
                    checked++;
                }
                free(tile);
                free(inp);
                free_weight(&w, own);
            }
    printf("quant_kernels: fp32%s products bit for bit the portable path's in %d (rows, width, N) cases (%s)\n",
           bf16_bitwise ? " and bf16" : "", checked, quant_simd_name());
}

// fp32 products past QUANT_DECODE_MAX_N rows, up to QUANT_BATCH_MAX_N (a batched decode step of many
// rollouts): weight_matmul_forward keeps them on the decode kernels, so every input row's outputs are bit
// for bit those of the row alone (N = 1), and the whole product matches double within tolerance, the bias
// added. Widths for each of dot_f32's block shapes (inputs in L1, groups of four, 128-column tiles), rows
// around the AVX-512 kernel's blocks of 6.
Test(quant_kernels, f32_batch_rows_bit_for_bit_each_row_alone) {
    threads_set(2);
    static const int Ns[] = {9, 16, 33, 64, QUANT_BATCH_MAX_N};
    static const int rows[] = {7, 13};
    static const int widths[] = {9, 203, 1027, 2053};
    int checked = 0;
    for (int ri = 0; ri < (int)(sizeof rows / sizeof rows[0]); ri++)
        for (int wi = 0; wi < (int)(sizeof widths / sizeof widths[0]); wi++) {
            int R = rows[ri], K = widths[wi];
            Case c = {WF_F32, K, 0, 0};
            Weight w;
            void *own;
            make_weight(&w, &c, R, 70 + 5 * ri + wi, &own);
            float *inp = random_vec((size_t)QUANT_BATCH_MAX_N * K, 80 + wi), *bias = random_vec(R, 90 + ri);
            float *out = malloc(sizeof(float) * ((size_t)QUANT_BATCH_MAX_N * R + R)), alone[13];
            float *ref = malloc(sizeof(float) * (size_t)QUANT_BATCH_MAX_N * R);
            for (int ni = 0; ni < (int)(sizeof Ns / sizeof Ns[0]); ni++) {
                int N = Ns[ni];
                char what[64];
                snprintf(what, sizeof what, "f32 R=%d K=%d N=%d", R, K, N);
                canary_fill(out + (size_t)N * R, R);
                cr_assert_eq(weight_matmul_forward(out, inp, &w, bias, N, NULL, QUANT_INT8_PREFILL), 0, "%s", er_last_error());
                cr_assert(canary_kept(out + (size_t)N * R, R), "%s: the product wrote past its outputs", what);
                check_forward(out, inp, w.data, bias, N, R, K, NULL, what);
                // the portable path (the reference where the build has an fp32 SIMD kernel) gives the same bits
                cr_assert_eq(quant_matmul_decode_portable(ref, inp, &w, N, NULL), 0, "%s", er_last_error());
                for (int n = 0; n < N; n++)
                    for (int r = 0; r < R; r++)
                        ref[(size_t)n * R + r] += bias[r];
                cr_assert(!memcmp(ref, out, sizeof(float) * N * R), "%s: decode != portable", what);
                for (int n = 0; n < N; n++) {
                    cr_assert_eq(weight_matmul_forward(alone, inp + (size_t)n * K, &w, bias, 1, NULL, QUANT_INT8_PREFILL), 0);
                    cr_assert(!memcmp(alone, out + (size_t)n * R, sizeof(float) * R),
                              "%s: input %d differs from the same input alone", what, n);
                }
                checked++;
            }
            free(out);
            free(ref);
            free(bias);
            free(inp);
            free_weight(&w, own);
        }
    printf("quant_kernels: fp32 products of 9..%d rows bit for bit each row alone in %d cases (%s)\n",
           QUANT_BATCH_MAX_N, checked, quant_simd_name());
}

// The int8-input products of q8, q4 and q4g32 sum each output in the same order at N = 1 and N = 2 on every
// kernel, so an input's outputs at N = 2 are the bits of the same input alone: with AVX512-VNNI this holds q8's
// two-rows-per-register kernel (N = 2, weights offset by 128) to its one-row kernel (N = 1) bit for bit, and
// the q4 pairs' halves to each other where a block runs past the last row. Row counts around the blocks of
// 4 rows, widths of 1 to 33 chunks of 64; the second input so small that its codes come out of NaNs (no code
// may be -128, which the one-row q8 kernel's sign trick cannot negate).
Test(quant_kernels, int8_products_at_n2_bit_for_bit_each_input_alone) {
    threads_set(2);
    static const Case fmts[] = {{WF_Q8, 0, 0, 0}, {WF_Q4, 0, 0, 0}, {WF_Q4G, 0, 32, 0}};
    static const int rows[] = {1, 3, 4, 5, 7, 19}, widths[] = {64, 128, 896, 2112};
    int checked = 0;
    for (int fi = 0; fi < 3; fi++)
        for (int ri = 0; ri < (int)(sizeof rows / sizeof rows[0]); ri++)
            for (int wi = 0; wi < (int)(sizeof widths / sizeof widths[0]); wi++) {
                int R = rows[ri], K = widths[wi];
                Weight w;
                random_weight(&w, fmts[fi].f, R, K, fmts[fi].group, 0, 300 + 31 * fi + 7 * ri + wi);
                float *inp = random_vec((size_t)2 * K, 400 + wi), out[2 * 19], alone[19];
                for (int k = 0; k < K; k++) // the second input under 127 / FLT_MAX: its codes come out of NaNs
                    inp[(size_t)K + k] = k % 3 ? 0.0f : -1e-38f;
                float *tile = malloc(sizeof(float) * quant_scratch_floats(K)); // for a build without the SIMD kernels
                cr_assert_eq(weight_matmul_forward(out, inp, &w, NULL, 2, tile, QUANT_INT8_PREFILL), 0, "%s", er_last_error());
                for (int n = 0; n < 2; n++) {
                    cr_assert_eq(weight_matmul_forward(alone, inp + (size_t)n * K, &w, NULL, 1, tile, QUANT_INT8_PREFILL), 0);
                    cr_assert(!memcmp(alone, out + (size_t)n * R, sizeof(float) * R),
                              "%s R=%d K=%d: input %d of 2 differs from the same input alone", weight_format_name(w.fmt),
                              R, K, n);
                }
                checked++;
                free(tile);
                free(inp);
                weight_free(&w);
            }
    printf("quant_kernels: int8-input products at N = 2 bit for bit each input alone in %d (format, rows, width) "
           "cases (%s)\n", checked, quant_simd_name());
}

// An input row's outputs are the same bits whatever rows share its product: at N = 1..8 input row n's outputs
// equal those of row n alone (N = 1), which batched decoding relies on (a request gives the same tokens decoded
// alone or beside others: tests/infer/test_api.c, docs/server.md). Held to every N: fp32, the GGUF block formats
// (on aarch64 with i8mm they take SMMLA at N = 1 too, for this) and every tiled weight. The other formats' kernels
// pick their accumulator chains by N (CHAINS and the int8 kernels' A in quant/qkernel.c, NCH and A in
// quant/qkernel_neon.c: more chains at N <= 2 for the FMA latency), so they are held to N = 1 and 2 (bf16 with
// AVX-512 to none: N = 1 runs a kernel of its own, the pairs from N = 2), and their differences from N = 3 on are
// counted and printed. Random weights and inputs, widths with the kernels' tails (for the 32-element block
// formats not multiples of 64 or 256), an odd row count and 16 rows, those tiled too where the build tiles them.
Test(quant_kernels, decode_each_input_bit_for_bit_alone_at_every_n) {
    threads_set(2);
    static const int rows[] = {7, 16};
    int bf16_own_n1 = strstr(quant_simd_name(), "AVX-512") != NULL, checked = 0, tiled = 0, chains = 0;
    for (int f = 0; f < WF_COUNT; f++) {
        int E = blocks_elems((WeightFormat)f), G = f == WF_Q4G ? 32 : 0;
        int sparse = f == WF_Q2LUT || f == WF_Q4LUT ? 2 : 0;
        const int *widths = E == 256 ? (const int[]){256, 768, 1536}
                            : E      ? (const int[]){96, 320, 2080}
                            : G      ? (const int[]){64, 288, 2112}
                                     : (const int[]){37, 200, 2112};
        for (int wi = 0; wi < 3; wi++)
            for (int ri = 0; ri < 2; ri++)
                for (int tile = 0; tile < 2; tile++) {
                    int R = rows[ri], K = widths[wi];
                    Case c = {(WeightFormat)f, K, G, sparse};
                    Weight w;
                    void *own;
                    make_weight(&w, &c, R, 600 + 17 * f + 3 * wi + ri, &own);
                    int rc = tile ? quant_tile(&w) : 0;
                    cr_assert(rc >= 0, "%s", er_last_error());
                    if (tile && !rc) { // the build or the shape has no tiled kernel
                        free_weight(&w, own);
                        continue;
                    }
                    tiled += tile;
                    int held = f == WF_F32 || E || tile ? 8 : f == WF_BF16 && bf16_own_n1 ? 1 : 2;
                    float *inp = random_vec((size_t)8 * K, 700 + wi), out[8 * 16], alone[8 * 16];
                    float *scr = malloc(sizeof(float) * quant_scratch_floats(K));
                    for (int n = 0; n < 8; n++)
                        cr_assert_eq(quant_matmul_decode(alone + n * R, inp + (size_t)n * K, &w, 1, scr), 0, "%s",
                                     er_last_error());
                    for (int N = 1; N <= 8; N++) {
                        cr_assert_eq(quant_matmul_decode(out, inp, &w, N, scr), 0, "%s", er_last_error());
                        for (int n = 0; n < N; n++) {
                            int same = !memcmp(out + n * R, alone + n * R, sizeof(float) * R);
                            cr_assert(same || N > held,
                                      "%s%s R=%d K=%d: input %d of N = %d differs from the same input alone (%s)",
                                      tile ? "tiled " : "", weight_format_name((WeightFormat)f), R, K, n, N,
                                      quant_simd_name());
                            chains += !same;
                        }
                        checked++;
                    }
                    free(scr);
                    free(inp);
                    free_weight(&w, own);
                }
    }
    printf("quant_kernels: each input's outputs against the input alone in %d (format, shape, N) cases, %d shapes "
           "tiled; NOTE: %d input rows differ from it where the kernels' chains change with N (%s)\n",
           checked, tiled, chains, quant_simd_name());
}

// The int8-input kernels of q8, q4 and q4g32 at the 0.5B model's widths (896, 4864) with inputs the way
// activations are: a block of zeros (scale 0), an outlier 300x the rest (its block's codes are mostly 0)
// and a tiny block (1e-30, scale near the bottom of fp32), N = 1..8, against double within the int8
// rounding bound.
Test(quant_kernels, int8_inputs_outliers_and_zero_blocks) {
    threads_set(2);
    static const Case big[] = {{WF_Q8, 896, 0, 0},  {WF_Q4, 896, 0, 0},  {WF_Q4G, 896, 32, 0},
                               {WF_Q4, 4864, 0, 0}, {WF_Q4G, 4864, 32, 0}, {WF_Q8, 4864, 0, 0}};
    for (int ci = 0; ci < (int)(sizeof big / sizeof big[0]); ci++) {
        const Case *c = &big[ci];
        const int R = 7, K = c->K;
        Weight w;
        random_weight(&w, c->f, R, K, c->group, c->sparse, 70 + ci);
        float *W = dequant_all(&w), *inp = random_vec((size_t)8 * K, 80 + ci), out[8 * 7];
        float *tile = malloc(sizeof(float) * quant_scratch_floats(K)); // for a build without the SIMD kernels
        for (int n = 0; n < 8; n++) {
            float *x = inp + (size_t)n * K;
            memset(x + 32, 0, 32 * sizeof(float));
            x[100 + n] = 300.0f;
            for (int k = 160; k < 192; k++)
                x[k] *= 1e-30f;
        }
        for (int N = 1; N <= 8; N++) {
            char what[64];
            snprintf(what, sizeof what, "%s K=%d g=%d N=%d int8 inputs", weight_format_name(c->f), K, c->group, N);
            cr_assert_eq(weight_matmul_forward(out, inp, &w, NULL, N, tile, QUANT_INT8_PREFILL), 0);
            check_forward(out, inp, W, NULL, N, R, K, &w, what);
        }
        free(tile);
        free(W);
        free(inp);
        weight_free(&w);
    }
}

// The tiles of the GEMM path (quant_dequant_rows, SIMD rows for q8 / q4 / q4g where built) equal the
// reference rows bit for bit, at widths around the 8- and 16-element steps and every q4g group.
Test(quant_kernels, dequant_rows_equal_reference_rows) {
    threads_set(2);
    static const Case tiles[] = {{WF_Q8, 37, 0, 0},     {WF_Q8, 896, 0, 0},    {WF_Q4, 37, 0, 0},
                                 {WF_Q4, 48, 0, 0},     {WF_Q4, 896, 0, 0},    {WF_Q4G, 96, 8, 0},
                                 {WF_Q4G, 48, 16, 0},   {WF_Q4G, 896, 32, 0},  {WF_Q4G, 256, 64, 0},
                                 {WF_Q4G, 256, 128, 0}, {WF_Q4LUT, 37, 0, 0},  {WF_Q2LUT, 39, 0, 0},
                                 {WF_Q2LUT, 39, 0, 4},  {WF_Q4LUT, 896, 0, 3}};
    for (int ci = 0; ci < (int)(sizeof tiles / sizeof tiles[0]); ci++) {
        const Case *c = &tiles[ci];
        const int R = 9;
        Weight w;
        random_weight(&w, c->f, R, c->K, c->group, c->sparse, 200 + ci);
        float *tile = malloc(sizeof(float) * R * c->K), *ref = dequant_all(&w);
        quant_dequant_rows(tile, &w, 0, R);
        cr_assert(!memcmp(tile, ref, sizeof(float) * R * c->K), "%s K=%d g=%d: tile differs from the reference rows",
                  weight_format_name(c->f), c->K, c->group);
        free(tile);
        free(ref);
        weight_free(&w);
    }
}

// Tiled q4, q8, q4g32 and the GGUF block formats (quant_tile, the layout of the AVX512-VNNI decode kernels): the packed
// rows and the fp32 rows read back bit for bit, the GEMM path's products (from those rows) bit for bit, the decode
// products within the int8 rounding bound of double (the block formats on their exact-grid inputs) at N = 1..8 and
// each input's outputs at N = 2 the bits of the same input alone; a weight that owns its buffer is re-laid in it,
// one that does not gets its own. Shapes the kernels do not take stay untiled everywhere.
Test(quant_kernels, tiled_rows_and_products) {
    threads_set(2);
    static const int shapes[][2] = {{16, 64}, {32, 896}, {48, 192}, {16, 4864}, {16, 5120}};
    static const int refused[][2] = {{19, 896}, {16, 96}, {16, 5184}};
    int tiled = 0;
    static const int k_widths[5] = {256, 768, 512, 4864, 5120}; // the k-quants': multiples of 256
    static const WeightFormat fmts[] = {WF_Q4,   WF_Q8,   WF_Q4G,  WF_Q8_0, WF_Q4_0, WF_Q4_1,
                                        WF_Q5_0, WF_Q5_1, WF_Q4_K, WF_Q5_K, WF_Q6_K};
    for (int fi = 0; fi < (int)(sizeof fmts / sizeof fmts[0]); fi++)
        for (int si = 0; si < 5; si++) {
            WeightFormat f = fmts[fi];
            int R = shapes[si][0], K = blocks_elems(f) == 256 ? k_widths[si] : shapes[si][1], G = f == WF_Q4G ? 32 : 0;
            Weight w, t;
            random_weight(&w, f, R, K, G, 0, 900 + si + 10 * fi);
            random_weight(&t, f, R, K, G, 0, 900 + si + 10 * fi);
            Weight borrowed = t; // the same bytes, not owned: quant_tile gives it a buffer of its own
            borrowed.owned = NULL;
            int rc = quant_tile(si % 2 ? &borrowed : &t);
            cr_assert(rc >= 0, "%s", er_last_error());
            if (!rc) { // a build without the kernels: untiled, and said so below
                weight_free(&w);
                weight_free(&t);
                continue;
            }
            Weight *q = si % 2 ? &borrowed : &t;
            cr_assert(q->tiled && (si % 2 ? q->owned && q->owned != t.owned : q->data == t.data), "R=%d K=%d", R, K);
            tiled++;
            float *W = dequant_all(&w), *Wt = dequant_all(q), *inp = input_vec(f, (size_t)33 * K, 910 + si);
            cr_assert(!memcmp(W, Wt, sizeof(float) * (size_t)R * K), "%s R=%d K=%d: tiled rows differ",
                      weight_format_name(f), R, K);
            for (int r = 0; r < R; r++) { // the file's bytes (what an export writes)
                uint8_t buf[QUANT_PACKED_ROW_MAX];
                cr_assert(!memcmp(weight_packed_row(q, r, buf), weight_packed_row(&w, r, NULL), weight_row_bytes(f, K)),
                          "%s R=%d K=%d: packed row %d differs", weight_format_name(f), R, K, r);
            }
            float *rows = malloc(sizeof(float) * (size_t)R * K), *tile = malloc(sizeof(float) * quant_scratch_floats(K));
            quant_dequant_rows(rows, q, 0, R);
            cr_assert(!memcmp(W, rows, sizeof(float) * (size_t)R * K), "%s R=%d K=%d: quant_dequant_rows differ",
                      weight_format_name(f), R, K);
            float *out = malloc(sizeof(float) * (size_t)33 * R), *ref = malloc(sizeof(float) * (size_t)33 * R);
            cr_assert_eq(weight_matmul_forward(out, inp, q, NULL, 33, tile, 0), 0);
            cr_assert_eq(weight_matmul_forward(ref, inp, &w, NULL, 33, tile, 0), 0);
            cr_assert(!memcmp(out, ref, sizeof(float) * (size_t)33 * R), "%s R=%d K=%d: the GEMM path differs",
                      weight_format_name(f), R, K);
            cr_assert_eq(weight_matmul_forward(out, inp, q, NULL, 33, tile, QUANT_INT8_PREFILL), 0);
            check_forward(out, inp, W, NULL, 33, R, K, q, "tiled int8 prefill");
            if (K >= 4864) { // more input rows than the block prefill quantizes at once (80 at these widths)
                float *inp2 = input_vec(f, (size_t)100 * K, 920 + si), *out2 = malloc(sizeof(float) * (size_t)100 * R);
                cr_assert_eq(weight_matmul_forward(out2, inp2, q, NULL, 100, tile, QUANT_INT8_PREFILL), 0);
                check_forward(out2, inp2, W, NULL, 100, R, K, q, "tiled int8 prefill, 100 rows");
                free(inp2);
                free(out2);
            }
            for (int N = 1; N <= 8; N++) {
                char what[64];
                snprintf(what, sizeof what, "tiled %s R=%d K=%d N=%d", weight_format_name(f), R, K, N);
                cr_assert_eq(weight_matmul_forward(out, inp, q, NULL, N, tile, QUANT_INT8_PREFILL), 0);
                check_forward(out, inp, W, NULL, N, R, K, q, what);
                if (N == 2)
                    for (int n = 0; n < 2; n++) {
                        cr_assert_eq(weight_matmul_forward(ref, inp + (size_t)n * K, q, NULL, 1, tile, QUANT_INT8_PREFILL), 0);
                        cr_assert(!memcmp(ref, out + (size_t)n * R, sizeof(float) * R), "%s: input %d alone differs",
                                  what, n);
                    }
            }
            free(out);
            free(ref);
            free(rows);
            free(tile);
            free(W);
            free(Wt);
            free(inp);
            weight_free(&w);
            if (si % 2)
                weight_free(&borrowed);
            weight_free(&t);
        }
    for (int si = 0; si < 6; si++) {
        Weight w;
        random_weight(&w, si < 3 ? WF_Q4 : WF_Q4G, refused[si % 3][0], si < 3 ? refused[si][1] : 896, si < 3 ? 0 : 64,
                      0, 950 + si); // q4g tiles with groups of 32 only
        cr_assert_eq(quant_tile(&w), 0, "%s R=%d", weight_format_name(w.fmt), w.rows);
        cr_assert(!w.tiled);
        weight_free(&w);
    }
    if (tiled)
        printf("quant_kernels: tiled q4, q8, q4g32 and the block formats' products checked in %d (format, shape) "
               "cases (%s)\n", tiled,
               quant_simd_name());
    else
        printf("quant_kernels: NOTE: these kernels tile nothing (%s): only the untiled shapes checked\n",
               quant_simd_name());
}
