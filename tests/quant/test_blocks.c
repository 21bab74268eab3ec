// The GGUF block formats of quant/blocks.h (q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K) against ggml itself and
// through the files that hold them:
//   - blocks_dequant_row equals ggml's dequantize_row_* bit for bit on random blocks (every byte random, the fp16
//     scales finite: zero, subnormal and negative ones among them). ggml is llama.cpp's libggml-base.so from npm's
//     node-llama-cpp (scripts/llama_cpp.sh --install), dlopened; skipped loudly without node / npm or off x86-64 Linux;
//   - blocks_quantize_row writes the bytes of ggml's reference quantizers where those take the block's extremes too
//     (q8_0, q4_0, q4_1, q5_0, q5_1), k-quant codes nearest under the stored scales, a round-trip error within a bound
//     derived per format from the stored scales, and zeros for zeros; with importances, a lower weighted error;
//   - a GGUF of mixed block types loads in place and exports back byte for byte (model_gguf_put with the model's
//     default type, and gguf_export_model); through a model dir (model_save, model_load) the bytes stay too;
//   - a NaN or infinite block scale is refused in a GGUF and in a model dir, naming the file and the tensor.
#include <criterion/criterion.h>
#include <ctype.h>
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
#include "core/safetensors.h"
#include "data/tokenizer.h"
#include "model/gguf_model.h"
#include "model/model.h"
#include "quant/blocks.h"
#include "quant/quant.h"
#include "tests/common/helpers.h"
#include "train/gguf_export.h"

TestSuite(quant_blocks, .timeout = 300);

// The formats, their ggml types and the byte offsets of a block's fp16 scales in ggml's layouts (-1: none).
static const struct {
    WeightFormat f;
    uint32_t type;
    int at[2];
} FMTS[] = {
    {WF_Q8_0, GGML_Q8_0, {0, -1}}, {WF_Q4_1, GGML_Q4_1, {0, 2}}, {WF_Q5_0, GGML_Q5_0, {0, -1}},
    {WF_Q5_1, GGML_Q5_1, {0, 2}},  {WF_Q4_K, GGML_Q4_K, {0, 2}}, {WF_Q5_K, GGML_Q5_K, {0, 2}},
    {WF_Q6_K, GGML_Q6_K, {208, -1}}, {WF_Q4_0, GGML_Q4_0, {0, -1}}, // (q4_0 last: the others draw the rows they did)
};
#define N_FMTS (int)(sizeof FMTS / sizeof FMTS[0])

static int fmt_of_type(uint32_t type) {
    for (int i = 0; i < N_FMTS; i++)
        if (FMTS[i].type == type)
            return i;
    cr_assert_fail("ggml type %u is not a block format", type);
    return -1;
}

