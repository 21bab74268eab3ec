// The CPU backend: the reference every other backend is tested against. Its buffers are host memory
// and its ops are the CPU ops themselves (model/ops.h, quant/quant.h, lora/lora.h); the few loops that
// have no other home (embedding rows, bias gradients, AdamW, the gradient norm) are written here once.
#include "model/backend.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/gemm.h"
#include "core/threads.h"
#include "model/op_rules.h"
#include "model/ops.h"
#include "quant/quant.h"

static void *cpu_alloc(Backend *be, size_t bytes) {
    void *p = er_alloc(bytes);
    if (!p)
        er_error(ER_ENOMEM, "cpu: cannot allocate %.1f MiB", bytes / 1048576.0);
    return p;
}

static void cpu_free(Backend *be, void *p) { er_free(p); }

static int cpu_copy(Backend *be, void *dst, const void *src, size_t bytes) {
    if (dst != src && bytes)
        memcpy(dst, src, bytes);
    return ER_OK;
}

static int cpu_zero(Backend *be, void *p, size_t bytes) {
    memset(p, 0, bytes);
    return ER_OK;
}

// The CPU products read every format in place: the placed matrix shares the host one's buffers.
static int cpu_weight_upload(Backend *be, Weight *dst, const Weight *src, int frozen) {
    *dst = *src;
    dst->owned = NULL;
    return ER_OK;
}

static int cpu_mem_available(Backend *be, size_t *bytes) {
    *bytes = er_physical_memory();
    return ER_OK;
}

static int cpu_embed_forward(Backend *be, float *out, const Weight *embed, const int *tokens, int N) {
    int C = embed->cols;
#pragma omp parallel for schedule(static) if ((long)N * C >= THREADS_MIN_WORK)
    for (int n = 0; n < N; n++)
        weight_row_f32(out + (size_t)n * C, embed, tokens[n]);
    return ER_OK;
}

static int cpu_matmul_forward(Backend *be, float *out, const float *inp, const Weight *w, const float *bias, int N,
                              float *scratch, int flags) {
    return weight_matmul_forward(out, inp, w, bias, N, scratch, flags);
}

static int cpu_rmsnorm_forward(Backend *be, float *out, float *rstd, const float *x, const float *w, int N, int C,
                               float eps) {
    rmsnorm_forward(out, rstd, x, w, N, C, eps);
    return ER_OK;
}

static int cpu_rope_forward(Backend *be, float *x, const int *pos, const float *cos_tab, const float *sin_tab, int N,
                            int nh, int HS) {
    rope_forward(x, pos, cos_tab, sin_tab, N, nh, HS);
    return ER_OK;
}

static int cpu_swiglu_forward(Backend *be, float *out, const float *gate, const float *up, int N, int F) {
    swiglu_forward(out, gate, up, N, F);
    return ER_OK;
}

static int cpu_residual_forward(Backend *be, float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for schedule(static) if (n >= THREADS_MIN_WORK)
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
    return ER_OK;
}

static int cpu_attention_forward(Backend *be, float *out, float *lse, const float *q, const float *k, const float *v,
                                 int B, int T, int NH, int NKV, int HS, float *scores, int nthreads) {
    return attention_forward(out, lse, q, k, v, NULL, B, T, T, NH, NKV, HS, scores, nthreads);
}

static int cpu_kv_store(Backend *be, KVCache *kv, int l, const float *k, const float *v, const int *dst, int N) {
    kv_store_rows(kv, l, k, v, dst, N);
    return ER_OK;
}

static int cpu_kv_attention_forward(Backend *be, float *out, const float *q, const KVCache *kv, int l,
                                    const int *blocks, const int *pos0, const int *len, int B, int T, int NH,
                                    float *scores, int nthreads, int keys) {
    return kv_attention_forward(out, q, kv, l, blocks, pos0, len, B, T, NH, scores, nthreads, keys);
}

static int cpu_lora_forward(Backend *be, float *out, float *h, const float *x, const LoraMat *m, int r, float scale,
                            const uint8_t *mask, int N) {
    return lora_forward(out, h, x, m, r, scale, mask, N);
}

