#include "infer/sampler.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/error.h"
#include "model/ops.h"

// The loops over the vocabulary (V = 151936, every token of every sequence) are written to
// vectorise at -O2: chunks of 8 or 16 with a fixed inner trip count (GCC's -O2 cost model rejects loops
// that need a scalar epilogue), and float compares done on bit patterns (under the default
// -ftrapping-math a float compare blocks if-conversion).

// exp(x) for x <= 0 (including -inf): Cephes' expf polynomial (max error ~1.5 ulp), flushed to 0
// below -86 so that no intermediate is subnormal. Branch-free, its clamps on bit patterns, so the
// vocabulary loops vectorise (ops_expf's float compares would not under -ftrapping-math).
static inline float exp_nonpos(float x) {
    uint32_t xb = f32_bits(x);
    uint32_t keep = -(uint32_t)((xb & 0x7fffffffu) <= 0x42ac0000u); // |x| <= 86
    float xc = f32_from_bits((xb & keep) | (0xc2ac0000u & ~keep));            // else -86
    float t = xc * 1.44269504088896341f + 12582912.0f;              // round(x log2 e) in t's low bits
    float n = t - 12582912.0f;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float y = ops_exp_reduced(r);
    float scale = f32_from_bits((f32_bits(t) - 0x4b400000u + 127u) << 23); // 2^n
    return f32_from_bits(f32_bits(y * scale) & keep);
}

// exp(z) when z >= thr, else 0, counting the kept ones in *kept; tb: |thr|'s bits, thr <= 0 or -inf. z and thr
// are <= 0 (or -inf), so z >= thr exactly when |z| <= |thr| as bit patterns.
static inline float weight_kept(float z, uint32_t tb, int *kept) {
    uint32_t keep = -(uint32_t)((f32_bits(z) & 0x7fffffffu) <= tb);
    *kept += (int)(keep & 1u);
    return f32_from_bits(f32_bits(exp_nonpos(z)) & keep);
}

// w = exp(z) where z = (l - m) / T >= thr, else 0   w, l (V); thr <= 0 or -inf (keep all).
// Returns how many were kept. Chunks of 16: 512-bit vectors where the CPU has them (twice the speed of
// 8, the same values lane by lane). At T = 1 the division, a fifth of the loop's time, is left out (x / 1
// is x).
static int weights_compute(float *restrict w, const float *restrict l, int V, float m, float T, float thr) {
    uint32_t tb = f32_bits(thr) & 0x7fffffffu;
    int kept16[16] = {0};
    int i = 0;
    if (T == 1.0f) {
        for (; i + 16 <= V; i += 16)
            for (int j = 0; j < 16; j++)
                w[i + j] = weight_kept(l[i + j] - m, tb, &kept16[j]);
    } else {
        for (; i + 16 <= V; i += 16)
            for (int j = 0; j < 16; j++)
                w[i + j] = weight_kept((l[i + j] - m) / T, tb, &kept16[j]);
    }
    for (; i < V; i++)
        w[i] = weight_kept((l[i] - m) / T, tb, &kept16[0]);
    int kept = 0;
    for (int j = 0; j < 16; j++)
        kept += kept16[j];
    return kept;
}

// Blocks fix the summation order, so the draw below re-adds exactly the partial sums that made
// the total and a draw below the total always lands in a block.
#define SAMPLER_BLOCK 64

