// Random ops: the documented element mapping, shard/thread/layout invariance
// (bitwise), statistics, dropout (mask, gradients) and error paths.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <set>

#include "autograd/api.h"
#include "autograd/ops/common.h"
#include "kernels/elementwise.h"
#include "kernels/random.h"
#include "runtime/threadpool.h"
#include "runtime/tmath.h"
#include "test/skip.h"
#include "test/util/util.h"

using namespace tessel;
using tessel::testing::bitwise_equal;

namespace {

const PhiloxKey kKey{0x0123456789abcdefull, 42};

// The slice of `full` a block covers (no autograd).
Tensor slice_of(const Tensor& full, const Dims& offset, const Dims& shape) {
  Tensor v = full;
  for (int d = 0; d < shape.size(); ++d) v = raw::narrow(v, d, offset[d], shape[d]);
  return v;
}

// An uninitialised tensor of `shape` laid out column-major with a stride-2
// last dimension: as far from contiguous as a layout gets.
Tensor noncontig_empty(const Dims& shape, DType dt) {
  int n = shape.size();
  if (n == 0) return raw::empty(shape, dt);
  Dims rev;
  for (int d = n - 1; d >= 0; --d) rev.push_back(shape[d]);
  rev[0] *= 2;
  Tensor buf = raw::empty(rev, dt);
  Dims order;
  for (int d = n - 1; d >= 0; --d) order.push_back(d);
  return raw::slice(raw::permute(buf, order), n - 1, 0, 2 * shape[n - 1], 2);
}

kernels::RandomParams bernoulli_params(double p) {
  kernels::RandomParams r;
  r.dist = kernels::RandomDist::Bernoulli;
  r.key = kKey;
  r.threshold = kernels::bernoulli_threshold(p);
  return r;
}
kernels::RandomParams randint_params(int64_t lo, int64_t hi) {
  kernels::RandomParams r;
  r.dist = kernels::RandomDist::Randint;
  r.key = kKey;
  r.low = lo;
  r.range = uint32_t(hi - lo);
  return r;
}

// One random op, as an allocating call (`gen`) and as a fill of a given,
// possibly non-contiguous, output (`fill`). Dropout reads a fixed global
// input instead (its layout varies through `x_local`).
struct Kind {
  std::string name;
  std::vector<DType> dtypes;
  std::function<Tensor(const Dims&, DType, const GlobalBlock&, const Tensor& x_local)> gen;
  std::function<void(const Tensor&, const GlobalBlock&)> fill;  // empty for dropout
};

std::vector<Kind> kinds() {
  const std::vector<DType> floats = {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16};
  std::vector<Kind> k;
  k.push_back({"rand", floats,
               [](const Dims& s, DType t, const GlobalBlock& b, const Tensor&) { return rand(s, kKey, t, b); },
               [](const Tensor& out, const GlobalBlock& b) { uniform_(out, kKey, 0.0, 1.0, b); }});
  k.push_back({"uniform_", floats,
               [](const Dims& s, DType t, const GlobalBlock& b, const Tensor&) {
                 return uniform_(raw::empty(s, t), kKey, -3.0, 5.0, b);
               },
               [](const Tensor& out, const GlobalBlock& b) { uniform_(out, kKey, -3.0, 5.0, b); }});
  k.push_back({"randn", floats,
               [](const Dims& s, DType t, const GlobalBlock& b, const Tensor&) { return randn(s, kKey, t, b); },
               [](const Tensor& out, const GlobalBlock& b) { normal_(out, kKey, 0.0, 1.0, b); }});
  k.push_back({"normal_", floats,
               [](const Dims& s, DType t, const GlobalBlock& b, const Tensor&) {
                 return normal_(raw::empty(s, t), kKey, 2.0, 0.5, b);
               },
               [](const Tensor& out, const GlobalBlock& b) { normal_(out, kKey, 2.0, 0.5, b); }});
  k.push_back({"trunc_normal_", floats,
               [](const Dims& s, DType t, const GlobalBlock& b, const Tensor&) {
                 return trunc_normal_(raw::empty(s, t), kKey, 0.5, 2.0, -1.0, 3.0, b);
               },
               [](const Tensor& out, const GlobalBlock& b) { trunc_normal_(out, kKey, 0.5, 2.0, -1.0, 3.0, b); }});
  k.push_back({"bernoulli", {DType::Bool, DType::Float32, DType::Float64, DType::Int32, DType::BFloat16},
               [](const Dims& s, DType t, const GlobalBlock& b, const Tensor&) {
                 return bernoulli(s, 0.3, kKey, t, b);
               },
               [](const Tensor& out, const GlobalBlock& b) {
                 kernels::random_fill(out.device(), out, bernoulli_params(0.3), b);
               }});
  k.push_back({"randint", {DType::Int64, DType::Int32, DType::Float32, DType::Float64},
               [](const Dims& s, DType t, const GlobalBlock& b, const Tensor&) {
                 return tessel::randint(-5, 1000, s, kKey, t, b);
               },
               [](const Tensor& out, const GlobalBlock& b) {
                 kernels::random_fill(out.device(), out, randint_params(-5, 1000), b);
               }});
  k.push_back({"dropout", floats,
               [](const Dims&, DType, const GlobalBlock& b, const Tensor& x) { return dropout(x, 0.4, kKey, true, b); },
               nullptr});
  return k;
}

// A random split of [0, n) into `parts` pieces (some may be empty).
std::vector<int64_t> random_cuts(int64_t n, int parts, std::mt19937_64& rng) {
  std::vector<int64_t> cuts = {0, n};
  for (int i = 1; i < parts; ++i) cuts.push_back(int64_t(rng() % uint64_t(n + 1)));
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

// Every block of the grid decomposition given by per-dim cuts.
void for_each_block(const std::vector<std::vector<int64_t>>& cuts,
                    const std::function<void(const Dims& offset, const Dims& shape)>& fn) {
  int n = int(cuts.size());
  std::vector<size_t> idx(size_t(n), 0);
  for (;;) {
    Dims off, shp;
    for (int d = 0; d < n; ++d) {
      off.push_back(cuts[d][idx[d]]);
      shp.push_back(cuts[d][idx[d] + 1] - cuts[d][idx[d]]);
    }
    fn(off, shp);
    int d = n - 1;
    while (d >= 0 && ++idx[d] == cuts[d].size() - 1) idx[d--] = 0;
    if (d < 0) return;
  }
}

Tensor global_input(const Dims& shape, DType dt) { return testing::uniform(shape, 99, -2.0, 2.0, dt); }

}  // namespace

TEST_CASE("values follow the documented mapping from (seed, stream, element)") {
  const int64_t n = 1037;
  // rand float32: u01(bits(e)) exactly (lo = 0, span = 1).
  auto f = rand({n}, kKey).to_vector<float>();
  for (int64_t e = 0; e < n; ++e) REQUIRE(f[e] == philox::u01(philox::bits_at(kKey, uint64_t(e))));
  // rand float64: block e/2, words (2w, 2w+1) as (low, high).
  auto d = rand({n}, kKey, DType::Float64).to_vector<double>();
  for (int64_t e = 0; e < n; ++e) {
    Philox4 r = philox::block(kKey, uint64_t(e) / 2);
    int w = int(e % 2);
    REQUIRE(d[e] == philox::u01_double(r.v[2 * w], r.v[2 * w + 1]));
  }
  // randn float32: Box-Muller on words (0,1) -> e%4 in {0,1}, (2,3) -> {2,3}; cos for even, sin for odd.
  auto z = randn({n}, kKey).to_vector<float>();
  for (int64_t e = 0; e < n; ++e) {
    Philox4 r = philox::block(kKey, uint64_t(e) / 4);
    int p = int(e % 4) & 2;
    float rad = std::sqrt(-2.0f * tmath::log(philox::u01_open0(r.v[p])));
    float t = 2.0f * philox::u01(r.v[p + 1]);
    float expect = e % 2 == 0 ? rad * tmath::cospi(t) : rad * tmath::sinpi(t);
    float got_times_one = 0.0f + 1.0f * expect;  // mean + std * z, as the kernel writes it
    REQUIRE(std::memcmp(&z[e], &got_times_one, 4) == 0);
  }
  // bernoulli: (bits >> 8) < ceil(p * 2^24), for any output dtype.
  auto b = bernoulli({n}, 0.3, kKey).to_vector<bool>();
  auto bf = bernoulli({n}, 0.3, kKey, DType::Float64).to_vector<double>();
  for (int64_t e = 0; e < n; ++e) {
    bool expect = (philox::bits_at(kKey, uint64_t(e)) >> 8) < uint32_t(std::ceil(0.3 * 16777216.0));
    REQUIRE(b[e] == expect);
    REQUIRE(bf[e] == (expect ? 1.0 : 0.0));
  }
  // randint: low + bounded(bits, range) on one word, whatever the dtype.
  auto ri = tessel::randint(-7, 1234567, {n}, kKey).to_vector<int64_t>();
  for (int64_t e = 0; e < n; ++e)
    REQUIRE(ri[e] == -7 + int64_t(philox::bounded(philox::bits_at(kKey, uint64_t(e)), 1234567 + 7)));
  // The stream's high word and the seed's high word both matter.
  CHECK_FALSE(bitwise_equal(rand({64}, {1, 5}), rand({64}, {1, 5 + (1ull << 32)})));
  CHECK_FALSE(bitwise_equal(rand({64}, {1, 5}), rand({64}, {1 + (1ull << 32), 5})));
}

// The CPU kernels generate whole Philox blocks along contiguous runs; the
// per-element definition (what the CUDA kernels compute) must give the same bits.
template <kernels::RandomDist D, class T>
void check_block_vs_element(const Tensor& t, const kernels::RandomParams& p) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  auto v = t.contiguous();
  const T* got = v.data<T>();
  const bool wide = kernels::random_wide_layout(D, dtype_v<T>);
  for (int64_t e = 0; e < t.numel(); ++e) {
    T expect;
    if constexpr (std::is_same_v<T, double> && D != kernels::RandomDist::Bernoulli &&
                  D != kernels::RandomDist::Randint) {
      REQUIRE(wide);
      auto k = kernels::rng::make_consts<double, double>(p);
      expect = kernels::rng::wide_value<D>(k, philox::block(p.key, uint64_t(e) / 2), int(e % 2));
    } else {
      REQUIRE(!wide);
      auto k = kernels::rng::make_consts<T, C>(p);
      expect = kernels::rng::narrow_value<D, T, C>(k, philox::block(p.key, uint64_t(e) / 4), int(e % 4));
    }
    REQUIRE(std::memcmp(&expect, &got[e], sizeof(T)) == 0);
  }
}

