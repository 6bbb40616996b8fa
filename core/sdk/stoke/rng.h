/* stoke/rng.h: the one random number generator every part uses (init,
 * shuffling, augmentation, dropout, synthetic data), so a seed means the
 * same thing everywhere: splitmix64 to derive streams, xoshiro256** to draw.
 * Pure inline helpers, part of the SDK. */
#ifndef STOKE_RNG_H
#define STOKE_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct stoke_rng {
  uint64_t s[4];
} stoke_rng;

static inline uint64_t stoke_splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* A well-mixed seed from three numbers, e.g. (run seed, epoch, index). */
static inline uint64_t stoke_hash3(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t x = a;
  uint64_t h = stoke_splitmix64(&x);
  x = h ^ b;
  h = stoke_splitmix64(&x);
  x = h ^ c;
  return stoke_splitmix64(&x);
}

static inline stoke_rng stoke_rng_seed(uint64_t seed) {
  stoke_rng r;
  for (int i = 0; i < 4; i++) r.s[i] = stoke_splitmix64(&seed);
  return r;
}

static inline uint64_t stoke_rng_next(stoke_rng *r) {
  uint64_t *s = r->s;
  uint64_t t = s[1] << 17, x = s[1] * 5;
  uint64_t result = ((x << 7) | (x >> 57)) * 9;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = (s[3] << 45) | (s[3] >> 19);
  return result;
}

/* Uniform in [0, 1) with 53 bits. */
static inline double stoke_rng_uniform(stoke_rng *r) {
  return (double)(stoke_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Uniform integer in [0, n). */
static inline uint64_t stoke_rng_below(stoke_rng *r, uint64_t n) {
  return (uint64_t)(stoke_rng_uniform(r) * (double)n) % (n ? n : 1);
}

/* Counter-based uniform in [0, 1): element i of stream `seed`. Every
 * element is independent of the others, so a GPU thread computes its own
 * and CPU and GPU agree bit for bit (dropout masks). */
static inline double stoke_uniform_at(uint64_t seed, uint64_t i) {
  return (double)(stoke_hash3(seed, i, 0x6d61736bull) >> 11) * (1.0 / 9007199254740992.0);
}

/* Standard normal (Box-Muller, one value per call). */
static inline double stoke_rng_normal(stoke_rng *r) {
  double u = stoke_rng_uniform(r), v = stoke_rng_uniform(r);
  if (u < 1e-300) u = 1e-300;
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

#endif
