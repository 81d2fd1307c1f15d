// cat, stack, split, chunk: values, promotion, views, gradients, errors.
#include <catch2/catch.hpp>

#include <vector>

#include "autograd/api.h"
#include "runtime/threadpool.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

namespace {
Tensor fseq(int64_t n, const Dims& shape, double start = 0) {
  return arange(start, start + double(n), 1.0, TensorOptions(DType::Float32)).reshape(shape);
}
}  // namespace

TEST_CASE("cat values along any dim, strided inputs") {
  Tensor a = fseq(6, {2, 3}), b = fseq(4, {2, 2}, 100);
  Tensor c = cat({a, b}, 1);
  CHECK(c.shape() == Dims{2, 5});
  CHECK(c.to_vector<float>() == std::vector<float>{0, 1, 2, 100, 101, 3, 4, 5, 102, 103});
  CHECK(bitwise_equal(cat({a, b}, -1), c));
  Tensor d = cat({a, fseq(3, {1, 3}, 10), a.narrow(0, 1, 1)}, 0);
  CHECK(d.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5, 10, 11, 12, 3, 4, 5});
  // Transposed inputs.
  Tensor t = cat({a.t(), b.t()}, 0);  // [3, 2] + [2, 2]
  CHECK(t.to_vector<float>() == std::vector<float>{0, 3, 1, 4, 2, 5, 100, 102, 101, 103});
  CHECK(bitwise_equal(cat({a}, 0), a));
  // Empty pieces along the dim, and PyTorch's legacy skip of 1-D empties.
  CHECK(bitwise_equal(cat({a, zeros({2, 0}), b}, 1), c));
  CHECK(bitwise_equal(cat({zeros({0}), a, zeros({0})}, 0), a));
  CHECK(cat({zeros({0}), zeros({0})}).shape() == Dims{0});
}

TEST_CASE("cat and stack promote dtypes") {
  Tensor i = tensor(std::vector<int32_t>{1, 2});
  Tensor f = tensor({0.5f});
  Tensor c = cat({i, f});
  CHECK(c.dtype() == DType::Float32);
  CHECK(c.to_vector<float>() == std::vector<float>{1, 2, 0.5f});
  CHECK(cat({i, tensor(std::vector<int64_t>{3})}).dtype() == DType::Int64);
  CHECK(cat({ones({1}, DType::Float16), ones({1}, DType::BFloat16)}).dtype() == DType::Float32);
  CHECK(cat({ones({1}, DType::Bool), i}).to_vector<int32_t>() == std::vector<int32_t>{1, 1, 2});
  Tensor s = stack({tensor(std::vector<int64_t>{1, 2}), tensor(std::vector<double>{3.5, 4})});
  CHECK(s.dtype() == DType::Float64);
  CHECK(s.to_vector<double>() == std::vector<double>{1, 2, 3.5, 4});
}

TEST_CASE("stack values at every position") {
  Tensor a = fseq(6, {2, 3}), b = fseq(6, {2, 3}, 10);
  Tensor s0 = stack({a, b});
  CHECK(s0.shape() == Dims{2, 2, 3});
  CHECK(s0.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15});
  Tensor s1 = stack({a, b}, 1);
  CHECK(s1.shape() == Dims{2, 2, 3});
  CHECK(s1.to_vector<float>() == std::vector<float>{0, 1, 2, 10, 11, 12, 3, 4, 5, 13, 14, 15});
  Tensor s2 = stack({a, b.t().contiguous().t()}, -1);
  CHECK(s2.shape() == Dims{2, 3, 2});
  CHECK(s2.to_vector<float>() == std::vector<float>{0, 10, 1, 11, 2, 12, 3, 13, 4, 14, 5, 15});
  CHECK(stack({scalar_tensor(1.0), scalar_tensor(2.0)}).to_vector<float>() == std::vector<float>{1, 2});
}

TEST_CASE("split and chunk return views with PyTorch's sizes") {
  Tensor x = fseq(20, {4, 5});
  auto p = split(x, 2, 1);
  REQUIRE(p.size() == 3);
  CHECK(p[0].shape() == Dims{4, 2});
  CHECK(p[2].shape() == Dims{4, 1});
  CHECK(p[2].to_vector<float>() == std::vector<float>{4, 9, 14, 19});
  for (const auto& t : p) CHECK(t.shares_storage(x));
  CHECK(p[1].raw_data() == static_cast<float*>(x.raw_data()) + 2);

  auto q = split(x, std::vector<int64_t>{1, 0, 3}, 0);
  REQUIRE(q.size() == 3);
  CHECK(q[1].shape() == Dims{0, 5});
  CHECK(q[2].to_vector<float>()[0] == 5.f);
  CHECK(split(x, 10, 0).size() == 1);

  // chunk: ceil(size / chunks) per piece, possibly fewer pieces.
  auto c = chunk(fseq(6, {6}), 4);
  REQUIRE(c.size() == 3);
  CHECK(c[2].to_vector<float>() == std::vector<float>{4, 5});
  auto c2 = chunk(x, 3, -1);  // 5 -> 2, 2, 1
  REQUIRE(c2.size() == 3);
  CHECK(c2[2].shape() == Dims{4, 1});
  CHECK(chunk(zeros({0, 3}), 3).size() == 3);
  CHECK(chunk(fseq(3, {3}), 5).size() == 3);
  // Strided input.
  auto tp = split(x.t(), 3, 0);  // [5, 4] -> 3 + 2 rows
  CHECK(tp[1].to_vector<float>() == std::vector<float>{3, 8, 13, 18, 4, 9, 14, 19});
}

