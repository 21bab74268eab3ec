// The GGUF block formats of quant/blocks.h (q8_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K) against ggml itself:
//   - blocks_dequant_row equals ggml's dequantize_row_* bit for bit on random blocks (every byte random, the fp16
//     scales finite: zero, subnormal and negative ones among them). ggml is llama.cpp's libggml-base.so from npm's
//     node-llama-cpp (scripts/llama_cpp.sh --install), dlopened; skipped loudly without node / npm or off x86-64 Linux;
//   - blocks_quantize_row writes the bytes of ggml's reference quantizers where those take the block's extremes too
//     (q8_0, q4_1, q5_0, q5_1), k-quant codes nearest under the stored scales, a round-trip error within a bound
//     derived per format from the stored scales, and zeros for zeros.
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/gguf.h"
#include "core/rng.h"
#include "quant/blocks.h"

TestSuite(quant_blocks, .timeout = 300);

// The formats, their ggml types and the byte offsets of a block's fp16 scales in ggml's layouts (-1: none).
static const struct {
    WeightFormat f;
    uint32_t type;
    int at[2];
} FMTS[] = {
    {WF_Q8_0, GGML_Q8_0, {0, -1}}, {WF_Q4_1, GGML_Q4_1, {0, 2}}, {WF_Q5_0, GGML_Q5_0, {0, -1}},
    {WF_Q5_1, GGML_Q5_1, {0, 2}},  {WF_Q4_K, GGML_Q4_K, {0, 2}}, {WF_Q5_K, GGML_Q5_K, {0, 2}},
    {WF_Q6_K, GGML_Q6_K, {208, -1}},
};
#define N_FMTS (int)(sizeof FMTS / sizeof FMTS[0])

static float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32(h);
}

// ---- random blocks ----

typedef struct {
    int zero, sub, neg; // blocks whose first scale (d) is zero, subnormal, negative
} Cover;

// A finite fp16 value of either sign: zero for kind 0, subnormal for kind 1, else normal of magnitude 2^-14 .. 2^3.
static uint16_t random_half(ErRng *r, int kind) {
    uint16_t sign = (uint16_t)((rng_u64(r) >> 63) << 15);
    if (kind == 0)
        return sign;
    if (kind == 1)
        return (uint16_t)(sign | (1 + rng_below(r, 1023)));
    return (uint16_t)(sign | (1 + rng_below(r, 17)) << 10 | rng_below(r, 1024));
}

// nb blocks of FMTS[fi] (er_alloc): every byte random, then each fp16 scale finite, one in eight of them zero and one
// in eight subnormal. cov (may be NULL) counts the kinds of d.
static uint8_t *random_blocks(int fi, size_t nb, ErRng *r, Cover *cov) {
    size_t B = (size_t)blocks_bytes(FMTS[fi].f);
    uint8_t *b = er_alloc(nb * B);
    cr_assert(b);
    for (size_t i = 0; i < nb * B; i++)
        b[i] = (uint8_t)(rng_u64(r) >> 56);
    for (size_t k = 0; k < nb; k++)
        for (int s = 0; s < 2; s++) {
            if (FMTS[fi].at[s] < 0)
                continue;
            int kind = (int)rng_below(r, 8);
            uint16_t h = random_half(r, kind);
            memcpy(b + k * B + FMTS[fi].at[s], &h, 2);
            if (s == 0 && cov) {
                cov->zero += kind == 0;
                cov->sub += kind == 1;
                cov->neg += kind > 1 && (h & 0x8000);
            }
        }
    return b;
}

// ---- ggml ----

#define GGML_BASE "build/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so"

// ggml-quants.h: void dequantize_row_X(const block_X *x, float *y, int64_t k), quantize_row_X_ref(const float *x,
// block_X *y, int64_t k); k elements, a multiple of the block.
typedef void (*GgmlDequant)(const void *x, float *y, int64_t k);
typedef void (*GgmlQuant)(const float *x, void *y, int64_t k);

// node-llama-cpp's libggml-base.so, installed by scripts/llama_cpp.sh when missing. A loud skip without node / npm,
// and off x86-64 Linux (the package's linux-x64 build is the one loaded).
static void *ggml_open(void) {
#if defined(__x86_64__) && defined(__linux__)
    if (!path_exists(GGML_BASE)) {
        int st = system("bash scripts/llama_cpp.sh --install 2>&1");
        if (WIFEXITED(st) && WEXITSTATUS(st) == 1)
            cr_skip_test("!!!!!! node / npm or node-llama-cpp unavailable: the bit-for-bit comparisons with ggml's "
                         "dequantizers and quantizers are SKIPPED !!!!!!");
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "scripts/llama_cpp.sh --install failed (status %d)", st);
    }
    void *h = dlopen(GGML_BASE, RTLD_NOW | RTLD_LOCAL);
    cr_assert(h, "dlopen %s: %s", GGML_BASE, dlerror());
    return h;
