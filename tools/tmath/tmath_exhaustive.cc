// Exhaustive accuracy check of runtime/tmath.h: every one of the 2^32 float
// inputs of every function, against the double-precision reference rounded to
// float (test/util/tmath_reference.h). One worker thread per core.
//
//   bazel run //tools/tmath:tmath_exhaustive -- [--threads N] [function ...]
//
// Prints per function: the maximum ulp distance to the rounded reference and
// where it occurs, the maximum error against the unrounded reference
// ("frac", in ulps), how many inputs are more than 1 and 2 ulps off, and how
// many NaN outputs are not the canonical quiet NaN. sin/cos are measured on
// |x| <= kTrigMax and must return NaN beyond; erfinv is also reported for
// |y| < 0.999 and 0.999 <= |y| < 1 separately.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/tmath.h"
#include "test/util/tmath_reference.h"

using namespace tessel;
using tessel::tmath_ref::bits;
using tessel::tmath_ref::frac_ulp_error;
using tessel::tmath_ref::from_bits;
using tessel::tmath_ref::ulp_distance;

namespace {

constexpr int kBlock = 4096;

#define BLOCK(fn)                                                    \
  void blk_##fn(const float* __restrict x, float* __restrict y) {   \
    for (int i = 0; i < kBlock; ++i) y[i] = tmath::fn(x[i]);         \
  }
BLOCK(exp)
BLOCK(expm1)
BLOCK(log)
BLOCK(log1p)
BLOCK(tanh)
BLOCK(sigmoid)
BLOCK(erf)
BLOCK(erfinv)
BLOCK(sinpi)
BLOCK(cospi)
BLOCK(sin)
BLOCK(cos)
#undef BLOCK

struct Fn {
  const char* name;
  void (*blk)(const float*, float*);
  double (*ref)(double);
  float limit;  // |x| > limit must give NaN and is not measured (inf: none)
};

#define FN(fn, limit) \
  Fn { #fn, blk_##fn, tmath_ref::ref_##fn, limit }
const float kInf = INFINITY;
const Fn kFns[] = {
    FN(exp, kInf),   FN(expm1, kInf), FN(log, kInf),    FN(log1p, kInf),
    FN(tanh, kInf),  FN(sigmoid, kInf), FN(erf, kInf),  FN(erfinv, kInf),
    FN(sinpi, kInf), FN(cospi, kInf), FN(sin, tmath::detail::kTrigMax),
    FN(cos, tmath::detail::kTrigMax),
};
#undef FN

struct Stats {
  uint64_t max_ulp = 0;
  float worst = 0;
  double max_frac = 0;
  float worst_frac = 0;
  uint64_t over1 = 0, over2 = 0, checked = 0, noncanonical_nan = 0, beyond_not_nan = 0;

  void add(float x, float y, double ref) {
    ++checked;
    uint64_t d = ulp_distance(y, float(ref));
    if (d > max_ulp || checked == 1) {
      max_ulp = d;
      worst = x;
    }
    over1 += d > 1;
    over2 += d > 2;
    double f = frac_ulp_error(y, ref);
    if (f > max_frac) {
      max_frac = f;
      worst_frac = x;
    }
  }
  void merge(const Stats& o) {
    if (o.max_ulp > max_ulp) {
      max_ulp = o.max_ulp;
      worst = o.worst;
    }
    if (o.max_frac > max_frac) {
      max_frac = o.max_frac;
      worst_frac = o.worst_frac;
    }
    over1 += o.over1;
    over2 += o.over2;
    checked += o.checked;
    noncanonical_nan += o.noncanonical_nan;
    beyond_not_nan += o.beyond_not_nan;
  }
};

void print(const char* name, const Stats& s, double seconds) {
  std::printf(
      "%-16s max %llu ulp at %-16a  frac %.3f at %-16a  >1ulp: %llu  >2ulp: %llu  "
      "inputs: %llu  non-canonical NaN: %llu%s  (%.0f s)\n",
      name, (unsigned long long)s.max_ulp, double(s.worst), s.max_frac, double(s.worst_frac),
      (unsigned long long)s.over1, (unsigned long long)s.over2, (unsigned long long)s.checked,
      (unsigned long long)s.noncanonical_nan,
      s.beyond_not_nan ? "  NOT NaN BEYOND RANGE!" : "", seconds);
  std::fflush(stdout);
}

void run(const Fn& f, int threads) {
  constexpr uint64_t kChunk = 1ull << 20;
  std::atomic<uint64_t> next{0};
  std::mutex mu;
  Stats total, near_one;  // near_one: erfinv with 0.999 <= |y| < 1
  const bool split = std::strcmp(f.name, "erfinv") == 0;
  auto t0 = std::chrono::steady_clock::now();
  auto worker = [&] {
    Stats st, st_near;
    std::vector<float> x(kBlock), y(kBlock);
    for (;;) {
      uint64_t c = next.fetch_add(kChunk);
      if (c >= (1ull << 32)) break;
      for (uint64_t b = c; b < c + kChunk; b += kBlock) {
        for (int i = 0; i < kBlock; ++i) x[i] = from_bits(uint32_t(b + uint64_t(i)));
        f.blk(x.data(), y.data());
        for (int i = 0; i < kBlock; ++i) {
          if (std::isnan(y[i]) && bits(y[i]) != 0x7fc00000u) ++st.noncanonical_nan;
          if (std::fabs(x[i]) > f.limit) {
            st.beyond_not_nan += !std::isnan(y[i]);
            continue;
          }
          double ref = f.ref(double(x[i]));
          if (split && std::fabs(x[i]) >= 0.999f && std::fabs(x[i]) < 1.0f)
            st_near.add(x[i], y[i], ref);
          else
            st.add(x[i], y[i], ref);
        }
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    total.merge(st);
    near_one.merge(st_near);
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (split) {
    Stats all = total;
    all.merge(near_one);
    print(f.name, all, secs);
    print("  |y|<0.999", total, secs);
    print("  0.999<=|y|<1", near_one, secs);
  } else {
    print(f.name, total, secs);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int threads = int(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::string> names;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else {
      names.push_back(argv[i]);
    }
  }
  std::printf("tmath exhaustive sweep, %d threads\n", threads);
  for (const Fn& f : kFns) {
    if (!names.empty() && std::find(names.begin(), names.end(), f.name) == names.end()) continue;
    run(f, threads);
  }
  return 0;
}
