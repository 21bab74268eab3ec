// Function-preserving transforms: Hadamard and orthogonal matrices, in-place products with them, and
// the closed-form balancing scales. See quant/transform.h for the constructions.
#include "quant/transform.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/gemm.h"

// ---- Hadamard matrices ----

static int is_prime(int p) {
    if (p < 2)
        return 0;
    for (int d = 2; (long)d * d <= p; d++)
        if (p % d == 0)
            return 0;
    return 1;
}

// The Paley block that, times a power of 2, makes order n: kind 1 (Paley I, order p+1), kind 2
// (Paley II, order 2(p+1)) or kind 0 (no block: n is a power of 2). Returns the block order, or 0
// when no construction here reaches n. The smallest block wins, leaving the most to Sylvester.
static int hadamard_plan(int n, int *kind, int *prime) {
    if (n <= 0)
        return 0;
    int odd = n;
    while (odd % 2 == 0)
        odd /= 2;
    for (int b = odd; b <= n; b *= 2) {
        if (b == 1) {
            *kind = 0;
            *prime = 0;
            return 1;
        }
        if (is_prime(b - 1) && (b - 1) % 4 == 3) {
            *kind = 1;
            *prime = b - 1;
            return b;
        }
        if (b % 2 == 0 && is_prime(b / 2 - 1) && (b / 2 - 1) % 4 == 1) {
            *kind = 2;
            *prime = b / 2 - 1;
            return b;
        }
    }
    return 0;
}

int transform_hadamard_exists(int n) {
    int kind, p;
    return hadamard_plan(n, &kind, &p) > 0;
}

static int sylvester(int i, int j) { return __builtin_popcount((unsigned)(i & j)) & 1 ? -1 : 1; }

// The Paley block P (b, b), ±1 entries. chi: the quadratic character of GF(p) (1 square, -1 not, 0 zero).
static int paley_block(int *P, int b, int kind, int p) {
    // The conference-style core S (p+1, p+1): [[0, 1ᵀ], [±1, Q]] with Q[a][c] = chi(a - c).
    int q1 = p + 1, rc = ER_OK;
    int *chi = er_calloc((size_t)p, sizeof(int)), *S = er_calloc((size_t)q1 * q1, sizeof(int)); // (p), (q1, q1)
    if (!chi || !S)
        ER_CHECK(ER_ENOMEM);
    for (int x = 1; x < p; x++)
        chi[x] = -1;
    for (long x = 1; x < p; x++)
        chi[(x * x) % p] = 1;
    for (int i = 0; i < q1; i++)
        for (int j = 0; j < q1; j++) {
            int v;
            if (i == 0 && j == 0)
                v = 0;
            else if (i == 0)
                v = 1;
            else if (j == 0)
                v = kind == 1 ? -1 : 1; // skew for Paley I, symmetric for Paley II
            else
                v = chi[((i - 1) - (j - 1) + p) % p];
            S[(size_t)i * q1 + j] = v;
        }
    if (kind == 1) { // H = I + S
        for (int i = 0; i < q1; i++)
            for (int j = 0; j < q1; j++)
                P[(size_t)i * b + j] = S[(size_t)i * q1 + j] + (i == j);
    } else { // 0 -> [[1,-1],[-1,-1]], ±1 -> ±[[1,1],[1,-1]]
        for (int i = 0; i < q1; i++)
            for (int j = 0; j < q1; j++)
                for (int u = 0; u < 2; u++)
                    for (int v = 0; v < 2; v++) {
                        int s = S[(size_t)i * q1 + j];
                        int e = s == 0 ? ((u | v) ? -1 : 1) : s * ((u & v) ? -1 : 1);
                        P[(size_t)(2 * i + u) * b + 2 * j + v] = e;
                    }
    }
done:
    er_free(S);
    er_free(chi);
    return rc;
}

