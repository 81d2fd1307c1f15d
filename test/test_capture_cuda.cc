// CUDA graphs of a compile-mode replay (kernels/cuda/graph.cc; runtime/capture.h,
// "device graphs"; docs/compile.md, "On a GPU"), at the level of one recorded
// program, so that a failure here is the graph layer's and not the Run's:
// a GEMM, an elementwise chain and a loss whose kernel reads its targets'
// check on the host. And fused chains as one CUDA kernel
// (kernels/cuda/fused_chain.cu; docs/compile.md, "Fusion"): the eager and
// unfused bits. Skips without a GPU.
#include <catch2/catch.hpp>

#include <functional>
#include <memory>
#include <vector>

#include "autograd/api.h"
#include "runtime/allocator.h"
#include "runtime/capture.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/loss.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/unary.h"
#include "test/util/cuda.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

TEST_CASE("CUDA graphs: a recorded program replays as graphs with the eager bits; a host read runs from the host") {
  TESSEL_REQUIRE_GPU();
  NoGradGuard no_grad;
  const Tensor w = to_cuda(randn({64, 64}, PhiloxKey{3, 1}));
  const Tensor targets = to_cuda(randint({32}, 5, 0, 64));
  auto step = [&](const Tensor& in) {
    Tensor h = gelu(matmul(in, w)) * Scalar(0.5) + in;
    return std::make_pair(h, cross_entropy(h, targets));
  };
  Tensor input = to_cuda(randn({32, 64}, PhiloxKey{3, 2}));  // the program's input buffer
  std::unique_ptr<capture::Program> p;
  Tensor h0, loss0;
  int out_h = -1, out_loss = -1;
  {
    capture::Recorder rec("cuda graphs");
    rec.input(input);
    std::tie(h0, loss0) = step(input);
    out_h = rec.output(h0);
    out_loss = rec.output(loss0);
    p = rec.finish();
  }
  p->use_graphs(true);
  for (uint64_t k = 0; k < 4; ++k) {
    INFO("replay " << k);
    const Tensor x = to_cuda(randn({32, 64}, PhiloxKey{3, 10 + k}));
    const auto [h, loss] = step(x);  // eager
    p->set_input(0, x);
    p->replay();
    CHECK_SAME_BITS(p->output(out_h, h0), to_cpu(h));
    CHECK_SAME_BITS(p->output(out_loss, loss0), to_cpu(loss));
  }
  const capture::Program::GraphStats g = p->graph_stats();
  INFO(g.graphs << " graphs of " << g.graph_launches << " launches (of " << p->launches() << "), " << g.captures
                << " captures, " << g.refused << " refused: " << g.last_refusal);
  CHECK(g.graphs >= 1);
  CHECK(g.graph_launches >= 2);
  CHECK(g.captures <= g.graphs + g.refused);  // no capture again: the buffers stayed
  // Copies between host and device still work after a capture refused one
  // (the staging buffers were never touched by it).
  CHECK(to_cpu(p->output(out_loss, loss0)).numel() == 1);
  // The graphs go with the program; their pools' blocks become ordinary ones.
  p.reset();
  allocator_for(kCuda)->empty_cache();
  CHECK(to_cpu(to_cuda(randn({8}, PhiloxKey{3, 99}))).numel() == 8);
}

TEST_CASE("CUDA fused chains: each chain is one kernel, with the eager and unfused bits") {
  TESSEL_REQUIRE_GPU();
  NoGradGuard no_grad;
  const int64_t R = 301, C = 257;
  const Tensor a = to_cuda(randn({R, C}, PhiloxKey{4, 1})), b = to_cuda(randn({R, C}, PhiloxKey{4, 2}));
  const Tensor bias = to_cuda(randn({C}, PhiloxKey{4, 3})), t = to_cuda(randn({C, R}, PhiloxKey{4, 4})).t();
  const Tensor ah = a.to(DType::BFloat16), bh = b.to(DType::BFloat16), af = a.to(DType::Float16);
  struct Case {
    const char* name;
    std::function<Tensor()> fn;
  };
  const std::vector<Case> cases = {
      {"silu(a) * b", [&] { return silu(a) * b; }},
      {"gelu(a + bias) * 0.5 + b (a broadcast row, a scalar)", [&] { return gelu(a + bias) * Scalar(0.5) + b; }},
      {"exp of a transposed view, times a, plus b", [&] { return exp(t) * a + b; }},
      {"bfloat16 silu(a) * b (SwiGLU under autocast)", [&] { return silu(ah) * bh; }},
      {"float16 through float32 and back", [&] { return (af.to(DType::Float32) * a).to(DType::Float16) + af; }},
      {"where over bfloat16", [&] {
         const Tensor m = gt(a, b);
         return where(m, sigmoid(ah), bh * bh);
       }},
  };
  for (const Case& k : cases) {
    INFO(k.name);
    Tensor outs[2];
    int64_t chains[2] = {0, 0};
    for (int fuse = 0; fuse < 2; ++fuse) {
      std::unique_ptr<capture::Program> p;
      Tensor y;
      int out = -1;
      {
        capture::Recorder rec("cuda fused chains");
        rec.fuse_elementwise = fuse == 1;
        y = k.fn();
        out = rec.output(y);
        p = rec.finish();
      }
      const Tensor eager = y.clone();
      p->replay();
      outs[fuse] = to_cpu(p->output(out, y));
      CHECK_SAME_BITS(outs[fuse], to_cpu(eager));
      p->use_graphs(true);  // and as (part of) a CUDA graph
      p->replay();
      p->replay();
      CHECK_SAME_BITS(p->output(out, y), to_cpu(eager));
      chains[fuse] = p->fused_chains();
    }
    CHECK(chains[0] == 0);
    CHECK(chains[1] >= 1);
    CHECK_SAME_BITS(outs[1], outs[0]);
  }
}
