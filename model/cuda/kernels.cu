// CUDA kernels of the backend: one kernel (or two) per op, each with its launcher. Shapes and the exact
// semantics are the CPU ops' (model/ops_impl.h, lora/lora.c, train/optim.c, model/forward.c); comments
// say where the order of a sum differs. Reductions that feed a loss or a norm run in a fixed order, so
// a run gives the same bits every time (no atomics anywhere).
#include <cuda_bf16.h>
#include <math.h>

#include "model/cuda/kernels.h"
#include "model/op_rules.h"

// Element-wise kernels: grid-stride loops over n elements with at most this many blocks.
#define EW_THREADS 256
#define EW_MAX_BLOCKS 65535
// Row kernels (one block per row: norms, softmaxes).
#define ROW_THREADS 256
// Attention: warps per block, each warp one query (forward, dq) or one key (dk, dv).
#define ATT_WARPS 4
#define ATT_PER_LANE (CUDA_ATTENTION_MAX_HS / 32)
// column_sum: 32 columns x COLSUM_ROWS row lanes per block.
#define COLSUM_ROWS 32

static unsigned ew_blocks(size_t n) {
    size_t b = (n + EW_THREADS - 1) / EW_THREADS;
    return (unsigned)(b < EW_MAX_BLOCKS ? b : EW_MAX_BLOCKS);
}

#define GRID_STRIDE(i, n)                                                                                              \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

// ---- reductions (blockDim.x a multiple of 32, at most 1024; every thread gets the result) ----

static __device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ double warp_sum_double(double v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static __device__ double block_sum_double(double v) {
    __shared__ double part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = warp_sum_double(v);
    __syncthreads(); // a previous call's readers are done with part
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    return warp_sum_double(lane < nwarps ? part[lane] : 0.0);
}

static __device__ float block_max(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    return warp_max(lane < nwarps ? part[lane] : -INFINITY);
}

// ---- embedding, casts, bias ----

// grid N: block n copies row tokens[n] (C).
static __global__ void embed_forward_kernel(float *out, const void *embed, int bf16, const int *tokens, int C) {
    size_t src = (size_t)tokens[blockIdx.x] * C, dst = (size_t)blockIdx.x * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        out[dst + i] =
            bf16 ? __bfloat162float(((const __nv_bfloat16 *)embed)[src + i]) : ((const float *)embed)[src + i];
}

cudaError_t cuda_embed_forward(cudaStream_t s, float *out, const void *embed, int bf16, const int *tokens, int N,
                               int C) {
    if (N > 0)
        embed_forward_kernel<<<N, ROW_THREADS, 0, s>>>(out, embed, bf16, tokens, C);
    return cudaGetLastError();
}

// One thread per column c walks the tokens in order, as the CPU does: repeated tokens add up in the
// same order, without atomics.
static __global__ void embed_backward_kernel(float *dembed, const float *dres, const int *tokens, int N, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    for (int n = 0; n < N; n++)
        dembed[(size_t)tokens[n] * C + c] += dres[(size_t)n * C + c];
}

cudaError_t cuda_embed_backward(cudaStream_t s, float *dembed, const float *dres, const int *tokens, int N, int C) {
    if (N > 0 && C > 0)
        embed_backward_kernel<<<(C + EW_THREADS - 1) / EW_THREADS, EW_THREADS, 0, s>>>(dembed, dres, tokens, N, C);
    return cudaGetLastError();
}

static __global__ void to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n) {
    GRID_STRIDE(i, n) { dst[i] = __float2bfloat16_rn(src[i]); }
}

cudaError_t cuda_to_bf16(cudaStream_t s, uint16_t *dst, const float *src, size_t n) {
    if (n > 0)
        to_bf16_kernel<<<ew_blocks(n), EW_THREADS, 0, s>>>((__nv_bfloat16 *)dst, src, n);
    return cudaGetLastError();
}

static __global__ void bias_forward_kernel(float *out, const float *bias, size_t n, int C) {
    GRID_STRIDE(i, n) { out[i] += bias[i % C]; }
}

cudaError_t cuda_bias_forward(cudaStream_t s, float *out, const float *bias, int N, int C) {
    size_t n = (size_t)N * C;
    if (n > 0)
        bias_forward_kernel<<<ew_blocks(n), EW_THREADS, 0, s>>>(out, bias, n, C);
    return cudaGetLastError();
}

// block (32, COLSUM_ROWS): 32 columns; row lane j sums rows j, j + COLSUM_ROWS, ... in double, and the
// lanes' partial sums are added in lane order (fixed, so the same bits every run).
static __global__ void __launch_bounds__(32 * COLSUM_ROWS)
    column_sum_kernel(float *acc, const float *a, const float *b, const float *row_scale, int N, int C) {
    __shared__ double part[COLSUM_ROWS][32];
    int c = blockIdx.x * 32 + threadIdx.x;
    double sum = 0.0;
    if (c < C)
        for (int n = threadIdx.y; n < N; n += COLSUM_ROWS) {
            size_t i = (size_t)n * C + c;
            double t = a[i];
            if (b)
                t *= b[i];
            if (row_scale)
                t *= row_scale[n];
            sum += t;
        }
    part[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        double total = 0.0;
        for (int j = 0; j < COLSUM_ROWS; j++)
            total += part[j][threadIdx.x];
        acc[c] += (float)total;
    }
}