static int fmt_of(WeightFormat f) {
    for (int i = 0; i < N_FMTS; i++)
        if (FMTS[i].f == f)
            return i;
    cr_assert_fail("format %d is not a block format", (int)f);
    return -1;
}

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
    for (int fi = 0; fi < N_FMTS; fi++) {
        WeightFormat f = FMTS[fi].f;
        if (blocks_elems(f) != 32) // q8_0, q4_1, q5_0, q5_1, q4_0
            continue;
        GgmlQuant q = (GgmlQuant)ggml_sym(h, "quantize_row_", FMTS[fi].type, "_ref");
        int B = blocks_bytes(f), nb = cols / blocks_elems(f), differ = 0;
        uint8_t *ours = malloc((size_t)nb * B), *theirs = malloc((size_t)nb * B);
        cr_assert(ours && theirs);
        for (int row = 0; row < rows; row++) {
            random_row(x, cols, &r, row);
            blocks_quantize_row(f, ours, x, NULL, cols);
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
    float step, base; // value(u) = step * (u - off) + base (q8_0 / q4_0 / q5_0 / q6_K: base 0; q4_1 ..: base m; k: -ml)
    int off, n;
} Grid;

static Grid elem_grid(WeightFormat f, const uint8_t *blk, int e) {
    switch (f) {
    case WF_Q8_0: return (Grid){half_at(blk), 0.0f, 128, 256};
    case WF_Q4_0: return (Grid){half_at(blk), 0.0f, 8, 16};
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
//   q4_0, q5_0: the same with nmax 8 (16): codes -8 .. 7 (-16 .. 15) of d, but the value of largest magnitude maps to
//       -8 d (-16 d), so values within half a step of +8 d (+16 d) are clamped to 7 d (15 d): a whole step at the top
//       code;
//   q4_K, q5_K, q6_K: each sub-block's range may be clipped (the scale search trades its extremes for a finer step),
//       so the bound is that of the nearest code: 0.5 dl inside the grid's range [lowest, highest level], plus the
//       distance of x beyond it outside.
static float error_bound(WeightFormat f, const uint8_t *blk, int e, float x, float y) {
    const float ulp = 1.0f / 1024.0f;
    Grid g = elem_grid(f, blk, e);
    float step = fabsf(g.step), slop = 1e-3f * step;
    switch (f) {
    case WF_Q8_0: return 0.5f * step + ulp * 127.0f * step + slop;
    case WF_Q4_1:
    case WF_Q5_1: return 0.5f * step + ulp * ((float)(g.n - 1) * step + fabsf(g.base)) + slop;
    case WF_Q4_0:
    case WF_Q5_0: {
        int top = step > 0.0f && lrintf(y / g.step) == g.n - 1 - g.off;
        return (top ? 1.0f : 0.5f) * step + ulp * (float)g.off * step + slop;
    }
    default: {
        float a = grid_value(&g, 0), b = grid_value(&g, g.n - 1), lo = fminf(a, b), hi = fmaxf(a, b);
        return 0.5f * step + (x < lo ? lo - x : x > hi ? x - hi : 0.0f) + slop;
    }
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
// magnitude ~ 2.2 sigma) / 127 for q8_0, / 16 for q5_0 and / 8 for q4_0, (of 16 normals ~ 1.9 sigma) / 32 for q6_K:
// 0.005, 0.079, 0.040, 0.038, 0.08, 0.04, 0.017, 0.079 (FMTS's order), less on the offset rows for the formats with a
// min. Measured on these seeded rows: 0.0042, 0.054, 0.038, 0.022, 0.047, 0.024, 0.0164, 0.080 (the k-quants' with
// the clipping search; 0.050, 0.025, 0.0165 from the extremes alone); the limits are those plus about a third.
static const double RMS_LIMIT[] = {0.0056, 0.072, 0.051, 0.03, 0.067, 0.034, 0.022, 0.107};

// One row of x quantized and dequantized; returns the elements over their bound, counts the k-quants' non-nearest
// codes into *far and sums squares into *se / *sx.
static int round_trip_row(int fi, const float *x, int cols, int *far, double *se, double *sx, float *worst) {
    WeightFormat f = FMTS[fi].f;
    int E = blocks_elems(f), B = blocks_bytes(f), over = 0;
    uint8_t *q = malloc((size_t)(cols / E) * B);
    float *y = malloc((size_t)cols * sizeof(float));
    cr_assert(q && y);
    blocks_quantize_row(f, q, x, NULL, cols);
    blocks_dequant_row(f, y, q, cols);
    for (int k = 0; k < cols; k++) {
        const uint8_t *blk = q + (size_t)(k / E) * B;
        float err = fabsf(x[k] - y[k]), bound = error_bound(f, blk, k % E, x[k], y[k]);
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
        blocks_quantize_row(f, q, x, NULL, cols);
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

// With importances (as ertrain quantize --calib computes them) the weighted squared error of every format's rows
// is lower than without (ggml's reference rounding), summed over 48 rows whose importance is 50 on a tenth of the
// columns and 1 elsewhere.
Test(quant_blocks, importance_weighted_rounding) {
    const int cols = 512, rows = 48;
    ErRng r;
    rng_seed(&r, 6);
    float *x = malloc(cols * sizeof(float)), *y = malloc(cols * sizeof(float)), *imp = malloc(cols * sizeof(float));
    uint8_t *q = malloc((size_t)cols * 2);
    cr_assert(x && y && imp && q);
    for (int fi = 0; fi < N_FMTS; fi++) {
        WeightFormat f = FMTS[fi].f;
        double with = 0, without = 0;
        for (int row = 0; row < rows; row++) {
            random_row(x, cols, &r, row);
            for (int k = 0; k < cols; k++)
                imp[k] = rng_below(&r, 10) == 0 ? 50.0f : 1.0f;
            for (int pass = 0; pass < 2; pass++) {
                blocks_quantize_row(f, q, x, pass ? imp : NULL, cols);
                blocks_dequant_row(f, y, q, cols);
                double e = 0;
                for (int k = 0; k < cols; k++)
                    e += (double)imp[k] * ((double)y[k] - x[k]) * ((double)y[k] - x[k]);
                *(pass ? &with : &without) += e;
            }
        }
        fprintf(stderr, "quant_blocks: %-4s importance-weighted error with the importances %.4g, without %.4g (%.3fx)\n",
                ggml_type_name(FMTS[fi].type), with, without, with / without);
        cr_expect_lt(with, without, "%s: the importances did not lower the weighted error (%.6g vs %.6g)",
                     ggml_type_name(FMTS[fi].type), with, without);
    }
    free(x);
    free(y);
    free(imp);
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

// ---- files ----

// The matrices' types in a test model: one config name (a k-quant falling back where rows are not whole
// super-blocks, as quant_block_fallback), or mixed: layer 0 in k-quants, the others in the 32-element types,
// token_embd q8_0 and output q6_K in both.
typedef struct {
    int mixed;
    WeightFormat linear; // the config's weights (mixed = 0)
} TypeRule;

static const struct {
    const char *suffix;
    uint32_t k, small;
} LAYER_TYPES[] = {
    {"attn_q.weight", GGML_Q4_K, GGML_Q5_0},    {"attn_k.weight", GGML_Q5_K, GGML_Q8_0},
    {"attn_v.weight", GGML_Q6_K, GGML_Q4_1},    {"attn_output.weight", GGML_Q4_K, GGML_Q5_1},
    {"ffn_gate.weight", GGML_Q5_K, GGML_Q4_0},  {"ffn_up.weight", GGML_Q6_K, GGML_Q8_0},
    {"ffn_down.weight", GGML_Q4_K, GGML_Q4_1},
};

static uint32_t matrix_type(const TypeRule *rule, const char *name, uint64_t cols) {
    if (strcmp(name, "token_embd.weight") == 0)
        return GGML_Q8_0;
    if (strcmp(name, "output.weight") == 0)
        return GGML_Q6_K;
    if (!rule->mixed)
        return FMTS[fmt_of(quant_block_fallback(rule->linear, (int)cols))].type;
    for (size_t i = 0; i < sizeof LAYER_TYPES / sizeof LAYER_TYPES[0]; i++) {
        const char *dot = strchr(name + 4, '.');
        if (dot && strcmp(dot + 1, LAYER_TYPES[i].suffix) == 0) {
            int k = strncmp(name, "blk.0.", 6) == 0;
            cr_assert(!k || cols % GGML_QK_K == 0, "%s: rows of %llu", name, (unsigned long long)cols);
            return k ? LAYER_TYPES[i].k : LAYER_TYPES[i].small;
        }
    }
    cr_assert_fail("no type for %s", name);
    return 0;
}

// A model of C 256 over the tiny tokenizer's 512 tokens, untied (an output tensor), FF as given.
static ModelConfig block_config(int FF, ModelArch arch) {
    ModelConfig c = helper_tiny_config(512, 256);
    c.C = 256, c.FF = FF, c.HS = 64, c.tied = 0, c.arch = arch;
    return c;
}

// One block scale set to a non-finite fp16: tensor, block, byte offset in it, value.
typedef struct {
    const char *tensor;
    int block, at;
    uint16_t h;
} Spoil;

// A random model of shape c with the tiny tokenizer written to path as GGUF, each matrix random valid blocks of the
// type rule gives it (vectors f32); with spoil, one scale made non-finite.
static void write_block_model(const char *path, const ModelConfig *c, const TypeRule *rule, uint64_t seed,
                              const Spoil *spoil) {
    Model m;
    Tokenizer *tok;
    GgufWriter w = {0};
    ErRng r;
    rng_seed(&r, seed);
    cr_assert_eq(model_build_random(&m, c, 0.05f, seed), ER_OK, "%s", er_last_error());
    cr_assert_eq(tok_load(&tok, "data/tiny_tokenizer"), ER_OK, "%s", er_last_error());
    cr_assert_eq(model_gguf_put(&m, GGML_F32, &w, NULL), ER_OK, "%s", er_last_error());
    cr_assert_eq(tok_gguf_put(tok, c->V, &w), ER_OK, "%s", er_last_error());
    int spoiled = 0;
    for (int i = 0; i < w.n_tensors; i++) {
        GgufWriteTensor *t = &w.tensors[i];
        if (t->ndim != 2)
            continue;
        int fi = fmt_of_type(matrix_type(rule, t->name, t->ne[0]));
        size_t nb = (size_t)(t->ne[0] * t->ne[1]) / (size_t)blocks_elems(FMTS[fi].f);
        uint8_t *b = random_blocks(fi, nb, &r, NULL);
        if (spoil && strcmp(t->name, spoil->tensor) == 0) {
            memcpy(b + (size_t)spoil->block * blocks_bytes(FMTS[fi].f) + spoil->at, &spoil->h, 2);
            spoiled = 1;
        }
        er_free(t->owned);
        t->type = FMTS[fi].type;
        t->nbytes = nb * (size_t)blocks_bytes(FMTS[fi].f);
        t->data = t->owned = b;
    }
    cr_assert(!spoil || spoiled, "no tensor %s", spoil ? spoil->tensor : "");
    cr_assert_eq(gguf_write(&w, path), ER_OK, "%s", er_last_error());
    gguf_writer_free(&w);
    tok_free(tok);
    model_free(&m);
}

// Every matrix of m (loaded from its GGUF) is in the format of its tensor's type, named alike (q4_K: "q4_k"), and
// used in place: the tensor's bytes in the mapping, owned by nobody (llama's q/k rows, which go back into HF order,
// are a copy of the weight's own). Returns the formats seen as a bit set.
static unsigned expect_in_place(const Model *m) {
    const GgufFile *f = m->gguf;
    cr_assert(f, "the model keeps no GGUF mapping");
    cr_assert_eq(f->n_tensors, m->n_params, "tensors and parameters differ in number");
    unsigned seen = 0;
    for (int i = 0; i < m->n_params; i++) {
        const ParamTensor *p = &m->params[i];
        const GgufTensor *t = &f->tensors[i]; // model_gguf_put writes the parameters in their order
        if (!p->w)
            continue;
        cr_assert(t->ne[0] == (uint64_t)p->shape[1] && t->ne[1] == (uint64_t)p->shape[0], "%s is not %s", p->name,
                  t->name);
        char want[16];
        snprintf(want, sizeof want, "%s", ggml_type_name(t->type));
        for (char *s = want; *s; s++)
            *s = (char)tolower((unsigned char)*s);
        cr_expect_str_eq(weight_format_name(p->w->fmt), want, "%s (%s)", p->name, t->name);
        int copied = m->cfg.arch == ARCH_LLAMA && (strstr(p->name, "q_proj") || strstr(p->name, "k_proj"));
        if (copied)
            cr_expect(p->w->owned && p->w->data == p->w->owned, "%s: llama's q/k rows are not a copy", p->name);
        else
            cr_expect(!p->w->owned && p->w->data == t->data, "%s (%s) is not used in place", p->name, t->name);
        seen |= 1u << p->w->fmt;
    }
    return seen;
}

// Every tensor of GGUF b is a's: the same names, types, shapes and bytes.
static void expect_same_tensors(const char *a, const char *b) {
    GgufFile fa, fb;
    cr_assert_eq(gguf_open(&fa, a), ER_OK, "%s", er_last_error());
    cr_assert_eq(gguf_open(&fb, b), ER_OK, "%s", er_last_error());
    cr_expect_eq(fa.n_tensors, fb.n_tensors, "%s has %d tensors, %s %d", a, fa.n_tensors, b, fb.n_tensors);
    int differ = 0;
    for (int i = 0; i < fa.n_tensors; i++) {
        const GgufTensor *ta = &fa.tensors[i], *tb = gguf_find_tensor(&fb, ta->name);
        int same = tb && tb->type == ta->type && tb->ndim == ta->ndim && !memcmp(tb->ne, ta->ne, sizeof ta->ne) &&
                   tb->nbytes == ta->nbytes && !memcmp(tb->data, ta->data, ta->nbytes);
        if (!same && differ++ < 4)
            fprintf(stderr, "quant_blocks: %s: tensor %s (%s) %s\n", b, ta->name, ggml_type_name(ta->type),
                    !tb ? "is missing" : tb->type != ta->type ? "has another type" : "has other bytes");
    }
    cr_expect_eq(differ, 0, "%s: %d tensors differ from %s's", b, differ, a);
    gguf_close(&fa);
    gguf_close(&fb);
}

// A GGUF of mixed block types (every one of the eight) loaded in place, then written back three ways: the model's
// default type (MODEL_GGUF_NATIVE) through model_gguf_put, the same once the model is tiled for decode (the rows
// gathered back from the tiles), and gguf_export_model from the .gguf; all hold the first file's tensors byte for
// byte.
static void reexport_case(ModelArch arch) {
    char *tmp = helper_tmpdir("er_blocks"), p1[512], p2[512], p3[512], p4[512];
    snprintf(p1, sizeof p1, "%s/mixed.gguf", tmp);
    snprintf(p2, sizeof p2, "%s/put.gguf", tmp);
    snprintf(p3, sizeof p3, "%s/export.gguf", tmp);
    snprintf(p4, sizeof p4, "%s/tiled.gguf", tmp);
    ModelConfig c = block_config(512, arch);
    TypeRule rule = {.mixed = 1};
    write_block_model(p1, &c, &rule, 5, NULL);
    Model m;
    Tokenizer *tok;
    GgufWriter w = {0};
    uint32_t type;
    cr_assert_eq(model_load(&m, p1, 0), ER_OK, "%s", er_last_error());
    unsigned seen = expect_in_place(&m);
    for (int fi = 0; fi < N_FMTS; fi++)
        cr_expect(seen & 1u << FMTS[fi].f, "no matrix is %s", ggml_type_name(FMTS[fi].type));
    cr_assert_eq(model_gguf_default_type(&m, &type), ER_OK, "%s", er_last_error());
    cr_expect_eq(type, MODEL_GGUF_NATIVE, "the default export type of a block model is %u", type);
    cr_assert_eq(tok_load(&tok, p1), ER_OK, "%s", er_last_error());
    cr_assert_eq(model_gguf_put(&m, type, &w, NULL), ER_OK, "%s", er_last_error());
    cr_assert_eq(tok_gguf_put(tok, m.cfg.V, &w), ER_OK, "%s", er_last_error());
    cr_assert_eq(gguf_write(&w, p2), ER_OK, "%s", er_last_error());
    cr_assert_eq(gguf_export_model(p1, p3, NULL, NULL), ER_OK, "%s", er_last_error());
    expect_same_tensors(p1, p2);
    expect_same_tensors(p1, p3);
    gguf_writer_free(&w);
    size_t released;
    cr_assert_eq(model_tile_for_decode(&m, &released, NULL, NULL), ER_OK, "%s", er_last_error());
    int tiled = 0, mats = 0, mapped = 0;
    for (int i = 0; i < m.n_params; i++) {
        tiled += m.params[i].w && m.params[i].w->tiled;
        mats += m.params[i].w != NULL;
        mapped += m.params[i].w && !m.params[i].w->owned;
    }
    fprintf(stderr, "quant_blocks: re-export of a model with %d of %d matrices tiled (%s)\n", tiled, mats,
            quant_simd_name());
    cr_expect(!released || mapped == 0, "%d matrices left in the file's mapping after tiling released %zu bytes",
              mapped, released);
    memset(&w, 0, sizeof w);
    cr_assert_eq(model_gguf_put(&m, type, &w, NULL), ER_OK, "%s", er_last_error());
    cr_assert_eq(tok_gguf_put(tok, m.cfg.V, &w), ER_OK, "%s", er_last_error());
    cr_assert_eq(gguf_write(&w, p4), ER_OK, "%s", er_last_error());
    expect_same_tensors(p1, p4);
    gguf_writer_free(&w);
    tok_free(tok);
    model_free(&m);
    helper_rmdir(tmp);
    er_free(tmp);
}

Test(quant_blocks, gguf_reexport_byte_identical) { reexport_case(ARCH_QWEN2); }
Test(quant_blocks, gguf_reexport_byte_identical_llama) { reexport_case(ARCH_LLAMA); }

// The weights of b are a's: formats, packed bytes, float values. The data tensor of each packed matrix in dir's
// model.safetensors is U8 [rows, row bytes].
static void expect_same_weights(const Model *a, const Model *b, const char *dir) {
    char *st = path_join(dir, "model.safetensors");
    StFile f;
    cr_assert_eq(safetensors_open(&f, st), ER_OK, "%s", er_last_error());
    cr_assert_eq(a->n_params, b->n_params);
    for (int i = 0; i < a->n_params; i++) {
        const ParamTensor *p = &a->params[i], *q = &b->params[i];
        cr_assert_str_eq(p->name, q->name);
        if (!p->w) {
            cr_expect(!memcmp(p->data, q->data, p->numel * sizeof(float)), "%s differs", p->name);
            continue;
        }
        size_t rb = weight_row_bytes(p->w->fmt, p->w->cols);
        cr_expect_eq(q->w->fmt, p->w->fmt, "%s: %s, was %s", p->name, weight_format_name(q->w->fmt),
                     weight_format_name(p->w->fmt));
        cr_expect(!memcmp(q->w->data, p->w->data, (size_t)p->w->rows * rb), "%s: the bytes differ", p->name);
        const StTensor *t = safetensors_find(&f, p->name);
        cr_assert(t, "%s: no tensor %s", st, p->name);
        cr_expect(t->dtype == DT_U8 && t->ndim == 2 && t->shape[0] == p->w->rows && t->shape[1] == (int64_t)rb,
                  "%s: %s is %s [%lld, %lld], expected U8 [%d, %zu]", st, p->name, dtype_name(t->dtype),
                  (long long)t->shape[0], (long long)t->shape[1], p->w->rows, rb);
    }
    safetensors_close(&f);
    er_free(st);
}

// The model's formats as a quantization_config names them: the config's weights (with quant_block_fallback),
// q8_0 embeddings and a q6_k lm_head.
static QuantConfig block_quant_config(WeightFormat linear) {
    QuantConfig q = {.enabled = 1, .linear = linear, .embed = WF_Q8_0, .lm_head = WF_Q6_K};
    snprintf(q.transforms, sizeof q.transforms, "none");
    return q;
}

// GGUF -> model dir -> GGUF, for configs whose k-quants fall back on ffn_down's rows of 288 (q4_k -> q5_0,
// q5_k -> q5_1, q6_k -> q8_0) and for q4_1 and q4_0: model_save writes the blocks as they are (U8 [rows, row bytes]),
// model_load reads them back the same, and the dir exports to the first GGUF's tensors byte for byte. A model loaded
// from a GGUF has no quantization_config, and model_save refuses packed matrices that a config does not name: the
// test gives it the config its formats follow (a mixed file like a Q4_K_M has none).
Test(quant_blocks, model_dir_round_trip) {
    static const WeightFormat LINEAR[] = {WF_Q4_K, WF_Q5_K, WF_Q6_K, WF_Q4_1, WF_Q4_0};
    char *tmp = helper_tmpdir("er_blocks");
    for (size_t i = 0; i < sizeof LINEAR / sizeof LINEAR[0]; i++) {
        char p1[512], p2[512], dir[512];
        snprintf(p1, sizeof p1, "%s/%s.gguf", tmp, weight_format_name(LINEAR[i]));
        snprintf(p2, sizeof p2, "%s/%s-again.gguf", tmp, weight_format_name(LINEAR[i]));
        snprintf(dir, sizeof dir, "%s/%s-dir", tmp, weight_format_name(LINEAR[i]));
        ModelConfig c = block_config(288, ARCH_QWEN2);
        TypeRule rule = {.mixed = 0, .linear = LINEAR[i]};
        write_block_model(p1, &c, &rule, 20 + i, NULL);
        Model g, d;
        Tokenizer *tok;
        GgufWriter w = {0};
        uint32_t type;
        cr_assert_eq(model_load(&g, p1, 0), ER_OK, "%s", er_last_error());
        g.quant = block_quant_config(LINEAR[i]);
        cr_assert_eq(model_save(&g, dir, 0), ER_OK, "%s", er_last_error());
        cr_assert_eq(model_load(&d, dir, 0), ER_OK, "%s", er_last_error());
        expect_same_weights(&g, &d, dir);
        cr_expect_eq(d.layers[0].wdown.fmt, quant_block_fallback(LINEAR[i], 288));
        cr_assert_eq(model_gguf_default_type(&d, &type), ER_OK, "%s", er_last_error());
        cr_assert_eq(tok_load(&tok, p1), ER_OK, "%s", er_last_error());
        cr_assert_eq(model_gguf_put(&d, type, &w, NULL), ER_OK, "%s", er_last_error());
        cr_assert_eq(tok_gguf_put(tok, d.cfg.V, &w), ER_OK, "%s", er_last_error());
        cr_assert_eq(gguf_write(&w, p2), ER_OK, "%s", er_last_error());
        expect_same_tensors(p1, p2);
        gguf_writer_free(&w);
        tok_free(tok);
        model_free(&d);
        model_free(&g);
    }
    helper_rmdir(tmp);
    er_free(tmp);
}

// ---- bad blocks ----

// The load of path refused, one line naming it, the tensor and what is wrong.
static void expect_refused(const char *path, const char *file, const char *tensor, int block) {
    Model m;
    char want[160];
    int rc = model_load(&m, path, 0);
    cr_expect_eq(rc, ER_EFORMAT, "%s: loaded (%d) with a non-finite scale in %s", path, rc, tensor);
    if (rc == ER_OK)
        model_free(&m);
    const char *msg = er_last_error();
    snprintf(want, sizeof want, "tensor \"%s\" holds a NaN or infinite scale in block %d", tensor, block);
    cr_expect(strstr(msg, file) && strstr(msg, want) && !strchr(msg, '\n'), "the error \"%s\" does not name %s and %s",
              msg, file, want);
}

// A q4_K block whose d is NaN (0x7e00) is refused, and so is each other kind of bad scale: an infinite dmin (q5_K),
// -inf d (q6_K, at byte 208), a NaN with a payload (q8_0 embeddings), an infinite m (q4_1), an infinite d (q4_0).
Test(quant_blocks, gguf_nonfinite_scale_refused) {
    static const Spoil SPOILS[] = {
        {"blk.0.attn_q.weight", 3, 0, 0x7e00},   {"blk.0.attn_k.weight", 0, 2, 0x7c00},
        {"blk.0.attn_v.weight", 7, 208, 0xfc00}, {"token_embd.weight", 100, 0, 0x7d01},
        {"blk.1.attn_v.weight", 5, 2, 0xfc00},   {"blk.1.ffn_gate.weight", 2, 0, 0x7c00},
    };
    char *tmp = helper_tmpdir("er_blocks"), path[512];
    ModelConfig c = block_config(512, ARCH_QWEN2);
    TypeRule rule = {.mixed = 1};
    for (size_t i = 0; i < sizeof SPOILS / sizeof SPOILS[0]; i++) {
        snprintf(path, sizeof path, "%s/bad-%zu.gguf", tmp, i);
        write_block_model(path, &c, &rule, 30 + i, &SPOILS[i]);
        expect_refused(path, path, SPOILS[i].tensor, SPOILS[i].block);
    }
    helper_rmdir(tmp);
    er_free(tmp);
}

// Two bytes of tensor `tensor` in a safetensors file, at offset `at` of its data, replaced by h (the old ones to *old).
static void patch_safetensors(const char *file, const char *tensor, size_t at, uint16_t h, uint16_t *old) {
    StFile f;
    cr_assert_eq(safetensors_open(&f, file), ER_OK, "%s", er_last_error());
    const StTensor *t = safetensors_find(&f, tensor);
    cr_assert(t && at + 2 <= t->nbytes, "%s: no tensor %s of %zu bytes", file, tensor, at + 2);
    long off = (long)((const char *)t->data - (const char *)f.map) + (long)at;
    safetensors_close(&f);
    FILE *fp = fopen(file, "r+b");
    cr_assert(fp, "%s", file);
    cr_assert(fseek(fp, off, SEEK_SET) == 0 && fread(old, 2, 1, fp) == 1);
    cr_assert(fseek(fp, off, SEEK_SET) == 0 && fwrite(&h, 2, 1, fp) == 1);
    cr_assert_eq(fclose(fp), 0);
}

// A model dir (q4_k weights: q5_0 on ffn_down's rows, q8_0 embeddings, q6_k lm_head) with one scale made infinite or
// NaN in turn is refused by model_load, naming model.safetensors and the tensor (quant_packed_load's check); with the
// bytes put back it loads.
Test(quant_blocks, model_dir_nonfinite_scale_refused) {
    static const struct {
        const char *tensor;
        int block;
        size_t at;
        uint16_t h;
    } CASES[] = {
        {"model.layers.0.self_attn.q_proj.weight", 2, 0, 0x7c00},  // q4_K d +inf
        {"model.layers.1.self_attn.v_proj.weight", 4, 2, 0xfc00},  // q4_K dmin -inf
        {"model.layers.0.mlp.down_proj.weight", 9, 0, 0x7e00},     // q5_0 d NaN
        {"lm_head.weight", 1, 208, 0x7c00},                        // q6_K d +inf
        {"model.embed_tokens.weight", 11, 0, 0xfc00},              // q8_0 d -inf
    };
    char *tmp = helper_tmpdir("er_blocks"), p1[512], dir[512];
    snprintf(p1, sizeof p1, "%s/q4_k.gguf", tmp);
    snprintf(dir, sizeof dir, "%s/dir", tmp);
    ModelConfig c = block_config(288, ARCH_QWEN2);
    TypeRule rule = {.mixed = 0, .linear = WF_Q4_K};
    write_block_model(p1, &c, &rule, 40, NULL);
    Model g;
    cr_assert_eq(model_load(&g, p1, 0), ER_OK, "%s", er_last_error());
    g.quant = block_quant_config(WF_Q4_K);
    cr_assert_eq(model_save(&g, dir, 0), ER_OK, "%s", er_last_error());
    char *st = path_join(dir, "model.safetensors");
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const ParamTensor *p = NULL;
        for (int k = 0; k < g.n_params && !p; k++)
            p = strcmp(g.params[k].name, CASES[i].tensor) == 0 ? &g.params[k] : NULL;
        cr_assert(p && p->w, "no matrix %s", CASES[i].tensor);
        size_t at = (size_t)CASES[i].block * (size_t)blocks_bytes(p->w->fmt) + CASES[i].at;
        uint16_t old;
        patch_safetensors(st, CASES[i].tensor, at, CASES[i].h, &old);
        expect_refused(dir, st, CASES[i].tensor, CASES[i].block);
        patch_safetensors(st, CASES[i].tensor, at, old, &old);
        Model d;
        cr_assert_eq(model_load(&d, dir, 0), ER_OK, "%s", er_last_error());
        model_free(&d);
    }
    model_free(&g);
    er_free(st);
    helper_rmdir(tmp);
    er_free(tmp);
}
