#include "checkpoint/crc32c.h"

#include <cstring>

namespace tessel::checkpoint {
namespace {

constexpr uint32_t kPoly = 0x82f63b78u;  // reflected Castagnoli polynomial

struct Table {
  uint32_t t[256];
  constexpr Table() : t() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[i] = c;
    }
  }
};
constexpr Table kTable;

uint32_t extend_table(uint32_t c, const unsigned char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) c = kTable.t[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c;
}

__attribute__((target("sse4.2"))) uint32_t extend_hw(uint32_t c32, const unsigned char* p, size_t n) {
  uint64_t c = c32;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = __builtin_ia32_crc32qi(uint32_t(c), *p++);
    --n;
  }
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c = __builtin_ia32_crc32di(c, w);
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = __builtin_ia32_crc32qi(uint32_t(c), *p++);
  return uint32_t(c);
}

bool has_sse42() {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}

// Multiplication modulo the polynomial in the reflected representation
// (zlib's multmodp), and x^(2^k) mod P by repeated squaring.
uint32_t multmodp(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

struct PowTable {
  uint32_t x2n[32];
  PowTable() {
    uint32_t p = 1u << 30;  // x^1
    x2n[0] = p;
    for (int k = 1; k < 32; ++k) x2n[k] = p = multmodp(p, p);
  }
};

// x^(n * 2^k) mod P.
uint32_t x2nmodp(uint64_t n, unsigned k) {
  static const PowTable table;
  uint32_t p = 1u << 31;  // x^0
  while (n) {
    if (n & 1) p = multmodp(table.x2n[k & 31], p);
    n >>= 1;
    ++k;
  }
  return p;
}

}  // namespace

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  const uint32_t c = ~crc;
  return ~(has_sse42() ? extend_hw(c, p, n) : extend_table(c, p, n));
}

namespace detail {
uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n) {
  return ~extend_table(~crc, static_cast<const unsigned char*>(data), n);
}
}  // namespace detail

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  return multmodp(x2nmodp(len_b, 3), crc_a) ^ crc_b;
}

}  // namespace tessel::checkpoint
