// dtype names/sizes and the fp16/bf16 conversions: exhaustive over all 65536 bit patterns, every
// rounding tie between adjacent representable values, and random fp32 inputs against an
// independent (double arithmetic) reference.
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"

static int f16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
static int bf16_is_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }

// fp16 value from the definition, in double.
static double f16_value_ref(uint16_t h) {
    int sign = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v;
    if (e == 0x1f)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp(m, -24);
    else
        v = ldexp(1024 + m, e - 25);
    return sign ? -v : v;
}

// fp32 -> fp16 value by rounding in double (finite inputs): the nearest fp16, ties to even.
static double f16_round_ref(float f) {
    double a = fabs((double)f);
    double r;
    if (a >= 65520.0) {
        r = INFINITY;
    } else if (a < ldexp(1, -14)) {
        r = ldexp(nearbyint(ldexp(a, 24)), -24); // subnormal grid
    } else {
        int e;
        frexp(a, &e); // a = m * 2^e, m in [0.5, 1)
        r = ldexp(nearbyint(ldexp(a, 11 - e)), e - 11); // 11 significant bits
        if (r > 65504.0)
            r = INFINITY;
    }
    return signbit(f) ? -r : r;
}

Test(dtype, names_and_sizes) {
    static const size_t want[DT_COUNT] = {
        [DT_F32] = 4, [DT_F16] = 2, [DT_BF16] = 2, [DT_I8] = 1,   [DT_U8] = 1,
        [DT_I32] = 4, [DT_F64] = 8, [DT_I16] = 2,  [DT_U16] = 2,  [DT_U32] = 4,
        [DT_I64] = 8, [DT_U64] = 8, [DT_BOOL] = 1, [DT_F8_E4M3] = 1, [DT_F8_E5M2] = 1,
    };
    for (int t = 0; t < DT_COUNT; t++) {
        cr_assert_eq(dtype_size((ErDType)t), want[t], "size of %s", dtype_name((ErDType)t));
        ErDType back = DT_COUNT;
        cr_assert_eq(dtype_from_name(dtype_name((ErDType)t), &back), ER_OK);
        cr_assert_eq(back, (ErDType)t, "name %s does not map back", dtype_name((ErDType)t));
    }
    cr_assert_str_eq(dtype_name(DT_BF16), "BF16");
    cr_assert_str_eq(dtype_name(DT_F8_E4M3), "F8_E4M3");
    cr_assert_eq(dtype_size(DT_COUNT), 0);
    cr_assert_str_eq(dtype_name(DT_COUNT), "?");
    const char *bad[] = {"f32", "float32", "", "F7", "F32 ", "BF16x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ErDType t = DT_F32;
        cr_assert_eq(dtype_from_name(bad[i], &t), ER_EFORMAT, "\"%s\" accepted", bad[i]);
        cr_assert_eq(t, DT_F32, "output written on failure");
    }
    cr_assert(strstr(er_last_error(), "unknown dtype"));
}

Test(dtype, f16_known_values) {
    cr_assert_eq(f16_to_f32(0x3c00), 1.0f);
    cr_assert_eq(f16_to_f32(0xc000), -2.0f);
    cr_assert_eq(f16_to_f32(0x7bff), 65504.0f);
    cr_assert_eq(f16_to_f32(0x0001), ldexpf(1, -24));
    cr_assert_eq(f16_to_f32(0x03ff), ldexpf(1023, -24));
    cr_assert_eq(f16_to_f32(0x0400), ldexpf(1, -14));
    cr_assert_eq(f16_to_f32(0x3555), 1365.0f / 4096.0f); // (1024 + 0x155) * 2^(13-25)
    cr_assert(isinf(f16_to_f32(0x7c00)) && f16_to_f32(0x7c00) > 0);
    cr_assert(isinf(f16_to_f32(0xfc00)) && f16_to_f32(0xfc00) < 0);
    cr_assert_eq(f32_bits(f16_to_f32(0x8000)), 0x80000000u);
    cr_assert_eq(f32_to_f16(1.0f), 0x3c00);
    cr_assert_eq(f32_to_f16(-2.0f), 0xc000);
    cr_assert_eq(f32_to_f16(65504.0f), 0x7bff);
    cr_assert_eq(f32_to_f16(0.1f), 0x2e66); // 0.1 -> 0.0999755859375
    cr_assert_eq(f32_to_f16(-0.0f), 0x8000);
    cr_assert_eq(f32_to_f16(ldexpf(1, -24)), 0x0001);
}

