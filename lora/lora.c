#include "lora/lora.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/gemm.h"
#include "core/threads.h"
#include "quant/quant.h"

static const char *target_names[LT_COUNT] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

const char *lora_target_name(LoraTarget t) { return t < LT_COUNT ? target_names[t] : "?"; }

int lora_targets_parse(const char *list, unsigned *mask) {
    *mask = 0;
    if (strcmp(list, "all") == 0 || strcmp(list, "all-linear") == 0) {
        *mask = LORA_ALL_TARGETS;
        return ER_OK;
    }
    const char *p = list;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        int found = -1;
        for (int t = 0; t < LT_COUNT; t++) {
            size_t short_len = strchr(target_names[t], '_') - target_names[t];
            if ((n == strlen(target_names[t]) && strncmp(p, target_names[t], n) == 0) ||
                (n == short_len && strncmp(p, target_names[t], n) == 0))
                found = t;
        }
        if (found < 0)
            return er_error(ER_EINVAL, "unknown LoRA target \"%.*s\" (expected q_proj, k_proj, v_proj, o_proj, gate_proj, "
                                       "up_proj, down_proj or all)", (int)n, p);
        *mask |= 1u << found;
        p += n;
        if (*p == ',')
            p++;
    }
    if (!*mask)
        return er_error(ER_EINVAL, "no LoRA targets given");
    return ER_OK;
}

void lora_target_shape(const LoraShape *s, LoraTarget t, int *in, int *out) {
    switch (t) {
    case LT_Q: *in = s->C; *out = s->q_dim; break;
    case LT_K: case LT_V: *in = s->C; *out = s->kv_dim; break;
    case LT_O: *in = s->q_dim; *out = s->C; break;
    case LT_GATE: case LT_UP: *in = s->C; *out = s->FF; break;
    default: *in = s->FF; *out = s->C; break;
    }
}

int lora_init(LoraAdapter *a, const LoraShape *s, int r, float alpha, int rslora, float dropout, unsigned targets,
              int with_grads, uint64_t seed) {
    memset(a, 0, sizeof *a);
    if (r < 1 || !(alpha > 0) || !(dropout >= 0 && dropout < 1) || !targets || (targets & ~LORA_ALL_TARGETS))
        return er_error(ER_EINVAL, "LoRA: need rank >= 1, alpha > 0, dropout in [0, 1) and at least one target");
    double scale = rslora ? alpha / sqrt((double)r) : (double)alpha / r;
    if (!(scale <= LORA_MAX_SCALE)) // what peft_load refuses: a trained adapter always loads
        return er_error(ER_ERANGE, "LoRA: alpha %g at rank %d%s gives a scale of %g, expected at most %g", alpha, r,
                        rslora ? " (rsLoRA)" : "", scale, (double)LORA_MAX_SCALE);
    a->L = s->L;
    a->r = r;
    a->alpha = alpha;
    a->rslora = rslora;
    a->scale = rslora ? alpha / sqrtf((float)r) : alpha / (float)r;
    a->dropout = dropout;
    a->targets = targets;
    a->masked = 1;
    static _Atomic uint64_t next_generation = 1;
    a->generation = next_generation++;
    a->mats = er_calloc((size_t)s->L * LT_COUNT, sizeof(LoraMat));
    if (!a->mats)
        return ER_ENOMEM;
    size_t total = 0;
    for (int l = 0; l < s->L; l++)
        for (int t = 0; t < LT_COUNT; t++)
            if (targets & (1u << t)) {
                LoraMat *m = &a->mats[l * LT_COUNT + t];
                lora_target_shape(s, (LoraTarget)t, &m->in, &m->out);
                total += (size_t)r * (m->in + m->out);
            }
    a->n_params = total;
    a->params = er_calloc(total, sizeof(float));
    a->grads = with_grads ? er_calloc(total, sizeof(float)) : NULL;
    if (!a->params || (with_grads && !a->grads)) {
        lora_free(a);
        return ER_ENOMEM;
    }
    ErRng rng;
    rng_seed(&rng, seed);
    size_t off = 0;
    for (int l = 0; l < s->L; l++)
        for (int t = 0; t < LT_COUNT; t++) {
            LoraMat *m = &a->mats[l * LT_COUNT + t];
            if (!m->in)
                continue;
            m->A = a->params + off;
            m->B = m->A + (size_t)r * m->in;
            if (with_grads) {
                m->gA = a->grads + off;
                m->gB = m->gA + (size_t)r * m->in;
            }
            off += (size_t)r * (m->in + m->out);
            // kaiming_uniform_(a = sqrt(5)): bound = sqrt(6 / ((1 + 5) * fan_in)) = 1 / sqrt(fan_in)
            float bound = 1.0f / sqrtf((float)m->in);
            for (size_t i = 0; i < (size_t)r * m->in; i++)
                m->A[i] = (2.0f * rng_uniform(&rng) - 1.0f) * bound;
        }
    return ER_OK;
}

