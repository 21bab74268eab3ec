// Quantizers: RTN with an Lp scale search, and weighted 1-D k-means for the 2-bit codebook format.
#include "quant/quantizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/error.h"
#include "quant/blocks.h"
#include "quant/quant.h"

void quant_options_default(QuantOptions *o, WeightFormat fmt, int group) {
    memset(o, 0, sizeof *o);
    o->fmt = fmt;
    o->group = group;
    o->search = QSEARCH_LP;
    o->p = 2.0;
    o->grid = 20;
    o->kmeans_iters = 25;
}

static inline double err_p(double d, double p) {
    d = fabs(d);
    return p == 2.0 ? d * d : pow(d, p);
}

static inline float clampf(float v, float lo, float hi) { return v < lo ? lo : v > hi ? hi : v; }

static double sym_error(const float *x, const float *imp, int n, int qmax, float s, double p) {
    double e = 0;
    float inv = 1.0f / s;
    for (int i = 0; i < n; i++) {
        float q = clampf(rintf(x[i] * inv), (float)-qmax, (float)qmax);
        e += (imp ? imp[i] : 1.0) * err_p((double)x[i] - (double)(q * s), p);
    }
    return e;
}

double quant_rtn_sym(const float *x, const float *imp, int n, int qmax, QuantSearch s, double p, int grid, float *scale,
                     int8_t *q) {
    *scale = 0;
    if (n <= 0)
        return 0;
    float amax = 0;
    for (int i = 0; i < n; i++)
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    if (!(amax > 0)) {
        *scale = 0;
        memset(q, 0, (size_t)n);
        double e = 0;
        for (int i = 0; i < n; i++)
            e += (imp ? imp[i] : 1.0) * err_p(x[i], p);
        return e;
    }
    int steps = s == QSEARCH_MINMAX ? 0 : grid;
    float best_s = amax / (float)qmax;
    double best = sym_error(x, imp, n, qmax, best_s, p);
    for (int i = 1; i <= steps; i++) {
        float c = 1.0f - 0.5f * (float)i / (float)steps;
        float sc = c * amax / (float)qmax;
        double e = sym_error(x, imp, n, qmax, sc, p);
        if (e < best) {
            best = e;
            best_s = sc;
        }
    }
    *scale = best_s;
    float inv = 1.0f / best_s;
    for (int i = 0; i < n; i++)
        q[i] = (int8_t)clampf(rintf(x[i] * inv), (float)-qmax, (float)qmax);
    return best;
}

// Codes of x for W = u * sf + zf (sf, zf as stored); sf == 0 gives u = 0.
static inline uint8_t asym_code(float x, float sf, float zf) {
    return sf > 0 ? (uint8_t)clampf(rintf((x - zf) / sf), 0.0f, 15.0f) : 0;
}

static double asym_error(const float *x, const float *imp, int n, float sf, float zf, double p) {
    double e = 0;
    for (int i = 0; i < n; i++)
        e += (imp ? imp[i] : 1.0) * err_p((double)x[i] - (double)((float)asym_code(x[i], sf, zf) * sf + zf), p);
    return e;
}

// The clipping search of the uniform quantizers: the row's [min, max] into *mn, *mx and the number of
// shrunk candidates to try after the full range (0 for min-max, or when the row is constant).
static int clip_steps(const float *x, int n, QuantSearch s, int grid, float *mn, float *mx) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    *mn = lo;
    *mx = hi;
    return s == QSEARCH_MINMAX || !(hi > lo) ? 0 : grid;
}

// Candidate i of `steps`: [min, max] shrunk about its centre, by up to half (i = 0: the full range);
// its lower end and width.
static void clip_candidate(float mn, float mx, int i, int steps, float *lo, float *width) {
    float c = i == 0 ? 1.0f : 1.0f - 0.5f * (float)i / (float)steps;
    float center = 0.5f * (mx + mn), half = 0.5f * c * (mx - mn);
    *lo = center - half;
    *width = 2.0f * half;
}

double quant_rtn_asym4(const float *x, const float *imp, int n, QuantSearch s, double p, int grid, uint16_t *scale16,
                       uint16_t *zero16, uint8_t *u) {
    *scale16 = *zero16 = 0;
    if (n <= 0)
        return 0;
    float mn, mx;
    int steps = clip_steps(x, n, s, grid, &mn, &mx);
    double best = INFINITY;
    uint16_t bs = 0, bz = 0;
    for (int i = 0; i <= steps; i++) {
        float lo, width;
        clip_candidate(mn, mx, i, steps, &lo, &width);
        uint16_t s16 = f32_to_f16(width / 15.0f), z16 = f32_to_f16(lo);
        double e = asym_error(x, imp, n, f16_to_f32(s16), f16_to_f32(z16), p);
        if (e < best) {
            best = e;
            bs = s16;
            bz = z16;
        }
    }
    *scale16 = bs;
    *zero16 = bz;
    float sf = f16_to_f32(bs), zf = f16_to_f32(bz);
    for (int i = 0; i < n; i++)
        u[i] = asym_code(x[i], sf, zf);
    return best;
}

