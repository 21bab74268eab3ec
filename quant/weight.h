// A linear layer's weight: a small struct with a format tag. Model code calls weight_matmul_* and
// never looks inside, so quantized formats plug in here without touching model/.
//
// Quantized layouts (row r, column k; packed rows are padded to whole bytes):
//   WF_Q8    data int8 (rows, cols), W[r,k] = q * scale[r]            q in [-127, 127]
//   WF_Q4    data u8 (rows, (cols+1)/2), nibble u: W[r,k] = (u - 8) * scale[r]   (per output row)
//   WF_Q4G   data u8 (rows, (cols+1)/2), nibble u: W[r,k] = u * gscale[r,g] + gzero[r,g], g = k / group
//   WF_Q2LUT data u8 (rows, (cols+3)/4), 2-bit index i: W[r,k] = lut[r,i]  (a 4-entry codebook per row)
// Nibbles: element k sits in byte k/2, low nibble for even k. 2-bit indices: element k sits in byte
// k/4 at bits 2*(k%4). So a little-endian 32-bit load at element k (k % 8 == 0) holds elements k..k+7
// of a 4-bit row at bits 4j, and a 16-bit load holds elements k..k+7 of a 2-bit row at bits 2j.
// Scales of Q8/Q4 are fp32; Q4G scales/zeros and Q2LUT codebooks are fp16 (the file's bytes, used in place).
#ifndef QUANT_WEIGHT_H
#define QUANT_WEIGHT_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    WF_F32,   // fp32, trainable
    WF_BF16,  // bf16 as stored in the file; dequantized tile by tile
    WF_F16,   // fp16 as stored in the file
    WF_Q8,    // int8 per output row, symmetric
    WF_Q4,    // int4 per output row, symmetric
    WF_Q4G,   // int4 per group of `group` inputs, asymmetric (scale + zero)
    WF_Q2LUT, // 2-bit indices into a per-row 4-entry fp16 codebook
} WeightFormat;

typedef struct {
    WeightFormat fmt;
    int rows, cols;           // (out, in): HF's [out_features, in_features]
    const void *data;         // F32/BF16/F16: rows * cols elements, row-major (usually mmapped); Q*: packed, see above
    const float *scale;       // Q8, Q4: (rows)
    const uint16_t *gscale;   // Q4G: fp16 (rows, cols / group)
    const uint16_t *gzero;    // Q4G: fp16 (rows, cols / group)
    const uint16_t *lut;      // Q2LUT: fp16 (rows, 4)
    int group;                // Q4G: inputs per group (divides cols)
    void *owned;              // one er_alloc block holding the buffers above, when this Weight owns them
} Weight;

const char *weight_format_name(WeightFormat f); // "f32", "bf16", "f16", "q8", "q4", "q4g", "q2lut"
int weight_is_quantized(WeightFormat f);
// Bytes of the whole weight: data plus scales, zeros and codebooks.
size_t weight_bytes(const Weight *w);
// weight_bytes * 8 / (rows * cols).
double weight_bits_per_weight(const Weight *w);
// Frees w->owned (and clears the pointers into it).
void weight_free(Weight *w);

// out (N, rows) = inp (N, cols) · Wᵀ + bias (rows, may be NULL)
int weight_matmul_forward(float *out, const float *inp, const Weight *w, const float *bias, int N);
// dinp (N, cols) += dout (N, rows) · W
int weight_matmul_backward_input(float *dinp, const float *dout, const Weight *w, int N);
// Row r of W as fp32 into dst (cols): embedding lookups.
void weight_row_f32(float *dst, const Weight *w, int r);

#endif
