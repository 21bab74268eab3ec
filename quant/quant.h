// Quantized weight formats beyond the table (quant/weight.h, which also has the layouts): shapes and
// allocation, packing, the products (decode kernels, GEMM path) with their caller-owned scratch, packed
// tensors in model files, and the quantization_config a quantized model dir carries in its config.json.
// The tensor names, dtypes and shapes below are the format table's companion columns.
//
// On disk (safetensors, HF naming): a quantized matrix "X.weight" of shape [rows, cols] is stored as
//   X.weight             q8: I8 [rows, cols]; q4, q4g, q4lut: U8 [rows, (cols+1)/2]; q2lut: U8 [rows, (cols+3)/4]
//   X.weight_scale       q8, q4: F32 [rows]; q4g: F16 [rows, cols/group]
//   X.weight_zero        q4g: F16 [rows, cols/group] (W = u * scale + zero)
//   X.weight_codebook    q2lut: F16 [rows, 4]; q4lut: F16 [rows, 16]
//   X.weight_sparse_cols, X.weight_sparse_values   q2lut / q4lut with "sparse_per_row" S > 0: U16 and F16
//                        [rows, S], the dense-and-sparse corrections (quant/weight.h)
// and config.json holds
//   "quantization_config": {"quant_method": "ertrain", "method": "rtn-lp" | "rtn-minmax" | "kmeans" |
//       "kmeans-fisher" | "kmeans-fisher-gptq" | "kmeans-fisher-qat" | ..., "weights": "q8" | "q4" | "q4g32" | "q4g64" | "q4g128" | "q4lut" | "q2lut",
//       "group_size": 0 | 32 | 64 | 128, "embeddings": "int8" | "q8_0" | "fp", "lm_head": <weights spec> | "fp",
//       "transforms": "none" | "fpt" | "fpt-trained" | ..., "sparse_per_row": 0 | S, "bits_per_weight": 4.5}
// A q2lut whose codebooks are 4 evenly spaced levels (ertrain quantize --weights q2rtn, the 2-bit RTN
// baseline) is stored as "q2lut" with method "rtn-lp" / "rtn-minmax"; "-qat" ends the method of a model
// written by ertrain qat (train/qat.h). Readers need only "weights" (and "sparse_per_row").
// "weights" applies to the seven projections of every layer (a k-quant falls back on matrices whose rows are not
// whole super-blocks, quant_block_fallback); "embeddings" int8 is q8 on the embedding matrix (and on the lm_head
// of a tied model), q8_0 the GGUF block format; "lm_head" applies to an untied lm_head (a tied model's
// config names the embedding's format there). bits_per_weight is that of the layer projections, scales
// included. sparse_per_row (absent = 0) applies to the layer projections, with codebook "weights" only.
// The packed codes are in the 8-byte block layout of quant/weight.h. Tensors are written
// widest dtype first, so every one of them is aligned in the file and used in place (mmapped).
#ifndef QUANT_QUANT_H
#define QUANT_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "core/safetensors.h"
#include "quant/weight.h"

// Checks the dimensions suit the format (Q4G: group >= 2, even, dividing cols; sparse corrections per
// row: 0, or up to cols <= 65536 on a codebook format); ctx names the tensor.
int quant_check_shape(WeightFormat f, int rows, int cols, int group, int sparse, const char *ctx);
// The format a matrix of `cols` columns takes when a config names f: f, or for a k-quant whose super-blocks do not
// divide the rows what llama.cpp's quantizer takes there (q4_k -> q5_0, q5_k -> q5_1, q6_k -> q8_0). Quantizers
// and loaders both ask, so a config's one name gives every matrix its format.
WeightFormat quant_block_fallback(WeightFormat f, int cols);
// "int8" -> WF_Q8, "q8_0" -> WF_Q8_0, "fp" -> WF_F32 (the embeddings of a quantization_config); ER_EINVAL otherwise.
int quant_parse_embeddings(const char *s, WeightFormat *f);
// A new weight owning zeroed buffers for the format (free with weight_free).
int quant_weight_alloc(Weight *w, WeightFormat f, int rows, int cols, int group, int sparse);

// Packing n codes (4-bit: 0..15, 2-bit: 0..3) into ceil(n/2) or ceil(n/4) bytes (padding bits zero).
void quant_pack4(uint8_t *dst, const uint8_t *codes, int n);
void quant_unpack4(uint8_t *codes, const uint8_t *src, int n);
void quant_pack2(uint8_t *dst, const uint8_t *codes, int n);
void quant_unpack2(uint8_t *codes, const uint8_t *src, int n);

