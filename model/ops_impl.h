// Op bodies, compiled twice by model/ops.c with REAL = float / double and SFX = "" / _f64.
// Shapes are in model/ops.h. Every loop over rows runs in parallel (the forward's, when it has
// THREADS_MIN_WORK elements: a decode step's one row does not); no BLAS is called here.

#define OPNAME_(a, b) a##b
#define OPNAME(a, b) OPNAME_(a, b)
#define OP(name) OPNAME(name, SFX)

void OP(rmsnorm_forward)(REAL *out, REAL *rstd, const REAL *x, const REAL *w, int N, int C, REAL eps) {
#pragma omp parallel for schedule(static) if ((long)N * C >= THREADS_MIN_WORK)
    for (int n = 0; n < N; n++) {
        const REAL *xn = x + (size_t)n * C;
        double ss = 0.0;
        for (int i = 0; i < C; i++)
            ss += (double)xn[i] * xn[i];
        REAL r = (REAL)(1.0 / sqrt(ss / C + (double)eps));
        rstd[n] = r;
        REAL *o = out + (size_t)n * C;
        for (int i = 0; i < C; i++)
            o[i] = xn[i] * r * w[i];
    }
}

void OP(rmsnorm_backward)(REAL *dx, REAL *dw, const REAL *dout, const REAL *x, const REAL *w, const REAL *rstd,
                          int N, int C) {
    // dx = r * (dy*w) - x * r^3 / C * sum(dy*w*x);  dw = sum_n dy * x * r
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const REAL *xn = x + (size_t)n * C, *dy = dout + (size_t)n * C;
        REAL r = rstd[n];
        double dot = 0.0;
        for (int i = 0; i < C; i++)
            dot += (double)dy[i] * w[i] * xn[i];
        REAL k = (REAL)(dot * r * r * r / C);
        REAL *d = dx + (size_t)n * C;
        for (int i = 0; i < C; i++)
            d[i] += r * dy[i] * w[i] - xn[i] * k;
    }
    if (dw) {
        // Columns in parallel so the accumulation over rows has no races.
#pragma omp parallel for schedule(static)
        for (int i = 0; i < C; i++) {
            double acc = 0.0;
            for (int n = 0; n < N; n++)
                acc += (double)dout[(size_t)n * C + i] * x[(size_t)n * C + i] * rstd[n];
            dw[i] += (REAL)acc;
        }
    }
}

// x (N, nh, HS) rotated in place by each position's angles (HF rotate_half pairs i, i + HS/2); inverse:
// by minus the angles, the transpose, which is the backward. Inlined with a constant `inverse`, so each
// direction keeps its own plain expressions.
static inline __attribute__((always_inline)) void OP(rope_rotate)(REAL *x, const int *pos, const REAL *cos_tab,
                                                                  const REAL *sin_tab, int N, int nh, int HS,
                                                                  const int inverse) {
    int half = HS / 2;
#pragma omp parallel for schedule(static) if ((long)N * nh * HS >= THREADS_MIN_WORK)
    for (int n = 0; n < N; n++) {
        const REAL *c = cos_tab + (size_t)pos[n] * half, *s = sin_tab + (size_t)pos[n] * half;
        for (int h = 0; h < nh; h++) {
            REAL *v = x + ((size_t)n * nh + h) * HS;
            for (int i = 0; i < half; i++) {
                REAL x1 = v[i], x2 = v[i + half];
                v[i] = inverse ? x1 * c[i] + x2 * s[i] : x1 * c[i] - x2 * s[i];
                v[i + half] = inverse ? x2 * c[i] - x1 * s[i] : x2 * c[i] + x1 * s[i];
            }
        }
    }
}

void OP(rope_forward)(REAL *x, const int *pos, const REAL *cos_tab, const REAL *sin_tab, int N, int nh, int HS) {
    OP(rope_rotate)(x, pos, cos_tab, sin_tab, N, nh, HS, 0);
}

void OP(rope_backward)(REAL *dx, const int *pos, const REAL *cos_tab, const REAL *sin_tab, int N, int nh, int HS) {
    OP(rope_rotate)(dx, pos, cos_tab, sin_tab, N, nh, HS, 1);
}

void OP(swiglu_forward)(REAL *out, const REAL *gate, const REAL *up, int N, int F) {
    size_t n = (size_t)N * F;
    // if (parallel : ...): a bare if clause applies to the simd part too and would keep it scalar
#pragma omp parallel for simd schedule(static) if (parallel : n >= THREADS_MIN_WORK)
    for (size_t i = 0; i < n; i++) {
        REAL g = gate[i];
        out[i] = g / (1 + VEXP(-g)) * up[i];
    }
}

