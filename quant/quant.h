// Quantized weight formats (layouts in quant/weight.h): sizes, packing, dequantization, the decode
// kernels, and the quantization_config a quantized model dir carries in its config.json.
//
// On disk (safetensors, HF naming): a quantized matrix "X.weight" of shape [rows, cols] is stored as
//   X.weight             q8: I8 [rows, cols]; q4, q4g, q4lut: U8 [rows, (cols+1)/2]; q2lut: U8 [rows, (cols+3)/4]
//   X.weight_scale       q8, q4: F32 [rows]; q4g: F16 [rows, cols/group]
//   X.weight_zero        q4g: F16 [rows, cols/group] (W = u * scale + zero)
//   X.weight_codebook    q2lut: F16 [rows, 4]; q4lut: F16 [rows, 16]
// and config.json holds
//   "quantization_config": {"quant_method": "ertrain", "method": "rtn-lp" | "rtn-minmax" | "kmeans" |
//       "kmeans-fisher" | "kmeans-qat" | ..., "weights": "q8" | "q4" | "q4g32" | "q4g64" | "q4g128" | "q4lut" | "q2lut",
//       "group_size": 0 | 32 | 64 | 128, "embeddings": "int8" | "fp", "lm_head": <weights spec> | "fp",
//       "transforms": "none" | ..., "bits_per_weight": 4.5}
// A q2lut whose codebooks are 4 evenly spaced levels (ertrain quantize --weights q2rtn, the 2-bit RTN
// baseline) is stored as "q2lut" with method "rtn-lp" / "rtn-minmax"; "-qat" ends the method of a model
// written by ertrain qat (train/qat.h). Readers need only "weights".
// "weights" applies to the seven projections of every layer; "embeddings" int8 is q8 on the embedding
// matrix (and on the lm_head of a tied model); "lm_head" applies to an untied lm_head (a tied model's
// config names the embedding's format there). bits_per_weight is that of the layer projections, scales
// included. The packed codes are in the 8-byte block layout of quant/weight.h. Tensors are written
// widest dtype first, so every one of them is aligned in the file and used in place (mmapped).
#ifndef QUANT_QUANT_H
#define QUANT_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "quant/weight.h"

// Bytes of one packed row of `data` (elements * size for the float formats).
size_t quant_row_bytes(WeightFormat f, int cols);
// Checks the dimensions suit the format (Q4G: group >= 2, even, dividing cols); ctx names the tensor.
int quant_check_shape(WeightFormat f, int rows, int cols, int group, const char *ctx);
// A new weight owning zeroed buffers for the format (free with weight_free).
int quant_weight_alloc(Weight *w, WeightFormat f, int rows, int cols, int group);

// The code of element k of a packed row of n elements (layout in quant/weight.h).
static inline unsigned quant_code4(const uint8_t *row, int n, int k) {
    int full = n & ~15;
    if (k < full)
        return (row[(k >> 4) * 8 + (k & 7)] >> ((k & 8) >> 1)) & 15;
    int t = k - full;
    return (row[full / 2 + (t >> 1)] >> ((t & 1) * 4)) & 15;
}
static inline unsigned quant_code2(const uint8_t *row, int n, int k) {
    int full = n & ~31;
    if (k < full)
        return (row[(k >> 5) * 8 + (k & 7)] >> (((k >> 3) & 3) * 2)) & 3;
    int t = k - full;
    return (row[full / 4 + (t >> 2)] >> ((t & 3) * 2)) & 3;
}

// Packing n codes (4-bit: 0..15, 2-bit: 0..3) into ceil(n/2) or ceil(n/4) bytes (padding bits zero).
void quant_pack4(uint8_t *dst, const uint8_t *codes, int n);
void quant_unpack4(uint8_t *codes, const uint8_t *src, int n);
void quant_pack2(uint8_t *dst, const uint8_t *codes, int n);
void quant_unpack2(uint8_t *codes, const uint8_t *src, int n);

// Row r of any format as fp32 (cols) (single thread).
void quant_dequant_row(float *dst, const Weight *w, int r);
// Rows [r0, r0 + nr) as fp32 (nr, cols), rows split across threads.
void quant_dequant_rows(float *dst, const Weight *w, int r0, int nr);

// Decode-sized products: out (N, rows) = inp (N, cols) · Wᵀ for 1 <= N <= QUANT_DECODE_MAX_N, any
// format, reading the packed weights once for all N rows; rows split across threads. Call outside
// OpenMP regions. Uses AVX2+FMA kernels where the build has them, else the portable path (dequantize a
// row, then plain dot products), which is the reference.
#define QUANT_DECODE_MAX_N 8
int quant_matmul_decode(float *out, const float *inp, const Weight *w, int N);
// 1: always use the portable path (tests compare the two). Returns the previous setting.
int quant_force_portable(int on);
// 1 when this build has the SIMD decode kernels.
int quant_has_simd(void);

// ---- quantization_config ----

// "q8", "q4", "q4g32", "q4g64", "q4g128", "q4lut", "q2lut" -> format and group (0 unless Q4G).
int quant_parse_spec(const char *s, WeightFormat *f, int *group);
// The spec string of a format ("fp" for the float formats); buf of at least 16 bytes.
const char *quant_spec_name(WeightFormat f, int group, char *buf);

typedef struct {
    int enabled;            // config.json had a quantization_config
    WeightFormat linear;    // the seven projections of every layer
    int group;              // Q4G group size of `linear` (and lm_head when Q4G)
    int embed_int8;         // embeddings: 1 int8 (WF_Q8), 0 fp (as stored)
    WeightFormat lm_head;   // untied lm_head; WF_F32 means fp (as stored)
    char method[32];
    char transforms[32];
    double bits_per_weight; // whole model, informative
} QuantConfig;

// Reads and validates j (the quantization_config object); ctx names the file.
int quant_config_from_json(QuantConfig *q, const cJSON *j, const char *ctx);
cJSON *quant_config_to_json(const QuantConfig *q); // NULL on ENOMEM

#endif
