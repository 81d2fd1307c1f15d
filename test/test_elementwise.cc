// Elementwise ops: values, broadcasting, promotion, reference comparison, gradients, errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "autograd/api.h"
#include "kernels/unary_math.h"
#include "runtime/threadpool.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

TEST_CASE("binary ops broadcast and promote") {
  Tensor a = arange(6).reshape({2, 3});                 // int64
  Tensor b = tensor({10.f, 20.f, 30.f});                // float32
  Tensor c = a + b;
  CHECK(c.dtype() == DType::Float32);
  CHECK(c.shape() == Dims{2, 3});
  CHECK(c.to_vector<float>() == std::vector<float>{10, 21, 32, 13, 24, 35});
  CHECK((a * 2).dtype() == DType::Int64);
  CHECK((a * 2.5).dtype() == DType::Float32);
  CHECK((a / 2).to_vector<float>()[1] == 0.5f);
  Tensor h = ones({2}, DType::Float16) + ones({2}, DType::BFloat16);
  CHECK(h.dtype() == DType::Float32);
  CHECK((3.0 - tensor({1.f, 2.f})).to_vector<float>() == std::vector<float>{2, 1});
  CHECK(maximum(tensor({1.f, NAN}), tensor({2.f, 0.f})).to_vector<float>()[0] == 2.f);
  CHECK(std::isnan(maximum(tensor({1.f, NAN}), tensor({2.f, 0.f})).to_vector<float>()[1]));
  CHECK(pow(tensor({2.f, 3.f}), 2).to_vector<float>() == std::vector<float>{4, 9});
  CHECK(pow(tensor({4.f}), 0.5).item<float>() == 2.f);
}

TEST_CASE("comparisons, logical ops, where and masked_fill") {
  Tensor x = tensor({1.f, 2.f, 3.f});
  CHECK(gt(x, 1.5).to_vector<bool>() == std::vector<bool>{false, true, true});
  CHECK(eq(x, tensor({1.f, 0.f, 3.f})).to_vector<bool>() == std::vector<bool>{true, false, true});
  CHECK(logical_and(gt(x, 1.5), lt(x, 2.5)).to_vector<bool>() == std::vector<bool>{false, true, false});
  CHECK(logical_not(gt(x, 1.5)).to_vector<bool>() == std::vector<bool>{true, false, false});
  CHECK(where(gt(x, 1.5), x, 0.0).to_vector<float>() == std::vector<float>{0, 2, 3});
  Tensor m = tensor(std::vector<bool>{true, false, true});
  CHECK(masked_fill(x.reshape({1, 3}).expand({2, 3}), m, -1.0).to_vector<float>() ==
        std::vector<float>{-1, 2, -1, -1, 2, -1});
}

TEST_CASE("elementwise errors name the op and the shapes") {
  CHECK_THROWS_WITH(zeros({2, 3}) + zeros({4}), Catch::Contains("add") && Catch::Contains("[2, 3]") &&
                                                    Catch::Contains("[4]"));
  CHECK_THROWS_WITH(where(zeros({2}), zeros({2}), zeros({2})), Catch::Contains("where") && Catch::Contains("bool"));
  CHECK_THROWS_WITH(gelu(zeros({2}), "fast"), Catch::Contains("gelu") && Catch::Contains("fast"));
  CHECK_THROWS_WITH(exp(tensor(std::vector<bool>{true})), Catch::Contains("bool"));
}

// Kernel vs the scalar definition (kernels/unary_math.h) applied element by element.
template <kernels::UnaryOp Op>
void check_unary_reference(Tensor (*fn)(const Tensor&), double lo, double hi) {
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16}) {
    Tensor x = uniform({37, 29}, 11, lo, hi, dt);
    Tensor xt = x.transpose(0, 1);  // strided input
    for (const Tensor& in : {x, xt}) {
      Tensor y = fn(in);
      auto xs = in.to_vector<double>();
      auto ys = y.to_vector<double>();
      for (size_t i = 0; i < xs.size(); ++i) {
        double ref;
        if (dt == DType::Float64) ref = kernels::UnaryFn<Op>::fwd(xs[i]);
        else if (dt == DType::Float32) ref = kernels::UnaryFn<Op>::fwd(float(xs[i]));
        else if (dt == DType::BFloat16) ref = float(bf16(kernels::UnaryFn<Op>::fwd(float(xs[i]))));
        else ref = float(f16(kernels::UnaryFn<Op>::fwd(float(xs[i]))));
        if (!(std::isnan(ref) && std::isnan(ys[i]))) REQUIRE(std::memcmp(&ref, &ys[i], 8) == 0);
      }
    }
  }
}