cudaError_t cuda_column_sum(cudaStream_t s, float *acc, const float *a, const float *b, const float *row_scale, int N,
                            int C) {
    if (C > 0)
        column_sum_kernel<<<(C + 31) / 32, dim3(32, COLSUM_ROWS), 0, s>>>(acc, a, b, row_scale, N, C);
    return cudaGetLastError();
}

// ---- RMSNorm ----

// grid N: block n normalises row n; the sum of squares in double as on the CPU.
static __global__ void rmsnorm_forward_kernel(float *out, float *rstd, const float *x, const float *w, int C,
                                              float eps) {
    const float *xn = x + (size_t)blockIdx.x * C;
    float *o = out + (size_t)blockIdx.x * C;
    double ss = 0.0;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        ss += (double)xn[i] * xn[i];
    ss = block_sum_double(ss);
    float r = (float)(1.0 / sqrt(ss / C + (double)eps));
    if (threadIdx.x == 0)
        rstd[blockIdx.x] = r;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        o[i] = xn[i] * r * w[i];
}

cudaError_t cuda_rmsnorm_forward(cudaStream_t s, float *out, float *rstd, const float *x, const float *w, int N, int C,
                                 float eps) {
    if (N > 0)
        rmsnorm_forward_kernel<<<N, ROW_THREADS, 0, s>>>(out, rstd, x, w, C, eps);
    return cudaGetLastError();
}

// grid N: dx += r * (dy*w) - x * r^3 / C * sum(dy*w*x), the sum in double.
static __global__ void rmsnorm_backward_kernel(float *dx, const float *dout, const float *x, const float *w,
                                               const float *rstd, int C) {
    size_t row = (size_t)blockIdx.x * C;
    const float *xn = x + row, *dy = dout + row;
    float *d = dx + row;
    float r = rstd[blockIdx.x];
    double dot = 0.0;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        dot += (double)dy[i] * w[i] * xn[i];
    dot = block_sum_double(dot);
    float k = (float)(dot * r * r * r / C);
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        d[i] += r * dy[i] * w[i] - xn[i] * k;
}

cudaError_t cuda_rmsnorm_backward(cudaStream_t s, float *dx, const float *dout, const float *x, const float *w,
                                  const float *rstd, int N, int C) {
    if (N > 0)
        rmsnorm_backward_kernel<<<N, ROW_THREADS, 0, s>>>(dx, dout, x, w, rstd, C);
    return cudaGetLastError();
}

// ---- RoPE, SwiGLU, residual, scale ----

// One thread per pair (n, h, i < HS/2): HF's rotate_half pairs i and i + HS/2 of each head.
static __global__ void rope_kernel(float *x, const int *pos, const float *cos_tab, const float *sin_tab, int nh, int HS,
                                   size_t pairs, int inverse) {
    int half = HS / 2;
    GRID_STRIDE(idx, pairs) {
        int i = (int)(idx % half);
        size_t head = idx / half; // n * nh + h
        size_t t = (size_t)pos[head / nh] * half + i;
        float c = cos_tab[t], sn = sin_tab[t];
        float *v = x + head * HS;
        float x1 = v[i], x2 = v[i + half];
        v[i] = inverse ? x1 * c + x2 * sn : x1 * c - x2 * sn;
        v[i + half] = inverse ? x2 * c - x1 * sn : x2 * c + x1 * sn;
    }
}

cudaError_t cuda_rope(cudaStream_t s, float *x, const int *pos, const float *cos_tab, const float *sin_tab, int N,
                      int nh, int HS, int inverse) {
    size_t pairs = (size_t)N * nh * (HS / 2);
    if (pairs > 0)
        rope_kernel<<<ew_blocks(pairs), EW_THREADS, 0, s>>>(x, pos, cos_tab, sin_tab, nh, HS, pairs, inverse);
    return cudaGetLastError();
}