TEST_CASE("block-at-a-time CPU kernels equal the per-element definition bit for bit") {
  using kernels::RandomDist;
  const Dims shape{13, 37};
  kernels::RandomParams u;
  u.dist = RandomDist::Uniform;
  u.key = kKey;
  u.lo = -3;
  u.hi = 5;
  kernels::RandomParams nrm = u;
  nrm.dist = RandomDist::Normal;
  nrm.mean = 2;
  nrm.std = 0.5;
  kernels::RandomParams tn = u;
  tn.dist = RandomDist::TruncNormal;
  tn.mean = 0.5;
  tn.std = 2;
  tn.lo = -1;
  tn.hi = 3;
  tn.vlo = tmath::erf((-1 - 0.5) / 2 / std::sqrt(2.0));
  tn.vhi = tmath::erf((3 - 0.5) / 2 / std::sqrt(2.0));
  auto run = [&](const kernels::RandomParams& p, DType dt) {
    Tensor t = raw::empty(shape, dt);
    kernels::random_fill(kCPU, t, p, GlobalBlock{});
    return t;
  };
  check_block_vs_element<RandomDist::Uniform, float>(run(u, DType::Float32), u);
  check_block_vs_element<RandomDist::Uniform, double>(run(u, DType::Float64), u);
  check_block_vs_element<RandomDist::Uniform, bf16>(run(u, DType::BFloat16), u);
  check_block_vs_element<RandomDist::Uniform, f16>(run(u, DType::Float16), u);
  check_block_vs_element<RandomDist::Normal, float>(run(nrm, DType::Float32), nrm);
  check_block_vs_element<RandomDist::Normal, double>(run(nrm, DType::Float64), nrm);
  check_block_vs_element<RandomDist::Normal, bf16>(run(nrm, DType::BFloat16), nrm);
  check_block_vs_element<RandomDist::Normal, f16>(run(nrm, DType::Float16), nrm);
  check_block_vs_element<RandomDist::TruncNormal, float>(run(tn, DType::Float32), tn);
  check_block_vs_element<RandomDist::TruncNormal, double>(run(tn, DType::Float64), tn);
  check_block_vs_element<RandomDist::TruncNormal, f16>(run(tn, DType::Float16), tn);
  auto bp = bernoulli_params(0.3);
  check_block_vs_element<RandomDist::Bernoulli, bool>(run(bp, DType::Bool), bp);
  check_block_vs_element<RandomDist::Bernoulli, double>(run(bp, DType::Float64), bp);
  auto rp = randint_params(-5, 1000);
  check_block_vs_element<RandomDist::Randint, int64_t>(run(rp, DType::Int64), rp);
  check_block_vs_element<RandomDist::Randint, int32_t>(run(rp, DType::Int32), rp);
  check_block_vs_element<RandomDist::Randint, float>(run(rp, DType::Float32), rp);
}

