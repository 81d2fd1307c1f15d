// Fusion of elementwise chains in a recorded program (runtime/capture_fusion.cc,
// docs/compile.md "Fusion"): a chain replayed tile by tile gives the bits of
// the same launches run whole, eagerly and unfused; intermediates only the
// chain uses take no memory of their own; memory a later launch sees at
// another place, and a range that would split a chain, are never fused into
// a wrong answer.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/language_model.h"
#include "runtime/capture.h"
#include "runtime/profile.h"
#include "tessel.h"
#include "test/util/error_of.h"
#include "test/util/replay.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

namespace {

Tensor noise(const Dims& shape, uint64_t seed) { return randn(shape, PhiloxKey{seed, 7}); }

}  // namespace

TEST_CASE("fusion: elementwise chains replay tile by tile with the eager and unfused bits", "[compile][fusion]") {
  // Odd sizes: the last tile is short, rows are not a multiple of anything.
  const int64_t R = 301, C = 257;  // 77k elements: several tiles
  Tensor a = noise({R, C}, 1), b = noise({R, C}, 2), c = noise({R, C}, 3), bias = noise({C}, 4);
  Tensor sq = noise({C, C}, 5), cols_major = noise({C, R}, 6).t();  // a transposed view: rows of stride 1
  Tensor three_d = noise({7, 43, C}, 8);
  std::vector<FusionCase> cases = common_chains(a, b, c, bias, cols_major);
  cases.insert(cases.end(), {
      {"a 3-d tensor: leading dims merged", [&] { return tanh(three_d) * Scalar(2.0) + three_d; }, 3},
      {"a 3-d result read as 2-d (one placement of its elements)",
       [&] { return (tanh(three_d) + three_d).reshape({7 * 43, C}) * a; }, 3},
      {"comparisons and where (bool intermediates)",
       [&] { return where(gt(a, b), a * c, b - c); }, 3},
      {"a cast to bfloat16 and back", [&] { return (a * b).to(DType::BFloat16).to(DType::Float32) + c; }, 3},
      {"a square matrix and its transpose (never fused across: read at other places than written)",
       [&] { Tensor t = sq * Scalar(3.0); return t.t() + t; }, 0},
  });
  check_fusion_cases(cases, /*registers=*/false);
}

TEST_CASE("fusion: an intermediate only the chain uses lives in a tile-sized scratch", "[compile][fusion]") {
  const int64_t R = 512, C = 512;
  Tensor a = noise({R, C}, 1), b = noise({R, C}, 2), c = noise({R, C}, 3);
  auto fn = [&] { return ((a * b) + c) * a; };  // two intermediates of R x C, then the output
  const Replayed fused = record_and_replay(fn, true);
  const Replayed unfused = record_and_replay(fn, false);
  CHECK(same_bytes(fused.output(), unfused.output()));
  REQUIRE(fused.program->fused_chains() == 1);
  CHECK(fused.program->fused_launches() == 3);
  // Unfused: the output plus an intermediate (the arena shares the other's
  // bytes). Fused: the output plus a few tiles of scratch.
  const int64_t tensor_bytes = R * C * 4;
  CHECK(unfused.program->bytes() >= 2 * tensor_bytes);
  CHECK(fused.program->bytes() < tensor_bytes + tensor_bytes / 2);
}

TEST_CASE("fusion: a chain's scratch is a region of the arena, in bytes a dead buffer left", "[compile][fusion]") {
  // t dies at the second GEMM; the chain runs after it, so its scratch fits
  // in t's bytes: the step needs t and s at once (2 tensors), and no more.
  // (s dies at the chain's first launch, and the output takes its bytes.)
  const int64_t R = 512, C = 512;
  Tensor p = noise({R, 64}, 1), q = noise({64, C}, 2), w = noise({C, C}, 3);
  Tensor a = noise({R, C}, 4), b = noise({R, C}, 5), c = noise({R, C}, 6);
  auto fn = [&] {
    Tensor t = matmul(p, q);
    Tensor s = matmul(t, w);
    return ((s * b) + c) * a;
  };
  const Replayed fused = record_and_replay(fn, true);
  CHECK(same_bytes(fused.output(), fused.eager));
  REQUIRE(fused.program->fused_chains() == 1);
  CHECK(fused.program->bytes() == 2 * R * C * 4);
  fused.program->replay();
  CHECK(same_bytes(fused.output(), fused.eager));
}

TEST_CASE("fusion: a buffer born in a chain takes the bytes of one that dies in it", "[compile][fusion]") {
  // h (a GEMM's output, made before the chain) dies at the chain's first
  // launch; the chain's output is born at its last, through the same layout.
  const int64_t R = 512, C = 512;
  Tensor p = noise({R, 64}, 1), q = noise({64, C}, 2), b = noise({R, C}, 3), c = noise({R, C}, 4);
  auto fn = [&] {
    Tensor h = matmul(p, q);
    return (h * b) + c;
  };
  const Replayed fused = record_and_replay(fn, true);
  const Replayed unfused = record_and_replay(fn, false);
  CHECK(same_bytes(fused.output(), fused.eager));
  CHECK(same_bytes(fused.output(), unfused.output()));
  REQUIRE(fused.program->fused_chains() == 1);
  // Unfused: h and the output share bytes, the product has its own. Fused:
  // the product is scratch, and the output takes h's bytes.
  const int64_t tensor_bytes = R * C * 4;
  CHECK(unfused.program->bytes() >= 2 * tensor_bytes);
  CHECK(fused.program->bytes() < tensor_bytes + tensor_bytes / 2);
  fused.program->replay();
  CHECK(same_bytes(fused.output(), fused.eager));
}

