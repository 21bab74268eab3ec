// Models as GGUF files for llama.cpp: architecture "qwen2" (Qwen2 family), "qwen3" or "llama", the
// hyper-parameters under "<arch>.*", tensors in llama.cpp's names (token_embd, blk.N.attn_q, ...,
// blk.N.attn_q_norm / attn_k_norm for qwen3, output_norm, output; no output when tied) and ggml's layouts:
//   f32, f16, bf16   rows as in HF ([out, in] is ne {in, out}, the same bytes)
//   q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K   ggml's blocks (quant/blocks.h), written by blocks_quantize_row
// Norms and biases are f32. llama's q_proj / k_proj rows are permuted into llama.cpp's interleaved
// RoPE order (convert_hf_to_gguf.py's permute) and back on import; qwen2 and qwen3 need no permutation.
// Import: f32 / f16 / bf16 matrices and the block types (q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K: our
// formats of the same names, quant/blocks.h) stay in their type and bytes (mmapped; llama q/k rows are
// copied back into HF order), so a Q4_0 or Q4_K_M file loads at its size; other types are refused by name.
// A model exported with its default type writes each of these matrices back byte for byte.
#ifndef MODEL_GGUF_MODEL_H
#define MODEL_GGUF_MODEL_H

#include <stdio.h>

#include "core/gguf.h"
#include "model/model.h"

// The GGUF type names an export accepts: "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1",
// "q4_K", "q5_K", "q6_K" (any case) -> ggml type.
int model_gguf_parse_type(const char *s, uint32_t *type);
// Export type: every matrix in the ggml type that holds it byte for byte (model_gguf_default_type).
#define MODEL_GGUF_NATIVE 0xffffffffu
// The ggml type a model exports to by default: its matrices' float type, q4_0 for q4g32 matrices that
// are q4_0 blocks (zero = -8 x scale), MODEL_GGUF_NATIVE when some are in a block format (q4_0 included;
// each then in its own type); other quantized formats have none (ER_EUNSUPPORTED, naming it).
int model_gguf_default_type(const Model *m, uint32_t *type);
// general.architecture, the "<arch>.*" hyper-parameters, general.file_type and every tensor of m as
// `type` into w (the tensor bytes are made now and owned by w). Matrices whose rows are not whole
// blocks of a quantized type are written f16, as llama.cpp's converter does; quantized matrices of
// ours are requantized from their dequantized values only where `type` cannot take them exactly (each
// such case is one line on log; NULL = silent).
int model_gguf_put(const Model *m, uint32_t type, GgufWriter *w, FILE *log);
// The architecture name of m ("qwen2" / "qwen3" / "llama").
const char *model_gguf_arch(const ModelConfig *c);
// Loads a GGUF model (flags as model_load; a quantized one is refused with MODEL_LOAD_TRAINABLE).
int model_load_gguf(Model *m, const char *path, int flags);
// The same from a GGUF already open (gguf_open_bytes: a buffer, an fd), which m takes over: f is an er_alloc'ed
// GgufFile, kept in m->gguf (the weights use its bytes in place) and freed by model_free, or on failure.
int model_load_gguf_file(Model *m, GgufFile *f, int flags);

#endif
