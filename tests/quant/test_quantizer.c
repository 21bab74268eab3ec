// Quantizer properties: the Lp scale search is never worse than min-max, the weighted k-means
// objective never goes up, q2lut represents rows of <= 4 distinct values exactly, q8 and q4 round
// trips stay within half a step, importance weights steer the error, GPTQ codes and dense-and-sparse
// corrections lower the output error.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/threads.h"
#include "quant/quant.h"
#include "quant/quantizer.h"

// Heavy-tailed rows (a few outliers), where clipping helps.
static float *heavy(int n, uint64_t seed) {
    float *v = malloc(sizeof(float) * (size_t)n);
    ErRng r;
    rng_seed(&r, seed);
    for (int i = 0; i < n; i++) {
        float z = rng_normal(&r);
        v[i] = rng_uniform(&r) < 0.02f ? 8.0f * z : z;
    }
    return v;
}

static double weighted_sq_error(const Weight *w, const float *src, const float *imp) {
    double e = 0;
    float *row = malloc(sizeof(float) * (size_t)w->cols);
    for (int r = 0; r < w->rows; r++) {
        weight_row_f32(row, w, r);
        for (int k = 0; k < w->cols; k++) {
            double d = (double)src[(size_t)r * w->cols + k] - row[k];
            e += (imp ? imp[(size_t)r * w->cols + k] : 1.0) * d * d;
        }
    }
    free(row);
    return e;
}

Test(quantizer, lp_search_never_worse_than_minmax) {
    threads_set(2);
    const int R = 24, K = 128;
    float *x = heavy(R * K, 3);
    WeightFormat fs[] = {WF_Q8, WF_Q4, WF_Q4G, WF_Q4G};
    int gs[] = {0, 0, 32, 128};
    for (int i = 0; i < 4; i++) {
        QuantOptions o;
        quant_options_default(&o, fs[i], gs[i]);
        Weight lp, mm;
        cr_assert_eq(quantize_matrix(&lp, x, R, K, NULL, &o), 0);
        o.search = QSEARCH_MINMAX;
        cr_assert_eq(quantize_matrix(&mm, x, R, K, NULL, &o), 0);
        double elp = weighted_sq_error(&lp, x, NULL), emm = weighted_sq_error(&mm, x, NULL);
        cr_assert(elp <= emm * (1 + 1e-12), "%s g%d: lp %g > minmax %g", weight_format_name(fs[i]), gs[i], elp, emm);
        if (fs[i] != WF_Q8) // with outliers, clipping must actually win at 4 bits
            cr_assert(elp < 0.95 * emm, "%s g%d: lp %g not better than minmax %g", weight_format_name(fs[i]), gs[i], elp,
                      emm);
        weight_free(&lp);
        weight_free(&mm);
    }
    // per row too, through the exposed pieces
    for (int r = 0; r < R; r++) {
        float s1, s2;
        int8_t q[128];
        double a = quant_rtn_sym(x + r * K, NULL, K, 7, QSEARCH_LP, 2.0, 20, &s1, q);
        double b = quant_rtn_sym(x + r * K, NULL, K, 7, QSEARCH_MINMAX, 2.0, 20, &s2, q);
        cr_assert(a <= b);
        uint16_t sc, z;
        uint8_t u[128];
        a = quant_rtn_asym4(x + r * K, NULL, K, QSEARCH_LP, 3.0, 20, &sc, &z, u);
        b = quant_rtn_asym4(x + r * K, NULL, K, QSEARCH_MINMAX, 3.0, 20, &sc, &z, u);
        cr_assert(a <= b, "p = 3");
    }
    free(x);
}