TEST_CASE("joining does not depend on the thread count") {
  std::vector<Tensor> xs;
  for (int i = 0; i < 5; ++i) xs.push_back(uniform({64, 300 + i}, uint64_t(i)).t());
  set_num_threads(1);
  Tensor a = cat(xs, 0);
  set_num_threads(3);
  Tensor b = cat(xs, 0);
  set_num_threads(2);
  CHECK(bitwise_equal(a, b));
}

TEST_CASE("gradients of cat and stack reach every input") {
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return cat(v, 1); },
                  {grad_input_noncontig({3, 2}, 1), grad_input({3, 4}, 2), grad_input_noncontig({3, 3}, 3)});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return cat(v, 0) * cat(v, 0); },
                  {grad_input_noncontig({2, 3}, 4), grad_input({1, 3}, 5)});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return stack(v, 1); },
                  {grad_input_noncontig({3, 2}, 6), grad_input({3, 2}, 7)});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return stack(v, -1); },
                  {grad_input({2, 2}, 8), grad_input_noncontig({2, 2}, 9), grad_input({2, 2}, 10)});
  // Mixed with an integer input (no gradient) and a skipped empty vector.
  Tensor ints = tensor(std::vector<int64_t>{1, 2}, {1, 2});
  CHECK_GRADCHECK([&](const std::vector<Tensor>& v) { return cat({v[0], ints, zeros({0}, DType::Float64)}, 0); },
                  {grad_input({2, 2}, 11)});
  Tensor e = grad_input({0}, 12);
  Tensor w = grad_input({2, 2}, 13);
  sum(cat({e, w})).backward();
  CHECK(e.grad().shape() == Dims{0});
  CHECK(w.grad().to_vector<double>() == std::vector<double>{1, 1, 1, 1});
}

TEST_CASE("gradients of split and chunk pieces, used or not") {
  CHECK_GRADCHECK(
      [](const std::vector<Tensor>& v) {
        auto p = split(v[0], 2, 1);
        return cat({p[2] * 3.0, p[0]}, 1);  // p[1] unused: its gradient is 0
      },
      {grad_input_noncontig({3, 5}, 1)});
  CHECK_GRADCHECK(
      [](const std::vector<Tensor>& v) {
        auto p = split(v[0], std::vector<int64_t>{1, 2}, 0);
        return p[1] * p[1] + p[0];
      },
      {grad_input_noncontig({3, 4}, 2)});
  CHECK_GRADCHECK(
      [](const std::vector<Tensor>& v) {
        auto p = chunk(v[0], 3, -1);
        return p[0] * p[1] * p[2];
      },
      {grad_input_noncontig({2, 6}, 3)});
}

TEST_CASE("join and split errors name the op and the shapes") {
  CHECK_THROWS_WITH(cat({}), Catch::Contains("cat") && Catch::Contains("at least one"));
  CHECK_THROWS_WITH(cat({zeros({2, 3}), zeros({3, 3})}, 1),
                    Catch::Contains("cat") && Catch::Contains("[3, 3]") && Catch::Contains("[2, 3]") &&
                        Catch::Contains("dimension 1"));
  CHECK_THROWS_WITH(cat({zeros({2, 3}), zeros({2, 3, 1})}),
                    Catch::Contains("cat") && Catch::Contains("[2, 3, 1]"));
  CHECK_THROWS_WITH(cat({scalar_tensor(1.0), scalar_tensor(2.0)}),
                    Catch::Contains("cat") && Catch::Contains("zero-dimensional"));
  CHECK_THROWS_WITH(cat({zeros({2}), zeros({2})}, 1), Catch::Contains("cat") && Catch::Contains("dimension 1"));
  CHECK_THROWS_WITH(cat({zeros({2}), empty({2}, TensorOptions(kMeta))}),
                    Catch::Contains("cat") && Catch::Contains("different devices"));
  CHECK_THROWS_WITH(cat({zeros({2}), Tensor()}), Catch::Contains("cat") && Catch::Contains("undefined"));
  CHECK_THROWS_WITH(stack({}), Catch::Contains("stack") && Catch::Contains("at least one"));
  CHECK_THROWS_WITH(stack({zeros({2}), zeros({3})}),
                    Catch::Contains("stack") && Catch::Contains("[2]") && Catch::Contains("[3]"));
  CHECK_THROWS_WITH(stack({zeros({2}), zeros({2})}, 2), Catch::Contains("stack") && Catch::Contains("dimension 2"));

  Tensor x = zeros({4, 5});
  CHECK_THROWS_WITH(split(x, 0, 1), Catch::Contains("split") && Catch::Contains("positive"));
  CHECK_THROWS_WITH(split(x, -2, 0), Catch::Contains("split") && Catch::Contains("-2"));
  CHECK_THROWS_WITH(split(x, std::vector<int64_t>{2, 2}, 1),
                    Catch::Contains("split") && Catch::Contains("sum to 4") && Catch::Contains("size 5"));
  CHECK_THROWS_WITH(split(x, std::vector<int64_t>{5, -1}, 1),
                    Catch::Contains("split") && Catch::Contains("negative"));
  CHECK_THROWS_WITH(split(x, 1, 2), Catch::Contains("split") && Catch::Contains("dimension 2"));
  CHECK_THROWS_WITH(split(scalar_tensor(1.0), 1, 0), Catch::Contains("split") && Catch::Contains("zero-dimensional"));
  CHECK_THROWS_WITH(chunk(x, 0), Catch::Contains("chunk") && Catch::Contains("positive"));
  CHECK_THROWS_WITH(chunk(x, 2, -3), Catch::Contains("chunk") && Catch::Contains("-3"));
}