#else
    cr_skip_test("!!!!!! not x86-64 Linux: node-llama-cpp's linux-x64 libggml-base.so cannot be loaded here: "
                 "the bit-for-bit comparisons with ggml's dequantizers and quantizers are SKIPPED !!!!!!");
    return NULL;
#endif
}

// ggml's function prefix + type name + suffix ("dequantize_row_" "q4_K" "").
static void *ggml_sym(void *h, const char *prefix, uint32_t type, const char *suffix) {
    char name[64];
    snprintf(name, sizeof name, "%s%s%s", prefix, ggml_type_name(type), suffix);
    void *f = dlsym(h, name);
    cr_assert(f, "%s does not export %s", GGML_BASE, name);
    return f;
}

static void hex(char *out, const uint8_t *p, int n) {
    for (int i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", p[i]);
}

// One line for a value that differs: the format, the block's bytes and both values with their bits.
static void report_dequant(uint32_t type, const uint8_t *blk, int B, int e, float ours, float theirs) {
    char h[2 * 256 + 1];
    uint32_t a, b;
    memcpy(&a, &ours, 4);
    memcpy(&b, &theirs, 4);
    hex(h, blk, B);
    fprintf(stderr, "quant_blocks: %s element %d of block %s: blocks_dequant_row %.9g (0x%08x), ggml %.9g (0x%08x)\n",
            ggml_type_name(type), e, h, ours, a, theirs, b);
}

#define DQ_ROWS 64 // rows of 1 .. 8 blocks per format

// Rows of random blocks through both dequantizers: the same bits (memcmp), every value of every row.
Test(quant_blocks, dequant_equals_ggml) {
    void *h = ggml_open();
    ErRng r;
    rng_seed(&r, 1);
    for (int fi = 0; fi < N_FMTS; fi++) {
        WeightFormat f = FMTS[fi].f;
        GgmlDequant dq = (GgmlDequant)ggml_sym(h, "dequantize_row_", FMTS[fi].type, "");
        int E = blocks_elems(f), B = blocks_bytes(f), differ = 0;
        size_t values = 0;
        Cover cov = {0};
        for (int row = 0; row < DQ_ROWS; row++) {
            int nb = 1 + row % 8, cols = nb * E;
            uint8_t *blk = random_blocks(fi, (size_t)nb, &r, &cov);
            float *ours = malloc((size_t)cols * sizeof(float)), *theirs = malloc((size_t)cols * sizeof(float));
            cr_assert(ours && theirs);
            memset(ours, 0xa5, (size_t)cols * sizeof(float)); // a value left unwritten shows
            memset(theirs, 0x5a, (size_t)cols * sizeof(float));
            blocks_dequant_row(f, ours, blk, cols);
            dq(blk, theirs, cols);
            if (memcmp(ours, theirs, (size_t)cols * sizeof(float)) != 0)
                for (int e = 0; e < cols; e++)
                    if (memcmp(&ours[e], &theirs[e], sizeof(float)) != 0 && differ++ < 8)
                        report_dequant(FMTS[fi].type, blk + (size_t)(e / E) * B, B, e % E, ours[e], theirs[e]);
            values += (size_t)cols;
            free(ours);
            free(theirs);
            er_free(blk);
        }
        fprintf(stderr,
                "quant_blocks: %-4s %6zu values in %d rows of 1..8 blocks (d zero in %d blocks, subnormal in %d, "
                "negative in %d): %d differ from ggml's dequantize_row_%s\n",
                ggml_type_name(FMTS[fi].type), values, DQ_ROWS, cov.zero, cov.sub, cov.neg, differ,
                ggml_type_name(FMTS[fi].type));
        cr_expect_eq(differ, 0, "%s: %d values differ from ggml's", ggml_type_name(FMTS[fi].type), differ);
        cr_expect(cov.zero && cov.sub && cov.neg, "%s: the blocks lack a zero, subnormal or negative d",
                  ggml_type_name(FMTS[fi].type));
    }
    dlclose(h);
}

// ---- quantization ----

// n values N(0, sigma^2), sigma 0.1 .. 10 (so every fp16 scale is normal), every third row offset by up to
// +-3 sigma (q4_1 and q5_1 then store a min far from zero).
static float random_row(float *x, int n, ErRng *r, int row) {
    float sigma = 0.1f * powf(100.0f, rng_uniform(r));
    float off = row % 3 == 2 ? 6.0f * sigma * (rng_uniform(r) - 0.5f) : 0.0f;
    for (int i = 0; i < n; i++)
        x[i] = sigma * rng_normal(r) + off;
    return sigma;
}

// The formats whose ggml reference quantizer (quantize_row_X_ref) also takes the scales from the block's extremes and
// rounds each value once: ours must write its bytes. (ggml's k-quant quantizers search their scales, ours does not.)
Test(quant_blocks, quantize_equals_ggml_reference) {
    void *h = ggml_open();
    const int cols = 512, rows = 48;
    ErRng r;
    rng_seed(&r, 2);
    float *x = malloc(cols * sizeof(float));
    cr_assert(x);
    for (int fi = 0; fi < 4; fi++) { // q8_0, q4_1, q5_0, q5_1
        WeightFormat f = FMTS[fi].f;
        GgmlQuant q = (GgmlQuant)ggml_sym(h, "quantize_row_", FMTS[fi].type, "_ref");
        int B = blocks_bytes(f), nb = cols / blocks_elems(f), differ = 0;
        uint8_t *ours = malloc((size_t)nb * B), *theirs = malloc((size_t)nb * B);
        cr_assert(ours && theirs);
        for (int row = 0; row < rows; row++) {
            random_row(x, cols, &r, row);
            blocks_quantize_row(f, ours, x, cols);
            q(x, theirs, cols);
            for (int b = 0; b < nb; b++)
                if (memcmp(ours + b * B, theirs + b * B, (size_t)B) != 0 && differ++ < 4) {
                    char ho[2 * 256 + 1], ht[2 * 256 + 1];
                    hex(ho, ours + b * B, B);
                    hex(ht, theirs + b * B, B);
                    fprintf(stderr, "quant_blocks: %s row %d block %d: blocks_quantize_row %s, ggml %s\n",
                            ggml_type_name(FMTS[fi].type), row, b, ho, ht);
                }
        }
        fprintf(stderr, "quant_blocks: %-4s %d blocks quantized: %d differ from ggml's quantize_row_%s_ref\n",
                ggml_type_name(FMTS[fi].type), rows * nb, differ, ggml_type_name(FMTS[fi].type));
        cr_expect_eq(differ, 0, "%s: %d blocks differ from ggml's reference quantizer", ggml_type_name(FMTS[fi].type),
                     differ);
        free(ours);
        free(theirs);
    }
    free(x);
    dlclose(h);
}

// The 6-bit scale and min of sub-block j of a q4_K / q5_K block's 12 scale bytes (ggml's get_scale_min_k4).
static void k_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 15) | (q[j - 4] >> 6) << 4;
        *m = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
    }
}