int transform_hadamard(float *H, int n) {
    int kind, p;
    int b = hadamard_plan(n, &kind, &p);
    if (b == 0)
        return er_error(ER_EUNSUPPORTED, "transform: no Hadamard matrix of order %d from Sylvester x Paley", n);
    int *P = er_alloc(sizeof(int) * (size_t)b * b), rc = ER_OK;
    if (!P)
        return ER_ENOMEM;
    if (kind == 0)
        P[0] = 1;
    else
        ER_CHECK(paley_block(P, b, kind, p));
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            H[(size_t)i * n + j] = (float)(sylvester(i / b, j / b) * P[(size_t)(i % b) * b + j % b]);
done:
    er_free(P);
    return rc;
}

// ---- orthogonal matrices ----

// M (n, n) <- (I - 2 v vᵀ) · M on columns j0..n-1, for a reflector v that is zero above row k.
static void reflect(double *M, const double *v, int n, int k, int j0) {
    for (int j = j0; j < n; j++) {
        double d = 0;
        for (int i = k; i < n; i++)
            d += v[i] * M[(size_t)i * n + j];
        for (int i = k; i < n; i++)
            M[(size_t)i * n + j] -= 2 * d * v[i];
    }
}

int transform_random_orthogonal(float *Q, int n, ErRng *rng) {
    if (n <= 0)
        return er_error(ER_EINVAL, "transform: orthogonal matrix of order %d", n);
    double *A = er_alloc(sizeof(double) * (size_t)n * n), *V = er_alloc(sizeof(double) * (size_t)n * n);
    double *Qd = er_alloc(sizeof(double) * (size_t)n * n), *sign = er_alloc(sizeof(double) * (size_t)n);
    int rc = ER_OK;
    if (!A || !V || !Qd || !sign)
        ER_CHECK(ER_ENOMEM);
    for (size_t i = 0; i < (size_t)n * n; i++)
        A[i] = rng_normal(rng);
    // Householder QR: A = H_0 ... H_{n-1} R; V[k] holds the unit reflector of step k (entries k..n-1).
    for (int k = 0; k < n; k++) {
        double *v = V + (size_t)k * n, norm = 0;
        for (int i = k; i < n; i++)
            norm += A[(size_t)i * n + k] * A[(size_t)i * n + k];
        norm = sqrt(norm);
        double x0 = A[(size_t)k * n + k], alpha = x0 >= 0 ? -norm : norm;
        sign[k] = alpha >= 0 ? 1.0 : -1.0; // sign of R[k][k]
        memset(v, 0, sizeof(double) * n);
        for (int i = k; i < n; i++)
            v[i] = A[(size_t)i * n + k];
        v[k] -= alpha;
        double vn = 0;
        for (int i = k; i < n; i++)
            vn += v[i] * v[i];
        vn = sqrt(vn);
        if (vn == 0) // the column is already reduced: identity reflector
            continue;
        for (int i = k; i < n; i++)
            v[i] /= vn;
        reflect(A, v, n, k, k);
    }
    // Q = H_0 ... H_{n-1} applied to I, then Q · diag(sign R) so that Q is Haar-distributed.
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            Qd[(size_t)i * n + j] = i == j;
    for (int k = n - 1; k >= 0; k--)
        reflect(Qd, V + (size_t)k * n, n, k, 0);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            Q[(size_t)i * n + j] = (float)(Qd[(size_t)i * n + j] * sign[j]);
done:
    er_free(A);
    er_free(V);
    er_free(Qd);
    er_free(sign);
    return rc;
}