// Rows [r0, r0 + nr) as fp32 (nr, cols), rows split across threads.
void quant_dequant_rows(float *dst, const Weight *w, int r0, int nr);

// ---- products ----
//
// Every product takes a scratch of quant_scratch_floats(cols) floats that the caller owns (the
// activations, sized once from the config), so no call allocates: non-fp32 rows are widened to fp32
// there, QUANT_TILE_ROWS at a time, a tile that stays cache-friendly.
#define QUANT_TILE_ROWS 256
size_t quant_scratch_floats(int max_cols);

// out (N, rows) = inp (N, cols) · Wᵀ + bias (rows, may be NULL): the decode kernels for N <= 8 (fp32 weights:
// N <= QUANT_BATCH_MAX_N), else, with QUANT_INT8_PREFILL in flags and a format whose decode kernels take int8
// inputs (q8, q4, q4g, the GGUF block formats), those kernels a few input rows at a time (integer dot products
// on the packed rows: what inference's prefill runs), else the format's GEMM path on fp32 inputs (the exact
// product, whose straight-through gradient training uses and whose log-probs scoring reports).
#define QUANT_INT8_PREFILL 1
int weight_matmul_forward(float *out, const float *inp, const Weight *w, const float *bias, int N, float *scratch,
                          int flags);
// dinp (N, cols) += dout (N, rows) · W: through a frozen weight of any format (a LoRA adapter training on
// a quantized base), tiles of rows dequantized and their share dout[:, tile] · W[tile, :] accumulated.
int weight_matmul_backward_input(float *dinp, const float *dout, const Weight *w, int N, float *scratch);

// Decode-sized products: out (N, rows) = inp (N, cols) · Wᵀ for 1 <= N <= QUANT_DECODE_MAX_N, any
// format, reading the packed weights once for all N rows; rows split across threads. Call outside
// OpenMP regions. Uses the format's SIMD kernel where the CPU's kernel set has one (quant/qkernel.h), else the
// portable path (dequantize rows, then plain dot products), which is the reference and which
// quant_matmul_decode_portable runs always (tests compare the two).
#define QUANT_DECODE_MAX_N 8
// fp32 weights take the decode kernels up to this many rows (quant_matmul_decode accepts them, and
// weight_matmul_forward sends them there): each block of weight rows passes over all the inputs, at most
// QUANT_DECODE_MAX_N at a time, while it is in cache, so the weights are read once per product and each
// output is summed exactly as for one row alone. A row's result is then bitwise the same at every N up to
// this bound, and at these sizes the kernel outruns sgemm. Below the prompt chunk (128 rows), so prefill
// keeps sgemm.
#define QUANT_BATCH_MAX_N 64
// Re-lays a q4, q8, q4g32 or GGUF block-format weight's rows QUANT_TILE at a time (quant/weight.h, quant/blocks.h)
// for the kernels that read them so (the AVX512-VNNI kernels, where the CPU has them; rows a multiple of 16, cols a
// multiple of 64 up to QUANT_TILE_MAX_COLS):
// 1 when tiled, 0 when the kernels or the shape have none such (the weight unchanged), ER_ENOMEM. An
// owned weight is re-laid in its own buffer, another gets one (w->owned). Every product and weight_row_f32
// read a tiled weight as before; model_save refuses one.
int quant_tile(Weight *w);
int quant_matmul_decode(float *out, const float *inp, const Weight *w, int N, float *scratch);
int quant_matmul_decode_portable(float *out, const float *inp, const Weight *w, int N, float *scratch);
// The SIMD kernels this process runs, chosen at the first product from what the CPU has: x86 AVX512-VNNI (with
// AVX-512 F, BW, DQ, VL), else AVX2 + FMA + F16C, else none (the portable path); aarch64 NEON, with the dot-product
// extensions the CPU reports. Any x86-64 build carries both x86 sets (quant/qkernel.h). The environment's
// ER_SIMD=portable|avx2|avx512 (x86) or portable|neon (aarch64) asks for one: one the CPU lacks, or an unknown
// name, gives the portable path.
// 1 when SIMD kernels run.
int quant_has_simd(void);
// Their name: "AVX-512 VNNI", "AVX2", "NEON ..." (the dot-product extensions in use), "portable" (and why, when
// ER_SIMD asked for what the CPU lacks).
const char *quant_simd_name(void);
// The decode kernel of format f (1 <= N <= 8 input rows): out (N, rows) = inp (N, cols) · Wᵀ, the dense part
// (quant_matmul_decode adds the sparse corrections). NULL, or a return of WEIGHT_DECODE_DECLINED for a weight it
// does not take: the portable path (weight_row_f32 + dot).
typedef int (*QuantDecodeFn)(float *out, const float *inp, const Weight *w, int N);
QuantDecodeFn quant_simd_decode(WeightFormat f);
// Row r of w as fp32, bit for bit weight_row_f32's dense part, from the SIMD kernels: 1, or 0 (nothing written)
// where they do not take w.
int quant_dequant_row_simd(float *dst, const Weight *w, int r);

