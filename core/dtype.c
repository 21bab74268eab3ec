#include "core/dtype.h"

#include <math.h>
#include <string.h>

#include "core/error.h"

// safetensors data is little-endian and is read here with plain loads.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "core/dtype.c assumes a little-endian host"
#endif

static const struct {
    const char *name;
    size_t size;
} dtype_info[DT_COUNT] = {
    [DT_F32] = {"F32", 4},   [DT_F16] = {"F16", 2},   [DT_BF16] = {"BF16", 2},
    [DT_I8] = {"I8", 1},     [DT_U8] = {"U8", 1},     [DT_I32] = {"I32", 4},
    [DT_F64] = {"F64", 8},   [DT_I16] = {"I16", 2},   [DT_U16] = {"U16", 2},
    [DT_U32] = {"U32", 4},   [DT_I64] = {"I64", 8},   [DT_U64] = {"U64", 8},
    [DT_BOOL] = {"BOOL", 1}, [DT_F8_E4M3] = {"F8_E4M3", 1}, [DT_F8_E5M2] = {"F8_E5M2", 1},
};

size_t dtype_size(ErDType t) { return (unsigned)t < DT_COUNT ? dtype_info[t].size : 0; }

const char *dtype_name(ErDType t) { return (unsigned)t < DT_COUNT ? dtype_info[t].name : "?"; }

int dtype_from_name(const char *name, ErDType *out) {
    if (!name)
        return er_error(ER_EINVAL, "dtype name is NULL");
    for (int t = 0; t < DT_COUNT; t++) {
        if (strcmp(name, dtype_info[t].name) == 0) {
            *out = (ErDType)t;
            return ER_OK;
        }
    }
    return er_error(ER_EFORMAT, "unknown dtype \"%.64s\"", name);
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f) // inf, or NaN with its payload moved to the top of the fp32 mantissa
        return f32_from_bits(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0)
            return f32_from_bits(sign);
        // subnormal: man * 2^-24, exact in fp32
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13)); // rebias 15 -> 127
}

uint16_t f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) {
        // NaN: keep the top payload bits; if they are all zero the result would read as inf,
        // so set the quiet bit. This makes f16 -> f32 -> f16 exact for every NaN too.
        uint32_t m = (ax >> 13) & 0x3ff;
        return (uint16_t)(sign | 0x7c00 | (m ? m : 0x200));
    }
    if (ax >= 0x477ff000u) // >= 65520, the midpoint between 65504 (max, odd) and 2^16: inf
        return sign | 0x7c00;
    if (ax < 0x38800000u) {
        // below 2^-14: an fp16 subnormal, i.e. an integer count of 2^-24
        uint32_t e = ax >> 23;
        if (e < 102) // below 2^-25: rounds to zero (2^-25 itself is a tie that goes to even 0)
            return sign;
        uint32_t m = (ax & 0x7fffffu) | 0x800000u; // value = m * 2^(e-150)
        uint32_t shift = 126 - e;                  // 14..24
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1)))
            r++; // may carry into 0x400, the smallest normal: still the right encoding
        return (uint16_t)(sign | r);
    }
    uint32_t r = (ax - 0x38000000u) >> 13; // rebias 127 -> 15, drop 13 mantissa bits
    uint32_t rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1)))
        r++; // a carry into the exponent is the correct next binade
    return (uint16_t)(sign | r);
}

float bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

uint16_t f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        uint16_t hi = (uint16_t)(x >> 16);
        return (hi & 0x7f) ? hi : (uint16_t)(hi | 0x40); // same NaN rule as f32_to_f16
    }
    // round to nearest even; the carry out of the mantissa rolls into the exponent (up to inf)
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

// F32 to or from F32 is a copy (in place allowed; the pointers may be NULL when n is 0).
static int copy_f32(void *dst, const void *src, size_t n) {
    if (n)
        memmove(dst, src, n * 4);
    return ER_OK;
}