TEST_CASE("any block decomposition assembles to the whole tensor, bit for bit") {
  std::mt19937_64 rng(2024);
  const std::vector<Dims> shapes = {{}, {1}, {17}, {0, 5}, {6, 9}, {5, 1, 7}, {3, 4, 1, 5}, {2, 3, 4, 5, 3}};
  for (const Kind& kind : kinds()) {
    for (DType dt : kind.dtypes) {
      for (const Dims& global : shapes) {
        Tensor x = global_input(global, is_floating(dt) ? dt : DType::Float32);
        Tensor full = kind.gen(global, dt, {}, x);
        REQUIRE(full.shape() == global);
        for (int trial = 0; trial < 3; ++trial) {
          INFO(kind.name << " " << dtype_name(dt) << " global " << global.str() << " trial " << trial);
          std::vector<std::vector<int64_t>> cuts;
          for (int d = 0; d < global.size(); ++d) cuts.push_back(random_cuts(global[d], 1 + int(rng() % 4), rng));
          Tensor assembled = raw::empty(global, full.dtype());
          if (full.numel() > 0) std::memset(assembled.raw_data(), 0xAB, assembled.nbytes());
          for_each_block(cuts, [&](const Dims& off, const Dims& shp) {
            GlobalBlock block{global, off};
            Tensor part = kind.gen(shp, dt, block, slice_of(x, off, shp));
            REQUIRE(part.shape() == shp);
            kernels::copy(kCPU, part, slice_of(assembled, off, shp));
          });
          REQUIRE(bitwise_equal(assembled, full));
        }
        // Arbitrary single blocks (not from a grid), contiguous and not.
        for (int trial = 0; trial < 4 && global.size() > 0; ++trial) {
          Dims off, shp;
          for (int d = 0; d < global.size(); ++d) {
            int64_t a = int64_t(rng() % uint64_t(global[d] + 1)), b = int64_t(rng() % uint64_t(global[d] + 1));
            off.push_back(std::min(a, b));
            shp.push_back(std::max(a, b) - std::min(a, b));
          }
          INFO(kind.name << " " << dtype_name(dt) << " global " << global.str() << " block " << shp.str() << " at "
                         << off.str());
          GlobalBlock block{global, off};
          Tensor expect = slice_of(full, off, shp);
          if (kind.fill) {
            Tensor out = noncontig_empty(shp, dt);
            kind.fill(out, block);
            REQUIRE(bitwise_equal(out, expect));
          } else {
            Tensor xin = noncontig_empty(shp, x.dtype());
            kernels::copy(kCPU, slice_of(x, off, shp), xin);
            REQUIRE(bitwise_equal(kind.gen(shp, dt, block, xin), expect));
          }
        }
      }
    }
  }
}