static int cpu_cross_entropy(Backend *be, double *loss, float *logits, const int *targets, const float *mask, int N,
                             int V, int grad, double wsum, double *row_loss) {
    *loss = cross_entropy_forward_backward(logits, targets, mask, N, V, grad, wsum, row_loss);
    return ER_OK;
}

static int cpu_logprob_forward(Backend *be, float *logp, const float *logits, const int *targets, int N, int V,
                               float inv_temp) {
    logprob_forward(logp, logits, targets, N, V, inv_temp);
    return ER_OK;
}

static int cpu_token_stats(Backend *be, float *logp, float *ent, const float *logits, const int *rows,
                           const int *targets, int n, int V, float inv_temp) {
    for (int i = 0; i < n; i++)
        logprob_forward(&logp[i], logits + (size_t)rows[i] * V, &targets[i], 1, V, inv_temp);
    if (!ent)
        return ER_OK;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) { // in double: Σ e^x and Σ x e^x over the row, x the tempered logit less the max
        const float *l = logits + (size_t)rows[i] * V;
        float mx = l[0];
        for (int v = 1; v < V; v++)
            mx = l[v] > mx ? l[v] : mx;
        double z = 0.0, zl = 0.0;
        for (int v = 0; v < V; v++) {
            double x = (double)(l[v] - mx) * inv_temp, e = exp(x);
            z += e;
            zl += e * x;
        }
        ent[i] = (float)(log(z) - zl / z);
    }
    return ER_OK;
}

static int cpu_logprob_backward(Backend *be, float *dlogits, const float *logits, const int *targets,
                                const float *coef, int N, int V, float inv_temp) {
    logprob_backward(dlogits, logits, targets, coef, N, V, inv_temp);
    return ER_OK;
}

static int cpu_matmul_backward_input(Backend *be, float *dinp, const float *dout, const Weight *w, int N,
                                     float *scratch) {
    return weight_matmul_backward_input(dinp, dout, w, N, scratch);
}

static int cpu_matmul_backward_weight(Backend *be, float *dW, float *dbias, const float *dout, const float *inp,
                                      int N, int R, int K) {
    if (dW)
        gemm_f32(1, 0, R, K, N, 1.0f, dout, R, inp, K, 1.0f, dW, K);
    if (dbias) {
#pragma omp parallel for schedule(static)
        for (int r = 0; r < R; r++) {
            float acc = 0.0f;
            for (int n = 0; n < N; n++)
                acc += dout[(size_t)n * R + r];
            dbias[r] += acc;
        }
    }
    return ER_OK;
}

static int cpu_rmsnorm_backward(Backend *be, float *dx, float *dw, const float *dout, const float *x, const float *w,
                                const float *rstd, int N, int C) {
    rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C);
    return ER_OK;
}

static int cpu_rope_backward(Backend *be, float *dx, const int *pos, const float *cos_tab, const float *sin_tab, int N,
                             int nh, int HS) {
    rope_backward(dx, pos, cos_tab, sin_tab, N, nh, HS);
    return ER_OK;
}

static int cpu_swiglu_backward(Backend *be, float *dgate, float *dup, const float *dout, const float *gate,
                               const float *up, int N, int F) {
    swiglu_backward(dgate, dup, dout, gate, up, N, F);
    return ER_OK;
}

static int cpu_attention_backward(Backend *be, float *dq, float *dk, float *dv, const float *dout, const float *out,
                                  const float *lse, const float *q, const float *k, const float *v, int B, int T,
                                  int NH, int NKV, int HS, float *dkh, float *dvh) {
    return attention_backward(dq, dk, dv, dout, out, lse, q, k, v, NULL, B, T, T, NH, NKV, HS, dkh, dvh);
}

static int cpu_lora_backward(Backend *be, float *dx, LoraMat *m, int r, float scale, const float *dout,
                             const float *x, const float *h, const uint8_t *mask, int N, float *dh) {
    lora_backward(dx, m, r, scale, dout, x, h, mask, N, dh);
    return ER_OK;
}