// ---- k-means ----

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static inline int nearest(float v, const float *c, int k) {
    int best = 0;
    float bd = fabsf(v - c[0]);
    for (int j = 1; j < k; j++) {
        float d = fabsf(v - c[j]);
        if (d < bd) {
            bd = d;
            best = j;
        }
    }
    return best;
}

static double assign_all(const float *x, const float *imp, int n, const float *c, int k, uint8_t *a, int *changed) {
    double obj = 0;
    int ch = 0;
    for (int i = 0; i < n; i++) {
        int j = nearest(x[i], c, k);
        ch |= a[i] != j;
        a[i] = (uint8_t)j;
        double d = (double)x[i] - (double)c[j];
        obj += (imp ? imp[i] : 1.0) * d * d;
    }
    if (changed)
        *changed = ch;
    return obj;
}

// Deterministic init: the distinct values when there are at most k, else the quantiles (2j+1)/(2k)
// of the sorted values, moved forward past duplicates.
static void kmeans_init(const float *x, int n, int k, float *c, float *sorted) {
    memcpy(sorted, x, sizeof(float) * (size_t)n);
    qsort(sorted, (size_t)n, sizeof(float), cmp_float);
    int distinct = n > 0;
    for (int i = 1; i < n && distinct <= k; i++)
        distinct += sorted[i] != sorted[i - 1];
    if (distinct <= k) {
        int m = 0;
        for (int i = 0; i < n; i++)
            if (i == 0 || sorted[i] != sorted[i - 1])
                c[m++] = sorted[i];
        for (; m < k; m++)
            c[m] = n > 0 ? sorted[n - 1] : 0.0f;
        return;
    }
    for (int j = 0; j < k; j++) {
        int i = (int)(((2 * (long)j + 1) * n) / (2 * k));
        while (j > 0 && i < n - 1 && sorted[i] <= c[j - 1])
            i++;
        c[j] = sorted[i];
    }
}


// Lloyd iterations from the centroids in c.
static double kmeans_lloyd(const float *x, const float *imp, int n, int k, int iters, float *c, uint8_t *a,
                           double *hist) {
    memset(a, 0xff, (size_t)n);
    double obj = assign_all(x, imp, n, c, k, a, NULL);
    if (hist)
        hist[0] = obj;
    int it = 0;
    for (; it < iters; it++) {
        double sw[16] = {0}, swx[16] = {0};
        float prev[16];
        memcpy(prev, c, sizeof(float) * (size_t)k);
        for (int i = 0; i < n; i++) {
            double wi = imp ? imp[i] : 1.0;
            sw[a[i]] += wi;
            swx[a[i]] += wi * x[i];
        }
        for (int j = 0; j < k; j++)
            if (sw[j] > 0)
                c[j] = (float)(swx[j] / sw[j]);
        int changed;
        double o = assign_all(x, imp, n, c, k, a, &changed);
        // Rounding a mean to float can nudge the objective up by an ulp: then go back to the centroids
        // that gave obj (the assignment is a function of the centroids) and stop.
        if (o > obj) {
            memcpy(c, prev, sizeof(float) * (size_t)k);
            assign_all(x, imp, n, c, k, a, NULL);
            break;
        }
        obj = o;
        if (hist)
            hist[it + 1] = obj;
        if (!changed)
            break;
    }
    if (hist)
        for (int j = it + 1; j <= iters; j++)
            hist[j] = obj;
    return obj;
}

static double kmeans_run(const float *x, const float *imp, int n, int k, int iters, float *c, uint8_t *a, double *hist,
                         float *sorted) {
    kmeans_init(x, n, k, c, sorted);
    return kmeans_lloyd(x, imp, n, k, iters, c, a, hist);
}

double quant_kmeans_1d(const float *x, const float *imp, int n, int k, int iters, float *centroids, uint8_t *assign,
                       double *hist) {
    if (k < 1 || k > 16 || n < 1)
        return er_error(ER_EINVAL, "quant_kmeans_1d: k = %d (1..16), n = %d", k, n);
    float *sorted = malloc(sizeof(float) * (size_t)n);
    if (!sorted)
        return er_error(ER_ENOMEM, "quant_kmeans_1d: out of memory");
    double obj = kmeans_run(x, imp, n, k, iters, centroids, assign, hist, sorted);
    free(sorted);
    return obj;
}

// ---- uniform codebooks (q2rtn) ----