int dtype_to_f32(float *dst, const void *src, ErDType t, size_t n) {
    const unsigned char *s = src;
    switch (t) {
    case DT_F32:
        return copy_f32(dst, src, n);
    case DT_F16:
    case DT_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = t == DT_F16 ? f16_to_f32(h) : bf16_to_f32(h);
        }
        return ER_OK;
    case DT_I8:
        for (size_t i = 0; i < n; i++)
            dst[i] = (float)(int8_t)s[i];
        return ER_OK;
    case DT_U8:
        for (size_t i = 0; i < n; i++)
            dst[i] = (float)s[i];
        return ER_OK;
    case DT_I32:
        for (size_t i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, s + 4 * i, 4);
            dst[i] = (float)v;
        }
        return ER_OK;
    default:
        return er_error(ER_EUNSUPPORTED, "no conversion from dtype %s to F32", dtype_name(t));
    }
}

// Round half to even, clamp to [lo, hi], NaN -> 0. Done in double so that hi = 2^31-1 is exact.
static double round_saturate(float x, double lo, double hi) {
    if (isnan(x))
        return 0.0;
    double r = nearbyint((double)x); // default rounding mode: to nearest, ties to even
    return r < lo ? lo : r > hi ? hi : r;
}

int dtype_from_f32(void *dst, ErDType t, const float *src, size_t n) {
    unsigned char *d = dst;
    switch (t) {
    case DT_F32:
        return copy_f32(dst, src, n);
    case DT_F16:
    case DT_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = t == DT_F16 ? f32_to_f16(src[i]) : f32_to_bf16(src[i]);
            memcpy(d + 2 * i, &h, 2);
        }
        return ER_OK;
    case DT_I8:
        for (size_t i = 0; i < n; i++)
            d[i] = (unsigned char)(int8_t)round_saturate(src[i], -128.0, 127.0);
        return ER_OK;
    case DT_U8:
        for (size_t i = 0; i < n; i++)
            d[i] = (unsigned char)round_saturate(src[i], 0.0, 255.0);
        return ER_OK;
    case DT_I32:
        for (size_t i = 0; i < n; i++) {
            int32_t v = (int32_t)round_saturate(src[i], -2147483648.0, 2147483647.0);
            memcpy(d + 4 * i, &v, 4);
        }
        return ER_OK;
    default:
        return er_error(ER_EUNSUPPORTED, "no conversion from F32 to dtype %s", dtype_name(t));
    }
}

// Scanned in blocks with a branch-free inner loop (it vectorises): loading a 15 GB model runs it over
// every weight once, and a block pays for its one test.
size_t dtype_find_nonfinite(const void *src, ErDType t, size_t n) {
    const unsigned char *s = src;
    size_t w = t == DT_F32 ? 4 : (t == DT_F16 || t == DT_BF16) ? 2 : 0;
    if (!w)
        return n;
    uint32_t mask = t == DT_F32 ? 0x7F800000u : t == DT_BF16 ? 0x7F80u : 0x7C00u;
    const size_t BLOCK = 4096;
    for (size_t b = 0; b < n; b += BLOCK) {
        size_t e = n - b < BLOCK ? n : b + BLOCK;
        uint32_t bad = 0;
        if (w == 4)
            for (size_t i = b; i < e; i++) {
                uint32_t x;
                memcpy(&x, s + 4 * i, 4);
                bad |= (x & mask) == mask;
            }
        else
            for (size_t i = b; i < e; i++) {
                uint16_t x;
                memcpy(&x, s + 2 * i, 2);
                bad |= (uint32_t)((x & mask) == mask);
            }
        if (!bad)
            continue;
        for (size_t i = b; i < e; i++) {
            uint32_t x = 0;
            memcpy(&x, s + w * i, w);
            if ((x & mask) == mask)
                return i;
        }
    }
    return n;
}