static int cpu_embed_backward(Backend *be, float *dembed, const float *dres, const int *tokens, int N, int C) {
    // Columns split across threads so repeated tokens never race; rows added in order.
#pragma omp parallel
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int c0 = (int)((long)C * id / nt), c1 = (int)((long)C * (id + 1) / nt);
        for (int n = 0; n < N; n++) {
            float *ge = dembed + (size_t)tokens[n] * C;
            const float *d = dres + (size_t)n * C;
            for (int i = c0; i < c1; i++)
                ge[i] += d[i];
        }
    }
    return ER_OK;
}

static int cpu_adamw_update(Backend *be, float *params, const float *grads, float *m, float *v,
                            const unsigned char *decay_mask, size_t n, float lr, float b1, float b2, float eps,
                            float wd, float bc1, float bc2) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        params[i] = adamw_rule(params[i], grads[i], &m[i], &v[i], !decay_mask || decay_mask[i], lr, b1, b2, eps, wd,
                               bc1, bc2);
    return ER_OK;
}

// Sums of squares over fixed chunks, added in chunk order: the same bits for any thread count, which
// bitwise-reproducible runs and resumes rely on.
#define SUMSQ_CHUNK 65536
#define SUMSQ_MAX_CHUNKS 4096

static int cpu_sumsq(Backend *be, double *out, const float *x, size_t n) {
    size_t chunk = SUMSQ_CHUNK;
    while ((n + chunk - 1) / chunk > SUMSQ_MAX_CHUNKS)
        chunk *= 2;
    long nchunks = (long)((n + chunk - 1) / chunk);
    double part[SUMSQ_MAX_CHUNKS];
#pragma omp parallel for schedule(static)
    for (long c = 0; c < nchunks; c++) {
        size_t end = (size_t)(c + 1) * chunk < n ? (size_t)(c + 1) * chunk : n;
        double ss = 0.0;
        for (size_t i = (size_t)c * chunk; i < end; i++)
            ss += (double)x[i] * x[i];
        part[c] = ss;
    }
    double ss = 0.0;
    for (long c = 0; c < nchunks; c++)
        ss += part[c];
    *out = ss;
    return ER_OK;
}

static int cpu_scale(Backend *be, float *x, size_t n, float s) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
    return ER_OK;
}

static const BackendOps cpu_ops = {
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .weight_upload = cpu_weight_upload,
    .mem_available = cpu_mem_available,
    .embed_forward = cpu_embed_forward,
    .matmul_forward = cpu_matmul_forward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rope_forward = cpu_rope_forward,
    .swiglu_forward = cpu_swiglu_forward,
    .residual_forward = cpu_residual_forward,
    .attention_forward = cpu_attention_forward,
    .kv_store = cpu_kv_store,
    .kv_attention_forward = cpu_kv_attention_forward,
    .lora_forward = cpu_lora_forward,
    .cross_entropy = cpu_cross_entropy,
    .logprob_forward = cpu_logprob_forward,
    .token_stats = cpu_token_stats,
    .logprob_backward = cpu_logprob_backward,
    .matmul_backward_input = cpu_matmul_backward_input,
    .matmul_backward_weight = cpu_matmul_backward_weight,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope_backward = cpu_rope_backward,
    .swiglu_backward = cpu_swiglu_backward,
    .attention_backward = cpu_attention_backward,
    .lora_backward = cpu_lora_backward,
    .embed_backward = cpu_embed_backward,
    .adamw_update = cpu_adamw_update,
    .sumsq = cpu_sumsq,
    .scale = cpu_scale,
};

static Backend cpu_backend = {.kind = BACKEND_CPU, .ops = &cpu_ops, .name = "cpu"};

Backend *backend_cpu(void) {
    if (!cpu_backend.device[0])
        snprintf(cpu_backend.device, sizeof cpu_backend.device, "%s, %d threads",
#if defined(__x86_64__)
                 "x86-64",
#elif defined(__aarch64__)
                 "aarch64",
#else
                 "cpu",
#endif
                 threads_get());
    return &cpu_backend;
}