double quant_rtn_uniform_lut(const float *x, const float *imp, int n, int nlev, QuantSearch s, double p, int grid,
                             uint16_t *lut, uint8_t *codes) {
    if (nlev < 2 || nlev > 16)
        return er_error(ER_EINVAL, "quant_rtn_uniform_lut: %d levels (2..16)", nlev);
    memset(lut, 0, sizeof(uint16_t) * (size_t)nlev);
    if (n <= 0)
        return 0;
    float mn, mx;
    int steps = clip_steps(x, n, s, grid, &mn, &mx);
    double best = INFINITY;
    for (int i = 0; i <= steps; i++) {
        float zero, width;
        clip_candidate(mn, mx, i, steps, &zero, &width);
        float scale = width / (float)(nlev - 1), lv[16];
        uint16_t l16[16];
        for (int j = 0; j < nlev; j++) {
            l16[j] = f32_to_f16(zero + (float)j * scale);
            lv[j] = f16_to_f32(l16[j]);
        }
        double e = 0;
        for (int k = 0; k < n; k++)
            e += (imp ? imp[k] : 1.0) * err_p((double)x[k] - (double)lv[nearest(x[k], lv, nlev)], p);
        if (e < best) {
            best = e;
            memcpy(lut, l16, sizeof(uint16_t) * (size_t)nlev);
        }
    }
    float lv[16];
    for (int j = 0; j < nlev; j++)
        lv[j] = f16_to_f32(lut[j]);
    for (int k = 0; k < n; k++)
        codes[k] = (uint8_t)nearest(x[k], lv, nlev);
    return best;
}

// ---- matrices ----

typedef struct {
    float score;
    int col;
} SparseCand;

typedef struct {
    float *sorted;
    uint8_t *codes;
    int8_t *sq;
    float *imp;        // sparse: the row's importances, 0 at its corrected columns
    SparseCand *cand;  // sparse: (cols)
} Scratch;

static int cand_desc(const void *a, const void *b) {
    const SparseCand *x = a, *y = b;
    return x->score > y->score ? -1 : x->score < y->score ? 1 : x->col - y->col;
}

static int u16_asc(const void *a, const void *b) { return (int)*(const uint16_t *)a - (int)*(const uint16_t *)b; }

// Dense-and-sparse: the w->sparse columns of row r whose weights carry the most output energy, H_kk x_k²
// (H the inputs' second moment; without it the importance times x_k², or x_k²), ascending into sp_cols;
// s->imp = the row's importances with those columns at 0, so the codebook is fitted to the rest.
static void sparse_pick(Weight *w, int r, const float *x, const float *imp, const float *H, Scratch *s) {
    int K = w->cols, S = w->sparse;
    for (int k = 0; k < K; k++) {
        double h = H ? H[(size_t)k * K + k] : imp ? imp[k] : 1.0;
        s->cand[k] = (SparseCand){(float)(h * x[k] * x[k]), k};
        s->imp[k] = imp ? imp[k] : 1.0f;
    }
    qsort(s->cand, (size_t)K, sizeof *s->cand, cand_desc);
    uint16_t *cols = (uint16_t *)w->sp_cols + (size_t)r * S;
    for (int j = 0; j < S; j++) {
        cols[j] = (uint16_t)s->cand[j].col;
        s->imp[cols[j]] = 0;
    }
    qsort(cols, (size_t)S, sizeof *cols, u16_asc);
}

// Without error feedback: each corrected weight's value, fp16(x - the dense row's value there).
static int sparse_fill(Weight *w, const float *src) {
    int fail = 0;
#pragma omp parallel
    {
        float *row = malloc(sizeof(float) * (size_t)w->cols);
        if (!row) {
#pragma omp atomic write
            fail = 1;
        }
#pragma omp for schedule(static)
        for (int r = 0; r < w->rows; r++) {
            if (!row)
                continue;
            weight_format_info(w->fmt)->dequant_row(row, w, r); // the dense row
            for (int j = 0; j < w->sparse; j++) {
                size_t i = (size_t)r * w->sparse + j;
                int k = w->sp_cols[i];
                ((uint16_t *)w->sp_vals)[i] = f32_to_f16(src[(size_t)r * w->cols + k] - row[k]);
            }
        }
        free(row);
    }
    return fail ? er_error(ER_ENOMEM, "quantize_matrix: out of memory for row scratch") : ER_OK;
}