Test(dtype, f16_all_bit_patterns) {
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = f16_to_f32(h);
        double ref = f16_value_ref(h);
        if (f16_is_nan(h)) {
            cr_assert(isnan(f), "0x%04x should be NaN", h);
            cr_assert_eq(signbit(f) != 0, (h >> 15) != 0, "NaN 0x%04x lost its sign", h);
            // payload kept: NaNs survive the round trip bit for bit as well
            cr_assert_eq(f32_to_f16(f), h, "NaN 0x%04x -> 0x%04x", h, f32_to_f16(f));
            continue;
        }
        cr_assert_eq((double)f, ref, "0x%04x -> %.9g, want %.9g", h, f, ref);
        cr_assert_eq(signbit(f) != 0, (h >> 15) != 0, "0x%04x sign", h);
        uint16_t back = f32_to_f16(f);
        cr_assert_eq(back, h, "round trip 0x%04x -> %.9g -> 0x%04x", h, f, back);
    }
}

// Every midpoint between neighbouring fp16 values (subnormal, normal, and the max -> inf edge)
// goes to the even neighbour; one fp32 ulp either side goes to the nearer one.
Test(dtype, f16_ties_to_even) {
    int ties = 0;
    for (uint32_t h = 0; h < 0x7c00; h++) {
        double lo = f16_value_ref((uint16_t)h);
        double hi = h + 1 < 0x7c00 ? f16_value_ref((uint16_t)(h + 1)) : 65536.0; // past max: the inf edge
        double mid_d = (lo + hi) / 2;
        float mid = (float)mid_d;
        cr_assert_eq((double)mid, mid_d, "midpoint not exact in fp32 at 0x%04x", h);
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h; // h + 1 == 0x7c00 is inf
        for (int s = 0; s < 2; s++) {
            uint16_t sg = s ? 0x8000 : 0;
            float m = s ? -mid : mid;
            cr_assert_eq(f32_to_f16(m), sg | even, "tie %.9g (0x%04x..): got 0x%04x", m, h, f32_to_f16(m));
            float below = nextafterf(m, 0.0f), above = nextafterf(m, s ? -INFINITY : INFINITY);
            cr_assert_eq(f32_to_f16(below), sg | h, "just below tie at 0x%04x: got 0x%04x", h, f32_to_f16(below));
            cr_assert_eq(f32_to_f16(above), sg | (h + 1), "just above tie at 0x%04x: got 0x%04x", h,
                         f32_to_f16(above));
            ties++;
        }
    }
    cr_assert_eq(ties, 2 * 0x7c00);
    // the tie between 0 and the smallest subnormal, 2^-25, goes to 0 (even)
    cr_assert_eq(f32_to_f16(ldexpf(1, -25)), 0x0000);
    cr_assert_eq(f32_to_f16(nextafterf(ldexpf(1, -25), 1)), 0x0001);
    cr_assert_eq(f32_to_f16(ldexpf(3, -25)), 0x0002); // 1.5 ulp: tie between 1 and 2 -> 2
}

Test(dtype, f16_overflow_underflow_nan) {
    cr_assert_eq(f32_to_f16(65519.996f), 0x7bff);
    cr_assert_eq(f32_to_f16(65520.0f), 0x7c00);
    cr_assert_eq(f32_to_f16(1e6f), 0x7c00);
    cr_assert_eq(f32_to_f16(-1e6f), 0xfc00);
    cr_assert_eq(f32_to_f16(FLT_MAX), 0x7c00);
    cr_assert_eq(f32_to_f16(INFINITY), 0x7c00);
    cr_assert_eq(f32_to_f16(-INFINITY), 0xfc00);
    cr_assert_eq(f32_to_f16(1e-10f), 0x0000);
    cr_assert_eq(f32_to_f16(-1e-10f), 0x8000);
    cr_assert_eq(f32_to_f16(FLT_TRUE_MIN), 0x0000);
    cr_assert_eq(f32_to_f16(-FLT_MIN), 0x8000);
    cr_assert(f16_is_nan(f32_to_f16(NAN)));
    cr_assert(f16_is_nan(f32_to_f16(f32_from_bits(0x7f800001u))), "low-payload NaN must not become inf");
    cr_assert(f16_is_nan(f32_to_f16(f32_from_bits(0xff800001u))));
    cr_assert_eq(f32_to_f16(f32_from_bits(0xff800001u)) & 0x8000, 0x8000, "NaN sign lost");
    cr_assert_eq(f32_to_f16(f32_from_bits(0x7fc00000u)), 0x7e00);
}

