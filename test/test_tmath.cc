// Tests for runtime/tmath.h: accuracy sweeps against double references,
// special values, signed zeros, and bitwise reproducibility (scalar vs
// vectorised code, and a checksum over a fixed input set that any change of
// arithmetic — e.g. a stray -ffp-contract=fast — would break).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "runtime/tmath.h"
#include "test/util/tmath_reference.h"

using namespace tessel;
using tessel::tmath_ref::bits;
using tessel::tmath_ref::from_bits;
using tessel::tmath_ref::ulp_distance;

namespace {

constexpr int kBlock = 1024;

// One vectorisable block loop per function (fixed trip count so GCC
// vectorises it even under -O2's very-cheap cost model — checked with
// --per_file_copt=test/test_tmath.cc@-fopt-info-vec-optimized: all twelve
// vec_* loops use 32-byte vectors), and the same loop with vectorisation
// disabled.
#define TMATH_BLOCKS(fn)                                                                       \
  void vec_##fn(const float* __restrict x, float* __restrict y) {                             \
    for (int i = 0; i < kBlock; ++i) y[i] = tmath::fn(x[i]);                                   \
  }                                                                                            \
  __attribute__((noinline, optimize("no-tree-vectorize"))) void scalar_##fn(const float* x,    \
                                                                            float* y) {        \
    for (int i = 0; i < kBlock; ++i) y[i] = tmath::fn(x[i]);                                   \
  }
TMATH_BLOCKS(exp)
TMATH_BLOCKS(expm1)
TMATH_BLOCKS(log)
TMATH_BLOCKS(log1p)
TMATH_BLOCKS(tanh)
TMATH_BLOCKS(sigmoid)
TMATH_BLOCKS(erf)
TMATH_BLOCKS(erfinv)
TMATH_BLOCKS(sinpi)
TMATH_BLOCKS(cospi)
TMATH_BLOCKS(sin)
TMATH_BLOCKS(cos)

using BlockFn = void (*)(const float*, float*);
using RefFn = double (*)(double);

struct Fn {
  const char* name;
  BlockFn vec;
  BlockFn scalar;
  RefFn ref;
  float lo, hi;  // inputs outside [lo, hi] are not checked by the sweeps
};

const float kInf = std::numeric_limits<float>::infinity();

#define FN(fn, lo, hi) \
  Fn { #fn, vec_##fn, scalar_##fn, tmath_ref::ref_##fn, lo, hi }
const Fn kFns[] = {
    FN(exp, -kInf, kInf),   FN(expm1, -kInf, kInf),  FN(log, -kInf, kInf),
    FN(log1p, -kInf, kInf), FN(tanh, -kInf, kInf),   FN(sigmoid, -kInf, kInf),
    FN(erf, -kInf, kInf),   FN(erfinv, -kInf, kInf), FN(sinpi, -kInf, kInf),
    FN(cospi, -kInf, kInf), FN(sin, -tmath::detail::kTrigMax, tmath::detail::kTrigMax),
    FN(cos, -tmath::detail::kTrigMax, tmath::detail::kTrigMax),
};
#undef FN

const Fn& find(const char* name) {
  for (const Fn& f : kFns)
    if (std::string(f.name) == name) return f;
  FAIL("no function " << name);
  return kFns[0];
}

struct SweepResult {
  uint64_t max_ulp = 0;
  float worst = 0;
  uint64_t checked = 0;
};

// Checks every `step`-th bit pattern in [first, last] (inclusive, as uint32).
SweepResult sweep(const Fn& f, uint64_t first, uint64_t last, uint64_t step) {
  SweepResult res;
  std::vector<float> x(kBlock), y(kBlock);
  uint64_t u = first;
  while (u <= last) {
    int n = 0;
    for (; n < kBlock && u <= last; ++n, u += step) x[n] = from_bits(uint32_t(u));
    for (int i = n; i < kBlock; ++i) x[i] = 0.0f;
    f.vec(x.data(), y.data());
    for (int i = 0; i < n; ++i) {
      if (!(x[i] >= f.lo && x[i] <= f.hi) && !std::isnan(x[i])) continue;
      float ref = float(f.ref(double(x[i])));
      uint64_t d = ulp_distance(y[i], ref);
      ++res.checked;
      if (d > res.max_ulp) {
        res.max_ulp = d;
        res.worst = x[i];
      }
    }
  }
  return res;
}

// All floats in [a, b], every `step`-th.
SweepResult sweep_range(const Fn& f, float a, float b, uint64_t step = 1) {
  if (a < 0.0f && b > 0.0f) {  // bit patterns are ordered per sign
    SweepResult n = sweep_range(f, a, -0.0f, step), p = sweep_range(f, 0.0f, b, step);
    p.checked += n.checked;
    if (n.max_ulp > p.max_ulp) {
      p.max_ulp = n.max_ulp;
      p.worst = n.worst;
    }
    return p;
  }
  uint32_t ua = bits(a), ub = bits(b);
  return sweep(f, std::min(ua, ub), std::max(ua, ub), step);
}

// Within one ulp of the double reference rounded to float.
bool close(float y, double ref) { return ulp_distance(y, float(ref)) <= 1; }

#define CHECK_SWEEP(result, bound)                                                       \
  do {                                                                                   \
    SweepResult r_ = (result);                                                           \
    INFO("max " << r_.max_ulp << " ulp at " << std::hexfloat << r_.worst << " ("       \
                << std::defaultfloat << r_.checked << " inputs)");                      \
    CHECK(r_.checked > 0);                                                               \
    CHECK(r_.max_ulp <= (bound));                                                        \
  } while (0)

// Bound asserted by the sweeps: the measured exhaustive maximum (see the
// comments in runtime/tmath.h). The contract is 2 ulp (4 for erfinv).
uint64_t bound_for(const std::string& name) { return name == "erfinv" ? 2 : 1; }

}  // namespace

