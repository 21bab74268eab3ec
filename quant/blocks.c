// The GGUF block formats (layouts in quant/blocks.h): reference dequantizers in ggml's order of operations,
// the scale check, and round-to-nearest quantizers.
#include "quant/blocks.h"

#include <math.h>
#include <string.h>

#include "core/dtype.h"

// Where each block keeps its fp16 scales (byte offsets; -1: none).
static const struct {
    WeightFormat f;
    int scale_at[2];
} SCALES[] = {
    {WF_Q8_0, {0, -1}}, {WF_Q4_0, {0, -1}}, {WF_Q4_1, {0, 2}}, {WF_Q5_0, {0, -1}},
    {WF_Q5_1, {0, 2}},  {WF_Q4_K, {0, 2}},  {WF_Q5_K, {0, 2}}, {WF_Q6_K, {208, -1}},
};

int blocks_elems(WeightFormat f) { return weight_format_info(f) ? weight_format_info(f)->block : 0; }
int blocks_bytes(WeightFormat f) { return weight_format_info(f) ? weight_format_info(f)->block_bytes : 0; }
int blocks_format(WeightFormat f) { return blocks_elems(f) > 0; }

static float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return f16_to_f32(h);
}

size_t blocks_find_nonfinite(WeightFormat f, const uint8_t *data, size_t nblocks) {
    for (size_t i = 0; i < sizeof SCALES / sizeof SCALES[0]; i++)
        for (size_t b = 0; SCALES[i].f == f && b < nblocks; b++)
            for (int s = 0; s < 2; s++)
                if (SCALES[i].scale_at[s] >= 0 &&
                    !isfinite(half_at(data + b * (size_t)blocks_bytes(f) + (size_t)SCALES[i].scale_at[s])))
                    return b;
    return nblocks;
}

// ---- dequantization, one block each (y: the block's elements) ----

static void dq_q8_0(float *y, const uint8_t *s) {
    float d = half_at(s);
    for (int j = 0; j < 32; j++)
        y[j] = (float)(int8_t)s[2 + j] * d;
}

// q4_0, q4_1, q5_0, q5_1: qh NULL for q4_0 and q4_1; offset 8 for q4_0, 16 for q5_0 (then m unused).
static void dq_32(float *y, float d, float m, const uint8_t *qs, const uint8_t *qh, int offset) {
    uint32_t h = 0;
    if (qh)
        memcpy(&h, qh, 4);
    for (int j = 0; j < 16; j++) {
        int x0 = (qs[j] & 15) | (int)((h >> j) << 4 & 16), x1 = (qs[j] >> 4) | (int)((h >> (j + 12)) & 16);
        if (offset) {
            y[j] = (float)(x0 - offset) * d;
            y[j + 16] = (float)(x1 - offset) * d;
        } else {
            y[j] = (float)x0 * d + m;
            y[j + 16] = (float)x1 * d + m;
        }
    }
}

// q4_K (qh NULL) and q5_K.
static void dq_k45(float *y, const uint8_t *s, int five) {
    float d = half_at(s), dmin = half_at(s + 2);
    const uint8_t *sc = s + 4, *qh = five ? s + 16 : NULL, *q = s + (five ? 48 : 16);
    for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
        int a, m;
        blocks_k_scale_min(is, sc, &a, &m);
        float d1 = d * (float)a, m1 = dmin * (float)m;
        blocks_k_scale_min(is + 1, sc, &a, &m);
        float d2 = d * (float)a, m2 = dmin * (float)m;
        for (int l = 0; l < 32; l++) {
            int h1 = qh && (qh[l] >> is & 1) ? 16 : 0, h2 = qh && (qh[l] >> (is + 1) & 1) ? 16 : 0;
            y[j + l] = d1 * (float)((q[l] & 15) + h1) - m1;
            y[j + 32 + l] = d2 * (float)((q[l] >> 4) + h2) - m2;
        }
    }
}

