// The block formats of GGUF files, byte for byte ggml's: a row of a matrix is a run of blocks, and each block
// holds its own scales, so a weight in one of them has no companion tensors (its data tensor in a model dir is
// U8 [rows, row bytes], the blocks as a GGUF file holds them). Per block (fp16 values little-endian):
//   WF_Q8_0   34 B per 32:  fp16 d, int8 q[32]                       W[j] = d * q[j]
//   WF_Q4_0   18 B per 32:  fp16 d, u8 qs[16]                        W[j] = d * (u[j] - 8)
//   WF_Q4_1   20 B per 32:  fp16 d, fp16 m, u8 qs[16]                W[j] = d * u[j] + m
//   WF_Q5_0   22 B per 32:  fp16 d, u32 qh, u8 qs[16]                W[j] = d * (u[j] - 16)
//   WF_Q5_1   24 B per 32:  fp16 d, fp16 m, u32 qh, u8 qs[16]        W[j] = d * u[j] + m
//     where u[j] = qs[j] & 15 and u[j + 16] = qs[j] >> 4 for j < 16, plus (q5_0, q5_1) 16 when bit j (bit j + 16)
//     of qh is set
//   WF_Q4_K  144 B per 256: fp16 d, fp16 dmin, 12 B of 6-bit scales and mins, u8 qs[128]
//   WF_Q5_K  176 B per 256: the same, then u8 qh[32], u8 qs[128]
//     eight sub-blocks of 32, sub-block s: W = (d * sc[s]) * u - dmin * m[s]; qs[32 i + l] holds u of elements
//     64 i + l (low nibble) and 64 i + 32 + l (high); q5_K adds 16 where bit 2 i (bit 2 i + 1) of qh[l] is set
//   WF_Q6_K  210 B per 256: u8 ql[128], u8 qh[64], int8 sc[16], fp16 d
//     sixteen sub-blocks of 16: W = (d * sc[s]) * (u - 32), u 6 bits: 4 from ql, 2 from qh (blocks.c)
// The dequantizers compute each value in ggml's order of operations, so they give its bits.
#ifndef QUANT_BLOCKS_H
#define QUANT_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

#include "quant/weight.h"

// 1 for the formats above.
int blocks_format(WeightFormat f);
// Elements and bytes per block, the format table's (0 for the other formats).
int blocks_elems(WeightFormat f);
int blocks_bytes(WeightFormat f);

// The 6-bit scale and min of sub-block j (0..7) from the 12 scale bytes q of a q4_K / q5_K block (ggml's layout).
static inline void blocks_k_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 15) | (q[j - 4] >> 6) << 4;
        *m = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
    }
}

// Tiled blocks (quant_tile lays them out so for the AVX512-VNNI decode kernels): the rows 16 at a time, and block g of
// those 16 rows side by side in 16 * blocks_bytes bytes. Each part of the block above (its fp16 scales, its scale
// bytes, its codes) that starts at byte o of a block starts at byte 16 o there, the 16 rows' copies interleaved:
//   fp16 d, m, dmin: row r's at 2r;  the k-quants' scale bytes: byte s of row r at 16s + r;
//   codes (q, qs, ql, the k-quants' qh): dword t of row r at 64t + 4r, so one 64-byte load gives 4 bytes of each
//   of the 16 rows, one row per int32 lane; q8_0's bytes plus 128 (unsigned, as vpdpbusd multiplies them);
//   q5_0 / q5_1's u32 qh: row r's at 4r, bit 4t + b of the file's at 8b + t (t < 8, b < 4), so that shifted by
//   4 - t the high bits of elements 4t .. 4t + 3 land on bit 4 of their code bytes.
// The same bytes as the file's blocks, in another order.
// Block g of the 16 rows at blk[0..15] (each pointing at its row's block g) into the tiled bytes tb.
void blocks_tile(uint8_t *tb, const uint8_t *const blk[16], WeightFormat f);
// Row i's block back from the tiled bytes tb, byte for byte what blocks_tile read.
void blocks_untile(uint8_t *blk, const uint8_t *tb, int i, WeightFormat f);

// The row (cols elements, a multiple of blocks_elems) of packed blocks as fp32.
void blocks_dequant_row(WeightFormat f, float *dst, const uint8_t *row, int cols);
// The first of nblocks blocks whose fp16 scales hold a NaN or infinity; nblocks when none does.
size_t blocks_find_nonfinite(WeightFormat f, const uint8_t *data, size_t nblocks);
// x (cols) rounded into packed blocks: per block (sub-block) scale and min from the values' extremes as
// ggml's reference quantizers take them, the k-quants' sub-block scales rounded to their 6- or 8-bit grid
// before the codes are chosen, so the codes are those nearest under the stored scales. imp (cols, or NULL): the
// inputs' importances (Fisher's, from calibration); with them each block's (sub-block's) scale search keeps the
// least importance-weighted squared error (blocks.c), the 32-blocks trying shrunk scales and clipped ranges too.
void blocks_quantize_row(WeightFormat f, uint8_t *dst, const float *x, const float *imp, int cols);

#endif
