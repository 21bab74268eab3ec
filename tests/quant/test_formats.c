// Quantized formats: packing round trips, dequantization by the documented layout, sizes and bits
// per weight, and shape checks.
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "quant/quant.h"

// The documented layout (quant/weight.h), written out independently: blocks of 8 bytes, byte i of a
// block holds elements i, i+8 (4-bit) or i, i+8, i+16, i+24 (2-bit); the tail in order.
static unsigned ref_code4(const uint8_t *p, int n, int k) {
    int nb = n / 16;
    if (k < 16 * nb) {
        int b = k / 16, e = k % 16;
        return (p[8 * b + e % 8] >> (4 * (e / 8))) & 15;
    }
    int t = k - 16 * nb;
    return (p[8 * nb + t / 2] >> (4 * (t % 2))) & 15;
}

static unsigned ref_code2(const uint8_t *p, int n, int k) {
    int nb = n / 32;
    if (k < 32 * nb) {
        int b = k / 32, e = k % 32;
        return (p[8 * b + e % 8] >> (2 * (e / 8))) & 3;
    }
    int t = k - 32 * nb;
    return (p[8 * nb + t / 4] >> (2 * (t % 4))) & 3;
}

Test(quant_formats, pack4_roundtrip) {
    for (int n = 1; n <= 70; n++) {
        uint8_t codes[70], back[70], packed[40];
        for (int i = 0; i < n; i++)
            codes[i] = (uint8_t)((i * 7 + 3) % 16);
        memset(packed, 0xAA, sizeof packed);
        quant_pack4(packed, codes, n);
        quant_unpack4(back, packed, n);
        cr_assert_eq(memcmp(codes, back, (size_t)n), 0, "n = %d", n);
        for (int k = 0; k < n; k++) {
            cr_assert_eq(ref_code4(packed, n, k), codes[k], "n = %d, element %d not where the layout puts it", n, k);
            cr_assert_eq(quant_code4(packed, n, k), codes[k]);
        }
        if (n % 2)
            cr_assert_eq(packed[n / 2] >> 4, 0, "padding nibble must be zero (n = %d)", n);
        cr_assert_eq(packed[(n + 1) / 2], 0xAA, "wrote past ceil(n/2) bytes (n = %d)", n);
    }
}

Test(quant_formats, pack2_roundtrip) {
    for (int n = 1; n <= 100; n++) {
        uint8_t codes[100], back[100], packed[30];
        for (int i = 0; i < n; i++)
            codes[i] = (uint8_t)((i * 5 + 1) % 4);
        memset(packed, 0xAA, sizeof packed);
        quant_pack2(packed, codes, n);
        quant_unpack2(back, packed, n);
        cr_assert_eq(memcmp(codes, back, (size_t)n), 0, "n = %d", n);
        for (int k = 0; k < n; k++) {
            cr_assert_eq(ref_code2(packed, n, k), codes[k], "n = %d, element %d not where the layout puts it", n, k);
            cr_assert_eq(quant_code2(packed, n, k), codes[k]);
        }
        if (n % 4)
            cr_assert_eq(packed[n / 4] >> (2 * (n % 4)), 0, "padding bits must be zero (n = %d)", n);
        cr_assert_eq(packed[(n + 3) / 4], 0xAA, "wrote past ceil(n/4) bytes (n = %d)", n);
    }
}