static void quantize_row(Weight *w, int r, const float *x, const float *imp, const QuantOptions *o, Scratch *s) {
    int K = w->cols;
    uint8_t *row = (uint8_t *)w->data + (size_t)r * weight_row_bytes(w->fmt, K);
    switch (w->fmt) {
    case WF_Q8:
        quant_rtn_sym(x, imp, K, 127, o->search, o->p, o->grid, (float *)&w->scale[r], (int8_t *)row);
        break;
    case WF_Q4:
        quant_rtn_sym(x, imp, K, 7, o->search, o->p, o->grid, (float *)&w->scale[r], s->sq);
        for (int k = 0; k < K; k++)
            s->codes[k] = (uint8_t)(s->sq[k] + 8);
        quant_pack4(row, s->codes, K);
        break;
    case WF_Q4G: {
        int G = w->group, ng = K / G;
        for (int g = 0; g < ng; g++)
            quant_rtn_asym4(x + g * G, imp ? imp + g * G : NULL, G, o->search, o->p, o->grid,
                            (uint16_t *)&w->gscale[(size_t)r * ng + g], (uint16_t *)&w->gzero[(size_t)r * ng + g],
                            s->codes + g * G);
        quant_pack4(row, s->codes, K);
        break;
    }
    case WF_Q2LUT:
    case WF_Q4LUT: {
        int nc = weight_format_info(w->fmt)->levels;
        float c[16], cr[16];
        if (o->uniform) {
            quant_rtn_uniform_lut(x, imp, K, nc, o->search, o->p, o->grid, (uint16_t *)&w->lut[(size_t)r * nc],
                                  s->codes);
            if (nc == 4)
                quant_pack2(row, s->codes, K);
            else
                quant_pack4(row, s->codes, K);
            break;
        }
        double obj = kmeans_run(x, imp, K, nc, o->kmeans_iters, c, s->codes, NULL, s->sorted);
        // A second start at the uniform RTN levels (L2, weighted like k-means): Lloyd never raises the
        // objective, so the codebook kept is never worse than q2rtn's / the uniform one (up to fp16 rounding).
        float c2[16];
        uint16_t u16[16];
        uint8_t *a2 = (uint8_t *)s->sq;
        quant_rtn_uniform_lut(x, imp, K, nc, o->search, 2.0, o->grid, u16, a2);
        for (int j = 0; j < nc; j++)
            c2[j] = f16_to_f32(u16[j]);
        if (kmeans_lloyd(x, imp, K, nc, o->kmeans_iters, c2, a2, NULL) < obj)
            memcpy(c, c2, sizeof(float) * (size_t)nc);
        uint16_t *lut = (uint16_t *)&w->lut[(size_t)r * nc];
        for (int j = 0; j < nc; j++) {
            lut[j] = f32_to_f16(c[j]);
            cr[j] = f16_to_f32(lut[j]);
        }
        for (int k = 0; k < K; k++)
            s->codes[k] = (uint8_t)nearest(x[k], cr, nc);
        if (nc == 4)
            quant_pack2(row, s->codes, K);
        else
            quant_pack4(row, s->codes, K);
        break;
    }
    default: // the GGUF block formats: round to nearest under each block's stored scales
        blocks_quantize_row(w->fmt, row, x, imp, K);
        break;
    }
}

// ---- output-error codebooks (GPTQ assignment, least-squares refit) ----

enum { CHOL_PANEL = 64, INV_STRIP = 64 }; // columns per Cholesky panel / per strip of the inverse

// a (n, n) <- its lower Cholesky factor L (a = L Lᵀ), upper triangle zeroed; ER_EINVAL when not positive
// definite. Right-looking by panels of CHOL_PANEL columns: the trailing update (nearly all the work) runs
// over rows in parallel against the panel held transposed in p (CHOL_PANEL, n), so every inner loop reads
// memory contiguously.
static int cholesky_lower(double *a, int n, double *p) {
    for (int k0 = 0; k0 < n; k0 += CHOL_PANEL) {
        int k1 = n - k0 < CHOL_PANEL ? n : k0 + CHOL_PANEL;
        for (int j = k0; j < k1; j++) { // the diagonal block, its columns left of k0 already subtracted
            double d = a[(size_t)j * n + j];
            for (int k = k0; k < j; k++)
                d -= a[(size_t)j * n + k] * a[(size_t)j * n + k];
            if (!(d > 0))
                return er_error(ER_EINVAL, "quantize_matrix: the input second moment is not positive definite");
            d = sqrt(d);
            a[(size_t)j * n + j] = d;
            for (int i = j + 1; i < k1; i++) {
                double s = a[(size_t)i * n + j];
                for (int k = k0; k < j; k++)
                    s -= a[(size_t)i * n + k] * a[(size_t)j * n + k];
                a[(size_t)i * n + j] = s / d;
            }
        }
#pragma omp parallel for schedule(static)
        for (int i = k1; i < n; i++) { // the panel below it: row i's L[i][k0:k1] by forward substitution
            double *r = a + (size_t)i * n;
            for (int j = k0; j < k1; j++) {
                double s = r[j];
                for (int k = k0; k < j; k++)
                    s -= r[k] * a[(size_t)j * n + k];
                r[j] = s / a[(size_t)j * n + j];
                p[(size_t)(j - k0) * n + i] = r[j];
            }
        }
#pragma omp parallel for schedule(dynamic, 8)
        for (int i = k1; i < n; i++) { // trailing update: a[i][k1:i+1] -= L[i][k0:k1] · L[k1:i+1][k0:k1]ᵀ
            double *r = a + (size_t)i * n;
            for (int k = 0; k < k1 - k0; k++) {
                double l = r[k0 + k];
                const double *pk = p + (size_t)k * n;
                for (int j = k1; j <= i; j++)
                    r[j] -= l * pk[j];
            }
        }
    }
    for (int i = 0; i < n; i++)
        memset(a + (size_t)i * n + i + 1, 0, sizeof(double) * (size_t)(n - 1 - i));
    return ER_OK;
}