static __global__ void swiglu_forward_kernel(float *out, const float *gate, const float *up, size_t n) {
    GRID_STRIDE(i, n) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

cudaError_t cuda_swiglu_forward(cudaStream_t s, float *out, const float *gate, const float *up, size_t n) {
    if (n > 0)
        swiglu_forward_kernel<<<ew_blocks(n), EW_THREADS, 0, s>>>(out, gate, up, n);
    return cudaGetLastError();
}

static __global__ void swiglu_backward_kernel(float *dgate, float *dup, const float *dout, const float *gate,
                                              const float *up, size_t n) {
    GRID_STRIDE(i, n) {
        float g = gate[i], u = up[i], d = dout[i], sg = 1.0f / (1.0f + expf(-g));
        dup[i] = d * g * sg;
        dgate[i] = d * u * sg * (1.0f + g * (1.0f - sg));
    }
}

cudaError_t cuda_swiglu_backward(cudaStream_t s, float *dgate, float *dup, const float *dout, const float *gate,
                                 const float *up, size_t n) {
    if (n > 0)
        swiglu_backward_kernel<<<ew_blocks(n), EW_THREADS, 0, s>>>(dgate, dup, dout, gate, up, n);
    return cudaGetLastError();
}

static __global__ void residual_forward_kernel(float *out, const float *a, const float *b, size_t n) {
    GRID_STRIDE(i, n) { out[i] = a[i] + b[i]; }
}

cudaError_t cuda_residual_forward(cudaStream_t s, float *out, const float *a, const float *b, size_t n) {
    if (n > 0)
        residual_forward_kernel<<<ew_blocks(n), EW_THREADS, 0, s>>>(out, a, b, n);
    return cudaGetLastError();
}

static __global__ void scale_kernel(float *x, size_t n, float scale) {
    GRID_STRIDE(i, n) { x[i] *= scale; }
}

cudaError_t cuda_scale(cudaStream_t s, float *x, size_t n, float scale) {
    if (n > 0)
        scale_kernel<<<ew_blocks(n), EW_THREADS, 0, s>>>(x, n, scale);
    return cudaGetLastError();
}

// ---- attention (flash-attention style: online softmax, no (T, T) scores) ----
//
// A warp owns one row vector of a head: lane l holds dims l, l + 32, l + 64, l + 96 (those below HS) in
// registers (ATT_PER_LANE of them), and a dot product is the lanes' partial sums added by warp_sum. Keys
// and values are read from global memory (the warps of a block walk the same keys, so they share them
// through L1). Layouts: q, out, dout (B, T, NH, HS); k, v (B, T, NKV, HS); lse, drow (B, NH, T). Query
// head h reads KV head h / (NH / NKV).

// r = the lane's dims of the row p (0 past HS).
static __device__ __forceinline__ void lane_load(float *r, const float *p, int lane, int HS) {
#pragma unroll
    for (int j = 0; j < ATT_PER_LANE; j++)
        r[j] = lane + 32 * j < HS ? p[lane + 32 * j] : 0.0f;
}

static __device__ __forceinline__ void lane_store(float *p, const float *r, int lane, int HS) {
#pragma unroll
    for (int j = 0; j < ATT_PER_LANE; j++)
        if (lane + 32 * j < HS)
            p[lane + 32 * j] = r[j];
}

// Σ_i r_i p_i over the whole row (every lane gets it).
static __device__ __forceinline__ float warp_dot(const float *r, const float *p, int lane, int HS) {
    float d = 0.0f;
#pragma unroll
    for (int j = 0; j < ATT_PER_LANE; j++)
        if (lane + 32 * j < HS)
            d += r[j] * p[lane + 32 * j];
    return warp_sum(d);
}

// r += a * p.
static __device__ __forceinline__ void lane_axpy(float *r, float a, const float *p, int lane, int HS) {
#pragma unroll
    for (int j = 0; j < ATT_PER_LANE; j++)
        if (lane + 32 * j < HS)
            r[j] += a * p[lane + 32 * j];
}

// One key of the online softmax: score sc joins the running max m and sum l of exp(score - m), the lane's
// output o is rescaled to the new max; returns the key's weight exp(sc - m), which the caller adds its value by.
static __device__ __forceinline__ float online_softmax_step(float sc, float *m, float *l, float *o) {
    float mnew = fmaxf(*m, sc);
    float corr = expf(*m - mnew), p = expf(sc - mnew); // corr = 0 at the first key (m = -inf)
    *l = *l * corr + p;
#pragma unroll
    for (int j = 0; j < ATT_PER_LANE; j++)
        o[j] *= corr;
    *m = mnew;
    return p;
}

// grid (ceil(T / ATT_WARPS), NH, B): warp -> query t of head h, row b. Keys s = 0..t in order, with a
// running max m and sum l of exp(score - m); out = Σ p_s v_s / l, lse = m + log l (kept for the backward).
static __global__ void attention_forward_kernel(float *out, float *lse, const float *q, const float *k, const float *v,
                                                int T, int NH, int NKV, int HS, float scale) {
    int lane = threadIdx.x % 32, t = blockIdx.x * ATT_WARPS + threadIdx.x / 32, h = blockIdx.y, b = blockIdx.z;
    if (t >= T) // the whole warp leaves together
        return;
    size_t row = ((size_t)b * T + t) * NH + h;
    const float *kb = k + ((size_t)b * T * NKV + h / (NH / NKV)) * HS; // key s at kb + s * NKV * HS
    const float *vb = v + ((size_t)b * T * NKV + h / (NH / NKV)) * HS;
    float qr[ATT_PER_LANE], o[ATT_PER_LANE] = {0.0f};
    lane_load(qr, q + row * HS, lane, HS);
    float m = -INFINITY, l = 0.0f;
    for (int s = 0; s <= t; s++) {
        float sc = warp_dot(qr, kb + (size_t)s * NKV * HS, lane, HS) * scale;
        float p = online_softmax_step(sc, &m, &l, o);
        lane_axpy(o, p, vb + (size_t)s * NKV * HS, lane, HS);
    }
#pragma unroll
    for (int j = 0; j < ATT_PER_LANE; j++)
        o[j] /= l;
    lane_store(out + row * HS, o, lane, HS);
    if (lane == 0)
        lse[((size_t)b * NH + h) * T + t] = m + logf(l);
}

cudaError_t cuda_attention_forward(cudaStream_t s, float *out, float *lse, const float *q, const float *k,
                                   const float *v, int B, int T, int NH, int NKV, int HS) {
    if (B > 0 && T > 0) {
        dim3 grid((T + ATT_WARPS - 1) / ATT_WARPS, NH, B);
        attention_forward_kernel<<<grid, 32 * ATT_WARPS, 0, s>>>(out, lse, q, k, v, T, NH, NKV, HS,
                                                                 (float)(1.0 / sqrt((double)HS)));
    }
    return cudaGetLastError();
}

// The backward recomputes p_ts = exp(score_ts - lse_t) and, with D_t = Σ_i dO_ti O_ti = Σ_s p_ts dp_ts,
//   dp_ts = dO_t · v_s,  ds_ts = p_ts (dp_ts - D_t) * scale,
//   dq_t = Σ_{s<=t} ds_ts k_s,  dk_s = Σ_{t>=s} ds_ts q_t,  dv_s = Σ_{t>=s} p_ts dO_t.
// Two kernels, neither with atomics: one warp per query for dq (which also writes D_t), then one warp
// per key for dk, dv, summing over the queries and over the NH / NKV query heads of its KV head.

// grid (ceil(T / ATT_WARPS), NH, B): warp -> query t of head h, row b.
static __global__ void attention_backward_dq_kernel(float *dq, float *drow, const float *dout, const float *out,
                                                    const float *lse, const float *q, const float *k, const float *v,
                                                    int T, int NH, int NKV, int HS, float scale) {
    int lane = threadIdx.x % 32, t = blockIdx.x * ATT_WARPS + threadIdx.x / 32, h = blockIdx.y, b = blockIdx.z;
    if (t >= T)
        return;
    size_t row = ((size_t)b * T + t) * NH + h, hrow = ((size_t)b * NH + h) * T + t;
    const float *kb = k + ((size_t)b * T * NKV + h / (NH / NKV)) * HS;
    const float *vb = v + ((size_t)b * T * NKV + h / (NH / NKV)) * HS;
    float qr[ATT_PER_LANE], dor[ATT_PER_LANE], acc[ATT_PER_LANE] = {0.0f};
    lane_load(qr, q + row * HS, lane, HS);
    lane_load(dor, dout + row * HS, lane, HS);
    float D = warp_dot(dor, out + row * HS, lane, HS), lt = lse[hrow];
    if (lane == 0)
        drow[hrow] = D;
    for (int s = 0; s <= t; s++) {
        const float *ks = kb + (size_t)s * NKV * HS, *vs = vb + (size_t)s * NKV * HS;
        float p = expf(warp_dot(qr, ks, lane, HS) * scale - lt);
        float ds = p * (warp_dot(dor, vs, lane, HS) - D) * scale;
        lane_axpy(acc, ds, ks, lane, HS);
    }
    lane_store(dq + row * HS, acc, lane, HS);
}

// grid (ceil(T / ATT_WARPS), NKV, B): warp -> key s of KV head kh, row b; reads drow from the dq kernel.
static __global__ void attention_backward_dkv_kernel(float *dk, float *dv, const float *dout, const float *lse,
                                                     const float *drow, const float *q, const float *k, const float *v,
                                                     int T, int NH, int NKV, int HS, float scale) {
    int lane = threadIdx.x % 32, s = blockIdx.x * ATT_WARPS + threadIdx.x / 32, kh = blockIdx.y, b = blockIdx.z;
    if (s >= T)
        return;
    int G = NH / NKV;
    size_t krow = ((size_t)b * T + s) * NKV + kh;
    float kr[ATT_PER_LANE], vr[ATT_PER_LANE], dka[ATT_PER_LANE] = {0.0f}, dva[ATT_PER_LANE] = {0.0f};
    lane_load(kr, k + krow * HS, lane, HS);
    lane_load(vr, v + krow * HS, lane, HS);
    for (int h = kh * G; h < (kh + 1) * G; h++) {
        const float *lh = lse + ((size_t)b * NH + h) * T, *dh = drow + ((size_t)b * NH + h) * T;
        for (int t = s; t < T; t++) {
            size_t row = ((size_t)b * T + t) * NH + h;
            const float *qt = q + row * HS, *dot = dout + row * HS;
            float p = expf(warp_dot(kr, qt, lane, HS) * scale - lh[t]);
            float ds = p * (warp_dot(vr, dot, lane, HS) - dh[t]) * scale;
            lane_axpy(dka, ds, qt, lane, HS);
            lane_axpy(dva, p, dot, lane, HS);
        }
    }
    lane_store(dk + krow * HS, dka, lane, HS);
    lane_store(dv + krow * HS, dva, lane, HS);
}

cudaError_t cuda_attention_backward(cudaStream_t s, float *dq, float *dk, float *dv, const float *dout,
                                    const float *out, const float *lse, const float *q, const float *k, const float *v,
                                    int B, int T, int NH, int NKV, int HS, float *drow) {
    if (B <= 0 || T <= 0)
        return cudaGetLastError();
    float scale = (float)(1.0 / sqrt((double)HS));
    dim3 gq((T + ATT_WARPS - 1) / ATT_WARPS, NH, B), gkv((T + ATT_WARPS - 1) / ATT_WARPS, NKV, B);
    attention_backward_dq_kernel<<<gq, 32 * ATT_WARPS, 0, s>>>(dq, drow, dout, out, lse, q, k, v, T, NH, NKV, HS,
                                                               scale);
    // (a failed launch stays the last error until read, so one check after both covers both)
    attention_backward_dkv_kernel<<<gkv, 32 * ATT_WARPS, 0, s>>>(dk, dv, dout, lse, drow, q, k, v, T, NH, NKV, HS,
                                                                 scale);
    return cudaGetLastError();
}

// ---- the KV cache (model/kvcache.h) ----
//
// Entries k, v (L, n_blocks * block rows, NKV, HS), fp32 or int8 with scales ks, vs (L, n_blocks * block
// rows, NKV); layer l's rows start at row0 = l * n_blocks * block, and a cache row is a block id * block +
// the position in its block. A sequence's blocks are a row of the block table (B, max_blocks).

// warp_dot and lane_axpy with an int8 row p (its scale applied by the caller).
static __device__ __forceinline__ float warp_dot_i8(const float *r, const int8_t *p, int lane, int HS) {
    float d = 0.0f;
#pragma unroll
    for (int j = 0; j < ATT_PER_LANE; j++)
        if (lane + 32 * j < HS)
            d += r[j] * (float)p[lane + 32 * j];
    return warp_sum(d);
}

static __device__ __forceinline__ void lane_axpy_i8(float *r, float a, const int8_t *p, int lane, int HS) {
#pragma unroll
    for (int j = 0; j < ATT_PER_LANE; j++)
        if (lane + 32 * j < HS)
            r[j] += a * (float)p[lane + 32 * j];
}

// One KV head's HS values x as int8 (kvcache.c's quantize_row): scale = max|x| / 127, q = x / scale rounded
// to nearest even (0 for a zero row). A warp, lanes striding over the values.
static __device__ void kv_quantize_row(int8_t *q, float *scale, const float *x, int HS, int lane) {
    float mx = 0.0f;
    for (int i = lane; i < HS; i += 32)
        mx = fmaxf(mx, fabsf(x[i]));
    mx = warp_max(mx);
    float sc = mx / 127.0f, inv = sc > 0 ? 1.0f / sc : 0.0f;
    for (int i = lane; i < HS; i += 32)
        q[i] = (int8_t)__float2int_rn(x[i] * inv);
    if (lane == 0)
        *scale = sc;
}

// grid (N, NKV), one warp: KV head h of position n (k, v (N, NKV, HS)) into cache row dst[n] (< 0: skipped).
static __global__ void kv_store_kernel(void *kc, void *vc, float *ks, float *vs, int i8, const float *k,
                                       const float *v, const int *dst, size_t row0, int NKV, int HS) {
    int n = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
    if (dst[n] < 0)
        return;
    size_t row = row0 + (size_t)dst[n], e = (row * NKV + h) * HS, x = ((size_t)n * NKV + h) * HS;
    if (i8) {
        kv_quantize_row((int8_t *)kc + e, ks + row * NKV + h, k + x, HS, lane);
        kv_quantize_row((int8_t *)vc + e, vs + row * NKV + h, v + x, HS, lane);
        return;
    }
    for (int i = lane; i < HS; i += 32) {
        ((float *)kc)[e + i] = k[x + i];
        ((float *)vc)[e + i] = v[x + i];
    }
}

cudaError_t cuda_kv_store(cudaStream_t s, void *kc, void *vc, float *ks, float *vs, int i8, const float *k,
                          const float *v, const int *dst, int N, size_t row0, int NKV, int HS) {
    if (N > 0)
        kv_store_kernel<<<dim3(N, NKV), 32, 0, s>>>(kc, vc, ks, vs, i8, k, v, dst, row0, NKV, HS);
    return cudaGetLastError();
}

// grid (ceil(T / ATT_WARPS), NH, B): warp -> query t < len[b] of head h, row b, at position pos0[b] + t; the
// cached positions 0..pos0[b] + t of row b's blocks in order, with the online softmax (an int8 entry is its
// value times its row's scale, applied to the score and to the value's weight).
static __global__ void kv_attention_kernel(float *out, const float *q, const void *kc, const void *vc,
                                           const float *ks, const float *vs, int i8, size_t row0,
                                           const int *blocks, int max_blocks, int block, const int *pos0,
                                           const int *len, int T, int NH, int NKV, int HS, float scale) {
    int lane = threadIdx.x % 32, t = blockIdx.x * ATT_WARPS + threadIdx.x / 32, h = blockIdx.y, b = blockIdx.z;
    if (t >= len[b]) // the whole warp leaves together
        return;
    int kh = h / (NH / NKV), last = pos0[b] + t;
    const int *table = blocks + (size_t)b * max_blocks;
    size_t qrow = ((size_t)b * T + t) * NH + h;
    float qr[ATT_PER_LANE], o[ATT_PER_LANE] = {0.0f};
    lane_load(qr, q + qrow * HS, lane, HS);
    float m = -INFINITY, l = 0.0f;
    for (int p = 0; p <= last; p++) {
        size_t row = row0 + (size_t)table[p / block] * block + p % block, e = (row * NKV + kh) * HS;
        float sc = i8 ? warp_dot_i8(qr, (const int8_t *)kc + e, lane, HS) * ks[row * NKV + kh] * scale
                      : warp_dot(qr, (const float *)kc + e, lane, HS) * scale;
        float w = online_softmax_step(sc, &m, &l, o);
        if (i8)
            lane_axpy_i8(o, w * vs[row * NKV + kh], (const int8_t *)vc + e, lane, HS);
        else
            lane_axpy(o, w, (const float *)vc + e, lane, HS);
    }
#pragma unroll
    for (int j = 0; j < ATT_PER_LANE; j++)
        o[j] /= l;
    lane_store(out + qrow * HS, o, lane, HS);
}

cudaError_t cuda_kv_attention_forward(cudaStream_t s, float *out, const float *q, const void *kc, const void *vc,
                                      const float *ks, const float *vs, int i8, size_t row0, const int *blocks,
                                      int max_blocks, int block, const int *pos0, const int *len, int B, int T,
                                      int NH, int NKV, int HS) {
    if (B > 0 && T > 0) {
        dim3 grid((T + ATT_WARPS - 1) / ATT_WARPS, NH, B);
        kv_attention_kernel<<<grid, 32 * ATT_WARPS, 0, s>>>(out, q, kc, vc, ks, vs, i8, row0, blocks, max_blocks,
                                                            block, pos0, len, T, NH, NKV, HS,
                                                            (float)(1.0 / sqrt((double)HS)));
    }
    return cudaGetLastError();
}

// ---- attention on tensor cores: the kernels around backend.c's cuBLAS products ----
//
// backend.c runs one batch row b at a time through head-major scratch: Qh, dOh (NH, T, HS) and Kh, Vh
// (NKV, T, HS) in bf16, so the G = NH / NKV query heads of KV head kh are one (G * T, HS) matrix; the
// scores S (NH, T, T) fp32 and the probabilities P (NH, T, T) bf16, row (h, t) at (h * T + t) * T.

// grid-stride over dst (nh, T, HS) bf16 = src (T, nh, HS) fp32 rounded (nearest even).
static __global__ void attention_to_heads_kernel(__nv_bfloat16 *dst, const float *src, int T, int nh, int HS) {
    size_t n = (size_t)nh * T * HS;
    GRID_STRIDE(i, n) {
        size_t d = i % HS, t = i / HS % T, h = i / ((size_t)HS * T);
        dst[i] = __float2bfloat16_rn(src[(t * nh + h) * HS + d]);
    }
}

cudaError_t cuda_attention_to_heads(cudaStream_t s, uint16_t *dst, const float *src, int T, int nh, int HS) {
    size_t n = (size_t)nh * T * HS;
    if (n > 0)
        attention_to_heads_kernel<<<ew_blocks(n), EW_THREADS, 0, s>>>((__nv_bfloat16 *)dst, src, T, nh, HS);
    return cudaGetLastError();
}

// grid-stride over src (nh, T, HS): dst (T, nh, HS) overwritten with it.
static __global__ void attention_from_heads_kernel(float *dst, const float *src, int T, int nh, int HS) {
    size_t n = (size_t)nh * T * HS;
    GRID_STRIDE(i, n) {
        size_t d = i % HS, t = i / HS % T, h = i / ((size_t)HS * T);
        dst[(t * nh + h) * HS + d] = src[i];
    }
}

cudaError_t cuda_attention_from_heads(cudaStream_t s, float *dst, const float *src, int T, int nh, int HS) {
    size_t n = (size_t)nh * T * HS;
    if (n > 0)
        attention_from_heads_kernel<<<ew_blocks(n), EW_THREADS, 0, s>>>(dst, src, T, nh, HS);
    return cudaGetLastError();
}

// grid NH * T: block row = h * T + t. Forward (lse_in NULL): lse_out[row] = m + log Σ_{s<=t} exp(x_s - m),
// x_s = S[row, s] * scale, m = max x_s (the sum in double); then P[row, s] = exp(x_s - lse).
// Backward (lse_in = the forward's lse): P recomputed from S with it. P is exactly 0 past the diagonal.
static __global__ void attention_softmax_kernel(__nv_bfloat16 *P, float *lse_out, const float *S,
                                                const float *lse_in, int T, float scale) {
    size_t row = blockIdx.x;
    int t = (int)(row % T);
    const float *x = S + row * T;
    __nv_bfloat16 *p = P + row * T;
    float l;
    if (lse_in) {
        l = lse_in[row];
    } else {
        float mx = -INFINITY;
        for (int s = threadIdx.x; s <= t; s += blockDim.x)
            mx = fmaxf(mx, x[s] * scale);
        mx = block_max(mx);
        double sum = 0.0;
        for (int s = threadIdx.x; s <= t; s += blockDim.x)
            sum += expf(x[s] * scale - mx);
        sum = block_sum_double(sum);
        l = mx + (float)log(sum);
        if (threadIdx.x == 0)
            lse_out[row] = l;
    }
    for (int s = threadIdx.x; s < T; s += blockDim.x)
        p[s] = __float2bfloat16_rn(s <= t ? expf(x[s] * scale - l) : 0.0f);
}

cudaError_t cuda_attention_softmax(cudaStream_t s, uint16_t *P, float *lse_out, const float *S, const float *lse_in,
                                   int NH, int T, float scale) {
    if (NH > 0 && T > 0)
        attention_softmax_kernel<<<(unsigned)NH * T, ROW_THREADS, 0, s>>>((__nv_bfloat16 *)P, lse_out, S, lse_in, T,
                                                                         scale);
    return cudaGetLastError();
}

// grid NH * T: block row = h * T + t; dS[row, s] = P (dP - D_row) * scale for s <= t, exactly 0 past the
// diagonal, written over P (each thread rewrites only the entries it read).
static __global__ void attention_dscores_kernel(__nv_bfloat16 *P, const float *dP, const float *D, int T,
                                                float scale) {
    size_t row = blockIdx.x;
    int t = (int)(row % T);
    float d = D[row];
    for (int s = threadIdx.x; s < T; s += blockDim.x) {
        float v = s <= t ? __bfloat162float(P[row * T + s]) * (dP[row * T + s] - d) * scale : 0.0f;
        P[row * T + s] = __float2bfloat16_rn(v);
    }
}

cudaError_t cuda_attention_dscores(cudaStream_t s, uint16_t *P, const float *dP, const float *D, int NH, int T,
                                   float scale) {
    if (NH > 0 && T > 0)
        attention_dscores_kernel<<<(unsigned)NH * T, ROW_THREADS, 0, s>>>((__nv_bfloat16 *)P, dP, D, T, scale);
    return cudaGetLastError();
}

// grid (ceil(T / ATT_WARPS), NH, B): warp -> drow[b, h, t] = Σ_i dout_ti out_ti of head h (fp32 inputs).
static __global__ void attention_drow_kernel(float *drow, const float *dout, const float *out, int T, int NH,
                                             int HS) {
    int lane = threadIdx.x % 32, t = blockIdx.x * ATT_WARPS + threadIdx.x / 32, h = blockIdx.y, b = blockIdx.z;
    if (t >= T)
        return;
    size_t row = ((size_t)b * T + t) * NH + h;
    float dor[ATT_PER_LANE];
    lane_load(dor, dout + row * HS, lane, HS);
    float D = warp_dot(dor, out + row * HS, lane, HS);
    if (lane == 0)
        drow[((size_t)b * NH + h) * T + t] = D;
}

cudaError_t cuda_attention_drow(cudaStream_t s, float *drow, const float *dout, const float *out, int B, int T,
                                int NH, int HS) {
    if (B > 0 && T > 0) {
        dim3 grid((T + ATT_WARPS - 1) / ATT_WARPS, NH, B);
        attention_drow_kernel<<<grid, 32 * ATT_WARPS, 0, s>>>(drow, dout, out, T, NH, HS);
    }
    return cudaGetLastError();
}

// ---- masked LoRA rows ----

static __global__ void zero_masked_rows_kernel(float *x, const uint8_t *mask, size_t n, int C) {
    GRID_STRIDE(i, n) {
        if (!mask[i / C])
            x[i] = 0.0f;
    }
}

cudaError_t cuda_zero_masked_rows(cudaStream_t s, float *x, const uint8_t *mask, int N, int C) {
    size_t n = (size_t)N * C;
    if (n > 0)
        zero_masked_rows_kernel<<<ew_blocks(n), EW_THREADS, 0, s>>>(x, mask, n, C);
    return cudaGetLastError();
}

// ---- cross-entropy and log-probs (one block per row of V logits) ----

// One thread, rows in order: result[0] = Σ mask (N without a mask), the CPU's sum; or the given batch's
// sum (wsum > 0) when these rows are a chunk of it.
static __global__ void mask_sum_kernel(double *result, const float *mask, int N, double wsum) {
    double w = 0.0;
    if (wsum > 0.0)
        w = wsum;
    else
        for (int n = 0; n < N; n++)
            w += mask ? mask[n] : 1.0;
    result[0] = w;
}

// grid N. row_loss[n] = w (lse - l[target]); with grad, l := w / wsum * (softmax - onehot). Rows with
// w = 0 (or an empty mask) get 0 and, with grad, a zero gradient.
static __global__ void cross_entropy_rows_kernel(float *logits, const int *targets, const float *mask, int V, int grad,
                                                 double *row_loss, const double *result) {
    int n = blockIdx.x;
    float *l = logits + (size_t)n * V;
    double wsum = result[0], w = mask ? mask[n] : 1.0;
    if (w == 0.0 || wsum == 0.0) { // the same for the whole block
        if (threadIdx.x == 0)
            row_loss[n] = 0.0;
        if (grad)
            for (int i = threadIdx.x; i < V; i += blockDim.x)
                l[i] = 0.0f;
        return;
    }
    float lt = l[targets[n]]; // read by every thread before block_max's barrier, written only after it
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        mx = fmaxf(mx, l[i]);
    mx = block_max(mx);
    double sum = 0.0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float e = expf(l[i] - mx);
        if (grad)
            l[i] = e;
        sum += e;
    }
    sum = block_sum_double(sum);
    if (threadIdx.x == 0)
        row_loss[n] = w * (mx + log(sum) - lt);
    if (grad) {
        float kf = (float)(w / wsum / sum);
        for (int i = threadIdx.x; i < V; i += blockDim.x)
            l[i] *= kf;
        __syncthreads();
        if (threadIdx.x == 0)
            l[targets[n]] -= (float)(w / wsum);
    }
}

