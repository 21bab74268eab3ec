// A linear layer's weight: a small struct with a format tag, and THE format table. Model code calls
// weight_* and the products of quant/quant.h and never looks inside, so a new format is one entry of
// the table (quant/weight.c) plus its kernels, all in quant/.
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
// even t) or t/4 (bits 2*(t%4)). quant_code4 / quant_code2 read one code.
// The tiled block formats (q8_0 ... q6_K) are laid out as quant/blocks.h says.
// Tiled Q4 and Q8 (tiled = 1, made by quant_tile for the AVX512-VNNI decode kernels): the rows' bytes
// interleaved QUANT_TILE rows at a time. Tile t (rows 16t .. 16t + 15) starts at byte 16t * row_bytes; its
// chunk c (columns 64c .. 64c + 63 of each row: 32 bytes of a Q4 row, 64 of a Q8 row) at 16c * chunk bytes
// in it; bytes 4j .. 4j + 3 of row 16t + i's chunk at 64j + 4i in that. So one 64-byte load gives 4 bytes of
// each of the 16 rows. Q8's bytes are stored plus 128 (unsigned, as vpdpbusd multiplies them). A tiled Q4G
// (group 32) interleaves its group scales and zeros too: group g of row 16t + i at (t * groups + g) * 16 + i.
// Scales of Q8/Q4 are fp32; Q4G scales/zeros and Q2LUT codebooks are fp16 (the file's bytes, used in place).
// Dense-and-sparse (SqueezeLLM, Kim et al., arXiv 2306.07629; the codebook formats): with sparse = S > 0 a
// row also carries S corrections, W[r, sp_cols[r,j]] += sp_vals[r,j] (U16 column, fp16 value; 32 bits
// each), for the few weights the codes would hurt most; they are added after the dense row or product.
#ifndef QUANT_WEIGHT_H
#define QUANT_WEIGHT_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

typedef enum {
    WF_F32,   // fp32, trainable
    WF_BF16,  // bf16 as stored in the file; dequantized tile by tile
    WF_F16,   // fp16 as stored in the file
    WF_Q8,    // int8 per output row, symmetric
    WF_Q4,    // int4 per output row, symmetric
    WF_Q4G,   // int4 per group of `group` inputs, asymmetric (scale + zero)
    WF_Q4LUT, // 4-bit indices into a per-row 16-entry fp16 codebook (non-uniform, SqueezeLLM style)
    WF_Q2LUT, // 2-bit indices into a per-row 4-entry fp16 codebook
    WF_Q8_0,  // the block formats of GGUF files (quant/blocks.h): each block carries its scales
    WF_Q4_0,
    WF_Q4_1,
    WF_Q5_0,
    WF_Q5_1,
    WF_Q4_K,
    WF_Q5_K,
    WF_Q6_K,
    WF_COUNT  // (the order is that of the spec lists in messages, quant_spec_list)
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
    int sparse;               // codebook formats: corrections per row (0: none; see above)
    int tiled;                // Q4, Q8, Q4G, blocks: rows interleaved QUANT_TILE at a time (see above), else 0
    const uint16_t *sp_cols;  // (rows, sparse) columns, each < cols
    const uint16_t *sp_vals;  // fp16 (rows, sparse) values added there
    void *owned;              // one er_alloc block holding the buffers above, when this Weight owns them
} Weight;

// ---- the format table ----

// The shape of a companion tensor of a (rows, cols) matrix.
typedef enum {
    WC_ROWS,   // [rows]
    WC_GROUPS, // [rows, cols / group]
    WC_LEVELS, // [rows, levels]: a codebook per row
    WC_SPARSE, // [rows, sparse]: dense-and-sparse corrections; absent when sparse = 0
} WeightCompanionShape;

// A tensor stored beside the packed data "X.weight", named "X.weight" + suffix.
typedef struct {
    const char *suffix;         // "_scale", "_zero", "_codebook", "_sparse_cols", "_sparse_values"
    const char *what;           // for messages: "scales", "group scales", "group zeros", "codebooks", ...
    ErDType dtype;              // DT_F32, DT_F16 (DT_U16: sparse columns)
    WeightCompanionShape shape;
    size_t field;               // offsetof(Weight, ...): the pointer it fills
    int nonneg;                 // values must be >= 0 (scales; 0 is an all-zero row)
} WeightCompanion;

