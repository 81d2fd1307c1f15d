// The CUDA matmul. Bitwise mode: the project's GEMM equals gemm_reference_f32
// (and so the CPU) bit for bit for many shapes (tile edges, K < V, K = 0),
// every transpose combination, V from 1 to 1024, accumulate, batches and
// 16-bit inputs; a sub-block of C computed alone equals the same block of the
// full product. Fast mode (cuBLASLt): close to the bitwise result and the same
// bits run after run; the fused bias/GELU epilogues match the composite ops.
// Skips without a GPU.
#include <catch2/catch.hpp>

#include <vector>

#include "autograd/api.h"
#include "kernels/cuda/lt_plan.h"
#include "kernels/gemm.h"
#include "kernels/matmul.h"
#include "runtime/numerics.h"
#include "test/util/cuda.h"
#include "test/util/util.h"

#ifdef TESSEL_WITH_CUDA
#include "kernels/cuda/cublaslt.h"
#endif

using namespace tessel;
using namespace tessel::testing;

namespace {

// C = A . B by the reference (float32), A [M, K] and B [K, N] given as strided views.
Tensor reference(const Tensor& a, const Tensor& b, int v, const Tensor& c_init = Tensor()) {
  const int64_t M = a.shape()[0], K = a.shape()[1], N = b.shape()[1];
  Tensor c = c_init.defined() ? c_init.clone() : zeros({M, N});
  kernels::cpu::GemmArgs g;
  g.M = M;
  g.N = N;
  g.K = K;
  g.A = a.data<float>();
  g.a_row_stride = a.strides()[0];
  g.a_col_stride = a.strides()[1];
  g.B = b.data<float>();
  g.b_row_stride = b.strides()[0];
  g.b_col_stride = b.strides()[1];
  g.C = c.data<float>();
  g.c_row_stride = N;
  g.accumulate = c_init.defined();
  g.chunks = v;
  kernels::cpu::gemm_reference_f32(g);
  return c;
}

// The same strided view of a GPU copy of t's buffer.
Tensor gpu_view(const Tensor& t, bool transposed) {
  if (!transposed) return to_cuda(t);
  return raw::transpose(to_cuda(raw::transpose(t, 0, 1).contiguous()), 0, 1);
}

Tensor gpu_bmm(const Tensor& a, const Tensor& b, int v, bool accumulate = false, const Tensor& c_init = Tensor()) {
  const int64_t M = a.shape()[0], N = b.shape()[1];
  Tensor out = c_init.defined() ? to_cuda(c_init) : raw::empty({M, N}, a.dtype(), kCuda);
  kernels::bmm(kCuda, raw::unsqueeze(a, 0), raw::unsqueeze(b, 0), raw::unsqueeze(out, 0), accumulate, v);
  return out;
}

}  // namespace

TEST_CASE("bitwise CUDA GEMM equals gemm_reference_f32 for every shape, layout and V") {
  TESSEL_REQUIRE_GPU();
  numerics::GemmModeGuard mode(numerics::GemmMode::Bitwise);
  struct Shape {
    int64_t m, n, k;
  };
  const std::vector<Shape> shapes = {{1, 1, 1},    {3, 5, 7},     {64, 64, 64},  {65, 63, 129}, {17, 200, 3},
                                     {128, 96, 0}, {7, 1, 4096},  {1, 300, 515}, {130, 70, 16}, {256, 256, 768}};
  for (int v : {1, 4, 16, 64, 1024}) {
    for (const Shape& s : shapes) {
      for (int layout = 0; layout < 4; ++layout) {
        const bool ta = layout & 1, tb = layout & 2;
        INFO("M " << s.m << " N " << s.n << " K " << s.k << " V " << v << " ta " << ta << " tb " << tb);
        Tensor a = ta ? raw::transpose(uniform({s.k, s.m}, 101), 0, 1) : uniform({s.m, s.k}, 101);
        Tensor b = tb ? raw::transpose(uniform({s.n, s.k}, 102), 0, 1) : uniform({s.k, s.n}, 102);
        Tensor ref = reference(a, b, v);
        CHECK_SAME_BITS(gpu_bmm(gpu_view(a, ta), gpu_view(b, tb), v), ref);
        Tensor c0 = uniform({s.m, s.n}, 103);
        CHECK_SAME_BITS(gpu_bmm(gpu_view(a, ta), gpu_view(b, tb), v, true, c0), reference(a, b, v, c0));
      }
    }
  }
}

