// sort, argsort, topk: the total order (ties, NaN, signed zeros), a std::stable_sort
// reference, layouts, thread-count invariance, gradients, errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "autograd/api.h"
#include "runtime/threadpool.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

namespace {

std::vector<int64_t> I(std::initializer_list<int64_t> v) { return v; }

// Stable reference for one line: NaN largest, ties by index.
std::vector<int64_t> ref_order(const std::vector<double>& v, bool descending) {
  std::vector<int64_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), int64_t(0));
  auto key_less = [&](int64_t a, int64_t b) {
    double x = v[size_t(a)], y = v[size_t(b)];
    if (std::isnan(x) || std::isnan(y)) return !std::isnan(x) && std::isnan(y);
    return x < y;
  };
  if (descending) std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return key_less(b, a); });
  else std::stable_sort(idx.begin(), idx.end(), key_less);
  return idx;
}

}  // namespace

TEST_CASE("sort orders ties by index and NaN last (first when descending)") {
  Tensor x = tensor({3.f, 1.f, NAN, 1.f, 2.f, NAN, 3.f});
  auto [v, i] = sort(x);
  CHECK(i.to_vector<int64_t>() == I({1, 3, 4, 0, 6, 2, 5}));
  auto vv = v.to_vector<float>();
  CHECK(std::vector<float>(vv.begin(), vv.begin() + 5) == std::vector<float>{1, 1, 2, 3, 3});
  CHECK(std::isnan(vv[5]));
  CHECK(std::isnan(vv[6]));
  auto [vd, id] = sort(x, -1, /*descending=*/true);
  CHECK(id.to_vector<int64_t>() == I({2, 5, 0, 6, 4, 1, 3}));
  CHECK(vd.to_vector<float>()[2] == 3.f);
  CHECK(bitwise_equal(argsort(x, 0, true), id));
  // -0 and +0 are equal: index order in both directions.
  Tensor z = tensor({0.f, -0.f, 0.f});
  CHECK(argsort(z).to_vector<int64_t>() == I({0, 1, 2}));
  CHECK(argsort(z, 0, true).to_vector<int64_t>() == I({0, 1, 2}));
  CHECK(std::signbit(std::get<0>(sort(z)).to_vector<float>()[1]));  // values are the original elements
  // -inf and +inf sort among the numbers, before NaN.
  CHECK(argsort(tensor({NAN, INFINITY, -INFINITY})).to_vector<int64_t>() == I({2, 1, 0}));
  // stable = false gives the same (always stable) result.
  CHECK(bitwise_equal(argsort(x, -1, false, false), i));
}

TEST_CASE("sort along any dim of strided tensors equals a stable reference, every dtype") {
  for (DType dt : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16, DType::Int32, DType::Int64}) {
    // Few distinct values: plenty of ties.
    Tensor base = randint({6, 9, 7}, 5, -4, 4).to(dt);
    Tensor x = base.permute({2, 0, 1});  // [7, 6, 9], strided
    for (int64_t dim : {0, 1, 2}) {
      for (bool desc : {false, true}) {
        auto [v, i] = sort(x, dim, desc);
        REQUIRE(v.dtype() == dt);
        REQUIRE(i.dtype() == DType::Int64);
        // Compare line by line: move dim last.
        Tensor xl = x.transpose(dim, 2).contiguous();
        Tensor il = i.transpose(dim, 2).contiguous();
        Tensor vl = v.transpose(dim, 2).contiguous();
        const int64_t n = x.shape()[dim];
        auto xv = xl.to_vector<double>();
        auto iv = il.to_vector<int64_t>();
        auto vv = vl.to_vector<double>();
        for (size_t line = 0; line < xv.size() / size_t(n); ++line) {
          std::vector<double> vals(xv.begin() + line * n, xv.begin() + (line + 1) * n);
          auto ref = ref_order(vals, desc);
          for (int64_t j = 0; j < n; ++j) {
            REQUIRE(iv[line * n + j] == ref[size_t(j)]);
            REQUIRE(vv[line * n + j] == vals[size_t(ref[size_t(j)])]);
          }
        }
      }
    }
  }
}

TEST_CASE("topk values, ties, sorted and unsorted") {
  Tensor x = tensor({1.f, 3.f, 3.f, 2.f, 5.f});
  auto [v, i] = topk(x, 3);
  CHECK(v.to_vector<float>() == std::vector<float>{5, 3, 3});
  CHECK(i.to_vector<int64_t>() == I({4, 1, 2}));
  auto [vs, is] = topk(x, 2, -1, /*largest=*/false);
  CHECK(vs.to_vector<float>() == std::vector<float>{1, 2});
  CHECK(is.to_vector<int64_t>() == I({0, 3}));
  auto [vu, iu] = topk(x, 3, 0, true, /*sorted=*/false);  // ascending index order
  CHECK(iu.to_vector<int64_t>() == I({1, 2, 4}));
  CHECK(vu.to_vector<float>() == std::vector<float>{3, 3, 5});
  CHECK(std::get<0>(topk(x, 0)).shape() == Dims{0});
  CHECK(bitwise_equal(std::get<1>(topk(x, 5)), argsort(x, 0, true)));
  // NaN is the largest.
  CHECK(std::get<1>(topk(tensor({1.f, NAN, 2.f}), 2)).to_vector<int64_t>() == I({1, 2}));
  // 2-D, along dim 0, strided.
  Tensor m = tensor({4.f, 1.f, 2.f, 8.f, 6.f, 0.f}, {2, 3}).t();  // [3, 2]: cols [4,1,2], [8,6,0]
  auto [mv, mi] = topk(m, 2, 0);
  CHECK(mv.to_vector<float>() == std::vector<float>{4, 8, 2, 6});
  CHECK(mi.to_vector<int64_t>() == I({0, 0, 2, 1}));
}

