// A linear layer's weight: a small struct with a format tag. Model code calls weight_matmul_* and
// never looks inside, so quantized formats plug in here without touching model/.
//
// Quantized layouts (row r, column k; each row packed on its own, padded to whole bytes):
//   WF_Q8    data int8 (rows, cols), W[r,k] = q * scale[r]            q in [-127, 127]
//   WF_Q4    data u8 (rows, (cols+1)/2), code u: W[r,k] = (u - 8) * scale[r]   (per output row)
//   WF_Q4G   data u8 (rows, (cols+1)/2), code u: W[r,k] = u * gscale[r,g] + gzero[r,g], g = k / group
//   WF_Q2LUT data u8 (rows, (cols+3)/4), code i: W[r,k] = lut[r,i]  (a 4-entry codebook per row)
//   WF_Q4LUT data u8 (rows, (cols+1)/2), code i: W[r,k] = lut[r,i]  (a 16-entry codebook per row)
// Codes are laid out for 8-wide SIMD (Q4LUT codes like Q4's): a row is cut into blocks of 8 bytes, and byte i of a block holds
// the elements i, i+8 (4-bit: low nibble, high nibble; a block is 16 elements) or i, i+8, i+16, i+24
// (2-bit: bits 0-1, 2-3, 4-5, 6-7; a block is 32 elements). So widening the 8 bytes to 8 lanes and
// shifting gives 8 consecutive elements per shift. The last cols % 16 (4-bit) or cols % 32 (2-bit)
// elements are packed in order after the blocks: element t of the tail at byte t/2 (low nibble for
// even t) or t/4 (bits 2*(t%4)). quant_code4 / quant_code2 (quant/quant.h) read one code.
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
    WF_Q4LUT, // 4-bit indices into a per-row 16-entry fp16 codebook (non-uniform, SqueezeLLM style)
} WeightFormat;

typedef struct {
    WeightFormat fmt;
    int rows, cols;           // (out, in): HF's [out_features, in_features]
    const void *data;         // F32/BF16/F16: rows * cols elements, row-major (usually mmapped); Q*: packed, see above
    const float *scale;       // Q8, Q4: (rows)
    const uint16_t *gscale;   // Q4G: fp16 (rows, cols / group)
    const uint16_t *gzero;    // Q4G: fp16 (rows, cols / group)
    const uint16_t *lut;      // Q2LUT: fp16 (rows, 4); Q4LUT: fp16 (rows, 16)
    int group;                // Q4G: inputs per group (divides cols)
    void *owned;              // one er_alloc block holding the buffers above, when this Weight owns them
} Weight;

const char *weight_format_name(WeightFormat f); // "f32", "bf16", "f16", "q8", "q4", "q4g", "q2lut", "q4lut"
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