void OP(swiglu_backward)(REAL *dgate, REAL *dup, const REAL *dout, const REAL *gate, const REAL *up, int N, int F) {
    size_t n = (size_t)N * F;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        REAL g = gate[i], sg = 1 / (1 + VEXP(-g));
        dup[i] = dout[i] * g * sg;
        dgate[i] = dout[i] * up[i] * sg * (1 + g * (1 - sg));
    }
}

int OP(attention_forward)(REAL *out, REAL *lse, const REAL *q, const REAL *k, const REAL *v, const int *qoff,
                          int B, int T, int Tk, int NH, int NKV, int HS, REAL *scores, int nthreads) {
    if (!scores || nthreads < 1)
        return er_error(ER_EINVAL, "attention: no scratch for the scores (%d threads)", nthreads);
    int G = NH / NKV;
    REAL scale = (REAL)(1.0 / sqrt((double)HS));
#pragma omp parallel for collapse(3) schedule(static) num_threads(nthreads)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                REAL *sc = scores + (size_t)omp_get_thread_num() * Tk;
                int last = (qoff ? qoff[b] : 0) + t; // last visible key
                if (last > Tk - 1)
                    last = Tk - 1;
                const REAL *qv = q + (((size_t)b * T + t) * NH + h) * HS;
                const REAL *kb = k + (size_t)b * Tk * NKV * HS + (size_t)(h / G) * HS;
                const REAL *vb = v + (size_t)b * Tk * NKV * HS + (size_t)(h / G) * HS;
                REAL mx = -INFINITY;
                for (int s = 0; s <= last; s++) {
                    const REAL *kv = kb + (size_t)s * NKV * HS;
                    REAL d = 0;
#pragma omp simd reduction(+ : d)
                    for (int i = 0; i < HS; i++)
                        d += qv[i] * kv[i];
                    sc[s] = d * scale;
                    if (sc[s] > mx)
                        mx = sc[s];
                }
                REAL sum = 0;
                for (int s = 0; s <= last; s++) {
                    sc[s] = VEXP(sc[s] - mx);
                    sum += sc[s];
                }
                REAL *o = out + (((size_t)b * T + t) * NH + h) * HS;
                for (int i = 0; i < HS; i++)
                    o[i] = 0;
                REAL inv = 1 / sum;
                for (int s = 0; s <= last; s++) {
                    const REAL *vv = vb + (size_t)s * NKV * HS;
                    REAL p = sc[s] * inv;
#pragma omp simd
                    for (int i = 0; i < HS; i++)
                        o[i] += p * vv[i];
                }
                lse[((size_t)b * NH + h) * T + t] = mx + log(sum);
            }
    return ER_OK;
}

int OP(attention_backward)(REAL *dq, REAL *dk, REAL *dv, const REAL *dout, const REAL *out, const REAL *lse,
                           const REAL *q, const REAL *k, const REAL *v, const int *qoff, int B, int T, int Tk,
                           int NH, int NKV, int HS, REAL *dkh, REAL *dvh) {
    // Heads run in parallel, each accumulating its own dK/dV (Tk, HS); the query heads sharing a KV
    // head are summed afterwards. This keeps the loop race-free with NH-way parallelism even for B = 1.
    int G = NH / NKV;
    REAL scale = (REAL)(1.0 / sqrt((double)HS));
    size_t per_head = (size_t)Tk * HS;
    if (!dkh || !dvh)
        return er_error(ER_EINVAL, "attention backward: no scratch for the per-head gradients");
    memset(dkh, 0, sizeof(REAL) * (size_t)B * NH * per_head);
    memset(dvh, 0, sizeof(REAL) * (size_t)B * NH * per_head);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            REAL *dkb = dkh + ((size_t)b * NH + h) * per_head, *dvb = dvh + ((size_t)b * NH + h) * per_head;
            const REAL *kb = k + (size_t)b * Tk * NKV * HS + (size_t)(h / G) * HS;
            const REAL *vb = v + (size_t)b * Tk * NKV * HS + (size_t)(h / G) * HS;
            for (int t = 0; t < T; t++) {
                int last = (qoff ? qoff[b] : 0) + t;
                if (last > Tk - 1)
                    last = Tk - 1;
                size_t row = ((size_t)b * T + t) * NH + h;
                const REAL *qv = q + row * HS, *dov = dout + row * HS, *ov = out + row * HS;
                REAL *dqv = dq + row * HS;
                REAL l = lse[((size_t)b * NH + h) * T + t];
                REAL D = 0; // sum_i dO_i O_i = sum_s p_s dp_s
                for (int i = 0; i < HS; i++) {
                    D += dov[i] * ov[i];
                    dqv[i] = 0;
                }
                for (int s = 0; s <= last; s++) {
                    const REAL *kv = kb + (size_t)s * NKV * HS, *vv = vb + (size_t)s * NKV * HS;
                    REAL sc = 0, dp = 0;
#pragma omp simd reduction(+ : sc, dp)
                    for (int i = 0; i < HS; i++) {
                        sc += qv[i] * kv[i];
                        dp += dov[i] * vv[i];
                    }
                    REAL p = VEXP(sc * scale - l);
                    REAL ds = p * (dp - D) * scale;
                    REAL *dks = dkb + (size_t)s * HS, *dvs = dvb + (size_t)s * HS;
#pragma omp simd
                    for (int i = 0; i < HS; i++) {
                        dqv[i] += ds * kv[i];
                        dks[i] += ds * qv[i];
                        dvs[i] += p * dov[i];
                    }
                }
            }
        }
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int s = 0; s < Tk; s++)
            for (int kh = 0; kh < NKV; kh++) {
                REAL *dks = dk + (((size_t)b * Tk + s) * NKV + kh) * HS;
                REAL *dvs = dv + (((size_t)b * Tk + s) * NKV + kh) * HS;
                for (int i = 0; i < HS; i++)
                    dks[i] = dvs[i] = 0;
                for (int g = 0; g < G; g++) {
                    size_t off = ((size_t)b * NH + kh * G + g) * per_head + (size_t)s * HS;
                    for (int i = 0; i < HS; i++) {
                        dks[i] += dkh[off + i];
                        dvs[i] += dvh[off + i];
                    }
                }
            }
    return ER_OK;
}