static void dq_q6_k(float *y, const uint8_t *s) {
    const uint8_t *ql = s, *qh = s + 128;
    const int8_t *sc = (const int8_t *)(s + 192);
    float d = half_at(s + 208);
    for (int n = 0; n < 256; n += 128, y += 128, ql += 64, qh += 32, sc += 8)
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            y[l] = d * (float)sc[is] * (float)((int)((ql[l] & 15) | (qh[l] & 3) << 4) - 32);
            y[l + 32] = d * (float)sc[is + 2] * (float)((int)((ql[l + 32] & 15) | (qh[l] >> 2 & 3) << 4) - 32);
            y[l + 64] = d * (float)sc[is + 4] * (float)((int)((ql[l] >> 4) | (qh[l] >> 4 & 3) << 4) - 32);
            y[l + 96] = d * (float)sc[is + 6] * (float)((int)((ql[l + 32] >> 4) | (qh[l] >> 6 & 3) << 4) - 32);
        }
}

// ---- tiled blocks (blocks.h) ----

// The parts of a block, in the file's order: where each starts and how many bytes it has, and how the 16 rows'
// copies interleave in the tiled bytes (at 16 times its start).
typedef enum {
    PART_HALF,   // an fp16 scale: row r's at 2r
    PART_BYTES,  // a byte array: byte s of row r at 16s + r
    PART_DWORDS, // codes: dword t of row r at 64t + 4r
    PART_Q8,     // q8_0's codes: as PART_DWORDS, each byte plus 128
    PART_QH5,    // q5_0 / q5_1's u32 qh: row r's at 4r, bit 4t + b moved to 8b + t
} PartKind;

typedef struct {
    int at, bytes;
    PartKind kind;
} BlockPart;

#define MAX_PARTS 5

// f's parts; their count.
static int block_parts(WeightFormat f, BlockPart p[MAX_PARTS]) {
    switch (f) {
    case WF_Q8_0: p[0] = (BlockPart){0, 2, PART_HALF}, p[1] = (BlockPart){2, 32, PART_Q8}; return 2;
    case WF_Q4_0: p[0] = (BlockPart){0, 2, PART_HALF}, p[1] = (BlockPart){2, 16, PART_DWORDS}; return 2;
    case WF_Q4_1:
        p[0] = (BlockPart){0, 2, PART_HALF}, p[1] = (BlockPart){2, 2, PART_HALF}, p[2] = (BlockPart){4, 16, PART_DWORDS};
        return 3;
    case WF_Q5_0:
        p[0] = (BlockPart){0, 2, PART_HALF}, p[1] = (BlockPart){2, 4, PART_QH5}, p[2] = (BlockPart){6, 16, PART_DWORDS};
        return 3;
    case WF_Q5_1:
        p[0] = (BlockPart){0, 2, PART_HALF}, p[1] = (BlockPart){2, 2, PART_HALF}, p[2] = (BlockPart){4, 4, PART_QH5};
        p[3] = (BlockPart){8, 16, PART_DWORDS};
        return 4;
    case WF_Q4_K:
        p[0] = (BlockPart){0, 2, PART_HALF}, p[1] = (BlockPart){2, 2, PART_HALF}, p[2] = (BlockPart){4, 12, PART_BYTES};
        p[3] = (BlockPart){16, 128, PART_DWORDS};
        return 4;
    case WF_Q5_K:
        p[0] = (BlockPart){0, 2, PART_HALF}, p[1] = (BlockPart){2, 2, PART_HALF}, p[2] = (BlockPart){4, 12, PART_BYTES};
        p[3] = (BlockPart){16, 32, PART_DWORDS}, p[4] = (BlockPart){48, 128, PART_DWORDS};
        return 5;
    case WF_Q6_K:
        p[0] = (BlockPart){0, 128, PART_DWORDS}, p[1] = (BlockPart){128, 64, PART_DWORDS};
        p[2] = (BlockPart){192, 16, PART_BYTES}, p[3] = (BlockPart){208, 2, PART_HALF};
        return 4;
    default: return 0;
    }
}