Test(quantizer, rtn_within_half_step) {
    const int R = 5, K = 64;
    float *x = heavy(R * K, 9);
    QuantOptions o;
    quant_options_default(&o, WF_Q8, 0);
    o.search = QSEARCH_MINMAX;
    Weight w;
    cr_assert_eq(quantize_matrix(&w, x, R, K, NULL, &o), 0);
    float row[64];
    for (int r = 0; r < R; r++) {
        weight_row_f32(row, &w, r);
        for (int k = 0; k < K; k++)
            cr_assert(fabsf(row[k] - x[r * K + k]) <= 0.5f * w.scale[r] * (1 + 1e-5f), "q8 [%d,%d]", r, k);
    }
    weight_free(&w);
    quant_options_default(&o, WF_Q4G, 16);
    o.search = QSEARCH_MINMAX;
    cr_assert_eq(quantize_matrix(&w, x, R, K, NULL, &o), 0);
    for (int r = 0; r < R; r++) {
        weight_row_f32(row, &w, r);
        for (int k = 0; k < K; k++) {
            float s = f16_to_f32(w.gscale[r * 4 + k / 16]);
            cr_assert(fabsf(row[k] - x[r * K + k]) <= 0.5f * s + 2e-3f * fabsf(x[r * K + k]) + 1e-3f, "q4g [%d,%d]", r,
                      k);
        }
    }
    weight_free(&w);
    free(x);
}

Test(quantizer, kmeans_objective_monotone) {
    const int n = 500, iters = 30;
    float *x = heavy(n, 21);
    float *imp = malloc(sizeof(float) * n);
    ErRng r;
    rng_seed(&r, 5);
    for (int i = 0; i < n; i++) {
        float g = rng_normal(&r);
        imp[i] = g * g; // squared gradients
    }
    int ks[] = {4, 16};
    for (int t = 0; t < 2; t++)
        for (int weighted = 0; weighted < 2; weighted++) {
            float c[16];
            uint8_t a[500];
            double hist[31];
            double obj = quant_kmeans_1d(x, weighted ? imp : NULL, n, ks[t], iters, c, a, hist);
            for (int i = 1; i <= iters; i++)
                cr_assert(hist[i] <= hist[i - 1], "k=%d weighted=%d: objective rose at iteration %d: %.17g -> %.17g",
                          ks[t], weighted, i, hist[i - 1], hist[i]);
            cr_assert(hist[iters] < hist[0], "k=%d: Lloyd did not improve on the init", ks[t]);
            cr_assert_eq(obj, hist[iters]);
            // the reported objective is the objective of the returned centroids and assignments
            double check = 0;
            for (int i = 0; i < n; i++) {
                cr_assert_lt(a[i], ks[t]);
                double d = (double)x[i] - c[a[i]];
                check += (weighted ? imp[i] : 1.0) * d * d;
            }
            cr_assert_float_eq(check, obj, 1e-9 * (1 + obj));
        }
    free(x);
    free(imp);
}

Test(quantizer, q2lut_exact_for_four_values) {
    const int R = 3, K = 37;
    const float vals[3][4] = {{-1.25f, 0.0f, 0.5f, 2.0f}, {3.0f, 3.0f, -0.75f, -0.75f}, {0.125f, 0.125f, 0.125f, 0.125f}};
    float x[3 * 37];
    for (int r = 0; r < R; r++)
        for (int k = 0; k < K; k++)
            x[r * K + k] = vals[r][(k * 7 + r) % 4];
    QuantOptions o;
    quant_options_default(&o, WF_Q2LUT, 0);
    Weight w;
    cr_assert_eq(quantize_matrix(&w, x, R, K, NULL, &o), 0);
    float row[37];
    for (int r = 0; r < R; r++) {
        weight_row_f32(row, &w, r);
        for (int k = 0; k < K; k++)
            cr_assert_eq(row[k], x[r * K + k], "row %d col %d: %g vs %g", r, k, row[k], x[r * K + k]);
    }
    cr_assert_eq(quant_rel_error(&w, x), 0.0);
    weight_free(&w);
}

