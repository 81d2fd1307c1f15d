// softplus, the example op family (docs/adding_an_op.md): the kernel against
// its scalar reference bit for bit (every floating dtype, strided inputs),
// values against float64 math, gradients by finite differences, errors, Meta
// tensors, distributed tensors against one device, and the GPU against the
// CPU. test/ops/: one file per op family, built into test_ops (the CPU suite)
// and into gpu_tests (tools/gpu_check.sh).
#include <catch2/catch.hpp>

#include <cmath>

#include "autograd/api.h"
#include "kernels/softplus.h"
#include "test/dtensor/cases.h"
#include "test/util/cuda.h"
#include "test/util/dist.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

namespace {

// softplus of every element through the scalar reference in the compute type
// C, rounded once to x's dtype (the contract of kernels/softplus.h).
template <class C>
Tensor softplus_reference(const Tensor& x, double beta, double threshold) {
  std::vector<double> v = x.to(DType::Float64).contiguous().to_vector<double>();
  for (double& e : v) e = double(kernels::softplus_value<C>(C(e), C(beta), C(threshold)));
  return tensor(v, x.shape(), DType::Float64).to(x.dtype());
}

Tensor softplus_reference(const Tensor& x, double beta, double threshold) {
  return x.dtype() == DType::Float64 ? softplus_reference<double>(x, beta, threshold)
                                     : softplus_reference<float>(x, beta, threshold);
}

// dx = softplus'(x) * g through the scalar reference, rounded once to x's dtype.
template <class C>
Tensor softplus_grad_reference(const Tensor& g, const Tensor& x, double beta, double threshold) {
  std::vector<double> gv = g.to(DType::Float64).contiguous().to_vector<double>();
  std::vector<double> xv = x.to(DType::Float64).contiguous().to_vector<double>();
  for (size_t i = 0; i < xv.size(); ++i)
    xv[i] = double(kernels::softplus_grad<C>(C(gv[i]), C(xv[i]), C(beta), C(threshold)));
  return tensor(xv, x.shape(), DType::Float64).to(x.dtype());
}

}  // namespace

TEST_CASE("softplus backward: the kernel gives the scalar reference's bits, every dtype", "[softplus]") {
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16}) {
    INFO(dtype_name(dt));
    Tensor x = uniform({23, 31}, 5, -30, 30, dt).requires_grad_();
    Tensor g = uniform({23, 31}, 6, -2, 2, dt);
    softplus(x, 2.0, 15.0).backward(g);
    Tensor want = dt == DType::Float64 ? softplus_grad_reference<double>(g, x.detach(), 2.0, 15.0)
                                       : softplus_grad_reference<float>(g, x.detach(), 2.0, 15.0);
    CHECK(bitwise_equal(x.grad(), want));
  }
}

TEST_CASE("softplus: the kernel gives the scalar reference's bits, every dtype, any strides", "[softplus]") {
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16}) {
    for (double beta : {1.0, 0.5, 3.0}) {
      INFO(dtype_name(dt) << " beta " << beta);
      Tensor x = uniform({37, 29}, 1, -30, 30, dt);  // both sides of the threshold
      CHECK(bitwise_equal(softplus(x, beta), softplus_reference(x, beta, 20.0)));
      Tensor xt = x.t();  // strided
      CHECK(bitwise_equal(softplus(xt, beta, 5.0), softplus_reference(xt, beta, 5.0)));
    }
  }
}

TEST_CASE("softplus: values of float64 math; the linear branch above the threshold", "[softplus]") {
  Tensor x = tensor({0.0f, 1.0f, -3.0f, 25.0f}, {4});
  std::vector<float> y = softplus(x).to_vector<float>();
  CHECK(y[0] == Approx(std::log(2.0)).epsilon(1e-6));
  CHECK(y[1] == Approx(std::log1p(std::exp(1.0))).epsilon(1e-6));
  CHECK(y[2] == Approx(std::log1p(std::exp(-3.0))).epsilon(1e-6));
  CHECK(y[3] == 25.0f);  // beta * x > threshold: x itself
  CHECK(softplus(tensor({1.0f}, {1}), 2.0).item<float>() == Approx(std::log1p(std::exp(2.0)) / 2).epsilon(1e-6));
}

TEST_CASE("softplus: gradients by finite differences (float64, non-contiguous)", "[softplus]") {
  CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return softplus(in[0]); }, {grad_input_noncontig({5, 7}, 2, -4, 4)});
  CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return softplus(in[0], 2.5, 3.0); },
                  {grad_input_noncontig({4, 6}, 3, -3, 3)});
}

TEST_CASE("softplus: bad input names the op, the tensor and the values", "[softplus]") {
  CHECK_THROWS_WITH(softplus(zeros({3}, DType::Int64)), Catch::Contains("softplus") && Catch::Contains("floating"));
  CHECK_THROWS_WITH(softplus(zeros({3}), 0.0), Catch::Contains("softplus") && Catch::Contains("beta 0"));
  CHECK_THROWS_WITH(softplus(zeros({3}), 1.0, NAN), Catch::Contains("softplus") && Catch::Contains("threshold nan"));
  // Meta tensors: the shape, and the same checks, with no kernel.
  Tensor m = empty({2, 3}, kMeta);
  CHECK(softplus(m).shape() == Dims{2, 3});
  CHECK_THROWS_WITH(softplus(empty({2}, TensorOptions(DType::Int32).with_device(kMeta))), Catch::Contains("softplus"));
}

TEST_CASE("softplus on distributed tensors equals one device, bit for bit", "[softplus][dtensor]") {
  OpCase c{"softplus", {{7, 5}}, [](auto& x, auto&) { return std::vector<Tensor>{softplus(x[0], 1.5)}; }, true};
  for (const auto& dims : test_meshes()) {
    for (uint64_t seed : {11, 12}) {
      INFO("mesh " << mesh_name(dims) << " seed " << seed);
      CHECK(first_failure(on_ranks(mesh_size(dims), [&](int) {
              return run_op_case(c, Mesh::world(dims), seed, /*all_bitwise=*/true);
            })) == "");
    }
  }
}

TEST_CASE("CUDA softplus equals the CPU, forward and backward", "[softplus][cuda]") {
  TESSEL_REQUIRE_GPU();
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16}) {
    INFO(dtype_name(dt));
    // float64 is outside the bitwise contract: tmath's double overloads are
    // the platform's libm on the CPU and CUDA's on the GPU, which differ in
    // the last bit (seen on an H100). Those agree to a few ulps.
    CompareOptions opts;
    if (dt == DType::Float64) opts = CompareOptions{/*bitwise=*/false, /*rtol=*/1e-14, /*atol=*/1e-300};
    Tensor x = uniform({65, 129}, 4, -30, 30, dt).requires_grad_();
    CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return softplus(in[0], 1.5, 10.0); }, {x}, opts);
    CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return softplus(in[0].t()); }, {x}, opts);
  }
}
