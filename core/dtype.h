// Tensor element types as safetensors names them, and conversions to/from fp32.
#ifndef CORE_DTYPE_H
#define CORE_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum {
    DT_F32, DT_F16, DT_BF16, DT_I8, DT_U8, DT_I32,
    // Known to the safetensors format (so files holding them open), without conversions here.
    DT_F64, DT_I16, DT_U16, DT_U32, DT_I64, DT_U64, DT_BOOL,
    DT_F8_E4M3, DT_F8_E5M2,
    DT_COUNT
} ErDType;

size_t dtype_size(ErDType t);               // bytes per element; 0 for an invalid value
const char *dtype_name(ErDType t);          // "F32", "BF16", ...; "?" for an invalid value
int dtype_from_name(const char *name, ErDType *out); // ER_EFORMAT on unknown names

// The bits of an fp32 value and back (memcpy: no aliasing trouble, compiles to a move).
static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float f16_to_f32(uint16_t h);
// NaN kept: sign and top payload bits survive (a NaN never turns into inf), so 16 -> 32 -> 16
// is the identity on all 65536 bit patterns, NaNs included.
uint16_t f32_to_f16(float f);   // round to nearest even; overflow to inf; NaN kept
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);  // round to nearest even; NaN kept

// n elements of `src` (type t) into fp32. Supports F32 F16 BF16 I8 U8 I32; else ER_EUNSUPPORTED.
int dtype_to_f32(float *dst, const void *src, ErDType t, size_t n);
// n fp32 values into `dst` of type t (F32 F16 BF16; I8 U8 I32 round half to even and saturate,
// NaN becomes 0). `dst` and `src` need no alignment; data is little-endian as in safetensors.
int dtype_from_f32(void *dst, ErDType t, const float *src, size_t n);

// Index of the first NaN or infinity among n elements of a floating-point type (F32, F16, BF16; the
// exponent bits all set), or n when every element is finite or the type holds no such values.
size_t dtype_find_nonfinite(const void *src, ErDType t, size_t n);

#endif
