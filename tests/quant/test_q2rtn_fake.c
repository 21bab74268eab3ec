// The 2-bit RTN baseline (q2rtn: a q2lut codebook of 4 evenly spaced levels) against the k-means
// codebook, and the fake-quantization primitives QAT uses.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/rng.h"
#include "core/threads.h"
#include "quant/quant.h"
#include "quant/quantizer.h"
#include "tests/common/helpers.h"

// Gaussian rows, or with 2% outliers (8x) when heavy.
static float *rows_of(int n, uint64_t seed, int heavy) {
    float *v = malloc(sizeof(float) * (size_t)n);
    ErRng r;
    rng_seed(&r, seed);
    for (int i = 0; i < n; i++) {
        float z = rng_normal(&r);
        v[i] = heavy && rng_uniform(&r) < 0.02f ? 8.0f * z : z;
    }
    return v;
}

static double row_sq_error(const Weight *w, const float *src, int r) {
    float row[512];
    cr_assert(w->cols <= 512);
    weight_row_f32(row, w, r);
    double e = 0;
    for (int k = 0; k < w->cols; k++) {
        double d = (double)src[(size_t)r * w->cols + k] - row[k];
        e += d * d;
    }
    return e;
}

static int distinct(const float *x, int n) {
    float seen[64];
    return helper_distinct(x, n, seen, 64);
}

Test(q2rtn, levels_evenly_spaced_and_codes_nearest) {
    threads_set(2);
    const int R = 16, K = 200; // K not a multiple of 32: the packed tail too
    for (int heavy = 0; heavy < 2; heavy++) {
        float *x = rows_of(R * K, 5 + heavy, heavy);
        QuantOptions o;
        quant_options_default(&o, WF_Q2LUT, 0);
        o.uniform = 1;
        Weight w;
        cr_assert_eq(quantize_matrix(&w, x, R, K, NULL, &o), 0);
        cr_assert_eq(w.fmt, WF_Q2LUT);
        float row[200];
        for (int r = 0; r < R; r++) {
            float l[4];
            for (int j = 0; j < 4; j++)
                l[j] = f16_to_f32(w.lut[r * 4 + j]);
            float step = l[1] - l[0];
            cr_assert_gt(step, 0.0f, "row %d: levels not increasing", r);
            for (int j = 1; j < 4; j++) // equal steps up to the fp16 rounding of each level
                cr_assert(fabsf((l[j] - l[j - 1]) - step) <= 2e-3f * (fabsf(l[0]) + fabsf(l[3])),
                          "row %d: steps %g and %g", r, step, l[j] - l[j - 1]);
            weight_row_f32(row, &w, r);
            cr_assert_leq(distinct(row, K), 4);
            for (int k = 0; k < K; k++) {
                float v = x[r * K + k], d = fabsf(row[k] - v);
                for (int j = 0; j < 4; j++)
                    cr_assert_leq(d, fabsf(l[j] - v), "row %d col %d: not the nearest level", r, k);
            }
        }
        // Minmax keeps the row's range: the end levels are its min and max (in fp16).
        Weight mm;
        o.search = QSEARCH_MINMAX;
        cr_assert_eq(quantize_matrix(&mm, x, R, K, NULL, &o), 0);
        for (int r = 0; r < R; r++) {
            float mn = x[r * K], mx = x[r * K];
            for (int k = 1; k < K; k++) {
                mn = fminf(mn, x[r * K + k]);
                mx = fmaxf(mx, x[r * K + k]);
            }
            cr_assert_float_eq(f16_to_f32(mm.lut[r * 4]), mn, 2e-3f * fabsf(mn) + 1e-4f);
            cr_assert_float_eq(f16_to_f32(mm.lut[r * 4 + 3]), mn + 3.0f * ((mx - mn) / 3.0f),
                               2e-3f * (fabsf(mn) + fabsf(mx)) + 1e-4f);
            cr_assert_leq(row_sq_error(&w, x, r), row_sq_error(&mm, x, r) * (1 + 1e-9), "lp search worse than minmax");
        }
        weight_free(&mm);
        weight_free(&w);
        free(x);
    }
}

