// Fused chains as one device kernel (runtime/capture_fusion.cc,
// kernels/fused_chain.h; docs/compile.md "Fusion"), checked on the CPU: the
// host fused backend runs the same per-element interpreter CUDA's kernel
// runs (kernels/cuda/fused_chain.cu), set here as the CPU's, so CPU chains
// are planned and replayed as a device's are.
//   - every step the interpreter takes equals its unfused kernel bit for bit
//     (every unary op and its backward, the arithmetic binary ops, copies
//     between the float dtypes, where), on special values (two NaNs are
//     equal whatever their payload, as between the CPU and CUDA);
//   - recorded chains replay with the eager and unfused bits, their
//     intermediates in registers (no memory), and the hazards of
//     test_capture_fusion are not fused into a wrong answer;
//   - LLaMA trains compiled with the eager bits, in float32 and under
//     bfloat16 autocast.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/fused_chain.h"
#include "kernels/unary.h"
#include "models/language_model.h"
#include "runtime/capture.h"
#include "tessel.h"
#include "test/util/cuda.h"
#include "test/util/replay.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

namespace {

// The CPU gets the host fused backend for the guard's life.
struct HostFusion {
  HostFusion() { capture::set_fused_backend(DeviceType::CPU, kernels::host_fused_backend()); }
  ~HostFusion() { capture::set_fused_backend(DeviceType::CPU, nullptr); }
};


capture::FusedType type_of(DType d) {
  switch (d) {
    case DType::BFloat16: return capture::FusedType::BFloat16;
    case DType::Float16: return capture::FusedType::Float16;
    case DType::Bool: return capture::FusedType::Bool;
    default: return capture::FusedType::Float32;
  }
}

// One step over contiguous 1-d tensors (inputs, then the output) through the
// host fused backend.
void run_step(capture::FusedKind kind, uint8_t op, const std::vector<Tensor>& ins, const Tensor& out) {
  capture::FusedProgram p;
  p.rows = 1;
  p.cols = out.numel();
  capture::FusedStep st;
  st.kind = kind;
  st.op = op;
  auto add = [&](const Tensor& t) {
    capture::FusedOperand& o = p.operands[p.num_operands];
    o.data = static_cast<char*>(t.raw_data());
    o.row_stride = t.numel();
    o.col_stride = 1;
    o.type = type_of(t.dtype());
    return int8_t(p.num_operands++);
  };
  for (size_t k = 0; k < ins.size(); ++k) st.in[k] = add(ins[k]);
  st.out = add(out);
  p.steps[p.num_steps++] = st;
  kernels::host_fused_backend()->launch(kCPU, p);
}

// Values with the edge cases: signed zeros, infinities, NaNs with payloads,
// subnormals of every dtype, large and small magnitudes, then noise.
Tensor specials(DType dt, uint64_t seed) {
  const float nan_payload = [] {
    uint32_t u = 0x7fc12345u;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }();
  const std::vector<float> edge = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 2.0f, -3.75f,
                                   std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                                   std::nanf(""), -nan_payload, nan_payload, 1e-40f, -1e-42f, 6e-8f, 1e-39f,
                                   65504.0f, 70000.0f, 3e38f, -1e30f, 88.0f, -104.0f, 1e-7f, 20.0f};
  const int64_t n = 4096;
  Tensor x = randn({n}, PhiloxKey{seed, 3}) * Scalar(4.0);
  float* v = x.data<float>();
  for (size_t i = 0; i < edge.size(); ++i) v[i] = edge[i];
  Tensor t = x.to(dt);
  if (dt == DType::BFloat16 || dt == DType::Float16) {  // 16-bit NaNs with payloads, not only converted ones
    uint16_t* h = static_cast<uint16_t*>(t.raw_data());
    h[30] = dt == DType::BFloat16 ? 0x7fa1 : 0x7e21;
    h[31] = dt == DType::BFloat16 ? 0xffc3 : 0xfd03;  // (f16 0xfd03: a signalling NaN)
  }
  return t;
}

Tensor noise(const Dims& shape, uint64_t seed) { return randn(shape, PhiloxKey{seed, 7}); }

}  // namespace

// Bit for bit as the CPU and CUDA kernels are compared (test/util/cuda.h):
// any two NaNs are equal -- a NaN's payload and sign are not part of the
// contract (the CPU's vector kernels return the default NaN where the
// scalar expression passes an input's payload on).
TEST_CASE("device fusion: every fused step equals its unfused kernel bit for bit", "[compile][fusion]") {
  using kernels::BinaryOp;
  using kernels::UnaryOp;
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    INFO(dtype_name(dt));
    const Tensor a = specials(dt, 1), b = specials(dt, 2), g = specials(dt, 3);
    for (int k = 0; k < kernels::kNumUnaryOps; ++k) {
      const UnaryOp op = UnaryOp(k);
      if (!kernels::fusable_unary(op)) continue;
      INFO(kernels::unary_op_name(op));
      Tensor want = empty_like(a), got = empty_like(a);
      kernels::unary(kCPU, op, a, want);
      run_step(capture::FusedKind::Unary, uint8_t(op), {a}, got);
      CHECK_SAME_BITS(got, want);
      Tensor dwant = empty_like(a), dgot = empty_like(a);
      kernels::unary_backward(kCPU, op, g, a, want, dwant);
      run_step(capture::FusedKind::UnaryBackward, uint8_t(op), {g, a, want}, dgot);
      CHECK_SAME_BITS(dgot, dwant);
    }
    for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Maximum,
                        BinaryOp::Minimum}) {
      INFO(kernels::binary_op_name(op));
      REQUIRE(kernels::fusable_binary(op));
      Tensor want = empty_like(a), got = empty_like(a);
      kernels::binary(kCPU, op, a, b, want);
      run_step(capture::FusedKind::Binary, uint8_t(op), {a, b}, got);
      CHECK_SAME_BITS(got, want);
    }
    CHECK(!kernels::fusable_binary(BinaryOp::Pow));
    for (DType to : {DType::Float32, DType::BFloat16, DType::Float16}) {
      INFO("copy to " << dtype_name(to));
      Tensor want = raw::empty(a.shape(), to, kCPU), got = raw::empty(a.shape(), to, kCPU);
      kernels::copy(kCPU, a, want);
      run_step(capture::FusedKind::Copy, 0, {a}, got);
      CHECK_SAME_BITS(got, want);
    }
    const Tensor cond = gt(noise({a.numel()}, 9), zeros({a.numel()}));
    Tensor want = empty_like(a), got = empty_like(a);
    kernels::where(kCPU, cond, a, b, want);
    run_step(capture::FusedKind::Where, 0, {cond, a, b}, got);
    CHECK_SAME_BITS(got, want);
  }
}

