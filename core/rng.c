#include "core/rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void rng_seed(ErRng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

void rng_fork(ErRng *child, const ErRng *parent, uint64_t stream) {
    uint64_t x = parent->s[0] ^ (parent->s[3] * 0x2545f4914f6cdd1dULL) ^ (stream * 0x9e3779b97f4a7c15ULL);
    for (int i = 0; i < 4; i++)
        child->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t rng_u64(ErRng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint32_t rng_below(ErRng *r, uint32_t n) {
    // Lemire's multiply-shift with rejection: unbiased.
    uint64_t m = (uint64_t)(uint32_t)(rng_u64(r) >> 32) * n;
    uint32_t lo = (uint32_t)m;
    if (lo < n) {
        uint32_t threshold = -n % n;
        while (lo < threshold) {
            m = (uint64_t)(uint32_t)(rng_u64(r) >> 32) * n;
            lo = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

float rng_uniform(ErRng *r) { return (float)(rng_u64(r) >> 40) * (1.0f / 16777216.0f); }
double rng_uniform_f64(ErRng *r) { return (double)(rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }

float rng_normal(ErRng *r) {
    double u1 = rng_uniform_f64(r), u2 = rng_uniform_f64(r);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