static double block_sum(const float *w, int n) {
    double acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += w[i + j];
    for (; i < n; i++)
        acc[0] += w[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// The sum of w (V) block by block; each block's sum to bsum (V / SAMPLER_BLOCK rounded up) when given.
static double weights_sum(const float *w, int V, double *bsum) {
    double s = 0.0;
    for (int b = 0; b < V; b += SAMPLER_BLOCK) {
        double bs = block_sum(w + b, V - b < SAMPLER_BLOCK ? V - b : SAMPLER_BLOCK);
        if (bsum)
            bsum[b / SAMPLER_BLOCK] = bs;
        s += bs;
    }
    return s;
}

// The token where the running sum of w (V), in id order, first exceeds u, 0 <= u < weights_sum; bsum: the
// block sums weights_sum left.
static int weights_draw(const float *w, int V, const double *bsum, double u) {
    double cum = 0.0;
    int last = -1;
    for (int b = 0; b < V; b += SAMPLER_BLOCK) {
        int n = V - b < SAMPLER_BLOCK ? V - b : SAMPLER_BLOCK;
        double bs = bsum[b / SAMPLER_BLOCK];
        if (bs > 0.0 && u < cum + bs) {
            double c = cum;
            for (int i = b; i < b + n; i++) {
                if (w[i] > 0.0f) {
                    last = i; // the block's last positive one if rounding leaves u past the scan
                    c += w[i];
                    if (u < c)
                        return i;
                }
            }
            return last;
        }
        cum += bs;
        if (bs > 0.0)
            for (int i = b + n - 1; i >= b; i--)
                if (w[i] > 0.0f) {
                    last = i;
                    break;
                }
    }
    return last;
}

SamplerParams sampler_params_default(void) {
    SamplerParams p = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f};
    return p;
}

int sampler_params_validate(const SamplerParams *p) {
    if (!p)
        return er_error(ER_EINVAL, "sampler: params are NULL");
    // The negated comparisons also reject NaN.
    if (!(p->temperature >= 0.0f) || isinf(p->temperature))
        return er_error(ER_EINVAL, "sampler: temperature = %g, expected a finite value >= 0 (0 = greedy)",
                        (double)p->temperature);
    if (p->top_k < 0)
        return er_error(ER_EINVAL, "sampler: top_k = %d, expected >= 0 (0 = off)", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return er_error(ER_EINVAL, "sampler: top_p = %g, expected a value in (0, 1] (1 = off)", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p < 1.0f))
        return er_error(ER_EINVAL, "sampler: min_p = %g, expected a value in [0, 1) (0 = off)", (double)p->min_p);
    return ER_OK;
}

int sampler_init(Sampler *s, int V) {
    memset(s, 0, sizeof *s);
    if (V <= 0)
        return er_error(ER_EINVAL, "sampler: vocabulary size %d, expected > 0", V);
    s->w = er_calloc((size_t)V, sizeof(float));
    s->cand = er_calloc((size_t)V, sizeof(SamplerCand));
    s->heap = er_calloc((size_t)V, sizeof(float));
    s->bsum = er_calloc((size_t)V / SAMPLER_BLOCK + 1, sizeof(double));
    if (!s->w || !s->cand || !s->heap || !s->bsum) {
        sampler_free(s);
        return ER_ENOMEM;
    }
    s->V = V;
    return ER_OK;
}

void sampler_free(Sampler *s) {
    if (!s)
        return;
    er_free(s->w);
    er_free(s->cand);
    er_free(s->heap);
    er_free(s->bsum);
    memset(s, 0, sizeof *s);
}

// Max and argmax (lowest id on ties) of logits (V); ER_EINVAL for NaN, +inf, or no finite value.
static int logits_scan(const float *l, int V, float *max, int *argmax) {
    // One branch-free pass, 16 at a time: the max through an integer key that orders like the floats, and
    // a flag for NaN / +inf. The offender's id is looked up only on failure.
    uint32_t bad16[16] = {0};
    int32_t kmax16[16];
    for (int j = 0; j < 16; j++)
        kmax16[j] = INT32_MIN;
    int i = 0;
    for (; i + 16 <= V; i += 16) {
        for (int j = 0; j < 16; j++) {
            uint32_t b = f32_bits(l[i + j]);
            bad16[j] |= ((b & 0x7fffffffu) > 0x7f800000u) | (b == 0x7f800000u);
            int32_t key = (int32_t)(b ^ ((uint32_t)((int32_t)b >> 31) & 0x7fffffffu));
            kmax16[j] = key > kmax16[j] ? key : kmax16[j];
        }
    }
    for (; i < V; i++) {
        uint32_t b = f32_bits(l[i]);
        bad16[0] |= ((b & 0x7fffffffu) > 0x7f800000u) | (b == 0x7f800000u);
        int32_t key = (int32_t)(b ^ ((uint32_t)((int32_t)b >> 31) & 0x7fffffffu));
        kmax16[0] = key > kmax16[0] ? key : kmax16[0];
    }
    uint32_t bad = 0;
    int32_t kmax = INT32_MIN;
    for (int j = 0; j < 16; j++) {
        bad |= bad16[j];
        kmax = kmax16[j] > kmax ? kmax16[j] : kmax;
    }
    if (bad) {
        for (i = 0; i < V; i++) {
            if (isnan(l[i]))
                return er_error(ER_EINVAL, "the logits hold NaN (at vocabulary id %d)", i);
            if (l[i] == INFINITY)
                return er_error(ER_EINVAL, "the logits hold +inf (at vocabulary id %d)", i);
        }
    }
    uint32_t kb = (uint32_t)kmax;
    float m = f32_from_bits(kb ^ ((uint32_t)((int32_t)kb >> 31) & 0x7fffffffu));
    if (m == -INFINITY)
        return er_error(ER_EINVAL, "sampler: all %d logits are -inf", V);
    int a = 0;
    while (l[a] != m)
        a++;
    *max = m;
    *argmax = a;
    return ER_OK;
}

static void heap_sift_down(float *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && h[l] < h[m])
            m = l;
        if (r < n && h[r] < h[m])
            m = r;
        if (m == i)
            return;
        float t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

// Top-k threshold: the k-th largest z = (l - m) / T, 0 < k < V. z is a nondecreasing function of
// l, so it is z of the k-th largest logit, and the heap compares raw logits. A min-heap of the k
// largest: O(V log k) worst case, no sort of V.
static float topk_threshold(const float *l, int V, float m, float T, int k, float *heap) {
    for (int i = 0; i < k; i++)
        heap[i] = l[i];
    for (int i = k / 2 - 1; i >= 0; i--)
        heap_sift_down(heap, k, i);
    for (int i = k; i < V; i++) {
        if (l[i] > heap[0]) {
            heap[0] = l[i];
            heap_sift_down(heap, k, 0);
        }
    }
    return (heap[0] - m) / T;
}

// Rank order of the nucleus: more probable first, equal ones by lower id.
static inline int cand_before(SamplerCand a, SamplerCand b) {
    return a.w > b.w || (a.w == b.w && a.id < b.id);
}

static int cand_cmp(const void *a, const void *b) {
    SamplerCand x = *(const SamplerCand *)a, y = *(const SamplerCand *)b;
    return cand_before(x, y) ? -1 : cand_before(y, x) ? 1 : 0;
}

static inline void cand_swap(SamplerCand *c, int i, int j) {
    SamplerCand t = c[i];
    c[i] = c[j];
    c[j] = t;
}

// Reorders c (n) so that c[0..keep) is the shortest rank-order prefix whose mass reaches target,
// and returns keep. Quickselect on the mass instead of a sort: each round partitions the open
// window around a pivot and keeps the side holding the boundary. Only the last small window is
// sorted (also after too many rounds, which bounds the worst case at a sort).
static int nucleus_select(SamplerCand *c, int n, double target) {
    int lo = 0, hi = n; // c[0..lo) inside, c[hi..n) outside
    double acc = 0.0;   // mass of c[0..lo), < target
    for (int round = 0; hi - lo > 32 && round < 64; round++) {
        int mid = lo + (hi - lo) / 2;
        if (cand_before(c[mid], c[lo]))
            cand_swap(c, mid, lo);
        if (cand_before(c[hi - 1], c[lo]))
            cand_swap(c, hi - 1, lo);
        if (cand_before(c[hi - 1], c[mid]))
            cand_swap(c, hi - 1, mid);
        cand_swap(c, mid, hi - 1); // the median of three as the pivot, at hi - 1
        SamplerCand pv = c[hi - 1];
        int st = lo;
        double before = 0.0;
        for (int i = lo; i < hi - 1; i++) {
            if (cand_before(c[i], pv)) {
                cand_swap(c, i, st);
                before += c[st].w;
                st++;
            }
        }
        cand_swap(c, st, hi - 1);
        if (acc + before >= target) {
            hi = st;
        } else if (acc + before + pv.w >= target) {
            return st + 1;
        } else {
            acc += before + pv.w;
            lo = st + 1;
        }
    }
    qsort(c + lo, (size_t)(hi - lo), sizeof(SamplerCand), cand_cmp);
    for (int i = lo; i < hi; i++) {
        acc += c[i].w;
        if (acc >= target)
            return i + 1;
    }
    return hi; // rounding kept the boundary from being reached: keep the whole window
}

// Top-p over w (V), of which at most `alive` are nonzero; argmax has w = 1.
static void topp_filter(Sampler *s, float top_p, int alive, int argmax) {
    float *w = s->w;
    int V = s->V;
    if (alive <= 1)
        return;
    double S = weights_sum(w, V, NULL);
    // A token t below the top has at most alive-1 tokens at or below it, each with prob <= p_t,
    // so if p_t < (1 - top_p) / (alive - 1) that ascending prefix sums to less than 1 - top_p and
    // HF removes t (llama2.c's bound). The cut is loosened slightly so rounding can only keep
    // extra candidates for the exact selection to decide on.
    float cutoff = (float)((1.0 - (double)top_p) / (double)(alive - 1) * S * (1.0 - 1e-6));
    uint32_t cb = f32_bits(cutoff); // w >= 0: bit order is value order
    SamplerCand *c = s->cand;
    int n = 0, i = 0;
    for (; i + 8 <= V; i += 8) {
        uint32_t any = 0; // most chunks hold no candidate: test all 8 at once
        for (int j = 0; j < 8; j++)
            any |= f32_bits(w[i + j]) >= cb;
        if (!any)
            continue;
        for (int j = i; j < i + 8; j++)
            if (f32_bits(w[j]) >= cb)
                c[n++] = (SamplerCand){w[j], j};
    }
    for (; i < V; i++)
        if (f32_bits(w[i]) >= cb)
            c[n++] = (SamplerCand){w[i], i};
    if (f32_bits(w[argmax]) < cb) // the top is always kept, even if the cut (for tiny top_p) exceeds it
        c[n++] = (SamplerCand){w[argmax], argmax};
    int keep = nucleus_select(c, n, (double)top_p * S);
    memset(w, 0, sizeof(float) * (size_t)V);
    for (int i = 0; i < keep; i++)
        w[c[i].id] = c[i].w;
}

// Validates, then leaves in s->w the unnormalised distribution p describes (when T > 0), in HF's
// order, and in *m, *argmax the max logit and its lowest id.
// *plain (when not NULL): 1 when w is exp(l - m) for every token (temperature 1, no filter applied).
static int sampler_filter(Sampler *s, const SamplerParams *p, const float *logits, float *m, int *argmax, int *plain) {
    ER_TRY(sampler_params_validate(p));
    int V = s->V, unfiltered = 1;
    ER_TRY(logits_scan(logits, V, m, argmax));
    if (plain)
        *plain = 0;
    if (p->temperature == 0.0f)
        return ER_OK;
    // Temperature. Scaling (l - m) rather than l keeps z <= 0 with z = 0 at the argmax, so a tiny
    // T cannot overflow to +inf; the order and the softmax are those of l / T.
    float T = p->temperature, *w = s->w;
    float thr = -INFINITY;
    if (p->top_k > 0 && p->top_k < V) {
        thr = topk_threshold(logits, V, *m, T, p->top_k, s->heap);
        unfiltered = 0;
    }
    int alive = weights_compute(w, logits, V, *m, T, thr);
    if (p->top_p < 1.0f) {
        topp_filter(s, p->top_p, alive, *argmax);
        unfiltered = 0;
    }
    // Min-p: w is prob / max prob whatever the normalisation, and the max survives every filter
    // above, so this is HF's prob >= min_p * max_prob on the filtered distribution.
    if (p->min_p > 0.0f) {
        unfiltered = 0;
        uint32_t mb = f32_bits(p->min_p); // w >= 0: bit order is value order
        int i = 0;
        for (; i + 8 <= V; i += 8)
            for (int j = 0; j < 8; j++)
                w[i + j] = f32_from_bits(f32_bits(w[i + j]) & -(uint32_t)(f32_bits(w[i + j]) >= mb));
        for (; i < V; i++)
            w[i] = f32_from_bits(f32_bits(w[i]) & -(uint32_t)(f32_bits(w[i]) >= mb));
    }
    if (plain)
        *plain = unfiltered && T == 1.0f;
    return ER_OK;
}

int sampler_sample(Sampler *s, const SamplerParams *p, const float *logits, ErRng *rng, int *token,
                   float *logprob) {
    if (!s || !s->w || !logits || !rng || !token)
        return er_error(ER_EINVAL, "sampler_sample: NULL argument or uninitialised sampler");
    float m = 0.0f;
    int argmax = 0, plain;
    ER_TRY(sampler_filter(s, p, logits, &m, &argmax, &plain));
    int V = s->V, tok = argmax;
    double W = 0.0;
    if (p->temperature > 0.0f) {
        W = weights_sum(s->w, V, s->bsum); // >= 1: the argmax has w = 1
        tok = weights_draw(s->w, V, s->bsum, rng_uniform_f64(rng) * W);
        if (tok < 0)
            tok = argmax; // unreachable: the argmax has w = 1 and survives every filter
    }
    if (logprob) {
        // Where w already is exp(l - m) for every token, W is its sum: the same values and the same sum as
        // recomputed here (half the sampling time of a step otherwise).
        if (!plain) {
            weights_compute(s->w, logits, V, m, 1.0f, -INFINITY);
            W = weights_sum(s->w, V, NULL);
        }
        double lse = log(W);
        *logprob = (float)((double)logits[tok] - (double)m - lse);
    }
    *token = tok;
    return ER_OK;
}

int sampler_top_logprobs(Sampler *s, const float *logits, int k, int *ids, float *logprobs) {
    if (!s || !s->w || !logits || !ids || !logprobs || k < 1 || k > s->V)
        return er_error(ER_EINVAL, "sampler_top_logprobs: NULL argument, uninitialised sampler or k outside 1..V");
    int V = s->V, argmax, n = 0;
    float m;
    ER_TRY(logits_scan(logits, V, &m, &argmax));
    // log W as sampler_sample computes it, so a token's log-prob here is bitwise the one it reports.
    weights_compute(s->w, logits, V, m, 1.0f, -INFINITY);
    double lse = log(weights_sum(s->w, V, NULL));
    // The k largest logits by insertion into the sorted best so far: past the first k, nearly every logit
    // fails the first compare. A tie with the k-th does not displace it (the lower id stays).
    for (int i = 0; i < V; i++) {
        float l = logits[i];
        if (n == k && !(l > logits[ids[k - 1]]))
            continue;
        int j = n < k ? n++ : k - 1;
        for (; j > 0 && l > logits[ids[j - 1]]; j--)
            ids[j] = ids[j - 1];
        ids[j] = i;
    }
    for (int j = 0; j < k; j++)
        logprobs[j] = (float)((double)logits[ids[j]] - (double)m - lse);
    return ER_OK;
}

int sampler_dist(Sampler *s, const SamplerParams *p, const float *logits, float *probs) {
    if (!s || !s->w || !logits || !probs)
        return er_error(ER_EINVAL, "sampler_dist: NULL argument or uninitialised sampler");
    float m = 0.0f;
    int argmax = 0;
    ER_TRY(sampler_filter(s, p, logits, &m, &argmax, NULL));
    int V = s->V;
    if (p->temperature == 0.0f) {
        memset(probs, 0, sizeof(float) * (size_t)V);
        probs[argmax] = 1.0f;
        return ER_OK;
    }
    double W = weights_sum(s->w, V, NULL);
    for (int i = 0; i < V; i++)
        probs[i] = (float)(s->w[i] / W);
    return ER_OK;
}