TEST_CASE("unary kernels equal their scalar definitions bit for bit") {
  using kernels::UnaryOp;
  check_unary_reference<UnaryOp::Exp>(exp, -5, 5);
  check_unary_reference<UnaryOp::Log>(log, 0.01, 10);
  check_unary_reference<UnaryOp::Tanh>(tanh, -4, 4);
  check_unary_reference<UnaryOp::Sigmoid>(sigmoid, -6, 6);
  check_unary_reference<UnaryOp::Silu>(silu, -6, 6);
  check_unary_reference<UnaryOp::Erf>(erf, -3, 3);
  check_unary_reference<UnaryOp::Sqrt>(sqrt, 0, 4);
  check_unary_reference<UnaryOp::Rsqrt>(rsqrt, 0.1, 4);
  check_unary_reference<UnaryOp::Relu>(relu, -1, 1);
  check_unary_reference<UnaryOp::Round>(round, -5, 5);
  check_unary_reference<UnaryOp::Neg>(neg, -1, 1);
  check_unary_reference<UnaryOp::Abs>(abs, -1, 1);
}

TEST_CASE("elementwise results do not depend on the thread count") {
  Tensor x = uniform({300, 257}, 3);
  Tensor y = uniform({257}, 4);
  set_num_threads(1);
  Tensor a = gelu(x * y + x);
  set_num_threads(3);
  Tensor b = gelu(x * y + x);
  set_num_threads(2);
  CHECK(bitwise_equal(a, b));
}

TEST_CASE("gradients of binary ops, with broadcasting and strided inputs") {
  auto A = [] { return grad_input_noncontig({3, 4}, 1); };
  auto B = [] { return grad_input({4}, 2, 0.5, 1.5); };
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return v[0] + v[1]; }, {A(), B()});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return v[0] - v[1]; }, {A(), B()});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return v[0] * v[1]; }, {A(), B()});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return v[0] / v[1]; }, {A(), B()});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return maximum(v[0], v[1]); }, {A(), B()});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return minimum(v[0], v[1]); }, {A(), B()});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return pow(v[1], v[0]); },
                  {grad_input({3, 4}, 3), grad_input({4}, 4, 0.5, 2.0)});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return pow(v[0], 3.0); }, {A()});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return 2.0 - v[0] * 3.0 + 1.0; }, {A()});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return where(gt(v[0], 0.0), v[0], v[1]); }, {A(), B()});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return masked_fill(v[0], gt(v[0], 0.2), 0.0); }, {A()});
}

TEST_CASE("gradients of unary ops") {
  auto X = [] { return grad_input_noncontig({3, 5}, 9, -2, 2); };
  auto P = [] { return grad_input({3, 5}, 10, 0.2, 3); };
  using F = Tensor (*)(const Tensor&);
  for (F f : {F(neg), F(exp), F(tanh), F(sigmoid), F(silu), F(erf), F(sin), F(cos), F(expm1), F(square)}) {
    CHECK_GRADCHECK([f](const std::vector<Tensor>& v) { return f(v[0]); }, {X()});
  }
  for (F f : {F(log), F(sqrt), F(rsqrt), F(reciprocal), F(log1p), F(abs), F(relu)}) {
    CHECK_GRADCHECK([f](const std::vector<Tensor>& v) { return f(v[0]); }, {P()});
  }
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return gelu(v[0], "tanh"); }, {X()});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return gelu(v[0], "none"); }, {X()});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return swiglu(v[0], v[1]); }, {X(), grad_input({3, 5}, 11)});
}

// The op checks its inputs once and the kernels do not re-check them: every
// error here comes from the op, so it comes on Meta tensors too (no kernel
// runs there), as in a Meta model or before a distributed op.
TEST_CASE("elementwise errors come from the op, on Meta tensors too") {
  CHECK_THROWS_WITH(meta({2, 3}) + meta({4}), Catch::Contains("add") && Catch::Contains("[2, 3]"));
  CHECK_THROWS_WITH(where(meta({2}), meta({2}), meta({2})), Catch::Contains("where") && Catch::Contains("bool"));
  CHECK_THROWS_WITH(where(meta({3}, DType::Bool), meta({2}), meta({2})), Catch::Contains("where"));
  CHECK_THROWS_WITH(exp(meta({2}, DType::Bool)), Catch::Contains("bool"));
  CHECK((meta({2, 1}) * meta({3}, DType::Float64)).shape() == Dims{2, 3});
}