TEST_CASE("non-contiguous outputs and inputs hold the same values as contiguous ones") {
  for (const Kind& kind : kinds()) {
    for (DType dt : kind.dtypes) {
      INFO(kind.name << " " << dtype_name(dt));
      const Dims shape{23, 19, 6};
      Tensor x = global_input(shape, is_floating(dt) ? dt : DType::Float32);
      Tensor full = kind.gen(shape, dt, {}, x);
      if (kind.fill) {
        Tensor out = noncontig_empty(shape, dt);
        kind.fill(out, {});
        CHECK(bitwise_equal(out, full));
        // A transposed view: its own logical coordinates define the values.
        Tensor buf = raw::empty({6, 19, 23}, dt);
        Tensor view = raw::permute(buf, {2, 1, 0});
        kind.fill(view, {});
        CHECK(bitwise_equal(view, full));
      } else {
        Tensor xt = raw::permute(detail::contiguous_raw(raw::permute(x, {2, 1, 0})), {2, 1, 0});
        CHECK_FALSE(xt.is_contiguous());
        CHECK(bitwise_equal(kind.gen(shape, dt, {}, xt), full));
      }
    }
  }
}

TEST_CASE("results do not depend on the thread count") {
  const int saved = num_threads();
  const std::vector<std::pair<Dims, GlobalBlock>> cases = {
      {{300, 1001}, {}},                                // many rows
      {{(1 << 18) + 3}, {}},                            // one long run
      {{1, (1 << 17) + 1}, {{4, (1 << 17) + 9}, {2, 5}}},  // one long run at an unaligned offset
      {{40000, 1}, {{40000, 3}, {0, 1}}},               // a column: global stride 3, no block path
  };
  for (const Kind& kind : kinds()) {
    for (DType dt : {kind.dtypes[0], kind.dtypes[1]}) {
      for (const auto& [shape, block] : cases) {
        INFO(kind.name << " " << dtype_name(dt) << " shape " << shape.str());
        Tensor x = global_input(shape, is_floating(dt) ? dt : DType::Float32);
        set_num_threads(1);
        Tensor ref = kind.gen(shape, dt, block, x);
        for (int t : {2, 3, 7}) {
          set_num_threads(t);
          REQUIRE(bitwise_equal(kind.gen(shape, dt, block, x), ref));
        }
      }
    }
  }
  set_num_threads(saved);
}

