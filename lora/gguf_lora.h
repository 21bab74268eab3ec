// llama.cpp LoRA adapters (GGUF): general.type "adapter", adapter.type "lora", adapter.lora.alpha, and per
// adapted projection blk.N.<name>.weight.lora_a, ggml ne {in, r} (PEFT's lora_A (r, in), same bytes), and
// .lora_b, ne {r, out} (lora_B (out, r)). llama.cpp scales B·A by alpha / r times the per-request scale and
// applies it at every position: an adapter trained masked (off on the prompt) is exported as it is, and
// only erinfer keeps the masked semantics and the prompt's KV reuse.
#ifndef LORA_GGUF_LORA_H
#define LORA_GGUF_LORA_H

#include "core/gguf.h"
#include "lora/lora.h"

// llama only: the HF row behind row r of a q/k projection in llama.cpp's order, heads of HS rows
// (convert_hf_to_gguf.py's permute: rows (head, 2, HS/2) stored as (head, HS/2, 2)).
int lora_gguf_llama_row(int r, int HS);
// llama.cpp's tensor name of a target's projection: "attn_q", "attn_k", "attn_v", "attn_output",
// "ffn_gate", "ffn_up", "ffn_down".
const char *lora_gguf_target_name(LoraTarget t);
// The adapter's metadata and tensors (fp32) into w; arch is the base's llama.cpp architecture ("qwen2", "qwen3" or
// "llama", whose q/k lora_b rows are permuted like the base's rows, heads of HS). Tensors point into a, which
// must outlive the write, or are copies w owns. An rsLoRA adapter (scale alpha / sqrt(r)) is written with the
// alpha that gives llama.cpp's alpha / r the same scale.
int lora_gguf_put(const LoraAdapter *a, const char *arch, int HS, GgufWriter *w);

#endif