Test(dtype, f16_random_against_reference) {
    ErRng r;
    rng_seed(&r, 1234);
    for (int i = 0; i < 1000000; i++) {
        uint32_t u = (uint32_t)rng_u64(&r);
        if (i & 1) // half the draws near the fp16 range, where the interesting cases are
            u = (u & 0x807fffffu) | ((uint32_t)(100 + rng_below(&r, 45)) << 23);
        float f = f32_from_bits(u);
        if (isnan(f))
            continue;
        uint16_t h = f32_to_f16(f);
        double want = f16_round_ref(f);
        cr_assert_eq((double)f16_to_f32(h), want, "%.9g (0x%08x) -> 0x%04x = %.9g, want %.9g", f, u, h,
                     f16_to_f32(h), want);
        cr_assert_eq(h >> 15, u >> 31, "sign of 0x%08x", u);
#ifdef __FLT16_MAX__
        _Float16 hw = (_Float16)f; // the compiler's own conversion: round to nearest even
        uint16_t hb;
        memcpy(&hb, &hw, 2);
        cr_assert_eq(h, hb, "0x%08x: 0x%04x, compiler says 0x%04x", u, h, hb);
#endif
    }
}

Test(dtype, bf16_all_bit_patterns) {
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = bf16_to_f32(h);
        cr_assert_eq(f32_bits(f), (uint32_t)h << 16, "0x%04x", h);
        cr_assert_eq(f32_to_bf16(f), h, "round trip 0x%04x -> 0x%04x", h, f32_to_bf16(f));
        cr_assert_eq(isnan(f) != 0, bf16_is_nan(h), "0x%04x NaN-ness", h);
    }
}

Test(dtype, bf16_ties_to_even) {
    for (uint32_t hi = 0; hi < 65536; hi++) {
        if ((hi & 0x7f80) == 0x7f80)
            continue; // inf/NaN upper halves
        uint32_t tie = (hi << 16) | 0x8000;
        uint16_t even = (hi & 1) ? (uint16_t)(hi + 1) : (uint16_t)hi; // 0x7f7f + 1 = inf
        cr_assert_eq(f32_to_bf16(f32_from_bits(tie)), even, "tie 0x%08x", tie);
        cr_assert_eq(f32_to_bf16(f32_from_bits(tie - 1)), hi, "below tie 0x%08x", tie - 1);
        cr_assert_eq(f32_to_bf16(f32_from_bits(tie + 1)), (uint16_t)(hi + 1), "above tie 0x%08x", tie + 1);
        cr_assert_eq(f32_to_bf16(f32_from_bits(hi << 16 | 0x7fff)), hi);
    }
    cr_assert_eq(f32_to_bf16(FLT_MAX), 0x7f80, "FLT_MAX rounds to inf");
    cr_assert_eq(f32_to_bf16(1.0f), 0x3f80);
    cr_assert_eq(f32_to_bf16(INFINITY), 0x7f80);
    cr_assert_eq(f32_to_bf16(-INFINITY), 0xff80);
    cr_assert(bf16_is_nan(f32_to_bf16(NAN)));
    cr_assert(bf16_is_nan(f32_to_bf16(f32_from_bits(0x7f800001u))), "low-payload NaN must not become inf");
    cr_assert_eq(f32_to_bf16(f32_from_bits(0xffc00000u)), 0xffc0);
}