TEST_CASE("same key gives the same values; other seeds and streams differ") {
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16}) {
    Tensor a = randn({1000}, {7, 11}, dt);
    CHECK(bitwise_equal(a, randn({1000}, {7, 11}, dt)));
    for (PhiloxKey other : {PhiloxKey{7, 12}, PhiloxKey{8, 11}, PhiloxKey{11, 7}}) {
      Tensor b = randn({1000}, other, dt);
      auto av = a.to_vector<double>(), bv = b.to_vector<double>();
      int same = 0;
      for (size_t i = 0; i < av.size(); ++i) same += av[i] == bv[i];
      CHECK(same < (dt == DType::BFloat16 ? 50 : 3));
    }
  }
  CHECK(bitwise_equal(tessel::randint(0, 10, {100}, {1, 2}), tessel::randint(0, 10, {100}, {1, 2})));
  CHECK_FALSE(bitwise_equal(tessel::randint(0, 10, {100}, {1, 2}), tessel::randint(0, 10, {100}, {1, 3})));
  CHECK_FALSE(bitwise_equal(bernoulli({100}, 0.5, {1, 2}), bernoulli({100}, 0.5, {1, 3})));
  // rand_like / randn_like follow the tensor's shape, dtype and device.
  Tensor like = raw::empty({3, 4}, DType::Float64);
  CHECK(bitwise_equal(rand_like(like, kKey), rand({3, 4}, kKey, DType::Float64)));
  CHECK(bitwise_equal(randn_like(like, kKey), randn({3, 4}, kKey, DType::Float64)));
}

namespace {
struct Moments {
  double mean = 0, var = 0, min = INFINITY, max = -INFINITY;
};
Moments moments(const Tensor& t) {
  auto v = t.to_vector<double>();
  Moments m;
  for (double x : v) {
    m.mean += x;
    m.min = std::min(m.min, x);
    m.max = std::max(m.max, x);
  }
  m.mean /= double(v.size());
  for (double x : v) m.var += (x - m.mean) * (x - m.mean);
  m.var /= double(v.size() - 1);
  return m;
}
// |got - expect| within k standard errors.
void check_within(double got, double expect, double se, const char* what, double k = 5.0) {
  INFO(what << ": got " << got << ", expected " << expect << " +- " << k << " * " << se);
  CHECK(std::fabs(got - expect) <= k * se);
}
}  // namespace