TEST_CASE("topk equals the first k of the stable sort") {
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Int64}) {
    Tensor x = randint({5, 40}, 9, 0, 10).to(dt).t();  // [40, 5] with ties, strided
    for (int64_t k : {1, 7, 40}) {
      for (bool largest : {true, false}) {
        auto [v, i] = topk(x, k, 0, largest);
        auto [sv, si] = sort(x, 0, largest);
        CHECK(bitwise_equal(v, sv.narrow(0, 0, k).contiguous()));
        CHECK(bitwise_equal(i, si.narrow(0, 0, k).contiguous()));
      }
    }
  }
}

TEST_CASE("sort and topk of a scalar") {
  auto [v, i] = sort(scalar_tensor(2.5));
  CHECK(v.dim() == 0);
  CHECK(v.item<float>() == 2.5f);
  CHECK(i.item<int64_t>() == 0);
  auto [tv, ti] = topk(scalar_tensor(2.5), 1);
  CHECK(tv.item<float>() == 2.5f);
  CHECK(ti.item<int64_t>() == 0);
}

TEST_CASE("sorting does not depend on the thread count") {
  Tensor x = randint({64, 2000}, 3, 0, 50).to(DType::Float32);
  set_num_threads(1);
  auto [a, ai] = sort(x, 1, true);
  auto [b, bi] = topk(x, 100, 1);
  set_num_threads(3);
  auto [c, ci] = sort(x, 1, true);
  auto [d, di] = topk(x, 100, 1);
  set_num_threads(2);
  CHECK(bitwise_equal(a, c));
  CHECK(bitwise_equal(ai, ci));
  CHECK(bitwise_equal(b, d));
  CHECK(bitwise_equal(bi, di));
}

TEST_CASE("gradients of sort and topk values go back to the source positions") {
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return std::get<0>(sort(v[0], 1)); },
                  {grad_input_noncontig({3, 5}, 1)});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return std::get<0>(sort(v[0], 0, true)); },
                  {grad_input_noncontig({4, 3}, 2)});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return std::get<0>(topk(v[0], 2, -1)); },
                  {grad_input_noncontig({3, 6}, 3)});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return std::get<0>(topk(v[0], 3, 0, false, false)); },
                  {grad_input_noncontig({5, 2, 3}, 4)});
  // Hand check: the gradient lands where each value came from.
  Tensor x = tensor(std::vector<double>{3, 1, 2});
  x.requires_grad_(true);
  std::get<0>(sort(x)).backward(tensor(std::vector<double>{10, 20, 30}));
  CHECK(x.grad().to_vector<double>() == std::vector<double>{30, 10, 20});
  CHECK_FALSE(std::get<1>(sort(x)).requires_grad());
}

TEST_CASE("sort and topk errors") {
  Tensor x = zeros({2, 3});
  CHECK_THROWS_WITH(topk(x, 4), Catch::Contains("topk") && Catch::Contains("k = 4") && Catch::Contains("size 3"));
  CHECK_THROWS_WITH(topk(x, -1), Catch::Contains("topk") && Catch::Contains("-1"));
  CHECK_THROWS_WITH(topk(x, 1, 2), Catch::Contains("topk") && Catch::Contains("dimension 2"));
  CHECK_THROWS_WITH(sort(x, -3), Catch::Contains("sort") && Catch::Contains("-3"));
  CHECK_THROWS_WITH(argsort(x, 5), Catch::Contains("sort") && Catch::Contains("5"));
  CHECK_THROWS_WITH(topk(scalar_tensor(1.0), 2), Catch::Contains("topk") && Catch::Contains("k = 2"));
}

// The op checks its inputs once and the kernels do not re-check them: every
// error here comes from the op, so it comes on Meta tensors too (no kernel
// runs there), as in a Meta model or before a distributed op.
TEST_CASE("sort / topk errors come from the op, on Meta tensors too") {
  const Tensor x = meta({2, 3});
  CHECK_THROWS_WITH(topk(x, 4), Catch::Contains("topk") && Catch::Contains("k = 4") && Catch::Contains("size 3"));
  CHECK_THROWS_WITH(topk(x, -1), Catch::Contains("topk") && Catch::Contains("-1"));
  CHECK_THROWS_WITH(sort(x, -3), Catch::Contains("sort") && Catch::Contains("-3"));
  auto [v, i] = topk(x, 2);
  CHECK(v.shape() == Dims{2, 2});
  CHECK(i.dtype() == DType::Int64);
}