// One thread: row losses added in row order (the same bits as the CPU's loss for the same row losses).
static __global__ void cross_entropy_total_kernel(double *result, const double *row_loss, int N) {
    double total = 0.0;
    for (int n = 0; n < N; n++)
        total += row_loss[n];
    result[1] = result[0] > 0 ? total / result[0] : 0.0;
}

cudaError_t cuda_cross_entropy(cudaStream_t s, double *result, float *logits, const int *targets, const float *mask,
                               int N, int V, int grad, double wsum, double *row_loss) {
    mask_sum_kernel<<<1, 1, 0, s>>>(result, mask, N, wsum);
    if (N > 0)
        cross_entropy_rows_kernel<<<N, ROW_THREADS, 0, s>>>(logits, targets, mask, V, grad, row_loss, result);
    cross_entropy_total_kernel<<<1, 1, 0, s>>>(result, row_loss, N);
    return cudaGetLastError();
}

// grid N: logp[n] = (l[target] - max) * inv_temp - log Σ exp((l - max) * inv_temp), the sum in double.
static __global__ void logprob_forward_kernel(float *logp, const float *logits, const int *targets, int V,
                                              float inv_temp) {
    const float *l = logits + (size_t)blockIdx.x * V;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        mx = fmaxf(mx, l[i]);
    mx = block_max(mx);
    double sum = 0.0;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        sum += expf((l[i] - mx) * inv_temp);
    sum = block_sum_double(sum);
    if (threadIdx.x == 0)
        logp[blockIdx.x] = (float)((double)(l[targets[blockIdx.x]] - mx) * inv_temp - log(sum));
}