TEST_CASE("statistics of a million draws") {
  const double n = 1 << 20;
  const Dims shape{1 << 20};
  for (DType dt : {DType::Float32, DType::Float64}) {
    INFO(dtype_name(dt));
    Moments u = moments(rand(shape, kKey, dt));
    check_within(u.mean, 0.5, std::sqrt(1.0 / 12 / n), "rand mean");
    check_within(u.var, 1.0 / 12, std::sqrt((1.0 / 80 - 1.0 / 144) / n), "rand variance");
    CHECK(u.min >= 0.0);
    CHECK(u.max < 1.0);
    Moments w = moments(uniform_(raw::empty(shape, dt), kKey, -3.0, 5.0));
    check_within(w.mean, 1.0, std::sqrt(64.0 / 12 / n), "uniform_ mean");
    CHECK(w.min >= -3.0);
    CHECK(w.max < 5.0);
    Moments z = moments(randn(shape, kKey, dt));
    check_within(z.mean, 0.0, std::sqrt(1.0 / n), "randn mean");
    check_within(z.var, 1.0, std::sqrt(2.0 / n), "randn variance");
    Moments g = moments(normal_(raw::empty(shape, dt), kKey, 2.0, 0.5));
    check_within(g.mean, 2.0, std::sqrt(0.25 / n), "normal_ mean");
    check_within(g.var, 0.25, 0.25 * std::sqrt(2.0 / n), "normal_ variance");
    // Box-Muller pairs: the cosine and sine halves are uncorrelated.
    auto zv = randn(shape, {3, 4}, dt).to_vector<double>();
    double c = 0;
    for (size_t i = 0; i + 1 < zv.size(); i += 2) c += zv[i] * zv[i + 1];
    check_within(c / (n / 2), 0.0, std::sqrt(1.0 / (n / 2)), "pair correlation");
  }
  Moments b = moments(bernoulli(shape, 0.3, kKey, DType::Float32));
  check_within(b.mean, 0.3, std::sqrt(0.21 / n), "bernoulli rate");
  CHECK(moments(bernoulli({1000}, 0.0, kKey, DType::Float32)).max == 0.0);
  CHECK(moments(bernoulli({1000}, 1.0, kKey, DType::Float32)).min == 1.0);
  // randint covers its range, evenly.
  auto r = tessel::randint(-5, 100, shape, kKey).to_vector<int64_t>();
  std::vector<int64_t> count(105, 0);
  for (int64_t v : r) {
    REQUIRE(v >= -5);
    REQUIRE(v < 100);
    ++count[size_t(v + 5)];
  }
  const double pk = 1.0 / 105;
  for (int64_t c : count) check_within(double(c), n * pk, std::sqrt(n * pk * (1 - pk)), "randint bucket count");
  // 16-bit dtypes stay in range after rounding.
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    Moments h = moments(uniform_(raw::empty({1 << 16}, dt), kKey, 0.0, 1.0));
    CHECK(h.min >= 0.0);
    CHECK(h.max < 1.0);
    Moments hw = moments(uniform_(raw::empty({1 << 16}, dt), kKey, 1000.0, 1001.0));
    CHECK(hw.min >= 1000.0);
    CHECK(hw.max < 1001.0);
  }
}

TEST_CASE("trunc_normal_ respects its bounds") {
  struct Case {
    double mean, std, a, b;
  };
  for (const Case& c : {Case{0, 1, -2, 2}, Case{0.5, 2, -1, 3}, Case{0, 0.02, -0.04, 0.04}, Case{1, 1, 1.5, 10},
                        Case{0, 1, -INFINITY, 0}}) {
    for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16}) {
      INFO("mean " << c.mean << " std " << c.std << " [" << c.a << ", " << c.b << "] " << dtype_name(dt));
      Moments m = moments(trunc_normal_(raw::empty({1 << 16}, dt), kKey, c.mean, c.std, c.a, c.b));
      CHECK(m.min >= c.a);
      CHECK(m.max <= c.b);
      CHECK(std::isfinite(m.mean));
    }
  }
}

