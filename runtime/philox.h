#pragma once
// Philox4x32-10 (Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3",
// SC'11; the Random123 library), and the mapping from (seed, stream, element)
// to random values that makes every random op shard-invariant
// (docs/design.md §4 level 1). Host/device code: CPU and CUDA draw the same bits.
//
// The contract, for an op with key (seed, stream) producing a tensor whose
// *global* row-major linear element index is e:
//   key     = {seed & 0xffffffff, seed >> 32}
//   counter = {b & 0xffffffff, b >> 32, stream & 0xffffffff, stream >> 32}
//             with block b = e / 4 (float32 draws) and word w = e % 4;
//   bits(e) = philox4x32_10(counter, key)[w].
// Values derive from bits(e) alone (uniform, bernoulli, randint) or from the
// pair of words {2*(w/2), 2*(w/2)+1} of the same block (normal: Box-Muller,
// cosine branch for even e, sine branch for odd e). Float64 draws use a block
// of two elements: b = e / 2, words {2*(e%2), 2*(e%2)+1} form 64 bits.
// Nothing depends on which device, thread or shard computes element e.
//
// The values, per distribution (kernels/random_math.h is the one definition;
// C = float for float32/float16/bfloat16, double for float64; 16-bit results
// round once on store):
//   uniform [lo, hi): lo + u01 * (hi - lo) in C (float64: u01_double of the
//     element's 64 bits); a result that rounds to >= hi (or below lo) is
//     replaced by the largest (smallest) value of the dtype inside the range.
//   normal: mean + std * z, z by Box-Muller from the pair of words
//     (p, p+1) = (2*(w/2), 2*(w/2)+1): u1 = u01_open0(word p),
//     u2 = u01(word p+1), r = sqrt(-2 log u1), z = r * cospi(2 u2) for even e,
//     r * sinpi(2 u2) for odd e. Float64: u1 = u01_double_open0(words 0, 1),
//     u2 = u01_double(words 2, 3) of block e / 2; cosine for even e, sine for odd.
//   trunc_normal (mean, std, [a, b]), by the inverse CDF, no rejection:
//     u = ((x >> 9) * 2 + 1) * 2^-24 in (0, 1) (float64: ((m >> 1) * 2 + 1) * 2^-53
//     with m the top 53 of the element's 64 bits), v = vlo + u * (vhi - vlo)
//     with vlo/vhi = erf((a|b - mean) / (std sqrt 2)) (= 2 Phi - 1, computed
//     once in double), value = mean + std * sqrt(2) * erfinv(v) clamped to [a, b].
//   bernoulli(p), the dropout mask and randint always use one word per element
//   (b = e / 4, w = e % 4), whatever the output dtype:
//     bernoulli: (x >> 8) < ceil(p * 2^24)  (i.e. u01(x) < p);
//     dropout(p): keep where (x >> 8) < ceil((1 - p) * 2^24) (= bernoulli(1 - p));
//     randint [lo, hi): lo + bounded(x, hi - lo), hi - lo <= 2^32 - 1; each
//     value has probability floor or ceil of 2^32 / range, over 2^32: within
//     2^-32 of 1/range (relative bias below range / 2^32).
#include <cstdint>

#include "runtime/macros.h"

namespace tessel {

struct PhiloxKey {
  uint64_t seed = 0;
  uint64_t stream = 0;
};

struct Philox4 {
  uint32_t v[4];
};

namespace philox {

inline constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
inline constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

TESSEL_HOST_DEVICE_INLINE void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = uint64_t(a) * uint64_t(b);
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}

// The raw generator: R rounds (10 for Philox4x32-10).
template <int R = 10>
TESSEL_HOST_DEVICE_INLINE Philox4 philox4x32(Philox4 ctr, uint32_t k0, uint32_t k1) {
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int r = 0; r < R; ++r) {
    if (r > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kM0, ctr.v[0], hi0, lo0);
    mulhilo(kM1, ctr.v[2], hi1, lo1);
    ctr = Philox4{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
  }
  return ctr;
}

// The four words of block `b` for a key.
TESSEL_HOST_DEVICE_INLINE Philox4 block(const PhiloxKey& key, uint64_t b) {
  Philox4 ctr{{uint32_t(b), uint32_t(b >> 32), uint32_t(key.stream), uint32_t(key.stream >> 32)}};
  return philox4x32<10>(ctr, uint32_t(key.seed), uint32_t(key.seed >> 32));
}

// uint32 -> float in [0, 1): the top 24 bits, exactly representable.
TESSEL_HOST_DEVICE_INLINE float u01(uint32_t x) { return float(x >> 8) * 5.9604644775390625e-8f; }
// uint32 -> float in (0, 1]: for logarithms.
TESSEL_HOST_DEVICE_INLINE float u01_open0(uint32_t x) { return float((x >> 8) + 1u) * 5.9604644775390625e-8f; }
// two uint32 -> double in [0, 1): 53 bits.
TESSEL_HOST_DEVICE_INLINE double u01_double(uint32_t lo, uint32_t hi) {
  uint64_t m = ((uint64_t(hi) << 32) | lo) >> 11;
  return double(m) * 1.1102230246251565e-16;  // 2^-53
}
TESSEL_HOST_DEVICE_INLINE double u01_double_open0(uint32_t lo, uint32_t hi) {
  uint64_t m = (((uint64_t(hi) << 32) | lo) >> 11) + 1u;
  return double(m) * 1.1102230246251565e-16;
}

// Bits for element e (float32 layout).
TESSEL_HOST_DEVICE_INLINE uint32_t bits_at(const PhiloxKey& key, uint64_t e) {
  return block(key, e >> 2).v[e & 3];
}

// Integer in [0, range) from one word (multiply-shift; bias < range / 2^32).
TESSEL_HOST_DEVICE_INLINE uint32_t bounded(uint32_t x, uint32_t range) {
  return uint32_t((uint64_t(x) * uint64_t(range)) >> 32);
}

}  // namespace philox

// Deterministic 64-bit mixing for deriving stream ids from names and counters
// (splitmix64 finaliser / FNV-1a). Same result on every platform.
TESSEL_HOST_DEVICE_INLINE uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline uint64_t hash_string(const char* s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; ++s) h = (h ^ uint8_t(*s)) * 0x100000001b3ull;
  return mix64(h);
}
// A stream id from parts every configuration shares (site hash, step, call index).
inline uint64_t combine_stream(uint64_t a, uint64_t b) { return mix64(a ^ mix64(b)); }

}  // namespace tessel