cudaError_t cuda_logprob_forward(cudaStream_t s, float *logp, const float *logits, const int *targets, int N, int V,
                                 float inv_temp) {
    if (N > 0)
        logprob_forward_kernel<<<N, ROW_THREADS, 0, s>>>(logp, logits, targets, V, inv_temp);
    return cudaGetLastError();
}

// grid n: row rows[i] of logits: its tempered log-prob of targets[i], as logprob_forward_kernel, and with ent its
// entropy log z - Σ e^x x / z (x the tempered logit less the max, e^x summed in double).
static __global__ void token_stats_kernel(float *logp, float *ent, const float *logits, const int *rows,
                                          const int *targets, int V, float inv_temp) {
    const float *l = logits + (size_t)rows[blockIdx.x] * V;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        mx = fmaxf(mx, l[i]);
    mx = block_max(mx);
    double z = 0.0, zl = 0.0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float x = (l[i] - mx) * inv_temp, e = expf(x);
        z += e;
        zl += (double)e * x;
    }
    z = block_sum_double(z);
    if (ent)
        zl = block_sum_double(zl);
    if (threadIdx.x == 0) {
        logp[blockIdx.x] = (float)((double)(l[targets[blockIdx.x]] - mx) * inv_temp - log(z));
        if (ent)
            ent[blockIdx.x] = (float)(log(z) - zl / z);
    }
}