// Every format's dequantization against the layout written out by hand.
Test(quant_formats, dequant_matches_layout) {
    const int R = 3, K = 44; // one full block and a tail in both packings
    ErRng rng;
    rng_seed(&rng, 1);
    // q8
    Weight w;
    cr_assert_eq(quant_weight_alloc(&w, WF_Q8, R, K, 0, 0), 0);
    for (int i = 0; i < R * K; i++)
        ((int8_t *)w.data)[i] = (int8_t)(rng_below(&rng, 255) - 127);
    for (int r = 0; r < R; r++)
        ((float *)w.scale)[r] = 0.1f * (r + 1);
    float row[44];
    for (int r = 0; r < R; r++) {
        weight_row_f32(row, &w, r);
        for (int k = 0; k < K; k++)
            cr_assert_eq(row[k], ((int8_t *)w.data)[r * K + k] * w.scale[r]);
    }
    weight_free(&w);
    // q4 and q4g
    for (int g = 0; g < 2; g++) {
        cr_assert_eq(quant_weight_alloc(&w, g ? WF_Q4G : WF_Q4, R, K, g ? 4 : 0, 0), 0);
        uint8_t codes[3 * 44];
        for (int i = 0; i < R * K; i++)
            codes[i] = (uint8_t)rng_below(&rng, 16);
        for (int r = 0; r < R; r++)
            quant_pack4((uint8_t *)w.data + r * weight_row_bytes(w.fmt, K), codes + r * K, K);
        if (g) {
            for (int i = 0; i < R * K / 4; i++) {
                ((uint16_t *)w.gscale)[i] = f32_to_f16(0.25f + 0.125f * i);
                ((uint16_t *)w.gzero)[i] = f32_to_f16(-1.0f + 0.5f * i);
            }
        } else {
            for (int r = 0; r < R; r++)
                ((float *)w.scale)[r] = 0.5f + r;
        }
        for (int r = 0; r < R; r++) {
            weight_row_f32(row, &w, r);
            for (int k = 0; k < K; k++) {
                float u = codes[r * K + k];
                float want = g ? u * f16_to_f32(w.gscale[r * (K / 4) + k / 4]) + f16_to_f32(w.gzero[r * (K / 4) + k / 4])
                               : (u - 8) * w.scale[r];
                cr_assert_eq(row[k], want, "%s [%d,%d]", g ? "q4g" : "q4", r, k);
            }
        }
        weight_free(&w);
    }
    // q4lut
    cr_assert_eq(quant_weight_alloc(&w, WF_Q4LUT, R, K, 0, 0), 0);
    uint8_t c16[3 * 44];
    for (int i = 0; i < R * K; i++)
        c16[i] = (uint8_t)rng_below(&rng, 16);
    for (int r = 0; r < R; r++) {
        quant_pack4((uint8_t *)w.data + r * weight_row_bytes(WF_Q4LUT, K), c16 + r * K, K);
        for (int j = 0; j < 16; j++)
            ((uint16_t *)w.lut)[r * 16 + j] = f32_to_f16((float)(j - 7.5) * 0.25f * (r + 1));
    }
    for (int r = 0; r < R; r++) {
        weight_row_f32(row, &w, r);
        for (int k = 0; k < K; k++)
            cr_assert_eq(row[k], f16_to_f32(w.lut[r * 16 + c16[r * K + k]]), "q4lut [%d,%d]", r, k);
    }
    weight_free(&w);
    // q2lut
    cr_assert_eq(quant_weight_alloc(&w, WF_Q2LUT, R, K, 0, 0), 0);
    uint8_t idx[3 * 44];
    for (int i = 0; i < R * K; i++)
        idx[i] = (uint8_t)rng_below(&rng, 4);
    for (int r = 0; r < R; r++) {
        quant_pack2((uint8_t *)w.data + r * weight_row_bytes(WF_Q2LUT, K), idx + r * K, K);
        for (int j = 0; j < 4; j++)
            ((uint16_t *)w.lut)[r * 4 + j] = f32_to_f16((float)(j - 1.5) * (r + 1));
    }
    for (int r = 0; r < R; r++) {
        weight_row_f32(row, &w, r);
        for (int k = 0; k < K; k++)
            cr_assert_eq(row[k], f16_to_f32(w.lut[r * 4 + idx[r * K + k]]));
    }
    weight_free(&w);
}

Test(quant_formats, bytes_and_bits_per_weight) {
    Weight w;
    cr_assert_eq(quant_weight_alloc(&w, WF_Q4, 896, 4864, 0, 0), 0);
    cr_assert_eq(weight_bytes(&w), (size_t)896 * 2432 + 896 * 4);
    cr_assert_float_eq(weight_bits_per_weight(&w), 4.0 + 32.0 / 4864, 1e-9);
    weight_free(&w);
    int groups[] = {32, 64, 128};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(quant_weight_alloc(&w, WF_Q4G, 16, 896, groups[i], 0), 0);
        cr_assert_float_eq(weight_bits_per_weight(&w), 4.0 + 32.0 / groups[i], 1e-9, "group %d", groups[i]);
        weight_free(&w);
    }
    cr_assert_eq(quant_weight_alloc(&w, WF_Q2LUT, 10, 896, 0, 0), 0);
    cr_assert_float_eq(weight_bits_per_weight(&w), 2.0 + 64.0 / 896, 1e-9);
    weight_free(&w);
    cr_assert_eq(quant_weight_alloc(&w, WF_Q4LUT, 10, 896, 0, 0), 0);
    cr_assert_float_eq(weight_bits_per_weight(&w), 4.0 + 256.0 / 896, 1e-9);
    weight_free(&w);
    cr_assert_eq(quant_weight_alloc(&w, WF_Q8, 10, 896, 0, 0), 0);
    cr_assert_float_eq(weight_bits_per_weight(&w), 8.0 + 32.0 / 896, 1e-9);
    weight_free(&w);
    cr_assert_eq(weight_row_bytes(WF_Q4, 7), 4u);
    cr_assert_eq(weight_row_bytes(WF_Q2LUT, 7), 2u);
    Weight f = {.fmt = WF_BF16, .rows = 4, .cols = 8};
    cr_assert_float_eq(weight_bits_per_weight(&f), 16.0, 1e-12);
}

Test(quant_formats, shape_checks) {
    Weight w;
    cr_assert_lt(quant_weight_alloc(&w, WF_Q4G, 4, 96, 64, 0), 0);
    cr_assert(strstr(er_last_error(), "does not divide"), "%s", er_last_error());
    cr_assert_lt(quant_weight_alloc(&w, WF_Q4G, 4, 96, 3, 0), 0);
    cr_assert_lt(quant_weight_alloc(&w, WF_Q8, 0, 96, 0, 0), 0);
}

Test(quant_formats, specs) {
    const char *good[] = {"q8", "q4", "q4g32", "q4g64", "q4g128", "q2lut", "q4lut"};
    for (int i = 0; i < 7; i++) {
        WeightFormat f;
        int g;
        char buf[16];
        cr_assert_eq(quant_parse_spec(good[i], &f, &g), 0, "%s", good[i]);
        cr_assert_str_eq(quant_spec_name(f, g, buf), good[i]);
    }
    WeightFormat f;
    int g;
    cr_assert_lt(quant_parse_spec("q3", &f, &g), 0);
    cr_assert_lt(quant_parse_spec("q4g16", &f, &g), 0);
    cr_assert_lt(quant_parse_spec("", &f, &g), 0);
}