// What element e of block blk may decode to: code u's value, u in [0, n), in dequantization's order of operations.
typedef struct {
    float step, base; // value(u) = step * (u - off) + base  (q8_0 / q5_0 / q6_K: base 0; q4_1 ..: base m; k: -ml)
    int off, n;
} Grid;

static Grid elem_grid(WeightFormat f, const uint8_t *blk, int e) {
    switch (f) {
    case WF_Q8_0: return (Grid){half_at(blk), 0.0f, 128, 256};
    case WF_Q4_1: return (Grid){half_at(blk), half_at(blk + 2), 0, 16};
    case WF_Q5_0: return (Grid){half_at(blk), 0.0f, 16, 32};
    case WF_Q5_1: return (Grid){half_at(blk), half_at(blk + 2), 0, 32};
    case WF_Q6_K: return (Grid){half_at(blk + 208) * (float)(int8_t)blk[192 + e / 16], 0.0f, 32, 64};
    default: {
        int sc, m;
        k_scale_min(e / 32, blk + 4, &sc, &m);
        return (Grid){half_at(blk) * (float)sc, -(half_at(blk + 2) * (float)m), 0, f == WF_Q4_K ? 16 : 32};
    }
    }
}

static float grid_value(const Grid *g, int u) {
    return g->base != 0.0f ? g->step * (float)(u - g->off) + g->base : g->step * (float)(u - g->off);
}

