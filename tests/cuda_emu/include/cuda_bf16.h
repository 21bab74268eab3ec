// Test-only (make CUDA_EMU=1): __nv_bfloat16 and the conversions the kernels use, bit for bit CUDA's
// (round to nearest even; every NaN becomes the canonical 0x7fff, as cvt.rn.bf16.f32 and cuda_bf16.hpp do).
#ifndef CUDA_EMU_BF16_H
#define CUDA_EMU_BF16_H

#include <stdint.h>
#include <string.h>

struct __nv_bfloat16 {
    uint16_t x;
};

static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    __nv_bfloat16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u)
        r.x = 0x7fff;
    else
        r.x = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return r;
}

static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }

static inline float __bfloat162float(__nv_bfloat16 b) {
    uint32_t u = (uint32_t)b.x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif
