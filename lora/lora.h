// LoRA adapters with the masked-LoRA rule: on a linear layer y = x·Wᵀ the adapter adds
// scale · (x·Aᵀ)·Bᵀ only at input positions whose mask is on (response positions), so prompt
// positions compute exactly the base model and their KV cache can be shared with it.
#ifndef LORA_LORA_H
#define LORA_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "core/rng.h"

// The linear layers an adapter may target, in PEFT's module names.
typedef enum { LT_Q, LT_K, LT_V, LT_O, LT_GATE, LT_UP, LT_DOWN, LT_COUNT } LoraTarget;

#define LORA_ALL_TARGETS ((1u << LT_COUNT) - 1)

// The largest scale (alpha / r, or alpha / sqrt(r) with rsLoRA) a loaded adapter may have: far above
// any trained one (alpha 2r gives 2), far below what overflows the forward's activations.
#define LORA_MAX_SCALE 1e4

const char *lora_target_name(LoraTarget t);     // "q_proj", ..., "down_proj"
int lora_targets_parse(const char *list, unsigned *mask); // "q_proj,v_proj" | "q,v" | "all"

typedef struct {
    int in, out;     // the base linear's (in, out) features
    float *A;        // (r, in)
    float *B;        // (out, r)
    float *gA, *gB;  // gradients, same shapes (NULL when not training)
} LoraMat;

typedef struct LoraAdapter {
    int L, r;
    float alpha;
    int rslora;          // scale = alpha / sqrt(r) instead of alpha / r
    float scale;
    float dropout;       // on the adapter's input, training only
    unsigned targets;    // bit t set: LoraTarget t is adapted
    LoraMat *mats;       // (L * LT_COUNT); mats[l * LT_COUNT + t], A == NULL when not targeted
    float *params;       // every A and B, contiguous (for the optimizer)
    float *grads;        // same layout, NULL when not training
    size_t n_params;
    int masked;          // trained with the masked rule (PEFT key "er_mask": "response")
    char *reasoning_prefix; // forced at the start of responses ("er_reasoning_prefix"), may be NULL
    char *base_model;    // base_model_name_or_path
    uint64_t generation; // unique per lora_init in this process: caches keyed by an adapter (the engine's
                         // prompt K/V) compare it, not the address, which a replaced adapter may reuse
} LoraAdapter;

// Shapes of the base model a LoRA attaches to: hidden C, q width NH*HS, kv width NKV*HS, FF.
typedef struct {
    int L, C, q_dim, kv_dim, FF;
} LoraShape;

// The (in, out) features of target t's base linear.
void lora_target_shape(const LoraShape *s, LoraTarget t, int *in, int *out);

// PEFT init: A ~ Kaiming-uniform(a = sqrt(5)) i.e. U(-1/sqrt(in), 1/sqrt(in)), B = 0.
int lora_init(LoraAdapter *a, const LoraShape *s, int r, float alpha, int rslora, float dropout, unsigned targets,
              int with_grads, uint64_t seed);
void lora_free(LoraAdapter *a);
const LoraMat *lora_mat(const LoraAdapter *a, int layer, LoraTarget t); // NULL when not targeted
void lora_zero_grad(LoraAdapter *a);

// out (N, out) += scale * mask[n] * (x (N, in) · Aᵀ) · Bᵀ. h (N, r) receives x·Aᵀ (kept for the
// backward); rows with mask 0 are skipped. mask NULL = on everywhere.
int lora_forward(float *out, float *h, const float *x, const LoraMat *m, int r, float scale, const uint8_t *mask,
                 int N);
// Accumulates gA, gB and dx (N, in) += ... from dout (N, out), with x and h from the forward;
// dh (N, r) is the caller's scratch.
void lora_backward(float *dx, LoraMat *m, int r, float scale, const float *dout, const float *x, const float *h,
                   const uint8_t *mask, int N, float *dh);

// W (out, in) += sign * scale * B·A in fp32 (sign -1 unmerges).
void lora_merge_into(float *W, const LoraMat *m, int r, float scale, float sign);

#endif