Test(quantizer, q4lut_exact_for_sixteen_values) {
    const int R = 2, K = 70;
    float x[2 * 70];
    for (int r = 0; r < R; r++)
        for (int k = 0; k < K; k++)
            x[r * K + k] = (float)((k * 5 + r) % (r ? 9 : 16)) * 0.375f - 2.0f; // 16 and 9 distinct values
    QuantOptions o;
    quant_options_default(&o, WF_Q4LUT, 0);
    Weight w;
    cr_assert_eq(quantize_matrix(&w, x, R, K, NULL, &o), 0);
    cr_assert_eq(quant_rel_error(&w, x), 0.0);
    weight_free(&w);
    // on a smooth row 16 non-uniform levels beat 16 uniform ones (q4, Lp search)
    float *y = heavy(4 * 256, 8);
    Weight a, b;
    cr_assert_eq(quantize_matrix(&a, y, 4, 256, NULL, &o), 0);
    quant_options_default(&o, WF_Q4, 0);
    cr_assert_eq(quantize_matrix(&b, y, 4, 256, NULL, &o), 0);
    cr_assert(quant_rel_error(&a, y) < quant_rel_error(&b, y), "q4lut %g vs q4 %g", quant_rel_error(&a, y),
              quant_rel_error(&b, y));
    weight_free(&a);
    weight_free(&b);
    free(y);
}

Test(quantizer, importance_steers_the_error) {
    // Fisher-weighted k-means puts its error where the importance is small.
    const int K = 256;
    float *x = heavy(K, 77), *imp = malloc(sizeof(float) * K);
    for (int k = 0; k < K; k++)
        imp[k] = k < K / 4 ? 100.0f : 0.01f;
    QuantOptions o;
    quant_options_default(&o, WF_Q2LUT, 0);
    Weight plain, fisher;
    cr_assert_eq(quantize_matrix(&plain, x, 1, K, NULL, &o), 0);
    cr_assert_eq(quantize_matrix(&fisher, x, 1, K, imp, &o), 0);
    double ep = weighted_sq_error(&plain, x, imp), ef = weighted_sq_error(&fisher, x, imp);
    cr_assert(ef < ep, "weighted error with importance %g should beat plain %g", ef, ep);
    weight_free(&plain);
    weight_free(&fisher);
    free(x);
    free(imp);
}

// ||X (W - Q)ᵀ||² of a quantized weight: the output error on the inputs X (N, cols).
static double output_error(const Weight *w, const float *src, const float *X, int N) {
    double e = 0;
    float *row = malloc(sizeof(float) * (size_t)w->cols);
    for (int r = 0; r < w->rows; r++) {
        weight_row_f32(row, w, r);
        for (int n = 0; n < N; n++) {
            double y = 0;
            for (int k = 0; k < w->cols; k++)
                y += (double)X[(size_t)n * w->cols + k] * (src[(size_t)r * w->cols + k] - row[k]);
            e += y * y;
        }
    }
    free(row);
    return e;
}

// X (N, K): correlated inputs with a loud channel every 11 (as after an RMSNorm with outlier scales), and
// H (K, K) = XᵀX, their second moment.
static void loud_inputs(float *X, float *H, int N, int K, uint64_t seed) {
    ErRng r;
    rng_seed(&r, seed);
    for (int n = 0; n < N; n++) {
        float shared = rng_normal(&r);
        for (int k = 0; k < K; k++)
            X[n * K + k] = (0.7f * shared + rng_normal(&r)) * (k % 11 == 0 ? 6.0f : 1.0f);
    }
    memset(H, 0, sizeof(float) * (size_t)K * K);
    for (int i = 0; i < K; i++)
        for (int j = 0; j < K; j++)
            for (int n = 0; n < N; n++)
                H[i * K + j] += X[n * K + i] * X[n * K + j];
}