// The largest error blocks_quantize_row may leave on element e of block blk, from the stored scales. fp16 rounds a
// scale by at most 2^-11 of itself (written 2^-10 for slack; the float arithmetic of the code choice adds ~1e-6 of a
// step, covered by 1e-3 of one).
//   q8_0, q4_1, q5_1: the code rounds to the nearest step of the unrounded d, so |x - y| <= 0.5 d + nmax |d - d_h| +
//       |m - m_h| <= 0.5 |d_h| + 2^-10 (nmax |d_h| + |m_h|): 0.51 .. 0.53 of a step, up to the |m| term;
//   q5_0: the same with nmax 16 (codes -16 .. 15 of d), but the value of largest magnitude maps to -16 d, so values
//       within half a step of +16 d are clamped to 15 d: a whole step at code 31;
//   q4_K, q5_K (sub-block s: dl = d sc_s, ml = dmin m_s): inside [-ml, nmax dl - ml] the code is the nearest, 0.5 dl;
//       the 6-bit grids of sc and m move the ends of that range from the sub-block's extremes by at most
//       nmax (0.5 + 63 * 2^-11) d at the top and (0.5 + 63 * 2^-11) dmin at the bottom, so
//       |x - y| <= 0.5 dl + 0.54 (nmax d + dmin): 0.62 (q4_K) or 0.75 (q5_K) of the largest sub-block step 63 d;
//   q6_K (sub-block s: dl = d sc_s, codes -32 .. 31 of dl): the sub-block's value of largest magnitude maps to -32 dl'
//       (dl' its unrounded scale, |dl - dl'| <= 1.0625 |d|: the 8-bit grid, 128 clamped to 127, fp16), and values
//       up to +32 dl' are clamped to code 31: |x - y| <= |dl| + 34 |d|, 1.27 of the largest sub-block step 128 |d|.
static float error_bound(WeightFormat f, const uint8_t *blk, int e, float y) {
    const float ulp = 1.0f / 1024.0f;
    Grid g = elem_grid(f, blk, e);
    float step = fabsf(g.step), slop = 1e-3f * step;
    switch (f) {
    case WF_Q8_0: return 0.5f * step + ulp * 127.0f * step + slop;
    case WF_Q4_1:
    case WF_Q5_1: return 0.5f * step + ulp * ((float)(g.n - 1) * step + fabsf(g.base)) + slop;
    case WF_Q5_0: {
        int top = step > 0.0f && lrintf(y / g.step) == 15;
        return (top ? 1.0f : 0.5f) * step + ulp * 16.0f * step + slop;
    }
    case WF_Q6_K: return step + 34.0f * fabsf(half_at(blk + 208)) + slop;
    default:
        return 0.5f * step + 0.54f * ((float)(g.n - 1) * fabsf(half_at(blk)) + fabsf(half_at(blk + 2))) + slop;
    }
}

// The k-quants choose each code under the stored (rounded) scales: |x - y| is the least over the codes.
static int nearest_code(WeightFormat f, const uint8_t *blk, int e, float x, float y) {
    Grid g = elem_grid(f, blk, e);
    float best = INFINITY;
    for (int u = 0; u < g.n; u++)
        best = fminf(best, fabsf(x - grid_value(&g, u)));
    return fabsf(x - y) <= best + 1e-5f * fabsf(g.step) + 1e-6f * fabsf(x);
}

// The round-trip tolerances on RMS(x - y) / RMS(x). A uniform rounding error of one step is step / sqrt(12); on
// centered rows the step is about (range of 32 normals ~ 4.1 sigma) / nmax for q4_1 / q5_1 / q4_K / q5_K, (largest
// magnitude ~ 2.2 sigma) / 127 for q8_0 and / 16 for q5_0, (of 16 normals ~ 1.9 sigma) / 32 for q6_K: 0.005, 0.079,
// 0.040, 0.038, 0.08, 0.04, 0.017, less on the offset rows for the formats with a min. Measured on these seeded rows:
// 0.0042, 0.054, 0.038, 0.022, 0.050, 0.025, 0.0165; the limits are those plus about a third.
static const double RMS_LIMIT[] = {0.0056, 0.072, 0.051, 0.03, 0.067, 0.034, 0.022};