// The 32 bits of h as a rows x cols bit matrix (bit cols * i + j), transposed (bit rows * j + i): (8, 4) takes a q5
// block's qh bit 4t + b to 8b + t (blocks.h), (4, 8) back.
static uint32_t transpose_bits(uint32_t h, int rows, int cols) {
    uint32_t o = 0;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++)
            o |= ((h >> (cols * i + j)) & 1u) << (rows * j + i);
    return o;
}

// Part p of row r's block into the tiled bytes tb.
static void tile_part(uint8_t *tb, const uint8_t *blk, int r, const BlockPart *p) {
    uint8_t *t = tb + 16 * p->at;
    const uint8_t *b = blk + p->at;
    uint32_t v, flip = p->kind == PART_Q8 ? 0x80808080u : 0;
    switch (p->kind) {
    case PART_HALF: memcpy(t + 2 * r, b, 2); break;
    case PART_BYTES:
        for (int s = 0; s < p->bytes; s++)
            t[16 * s + r] = b[s];
        break;
    case PART_QH5:
        memcpy(&v, b, 4);
        v = transpose_bits(v, 8, 4);
        memcpy(t + 4 * r, &v, 4);
        break;
    default: // PART_DWORDS, PART_Q8
        for (int d = 0; d < p->bytes / 4; d++) {
            memcpy(&v, b + 4 * d, 4);
            v ^= flip;
            memcpy(t + 64 * d + 4 * r, &v, 4);
        }
    }
}

// Part p of row r's block back from the tiled bytes tb.
static void untile_part(uint8_t *blk, const uint8_t *tb, int r, const BlockPart *p) {
    const uint8_t *t = tb + 16 * p->at;
    uint8_t *b = blk + p->at;
    uint32_t v, flip = p->kind == PART_Q8 ? 0x80808080u : 0;
    switch (p->kind) {
    case PART_HALF: memcpy(b, t + 2 * r, 2); break;
    case PART_BYTES:
        for (int s = 0; s < p->bytes; s++)
            b[s] = t[16 * s + r];
        break;
    case PART_QH5:
        memcpy(&v, t + 4 * r, 4);
        v = transpose_bits(v, 4, 8);
        memcpy(b, &v, 4);
        break;
    default:
        for (int d = 0; d < p->bytes / 4; d++) {
            memcpy(&v, t + 64 * d + 4 * r, 4);
            v ^= flip;
            memcpy(b + 4 * d, &v, 4);
        }
    }
}

void blocks_tile(uint8_t *tb, const uint8_t *const blk[16], WeightFormat f) {
    BlockPart p[MAX_PARTS];
    int np = block_parts(f, p);
    for (int r = 0; r < 16; r++)
        for (int i = 0; i < np; i++)
            tile_part(tb, blk[r], r, &p[i]);
}

void blocks_untile(uint8_t *blk, const uint8_t *tb, int r, WeightFormat f) {
    BlockPart p[MAX_PARTS];
    int np = block_parts(f, p);
    for (int i = 0; i < np; i++)
        untile_part(blk, tb, r, &p[i]);
}

void blocks_dequant_row(WeightFormat f, float *dst, const uint8_t *row, int cols) {
    int E = blocks_elems(f), B = blocks_bytes(f);
    for (int b = 0; b < cols / E; b++, dst += E, row += B)
        switch (f) {
        case WF_Q8_0: dq_q8_0(dst, row); break;
        case WF_Q4_0: dq_32(dst, half_at(row), 0.0f, row + 2, NULL, 8); break;
        case WF_Q4_1: dq_32(dst, half_at(row), half_at(row + 2), row + 4, NULL, 0); break;
        case WF_Q5_0: dq_32(dst, half_at(row), 0.0f, row + 6, row + 2, 16); break;
        case WF_Q5_1: dq_32(dst, half_at(row), half_at(row + 2), row + 8, row + 4, 0); break;
        case WF_Q4_K: dq_k45(dst, row, 0); break;
        case WF_Q5_K: dq_k45(dst, row, 1); break;
        case WF_Q6_K: dq_q6_k(dst, row); break;
        default: break;
        }
}

// ---- quantization ----