// x (n, n) <- L⁻¹ (lower) for the lower L (n, n). Each strip of INV_STRIP columns solves L x = I on its
// own, in parallel with the others, row by row so the inner loop runs along rows.
static void lower_inverse(double *x, const double *L, int n) {
    memset(x, 0, sizeof(double) * (size_t)n * n);
#pragma omp parallel for schedule(dynamic, 1)
    for (int c0 = 0; c0 < n; c0 += INV_STRIP) {
        int c1 = n - c0 < INV_STRIP ? n : c0 + INV_STRIP;
        for (int i = c0; i < n; i++) {
            double *xi = x + (size_t)i * n;
            const double *l = L + (size_t)i * n;
            if (i < c1)
                xi[i] = 1;
            for (int k = c0; k < i; k++) {
                const double *xk = x + (size_t)k * n, lk = l[k];
                for (int c = c0; c < c1; c++)
                    xi[c] -= lk * xk[c];
            }
            for (int c = c0; c < c1; c++)
                xi[c] /= l[i];
        }
    }
}

// Hd (n, n) = H + damping (dead inputs get 1 on the diagonal); U (n, n) upper with (Hd)⁻¹ = Uᵀ U. With J
// the order-reversing permutation and L the lower Cholesky factor of J Hd J, Hd = (J L J)(J L J)ᵀ where
// J L J is upper, so (Hd)⁻¹ = Uᵀ U for the upper U = (J L J)⁻¹ = J L⁻¹ J: one Cholesky and one triangular
// inverse, and U is the Cholesky factor itself (upper with a positive diagonal, hence unique).
int quant_gptq_factor(double *Hd, double *U, const float *H, int n) {
    for (size_t i = 0; i < (size_t)n * n; i++) // NaN would pass the diagonal's `> 0` test as a dead input
        if (!isfinite(H[i]))
            return er_error(ER_EINVAL, "quantize_matrix: the input second moment (%d x %d) is not finite at (%zu, %zu)",
                            n, n, i / n, i % n);
    double mean = 0;
    for (int i = 0; i < n; i++)
        mean += H[(size_t)i * n + i] / n;
    double damp = 0.01 * (mean > 0 ? mean : 1.0);
    for (size_t i = 0; i < (size_t)n * n; i++)
        Hd[i] = H[i];
    for (int i = 0; i < n; i++)
        Hd[(size_t)i * n + i] = (H[(size_t)i * n + i] > 0 ? H[(size_t)i * n + i] : 1.0) + damp;
    double *x = malloc(sizeof(double) * (size_t)n * n);
    if (!x)
        return er_error(ER_ENOMEM, "quantize_matrix: no memory for a %d x %d factor", n, n);
    for (size_t i = 0; i < (size_t)n * n; i++) // U <- J Hd J
        U[i] = Hd[(size_t)n * n - 1 - i];
    int rc = cholesky_lower(U, n, x); // x: the panel scratch
    if (rc == ER_OK) {
        lower_inverse(x, U, n);
        for (size_t i = 0; i < (size_t)n * n; i++) // U <- J L⁻¹ J
            U[i] = x[(size_t)n * n - 1 - i];
    }
    free(x);
    return rc;
}

void quant_gptq_cache_free(QuantGptqCache *c) {
    free(c->Hd);
    free(c->U);
    memset(c, 0, sizeof *c);
}

// c <- the factor of H (n, n), unless it already holds it.
static int gptq_cache_get(QuantGptqCache *c, const float *H, int n) {
    if (c->U && c->H == H && c->n == n)
        return ER_OK;
    quant_gptq_cache_free(c);
    c->Hd = malloc(sizeof(double) * (size_t)n * n);
    c->U = malloc(sizeof(double) * (size_t)n * n);
    int rc = !c->Hd || !c->U ? er_error(ER_ENOMEM, "quantize_matrix: no memory for a %d x %d factor", n, n)
                             : quant_gptq_factor(c->Hd, c->U, H, n);
    if (rc < 0)
        quant_gptq_cache_free(c);
    else
        c->H = H, c->n = n;
    return rc;
}

