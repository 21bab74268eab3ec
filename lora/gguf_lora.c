// GGUF-LoRA export for llama.cpp (layout in lora/gguf_lora.h).
#include "lora/gguf_lora.h"

#include <stdio.h>

#include "core/error.h"

static const char *const gguf_names[LT_COUNT] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                                  "ffn_gate", "ffn_up", "ffn_down"};

const char *lora_gguf_target_name(LoraTarget t) { return t < LT_COUNT ? gguf_names[t] : "?"; }

int lora_gguf_put(const LoraAdapter *a, const char *arch, GgufWriter *w) {
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
            ER_TRY(gguf_add_tensor(w, name, GGML_F32, 2, ne_b, m->B, (size_t)m->out * a->r * 4));
        }
    return ER_OK;
}