int backend_open(Backend **be, const char *name) {
    *be = NULL;
    if (!name || !strcmp(name, "cpu")) {
        *be = backend_cpu();
        return ER_OK;
    }
    int device = 0;
    if (strcmp(name, "cuda") != 0) {
        char *end = NULL;
        if (strncmp(name, "cuda:", 5) != 0 || !name[5] || (device = (int)strtol(name + 5, &end, 10)) < 0 || *end)
            return er_error(ER_EINVAL, "device '%s': expected cpu, cuda or cuda:N", name);
    }
#ifdef ER_CUDA
    Backend *b = er_calloc(1, sizeof *b);
    if (!b)
        return ER_ENOMEM;
    int rc = backend_cuda_open(b, device);
    if (rc < 0) {
        er_free(b);
        return rc;
    }
    *be = b;
    return ER_OK;
#else
    return er_error(ER_EUNSUPPORTED, "device '%s': this build has no CUDA backend (build with make CUDA=1)", name);
#endif
}

void backend_close(Backend *be) {
    if (!be || be == &cpu_backend)
        return;
#ifdef ER_CUDA
    backend_cuda_close(be);
    er_free(be);
#endif
}

const char *backend_default(void) {
#ifdef ER_CUDA
    Backend *be = NULL;
    if (backend_open(&be, "cuda") == ER_OK) {
        backend_close(be);
        return "cuda";
    }
#endif
    return "cpu";
}

// ---- backend_after_each_op: the ops of be->inner, each followed by be->after naming it ----

#define AFTER_OP(op, params, args)                                                                                      \
    static int after_##op params {                                                                                   \
        int rc = be->inner->op args;                                                                               \
        return rc < 0 ? rc : be->after(be, #op);                                                                       \
    }

static void *after_alloc(Backend *be, size_t bytes) { return be->inner->alloc(be, bytes); }
static void after_free(Backend *be, void *p) { be->inner->free(be, p); }
AFTER_OP(upload, (Backend *be, void *dst, const void *host, size_t bytes), (be, dst, host, bytes))
AFTER_OP(download, (Backend *be, void *host, const void *src, size_t bytes), (be, host, src, bytes))
AFTER_OP(copy, (Backend *be, void *dst, const void *src, size_t bytes), (be, dst, src, bytes))
AFTER_OP(zero, (Backend *be, void *p, size_t bytes), (be, p, bytes))
AFTER_OP(weight_upload, (Backend *be, Weight *dst, const Weight *src, int frozen), (be, dst, src, frozen))
AFTER_OP(mem_available, (Backend *be, size_t *bytes), (be, bytes))
AFTER_OP(embed_forward, (Backend *be, float *out, const Weight *embed, const int *tokens, int N),
       (be, out, embed, tokens, N))
AFTER_OP(matmul_forward,
       (Backend *be, float *out, const float *inp, const Weight *w, const float *bias, int N, float *scratch,
        int flags),
       (be, out, inp, w, bias, N, scratch, flags))
AFTER_OP(rmsnorm_forward, (Backend *be, float *out, float *rstd, const float *x, const float *w, int N, int C, float eps),
       (be, out, rstd, x, w, N, C, eps))
AFTER_OP(rope_forward,
       (Backend *be, float *x, const int *pos, const float *cos_tab, const float *sin_tab, int N, int nh, int HS),
       (be, x, pos, cos_tab, sin_tab, N, nh, HS))
AFTER_OP(swiglu_forward, (Backend *be, float *out, const float *gate, const float *up, int N, int F),
       (be, out, gate, up, N, F))
AFTER_OP(residual_forward, (Backend *be, float *out, const float *a, const float *b, size_t n), (be, out, a, b, n))
AFTER_OP(attention_forward,
       (Backend *be, float *out, float *lse, const float *q, const float *k, const float *v, int B, int T, int NH,
        int NKV, int HS, float *scores, int nthreads),
       (be, out, lse, q, k, v, B, T, NH, NKV, HS, scores, nthreads))