TEST_CASE("tmath: dense sweep over all float bit patterns within the ulp bound") {
  // Every 1021st bit pattern: ~4.2M inputs per function, all binades, both
  // signs, subnormals, infinities and NaNs.
  for (const Fn& f : kFns) {
    SECTION(f.name) { CHECK_SWEEP(sweep(f, 0, 0xffffffffull, 1021), bound_for(f.name)); }
  }
}

TEST_CASE("tmath: every float in the delicate ranges") {
  SECTION("exp near overflow, underflow and the subnormal boundary") {
    const Fn& f = find("exp");
    CHECK_SWEEP(sweep_range(f, 88.5f, 88.8f), 1);
    CHECK_SWEEP(sweep_range(f, -104.0f, -103.9f), 1);
    CHECK_SWEEP(sweep_range(f, -87.5f, -87.2f), 1);
    CHECK_SWEEP(sweep_range(f, -0.4f, 0.4f, 97), 1);  // the n = 0 piece
  }
  SECTION("expm1 around the reduction boundaries") {
    const Fn& f = find("expm1");
    CHECK_SWEEP(sweep_range(f, 16.9f, 17.7f), 1);    // n = 24 / 25
    CHECK_SWEEP(sweep_range(f, -17.7f, -16.9f), 1);  // n = -24 / -25
    CHECK_SWEEP(sweep_range(f, 0.3f, 0.75f, 7), 1);  // n = 0 / 1
    CHECK_SWEEP(sweep_range(f, -0.75f, -0.3f, 7), 1);
    CHECK_SWEEP(sweep_range(f, 88.0f, 88.8f), 1);    // n = 127 / 128
  }
  SECTION("log and log1p near 1, 0, -1 and over the subnormals") {
    CHECK_SWEEP(sweep_range(find("log"), 0.99f, 1.01f), 1);
    CHECK_SWEEP(sweep_range(find("log"), 0x1p-149f, 0x1p-125f, 13), 1);
    CHECK_SWEEP(sweep_range(find("log1p"), -1.0f, -0.999f), 1);
    CHECK_SWEEP(sweep_range(find("log1p"), -0.3f, 0.42f, 31), 1);
    CHECK_SWEEP(sweep_range(find("log1p"), 0.99f, 1.01f), 1);
  }
  SECTION("tanh, sigmoid and erf around their piece boundaries") {
    CHECK_SWEEP(sweep_range(find("tanh"), 0.99f, 1.01f), 1);
    CHECK_SWEEP(sweep_range(find("tanh"), 8.5f, 9.5f, 3), 1);
    CHECK_SWEEP(sweep_range(find("sigmoid"), -90.0f, -80.0f, 3), 1);
    CHECK_SWEEP(sweep_range(find("sigmoid"), 15.0f, 18.0f, 3), 1);
    CHECK_SWEEP(sweep_range(find("erf"), 0.74f, 0.76f), 1);
    CHECK_SWEEP(sweep_range(find("erf"), 1.49f, 1.51f), 1);
    CHECK_SWEEP(sweep_range(find("erf"), 3.8f, 4.0f), 1);
  }
  SECTION("erfinv near +-1 and at the central/tail switch") {
    const Fn& f = find("erfinv");
    // The last 2^20 floats below 1 (|y| > 1 - 2^-4).
    CHECK_SWEEP(sweep(f, bits(1.0f) - (1u << 20), bits(1.0f), 1), 2);
    CHECK_SWEEP(sweep_range(f, 0.995f, 0.998f), 2);
    CHECK_SWEEP(sweep_range(f, -0.9f, -0.3f, 7), 2);
  }
  SECTION("sinpi / cospi on the Box-Muller range [0, 2) and near integers") {
    CHECK_SWEEP(sweep_range(find("sinpi"), 0.0f, 2.0f, 257), 1);
    CHECK_SWEEP(sweep_range(find("cospi"), 0.0f, 2.0f, 257), 1);
    CHECK_SWEEP(sweep_range(find("sinpi"), 0.999f, 1.001f), 1);
    CHECK_SWEEP(sweep_range(find("cospi"), 0.499f, 0.501f), 1);
    CHECK_SWEEP(sweep_range(find("sinpi"), 4194200.0f, 4194400.0f), 1);  // around 2^22
    CHECK_SWEEP(sweep_range(find("cospi"), 4194200.0f, 4194400.0f), 1);
    CHECK_SWEEP(sweep_range(find("sinpi"), 8388500.0f, 8388700.0f), 1);  // around 2^23
    CHECK_SWEEP(sweep_range(find("cospi"), 16777000.0f, 16777400.0f), 1);  // around 2^24
  }
  SECTION("sin / cos near multiples of pi/2 and up to the documented range") {
    for (double k : {1.0, 2.0, 7.0, 1000.0, 65536.0, 4000000.0}) {
      float c = float(k * 1.57079632679489661923);
      float a = c * (1 - 1e-4f), b = c * (1 + 1e-4f);
      CHECK_SWEEP(sweep_range(find("sin"), a, b), 1);
      CHECK_SWEEP(sweep_range(find("cos"), a, b), 1);
    }
    CHECK_SWEEP(sweep_range(find("sin"), 6.0e6f, tmath::detail::kTrigMax, 5), 1);
    CHECK_SWEEP(sweep_range(find("cos"), -tmath::detail::kTrigMax, -6.0e6f, 5), 1);
  }
}

