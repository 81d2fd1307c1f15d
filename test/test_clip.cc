// Gradient-norm clipping: the fused sum-of-squares kernel against the scalar
// reference (bitwise), the documented combination over parameters, values
// against hand computations, thread invariance, errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "autograd/api.h"
#include "kernels/cpu/optim_ref.h"
#include "kernels/optim.h"
#include "nn/clip.h"
#include "runtime/allocator.h"
#include "runtime/numerics.h"
#include "runtime/threadpool.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

namespace {

float bits_of(const Tensor& t) { return t.item<float>(); }

bool same(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

float kernel_sum_squares(const Tensor& x, int v) {
  Tensor out = empty({});
  kernels::sum_squares(kCPU, x, v, out);
  return bits_of(out);
}

float ref_sum_squares(const Tensor& x, int v) {
  Tensor c = x.contiguous();
  return dispatch_floating(x.dtype(), "test", [&](auto tag) {
    using T = typename decltype(tag)::type;
    return kernels::ref::sum_squares(c.data<T>(), c.numel(), v);
  });
}

}  // namespace

TEST_CASE("sum_squares equals the scalar reference bit for bit") {
  for (int64_t n : {0, 1, 7, 8, 9, 31, 64, 65, 1000, 4097, 70001, 300007}) {
    for (int v : {1, 2, 4, 16, 64}) {
      for (DType d : {DType::Float32, DType::BFloat16, DType::Float16}) {
        Tensor x = uniform({n}, uint64_t(n * 13 + v), -3, 3, d);
        INFO("n=" << n << " V=" << v << " " << dtype_name(d));
        REQUIRE(same(kernel_sum_squares(x, v), ref_sum_squares(x, v)));
      }
    }
  }
}

TEST_CASE("sum_squares of float32 equals the composed canonical sum(square(x))") {
  for (int64_t n : {5, 1000, 100003}) {
    Tensor x = uniform({n}, uint64_t(n));
    numerics::ChunksGuard guard(16);
    CHECK(same(kernel_sum_squares(x, 16), sum(square(x)).item<float>()));
  }
}

TEST_CASE("sum_squares does not depend on the thread count") {
  Tensor x = uniform({1000003}, 3);
  const int prev = num_threads();
  std::vector<float> r;
  for (int t : {1, 2, 3, 5}) {
    set_num_threads(t);
    r.push_back(kernel_sum_squares(x, 16));
  }
  set_num_threads(prev);
  for (float y : r) CHECK(same(y, r[0]));
}

TEST_CASE("clip_grad_norm_: values by hand (3-4-12-13)") {
  Tensor a = zeros({2}).requires_grad_(), b = zeros({1, 1}).requires_grad_(), c = zeros({3}).requires_grad_();
  a.set_grad(tensor({3.0f, 4.0f}));
  b.set_grad(tensor({12.0f}, {1, 1}));
  // c has no gradient: skipped.
  CHECK(nn::grad_norm({a, b, c}) == 13.0);
  const double norm = nn::clip_grad_norm_({a, b, c}, 1.0);
  CHECK(norm == 13.0);
  const float scale = 1.0f / (13.0f + 1e-6f);
  CHECK(a.grad().to_vector<float>() == std::vector<float>{3.0f * scale, 4.0f * scale});
  CHECK(b.grad().to_vector<float>() == std::vector<float>{12.0f * scale});
  CHECK(!c.grad().defined());
  CHECK(nn::grad_norm({a, b, c}) == Approx(1.0).epsilon(1e-6));

  // Below max_norm: untouched.
  Tensor a0 = a.grad().clone();
  CHECK(nn::clip_grad_norm_({a, b}, 2.0) == Approx(1.0).epsilon(1e-6));
  CHECK(bitwise_equal(a.grad(), a0));
  // No gradients at all: norm 0.
  CHECK(nn::clip_grad_norm_({c}, 1.0) == 0.0);
}

TEST_CASE("clip_grad_norm_: the documented tree over parameters, bit for bit") {
  // Five parameters (padded to eight leaves), sizes off the lane and chunk grid,
  // mixed gradient dtypes, one non-contiguous gradient.
  std::vector<Dims> shapes = {{37}, {5, 13}, {1000}, {3}, {17, 29}};
  std::vector<DType> dtypes = {DType::Float32, DType::BFloat16, DType::Float32, DType::Float16, DType::Float32};
  std::vector<Tensor> params;
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor p = zeros(shapes[i]).requires_grad_();
    Tensor g = uniform(shapes[i], 40 + i, -2, 2, dtypes[i]);
    if (i == 4) g = uniform({29, 17}, 44, -2, 2).t();  // non-contiguous
    p.set_grad(g);
    params.push_back(p);
  }
  const int v = numerics::reduction_chunks();
  std::vector<float> s;
  for (auto& p : params) s.push_back(ref_sum_squares(p.grad(), v));
  const float total_sq = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + 0.0f) + (0.0f + 0.0f));
  const float total = std::sqrt(total_sq);
  std::vector<Tensor> before;
  for (auto& p : params) before.push_back(p.grad().clone());

  const double norm = nn::clip_grad_norm_(params, 0.5);
  CHECK(same(float(norm), total));
  CHECK(double(float(norm)) == norm);
  const float scale = 0.5f / (total + 1e-6f);
  REQUIRE(scale < 1.0f);
  for (size_t i = 0; i < params.size(); ++i) {
    INFO("parameter " << i);
    Tensor expect = dispatch_floating(dtypes[i], "test", [&](auto tag) {
      using T = typename decltype(tag)::type;
      Tensor e = before[i].contiguous();
      T* d = e.data<T>();
      for (int64_t k = 0; k < e.numel(); ++k) d[k] = T(float(d[k]) * scale);
      return e;
    });
    CHECK(bitwise_equal(params[i].grad(), expect));
  }
}

