// Reductions: the canonical order (bitwise against the reference), layout,
// thread-count and shard invariance, values, gradients.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "autograd/api.h"
#include "kernels/canonical.h"
#include "kernels/cpu/canonical_simd.h"
#include "runtime/numerics.h"
#include "runtime/threadpool.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

static float ref_sum(const std::vector<float>& v, int chunks) {
  return kernels::canonical_sum_ref<float>(v.data(), int64_t(v.size()), 1, chunks);
}

TEST_CASE("SIMD canonical sums equal the reference bit for bit") {
  for (int64_t n : {0, 1, 7, 8, 9, 63, 64, 65, 1000, 4097, 100003}) {
    for (int v : {1, 2, 4, 16, 64}) {
      auto x = uniform({n}, uint64_t(n * 31 + v)).to_vector<float>();
      float a = kernels::cpu::canonical_sum_row(x.data(), n, v);
      float b = ref_sum(x, v);
      REQUIRE(std::memcmp(&a, &b, 4) == 0);
      // Column version: 11 columns, each a copy of the row in a strided layout.
      std::vector<float> m(size_t(n * 11));
      for (int64_t t = 0; t < n; ++t)
        for (int j = 0; j < 11; ++j) m[size_t(t * 11 + j)] = x[size_t(t)] * float(j + 1);
      std::vector<float> out(11);
      kernels::cpu::canonical_sum_cols(m.data(), n, 11, 11, v, out.data());
      for (int j = 0; j < 11; ++j) {
        float r = kernels::canonical_sum_ref<float>(m.data() + j, n, 11, v);
        REQUIRE(std::memcmp(&r, &out[size_t(j)], 4) == 0);
      }
    }
  }
}

TEST_CASE("sum over any dims equals the canonical reference and ignores layout") {
  numerics::ChunksGuard chunks(16);
  Tensor x = uniform({6, 50, 33}, 5);
  Tensor xt = x.permute({2, 0, 1}).contiguous().permute({1, 2, 0});  // same values, other layout
  REQUIRE(bitwise_equal(x, xt.contiguous()));
  for (std::vector<int64_t> dims : {std::vector<int64_t>{2}, {1}, {0}, {0, 2}, {1, 2}, {0, 1, 2}}) {
    Tensor a = sum(x, dims, true), b = sum(xt, dims, true);
    CHECK(bitwise_equal(a, b));
  }
  // Reference for the middle dim.
  auto xv = x.to_vector<float>();
  Tensor s1 = sum(x, {1});
  auto sv = s1.to_vector<float>();
  for (int i = 0; i < 6; ++i)
    for (int k = 0; k < 33; ++k) {
      float r = kernels::canonical_sum_ref<float>(xv.data() + i * 50 * 33 + k, 50, 33, 16);
      REQUIRE(std::memcmp(&r, &sv[size_t(i * 33 + k)], 4) == 0);
    }
  // Reference over dims {0, 2}: reduced index order is row-major over (d0, d2).
  Tensor s02 = sum(x, {0, 2});
  auto v02 = s02.to_vector<float>();
  for (int j = 0; j < 50; ++j) {
    std::vector<float> seq;
    for (int i = 0; i < 6; ++i)
      for (int k = 0; k < 33; ++k) seq.push_back(xv[size_t(i * 50 * 33 + j * 33 + k)]);
    float r = ref_sum(seq, 16);
    REQUIRE(std::memcmp(&r, &v02[size_t(j)], 4) == 0);
  }
}

TEST_CASE("sum does not depend on the thread count, long sums included") {
  Tensor x = uniform({1 << 18}, 8);
  Tensor m = uniform({512, 300}, 9);
  set_num_threads(1);
  Tensor a = sum(x), b = sum(m, {0}), c = sum(m, {1});
  set_num_threads(3);
  CHECK(bitwise_equal(a, sum(x)));
  CHECK(bitwise_equal(b, sum(m, {0})));
  CHECK(bitwise_equal(c, sum(m, {1})));
  set_num_threads(2);
  auto xv = x.to_vector<float>();
  float r = ref_sum(xv, numerics::reduction_chunks());
  CHECK(std::memcmp(&r, a.raw_data(), 4) == 0);
}