TEST_CASE("tmath: special values") {
  const float inf = kInf;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float snan = std::numeric_limits<float>::signaling_NaN();
  const float neg_nan = -nan;
  const uint32_t kCanonNaN = 0x7fc00000u;
  auto is_pos_zero = [](float v) { return bits(v) == 0u; };
  auto is_neg_zero = [](float v) { return bits(v) == 0x80000000u; };

  // NaN in -> canonical NaN out, for every function and NaN flavour.
  for (float n : {nan, snan, neg_nan, from_bits(0x7f800001u), from_bits(0xffc12345u)}) {
    float x[kBlock], y[kBlock], z[kBlock];
    for (int i = 0; i < kBlock; ++i) x[i] = n;
    for (const Fn& f : kFns) {
      f.vec(x, y);
      f.scalar(x, z);
      INFO(f.name << " of NaN 0x" << std::hex << bits(n));
      CHECK(bits(y[0]) == kCanonNaN);
      CHECK(bits(y[kBlock - 1]) == kCanonNaN);
      CHECK(bits(z[0]) == kCanonNaN);
    }
  }

  // exp / expm1
  CHECK(tmath::exp(inf) == inf);
  CHECK(is_pos_zero(tmath::exp(-inf)));
  CHECK(tmath::exp(0.0f) == 1.0f);
  CHECK(tmath::exp(-0.0f) == 1.0f);
  CHECK(tmath::exp(88.8f) == inf);   // overflow
  CHECK(tmath::exp(1e30f) == inf);
  CHECK(close(tmath::exp(88.72f), std::exp(double(88.72f))));  // largest finite results
  CHECK(std::isfinite(tmath::exp(88.72f)));
  CHECK(is_pos_zero(tmath::exp(-104.0f)));               // underflow
  CHECK(is_pos_zero(tmath::exp(-1e30f)));
  CHECK(close(tmath::exp(-103.0f), std::exp(-103.0)));  // subnormal result
  CHECK(tmath::exp(-103.0f) > 0.0f);
  CHECK(close(tmath::exp(-103.9f), std::exp(double(-103.9f))));
  CHECK(tmath::exp(-103.9f) > 0.0f);
  CHECK(tmath::expm1(inf) == inf);
  CHECK(tmath::expm1(-inf) == -1.0f);
  CHECK(tmath::expm1(100.0f) == inf);
  CHECK(close(tmath::expm1(88.7f), std::expm1(double(88.7f))));
  CHECK(is_neg_zero(tmath::expm1(-0.0f)));
  CHECK(is_pos_zero(tmath::expm1(0.0f)));
  CHECK(tmath::expm1(from_bits(1u)) == from_bits(1u));
  CHECK(tmath::expm1(-from_bits(1u)) == -from_bits(1u));
  CHECK(tmath::expm1(-1e30f) == -1.0f);

  // log / log1p
  CHECK(tmath::log(0.0f) == -inf);
  CHECK(tmath::log(-0.0f) == -inf);
  CHECK(std::isnan(tmath::log(-1.0f)));
  CHECK(std::isnan(tmath::log(-from_bits(1u))));
  CHECK(std::isnan(tmath::log(-inf)));
  CHECK(tmath::log(inf) == inf);
  CHECK(is_pos_zero(tmath::log(1.0f)));
  CHECK(close(tmath::log(from_bits(1u)), std::log(std::ldexp(1.0, -149))));  // subnormal input
  CHECK(close(tmath::log(from_bits(0x007fffffu)), std::log(double(from_bits(0x007fffffu)))));
  CHECK(close(tmath::log(std::numeric_limits<float>::max()), std::log(3.4028234663852886e38)));
  CHECK(tmath::log1p(-1.0f) == -inf);
  CHECK(std::isnan(tmath::log1p(-1.5f)));
  CHECK(std::isnan(tmath::log1p(-inf)));
  CHECK(tmath::log1p(inf) == inf);
  CHECK(is_neg_zero(tmath::log1p(-0.0f)));
  CHECK(is_pos_zero(tmath::log1p(0.0f)));
  CHECK(tmath::log1p(from_bits(1u)) == from_bits(1u));
  CHECK(tmath::log1p(1e-30f) == 1e-30f);
  CHECK(close(tmath::log1p(std::numeric_limits<float>::max()), std::log(3.4028234663852886e38)));

  // tanh / sigmoid
  CHECK(tmath::tanh(inf) == 1.0f);
  CHECK(tmath::tanh(-inf) == -1.0f);
  CHECK(tmath::tanh(10.0f) == 1.0f);
  CHECK(is_neg_zero(tmath::tanh(-0.0f)));
  CHECK(is_pos_zero(tmath::tanh(0.0f)));
  CHECK(tmath::tanh(-from_bits(1u)) == -from_bits(1u));
  CHECK(tmath::sigmoid(inf) == 1.0f);
  CHECK(is_pos_zero(tmath::sigmoid(-inf)));
  CHECK(tmath::sigmoid(0.0f) == 0.5f);
  CHECK(tmath::sigmoid(-0.0f) == 0.5f);
  CHECK(tmath::sigmoid(100.0f) == 1.0f);
  CHECK(close(tmath::sigmoid(-100.0f), 1.0 / (1.0 + std::exp(100.0))));  // subnormal
  CHECK(tmath::sigmoid(-100.0f) > 0.0f);
  CHECK(is_pos_zero(tmath::sigmoid(-200.0f)));

  // erf / erfinv
  CHECK(tmath::erf(inf) == 1.0f);
  CHECK(tmath::erf(-inf) == -1.0f);
  CHECK(tmath::erf(4.0f) == 1.0f);
  CHECK(is_neg_zero(tmath::erf(-0.0f)));
  CHECK(is_pos_zero(tmath::erf(0.0f)));
  CHECK(tmath::erfinv(1.0f) == inf);
  CHECK(tmath::erfinv(-1.0f) == -inf);
  CHECK(std::isnan(tmath::erfinv(1.0000001f)));
  CHECK(std::isnan(tmath::erfinv(-2.0f)));
  CHECK(std::isnan(tmath::erfinv(inf)));
  CHECK(std::isnan(tmath::erfinv(-inf)));
  CHECK(is_neg_zero(tmath::erfinv(-0.0f)));
  CHECK(is_pos_zero(tmath::erfinv(0.0f)));
  CHECK(std::isfinite(tmath::erfinv(0.99999994f)));  // largest float below 1
  CHECK(ulp_distance(tmath::erfinv(0.99999994f), float(tmath::erfinv(double(0.99999994f)))) <= 2);

  // sinpi / cospi
  CHECK(is_neg_zero(tmath::sinpi(-0.0f)));
  CHECK(is_pos_zero(tmath::sinpi(0.0f)));
  CHECK(is_pos_zero(tmath::sinpi(1.0f)));
  CHECK(is_pos_zero(tmath::sinpi(2.0f)));
  CHECK(is_neg_zero(tmath::sinpi(-1.0f)));
  CHECK(is_neg_zero(tmath::sinpi(-2.0f)));
  CHECK(is_pos_zero(tmath::sinpi(1e30f)));
  CHECK(tmath::sinpi(0.5f) == 1.0f);
  CHECK(tmath::sinpi(1.5f) == -1.0f);
  CHECK(tmath::sinpi(-0.5f) == -1.0f);
  CHECK(close(tmath::sinpi(0.25f), std::sqrt(0.5)));
  CHECK(tmath::sinpi(8388609.0f) == 0.0f);      // odd integer above 2^23
  CHECK(tmath::sinpi(4194304.5f) == 1.0f);      // x.5 just above 2^22
  CHECK(tmath::cospi(8388609.0f) == -1.0f);
  CHECK(tmath::cospi(16777216.0f) == 1.0f);
  CHECK(tmath::cospi(0.0f) == 1.0f);
  CHECK(tmath::cospi(-0.0f) == 1.0f);
  CHECK(tmath::cospi(1.0f) == -1.0f);
  CHECK(is_pos_zero(tmath::cospi(0.5f)));
  CHECK(is_pos_zero(tmath::cospi(-0.5f)));
  CHECK(is_pos_zero(tmath::cospi(1.5f)));
  CHECK(std::isnan(tmath::sinpi(inf)));
  CHECK(std::isnan(tmath::sinpi(-inf)));
  CHECK(std::isnan(tmath::cospi(inf)));
  CHECK(tmath::sinpi(from_bits(1u)) == float(3.14159265358979 * std::ldexp(1.0, -149)));

  // sin / cos
  CHECK(is_neg_zero(tmath::sin(-0.0f)));
  CHECK(is_pos_zero(tmath::sin(0.0f)));
  CHECK(tmath::sin(from_bits(1u)) == from_bits(1u));
  CHECK(tmath::cos(0.0f) == 1.0f);
  CHECK(tmath::cos(-0.0f) == 1.0f);
  CHECK(std::isnan(tmath::sin(inf)));
  CHECK(std::isnan(tmath::sin(-inf)));
  CHECK(std::isnan(tmath::cos(inf)));
  CHECK(close(tmath::sin(1e5f), std::sin(1e5)));
  CHECK(close(tmath::cos(1e5f), std::cos(1e5)));
  // Beyond the documented range: NaN rather than a silently wrong value.
  CHECK(std::isnan(tmath::sin(7e6f)));
  CHECK(std::isnan(tmath::cos(-1e30f)));
  CHECK(!std::isnan(tmath::sin(tmath::detail::kTrigMax)));
}