AFTER_OP(kv_store, (Backend *be, KVCache *kv, int l, const float *k, const float *v, const int *dst, int N),
       (be, kv, l, k, v, dst, N))
AFTER_OP(kv_attention_forward,
       (Backend *be, float *out, const float *q, const KVCache *kv, int l, const int *blocks, const int *pos0,
        const int *len, int B, int T, int NH, float *scores, int nthreads, int keys),
       (be, out, q, kv, l, blocks, pos0, len, B, T, NH, scores, nthreads, keys))
AFTER_OP(lora_forward,
       (Backend *be, float *out, float *h, const float *x, const LoraMat *m, int r, float scale, const uint8_t *mask,
        int N),
       (be, out, h, x, m, r, scale, mask, N))
AFTER_OP(cross_entropy,
       (Backend *be, double *loss, float *logits, const int *targets, const float *mask, int N, int V, int grad,
        double wsum, double *row_loss),
       (be, loss, logits, targets, mask, N, V, grad, wsum, row_loss))
AFTER_OP(logprob_forward,
       (Backend *be, float *logp, const float *logits, const int *targets, int N, int V, float inv_temp),
       (be, logp, logits, targets, N, V, inv_temp))
AFTER_OP(token_stats,
       (Backend *be, float *logp, float *ent, const float *logits, const int *rows, const int *targets, int n, int V,
        float inv_temp),
       (be, logp, ent, logits, rows, targets, n, V, inv_temp))
AFTER_OP(logprob_backward,
       (Backend *be, float *dlogits, const float *logits, const int *targets, const float *coef, int N, int V,
        float inv_temp),
       (be, dlogits, logits, targets, coef, N, V, inv_temp))
AFTER_OP(matmul_backward_input,
       (Backend *be, float *dinp, const float *dout, const Weight *w, int N, float *scratch),
       (be, dinp, dout, w, N, scratch))
AFTER_OP(matmul_backward_weight,
       (Backend *be, float *dW, float *dbias, const float *dout, const float *inp, int N, int R, int K),
       (be, dW, dbias, dout, inp, N, R, K))
AFTER_OP(rmsnorm_backward,
       (Backend *be, float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd, int N,
        int C),
       (be, dx, dw, dout, x, w, rstd, N, C))
AFTER_OP(rope_backward,
       (Backend *be, float *dx, const int *pos, const float *cos_tab, const float *sin_tab, int N, int nh, int HS),
       (be, dx, pos, cos_tab, sin_tab, N, nh, HS))
AFTER_OP(swiglu_backward,
       (Backend *be, float *dgate, float *dup, const float *dout, const float *gate, const float *up, int N, int F),
       (be, dgate, dup, dout, gate, up, N, F))
AFTER_OP(attention_backward,
       (Backend *be, float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
        const float *q, const float *k, const float *v, int B, int T, int NH, int NKV, int HS, float *dkh, float *dvh),
       (be, dq, dk, dv, dout, out, lse, q, k, v, B, T, NH, NKV, HS, dkh, dvh))
AFTER_OP(lora_backward,
       (Backend *be, float *dx, LoraMat *m, int r, float scale, const float *dout, const float *x, const float *h,
        const uint8_t *mask, int N, float *dh),
       (be, dx, m, r, scale, dout, x, h, mask, N, dh))
AFTER_OP(embed_backward, (Backend *be, float *dembed, const float *dres, const int *tokens, int N, int C),
       (be, dembed, dres, tokens, N, C))
AFTER_OP(adamw_update,
       (Backend *be, float *params, const float *grads, float *m, float *v, const unsigned char *decay_mask, size_t n,
        float lr, float b1, float b2, float eps, float wd, float bc1, float bc2),
       (be, params, grads, m, v, decay_mask, n, lr, b1, b2, eps, wd, bc1, bc2))
AFTER_OP(sumsq, (Backend *be, double *out, const float *x, size_t n), (be, out, x, n))
AFTER_OP(scale, (Backend *be, float *x, size_t n, float s), (be, x, n, s))