Test(quantizer, gptq_codes_lower_the_output_error) {
    // Correlated inputs with a few loud channels (as after an RMSNorm with outlier scales): GPTQ codes and
    // the refitted codebooks must beat plain k-means on the output error, in the same format.
    enum { R = 24, K = 48, N = 256 };
    float *W = heavy(R * K, 5), *X = malloc(sizeof(float) * N * K), *H = malloc(sizeof(float) * K * K);
    loud_inputs(X, H, N, K, 6);
    for (int f = 0; f < 2; f++) {
        QuantOptions o;
        quant_options_default(&o, f ? WF_Q4LUT : WF_Q2LUT, 0);
        Weight plain, gptq;
        cr_assert_eq(quantize_matrix(&plain, W, R, K, NULL, &o), 0);
        o.hessian = H;
        cr_assert_eq(quantize_matrix(&gptq, W, R, K, NULL, &o), 0, "%s", er_last_error());
        cr_assert_eq(gptq.fmt, plain.fmt);
        double ep = output_error(&plain, W, X, N), eg = output_error(&gptq, W, X, N);
        fprintf(stderr, "quantizer: %s output error k-means %.4g, GPTQ codes + refit %.4g (%.2fx)\n",
                weight_format_name(o.fmt), ep, eg, ep / eg);
        cr_assert(eg < 0.8 * ep, "%s: GPTQ output error %g should clearly beat k-means %g", weight_format_name(o.fmt),
                  eg, ep);
        weight_free(&plain);
        weight_free(&gptq);
    }
    // Two matrices through one cache (as q, k, v share H): each result is byte for byte the one factored
    // alone, the factor is reused for the same H (a change made to H in place goes unseen, as documented),
    // and another H replaces it.
    {
        QuantOptions o;
        quant_options_default(&o, WF_Q2LUT, 0);
        o.hessian = H;
        QuantGptqCache gc = {0};
        float *W2 = heavy(R * K, 8), *H2 = malloc(sizeof(float) * K * K);
        for (int m = 0; m < 2; m++) {
            Weight alone, cached;
            cr_assert_eq(quantize_matrix(&alone, m ? W2 : W, R, K, NULL, &o), 0);
            o.gptq_cache = &gc;
            cr_assert_eq(quantize_matrix(&cached, m ? W2 : W, R, K, NULL, &o), 0);
            o.gptq_cache = NULL;
            cr_assert(gc.H == H && gc.n == K, "matrix %d: the cache does not hold H", m);
            cr_assert_eq(memcmp(alone.data, cached.data, weight_row_bytes(alone.fmt, K) * R), 0, "matrix %d codes", m);
            cr_assert_eq(memcmp(alone.lut, cached.lut, sizeof(uint16_t) * 4 * R), 0, "matrix %d codebooks", m);
            weight_free(&alone);
            weight_free(&cached);
        }
        double hd0 = gc.Hd[0];
        float h0 = H[0];
        H[0] *= 2;
        o.gptq_cache = &gc;
        Weight w2;
        cr_assert_eq(quantize_matrix(&w2, W, R, K, NULL, &o), 0);
        weight_free(&w2);
        cr_assert_eq(gc.Hd[0], hd0, "the same H was factored again");
        H[0] = h0;
        memcpy(H2, H, sizeof(float) * K * K);
        H2[0] *= 2;
        o.hessian = H2;
        cr_assert_eq(quantize_matrix(&w2, W, R, K, NULL, &o), 0);
        cr_assert(gc.H == H2 && gc.Hd[0] > 1.5 * hd0, "another H must replace the cached factor");
        weight_free(&w2);
        quant_gptq_cache_free(&gc);
        free(W2), free(H2);
    }
    // A NaN in H (a diagonal one looked like a dead input) or an Inf off it: an error, not codes.
    float keep = H[5 * K + 5];
    H[5 * K + 5] = NAN;
    QuantOptions o;
    quant_options_default(&o, WF_Q2LUT, 0);
    o.hessian = H;
    Weight w;
    cr_assert_lt(quantize_matrix(&w, W, R, K, NULL, &o), 0);
    cr_assert(strstr(er_last_error(), "not finite at (5, 5)"), "%s", er_last_error());
    H[5 * K + 5] = keep, H[3 * K + 7] = INFINITY;
    cr_assert_lt(quantize_matrix(&w, W, R, K, NULL, &o), 0);
    cr_assert(strstr(er_last_error(), "not finite at (3, 7)"), "%s", er_last_error());
    free(W), free(X), free(H);
}