// GPTQ assignment of one row x (n) to the levels c (k): codes a (n); w (n) scratch. Columns with
// sp[i] set (sp may be NULL) are corrected exactly: sv[i] = fp16(w_i - c[a_i]), the value the row needs
// there after the feedback so far, and only its fp16 rounding is fed forward.
static void gptq_assign_row(const float *x, const double *U, int n, const float *c, int k, uint8_t *a, double *w,
                            const uint8_t *sp, uint16_t *sv) {
    for (int i = 0; i < n; i++)
        w[i] = x[i];
    for (int i = 0; i < n; i++) {
        a[i] = (uint8_t)nearest((float)w[i], c, k);
        double q = c[a[i]];
        if (sp && sp[i]) {
            sv[i] = f32_to_f16((float)(w[i] - q));
            q += f16_to_f32(sv[i]);
        }
        double e = (w[i] - q) / U[(size_t)i * n + i];
        const double *u = U + (size_t)i * n;
        for (int j = i + 1; j < n; j++)
            w[j] -= e * u[j];
    }
}

// The levels c (k) minimising (x - Ac)ᵀ H (x - Ac) for the codes a (n); a level no code uses is kept.
// Columns with sp[i] set (sp may be NULL) are left out: the sparse corrections make them exact.
// hx (n), M (k, k + 1) scratch.
static void lut_refit_row(const float *x, const double *Hd, int n, const uint8_t *a, const uint8_t *sp, float *c,
                          int k, double *hx, double *M) {
    memset(M, 0, sizeof(double) * (size_t)k * (k + 1));
    for (int i = 0; i < n; i++) { // one pass over Hd, which at n in the thousands streams from memory
        if (sp && sp[i])
            continue;
        const double *h = Hd + (size_t)i * n;
        double s = 0;
        for (int j = 0; j < n; j++)
            if (!(sp && sp[j])) {
                s += h[j] * x[j];
                M[a[i] * (k + 1) + a[j]] += h[j];
            }
        hx[i] = s;
        M[a[i] * (k + 1) + k] += hx[i];
    }
    for (int p = 0; p < k; p++) // unused levels: the equation c_p = old c_p
        if (M[p * (k + 1) + p] == 0)
            M[p * (k + 1) + p] = 1, M[p * (k + 1) + k] = c[p];
    for (int p = 0; p < k; p++) { // Gaussian elimination (AᵀHA is positive definite)
        double d = M[p * (k + 1) + p];
        if (!(fabs(d) > 0))
            return;
        for (int r = p + 1; r < k; r++) {
            double f = M[r * (k + 1) + p] / d;
            for (int j = p; j <= k; j++)
                M[r * (k + 1) + j] -= f * M[p * (k + 1) + j];
        }
    }
    double sol[16];
    for (int p = k - 1; p >= 0; p--) {
        double s = M[p * (k + 1) + k];
        for (int j = p + 1; j < k; j++)
            s -= M[p * (k + 1) + j] * sol[j];
        sol[p] = s / M[p * (k + 1) + p];
    }
    for (int p = 0; p < k; p++)
        if (isfinite(sol[p]))
            c[p] = (float)sol[p];
}