int transform_rotation(float *Q, int n, uint64_t seed) {
    if (n <= 0)
        return er_error(ER_EINVAL, "transform: rotation of order %d", n);
    ErRng r;
    rng_seed(&r, seed);
    if (transform_hadamard_exists(n)) {
        ER_TRY(transform_hadamard(Q, n));
        float inv = (float)(1.0 / sqrt((double)n));
        float *d = er_alloc(sizeof(float) * (size_t)n);
        if (!d)
            return ER_ENOMEM;
        for (int j = 0; j < n; j++)
            d[j] = (rng_u64(&r) >> 63) ? -inv : inv;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++)
                Q[(size_t)i * n + j] *= d[j];
        er_free(d);
        return ER_OK;
    }
    // (H_a · D / √a) ⊗ R_m with a the power-of-2 factor and R_m Haar-random orthogonal.
    int a = 1, m = n;
    while (m % 2 == 0) {
        a *= 2;
        m /= 2;
    }
    float *R = er_alloc(sizeof(float) * (size_t)m * m), *d = er_alloc(sizeof(float) * (size_t)a);
    int rc = ER_OK;
    if (!R || !d)
        ER_CHECK(ER_ENOMEM);
    float inv = (float)(1.0 / sqrt((double)a));
    for (int j = 0; j < a; j++)
        d[j] = (rng_u64(&r) >> 63) ? -inv : inv;
    ER_CHECK(transform_random_orthogonal(R, m, &r));
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            Q[(size_t)i * n + j] = (float)sylvester(i / m, j / m) * d[j / m] * R[(size_t)(i % m) * m + j % m];
done:
    er_free(R);
    er_free(d);
    return rc;
}

double transform_orthogonality_error(const float *Q, int n) {
    double *G = er_calloc((size_t)n * n, sizeof(double)); // (n, n) upper triangle of QᵀQ
    if (!G)
        return INFINITY;
    for (int k = 0; k < n; k++) { // row by row, so every access is contiguous
        const float *q = Q + (size_t)k * n;
        for (int i = 0; i < n; i++) {
            double qi = q[i], *g = G + (size_t)i * n;
            for (int j = i; j < n; j++)
                g[j] += qi * q[j];
        }
    }
    double worst = 0;
    for (int i = 0; i < n; i++)
        for (int j = i; j < n; j++) {
            double d = fabs(G[(size_t)i * n + j] - (i == j));
            if (d > worst)
                worst = d;
        }
    er_free(G);
    return worst;
}

// ---- products and scales ----

enum { TF_BLOCK = 256 }; // rows (or columns) per product, so the scratch stays small

int transform_matmul_right(float *W, int rows, int cols, int ld, const float *Q) {
    if (rows <= 0 || cols <= 0)
        return ER_OK;
    int rb = rows < TF_BLOCK ? rows : TF_BLOCK;
    float *tmp = er_alloc(sizeof(float) * (size_t)rb * cols); // (rb, cols)
    if (!tmp)
        return er_error(ER_ENOMEM, "transform: no scratch for %d x %d", rb, cols);
    for (int r0 = 0; r0 < rows; r0 += rb) {
        int nr = rows - r0 < rb ? rows - r0 : rb;
        float *blk = W + (size_t)r0 * ld;
        gemm_f32(0, 0, nr, cols, cols, 1.0f, blk, ld, Q, cols, 0.0f, tmp, cols);
        for (int i = 0; i < nr; i++)
            memcpy(blk + (size_t)i * ld, tmp + (size_t)i * cols, sizeof(float) * cols);
    }
    er_free(tmp);
    return ER_OK;
}

int transform_matmul_left_t(float *W, int rows, int cols, int ld, const float *Q) {
    if (rows <= 0 || cols <= 0)
        return ER_OK;
    int cb = cols < TF_BLOCK ? cols : TF_BLOCK;
    float *tmp = er_alloc(sizeof(float) * (size_t)rows * cb); // (rows, cb)
    if (!tmp)
        return er_error(ER_ENOMEM, "transform: no scratch for %d x %d", rows, cb);
    for (int c0 = 0; c0 < cols; c0 += cb) {
        int nc = cols - c0 < cb ? cols - c0 : cb;
        gemm_f32(1, 0, rows, nc, rows, 1.0f, Q, rows, W + c0, ld, 0.0f, tmp, nc);
        for (int i = 0; i < rows; i++)
            memcpy(W + (size_t)i * ld + c0, tmp + (size_t)i * nc, sizeof(float) * nc);
    }
    er_free(tmp);
    return ER_OK;
}

void transform_scale_cols(float *W, int rows, int cols, int ld, const float *s, int divide) {
    for (int i = 0; i < rows; i++) {
        float *row = W + (size_t)i * ld;
        for (int j = 0; j < cols; j++)
            row[j] = divide ? row[j] / s[j] : row[j] * s[j];
    }
}