Test(q2rtn, kmeans_codebook_never_worse) {
    threads_set(2);
    const int R = 48, K = 256;
    for (int heavy = 0; heavy < 2; heavy++) {
        float *x = rows_of(R * K, 11 + heavy, heavy);
        QuantOptions o;
        quant_options_default(&o, WF_Q2LUT, 0);
        Weight km, rtn;
        cr_assert_eq(quantize_matrix(&km, x, R, K, NULL, &o), 0);
        o.uniform = 1;
        cr_assert_eq(quantize_matrix(&rtn, x, R, K, NULL, &o), 0);
        double tk = 0, tr = 0;
        for (int r = 0; r < R; r++) {
            double ek = row_sq_error(&km, x, r), er = row_sq_error(&rtn, x, r);
            // Row by row (k-means also starts from the uniform levels; fp16 rounding of its centroids aside).
            cr_assert(ek <= er * (1 + 1e-3), "%s row %d: k-means %g > rtn %g", heavy ? "outliers" : "gaussian", r, ek,
                      er);
            tk += ek;
            tr += er;
        }
        double rk = quant_rel_error(&km, x), rr = quant_rel_error(&rtn, x);
        cr_assert(tk < tr && rk < rr, "k-means %g not below rtn %g", rk, rr);
        if (heavy) // outliers stretch the uniform grid; the codebook adapts
            cr_assert(rk < 0.8 * rr, "with outliers: k-means %g vs rtn %g", rk, rr);
        weight_free(&km);
        weight_free(&rtn);
        free(x);
    }
}

Test(fake_quant, equals_quantize_then_dequantize) {
    threads_set(2);
    const int R = 12, K = 100;
    float *x = rows_of(R * K, 17, 1);
    float *y = malloc(sizeof(float) * R * K), *z = malloc(sizeof(float) * R * K);
    struct {
        WeightFormat f;
        int group, uniform, levels;
    } cases[] = {{WF_Q2LUT, 0, 0, 4}, {WF_Q2LUT, 0, 1, 4}, {WF_Q4, 0, 0, 15}, {WF_Q4LUT, 0, 0, 16}, {WF_Q8, 0, 0, 255}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        QuantOptions o;
        quant_options_default(&o, cases[c].f, cases[c].group);
        o.uniform = cases[c].uniform;
        cr_assert_eq(quant_fake_quant_rows(y, x, R, K, NULL, &o), 0);
        Weight w;
        cr_assert_eq(quantize_matrix(&w, x, R, K, NULL, &o), 0);
        quant_dequant_rows(z, &w, 0, R);
        cr_assert_eq(memcmp(y, z, sizeof(float) * R * K), 0, "%s: fake quant != quantize + dequantize",
                     weight_format_name(cases[c].f));
        for (int r = 0; r < R; r++)
            cr_assert_leq(distinct(y + r * K, K), cases[c].levels < 64 ? cases[c].levels : 65);
        if (cases[c].f == WF_Q2LUT || cases[c].f == WF_Q4LUT) {
            // The assignment step with the stored codebook reproduces the stored codes.
            memset(z, 0, sizeof(float) * R * K);
            quant_fake_quant_lut(z, x, R, K, w.lut, cases[c].f == WF_Q2LUT ? 4 : 16);
            cr_assert_eq(memcmp(y, z, sizeof(float) * R * K), 0, "lut assignment != stored codes");
        }
        weight_free(&w);
    }
    // In place, and idempotent: Q(Q(W)) = Q(W) for a fixed codebook.
    QuantOptions o;
    quant_options_default(&o, WF_Q2LUT, 0);
    Weight w;
    cr_assert_eq(quantize_matrix(&w, x, R, K, NULL, &o), 0);
    memcpy(y, x, sizeof(float) * R * K);
    quant_fake_quant_lut(y, y, R, K, w.lut, 4);
    memcpy(z, y, sizeof(float) * R * K);
    quant_fake_quant_lut(z, z, R, K, w.lut, 4);
    cr_assert_eq(memcmp(y, z, sizeof(float) * R * K), 0);
    weight_free(&w);
    free(x);
    free(y);
    free(z);
}