cudaError_t cuda_token_stats(cudaStream_t s, float *logp, float *ent, const float *logits, const int *rows,
                             const int *targets, int n, int V, float inv_temp) {
    if (n > 0)
        token_stats_kernel<<<n, ROW_THREADS, 0, s>>>(logp, ent, logits, rows, targets, V, inv_temp);
    return cudaGetLastError();
}

// grid N: d = coef * inv_temp * (onehot - softmax(l * inv_temp)), overwritten; d may alias l (each
// thread rewrites only the entries it read, after block_max's barrier ends every read of the max pass).
static __global__ void logprob_backward_kernel(float *dlogits, const float *logits, const int *targets,
                                               const float *coef, int V, float inv_temp) {
    const float *l = logits + (size_t)blockIdx.x * V;
    float *d = dlogits + (size_t)blockIdx.x * V;
    float cf = coef[blockIdx.x];
    if (cf == 0.0f) { // the same for the whole block
        for (int i = threadIdx.x; i < V; i += blockDim.x)
            d[i] = 0.0f;
        return;
    }
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        mx = fmaxf(mx, l[i]);
    mx = block_max(mx);
    double sum = 0.0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float e = expf((l[i] - mx) * inv_temp);
        d[i] = e;
        sum += e;
    }
    sum = block_sum_double(sum);
    float kf = (float)(-cf * inv_temp / sum);
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        d[i] *= kf;
    __syncthreads();
    if (threadIdx.x == 0)
        d[targets[blockIdx.x]] += cf * inv_temp;
}