static const BackendOps after_ops = {
    .alloc = after_alloc,
    .free = after_free,
    .upload = after_upload,
    .download = after_download,
    .copy = after_copy,
    .zero = after_zero,
    .weight_upload = after_weight_upload,
    .mem_available = after_mem_available,
    .embed_forward = after_embed_forward,
    .matmul_forward = after_matmul_forward,
    .rmsnorm_forward = after_rmsnorm_forward,
    .rope_forward = after_rope_forward,
    .swiglu_forward = after_swiglu_forward,
    .residual_forward = after_residual_forward,
    .attention_forward = after_attention_forward,
    .kv_store = after_kv_store,
    .kv_attention_forward = after_kv_attention_forward,
    .lora_forward = after_lora_forward,
    .cross_entropy = after_cross_entropy,
    .logprob_forward = after_logprob_forward,
    .token_stats = after_token_stats,
    .logprob_backward = after_logprob_backward,
    .matmul_backward_input = after_matmul_backward_input,
    .matmul_backward_weight = after_matmul_backward_weight,
    .rmsnorm_backward = after_rmsnorm_backward,
    .rope_backward = after_rope_backward,
    .swiglu_backward = after_swiglu_backward,
    .attention_backward = after_attention_backward,
    .lora_backward = after_lora_backward,
    .embed_backward = after_embed_backward,
    .adamw_update = after_adamw_update,
    .sumsq = after_sumsq,
    .scale = after_scale,
};

void backend_after_each_op(Backend *be, int (*after)(Backend *be, const char *op)) {
    if (be->ops == &after_ops)
        return;
    be->inner = be->ops;
    be->after = after;
    be->ops = &after_ops;
}

int backend_cuda_devices(int *n) {
    *n = 0;
#ifdef ER_CUDA
    return backend_cuda_count(n);
#else
    return ER_OK;
#endif
}

int backend_env_flag(const char *name, const char *value, int *on) {
    *on = 0;
    if (!value || !value[0] || !strcmp(value, "0"))
        return ER_OK;
    if (!strcmp(value, "1")) {
        *on = 1;
        return ER_OK;
    }
    return er_error(ER_EINVAL, "%s='%.40s': expected 0 or 1", name, value);
}

void backend_weight_free(Backend *be, Weight *w) {
    if (w->owned)
        be->ops->free(be, w->owned);
    memset(w, 0, sizeof *w);
}

int lora_to_backend(LoraAdapter *dst, const LoraAdapter *src, Backend *be) {
    *dst = *src;
    dst->reasoning_prefix = dst->base_model = NULL;
    dst->mats = NULL;
    dst->params = dst->grads = NULL;
    int rc = ER_OK;
    size_t bytes = src->n_params * sizeof(float), n = (size_t)src->L * LT_COUNT;
    dst->mats = er_calloc(n, sizeof(LoraMat));
    dst->params = be->ops->alloc(be, bytes);
    dst->grads = src->grads ? be->ops->alloc(be, bytes) : NULL;
    if (!dst->mats || !dst->params || (src->grads && !dst->grads))
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(be->ops->upload(be, dst->params, src->params, bytes));
    if (dst->grads)
        ER_CHECK(be->ops->zero(be, dst->grads, bytes));
    for (size_t i = 0; i < n; i++) {
        const LoraMat *s = &src->mats[i];
        LoraMat *d = &dst->mats[i];
        *d = (LoraMat){.in = s->in, .out = s->out};
        if (!s->A)
            continue;
        d->A = dst->params + (s->A - src->params);
        d->B = dst->params + (s->B - src->params);
        if (dst->grads) {
            d->gA = dst->grads + (s->A - src->params);
            d->gB = dst->grads + (s->B - src->params);
        }
    }
    return ER_OK;
done:
    lora_backend_free(dst, be);
    return er_error_prefix(rc, "placing the adapter on %s", be->name);
}

void lora_backend_free(LoraAdapter *a, Backend *be) {
    er_free(a->mats);
    be->ops->free(be, a->params);
    be->ops->free(be, a->grads);
    memset(a, 0, sizeof *a);
}
