// The memory store's vector scan: int8 rows against an int8 query (exact int32 sums) and fp16 rows against an fp32
// query. A portable C path always; on x86 AVX2 and AVX-512 VNNI versions compiled here with target attributes
// (the erinfer program is built once, so unlike quant/'s kernels they need no copy per instruction set), picked at
// run time from the CPU, or by ER_SIMD (portable, avx2, avx512) as quant/matmul.c reads it.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "erinfer/memory.h"

void mem_quantize_i8(const float *x, int dim, int8_t *codes, float *scale) {
    float amax = 0.0f;
    for (int j = 0; j < dim; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    float s = amax / 127.0f;
    *scale = s;
    for (int j = 0; j < dim; j++) {
        long c = s > 0.0f ? lrintf(x[j] / s) : 0;
        codes[j] = (int8_t)(c > 127 ? 127 : c < -127 ? -127 : c);
    }
}

static void dot_i8_portable(const int8_t *rows, int n, int dim, const int8_t *q, int32_t *out) {
    for (int i = 0; i < n; i++) {
        const int8_t *r = rows + (size_t)i * (size_t)dim;
        int32_t acc = 0;
        for (int j = 0; j < dim; j++)
            acc += (int32_t)r[j] * (int32_t)q[j];
        out[i] = acc;
    }
}

static void dot_f16_portable(const uint16_t *rows, int n, int dim, const float *q, float *out) {
    for (int i = 0; i < n; i++) {
        const uint16_t *r = rows + (size_t)i * (size_t)dim;
        float acc = 0.0f;
        for (int j = 0; j < dim; j++)
            acc += f16_to_f32(r[j]) * q[j];
        out[i] = acc;
    }
}

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

// |r| * sign(q, r) = r * q in maddubs's unsigned x signed pairs (codes never -128, so |r| fits and the pair sums,
// 2 * 127 * 127, stay below int16's limit).
__attribute__((target("avx2"))) static void dot_i8_avx2(const int8_t *rows, int n, int dim, const int8_t *q,
                                                        int32_t *out) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int i = 0; i < n; i++) {
        const int8_t *r = rows + (size_t)i * (size_t)dim;
        __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
        for (int j = 0; j < dim; j += 64) {
            __m256i a0 = _mm256_load_si256((const __m256i *)(r + j));
            __m256i a1 = _mm256_load_si256((const __m256i *)(r + j + 32));
            __m256i b0 = _mm256_loadu_si256((const __m256i *)(q + j));
            __m256i b1 = _mm256_loadu_si256((const __m256i *)(q + j + 32));
            __m256i p0 = _mm256_maddubs_epi16(_mm256_abs_epi8(a0), _mm256_sign_epi8(b0, a0));
            __m256i p1 = _mm256_maddubs_epi16(_mm256_abs_epi8(a1), _mm256_sign_epi8(b1, a1));
            acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(p0, ones));
            acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(p1, ones));
        }
        __m256i acc = _mm256_add_epi32(acc0, acc1);
        __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
        out[i] = _mm_cvtsi128_si32(s);
    }
}

// vpdpbusd takes unsigned x signed: the rows' codes offset by 128 (an xor) against the signed query, and 128 Σ q
// taken off at the end. Four rows at a time keep four independent sums in flight.
#define DOT_I8_AVX512_TARGET "avx512f,avx512bw,avx512vnni"
__attribute__((target(DOT_I8_AVX512_TARGET))) static void dot_i8_avx512(const int8_t *rows, int n, int dim,
                                                                         const int8_t *q, int32_t *out) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    int32_t qsum = 0;
    for (int j = 0; j < dim; j++)
        qsum += q[j];
    const int32_t off = 128 * qsum;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const int8_t *r = rows + (size_t)i * (size_t)dim;
        __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
        for (int j = 0; j < dim; j += 64) {
            __m512i b = _mm512_loadu_si512((const void *)(q + j));
            a0 = _mm512_dpbusd_epi32(a0, _mm512_xor_si512(_mm512_load_si512((const void *)(r + j)), flip), b);
            a1 = _mm512_dpbusd_epi32(a1, _mm512_xor_si512(_mm512_load_si512((const void *)(r + dim + j)), flip), b);
            a2 = _mm512_dpbusd_epi32(a2, _mm512_xor_si512(_mm512_load_si512((const void *)(r + 2 * dim + j)), flip), b);
            a3 = _mm512_dpbusd_epi32(a3, _mm512_xor_si512(_mm512_load_si512((const void *)(r + 3 * dim + j)), flip), b);
        }
        out[i] = _mm512_reduce_add_epi32(a0) - off;
        out[i + 1] = _mm512_reduce_add_epi32(a1) - off;
        out[i + 2] = _mm512_reduce_add_epi32(a2) - off;
        out[i + 3] = _mm512_reduce_add_epi32(a3) - off;
    }
    for (; i < n; i++) {
        const int8_t *r = rows + (size_t)i * (size_t)dim;
        __m512i a = _mm512_setzero_si512();
        for (int j = 0; j < dim; j += 64)
            a = _mm512_dpbusd_epi32(a, _mm512_xor_si512(_mm512_load_si512((const void *)(r + j)), flip),
                                    _mm512_loadu_si512((const void *)(q + j)));
        out[i] = _mm512_reduce_add_epi32(a) - off;
    }
}