cudaError_t cuda_logprob_backward(cudaStream_t s, float *dlogits, const float *logits, const int *targets,
                                  const float *coef, int N, int V, float inv_temp) {
    if (N > 0)
        logprob_backward_kernel<<<N, ROW_THREADS, 0, s>>>(dlogits, logits, targets, coef, V, inv_temp);
    return cudaGetLastError();
}

// ---- optimizer ----

// train/optim.c's adamw_step, element by element.
static __global__ void adamw_kernel(float *params, const float *grads, float *m, float *v,
                                    const unsigned char *decay_mask, size_t n, float lr, float b1, float b2, float eps,
                                    float wd, float bc1, float bc2) {
    GRID_STRIDE(i, n) {
        params[i] = adamw_rule(params[i], grads[i], &m[i], &v[i], !decay_mask || decay_mask[i], lr, b1, b2, eps, wd,
                               bc1, bc2);
    }
}

cudaError_t cuda_adamw_update(cudaStream_t s, float *params, const float *grads, float *m, float *v,
                              const unsigned char *decay_mask, size_t n, float lr, float b1, float b2, float eps,
                              float wd, float bc1, float bc2) {
    if (n > 0)
        adamw_kernel<<<ew_blocks(n), EW_THREADS, 0, s>>>(params, grads, m, v, decay_mask, n, lr, b1, b2, eps, wd, bc1,
                                                         bc2);
    return cudaGetLastError();
}