TEST_CASE("fusion: a chain written in place through another view is not fused into a wrong answer", "[compile][fusion]") {
  // t is written by one launch and then read transposed, then written in
  // place: a tile-major order would read rows of t not written yet.
  const int64_t N = 300;
  Tensor a = noise({N, N}, 1), b = noise({N, N}, 2);
  auto fn = [&] {
    Tensor t = a * b;
    Tensor u = t.t() * Scalar(2.0);
    t.mul_(u);  // in place: t = t * u
    return t + b;
  };
  const Replayed fused = record_and_replay(fn, true);
  const Replayed unfused = record_and_replay(fn, false);
  CHECK(same_bytes(fused.output(), fused.eager));
  CHECK(same_bytes(fused.output(), unfused.output()));
}

TEST_CASE("fusion: a chain never crosses a recording's suspend point; replay_range never splits one", "[compile][fusion]") {
  const int64_t R = 256, C = 256;
  Tensor a = noise({R, C}, 1), b = noise({R, C}, 2);
  NoGradGuard no_grad;
  std::unique_ptr<capture::Program> p;
  Tensor y1, y2, e1, e2;
  int o1 = -1, o2 = -1;
  int64_t first_part = 0;
  {
    capture::Recorder rec("two parts");
    y1 = (a * b) + a;  // part 1: a chain of 2
    first_part = rec.launches();
    rec.suspend();
    rec.resume();
    y2 = (y1 * b) - b;  // part 2: a chain of 2, which would join part 1's without the boundary
    o1 = rec.output(y1);
    o2 = rec.output(y2);
    p = rec.finish();
  }
  e1 = y1.clone();
  e2 = y2.clone();
  CHECK(p->fused_chains() == 2);
  p->replay_range(0, first_part);
  p->replay_range(first_part, p->launches());
  CHECK(same_bytes(p->output(o1, y1), e1));
  CHECK(same_bytes(p->output(o2, y2), e2));
  // A range that ends inside a chain is an error naming it, never half a chain.
  CHECK_THAT(error_of([&] { p->replay_range(0, 1); }), Catch::Contains("inside the fused chain"));
  CHECK_THAT(error_of([&] { p->replay_range(1, first_part); }), Catch::Contains("inside the fused chain"));
}

TEST_CASE("fusion: a profiled replay times a chain as one row named by its kernels", "[compile][fusion]") {
  Tensor a = noise({256, 256}, 1), b = noise({256, 256}, 2);
  const Replayed r = record_and_replay([&] { return silu(a) * b; }, true);
  REQUIRE(r.program->fused_chains() == 1);
  profile::Profiler prof;
  {
    profile::Scope scope(&prof);
    r.program->replay();
  }
  bool saw = false;
  for (const profile::Row& row : prof.rows()) {
    INFO(row.name);
    saw = saw || row.name == "fused(unary+binary)";  // silu's kernel, then the product
  }
  CHECK(saw);
}

TEST_CASE("fusion: compile mode with and without fusion gives the eager bits (LLaMA: SwiGLU's chains)", "[compile][fusion]") {
  auto train = [](bool compile, bool fusion) {
    models::ModelConfig cfg = models::model_config("llama", "tiny");
    cfg.dropout = 0.1;
    auto model = models::make_language_model(cfg, 5);
    RunOptions o;
    o.seed = 5;
    o.compile = compile;
    o.compile_fusion = fusion;
    auto run = parallelize(model, nullptr, parallel::ParallelPlan{}, adamw({1e-3}), o);
    std::vector<double> losses;
    for (int64_t step = 0; step < 6; ++step) {
      Tensor tokens = randint({8, 65}, 500 + uint64_t(step), 0, cfg.vocab_size);
      losses.push_back(run.forward_backward(tokens.narrow(1, 0, 64).contiguous(), tokens.narrow(1, 1, 64).contiguous()).loss_sum);
      run.step_optimizer();
    }
    return std::make_tuple(losses, run.param_hash(), run.compile_stats());
  };
  const auto [eager_loss, eager_hash, eager_stats] = train(false, true);
  const auto [fused_loss, fused_hash, fused_stats] = train(true, true);
  const auto [plain_loss, plain_hash, plain_stats] = train(true, false);
  for (size_t i = 0; i < eager_loss.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(std::memcmp(&eager_loss[i], &fused_loss[i], 8) == 0);
    CHECK(std::memcmp(&eager_loss[i], &plain_loss[i], 8) == 0);
  }
  CHECK(eager_hash == fused_hash);
  CHECK(eager_hash == plain_hash);
  CHECK(fused_stats.replays == 3);
  CHECK(fused_stats.fused_chains >= 4);  // per block: SwiGLU's forward and its backward
  CHECK(fused_stats.fused_launches >= 2 * fused_stats.fused_chains);
  CHECK(plain_stats.fused_chains == 0);
  CHECK(plain_stats.replays == 3);
}