TEST_CASE("tmath: bitwise reproducibility") {
  // A large input set covering all binades: every 4099th bit pattern plus
  // uniform values in typical ranges.
  std::vector<float> xs;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4099) xs.push_back(from_bits(uint32_t(u)));
  for (int i = 0; i < 200000; ++i) xs.push_back(-20.0f + 40.0f * float(i) / 200000.0f);
  xs.resize((xs.size() + kBlock - 1) / kBlock * kBlock, 0.5f);

  SECTION("scalar and vectorised loops give identical bits") {
    std::vector<float> a(xs.size()), b(xs.size());
    for (const Fn& f : kFns) {
      for (size_t i = 0; i < xs.size(); i += kBlock) {
        f.vec(&xs[i], &a[i]);
        f.scalar(&xs[i], &b[i]);
      }
      size_t mismatches = 0, first = 0;
      for (size_t i = 0; i < xs.size(); ++i)
        if (bits(a[i]) != bits(b[i]) && mismatches++ == 0) first = i;
      INFO(f.name << ": " << mismatches << " mismatches, first at x = " << std::hexfloat
                  << xs[first]);
      CHECK(mismatches == 0);
    }
  }

  SECTION("same input twice gives the same bits, and single calls match the loops") {
    std::vector<float> a(kBlock), b(kBlock);
    for (const Fn& f : kFns) {
      f.vec(xs.data(), a.data());
      f.vec(xs.data(), b.data());
      for (int i = 0; i < kBlock; ++i) CHECK(bits(a[i]) == bits(b[i]));
    }
    const float x = 0.73f;
    CHECK(bits(tmath::exp(x)) == bits(tmath::exp(x)));
    float in[kBlock], out[kBlock];
    for (int i = 0; i < kBlock; ++i) in[i] = x;
    vec_erf(in, out);
    volatile float vx = x;  // defeat constant folding: a genuine run-time call
    CHECK(bits(out[17]) == bits(tmath::erf(vx)));
    vec_sin(in, out);
    CHECK(bits(out[0]) == bits(tmath::sin(vx)));
  }
}