// grid = chunks: block c sums x² over chunk c in double.
static __global__ void sumsq_chunks_kernel(double *partials, const float *x, size_t n, size_t chunk) {
    size_t start = (size_t)blockIdx.x * chunk, end = start + chunk < n ? start + chunk : n;
    double ss = 0.0;
    for (size_t i = start + threadIdx.x; i < end; i += blockDim.x)
        ss += (double)x[i] * x[i];
    ss = block_sum_double(ss);
    if (threadIdx.x == 0)
        partials[blockIdx.x] = ss;
}

// One thread: the chunks' sums added in chunk order, as train/optim.c does.
static __global__ void sumsq_total_kernel(double *result, const double *partials, int chunks) {
    double ss = 0.0;
    for (int c = 0; c < chunks; c++)
        ss += partials[c];
    result[0] = ss;
}

cudaError_t cuda_sumsq(cudaStream_t s, double *result, double *partials, const float *x, size_t n, size_t chunk) {
    int chunks = (int)((n + chunk - 1) / chunk);
    if (chunks > CUDA_SUMSQ_MAX_CHUNKS)
        return cudaErrorInvalidValue;
    if (chunks > 0)
        sumsq_chunks_kernel<<<chunks, ROW_THREADS, 0, s>>>(partials, x, n, chunk);
    sumsq_total_kernel<<<1, 1, 0, s>>>(result, partials, chunks);
    return cudaGetLastError();
}