// The largest of l[0..V-1] (V >= 1): the shift that keeps the exponentials of a softmax finite.
static inline REAL OP(row_max)(const REAL *l, int V) {
    REAL mx = l[0];
#pragma omp simd reduction(max : mx)
    for (int i = 1; i < V; i++)
        mx = l[i] > mx ? l[i] : mx;
    return mx;
}

double OP(cross_entropy_forward_backward)(REAL *logits, const int *targets, const REAL *mask, int N, int V,
                                          int grad, double wsum, double *row_loss) {
    if (wsum <= 0.0) { // this call's rows are the whole batch
        wsum = 0.0;
        for (int n = 0; n < N; n++)
            wsum += mask ? mask[n] : 1.0;
    }
    // Row losses are summed in row order afterwards, so the loss is the same bits for any thread count.
    if (N <= 0)
        return 0.0;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        REAL *l = logits + (size_t)n * V;
        double w = mask ? mask[n] : 1.0;
        if (w == 0.0 || wsum == 0.0) {
            row_loss[n] = 0;
            if (grad)
                for (int i = 0; i < V; i++)
                    l[i] = 0;
            continue;
        }
        REAL mx = OP(row_max)(l, V);
        REAL lt = l[targets[n]];
        double sum = 0.0;
        if (grad) { // exponentials stored in place, then scaled into the gradient
#pragma omp simd reduction(+ : sum)
            for (int i = 0; i < V; i++) {
                l[i] = VEXP(l[i] - mx);
                sum += l[i];
            }
        } else {
#pragma omp simd reduction(+ : sum)
            for (int i = 0; i < V; i++)
                sum += VEXP(l[i] - mx);
        }
        double lse = mx + log(sum);
        row_loss[n] = w * (lse - lt);
        if (grad) {
            REAL k = (REAL)(w / wsum / sum);
#pragma omp simd
            for (int i = 0; i < V; i++)
                l[i] *= k;
            l[targets[n]] -= (REAL)(w / wsum);
        }
    }
    double total = 0.0;
    for (int n = 0; n < N; n++)
        total += row_loss[n];
    return wsum > 0 ? total / wsum : 0.0;
}

void OP(logprob_forward)(REAL *logp, const REAL *logits, const int *targets, int N, int V, REAL inv_temp) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const REAL *l = logits + (size_t)n * V;
        REAL mx = OP(row_max)(l, V);
        double sum = 0.0;
#pragma omp simd reduction(+ : sum)
        for (int i = 0; i < V; i++)
            sum += VEXP((l[i] - mx) * inv_temp);
        logp[n] = (REAL)((double)(l[targets[n]] - mx) * inv_temp - log(sum));
    }
}

void OP(logprob_backward)(REAL *dlogits, const REAL *logits, const int *targets, const REAL *coef, int N, int V,
                          REAL inv_temp) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const REAL *l = logits + (size_t)n * V;
        REAL *d = dlogits + (size_t)n * V;
        if (coef[n] == 0) {
            for (int i = 0; i < V; i++)
                d[i] = 0;
            continue;
        }
        REAL mx = OP(row_max)(l, V);
        double sum = 0.0;
#pragma omp simd reduction(+ : sum)
        for (int i = 0; i < V; i++) {
            d[i] = VEXP((l[i] - mx) * inv_temp);
            sum += d[i];
        }
        REAL k = (REAL)(-coef[n] * inv_temp / sum);
#pragma omp simd
        for (int i = 0; i < V; i++)
            d[i] *= k;
        d[targets[n]] += coef[n] * inv_temp;
    }
}

#undef OP
#undef OPNAME
#undef OPNAME_