TEST_CASE("tmath: golden checksums pin the exact bits of every function") {
  // FNV-1a over the output bits for 2^20 inputs spread over all bit
  // patterns. These values are the cross-platform contract: the CUDA build
  // must reproduce them. They change only if the arithmetic changes — a new
  // polynomial (update the constants deliberately) or a build that breaks the
  // rules (contraction, fast-math, flush-to-zero): then this test fails.
  struct Golden {
    const char* name;
    uint64_t hash;
  };
  const Golden golden[] = {
      {"exp", 0x17fe13c5705473dfull},   {"expm1", 0x4b516001469e84b9ull},
      {"log", 0x8e04f5b93759b335ull},   {"log1p", 0x0d26dbdce448dc30ull},
      {"tanh", 0xfe600b5785c5f35bull},  {"sigmoid", 0x1a630bbf691b6d7cull},
      {"erf", 0xd2660b67decde249ull},   {"erfinv", 0x71df72590b059e8aull},
      {"sinpi", 0xca951bc10434c90bull}, {"cospi", 0xd0751c7283d39bf8ull},
      {"sin", 0x2df53abf5ab661edull},   {"cos", 0xb7b2e0641ce377c2ull},
  };
  std::vector<float> x(kBlock), y(kBlock);
  for (const Golden& g : golden) {
    const Fn& f = find(g.name);
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t i = 0; i < (1u << 20); i += kBlock) {
      for (int j = 0; j < kBlock; ++j) x[j] = from_bits((i + uint32_t(j)) * 4099u + 12345u);
      f.vec(x.data(), y.data());
      for (int j = 0; j < kBlock; ++j) {
        h ^= bits(y[j]);
        h *= 0x100000001b3ull;
      }
    }
    INFO(g.name << " checksum 0x" << std::hex << h);
    CHECK(h == g.hash);
  }
}