TEST_CASE("shard property: sub-sums over aligned pieces finish the same tree") {
  // A length-n sum with V chunks equals: split into W pieces (W | V, aligned to
  // chunks), each summed with V/W chunks, then a balanced tree over pieces.
  const int V = 16;
  const int64_t n = 16 * 37;
  auto x = uniform({n}, 12).to_vector<float>();
  float full = ref_sum(x, V);
  for (int W : {2, 4, 8, 16}) {
    std::vector<float> parts;
    for (int w = 0; w < W; ++w) {
      std::vector<float> piece(x.begin() + w * (n / W), x.begin() + (w + 1) * (n / W));
      parts.push_back(kernels::cpu::canonical_sum_row(piece.data(), int64_t(piece.size()), V / W));
    }
    float combined = kernels::tree_combine(parts.data(), W, kernels::SumCombine<float>());
    REQUIRE(std::memcmp(&combined, &full, 4) == 0);
  }
}

TEST_CASE("reduction values: sum, mean, amax, amin, argmax, max, var") {
  Tensor x = tensor({1.f, 5.f, 3.f, -2.f, 5.f, 0.f}, {2, 3});
  CHECK(sum(x).item<float>() == 12.f);
  CHECK(sum(x, {1}).to_vector<float>() == std::vector<float>{9, 3});
  CHECK(sum(x, {0}, true).shape() == Dims{1, 3});
  CHECK(mean(x, {0}).to_vector<float>() == std::vector<float>{-0.5f, 5.f, 1.5f});
  CHECK(amax(x, {1}).to_vector<float>() == std::vector<float>{5, 5});
  CHECK(amin(x).item<float>() == -2.f);
  CHECK(argmax(x, 1).to_vector<int64_t>() == std::vector<int64_t>{1, 1});
  CHECK(argmin(x, 0).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 1});  // ties: first index
  auto [v, i] = max(x, 1);
  CHECK(v.to_vector<float>() == std::vector<float>{5, 5});
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{1, 1});
  CHECK(var(tensor({1.f, 2.f, 3.f, 4.f})).item<float>() == Approx(1.6666667f));
  CHECK(var(tensor({1.f, 2.f, 3.f, 4.f}), {}, 0).item<float>() == 1.25f);
  CHECK(sum(arange(10)).item<int64_t>() == 45);
  CHECK(sum(arange(10)).dtype() == DType::Int64);
  CHECK(sum(gt(x, 0.0)).item<int64_t>() == 4);
  CHECK(std::isnan(amax(tensor({1.f, NAN, 2.f})).item<float>()));
  CHECK(argmax(tensor({1.f, NAN, 2.f, NAN}), 0).item<int64_t>() == 1);
  CHECK(sum(zeros({0, 3}), {0}).to_vector<float>() == std::vector<float>{0, 0, 0});
  CHECK(sum(ones({4}, DType::BFloat16)).dtype() == DType::BFloat16);
}

TEST_CASE("reduction errors") {
  CHECK_THROWS_WITH(sum(zeros({2, 3}), {2}), Catch::Contains("sum") && Catch::Contains("out of range"));
  CHECK_THROWS_WITH(sum(zeros({2, 3}), {1, -1}), Catch::Contains("twice"));
  CHECK_THROWS_WITH(amax(zeros({0, 3}), {0}), Catch::Contains("empty dimension"));
  CHECK_THROWS_WITH(mean(arange(3)), Catch::Contains("mean") && Catch::Contains("int64"));
  CHECK_THROWS_WITH(numerics::set_reduction_chunks(3), Catch::Contains("power of two"));
}

TEST_CASE("gradients of reductions") {
  auto X = [] { return grad_input_noncontig({4, 3, 5}, 21); };
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return sum(v[0]); }, {X()});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return sum(v[0], {0, 2}); }, {X()});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return mean(v[0], {1}, true); }, {X()});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return amax(v[0], {2}); }, {X()});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return amin(v[0], {0, 1}); }, {X()});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return std::get<0>(max(v[0], 1)); }, {X()});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return var(v[0], {2}); }, {X()});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return stddev(v[0], {0}, 0, true); }, {X()});
}

// The op checks its inputs once and the kernels do not re-check them: every
// error here comes from the op, so it comes on Meta tensors too (no kernel
// runs there), as in a Meta model or before a distributed op.
TEST_CASE("reduction errors come from the op, on Meta tensors too") {
  CHECK_THROWS_WITH(sum(meta({2, 3}), {2}), Catch::Contains("sum") && Catch::Contains("out of range"));
  CHECK_THROWS_WITH(amax(meta({0, 3}), {0}), Catch::Contains("empty dimension"));
  CHECK_THROWS_WITH(mean(meta({3}, DType::Int64)), Catch::Contains("mean") && Catch::Contains("int64"));
  CHECK(sum(meta({2, 3}, DType::Int32), {1}).dtype() == DType::Int64);
}
