// The one seeded RNG (xoshiro256**, seeded through splitmix64). Every random choice in a run
// (init, data order, dropout, sampling) draws from an ErRng derived from --seed, so runs are
// bitwise reproducible. State is plain data: checkpoints save and restore it as 4 words.
#ifndef CORE_RNG_H
#define CORE_RNG_H

#include <stdint.h>

typedef struct {
    uint64_t s[4];
} ErRng;

void rng_seed(ErRng *r, uint64_t seed);
// An independent stream for sub-task `stream` (a sample, a layer, a worker), same seed.
void rng_fork(ErRng *child, const ErRng *parent, uint64_t stream);
uint64_t rng_u64(ErRng *r);
uint32_t rng_below(ErRng *r, uint32_t n); // uniform in [0, n), n > 0
float rng_uniform(ErRng *r);              // [0, 1), 24 random bits
double rng_uniform_f64(ErRng *r);         // [0, 1), 53 random bits
float rng_normal(ErRng *r);               // standard normal (Box-Muller)

#endif
