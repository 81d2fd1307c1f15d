#pragma once
// 16-bit floating point storage types with round-to-nearest-even conversion.
// Arithmetic is never done in 16 bits: kernels widen to float, compute, and
// narrow once when storing. The conversions are bit-exact functions usable on
// host and device, so CPU and CUDA round identically.
#include <cstdint>
#include <cstring>

#include "runtime/macros.h"

namespace tessel {

TESSEL_HOST_DEVICE_INLINE uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

TESSEL_HOST_DEVICE_INLINE float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// bfloat16: the top 16 bits of a float32, rounded to nearest even.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  TESSEL_HD explicit bf16(float f) : bits(from_float(f)) {}
  TESSEL_HD explicit operator float() const { return bits_float(uint32_t(bits) << 16); }
  TESSEL_HD static bf16 from_bits(uint16_t b) { bf16 h; h.bits = b; return h; }

  TESSEL_HD static uint16_t from_float(float f) {
    uint32_t u = float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN, keep sign
    uint32_t lsb = (u >> 16) & 1u;
    u += 0x7fffu + lsb;  // round to nearest, ties to even; overflow rounds to inf
    return uint16_t(u >> 16);
  }
};

// IEEE binary16.
struct f16 {
  uint16_t bits = 0;
  f16() = default;
  TESSEL_HD explicit f16(float f) : bits(from_float(f)) {}
  TESSEL_HD explicit operator float() const { return to_float(bits); }
  TESSEL_HD static f16 from_bits(uint16_t b) { f16 h; h.bits = b; return h; }

  TESSEL_HD static uint16_t from_float(float f) {
    uint32_t u = float_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
    if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520 -> inf
    if (a < 0x38800000u) {
      // Result is subnormal (or zero) in half: value = a * 2^24 rounded to an integer.
      if (a < 0x33000000u) return uint16_t(sign);  // < 2^-25: rounds to zero (tie at 2^-25 -> 0, even)
      uint32_t e = a >> 23;                        // biased exponent, 102..112
      uint32_t m = (a & 0x7fffffu) | 0x800000u;    // 24-bit significand
      uint32_t shift = 126u - e;                   // 14..24
      uint32_t q = m >> shift;
      uint32_t rem = m & ((1u << shift) - 1u);
      uint32_t half = 1u << (shift - 1u);
      if (rem > half || (rem == half && (q & 1u))) ++q;
      return uint16_t(sign | q);
    }
    // Normal: rebias exponent (127 -> 15) and round the 13 dropped bits.
    uint32_t r = a - 0x38000000u;  // subtract (127-15) << 23
    uint32_t lsb = (r >> 13) & 1u;
    r += 0xfffu + lsb;
    return uint16_t(sign | (r >> 13));
  }

  TESSEL_HD static float to_float(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0x1fu) return bits_float(sign | 0x7f800000u | (m << 13));  // inf / NaN
    if (e == 0) {
      if (m == 0) return bits_float(sign);
      // Subnormal: normalise.
      int shift = 0;
      while ((m & 0x400u) == 0) { m <<= 1; ++shift; }
      m &= 0x3ffu;
      return bits_float(sign | (uint32_t(113 - shift) << 23) | (m << 13));
    }
    return bits_float(sign | ((e + 112u) << 23) | (m << 13));
  }
};

}  // namespace tessel
