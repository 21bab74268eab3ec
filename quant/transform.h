// Function-preserving transforms (FPTQuant style): the math on plain fp32 arrays. A transform
// multiplies one weight by an invertible matrix and its neighbour by the inverse, so the network
// computes the same function while the weights get ranges that quantize better. The model-level
// wiring (which weights pair up) lives in train/transform_model.h; these helpers know no model.
//
// Rotations. transform_rotation() builds a randomized Hadamard matrix Q = H·D/√n (H a ±1 Hadamard
// matrix, D random ±1 signs): every entry has magnitude 1/√n, so Q spreads any one outlier channel
// evenly over all n channels. H is Sylvester's H_{2^a} ⊗ a Paley block: Paley I gives order p+1 for
// a prime p ≡ 3 (mod 4), Paley II order 2(p+1) for a prime p ≡ 1 (mod 4). Every hidden size of the
// Qwen2 family is covered (896 = 32·28 with 28 from Paley II, p = 13; 1536 = 128·12, 3584 = 128·28;
// the test sizes 48 = 4·12 and 96 = 8·12). When no such H exists (e.g. n = 14, 86), Q is the
// Kronecker product of a randomized Walsh-Hadamard block of the largest power-of-2 factor 2^a with
// a Haar-random orthogonal block of the odd part m (Householder QR of a seeded Gaussian matrix, in
// double): still exactly orthogonal, and outliers still spread over 2^a channels at least.
//
// Matrices are row-major; W (rows, cols) with row stride ld (ld >= cols) so that blocks of a larger
// matrix (one head's columns of o_proj) can be transformed in place.
#ifndef QUANT_TRANSFORM_H
#define QUANT_TRANSFORM_H

#include <stddef.h>
#include <stdint.h>

#include "core/rng.h"

// The transforms of a model (train/transform_model.h applies them; a quantized model's
// quantization_config names the ones baked into its weights).
enum {
    TRANSFORM_ROTATE = 1, // T_r (with the norm fold)
    TRANSFORM_UP = 2,     // T_u
    TRANSFORM_V = 4,      // T_v
    TRANSFORM_K = 8,      // T_k
    TRANSFORM_ALL = 15,
    TRANSFORM_TRAINED = 16, // "fpt-trained": TRANSFORM_ALL as the initialisation, then trained (train/fpt.h)
};

// A mode string ("none", "rotate", "fpt", "fpt-trained", or a list joined by ',' or '+' of "rotate"
// ("r"), "u", "v", "k", "fpt") as TRANSFORM_* flags (0 for "none"); ER_EINVAL names the unknown part.
int transform_parse_mode(const char *mode, unsigned *flags);

// 1 when transform_hadamard can build an order-n Hadamard matrix, else 0.
int transform_hadamard_exists(int n);
// H (n, n) = a ±1 matrix with HᵀH = n·I; ER_EUNSUPPORTED when transform_hadamard_exists(n) is 0.
int transform_hadamard(float *H, int n);
// Q (n, n): a Haar-random orthogonal matrix drawn from rng (Householder QR, sign-corrected).
int transform_random_orthogonal(float *Q, int n, ErRng *rng);
// Q (n, n): the seeded randomized Hadamard rotation described above (orthogonal: QᵀQ = I).
int transform_rotation(float *Q, int n, uint64_t seed);
// max |QᵀQ - I| over all entries (in double): how far Q is from orthogonal (INFINITY without memory).
double transform_orthogonality_error(const float *Q, int n);

// W (rows, cols; stride ld) <- W · Q, Q (cols, cols). For matrices that read a rotated input.
int transform_matmul_right(float *W, int rows, int cols, int ld, const float *Q);
// W (rows, cols; stride ld) <- Qᵀ · W, Q (rows, rows). For matrices that write a rotated output
// (and for bias vectors: cols = ld = 1).
int transform_matmul_left_t(float *W, int rows, int cols, int ld, const float *Q);

// W[:, j] *= s[j] (or /= s[j] when divide): folding an RMSNorm scale, or the inverse side of a scale.
void transform_scale_cols(float *W, int rows, int cols, int ld, const float *s, int divide);
// W[i, :] *= s[i] (or /= s[i] when divide).
void transform_scale_rows(float *W, int rows, int cols, int ld, const float *s, int divide);
// Rows r0 and r1 of W (cols wide, stride ld) <- a · R(θ) [row r0; row r1], R(θ) = [[c, -s], [s, c]]
// with c = cos θ, s = sin θ: the pre-RoPE scaled rotation of one frequency pair.
void transform_rotate_rows(float *W, int cols, int ld, int r0, int r1, double c, double s, double a);

// out[i] = max_j |W[i, j]| (per row).
void transform_row_absmax(float *out, const float *W, int rows, int cols, int ld);
// out[j] = max(out[j], max_i |W[i, j]|) (per column, accumulated so several blocks can share out).
void transform_col_absmax_acc(float *out, const float *W, int rows, int cols, int ld);
// The closed-form balancing scale between a matrix whose channel j is multiplied by s_j (range a_j)
// and one whose channel j is divided by s_j (range b_j): s_j = b_j^alpha / a_j^(1-alpha). With
// alpha = 1/2 both sides end with range √(a_j·b_j). Channels with a zero or non-finite range get 1.
float transform_balance_scale(float a, float b, float alpha);

// Statistics for outlier checks: max |x|, and the kurtosis E[(x-μ)^4] / E[(x-μ)^2]^2 (3 for a Gaussian).
float transform_absmax(const float *x, size_t n);
double transform_kurtosis(const float *x, size_t n);

#endif
