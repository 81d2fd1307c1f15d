// CUDA reductions, arg max/min and softmax against the CPU: canonical-order
// sums/max/min are compared bit for bit for every floating dtype (float64
// too: its reductions are plain additions in one order), for several V,
// layouts (contiguous, transposed, several reduced dims) and sizes (one long
// reduction, many short ones). Skips without a GPU.
#include <catch2/catch.hpp>

#include <cmath>

#include "autograd/api.h"
#include "kernels/reduce.h"
#include "runtime/numerics.h"
#include "test/util/cuda.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;
using kernels::ReduceOp;

namespace {

// x reduced over `dims` (keepdim form) on the CPU and on the GPU.
void check_reduce(ReduceOp op, const Tensor& x, const std::vector<int>& dims, int v) {
  Dims os = x.shape();
  for (int d : dims) os[d] = 1;
  const DType od = is_floating(x.dtype()) || op != ReduceOp::Sum ? x.dtype() : DType::Int64;
  Tensor cpu = raw::empty(os, od), gpu = raw::empty(os, od, kCuda);
  kernels::reduce(kCPU, op, x, cpu, v);
  // The same logical tensor on the GPU with the same strides.
  Tensor xd = to_cuda(x);
  kernels::reduce(kCuda, op, xd, gpu, v);
  CHECK_SAME_BITS(gpu, cpu);
  // And from a transposed buffer (another memory layout, same logical order).
  if (x.dim() >= 2) {
    Tensor tb = to_cuda(raw::transpose(x, 0, x.dim() - 1).contiguous());
    Tensor xt = raw::transpose(tb, 0, x.dim() - 1);
    Tensor gpu2 = raw::empty(os, od, kCuda);
    kernels::reduce(kCuda, op, xt, gpu2, v);
    CHECK_SAME_BITS(gpu2, cpu);
  }
}

}  // namespace

TEST_CASE("CUDA sum/max/min equal the CPU's canonical order bit for bit") {
  TESSEL_REQUIRE_GPU();
  struct Case {
    Dims shape;
    std::vector<int> dims;
  };
  const std::vector<Case> cases = {
      {{37, 1000}, {1}},      {{37, 1000}, {0}},   {{37, 1000}, {0, 1}}, {{5, 7, 300}, {0, 2}},
      {{5, 7, 300}, {1}},     {{3, 1, 9}, {1}},    {{1}, {0}},           {{129, 64}, {0}},
      {{2, 3, 4, 5}, {1, 3}},
  };
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16, DType::Float64}) {
    for (int v : {1, 4, 16, 64}) {
      for (const Case& c : cases) {
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
          INFO(dtype_name(dt) << " V " << v << " shape " << c.shape.str() << " op " << int(op));
          check_reduce(op, uniform(c.shape, 21, -100, 100, dt), c.dims, v);
        }
      }
    }
  }
}

TEST_CASE("CUDA reduction of one long vector, and signed zeros / NaN in max") {
  TESSEL_REQUIRE_GPU();
  check_reduce(ReduceOp::Sum, uniform({3 * 1000 * 1000 + 17}, 22), {0}, 16);
  check_reduce(ReduceOp::Sum, uniform({4096, 3}, 23), {0}, 16);  // long columns
  Tensor z = tensor(std::vector<float>{-0.0f, 0.0f, -0.0f, -1.0f, 0.0f, -0.0f, -0.0f, -2.0f, 0.0f}, Dims{9});
  check_reduce(ReduceOp::Max, z, {0}, 4);
  check_reduce(ReduceOp::Min, z, {0}, 4);
  Tensor n = tensor(std::vector<float>{1.0f, NAN, 3.0f}, Dims{3});
  check_reduce(ReduceOp::Max, n, {0}, 2);
}

TEST_CASE("CUDA integer reductions are exact") {
  TESSEL_REQUIRE_GPU();
  for (DType dt : {DType::Int32, DType::Int64, DType::Bool}) {
    Tensor x = dt == DType::Bool ? randint({33, 77}, 24, 0, 2).to(DType::Bool) : randint({33, 77}, 24, -1000, 1000, dt);
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
      check_reduce(op, x, {1}, 16);
      check_reduce(op, x, {0, 1}, 16);
    }
  }
}

TEST_CASE("CUDA argmax / argmin: first occurrence, NaN wins") {
  TESSEL_REQUIRE_GPU();
  Tensor x = randint({40, 300}, 25, -5, 5).to(DType::Float32);  // many ties
  for (bool is_max : {true, false})
    for (int d : {0, 1}) {
      Tensor cpu = is_max ? argmax(x, d, true) : argmin(x, d, true);
      Tensor gpu = is_max ? argmax(to_cuda(x), d, true) : argmin(to_cuda(x), d, true);
      CHECK_SAME_BITS(gpu, cpu);
    }
  Tensor n = tensor(std::vector<float>{1, NAN, 5, NAN, 5}, Dims{1, 5});
  CHECK(argmax(to_cuda(n), 1).item<int64_t>() == 1);
  CHECK(argmin(to_cuda(n), 1).item<int64_t>() == 1);
}

TEST_CASE("CUDA softmax / log_softmax forward and backward equal the CPU") {
  TESSEL_REQUIRE_GPU();
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    for (int v : {1, 16, 128}) {
      numerics::ChunksGuard guard(v);
      INFO(dtype_name(dt) << " V " << v);
      Tensor x = uniform({64, 1000}, 26, -8, 8, dt).requires_grad_();
      CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return softmax(in[0], 1); }, {x});
      CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return log_softmax(in[0], 1); }, {x});
      Tensor y = uniform({50, 7, 9}, 27, -3, 3, dt).requires_grad_();  // along a strided dim
      CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return softmax(in[0], 0); }, {y});
      CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return log_softmax(in[0], 1); }, {y});
    }
  }
  // A causal mask row of -inf.
  Tensor m = uniform({4, 6}, 28).requires_grad_();
  CHECK_CUDA_MATCHES(
      [](const std::vector<Tensor>& in) {
        return softmax(masked_fill(in[0], logical_not(tril(ones({4, 6}, TensorOptions(DType::Bool).with_device(
                                                                             in[0].device())))),
                                   -INFINITY),
                       1);
      },
      {m});
}

TEST_CASE("CUDA sum / mean / var through autograd") {
  TESSEL_REQUIRE_GPU();
  Tensor x = uniform({6, 50, 70}, 29, -2, 2).requires_grad_();
  CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return sum(in[0], {0, 2}); }, {x});
  CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return mean(in[0], {1}); }, {x});
  CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return var(in[0], {2}); }, {x});
  CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return amax(in[0], {1}); }, {x});
}