void lora_free(LoraAdapter *a) {
    er_free(a->mats);
    er_free(a->params);
    er_free(a->grads);
    er_free(a->reasoning_prefix);
    er_free(a->base_model);
    memset(a, 0, sizeof *a);
}

const LoraMat *lora_mat(const LoraAdapter *a, int layer, LoraTarget t) {
    const LoraMat *m = &a->mats[layer * LT_COUNT + t];
    return m->A ? m : NULL;
}

void lora_zero_grad(LoraAdapter *a) {
    if (a->grads)
        memset(a->grads, 0, a->n_params * sizeof(float));
}

// Decode-sized passes sum every row alone with the decode kernels' dot product, so a row's result does not
// depend on the rows beside it (a batched decode step gives each request the bits it gets alone); a BLAS
// sgemm picks its kernel by the row count, which changes the last bits on some CPUs.
static void lora_forward_rows(float *out, float *h, const float *x, const LoraMat *m, int r, float scale,
                              const uint8_t *mask, int N) {
    for (int n = 0; n < N; n++) {
        float *hn = h + (size_t)n * r; // (r)
        if (mask && !mask[n]) {
            memset(hn, 0, sizeof(float) * r);
            continue;
        }
        for (int j = 0; j < r; j++)
            hn[j] = gemm_dot_f32(x + (size_t)n * m->in, m->A + (size_t)j * m->in, m->in);
        float *on = out + (size_t)n * m->out; // (out)
#pragma omp parallel for schedule(static) if ((long)m->out * r >= THREADS_MIN_WORK)
        for (int o = 0; o < m->out; o++)
            on[o] += scale * gemm_dot_f32(hn, m->B + (size_t)o * r, r);
    }
}

int lora_forward(float *out, float *h, const float *x, const LoraMat *m, int r, float scale, const uint8_t *mask,
                 int N) {
    if (N <= QUANT_BATCH_MAX_N) { // as far as the fp32 base products stay bitwise (quant/quant.h)
        lora_forward_rows(out, h, x, m, r, scale, mask, N);
        return ER_OK;
    }
    // h = x·Aᵀ for every row (masked rows are zeroed so the backward sees exactly what was used).
    gemm_f32(0, 1, N, r, m->in, 1.0f, x, m->in, m->A, m->in, 0.0f, h, r);
    if (mask)
        for (int n = 0; n < N; n++)
            if (!mask[n])
                memset(h + (size_t)n * r, 0, sizeof(float) * r);
    // out += scale · h·Bᵀ (rows with h = 0 add nothing)
    gemm_f32(0, 1, N, m->out, r, scale, h, r, m->B, r, 1.0f, out, m->out);
    return ER_OK;
}

void lora_backward(float *dx, LoraMat *m, int r, float scale, const float *dout, const float *x, const float *h,
                   const uint8_t *mask, int N, float *dh) {
    // dh = scale · dout·B (N, r), zero on masked-off rows
    gemm_f32(0, 0, N, r, m->out, scale, dout, m->out, m->B, r, 0.0f, dh, r);
    if (mask)
        for (int n = 0; n < N; n++)
            if (!mask[n])
                memset(dh + (size_t)n * r, 0, sizeof(float) * r);
    if (m->gB) // gB (out, r) += scale · doutᵀ·h   (h is zero on masked-off rows)
        gemm_f32(1, 0, m->out, r, N, scale, dout, m->out, h, r, 1.0f, m->gB, r);
    if (m->gA) // gA (r, in) += dhᵀ·x
        gemm_f32(1, 0, r, m->in, N, 1.0f, dh, r, x, m->in, 1.0f, m->gA, m->in);
    if (dx) // dx (N, in) += dh·A
        gemm_f32(0, 0, N, m->in, r, 1.0f, dh, r, m->A, m->in, 1.0f, dx, m->in);
}

void lora_merge_into(float *W, const LoraMat *m, int r, float scale, float sign) {
    gemm_f32(0, 0, m->out, m->in, r, sign * scale, m->B, r, m->A, m->in, 1.0f, W, m->in);
}