// Dense-and-sparse: each row's corrections sit at its S columns of largest output energy H_kk w² (w² without
// H), ascending; without H the corrected weights come out exact to the fp16 rounding of the correction;
// with and without H the output error falls as S grows, and S = cols reproduces the matrix. Refused on a
// format without a codebook and for more corrections than columns.
Test(quantizer, dense_and_sparse_corrections) {
    enum { R = 24, K = 48, N = 256, S = 3 };
    float *W = heavy(R * K, 15), *X = malloc(sizeof(float) * N * K), *H = malloc(sizeof(float) * K * K);
    loud_inputs(X, H, N, K, 16);
    for (int gptq = 0; gptq < 2; gptq++) {
        QuantOptions o;
        quant_options_default(&o, WF_Q2LUT, 0);
        o.hessian = gptq ? H : NULL;
        double prev = INFINITY;
        int counts[] = {0, 1, S, 8, K};
        for (int ci = 0; ci < 5; ci++) {
            o.sparse = counts[ci];
            Weight w;
            cr_assert_eq(quantize_matrix(&w, W, R, K, NULL, &o), 0, "%s", er_last_error());
            cr_assert_eq(w.sparse, o.sparse);
            double e = output_error(&w, W, X, N);
            fprintf(stderr, "quantizer: q2lut%s, %2d sparse per row: output error %.5g\n", gptq ? " GPTQ" : "",
                    o.sparse, e);
            cr_assert(e < prev, "%d corrections per row: output error %g, not below %g", o.sparse, e, prev);
            prev = e;
            float row[K], dense[K];
            Weight d = w;
            d.sparse = 0;
            for (int i = 0; i < R && o.sparse == S; i++) {
                const float *x = W + (size_t)i * K;
                const uint16_t *cols = w.sp_cols + (size_t)i * S;
                double min_kept = INFINITY, max_left = 0;
                for (int j = 0; j < S; j++) {
                    cr_assert(j == 0 || cols[j] > cols[j - 1], "row %d: columns not ascending", i);
                    int k = cols[j];
                    min_kept = fmin(min_kept, (gptq ? H[k * K + k] : 1.0) * x[k] * x[k]);
                }
                for (int k = 0; k < K; k++) {
                    int kept = 0;
                    for (int j = 0; j < S; j++)
                        kept |= cols[j] == k;
                    if (!kept)
                        max_left = fmax(max_left, (gptq ? H[k * K + k] : 1.0) * x[k] * x[k]);
                }
                cr_assert(min_kept >= max_left, "row %d: a corrected weight's energy %g below a dense one's %g", i,
                          min_kept, max_left);
                if (gptq)
                    continue;
                weight_row_f32(row, &w, i);
                weight_row_f32(dense, &d, i);
                for (int j = 0; j < S; j++) {
                    int k = cols[j];
                    double corr = fabs(row[k] - dense[k]);
                    cr_assert(fabs(row[k] - x[k]) <= corr * 0x1p-11 + 1e-6, "row %d col %d: %g, want %g", i, k,
                              row[k], x[k]);
                }
            }
            if (o.sparse == K && !gptq)
                cr_assert(e < 1e-5 * output_error(&d, W, X, N), "every weight corrected: output error %g", e);
            weight_free(&w);
        }
    }
    // Rows of 4 distinct values plus one outlier: with S = 1 the outlier is the correction and the codebook
    // fits the 4 values exactly (had it seen the outlier, a level would sit near it).
    for (int gptq = 0; gptq < 2; gptq++) {
        float V[R * K];
        for (int i = 0; i < R; i++)
            for (int k = 0; k < K; k++)
                V[i * K + k] = k == (7 * i) % K ? 40.0f + i : 0.25f * (float)((k * 5 + i) % 4) - 0.3f;
        QuantOptions o;
        quant_options_default(&o, WF_Q2LUT, 0);
        o.hessian = gptq ? H : NULL;
        o.sparse = 1;
        Weight w;
        cr_assert_eq(quantize_matrix(&w, V, R, K, NULL, &o), 0, "%s", er_last_error());
        float row[K];
        for (int i = 0; i < R; i++) {
            cr_assert_eq(w.sp_cols[i], (7 * i) % K, "row %d: the outlier is not the correction", i);
            weight_row_f32(row, &w, i);
            for (int k = 0; k < K; k++)
                cr_assert(fabsf(row[k] - V[i * K + k]) <= 0.02f + 0x1p-11f * fabsf(V[i * K + k]),
                          "%s row %d col %d: %g, want %g", gptq ? "GPTQ" : "k-means", i, k, row[k], V[i * K + k]);
        }
        weight_free(&w);
    }
    QuantOptions o;
    quant_options_default(&o, WF_Q4, 0);
    o.sparse = 2;
    Weight w;
    cr_assert_lt(quantize_matrix(&w, W, R, K, NULL, &o), 0);
    cr_assert(strstr(er_last_error(), "codebook"), "%s", er_last_error());
    quant_options_default(&o, WF_Q2LUT, 0);
    o.sparse = K + 1;
    cr_assert_lt(quantize_matrix(&w, W, R, K, NULL, &o), 0);
    cr_assert(strstr(er_last_error(), "do not fit"), "%s", er_last_error());
    free(W), free(X), free(H);
}