// Re-assigns the codes (and refits the codebooks) of w, quantized from src without H, as described in
// quant/quantizer.h.
// cache: as QuantOptions.gptq_cache.
static int lut_output_error(Weight *w, const float *src, const float *H, QuantGptqCache *cache) {
    int rows = w->rows, n = w->cols, k = weight_format_info(w->fmt)->levels, fail = 0;
    QuantGptqCache own = {0}, *fc = cache ? cache : &own;
    int rc = gptq_cache_get(fc, H, n);
    const double *Hd = fc->Hd, *U = fc->U;
#pragma omp parallel if (rc == ER_OK)
    {
        double *sw = malloc(sizeof(double) * (size_t)n * 2), M[16 * 17];
        uint8_t *a = malloc((size_t)n), *sp = w->sparse ? calloc((size_t)n, 1) : NULL;
        uint16_t *sv = w->sparse ? malloc(sizeof(uint16_t) * (size_t)n) : NULL;
        if (!sw || !a || (w->sparse && (!sp || !sv))) {
#pragma omp atomic write
            fail = 1;
        }
#pragma omp for schedule(dynamic, 4)
        for (int r = 0; r < rows; r++) {
            if (rc != ER_OK || !sw || !a || (w->sparse && (!sp || !sv)))
                continue;
            const uint16_t *spc = w->sparse ? w->sp_cols + (size_t)r * w->sparse : NULL;
            for (int j = 0; j < w->sparse; j++)
                sp[spc[j]] = 1;
            uint16_t *lut = (uint16_t *)&w->lut[(size_t)r * k];
            float c[16];
            for (int j = 0; j < k; j++)
                c[j] = f16_to_f32(lut[j]);
            const float *x = src + (size_t)r * n;
            for (int round = 0; round < 2; round++) {
                gptq_assign_row(x, U, n, c, k, a, sw, sp, sv);
                lut_refit_row(x, Hd, n, a, sp, c, k, sw + n, M);
            }
            for (int j = 0; j < k; j++) {
                lut[j] = f32_to_f16(c[j]);
                c[j] = f16_to_f32(lut[j]);
            }
            gptq_assign_row(x, U, n, c, k, a, sw, sp, sv);
            for (int j = 0; j < w->sparse; j++) {
                ((uint16_t *)w->sp_vals)[(size_t)r * w->sparse + j] = sv[spc[j]];
                sp[spc[j]] = 0;
            }
            uint8_t *row = (uint8_t *)w->data + (size_t)r * weight_row_bytes(w->fmt, n);
            if (k == 4)
                quant_pack2(row, a, n);
            else
                quant_pack4(row, a, n);
        }
        free(sw);
        free(a);
        free(sp);
        free(sv);
    }
    quant_gptq_cache_free(&own);
    if (rc == ER_OK && fail)
        rc = er_error(ER_ENOMEM, "quantize_matrix: out of memory for row scratch");
    return rc;
}

int quantize_matrix(Weight *w, const float *src, int rows, int cols, const float *importance, const QuantOptions *o) {
    if (!weight_is_quantized(o->fmt))
        return er_error(ER_EINVAL, "quantize_matrix: %s is not a quantized format", weight_format_name(o->fmt));
    ER_TRY(quant_weight_alloc(w, o->fmt, rows, cols, o->group, o->sparse));
    int fail = 0, S = o->sparse;
#pragma omp parallel
    {
        Scratch s = {malloc(sizeof(float) * (size_t)cols), malloc((size_t)cols), malloc((size_t)cols),
                     S ? malloc(sizeof(float) * (size_t)cols) : NULL, S ? malloc(sizeof(SparseCand) * (size_t)cols)
                                                                        : NULL};
        int ok = s.sorted && s.codes && s.sq && (!S || (s.imp && s.cand));
        if (!ok) {
#pragma omp atomic write
            fail = 1;
        }
#pragma omp for schedule(dynamic, 16)
        for (int r = 0; r < rows; r++) {
            if (!ok)
                continue;
            const float *x = src + (size_t)r * cols, *imp = importance ? importance + (size_t)r * cols : NULL;
            if (S) {
                sparse_pick(w, r, x, imp, o->hessian, &s);
                imp = s.imp;
            }
            quantize_row(w, r, x, imp, o, &s);
        }
        free(s.sorted);
        free(s.codes);
        free(s.sq);
        free(s.imp);
        free(s.cand);
    }
    if (fail) {
        weight_free(w);
        return er_error(ER_ENOMEM, "quantize_matrix: out of memory for row scratch");
    }
    int rc = o->hessian && weight_format_info(o->fmt)->levels && !o->uniform
                 ? lut_output_error(w, src, o->hessian, o->gptq_cache)
             : S ? sparse_fill(w, src)
                 : ER_OK;
    for (size_t i = 0; rc == ER_OK && i < (size_t)rows * S; i++)
        if (!isfinite(f16_to_f32(w->sp_vals[i])))
            rc = er_error(ER_ERANGE, "quantize_matrix: the sparse correction of row %zu, column %u, is beyond fp16's "
                          "range", i / (size_t)S, w->sp_cols[i]);
    if (rc < 0)
        weight_free(w);
    return rc;
}

// ---- fake quantization ----

int quant_fake_quant_rows(float *dst, const float *src, int rows, int cols, const float *importance,
                          const QuantOptions *o) {
    Weight w;
    ER_TRY(quantize_matrix(&w, src, rows, cols, importance, o));
    quant_dequant_rows(dst, &w, 0, rows);
    weight_free(&w);
    return ER_OK;
}

void quant_fake_quant_lut(float *dst, const float *src, int rows, int cols, const uint16_t *lut, int nlev) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        float c[16];
        for (int j = 0; j < nlev; j++)
            c[j] = f16_to_f32(lut[(size_t)r * nlev + j]);
        const float *x = src + (size_t)r * cols;
        float *y = dst + (size_t)r * cols;
        for (int k = 0; k < cols; k++)
            y[k] = c[nearest(x[k], c, nlev)];
    }
}