Test(dtype, to_f32_all_types_unaligned) {
    unsigned char buf[64 + 1];
    float out[8];
    // F32
    float f32s[4] = {1.5f, -2.25f, 1e30f, -0.0f};
    memcpy(buf + 1, f32s, sizeof f32s);
    cr_assert_eq(dtype_to_f32(out, buf + 1, DT_F32, 4), ER_OK);
    cr_assert_eq(memcmp(out, f32s, sizeof f32s), 0);
    // F16 / BF16
    uint16_t h[3] = {0x3c00, 0xc100, 0x0001};
    memcpy(buf + 1, h, sizeof h);
    cr_assert_eq(dtype_to_f32(out, buf + 1, DT_F16, 3), ER_OK);
    cr_assert(out[0] == 1.0f && out[1] == -2.5f && out[2] == ldexpf(1, -24));
    uint16_t b[2] = {0x3f80, 0xc040};
    memcpy(buf + 1, b, sizeof b);
    cr_assert_eq(dtype_to_f32(out, buf + 1, DT_BF16, 2), ER_OK);
    cr_assert(out[0] == 1.0f && out[1] == -3.0f);
    // I8 / U8
    buf[1] = 0x80;
    buf[2] = 0x7f;
    buf[3] = 0xff;
    cr_assert_eq(dtype_to_f32(out, buf + 1, DT_I8, 3), ER_OK);
    cr_assert(out[0] == -128.0f && out[1] == 127.0f && out[2] == -1.0f);
    cr_assert_eq(dtype_to_f32(out, buf + 1, DT_U8, 3), ER_OK);
    cr_assert(out[0] == 128.0f && out[1] == 127.0f && out[2] == 255.0f);
    // I32
    int32_t ints[3] = {-7, 16777217, INT32_MIN};
    memcpy(buf + 1, ints, sizeof ints);
    cr_assert_eq(dtype_to_f32(out, buf + 1, DT_I32, 3), ER_OK);
    cr_assert(out[0] == -7.0f && out[1] == 16777216.0f && out[2] == -2147483648.0f);
    cr_assert_eq(dtype_to_f32(out, buf, DT_F32, 0), ER_OK);
    int unsupported[] = {DT_F64, DT_I16, DT_U16, DT_U32, DT_I64, DT_U64, DT_BOOL, DT_F8_E4M3, DT_F8_E5M2};
    for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++) {
        cr_assert_eq(dtype_to_f32(out, buf, (ErDType)unsupported[i], 1), ER_EUNSUPPORTED);
        cr_assert_eq(dtype_from_f32(buf, (ErDType)unsupported[i], out, 1), ER_EUNSUPPORTED);
    }
}

Test(dtype, from_f32_round_and_saturate) {
    float in[] = {-1000.0f, -128.5f, -2.5f, -0.5f, 0.5f, 1.5f, 2.5f, 3.5f, 127.4f, 127.5f, 300.0f, NAN, -INFINITY};
    int8_t want_i8[] = {-128, -128, -2, 0, 0, 2, 2, 4, 127, 127, 127, 0, -128};
    uint8_t want_u8[] = {0, 0, 0, 0, 0, 2, 2, 4, 127, 128, 255, 0, 0};
    size_t n = sizeof in / sizeof *in;
    int8_t i8[16];
    uint8_t u8[16];
    cr_assert_eq(dtype_from_f32(i8, DT_I8, in, n), ER_OK);
    cr_assert_eq(dtype_from_f32(u8, DT_U8, in, n), ER_OK);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(i8[i], want_i8[i], "I8 of %g: %d", in[i], i8[i]);
        cr_assert_eq(u8[i], want_u8[i], "U8 of %g: %d", in[i], u8[i]);
    }
    float big[] = {3e9f, -3e9f, 2147483520.0f, 2147483648.0f, -2147483648.0f, -7.5f, INFINITY, NAN};
    int32_t want_i32[] = {INT32_MAX, INT32_MIN, 2147483520, INT32_MAX, INT32_MIN, -8, INT32_MAX, 0};
    unsigned char raw[8 * 4 + 1];
    cr_assert_eq(dtype_from_f32(raw + 1, DT_I32, big, 8), ER_OK); // unaligned destination
    for (int i = 0; i < 8; i++) {
        int32_t v;
        memcpy(&v, raw + 1 + 4 * i, 4);
        cr_assert_eq(v, want_i32[i], "I32 of %g: %d", big[i], v);
    }
    // F16 / BF16 / F32 arrays agree with the scalar conversions
    float src[5] = {0.1f, -65519.0f, 1e-7f, 3.14159f, 70000.0f};
    unsigned char hb[11], bb[11];
    float back[5];
    cr_assert_eq(dtype_from_f32(hb + 1, DT_F16, src, 5), ER_OK);
    cr_assert_eq(dtype_from_f32(bb + 1, DT_BF16, src, 5), ER_OK);
    for (int i = 0; i < 5; i++) {
        uint16_t x, y;
        memcpy(&x, hb + 1 + 2 * i, 2);
        memcpy(&y, bb + 1 + 2 * i, 2);
        cr_assert_eq(x, f32_to_f16(src[i]));
        cr_assert_eq(y, f32_to_bf16(src[i]));
    }
    cr_assert_eq(dtype_from_f32(back, DT_F32, src, 5), ER_OK);
    cr_assert_eq(memcmp(back, src, sizeof src), 0);
}