// a (n, n) <- a⁻¹ by Gauss-Jordan with partial pivoting; b (n, 2n) scratch.
static void gauss_jordan_inverse(double *a, int n, double *b) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < 2 * n; j++)
            b[i * 2 * n + j] = j < n ? a[i * n + j] : j - n == i;
    for (int c = 0; c < n; c++) {
        int p = c;
        for (int i = c + 1; i < n; i++)
            if (fabs(b[i * 2 * n + c]) > fabs(b[p * 2 * n + c]))
                p = i;
        for (int j = 0; j < 2 * n; j++) {
            double t = b[c * 2 * n + j];
            b[c * 2 * n + j] = b[p * 2 * n + j], b[p * 2 * n + j] = t;
        }
        double d = b[c * 2 * n + c];
        for (int j = 0; j < 2 * n; j++)
            b[c * 2 * n + j] /= d;
        for (int i = 0; i < n; i++)
            if (i != c) {
                double f = b[i * 2 * n + c];
                for (int j = 0; j < 2 * n; j++)
                    b[i * 2 * n + j] -= f * b[c * 2 * n + j];
            }
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            a[i * n + j] = b[i * 2 * n + n + j];
}

Test(quantizer, gptq_factor_is_the_cholesky_factor_of_the_inverse) {
    // Sizes across the 64-column panels and strips, odd and even; H = XᵀX from fewer samples than inputs
    // (singular before the 1% damping, so near-singular after) with loud channels and a dead input. The
    // factor must be upper with a positive diagonal and Uᵀ U must match (Hd)⁻¹ by Gauss-Jordan: that
    // factor is unique, so this pins it exactly.
    int sizes[] = {1, 2, 63, 64, 65, 130, 201};
    ErRng r;
    rng_seed(&r, 9);
    for (int t = 0; t < 7; t++) {
        int n = sizes[t], N = n > 4 ? n / 2 : 3;
        float *X = malloc(sizeof(float) * (size_t)N * n), *H = calloc((size_t)n * n, sizeof(float));
        double *Hd = malloc(sizeof(double) * n * n), *U = malloc(sizeof(double) * n * n);
        double *inv = malloc(sizeof(double) * n * n), *b = malloc(sizeof(double) * 2 * n * n);
        for (int s = 0; s < N; s++)
            for (int k = 0; k < n; k++)
                X[s * n + k] = k == n / 3 && n > 2 ? 0 : rng_normal(&r) * (k % 7 == 0 ? 8.0f : 1.0f);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++)
                for (int s = 0; s < N; s++)
                    H[i * n + j] += X[s * n + i] * X[s * n + j];
        cr_assert_eq(quant_gptq_factor(Hd, U, H, n), 0, "n = %d: %s", n, er_last_error());
        memcpy(inv, Hd, sizeof(double) * n * n);
        gauss_jordan_inverse(inv, n, b);
        double big = 0, err = 0;
        for (int i = 0; i < n; i++) {
            cr_assert_gt(U[i * n + i], 0, "n = %d: U[%d][%d]", n, i, i);
            for (int j = 0; j < n; j++) {
                cr_assert(j >= i || U[i * n + j] == 0, "n = %d: U[%d][%d] = %g below the diagonal", n, i, j,
                          U[i * n + j]);
                double s = 0;
                for (int k = 0; k < n; k++)
                    s += U[k * n + i] * U[k * n + j];
                big = fmax(big, fabs(inv[i * n + j]));
                err = fmax(err, fabs(s - inv[i * n + j]));
            }
        }
        cr_assert(err <= 1e-10 * big, "n = %d: |Uᵀ U - (Hd)⁻¹| = %g against %g", n, err, big);
        free(X), free(H), free(Hd), free(U), free(inv), free(b);
    }
    // Indefinite even after damping: an error, not a factor.
    float H[4] = {1, 3, 3, 1};
    double Hd[4], U[4];
    cr_assert_lt(quant_gptq_factor(Hd, U, H, 2), 0);
    cr_assert(strstr(er_last_error(), "not positive definite"), "%s", er_last_error());
}