TEST_CASE("trunc_normal_ has the truncated normal's moments") {
  // Needs the real tmath::erfinv (the temporary stand-in is the identity).
  if (!(std::fabs(tmath::erfinv(0.5f) - 0.4769362762f) < 1e-5f)) TESSEL_SKIP("tmath::erfinv is the stand-in");
  const double n = 1 << 20;
  struct Case {
    double mean, std, a, b;
  };
  for (const Case& c : {Case{0, 1, -2, 2}, Case{0.5, 2, -1, 3}, Case{1, 1, 1.5, 10}}) {
    for (DType dt : {DType::Float32, DType::Float64}) {
      INFO("mean " << c.mean << " std " << c.std << " [" << c.a << ", " << c.b << "] " << dtype_name(dt));
      double al = (c.a - c.mean) / c.std, be = (c.b - c.mean) / c.std;
      auto phi = [](double x) { return std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI); };
      auto Phi = [](double x) { return 0.5 * (1 + std::erf(x / std::sqrt(2.0))); };
      double Z = Phi(be) - Phi(al);
      double mu = c.mean + c.std * (phi(al) - phi(be)) / Z;
      double q = (phi(al) - phi(be)) / Z;
      double var = c.std * c.std * (1 + (al * phi(al) - be * phi(be)) / Z - q * q);
      Moments m = moments(trunc_normal_(raw::empty({1 << 20}, dt), kKey, c.mean, c.std, c.a, c.b));
      check_within(m.mean, mu, std::sqrt(var / n), "trunc_normal_ mean");
      CHECK(std::fabs(m.var / var - 1) < 0.01);
    }
  }
}

TEST_CASE("dropout: the mask is bernoulli(1 - p) on the same key, the rest scaled") {
  const double p = 0.3;
  const Dims shape{37, 41};
  for (DType dt : {DType::Float32, DType::Float64}) {
    Tensor x = testing::uniform(shape, 5, -2, 2, dt);
    Tensor y = dropout(x, p, kKey);
    Tensor mask = bernoulli(shape, 1.0 - p, kKey);
    CHECK(bitwise_equal(y, where(mask, x * (1.0 / (1.0 - p)), 0.0)));
    CHECK(bitwise_equal(y, dropout(x, p, kKey)));                     // same key, same mask
    CHECK_FALSE(bitwise_equal(y, dropout(x, p, {kKey.seed, 43})));  // another stream
  }
  // 16-bit: the scale multiplies in float, rounded once on store.
  Tensor xh = testing::uniform(shape, 5, -2, 2, DType::BFloat16);
  auto xs = xh.to_vector<float>();
  auto keep = bernoulli(shape, 1.0 - p, kKey).to_vector<bool>();
  auto ys = dropout(xh, p, kKey).to_vector<float>();
  const float scale = float(1.0 / (1.0 - p));
  for (size_t i = 0; i < xs.size(); ++i) REQUIRE(ys[i] == (keep[i] ? float(bf16(xs[i] * scale)) : 0.0f));
  // The kept fraction.
  Tensor big = dropout(ones({1 << 20}), 0.25, kKey);
  double kept = moments(ne(big, 0.0).to(DType::Float64)).mean;
  CHECK(std::fabs(kept - 0.75) < 5 * std::sqrt(0.75 * 0.25 / (1 << 20)));
  CHECK(moments(big).max == float(1.0 / 0.75));
}

TEST_CASE("dropout: identity, zeros and blocks") {
  Tensor x = testing::uniform({8, 9}, 3);
  CHECK(dropout(x, 0.5, kKey, false).is_same(x));
  CHECK(dropout(x, 0.0, kKey).is_same(x));
  Tensor z = dropout(x, 1.0, kKey);
  CHECK(moments(z).min == 0.0);
  CHECK(moments(z).max == 0.0);
  // A microbatch's mask is the slice of the full batch's mask.
  Tensor full = dropout(x, 0.5, kKey);
  for (int64_t start : {0, 3, 5}) {
    Tensor part = dropout(slice_of(x, {start, 0}, {3, 9}), 0.5, kKey, true, {{8, 9}, {start, 0}});
    CHECK(bitwise_equal(part, slice_of(full, {start, 0}, {3, 9})));
  }
}

TEST_CASE("dropout gradients") {
  const PhiloxKey key{9, 10};
  CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return dropout(in[0], 0.4, key); },
                  {testing::grad_input({6, 7}, 1)});
  CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return dropout(in[0], 0.4, key); },
                  {testing::grad_input_noncontig({5, 8}, 2)});
  CHECK_GRADCHECK(
      [&](const std::vector<Tensor>& in) { return dropout(in[0] * in[0], 0.5, key, true, {{9, 8}, {2, 0}}); },
      {testing::grad_input({5, 8}, 3)});
  // The gradient is the mask scaled: dropout of ones.
  Tensor x = testing::grad_input({10, 12}, 4);
  sum(dropout(x, 0.3, key)).backward();
  CHECK(bitwise_equal(x.grad(), dropout(ones({10, 12}, DType::Float64), 0.3, key)));
  // p == 1: zero gradient.
  Tensor x1 = testing::grad_input({4}, 5);
  sum(dropout(x1, 1.0, key)).backward();
  CHECK(moments(x1.grad()).max == 0.0);
  CHECK(moments(x1.grad()).min == 0.0);
}