TEST_CASE("bitwise CUDA GEMM: long K split into groups, batches, blocks and 16-bit inputs") {
  TESSEL_REQUIRE_GPU();
  numerics::GemmModeGuard mode(numerics::GemmMode::Bitwise);
  // Few tiles and a long K: the plan splits the chunk tree across blocks.
  Tensor a = uniform({96, 65536}, 104), b = uniform({65536, 80}, 105);
  CHECK_SAME_BITS(gpu_bmm(to_cuda(a), to_cuda(b), 16), reference(a, b, 16));
  // A sub-block of C computed alone equals the same block of the full product.
  Tensor full_c = gpu_bmm(to_cuda(a), to_cuda(b), 16);
  Tensor part = gpu_bmm(to_cuda(a.narrow(0, 30, 33)), to_cuda(b.narrow(1, 7, 50)), 16);
  CHECK_SAME_BITS(part, to_cpu(full_c).narrow(0, 30, 33).narrow(1, 7, 50).contiguous());
  // Batched through the autograd op (forward and backward), float32 and bfloat16.
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    Tensor x = uniform({3, 5, 40, 24}, 106, -1, 1, dt).requires_grad_();
    Tensor y = uniform({3, 5, 24, 33}, 107, -1, 1, dt).requires_grad_();
    CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }, {x, y});
    Tensor w = uniform({33, 24}, 108, -1, 1, dt).requires_grad_();
    CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return linear(in[0], in[1]); }, {x, w});
  }
  Tensor x64 = uniform({20, 30}, 109, -1, 1, DType::Float64).requires_grad_();
  Tensor y64 = uniform({30, 10}, 110, -1, 1, DType::Float64).requires_grad_();
  CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }, {x64, y64});
}

TEST_CASE("fast mode (cuBLASLt): close to the bitwise result, and the same bits every run") {
  TESSEL_REQUIRE_GPU();
  numerics::GemmModeGuard mode(numerics::GemmMode::Fast);
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    INFO(dtype_name(dt));
    Tensor a = to_cuda(uniform({512, 768}, 111, -1, 1, dt)), b = to_cuda(uniform({768, 320}, 112, -1, 1, dt));
    Tensor first = matmul(a, b), second = matmul(a, b), third = matmul(a, b.contiguous());
    CHECK(bitwise_equal(to_cpu(first), to_cpu(second)));
    CHECK(bitwise_equal(to_cpu(first), to_cpu(third)));
    Tensor ref = matmul(a.to(kCPU).to(DType::Float32), b.to(kCPU).to(DType::Float32));
    const double tol = dt == DType::Float32 ? 1e-4 : 3e-2;
    CHECK(allclose(to_cpu(first).to(DType::Float32), ref, tol, tol));
    // Transposed operands and a batch go through cuBLASLt too.
    Tensor bt = to_cuda(uniform({320, 768}, 113, -1, 1, dt));
    CHECK(allclose(to_cpu(matmul(a, bt.t())).to(DType::Float32),
                   matmul(a.to(kCPU).to(DType::Float32), bt.to(kCPU).to(DType::Float32).t()), tol, tol));
  }
}

#ifdef TESSEL_WITH_CUDA
TEST_CASE("cuBLASLt fused epilogues (bias, GELU) match the composite ops") {
  TESSEL_REQUIRE_GPU();
  using kernels::cuda::LtEpilogue;
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    Tensor x = to_cuda(uniform({64, 96}, 114, -1, 1, dt)), w = to_cuda(uniform({48, 96}, 115, -1, 1, dt));
    Tensor bias = to_cuda(uniform({48}, 116, -1, 1, dt));
    Tensor ref_lin = linear(x.to(kCPU).to(DType::Float32), w.to(kCPU).to(DType::Float32),
                            bias.to(kCPU).to(DType::Float32));
    const double tol = dt == DType::Float32 ? 1e-4 : 3e-2;
    Tensor out = raw::empty({64, 48}, dt, kCuda);
    REQUIRE(kernels::cuda::lt_linear(x, w, bias, LtEpilogue::Bias, out));
    CHECK(allclose(to_cpu(out).to(DType::Float32), ref_lin, tol, tol));
    REQUIRE(kernels::cuda::lt_linear(x, w, bias, LtEpilogue::GeluBias, out));
    CHECK(allclose(to_cpu(out).to(DType::Float32), gelu(ref_lin), tol, tol));
    Tensor aux = raw::empty({64, 48}, dt, kCuda);
    REQUIRE(kernels::cuda::lt_linear(x, w, bias, LtEpilogue::GeluAuxBias, out, aux));
    CHECK(allclose(to_cpu(aux).to(DType::Float32), ref_lin, tol, tol));
  }
}
#endif