// fp16 widened by F16C, multiplied in fp32 with FMA; the sums' order differs from the portable path's.
__attribute__((target("avx2,fma,f16c"))) static void dot_f16_avx2(const uint16_t *rows, int n, int dim,
                                                                   const float *q, float *out) {
    for (int i = 0; i < n; i++) {
        const uint16_t *r = rows + (size_t)i * (size_t)dim;
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        for (int j = 0; j < dim; j += 16) {
            __m256 x0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + j)));
            __m256 x1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + j + 8)));
            acc0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(q + j), acc0);
            acc1 = _mm256_fmadd_ps(x1, _mm256_loadu_ps(q + j + 8), acc1);
        }
        __m256 acc = _mm256_add_ps(acc0, acc1);
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        out[i] = _mm_cvtss_f32(s);
    }
}

// The CPU's features (CPUID leaves 1 and 7) whose registers the OS also saves (XGETBV), as quant/matmul.c reads
// them: AVX2 with FMA and F16C; AVX-512 F, BW and VNNI.
static int cpu_avx2(void) {
    unsigned a, b, c, d, lo, hi;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !(c & bit_FMA) || !(c & bit_F16C))
        return 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 0x6) == 0x6 && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_AVX2);
}

static int cpu_avx512_vnni(void) {
    unsigned a, b, c, d, lo, hi;
    if (!cpu_avx2())
        return 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 0xe6) == 0xe6 && __get_cpuid_count(7, 0, &a, &b, &c, &d) &&
           (b & (bit_AVX512F | bit_AVX512BW)) == (bit_AVX512F | bit_AVX512BW) && (c & bit_AVX512VNNI);
}
#endif

// The name asked for: the argument, else ER_SIMD, else NULL (the best there is).
static const char *scan_want(const char *name) {
    if (name)
        return name;
    const char *env = getenv("ER_SIMD");
    return env && env[0] ? env : NULL;
}

MemDotI8Fn mem_scan_kernel(const char *name, const char **picked) {
    const char *want = scan_want(name);
    MemDotI8Fn fn = NULL;
    const char *got = NULL;
#if defined(__x86_64__)
    if ((!want || !strcmp(want, "avx512")) && cpu_avx512_vnni())
        fn = dot_i8_avx512, got = "avx512";
    else if ((!want || !strcmp(want, "avx2")) && cpu_avx2())
        fn = dot_i8_avx2, got = "avx2";
#endif
    if (!fn && (!want || !name || !strcmp(want, "portable")))
        fn = dot_i8_portable, got = "portable";
    if (name && got && strcmp(name, got))
        fn = NULL, got = NULL; // asked for by name: that kernel or none
    if (picked)
        *picked = got;
    return fn;
}

MemDotF16Fn mem_scan_kernel_f16(const char *name, const char **picked) {
    const char *want = scan_want(name);
    MemDotF16Fn fn = NULL;
    const char *got = NULL;
#if defined(__x86_64__)
    if ((!want || strcmp(want, "portable")) && cpu_avx2())
        fn = dot_f16_avx2, got = "avx2";
#endif
    if (!fn && (!want || !name || !strcmp(want, "portable")))
        fn = dot_f16_portable, got = "portable";
    if (name && got && strcmp(name, got))
        fn = NULL, got = NULL;
    if (picked)
        *picked = got;
    return fn;
}
