// Quantizers: fp32 matrix -> a packed Weight (formats in quant/weight.h).
//   - RTN (q8, q4, q4g): round to nearest with a scale per row (or per group). The scale comes from a
//     grid search over clipping ratios c in {1, 1 - 0.5/grid, ..., 0.5} minimising the (importance-
//     weighted) Lp error sum_k imp_k |w_k - Q(w_k)|^p; min-max is the baseline (c = 1 only), so the
//     search is never worse than min-max. The error is measured with the scales as stored (fp16 for
//     q4g), so what is chosen is what the file holds.
//   - Non-uniform (q2lut, q4lut): 1-D k-means per row (4 or 16 centroids), weighted by an optional per-weight
//     importance (diagonal Fisher = squared gradients, SqueezeLLM style); init at the quantiles of the
//     sorted row (the row's distinct values when it has at most k), then Lloyd iterations, each of
//     which can only lower the weighted objective. quantize_matrix runs Lloyd from a second start, the
//     uniform RTN levels below, and keeps the lower objective: the codebook is never worse (in weighted
//     L2, fp16 rounding aside) than the evenly spaced one. Centroids are rounded to fp16 and the codes
//     re-assigned to the nearest rounded centroid.
//   - Uniform codebooks (q2rtn): the q2lut file format with evenly spaced levels, zero + scale * {0, 1, 2, 3}
//     (asymmetric RTN at 2 bits), chosen by the same Lp grid search over clipping ratios as the RTN
//     formats. The baseline the k-means codebook is measured against; the same kernels run it.
//   - Output-error codebooks (q2lut / q4lut with a hessian H = XᵀX of the inputs): after the k-means
//     codebook, the codes of a row are assigned column by column with GPTQ's error feedback (Frantar et
//     al., arXiv 2210.17323: the rounding error of column i, scaled by the Cholesky factor of H⁻¹, is
//     pushed onto the columns not yet assigned), then each row's codebook is refitted to the codes by
//     least squares in the H metric, c = (AᵀHA)⁻¹AᵀHw (A the one-hot codes): the exact minimiser of the
//     row's output error ||X(w - Ac)||² for those codes. Two rounds, then a last assignment with the
//     fp16 codebook as stored. H is damped by 1% of its mean diagonal, as GPTQ does. Same format, same
//     kernels: nothing is added to the file. Cost O(cols³) once per matrix plus O(rows·cols²).
//   - Dense-and-sparse (codebook formats, QuantOptions.sparse = S; SqueezeLLM, Kim et al., arXiv
//     2306.07629): in each row the S weights with the largest output energy H_kk w_k² (without H: the
//     importance times w_k², or w_k²) are kept as sparse corrections (weight.h) and left out of the
//     codebook's fit (importance 0) and of the refit; with H, GPTQ's assignment stores at those columns
//     the value the row needs after the feedback so far, so their error is only the fp16 rounding.
//   - Fake quantization (QAT): quantize then dequantize, in fp32, so a training forward sees Q(W).
#ifndef QUANT_QUANTIZER_H
#define QUANT_QUANTIZER_H

#include <stdint.h>

#include "quant/weight.h"

typedef enum { QSEARCH_LP, QSEARCH_MINMAX } QuantSearch;

// The GPTQ factorisation of one H (below), kept so the matrices that read the same input (q, k, v; gate,
// up) factor it once. Zeroed = empty; free with quant_gptq_cache_free.
typedef struct {
    const float *H; // the second moment it was built from: the caller keeps it unchanged while cached
    int n;
    double *Hd, *U; // (n, n) each, as quant_gptq_factor gives them
} QuantGptqCache;

void quant_gptq_cache_free(QuantGptqCache *c);

typedef struct {
    WeightFormat fmt;   // WF_Q8, WF_Q4, WF_Q4G, WF_Q2LUT, WF_Q4LUT
    int group;          // WF_Q4G: inputs per group
    QuantSearch search; // RTN formats
    double p;           // Lp exponent of the search (default 2)
    int grid;           // clipping ratios after c = 1 (default 20)
    int kmeans_iters;   // WF_Q2LUT / WF_Q4LUT Lloyd iterations (default 25)
    int uniform;        // WF_Q2LUT / WF_Q4LUT: evenly spaced levels by RTN (q2rtn) instead of k-means (default 0)
    const float *hessian; // WF_Q2LUT / WF_Q4LUT k-means: (cols, cols) second moment XᵀX of the matrix's inputs
                          // on calibration data, or NULL. With it the codes are assigned with GPTQ error
                          // feedback and the codebooks refitted to the output error (below).
    QuantGptqCache *gptq_cache; // with hessian: its factor is reused when the last one factored into it was
                                // of the same H (pointer) and cols; NULL = factor for this matrix alone
    int sparse;         // WF_Q2LUT / WF_Q4LUT: dense-and-sparse corrections per row (default 0; above)
} QuantOptions;