// ---- packed tensors in a model file (naming at the top of this file) ----

// Where quant_packed_load finds a matrix's tensors: find gives the tensor called name (NULL when
// absent) and the path of its file; use checks its values (finite, and >= 0 when nonneg) and gives the
// bytes to point at (in place, or an aligned copy the source keeps).
typedef struct {
    const StTensor *(*find)(void *ctx, const char *name, const char **path);
    int (*use)(void *ctx, const StTensor *t, const char *path, const char *name, int nonneg, const void **data);
    void *ctx;
} QuantTensorSource;

// *w = the (rows, cols) matrix `name` packed as f (group: Q4G's): its data tensor and every companion
// the format table lists, each checked for dtype and shape, sparse columns for range (errors name the
// tensor, the file and what quantization_config implies; dir names the model dir). sparse: corrections
// per row (0: none, their tensors not read).
int quant_packed_load(Weight *w, WeightFormat f, int group, int sparse, int rows, int cols, const char *name,
                      const char *dir, const QuantTensorSource *src);
// The tensors that store packed w under `name`: the data, then its companions (their names go to
// names, WEIGHT_MAX_COMPANIONS x 128 bytes that the caller keeps). Returns the count written to ts.
int quant_packed_tensors(const Weight *w, const char *name, StWriteTensor *ts, char (*names)[128]);
// For messages: t's shape ("3,4"), and expected dims ("d0" for a vector, d1 = 0; else "d0,d1").
void quant_shape_str(char *buf, size_t n, const StTensor *t);
void quant_dims_str(char *buf, size_t n, int64_t d0, int64_t d1);

// ---- quantization_config ----

// The specs are the format table's (quant/weight.c): a quantized format's name, a grouped one's name and group
// size ("q4g32"); today "q8", "q4", "q4g32", "q4g64", "q4g128", "q4lut", "q2lut".
// A spec -> format and group (0 unless grouped).
int quant_parse_spec(const char *s, WeightFormat *f, int *group);
// The spec string of a format ("fp" for the float formats); buf of at least 16 bytes.
const char *quant_spec_name(WeightFormat f, int group, char *buf);
// Every spec, in table order, into buf (n bytes, truncated): joined by sep, the last two by last
// (", " and " or ": "q8, q4, ..., q4lut or q2lut"), for messages and help texts.
const char *quant_spec_list(char *buf, size_t n, const char *sep, const char *last);

typedef struct {
    int enabled;            // config.json had a quantization_config
    WeightFormat linear;    // the seven projections of every layer
    int group;              // Q4G group size of `linear` (and lm_head when Q4G)
    WeightFormat embed;     // embeddings: WF_Q8 ("int8"), WF_Q8_0 ("q8_0", GGUF's int8), WF_F32 ("fp": as stored)
    WeightFormat lm_head;   // untied lm_head; WF_F32 means fp (as stored)
    int mix;                // QUANT_MIX_*: "weights" names a mix of formats (quant_mix_format), linear its base
    int sparse;             // dense-and-sparse corrections per row of `linear` (codebook formats); 0 none
    char method[32];
    char transforms[32];
    double bits_per_weight; // whole model, informative
} QuantConfig;

// The mixes llama.cpp's quantizer makes and GGUF files hold, by the names of its file types: "q4_k_m" and "q5_k_m"
// are q4_k / q5_k with q6_k for the v and down projections of the layers llama.cpp gives more bits (the first and
// last eighth of the layers and every third between) and for an untied lm_head.
enum { QUANT_MIX_NONE, QUANT_MIX_K_M };
// The format of layer `layer` of L's projection when q is a mix: q6_k for v and down (is_v_or_down) in the layers above,
// else q->linear (then quant_block_fallback, as for every format).
WeightFormat quant_mix_format(const QuantConfig *q, int layer, int L, int is_v_or_down);
// 1 when s names a mix ("q4_k_m", "q5_k_m"), its base format (q4_k, q5_k) into *f; 0 otherwise.
int quant_parse_mix(const char *s, WeightFormat *f);

// Reads and validates j (the quantization_config object); ctx names the file.
int quant_config_from_json(QuantConfig *q, const cJSON *j, const char *ctx);
cJSON *quant_config_to_json(const QuantConfig *q); // NULL on ENOMEM

#endif
