#include "model/ops.h"

#include <tgmath.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/error.h"

// exp for the float ops: Cody-Waite range reduction and a degree-6 polynomial (about 1 ulp over the
// range that matters), written branch-free so `omp simd` loops vectorise it; libm's expf does not.
// Arguments below -87.3 give about 1e-38 instead of a denormal or 0; NaN propagates.
static inline float expf_vec(float x) {
    x = x > 88.7f ? 88.7f : (x < -87.3f ? -87.3f : x);
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } scale = {.i = ((int32_t)n + 127) << 23};
    return p * scale.f;
}

#define REAL float
#define SFX
#define VEXP expf_vec
#include "model/ops_impl.h"
#undef REAL
#undef SFX
#undef VEXP

#define REAL double
#define SFX _f64
#define VEXP exp
#include "model/ops_impl.h"
#undef REAL
#undef SFX
#undef VEXP

void rope_tables(float *cos_tab, float *sin_tab, int P, int HS, double theta) {
    int half = HS / 2;
    for (int p = 0; p < P; p++)
        for (int i = 0; i < half; i++) {
            double a = p * pow(theta, -2.0 * i / HS);
            cos_tab[(size_t)p * half + i] = (float)cos(a);
            sin_tab[(size_t)p * half + i] = (float)sin(a);
        }
}

void rope_tables_f64(double *cos_tab, double *sin_tab, int P, int HS, double theta) {
    int half = HS / 2;
    for (int p = 0; p < P; p++)
        for (int i = 0; i < half; i++) {
            double a = p * pow(theta, -2.0 * i / HS);
            cos_tab[(size_t)p * half + i] = cos(a);
            sin_tab[(size_t)p * half + i] = sin(a);
        }
}
