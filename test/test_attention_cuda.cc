// CUDA fused causal attention against the CPU's fused kernel, forward and
// backward: the bitwise-mode kernel (kernels/cuda/attention.cu) bit for bit
// for float32 (docs/design.md §4 level 4) and 16-bit inputs (GQA, dropout,
// head-transposed operands, V = 1, 16, 64, a sequence longer than a block);
// fast mode's cuDNN flash attention (kernels/cuda/cudnn_attention.cc) within
// 16-bit rounding. Skips without a GPU.
#include <catch2/catch.hpp>

#include <cmath>

#include "autograd/api.h"
#include "kernels/attention.h"
#include "kernels/random.h"
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

// Context parallelism's kernel contract on the GPU (kernels/attention.h "A
// piece of the queries"): the kernels on query rows [q0, q0 + Tq) against all
// keys give the CPU kernels' out, stats, dq, dk and dv for that piece, bit
// for bit (GQA, dropout at the piece's block, V that does and does not divide
// the pieces, head-transposed operands).
TEST_CASE("CUDA fused attention on a piece of the queries equals the CPU's (context parallelism)") {
  TESSEL_REQUIRE_GPU();
  struct Case {
    int64_t B, Hq, Hkv, T, D, pieces;
    int v;
  };
  for (Case c : {Case{1, 2, 2, 64, 16, 2, 16}, Case{2, 4, 2, 96, 8, 4, 16}, Case{1, 3, 1, 100, 32, 4, 4}})
    for (bool dropout : {false, true}) {
      INFO("B " << c.B << " Hq " << c.Hq << " Hkv " << c.Hkv << " T " << c.T << " pieces " << c.pieces << " V "
                << c.v << " dropout " << dropout);
      const Tensor q = uniform({c.B, c.T, c.Hq, c.D}, 31, -2, 2).transpose(1, 2);
      const Tensor k = uniform({c.B, c.T, c.Hkv, c.D}, 32, -2, 2).transpose(1, 2);
      const Tensor v = uniform({c.B, c.T, c.Hkv, c.D}, 33, -2, 2).transpose(1, 2);
      const Tensor dout = uniform({c.B, c.Hq, c.T, c.D}, 34, -1, 1);
      kernels::AttentionParams p;
      p.scale = 1.0 / std::sqrt(double(c.D));
      p.chunks = c.v;
      if (dropout) {
        p.dropout = true;
        p.key = PhiloxKey{11, 12};
        p.keep_threshold = kernels::bernoulli_threshold(0.8);
        p.dropout_scale = 1.0 / 0.8;
        p.block = GlobalBlock{{c.B, c.Hq, c.T, c.T}, {0, 0, 0, 0}};
      }
      const int64_t Tq = c.T / c.pieces;
      for (int64_t i = 0; i < c.pieces; ++i) {
        INFO("piece " << i);
        kernels::AttentionParams pp = p;
        pp.q_begin = i * Tq;
        if (dropout) pp.block.offset[2] = i * Tq;
        const Tensor qi = q.narrow(2, i * Tq, Tq), di = dout.narrow(2, i * Tq, Tq);
        std::vector<Tensor> got[2];  // CPU, GPU: out, stats, dq, dk, dv
        for (int side = 0; side < 2; ++side) {
          const Device dev = side == 0 ? kCPU : kCuda;
          auto on = [&](const Tensor& t) { return side == 0 ? t : to_cuda(t); };
          const Tensor gq = on(qi), gk = on(k), gv = on(v), gd = on(di);
          Tensor out = raw::empty(gq.shape(), gq.dtype(), dev), st = raw::empty({c.B, c.Hq, Tq, 2}, DType::Float32, dev);
          kernels::attention_forward(dev, gq, gk, gv, pp, out, st);
          Tensor dq = raw::empty(gq.shape(), gq.dtype(), dev), dk = raw::empty(gk.shape(), gk.dtype(), dev),
                 dv = raw::empty(gv.shape(), gv.dtype(), dev);
          kernels::attention_backward(dev, gq, gk, gv, gd, st, pp, dq, dk, dv);
          for (const Tensor& t : {out, st, dq, dk, dv}) got[side].push_back(side == 0 ? t : to_cpu(t));
        }
        const char* names[] = {"out", "stats", "dq", "dk", "dv"};
        for (int j = 0; j < 5; ++j) {
          INFO(names[j]);
          CHECK_SAME_BITS(got[1][size_t(j)], got[0][size_t(j)]);
        }
      }
    }
  // The GPU refuses what the CPU refuses: rows outside the keys.
  kernels::AttentionParams p;
  p.q_begin = 6;
  const Tensor q = to_cuda(uniform({1, 1, 4, 4}, 1)), k = to_cuda(uniform({1, 1, 8, 4}, 2));
  Tensor out = raw::empty({1, 1, 4, 4}, DType::Float32, kCuda), st = raw::empty({1, 1, 4, 2}, DType::Float32, kCuda);
  CHECK_THROWS_WITH(kernels::attention_forward(kCuda, q, k, k, p, out, st),
                    Catch::Contains("query rows 6..10") && Catch::Contains("outside the 8 keys"));
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

TEST_CASE("CUDA fast mode: cuDNN flash attention's backward gives the same bits every run") {
  TESSEL_REQUIRE_GPU();
  numerics::GemmModeGuard mode(numerics::GemmMode::Fast);
  if (!kernels::attention_fast_forward.has(DeviceType::CUDA))
    TESSEL_SKIP("built without cuDNN's frontend (tools/deps.sh installs it where CUDA is)");
  // GPT-2's head shape and a sequence of many key blocks: dQ sums the
  // blocks' pieces, which cuDNN's default backward does with atomics on
  // Hopper (docs/design.md §4 level 2 promises the same bits every run).
  const Dims shape{4, 1024, 12, 64};
  const Tensor q0 = to_cuda(uniform(shape, 41, -1, 1, DType::BFloat16));
  const Tensor k0 = to_cuda(uniform(shape, 42, -1, 1, DType::BFloat16));
  const Tensor v0 = to_cuda(uniform(shape, 43, -1, 1, DType::BFloat16));
  const Tensor dout = to_cuda(uniform({4, 12, 1024, 64}, 44, -1, 1, DType::BFloat16));
  std::vector<std::vector<Tensor>> runs;
  for (int r = 0; r < 3; ++r) {
    Tensor q = q0.detach().requires_grad_(), k = k0.detach().requires_grad_(), v = v0.detach().requires_grad_();
    Tensor out = attend({q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)}, 0.0);
    out.backward(dout);
    runs.push_back({out.detach(), q.grad(), k.grad(), v.grad()});
  }
  for (int r = 1; r < 3; ++r)
    for (int i = 0; i < 4; ++i) {
      INFO("run " << r << ", " << (i == 0 ? "out" : i == 1 ? "dq" : i == 2 ? "dk" : "dv"));
      CHECK_SAME_BITS(runs[r][size_t(i)], runs[0][size_t(i)]);
    }
}