TEST_CASE("random ops on the meta device only compute shapes") {
  Tensor m = randn({3, 5}, kKey, TensorOptions(DType::Float32).with_device(kMeta));
  CHECK(m.device().is_meta());
  CHECK(m.shape() == Dims{3, 5});
}

TEST_CASE("random op errors name the op") {
  using Catch::Contains;
  CHECK_THROWS_WITH(bernoulli({2}, -0.1, kKey), Contains("bernoulli") && Contains("-0.1"));
  CHECK_THROWS_WITH(bernoulli({2}, 1.5, kKey), Contains("bernoulli") && Contains("[0, 1]"));
  CHECK_THROWS_WITH(bernoulli({2}, NAN, kKey), Contains("bernoulli"));
  CHECK_THROWS_WITH(dropout(ones({2}), 1.2, kKey), Contains("dropout") && Contains("1.2"));
  CHECK_THROWS_WITH(dropout(ones({2}, DType::Int64), 0.5, kKey), Contains("dropout") && Contains("int64"));
  CHECK_THROWS_WITH(rand({2}, kKey, DType::Int32), Contains("rand") && Contains("int32"));
  CHECK_THROWS_WITH(randn({2}, kKey, DType::Bool), Contains("randn") && Contains("bool"));
  CHECK_THROWS_WITH(tessel::randint(5, 5, {2}, kKey), Contains("randint") && Contains("empty range"));
  CHECK_THROWS_WITH(tessel::randint(0, int64_t(1) << 33, {2}, kKey), Contains("randint") && Contains("2^32"));
  CHECK_THROWS_WITH(tessel::randint(INT64_MIN, INT64_MAX, {2}, kKey), Contains("randint") && Contains("2^32"));
  CHECK_THROWS_WITH(tessel::randint(0, int64_t(1) << 31 | 1, {2}, kKey, DType::Int32),
                    Contains("randint") && Contains("int32"));
  CHECK_THROWS_WITH(tessel::randint(0, 2, {2}, kKey, DType::Bool), Contains("randint") && Contains("bool"));
  CHECK_THROWS_WITH(rand({2, 3}, kKey, {}, {{4}, {0}}), Contains("rand") && Contains("rank"));
  CHECK_THROWS_WITH(rand({2, 3}, kKey, {}, {{4, 4}, {3, 0}}), Contains("rand") && Contains("does not fit"));
  CHECK_THROWS_WITH(randn({2}, kKey, {}, {{4}, {-1}}), Contains("randn") && Contains("does not fit"));
  CHECK_THROWS_WITH(dropout(ones({2, 3}), 0.5, kKey, true, {{2, 2}, {0, 0}}), Contains("dropout"));
  CHECK_NOTHROW(tessel::randint(0, int64_t(UINT32_MAX), {2}, kKey));
  CHECK_NOTHROW(tessel::randint(INT32_MIN, INT32_MAX, {2}, kKey, DType::Int32));
}

// The op checks its inputs once and the kernels do not re-check them: every
// error here comes from the op, so it comes on Meta tensors too (no kernel
// runs there), as in a Meta model or before a distributed op.
TEST_CASE("dropout errors come from the op, on Meta tensors too") {
  using Catch::Contains;
  using tessel::testing::meta;
  CHECK_THROWS_WITH(dropout(meta({2}), 1.2, kKey), Contains("dropout") && Contains("1.2"));
  CHECK_THROWS_WITH(dropout(meta({2}, DType::Int64), 0.5, kKey), Contains("dropout") && Contains("int64"));
  CHECK_THROWS_WITH(dropout(meta({2, 3}), 0.5, kKey, true, {{2, 2}, {0, 0}}), Contains("dropout"));
  CHECK(dropout(meta({2, 3}), 0.5, kKey).shape() == Dims{2, 3});
}