#define WEIGHT_MAX_COMPANIONS 4
#define WEIGHT_MAX_GROUPS 3
#define WEIGHT_DECODE_DECLINED 1

typedef struct {
    const char *name;           // "f32", "bf16", "f16", "q8", "q4", "q4g", "q4lut", "q2lut", "q8_0", ..., "q6_k"
    int bits;                   // per element of `data` (row bytes: ceil(cols * bits / 8)); 0 for block formats
    int quantized;              // packed codes (frozen: no gradients, no in-place training)
    int levels;                 // codebook formats: entries per row (WC_LEVELS), else 0; only these take sparse
                                // corrections (WC_SPARSE companions)
    ErDType dtype;              // of the data tensor in a file: the float type, or I8 / U8 for packed rows
    int n_comp;
    WeightCompanion comp[WEIGHT_MAX_COMPANIONS];
    // Row r as fp32 (cols), single thread, the dense part only (weight_row_f32 adds the sparse corrections):
    // the reference every kernel is tested against.
    void (*dequant_row)(float *dst, const Weight *w, int r);
    // GEMM path for more rows: 1: sgemm reads `data` in place (fp32); 0: rows are widened to fp32 tile by
    // tile into the caller's scratch, then sgemm.
    int gemm_in_place;
    // Grouped formats: the group sizes a spec may name ("q4g32", quant_parse_spec), 0 ends the list.
    int groups[WEIGHT_MAX_GROUPS];
    // Block formats (quant/blocks.h): elements and bytes per block (row bytes: cols / block * block_bytes;
    // cols a multiple of block); 0 for the others.
    int block, block_bytes;
} WeightFormatInfo;

// The entry of f; NULL outside the enum.
const WeightFormatInfo *weight_format_info(WeightFormat f);
const char *weight_format_name(WeightFormat f); // the entry's name; "?" outside the enum
int weight_is_quantized(WeightFormat f);
// 1 when the format has per-group companions (Weight.group matters: q4g).
int weight_format_grouped(WeightFormat f);
// Bytes of one packed row of `data` (elements * size for the float formats; whole blocks for block formats).
size_t weight_row_bytes(WeightFormat f, int cols);
// 1 when companion c is stored for a weight with `sparse` corrections per row (the sparse ones only then).
static inline int weight_companion_stored(const WeightCompanion *c, int sparse) {
    return c->shape != WC_SPARSE || sparse > 0;
}
// Elements of companion c of a (rows, cols) matrix (group: Q4G's; sparse: corrections per row).
size_t weight_companion_numel(const WeightFormatInfo *fi, const WeightCompanion *c, int rows, int cols, int group,
                              int sparse);
// Bytes of the whole weight: data plus scales, zeros, codebooks and sparse corrections.
size_t weight_bytes(const Weight *w);
// weight_bytes * 8 / (rows * cols).
double weight_bits_per_weight(const Weight *w);
// Row r of W as fp32 into dst (cols): embedding lookups, saving, the portable kernels.
void weight_row_f32(float *dst, const Weight *w, int r);
// dst (cols) += row r's sparse corrections (nothing when w->sparse = 0).
void weight_sparse_add_row(float *dst, const Weight *w, int r);
// Frees w->owned (and clears the pointers into it). Safe on a zeroed Weight.
void weight_free(Weight *w);

#define QUANT_TILE 16
#define QUANT_TILE_MAX_COLS 5120 // the widest rows tiled (the kernels' 8 input rows of int8 codes)
#define QUANT_PACKED_ROW_MAX (QUANT_TILE_MAX_COLS / 32 * 34) // bytes of the widest tiled row (q8_0's)
// Row r's packed bytes: in place, or gathered from a tiled weight into buf (QUANT_PACKED_ROW_MAX bytes).
const uint8_t *weight_packed_row(const Weight *w, int r, uint8_t *buf);
// Q4G: the index of row r's group g in gscale and gzero.
static inline size_t weight_group_index(const Weight *w, int r, int g) {
    size_t ng = (size_t)(w->cols / w->group);
    return w->tiled ? ((size_t)(r / QUANT_TILE) * ng + (size_t)g) * QUANT_TILE + (size_t)(r % QUANT_TILE)
                    : (size_t)r * ng + (size_t)g;
}

// The code of element k of a packed row of n elements (layout above).
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

#endif