Test(quantizer, zero_rows_and_bad_options) {
    float x[2 * 16] = {0};
    for (int k = 0; k < 16; k++)
        x[16 + k] = 0.5f; // a constant row
    WeightFormat fs[] = {WF_Q8, WF_Q4, WF_Q4G, WF_Q2LUT, WF_Q4LUT};
    for (int i = 0; i < 5; i++) {
        QuantOptions o;
        quant_options_default(&o, fs[i], 8);
        Weight w;
        cr_assert_eq(quantize_matrix(&w, x, 2, 16, NULL, &o), 0);
        float row[16];
        weight_row_f32(row, &w, 0);
        for (int k = 0; k < 16; k++)
            cr_assert_eq(row[k], 0.0f, "%s zero row", weight_format_name(fs[i]));
        weight_row_f32(row, &w, 1);
        for (int k = 0; k < 16; k++)
            cr_assert(fabsf(row[k] - 0.5f) < 0.5f / 14, "%s constant row: %g", weight_format_name(fs[i]), row[k]);
        weight_free(&w);
    }
    QuantOptions o;
    quant_options_default(&o, WF_F32, 0);
    Weight w;
    cr_assert_lt(quantize_matrix(&w, x, 2, 16, NULL, &o), 0);
    quant_options_default(&o, WF_Q4G, 32);
    cr_assert_lt(quantize_matrix(&w, x, 2, 16, NULL, &o), 0);
}

// ---- the straight-through gradient of the error ----

// The surrogate quant_ste_error_row differentiates, written out from its documentation: the row's (group's)
// levels follow its extremes with the clipping ratio c held, the offsets code - w/s (inside the grid) and
// the codes held, at the quantization q of w0; for k-means the codes held and each level its weights' mean.
typedef struct {
    const Weight *q;
    const QuantOptions *o;
    const float *w0;
} Surrogate;

static void extremes(const float *x, int n, float *mn, float *mx) {
    *mn = *mx = x[0];
    for (int i = 1; i < n; i++)
        *mn = fminf(*mn, x[i]), *mx = fmaxf(*mx, x[i]);
}

// e (n) of the values w of one group whose levels at w0 were zero0 + s0 * [0, nl - 1].
static void surrogate_affine(const float *w0, const float *w, int n, float s0, float zero0, int nl, double *e) {
    float mn0, mx0, mn, mx;
    extremes(w0, n, &mn0, &mx0);
    extremes(w, n, &mn, &mx);
    double c = (double)s0 * (nl - 1) / (mx0 - mn0), s = c * (mx - mn) / (nl - 1);
    double z = (mx + mn) / 2.0 - c * (mx - mn) / 2;
    for (int j = 0; j < n; j++) {
        float t = (w0[j] - zero0) / s0, u = fminf(fmaxf(rintf(t), 0.0f), (float)(nl - 1));
        int clipped = t < 0 || t > nl - 1;
        e[j] = clipped ? s * u + z - w[j] : s * (u - t);
    }
}