// ---- the straight-through gradient of the error ----

// Symmetric levels scale * [-qmax, qmax], scale = c * max|x| / qmax.
static void ste_sym(const float *x, int n, float scale, int qmax, const float *ge, float *gw) {
    int imax = 0;
    for (int j = 1; j < n; j++)
        imax = fabsf(x[j]) > fabsf(x[imax]) ? j : imax;
    float amax = fabsf(x[imax]);
    if (!(scale > 0) || !(amax > 0))
        return;
    float inv = 1.0f / scale;
    double sigma = 0;
    for (int j = 0; j < n; j++) {
        float t = x[j] * inv, u = clampf(rintf(t), (float)-qmax, (float)qmax);
        int clipped = fabsf(t) > (float)qmax; // LSQ's rule: the clamp is active
        sigma += (double)ge[j] * (clipped ? u : u - t);
        if (clipped)
            gw[j] -= ge[j];
    }
    double c = (double)scale * qmax / amax; // ds/d|x_imax| = c / qmax
    gw[imax] += (float)(sigma * c / qmax * (x[imax] > 0 ? 1 : -1));
}

// Evenly spaced levels zero + scale * [0, nl - 1] over [min, max] shrunk about its centre by c: scale =
// c (max - min) / (nl - 1), zero = (max + min) / 2 - c (max - min) / 2.
static void ste_affine(const float *x, int n, float scale, float zero, int nl, const float *ge, float *gw) {
    int imin = 0, imax = 0;
    for (int j = 1; j < n; j++) {
        imin = x[j] < x[imin] ? j : imin;
        imax = x[j] > x[imax] ? j : imax;
    }
    float range = x[imax] - x[imin];
    if (!(scale > 0) || !(range > 0))
        return;
    double sigma = 0, zeta = 0; // sums over ge of d e / d scale and d e / d zero
    for (int j = 0; j < n; j++) {
        float t = (x[j] - zero) / scale, u = clampf(rintf(t), 0.0f, (float)(nl - 1));
        int clipped = t < 0 || t > (float)(nl - 1);
        sigma += (double)ge[j] * (clipped ? u : u - t);
        if (clipped) {
            zeta += ge[j];
            gw[j] -= ge[j];
        }
    }
    double c = (double)scale * (nl - 1) / range;
    gw[imax] += (float)(sigma * c / (nl - 1) + zeta * (1 - c) / 2);
    gw[imin] += (float)(-sigma * c / (nl - 1) + zeta * (1 + c) / 2);
}

void quant_ste_error_row(const Weight *q, const QuantOptions *o, int r, const float *w, const float *ge, float *gw) {
    int K = q->cols;
    switch (q->fmt) {
    case WF_Q8:
    case WF_Q4:
        ste_sym(w, K, q->scale[r], q->fmt == WF_Q8 ? 127 : 7, ge, gw);
        break;
    case WF_Q4G: {
        int G = q->group, ng = K / G;
        for (int g = 0; g < ng; g++)
            ste_affine(w + g * G, G, f16_to_f32(q->gscale[(size_t)r * ng + g]),
                       f16_to_f32(q->gzero[(size_t)r * ng + g]), 16, ge + g * G, gw + g * G);
        break;
    }
    case WF_Q2LUT:
    case WF_Q4LUT: {
        int nl = weight_format_info(q->fmt)->levels;
        float lv[16];
        for (int j = 0; j < nl; j++)
            lv[j] = f16_to_f32(q->lut[(size_t)r * nl + j]);
        if (o->uniform) {
            ste_affine(w, K, (lv[nl - 1] - lv[0]) / (float)(nl - 1), lv[0], nl, ge, gw);
            break;
        }
        double sum[16] = {0};
        int cnt[16] = {0};
        for (int j = 0; j < K; j++) {
            int a = nearest(w[j], lv, nl);
            sum[a] += ge[j];
            cnt[a]++;
        }
        for (int j = 0; j < K; j++) {
            int a = nearest(w[j], lv, nl);
            gw[j] += (float)(sum[a] / cnt[a]) - ge[j];
        }
        break;
    }
    default: break;
    }
}

double quant_rel_error(const Weight *q, const float *src) {
    double num = 0, den = 0;
#pragma omp parallel reduction(+ : num, den)
    {
        float *row = malloc(sizeof(float) * (size_t)q->cols);
#pragma omp for schedule(static)
        for (int r = 0; r < q->rows; r++) {
            if (!row)
                continue;
            weight_row_f32(row, q, r);
            const float *x = src + (size_t)r * q->cols;
            for (int k = 0; k < q->cols; k++) {
                double d = (double)x[k] - row[k];
                num += d * d;
                den += (double)x[k] * x[k];
            }
        }
        free(row);
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