TEST_CASE("clip_grad_norm_ does not depend on the thread count") {
  auto run = [](int threads) {
    const int prev = num_threads();
    set_num_threads(threads);
    Tensor a = zeros({300001}).requires_grad_(), b = zeros({700, 300}).requires_grad_();
    a.set_grad(uniform({300001}, 1));
    b.set_grad(uniform({700, 300}, 2));
    double n = nn::clip_grad_norm_({a, b}, 1.0);
    set_num_threads(prev);
    return std::make_tuple(n, a.grad(), b.grad());
  };
  auto [n1, a1, b1] = run(1);
  auto [n2, a2, b2] = run(2);
  auto [n3, a3, b3] = run(3);
  CHECK(n1 == n2);
  CHECK(n1 == n3);
  CHECK(bitwise_equal(a1, a2));
  CHECK(bitwise_equal(a1, a3));
  CHECK(bitwise_equal(b1, b2));
  CHECK(bitwise_equal(b1, b3));
}

TEST_CASE("clip_grad_norm_ makes no full-size temporaries") {
  Tensor a = zeros({100000}).requires_grad_(), b = zeros({300, 300}).requires_grad_();
  a.set_grad(uniform({100000}, 1));
  b.set_grad(uniform({300, 300}, 2));
  nn::clip_grad_norm_({a, b}, 1.0);
  Allocator* al = cpu_allocator();
  AllocatorStats before = al->stats();
  al->reset_peak();
  const int64_t base = al->stats().current_bytes;
  nn::clip_grad_norm_({a, b}, 1.0);
  AllocatorStats after = al->stats();
  CHECK(after.requests - before.requests <= 1);  // the per-parameter sums
  CHECK(after.peak_bytes - base < 4096);
  // Without the pool (TESSEL_CPU_ALLOCATOR=system) every request reaches the
  // system; the two checks above still hold.
  if (cpu_allocator_pools()) CHECK(after.system_allocs == before.system_allocs);
}

TEST_CASE("clip_grad_norm_ errors and non-finite norms") {
  Tensor a = zeros({2}).requires_grad_();
  a.set_grad(tensor({INFINITY, 1.0f}));
  CHECK_THROWS_WITH(nn::clip_grad_norm_({a}, -1.0),
                    Catch::Contains("clip_grad_norm_") && Catch::Contains("max_norm = -1"));
  CHECK_THROWS_WITH(nn::clip_grad_norm_({a}, 1.0, true),
                    Catch::Contains("clip_grad_norm_") && Catch::Contains("inf"));
  CHECK(std::isinf(nn::clip_grad_norm_({a}, 1.0)));  // scale 0: applied (PyTorch does the same)
  a.set_grad(zeros({2}, DType::Float64));
  CHECK_THROWS_WITH(nn::clip_grad_norm_({a}, 1.0), Catch::Contains("clip_grad_norm_") && Catch::Contains("float64"));
  CHECK_THROWS_WITH(nn::grad_norm({Tensor()}), Catch::Contains("grad_norm") && Catch::Contains("undefined"));
  Tensor x = uniform({4}, 1);
  CHECK_THROWS_WITH(kernels::sum_squares(kCPU, uniform({4, 4}, 1).t(), 16, empty({})),
                    Catch::Contains("sum_squares") && Catch::Contains("contiguous"));
  CHECK_THROWS_WITH(kernels::sum_squares(kCPU, x, 3, empty({})),
                    Catch::Contains("sum_squares") && Catch::Contains("power of two"));
}