void transform_scale_rows(float *W, int rows, int cols, int ld, const float *s, int divide) {
    for (int i = 0; i < rows; i++) {
        float *row = W + (size_t)i * ld;
        for (int j = 0; j < cols; j++)
            row[j] = divide ? row[j] / s[i] : row[j] * s[i];
    }
}

void transform_rotate_rows(float *W, int cols, int ld, int r0, int r1, double c, double s, double a) {
    float *x = W + (size_t)r0 * ld, *y = W + (size_t)r1 * ld;
    for (int j = 0; j < cols; j++) {
        double u = x[j], v = y[j];
        x[j] = (float)(a * (c * u - s * v));
        y[j] = (float)(a * (s * u + c * v));
    }
}

void transform_row_absmax(float *out, const float *W, int rows, int cols, int ld) {
    for (int i = 0; i < rows; i++)
        out[i] = transform_absmax(W + (size_t)i * ld, (size_t)cols);
}

void transform_col_absmax_acc(float *out, const float *W, int rows, int cols, int ld) {
    for (int i = 0; i < rows; i++) {
        const float *row = W + (size_t)i * ld;
        for (int j = 0; j < cols; j++)
            if (fabsf(row[j]) > out[j])
                out[j] = fabsf(row[j]);
    }
}

float transform_balance_scale(float a, float b, float alpha) {
    if (!(a > 0) || !(b > 0) || !isfinite(a) || !isfinite(b))
        return 1.0f;
    double s = pow((double)b, alpha) / pow((double)a, 1.0 - alpha);
    return isfinite(s) && s > 0 ? (float)s : 1.0f;
}

float transform_absmax(const float *x, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++)
        if (fabsf(x[i]) > m)
            m = fabsf(x[i]);
    return m;
}

double transform_kurtosis(const float *x, size_t n) {
    if (n == 0)
        return 0;
    double mu = 0, m2 = 0, m4 = 0;
    for (size_t i = 0; i < n; i++)
        mu += x[i];
    mu /= (double)n;
    for (size_t i = 0; i < n; i++) {
        double d = x[i] - mu, d2 = d * d;
        m2 += d2;
        m4 += d2 * d2;
    }
    m2 /= (double)n;
    m4 /= (double)n;
    return m2 > 0 ? m4 / (m2 * m2) : 0;
}

int transform_parse_mode(const char *mode, unsigned *flags) {
    *flags = 0;
    if (!mode || !*mode)
        return er_error(ER_EINVAL, "transform: no mode (expected none, rotate or fpt)");
    const char *p = mode;
    while (*p) {
        size_t n = strcspn(p, ",+");
        char part[16];
        if (n == 0 || n >= sizeof part)
            return er_error(ER_EINVAL, "transform: mode \"%s\": expected none, rotate, fpt or a list of rotate,u,v,k",
                            mode);
        memcpy(part, p, n);
        part[n] = 0;
        if (strcmp(part, "none") == 0)
            ;
        else if (strcmp(part, "rotate") == 0 || strcmp(part, "r") == 0)
            *flags |= TRANSFORM_ROTATE;
        else if (strcmp(part, "u") == 0)
            *flags |= TRANSFORM_UP;
        else if (strcmp(part, "v") == 0)
            *flags |= TRANSFORM_V;
        else if (strcmp(part, "k") == 0)
            *flags |= TRANSFORM_K;
        else if (strcmp(part, "fpt") == 0)
            *flags |= TRANSFORM_ALL;
        else if (strcmp(part, "fpt-trained") == 0)
            *flags |= TRANSFORM_ALL | TRANSFORM_TRAINED;
        else
            return er_error(ER_EINVAL, "transform: unknown mode \"%s\" in \"%s\" (expected none, rotate, fpt, fpt-trained, u, v or k)",
                            part, mode);
        p += n;
        if (*p)
            p++;
    }
    return ER_OK;
}