// One row of x quantized and dequantized; returns the elements over their bound, counts the k-quants' non-nearest
// codes into *far and sums squares into *se / *sx.
static int round_trip_row(int fi, const float *x, int cols, int *far, double *se, double *sx, float *worst) {
    WeightFormat f = FMTS[fi].f;
    int E = blocks_elems(f), B = blocks_bytes(f), over = 0;
    uint8_t *q = malloc((size_t)(cols / E) * B);
    float *y = malloc((size_t)cols * sizeof(float));
    cr_assert(q && y);
    blocks_quantize_row(f, q, x, cols);
    blocks_dequant_row(f, y, q, cols);
    for (int k = 0; k < cols; k++) {
        const uint8_t *blk = q + (size_t)(k / E) * B;
        float err = fabsf(x[k] - y[k]), bound = error_bound(f, blk, k % E, y[k]);
        if (!(err <= bound) && over++ < 4)
            fprintf(stderr, "quant_blocks: %s element %d: x %.7g, round trip %.7g, error %.3g over the bound %.3g\n",
                    ggml_type_name(FMTS[fi].type), k, x[k], y[k], err, bound);
        if (bound > 0 && err / bound > *worst)
            *worst = err / bound;
        if (f == WF_Q4_K || f == WF_Q5_K || f == WF_Q6_K)
            *far += !nearest_code(f, blk, k % E, x[k], y[k]);
        *se += (double)err * err;
        *sx += (double)x[k] * x[k];
    }
    free(q);
    free(y);
    return over;
}

Test(quant_blocks, quantize_round_trip) {
    const int cols = 1024, rows = 48;
    ErRng r;
    rng_seed(&r, 3);
    float *x = malloc(cols * sizeof(float)), *y = malloc(cols * sizeof(float));
    uint8_t *q = malloc((size_t)cols * 2);
    cr_assert(x && y && q);
    for (int fi = 0; fi < N_FMTS; fi++) {
        WeightFormat f = FMTS[fi].f;
        const char *name = ggml_type_name(FMTS[fi].type);
        int over = 0, far = 0;
        double se = 0, sx = 0;
        float worst = 0;
        for (int row = 0; row < rows; row++) {
            random_row(x, cols, &r, row);
            over += round_trip_row(fi, x, cols, &far, &se, &sx, &worst);
        }
        double rms = sqrt(se / sx);
        fprintf(stderr, "quant_blocks: %-4s round trip of %d rows: relative RMS error %.4f (limit %.4f), largest "
                "error %.2f of its bound, %d over it, %d codes not the nearest\n", name, rows, rms, RMS_LIMIT[fi],
                worst, over, far);
        cr_expect_eq(over, 0, "%s: %d values round-trip with more error than their bound", name, over);
        cr_expect_eq(far, 0, "%s: %d codes are not the nearest under the stored scales", name, far);
        cr_expect_leq(rms, RMS_LIMIT[fi], "%s: relative RMS error %.4f", name, rms);
        // Zeros give zeros.
        memset(x, 0, cols * sizeof(float));
        blocks_quantize_row(f, q, x, cols);
        blocks_dequant_row(f, y, q, cols);
        int nonzero = 0;
        for (int k = 0; k < cols; k++)
            nonzero += y[k] != 0.0f;
        cr_expect_eq(nonzero, 0, "%s: a row of zeros round-trips to %d nonzero values", name, nonzero);
    }
    free(x);
    free(y);
    free(q);
}

// blocks_find_nonfinite: none in finite blocks; the first block whose d or (second scale) m is NaN or infinite.
Test(quant_blocks, find_nonfinite) {
    static const uint16_t BAD[] = {0x7e00, 0x7c00, 0xfc00, 0x7c01, 0xffff};
    ErRng r;
    rng_seed(&r, 4);
    for (int fi = 0; fi < N_FMTS; fi++) {
        const size_t nb = 9, B = (size_t)blocks_bytes(FMTS[fi].f);
        uint8_t *b = random_blocks(fi, nb, &r, NULL);
        cr_expect_eq(blocks_find_nonfinite(FMTS[fi].f, b, nb), nb, "%s", ggml_type_name(FMTS[fi].type));
        for (int s = 0; s < 2 && FMTS[fi].at[s] >= 0; s++)
            for (size_t k = 0; k < sizeof BAD / sizeof BAD[0]; k++) {
                size_t at = (3 + k) * B + (size_t)FMTS[fi].at[s];
                uint8_t keep[2] = {b[at], b[at + 1]};
                memcpy(b + at, &BAD[k], 2);
                cr_expect_eq(blocks_find_nonfinite(FMTS[fi].f, b, nb), 3 + k, "%s: scale %d = 0x%04x in block %zu",
                             ggml_type_name(FMTS[fi].type), s, BAD[k], 3 + k);
                memcpy(b + at, keep, 2);
            }
        er_free(b);
    }
}