void quant_options_default(QuantOptions *o, WeightFormat fmt, int group);

// *w = a new weight owning its buffers (free with weight_free). src (rows, cols) fp32; importance
// (rows, cols) >= 0 weights the error of each weight, NULL = all ones. Rows run in parallel.
int quantize_matrix(Weight *w, const float *src, int rows, int cols, const float *importance, const QuantOptions *o);

// ---- the pieces, exposed for tests ----

// The GPTQ factorisation of H (n, n): Hd (n, n) = H damped by 1% of its mean diagonal (dead inputs get 1 on
// the diagonal) and U (n, n) the upper Cholesky factor of its inverse, (Hd)⁻¹ = Uᵀ U. ER_EINVAL when H is
// not finite or Hd not positive definite.
int quant_gptq_factor(double *Hd, double *U, const float *H, int n);

// Symmetric RTN of n values with codes in [-qmax, qmax]: the chosen scale, codes q (n), and the weighted
// Lp error of that choice.
double quant_rtn_sym(const float *x, const float *imp, int n, int qmax, QuantSearch s, double p, int grid, float *scale,
                     int8_t *q);
// Asymmetric RTN of n values with codes in [0, 15]: W = u * scale + zero with scale and zero in fp16.
double quant_rtn_asym4(const float *x, const float *imp, int n, QuantSearch s, double p, int grid, uint16_t *scale16,
                       uint16_t *zero16, uint8_t *u);

// Evenly spaced codebook of nlev (2..16) levels for n values: lut[j] = fp16(zero + j * scale), zero and
// scale from the Lp search over clipping ratios c of [min, max] (shrunk about its centre); codes (n) the
// nearest stored level. Returns the weighted Lp error of the levels as stored.
double quant_rtn_uniform_lut(const float *x, const float *imp, int n, int nlev, QuantSearch s, double p, int grid,
                             uint16_t *lut, uint8_t *codes);

// Weighted 1-D k-means (1 <= k <= 16) of n values: centroids (k), assignments (n); hist (iters + 1),
// when not NULL, gets the objective sum imp_i (x_i - c_{a_i})^2 after the init and after each
// iteration. Returns the final objective. Deterministic.
double quant_kmeans_1d(const float *x, const float *imp, int n, int k, int iters, float *centroids, uint8_t *assign,
                       double *hist);

// ---- fake quantization (QAT) ----

// dst (rows, cols) = dequantize(quantize(src)) with options o (any quantized format); dst may be src.
// Exactly what quantize_matrix + quant_dequant_rows give.
int quant_fake_quant_rows(float *dst, const float *src, int rows, int cols, const float *importance,
                          const QuantOptions *o);
// dst (rows, cols) = each value of src replaced by the nearest level of its row's fp16 codebook lut
// (rows, nlev), ties to the lower index: the assignment step of a fixed codebook (quantize_matrix's
// q2lut / q4lut codes are the nearest levels of the codebook it stores). dst may be src.
void quant_fake_quant_lut(float *dst, const float *src, int rows, int cols, const uint16_t *lut, int nlev);

// The straight-through gradient of the fake quantizer's error e = Q(w) - w, scale-aware (LSQ's, Esser et
// al., arXiv 1902.08153): rounding passes gradients straight through, so a weight inside the grid moves
// its own error only through the levels, which its row's (group's) extremes set: e_j = s(w) (u_j - t_j)
// with the offsets u_j - t_j = code - w_j / s held; a clipped weight (t_j = w_j / s, or (w_j - zero) / s,
// beyond the end levels) sits on an end level, e_j = s(w) u_j + zero(w) - w_j. s and zero follow [min, max]
// as the clipping search shrank it (its ratio held).
// k-means codebooks: the codes held, each level the (unweighted) mean of its weights, e_j = mean - w_j.
// Row r of q = quantize_matrix(src, no importance, o), w = src's row r: gw (cols) += (de/dw)ᵀ ge.
void quant_ste_error_row(const Weight *q, const QuantOptions *o, int r, const float *w, const float *ge, float *gw);

// ||W - Q(W)||_F / ||W||_F of a quantized weight against its fp32 source (rows, cols).
double quant_rel_error(const Weight *q, const float *src);

#endif
