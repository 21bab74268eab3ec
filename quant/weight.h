// A linear layer's weight: a small struct with a format tag. Model code calls weight_matmul_* and
// never looks inside, so quantized formats plug in here without touching model/.
#ifndef QUANT_WEIGHT_H
#define QUANT_WEIGHT_H

#include <stddef.h>

typedef enum {
    WF_F32,  // fp32, trainable
    WF_BF16, // bf16 as stored in the file; dequantized tile by tile
    WF_F16,  // fp16 as stored in the file
} WeightFormat;

typedef struct {
    WeightFormat fmt;
    int rows, cols;   // (out, in): HF's [out_features, in_features]
    const void *data; // rows * cols elements of fmt, row-major (usually mmapped)
} Weight;

const char *weight_format_name(WeightFormat f);
size_t weight_bytes(const Weight *w);

// out (N, rows) = inp (N, cols) · Wᵀ + bias (rows, may be NULL)
int weight_matmul_forward(float *out, const float *inp, const Weight *w, const float *bias, int N);
// dinp (N, cols) += dout (N, rows) · W
int weight_matmul_backward_input(float *dinp, const float *dout, const Weight *w, int N);
// Row r of W as fp32 into dst (cols): embedding lookups.
void weight_row_f32(float *dst, const Weight *w, int r);

#endif