static void put_half(uint8_t *p, float v) {
    uint16_t h = f32_to_f16(v);
    memcpy(p, &h, 2);
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

// The importance-weighted squared error of n values x rounded to u in [0, nmax] under W = d * u - m (imp NULL: all 1).
static double affine_sse(const float *x, const float *imp, int n, float d, float m, int nmax) {
    double e = 0;
    for (int l = 0; l < n; l++) {
        int u = d != 0.0f ? clampi((int)lrintf((x[l] + m) / d), 0, nmax) : 0;
        double r = (double)d * u - m - x[l];
        e += (imp ? imp[l] : 1.0) * r * r;
    }
    return e;
}

// With importances (imp != NULL) the 32-blocks try their scale (and min) shrunk by up to 10% (the range clipped at
// either end by up to 30%) and keep the least weighted error under the stored fp16 values; the first candidate is
// the one taken without importances, so a weighted block is never worse than it on the weighted error.
#define Q32_TRIES 11

// v as its stored fp16 reads back.
static float half_round(float v) { return f16_to_f32(f32_to_f16(v)); }

// q8_0: d = max|x| / 127 (times the candidate), codes rounded to nearest.
static int q8_code(float x, float d) { return clampi((int)roundf(x * (d != 0.0f ? 1.0f / d : 0.0f)), -127, 127); }

static void q_q8_0(uint8_t *s, const float *x, const float *imp) {
    float amax = 0, bd = 0;
    for (int j = 0; j < 32; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    double best = -1;
    for (int i = 0; i < (imp ? Q32_TRIES : 1); i++) {
        float d = amax / 127.0f * (1.0f - 0.01f * (float)i), ds = half_round(d);
        double e = 0;
        for (int j = 0; j < 32; j++) {
            double r = (double)ds * q8_code(x[j], d) - x[j];
            e += (imp ? imp[j] : 1.0) * r * r;
        }
        if (best < 0 || e < best) {
            best = e;
            bd = d;
        }
    }
    put_half(s, bd);
    for (int j = 0; j < 32; j++)
        s[2 + j] = (uint8_t)(int8_t)q8_code(x[j], bd);
}

// The codes u of a 32-block under scale d and min m (sym: q4_0's W = d * (u - 8), q5_0's d * (u - 16), m unused).
static void q32_codes(uint8_t *u, const float *x, float d, float m, int nmax, int sym) {
    float id = d != 0.0f ? 1.0f / d : 0.0f, half = (float)(nmax + 1) / 2.0f + 0.5f; // 8.5 (q4_0), 16.5 (q5_0)
    for (int j = 0; j < 32; j++)
        u[j] = (uint8_t)(sym ? clampi((int)(int8_t)(x[j] * id + half), 0, nmax)
                             : clampi((int)((x[j] - m) * id + 0.5f), 0, nmax));
}

// q4_0 (bits 4, symmetric), q4_1 (bits 4), q5_0 (bits 5, symmetric), q5_1 (bits 5).
static void q_32(uint8_t *s, const float *x, const float *imp, int bits, int sym) {
    int nmax = (1 << bits) - 1, off = 1 << (bits - 1); // off: the symmetric formats' zero code
    uint8_t u[32];
    float amax = 0, max = 0, lo = x[0], hi = x[0], bd = 0, bm = 0;
    for (int j = 0; j < 32; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
        lo = fminf(lo, x[j]);
        hi = fmaxf(hi, x[j]);
    }
    double best = -1;
    for (int i = 0; i < (imp ? (sym ? Q32_TRIES : 2 * Q32_TRIES - 1) : 1); i++) {
        float d, m = 0;
        if (sym) { // the value of largest magnitude maps to code 0: d = max / -8 (q4_0), max / -16 (q5_0)
            d = max / -(float)off * (1.0f - 0.01f * (float)i);
        } else { // [lo, hi], then [lo, c hi] and [c lo, hi] for c = 0.97, 0.94, ...
            float c = 1.0f - 0.03f * (float)((i + 1) / 2), l = i % 2 ? lo : c * lo, h = i % 2 ? c * hi : hi;
            d = (h - l) / (float)nmax;
            m = l;
        }
        double e = 0;
        if (imp) {
            float ds = half_round(d), ms = sym ? -(float)off * ds : half_round(m);
            q32_codes(u, x, d, m, nmax, sym);
            for (int j = 0; j < 32; j++) {
                double r = (double)ds * u[j] + ms - x[j];
                e += imp[j] * r * r;
            }
        }
        if (best < 0 || e < best) {
            best = e;
            bd = d;
            bm = m;
        }
    }
    put_half(s, bd);
    if (!sym)
        put_half(s + 2, bm);
    q32_codes(u, x, bd, bm, nmax, sym);
    uint8_t *qh = s + (sym ? 2 : 4), *qs = qh + (bits == 5 ? 4 : 0); // after d (and m), then qh (q5)
    uint32_t h = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((u[j] & 15) | (u[j + 16] & 15) << 4);
        h |= (uint32_t)(u[j] >> 4 & 1) << j | (uint32_t)(u[j + 16] >> 4 & 1) << (j + 16);
    }
    if (bits == 5)
        memcpy(qh, &h, 4);
}

// Of the ranges [lo, c * hi] and [c * lo, hi] (c from 1 down to 0.7, lo <= 0), the scale and min whose codes
// leave the least (importance-weighted) squared error: clipping the extremes pays where the rest of the sub-block is
// dense.
static void affine_search(const float *x, const float *imp, int n, int nmax, float lo, float hi, float *scale,
                          float *minv) {
    double best = -1;
    for (int i = 0; i <= 12; i++)
        for (int side = 0; side < 2; side++) {
            float c = 1.0f - 0.025f * (float)i, l = side ? c * lo : lo, h = side ? hi : c * hi;
            float d = (h - l) / (float)nmax;
            double e = affine_sse(x, imp, n, d, -l, nmax);
            if (best < 0 || e < best) {
                best = e;
                *scale = d;
                *minv = -l;
            }
        }
}

// q4_K (five 0) and q5_K: per sub-block of 32 the scale and min (min <= 0) of a clipped range (affine_search),
// both on a 6-bit grid of the super-block's d and dmin, then the codes nearest under the stored values.
static void q_k45(uint8_t *s, const float *x, const float *imp, int five) {
    int nmax = five ? 31 : 15;
    float scale[8], minv[8], maxs = 0, maxm = 0;
    for (int j = 0; j < 8; j++) {
        float lo = fminf(x[32 * j], 0.0f), hi = x[32 * j];
        for (int l = 0; l < 32; l++) {
            lo = fminf(lo, x[32 * j + l]);
            hi = fmaxf(hi, x[32 * j + l]);
        }
        affine_search(x + 32 * j, imp ? imp + 32 * j : NULL, 32, nmax, lo, hi, &scale[j], &minv[j]);
        maxs = fmaxf(maxs, scale[j]);
        maxm = fmaxf(maxm, minv[j]);
    }
    float is = maxs > 0 ? 63.0f / maxs : 0.0f, im = maxm > 0 ? 63.0f / maxm : 0.0f;
    uint8_t *sc = s + 4, L[256];
    memset(sc, 0, 12);
    for (int j = 0; j < 8; j++) {
        int ls = clampi((int)lrintf(is * scale[j]), 0, 63), lm = clampi((int)lrintf(im * minv[j]), 0, 63);
        if (j < 4) {
            sc[j] = (uint8_t)ls;
            sc[j + 4] = (uint8_t)lm;
        } else {
            sc[j + 4] = (uint8_t)((ls & 15) | (lm & 15) << 4);
            sc[j - 4] |= (uint8_t)((ls >> 4) << 6);
            sc[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    put_half(s, maxs / 63.0f);
    put_half(s + 2, maxm / 63.0f);
    float d = half_at(s), dmin = half_at(s + 2);
    for (int j = 0; j < 8; j++) {
        int a, m;
        blocks_k_scale_min(j, sc, &a, &m);
        float dl = d * (float)a, ml = dmin * (float)m;
        for (int l = 0; l < 32; l++)
            L[32 * j + l] = (uint8_t)(dl != 0.0f ? clampi((int)lrintf((x[32 * j + l] + ml) / dl), 0, nmax) : 0);
    }
    uint8_t *qh = s + 16, *q = s + (five ? 48 : 16);
    if (five)
        memset(qh, 0, 32);
    for (int n = 0, sh = 0; n < 256; n += 64, q += 32, sh += 2)
        for (int l = 0; l < 32; l++) {
            int l1 = L[n + l], l2 = L[n + l + 32];
            if (five) {
                qh[l] |= (uint8_t)((l1 >> 4) << sh | (l2 >> 4) << (sh + 1));
                l1 &= 15;
                l2 &= 15;
            }
            q[l] = (uint8_t)(l1 | l2 << 4);
        }
}

// q6_K: per sub-block of 16 the signed scale that maps its value of largest magnitude to -32 times c (c from 1
// down to 0.8, the least squared error), the sixteen on an 8-bit grid of the super-block's d.
static void q_q6_k(uint8_t *s, const float *x, const float *imp) {
    float scale[16], maxs = 0, amaxs = 0;
    for (int j = 0; j < 16; j++) {
        float amax = 0, max = 0;
        for (int l = 0; l < 16; l++)
            if (amax < fabsf(x[16 * j + l])) {
                amax = fabsf(x[16 * j + l]);
                max = x[16 * j + l];
            }
        double best = -1;
        for (int i = 0; i <= 8; i++) {
            float d = max / -32.0f * (1.0f - 0.025f * (float)i);
            double e = affine_sse(x + 16 * j, imp ? imp + 16 * j : NULL, 16, d, 32.0f * d, 63);
            if (best < 0 || e < best) {
                best = e;
                scale[j] = d;
            }
        }
        if (fabsf(scale[j]) > amaxs) {
            amaxs = fabsf(scale[j]);
            maxs = scale[j];
        }
    }
    int8_t *sc = (int8_t *)(s + 192);
    uint8_t L[256];
    if (amaxs == 0.0f) {
        memset(s, 0, 210);
        return;
    }
    float iscale = -128.0f / maxs;
    put_half(s + 208, 1.0f / iscale);
    float d = half_at(s + 208);
    for (int j = 0; j < 16; j++) {
        sc[j] = (int8_t)clampi((int)lrintf(iscale * scale[j]), -128, 127);
        float dl = d * (float)sc[j];
        for (int l = 0; l < 16; l++)
            L[16 * j + l] = (uint8_t)(dl != 0.0f ? clampi((int)lrintf(x[16 * j + l] / dl), -32, 31) + 32 : 32);
    }
    uint8_t *ql = s, *qh = s + 128;
    for (int j = 0; j < 256; j += 128, ql += 64, qh += 32)
        for (int l = 0; l < 32; l++) {
            ql[l] = (uint8_t)((L[j + l] & 15) | (L[j + l + 64] & 15) << 4);
            ql[l + 32] = (uint8_t)((L[j + l + 32] & 15) | (L[j + l + 96] & 15) << 4);
            qh[l] = (uint8_t)(L[j + l] >> 4 | (L[j + l + 32] >> 4) << 2 | (L[j + l + 64] >> 4) << 4 |
                              (L[j + l + 96] >> 4) << 6);
        }
}

void blocks_quantize_row(WeightFormat f, uint8_t *dst, const float *x, const float *imp, int cols) {
    int E = blocks_elems(f), B = blocks_bytes(f);
    for (int b = 0; b < cols / E; b++, dst += B, x += E, imp = imp ? imp + E : NULL)
        switch (f) {
        case WF_Q8_0: q_q8_0(dst, x, imp); break;
        case WF_Q4_0: q_32(dst, x, imp, 4, 1); break;
        case WF_Q4_1: q_32(dst, x, imp, 4, 0); break;
        case WF_Q5_0: q_32(dst, x, imp, 5, 1); break;
        case WF_Q5_1: q_32(dst, x, imp, 5, 0); break;
        case WF_Q4_K: q_k45(dst, x, imp, 0); break;
        case WF_Q5_K: q_k45(dst, x, imp, 1); break;
        case WF_Q6_K: q_q6_k(dst, x, imp); break;
        default: break;
        }
}