TEST_CASE("device fusion: recorded chains replay as one kernel with the eager and unfused bits", "[compile][fusion]") {
  HostFusion fusion;
  const int64_t R = 37, C = 53;  // small: the CPU's tiles would not fuse these (a device kernel does)
  Tensor a = noise({R, C}, 1), b = noise({R, C}, 2), c = noise({R, C}, 3), bias = noise({C}, 4);
  Tensor sq = noise({C, C}, 5), cols_major = noise({C, R}, 6).t();
  Tensor three_d = noise({7, 5, C}, 8);
  Tensor ah = a.to(DType::BFloat16), bh = b.to(DType::BFloat16), af = a.to(DType::Float16);
  std::vector<FusionCase> cases = common_chains(a, b, c, bias, cols_major);
  cases.insert(cases.end(), {
      {"a 3-d tensor: leading dims merged", [&] { return tanh(three_d) * Scalar(2.0) + three_d; }, 2},
      {"bfloat16: silu(a) * b", [&] { return silu(ah) * bh; }, 2},
      {"float16 through float32 and back", [&] { return (af.to(DType::Float32) * a).to(DType::Float16) + af; }, 3},
      {"where over bfloat16 (bits moved)",
       [&] {
         const Tensor m = gt(a, b);  // (first: a comparison is not a fused step, and arguments run in any order)
         return where(m, sigmoid(ah), bh * bh);
       },
       3},
      {"a square matrix and its transpose (never fused across)", [&] { Tensor t = sq * Scalar(3.0); return t.t() + t; },
       0},
  });
  check_fusion_cases(cases, /*registers=*/true);
}

TEST_CASE("device fusion: a chain written in place through another view is not fused into a wrong answer",
          "[compile][fusion]") {
  HostFusion fusion;
  const int64_t N = 40;
  Tensor a = noise({N, N}, 1), b = noise({N, N}, 2);
  auto fn = [&] {
    Tensor t = a * b;
    Tensor u = t.t() * Scalar(2.0);
    t.mul_(u);
    return t + b;
  };
  const Replayed fused = record_and_replay(fn, true);
  const Replayed unfused = record_and_replay(fn, false);
  CHECK(same_bytes(fused.output(), fused.eager));
  CHECK(same_bytes(fused.output(), unfused.output()));
}

TEST_CASE("device fusion: LLaMA trains compiled with the eager bits, float32 and bfloat16 autocast",
          "[compile][fusion]") {
  HostFusion fusion;
  auto train = [](bool compile, std::optional<DType> compute) {
    models::ModelConfig cfg = models::model_config("llama", "tiny");
    cfg.dropout = 0.1;
    auto model = models::make_language_model(cfg, 5);
    RunOptions o;
    o.seed = 5;
    o.compile = compile;
    if (compute) o.compute = *compute;
    auto run = parallelize(model, nullptr, parallel::ParallelPlan{}, adamw({1e-3}), o);
    std::vector<double> losses;
    for (int64_t step = 0; step < 6; ++step) {
      Tensor tokens = randint({4, 33}, 500 + uint64_t(step), 0, cfg.vocab_size);
      losses.push_back(
          run.forward_backward(tokens.narrow(1, 0, 32).contiguous(), tokens.narrow(1, 1, 32).contiguous()).loss_sum);
      run.step_optimizer();
    }
    return std::make_tuple(losses, run.param_hash(), run.compile_stats());
  };
  for (std::optional<DType> compute : {std::optional<DType>(), std::optional<DType>(DType::BFloat16)}) {
    INFO((compute ? "bfloat16 autocast" : "float32"));
    const auto [eager_loss, eager_hash, eager_stats] = train(false, compute);
    const auto [fused_loss, fused_hash, fused_stats] = train(true, compute);
    REQUIRE(eager_loss.size() == fused_loss.size());
    for (size_t i = 0; i < eager_loss.size(); ++i) {
      INFO("step " << i + 1);
      CHECK(std::memcmp(&eager_loss[i], &fused_loss[i], 8) == 0);
    }
    CHECK(eager_hash == fused_hash);
    CHECK(fused_stats.refused == "");
    CHECK(fused_stats.replays == 3);
    CHECK(fused_stats.fused_chains >= 4);
  }
}
