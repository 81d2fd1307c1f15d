// CUDA fused causal attention against the CPU's fused kernel, forward and
// backward: the bitwise-mode kernel (kernels/cuda/attention.cu) bit for bit
// for float32 (docs/design.md §4 level 4) and 16-bit inputs (GQA, dropout,
// head-transposed operands, V = 1, 16, 64, a sequence longer than a block);
// fast mode's cuDNN flash attention (kernels/cuda/cudnn_attention.cc) within
// 16-bit rounding. Skips without a GPU.
#include <catch2/catch.hpp>

#include "autograd/api.h"
#include "kernels/attention.h"
#include "runtime/numerics.h"
#include "test/util/cuda.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

namespace {
Tensor attend(const std::vector<Tensor>& in, double dropout) {
  AttentionOptions o;
  o.dropout_p = dropout;
  o.dropout_key = PhiloxKey{7, 3};
  return scaled_dot_product_attention(in[0], in[1], in[2], o);
}
}  // namespace

TEST_CASE("CUDA fused attention is registered; float32 fast mode (composite) and bitwise mode agree") {
  TESSEL_REQUIRE_GPU();
  CHECK(kernels::attention_forward.has(DeviceType::CUDA));
  CHECK(kernels::attention_backward.has(DeviceType::CUDA));
  // Fast and bitwise GEMM modes agree within rounding on the GPU.
  Tensor q = uniform({2, 4, 33, 16}, 1), k = uniform({2, 2, 33, 16}, 2), v = uniform({2, 2, 33, 16}, 3);
  Tensor fast, bit;
  {
    numerics::GemmModeGuard g(numerics::GemmMode::Fast);
    fast = to_cpu(scaled_dot_product_attention(to_cuda(q), to_cuda(k), to_cuda(v)));
  }
  {
    numerics::GemmModeGuard g(numerics::GemmMode::Bitwise);
    bit = to_cpu(scaled_dot_product_attention(to_cuda(q), to_cuda(k), to_cuda(v)));
  }
  CHECK(allclose(fast, bit, 1e-4, 1e-5));
}

TEST_CASE("CUDA fused attention equals the CPU bit for bit (bitwise mode)") {
  TESSEL_REQUIRE_GPU();
  numerics::GemmModeGuard mode(numerics::GemmMode::Bitwise);
  struct Shape {
    int64_t B, Hq, Hkv, T, D;
  };
  for (Shape s : {Shape{2, 4, 4, 37, 16}, Shape{1, 6, 2, 130, 64}, Shape{2, 2, 1, 300, 32}}) {
    for (int V : {1, 16, 64}) {
      numerics::ChunksGuard chunks(V);
      for (double p : {0.0, 0.2}) {
        INFO("B " << s.B << " Hq " << s.Hq << " Hkv " << s.Hkv << " T " << s.T << " D " << s.D << " V " << V
                  << " dropout " << p);
        Tensor q = uniform({s.B, s.Hq, s.T, s.D}, 11, -2, 2).requires_grad_();
        Tensor k = uniform({s.B, s.Hkv, s.T, s.D}, 12, -2, 2).requires_grad_();
        Tensor v = uniform({s.B, s.Hkv, s.T, s.D}, 13, -2, 2).requires_grad_();
        CHECK_CUDA_MATCHES([p](const std::vector<Tensor>& in) { return attend(in, p); }, {q, k, v});
      }
    }
  }
}

TEST_CASE("CUDA fused attention: head-transposed operands and 16-bit inputs equal the CPU") {
  TESSEL_REQUIRE_GPU();
  numerics::GemmModeGuard mode(numerics::GemmMode::Bitwise);
  // q, k, v as the models make them: [B, T, H, D] projections viewed as [B, H, T, D].
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    INFO(dtype_name(dt));
    Tensor q = uniform({2, 45, 4, 32}, 21, -2, 2, dt).requires_grad_();
    Tensor k = uniform({2, 45, 2, 32}, 22, -2, 2, dt).requires_grad_();
    Tensor v = uniform({2, 45, 2, 32}, 23, -2, 2, dt).requires_grad_();
    CHECK_CUDA_MATCHES(
        [](const std::vector<Tensor>& in) {
          return attend({in[0].transpose(1, 2), in[1].transpose(1, 2), in[2].transpose(1, 2)}, 0.1);
        },
        {q, k, v});
  }
}

TEST_CASE("CUDA fast mode: cuDNN flash attention matches the CPU within bf16 rounding, with GQA") {
  TESSEL_REQUIRE_GPU();
  numerics::GemmModeGuard mode(numerics::GemmMode::Fast);
  if (!kernels::attention_fast_forward.has(DeviceType::CUDA))
    TESSEL_SKIP("built without cuDNN's frontend (tools/deps.sh installs it where CUDA is)");
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    INFO(dtype_name(dt));
    // [B, T, H, D] projections viewed as [B, H, T, D], as the models make them.
    Tensor q = uniform({2, 129, 8, 64}, 31, -1, 1, dt).requires_grad_();
    Tensor k = uniform({2, 129, 2, 64}, 32, -1, 1, dt).requires_grad_();
    Tensor v = uniform({2, 129, 2, 64}, 33, -1, 1, dt).requires_grad_();
    CompareOptions tol;
    tol.bitwise = false;
    tol.rtol = 2e-2;
    tol.atol = 2e-2;
    CHECK_CUDA_MATCHES(
        [](const std::vector<Tensor>& in) {
          return attend({in[0].transpose(1, 2), in[1].transpose(1, 2), in[2].transpose(1, 2)}, 0.0);
        },
        {q, k, v}, tol);
  }
}
