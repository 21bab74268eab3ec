// GGUF-LoRA export for llama.cpp (layout in lora/gguf_lora.h).
#include "lora/gguf_lora.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

static const char *const gguf_names[LT_COUNT] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                                  "ffn_gate", "ffn_up", "ffn_down"};

const char *lora_gguf_target_name(LoraTarget t) { return t < LT_COUNT ? gguf_names[t] : "?"; }

int lora_gguf_llama_row(int r, int HS) {
    int h = r / HS, i = (r % HS) / 2, j = r % 2;
    return h * HS + j * (HS / 2) + i;
}

// lora_b (out, r) of a llama q/k projection with its rows in llama.cpp's order, a new block.
static float *permuted_b(const LoraMat *m, int r, int HS) {
    float *b = er_alloc((size_t)m->out * r * sizeof(float));
    for (int row = 0; b && row < m->out; row++)
        memcpy(b + (size_t)row * r, m->B + (size_t)lora_gguf_llama_row(row, HS) * r, (size_t)r * sizeof(float));
    return b;
}

int lora_gguf_put(const LoraAdapter *a, const char *arch, int HS, GgufWriter *w) {
    int llama = strcmp(arch, "llama") == 0;
    // llama.cpp: scale = adapter.lora.alpha / r (times the user's scale).
    float alpha = a->scale * (float)a->r;
    ER_TRY(gguf_set_str(w, "general.architecture", arch));
    ER_TRY(gguf_set_str(w, "general.type", "adapter"));
    ER_TRY(gguf_set_str(w, "adapter.type", "lora"));
    ER_TRY(gguf_set_f32(w, "adapter.lora.alpha", alpha));
    for (int l = 0; l < a->L; l++)
        for (int t = 0; t < LT_COUNT; t++) {
            const LoraMat *m = lora_mat(a, l, (LoraTarget)t);
            if (!m)
                continue;
            char name[96];
            uint64_t ne_a[2] = {(uint64_t)m->in, (uint64_t)a->r}, ne_b[2] = {(uint64_t)a->r, (uint64_t)m->out};
            snprintf(name, sizeof name, "blk.%d.%s.weight.lora_a", l, gguf_names[t]);
            ER_TRY(gguf_add_tensor(w, name, GGML_F32, 2, ne_a, m->A, (size_t)m->in * a->r * 4));
            snprintf(name, sizeof name, "blk.%d.%s.weight.lora_b", l, gguf_names[t]);
            size_t nb = (size_t)m->out * a->r * 4;
            if (llama && (t == LT_Q || t == LT_K)) {
                float *b = permuted_b(m, a->r, HS);
                if (!b)
                    return ER_ENOMEM;
                ER_TRY(gguf_add_tensor_owned(w, name, GGML_F32, 2, ne_b, b, nb));
            } else {
                ER_TRY(gguf_add_tensor(w, name, GGML_F32, 2, ne_b, m->B, nb));
            }
        }
    return ER_OK;
}
