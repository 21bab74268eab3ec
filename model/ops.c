#include "model/ops.h"

#include <tgmath.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "core/error.h"
#include "core/threads.h"

#define REAL float
#define SFX
#define VEXP ops_expf
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