static void surrogate_error(const Surrogate *sg, const float *w, double *e) {
    const Weight *q = sg->q;
    int K = q->cols;
    if (q->fmt == WF_Q4) {
        float amax0 = 0, amax = 0;
        for (int j = 0; j < K; j++)
            amax0 = fmaxf(amax0, fabsf(sg->w0[j])), amax = fmaxf(amax, fabsf(w[j]));
        double c = (double)q->scale[0] * 7 / amax0, s = c * amax / 7;
        for (int j = 0; j < K; j++) {
            float t = sg->w0[j] / q->scale[0], u = fminf(fmaxf(rintf(t), -7.0f), 7.0f);
            int clipped = fabsf(t) > 7;
            e[j] = clipped ? s * u - w[j] : s * (u - t);
        }
    } else if (q->fmt == WF_Q4G) {
        int G = q->group;
        for (int g = 0; g < K / G; g++)
            surrogate_affine(sg->w0 + g * G, w + g * G, G, f16_to_f32(q->gscale[g]), f16_to_f32(q->gzero[g]), 16,
                             e + g * G);
    } else if (sg->o->uniform) {
        float lo = f16_to_f32(q->lut[0]), hi = f16_to_f32(q->lut[3]);
        surrogate_affine(sg->w0, w, K, (hi - lo) / 3, lo, 4, e);
    } else {
        float lv[4];
        int a[64];
        double sum[4] = {0};
        int cnt[4] = {0};
        for (int j = 0; j < 4; j++)
            lv[j] = f16_to_f32(q->lut[j]);
        for (int j = 0; j < K; j++) {
            a[j] = 0;
            for (int l = 1; l < 4; l++)
                a[j] = fabsf(sg->w0[j] - lv[l]) < fabsf(sg->w0[j] - lv[a[j]]) ? l : a[j];
            sum[a[j]] += w[j], cnt[a[j]]++;
        }
        for (int j = 0; j < K; j++)
            e[j] = sum[a[j]] / cnt[a[j]] - w[j];
    }
}

Test(quantizer, straight_through_error_gradient_is_the_documented_surrogates) {
    threads_set(1);
    enum { K = 64 };
    struct {
        WeightFormat fmt;
        int group, uniform;
        const char *name;
    } cases[] = {{WF_Q4, 0, 0, "q4"}, {WF_Q4G, 16, 0, "q4g16"}, {WF_Q2LUT, 0, 1, "q2rtn"}, {WF_Q2LUT, 0, 0, "q2lut"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float w[K], ge[K], gw[K] = {0};
        double e0[K], ep[K], em[K];
        ErRng r;
        rng_seed(&r, 50 + c);
        for (int j = 0; j < K; j++)
            w[j] = rng_normal(&r), ge[j] = rng_normal(&r);
        w[5] = 12.0f, w[20] = -9.0f; // outliers that the clipping search (L1 here) cuts off
        QuantOptions o;
        quant_options_default(&o, cases[c].fmt, cases[c].group);
        o.uniform = cases[c].uniform;
        o.p = 1.0;
        Weight q;
        cr_assert_eq(quantize_matrix(&q, w, 1, K, NULL, &o), 0, "%s", er_last_error());
        // At w0 the surrogate is the quantizer's error (up to the levels' fp16 rounding).
        float deq[K];
        quant_dequant_rows(deq, &q, 0, 1);
        Surrogate sg = {&q, &o, w};
        surrogate_error(&sg, w, e0);
        for (int j = 0; j < K; j++)
            cr_assert(fabs(e0[j] - ((double)deq[j] - w[j])) <= 2e-3 * (1 + fabs(w[j])), "%s: e[%d] %g vs %g",
                      cases[c].name, j, e0[j], (double)deq[j] - w[j]);
        quant_ste_error_row(&q, &o, 0, w, ge, gw);
        int moved = 0;
        for (int k = 0; k < K; k++) {
            float keep = w[k], x[K];
            double lp = 0, lm = 0;
            memcpy(x, w, sizeof x);
            float up = keep + 1e-3f, down = keep - 1e-3f; // the step as the floats hold it
            x[k] = up;
            surrogate_error(&sg, x, ep);
            x[k] = down;
            surrogate_error(&sg, x, em);
            for (int j = 0; j < K; j++)
                lp += ge[j] * ep[j], lm += ge[j] * em[j];
            double fd = (lp - lm) / ((double)up - down);
            moved += gw[k] != 0;
            cr_assert(fabs(fd - gw[k]) <= 1e-2 * fabs(fd) + 1e-3, "%s: d/dw[%d] %g, surrogate's %g", cases[c].name, k,
                      gw[k], fd);
        }
        fprintf(stderr, "ste %s: %d of %d weights with a gradient\n", cases[c].name, moved, K);
        cr_assert(moved > 0, "%s: no weight carries a gradient: the test checks nothing", cases[c].name);
        weight_free(&q);
    }
}