TEST_CASE("tmath: double overloads") {
  SECTION("forwarders match std") {
    for (double x : {-3.5, -0.1, 0.0, 0.7, 2.0, 30.0}) {
      CHECK(tmath::exp(x) == std::exp(x));
      CHECK(tmath::expm1(x) == std::expm1(x));
      CHECK(tmath::tanh(x) == std::tanh(x));
      CHECK(tmath::erf(x) == std::erf(x));
      CHECK(tmath::sin(x) == std::sin(x));
      CHECK(tmath::cos(x) == std::cos(x));
    }
    CHECK(tmath::log(2.5) == std::log(2.5));
    CHECK(tmath::log1p(1e-10) == std::log1p(1e-10));
  }
  SECTION("sigmoid is stable") {
    CHECK(tmath::sigmoid(0.0) == 0.5);
    CHECK(tmath::sigmoid(-800.0) == 0.0);
    CHECK(tmath::sigmoid(800.0) == 1.0);
    CHECK(tmath::sigmoid(-700.0) == Approx(std::exp(-700.0)).epsilon(1e-14));
    CHECK(tmath::sigmoid(2.0) == Approx(1.0 / (1.0 + std::exp(-2.0))).epsilon(1e-15));
  }
  SECTION("sinpi / cospi reduce exactly") {
    CHECK(tmath::sinpi(1.0) == 0.0);
    CHECK(std::signbit(tmath::sinpi(-1.0)));
    CHECK(tmath::sinpi(0.5) == 1.0);
    CHECK(tmath::cospi(0.5) == 0.0);
    CHECK(!std::signbit(tmath::cospi(0.5)));
    CHECK(tmath::cospi(1e17 + 1.0) == 1.0);  // even integer (1e17+1 rounds to even)
    CHECK(tmath::sinpi(1e-300) == Approx(3.14159265358979323846e-300).epsilon(1e-15));
    CHECK(tmath::sinpi(1.0 / 6.0) == Approx(0.5).epsilon(1e-15));
    CHECK(tmath::cospi(2.0 / 3.0) == Approx(-0.5).epsilon(1e-15));
    CHECK(std::isnan(tmath::sinpi(std::numeric_limits<double>::infinity())));
  }
  SECTION("erfinv against high-precision values (mpmath, 40 digits)") {
    struct Case {
      double y, x;
    };
    const Case cases[] = {
        {1e-300, 8.8622692545275803586e-301},
        {1e-10, 8.8622692545275804594e-11},
        {0.1, 0.088855990494257691974},
        {0.25, 0.22531205501217810473},
        {0.5, 0.47693627620446987338},
        {0.75, 0.81341984759761854169},
        {0.9, 1.1630871536766741628},
        {0.99, 1.8213863677184494559},
        {0.999999, 3.4589107372754987775},
        {0.999999999999, 5.0420318985726961301},
        {1.0 - 0x1p-53, 5.8635847487551679272},
        {-0.3, -0.27246271472675434502},
    };
    for (const Case& c : cases) {
      INFO("erfinv(" << c.y << ")");
      double v = tmath::erfinv(c.y);
      CHECK(std::fabs(v - c.x) <= 4e-15 * std::fabs(c.x));
    }
    CHECK(tmath::erfinv(1.0) == std::numeric_limits<double>::infinity());
    CHECK(tmath::erfinv(-1.0) == -std::numeric_limits<double>::infinity());
    CHECK(std::isnan(tmath::erfinv(1.5)));
    CHECK(std::isnan(tmath::erfinv(std::numeric_limits<double>::quiet_NaN())));
    CHECK(std::signbit(tmath::erfinv(-0.0)));
  }
  SECTION("erfinv round-trips through erf / erfc") {
    for (int i = -999; i <= 999; ++i) {
      double y = i / 1000.0;
      double x = tmath::erfinv(y);
      if (std::fabs(y) <= 0.5)
        CHECK(std::fabs(std::erf(x) - y) <= 1e-15 * std::fabs(y));
      else
        CHECK(std::fabs(std::erfc(std::fabs(x)) - (1 - std::fabs(y))) <=
              1e-14 * (1 - std::fabs(y)));
    }
  }
}
