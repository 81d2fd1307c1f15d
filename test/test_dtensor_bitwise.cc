// Bitwise mode (docs/numerics.md): every distributed op case of
// test_dtensor_ops — random placements including Partial inputs, uneven
// shapes, 1-D to 3-D meshes — gives outputs AND gradients equal to the
// single-device ones bit for bit. Sharded reductions either compute exact
// subtrees of the canonical order (finished by the rank-order collectives) or
// gather; pending sums never pass through inexact arithmetic.
#include <catch2/catch.hpp>

#include "autograd/api.h"
#include "dtensor/dist_call.h"
#include "runtime/numerics.h"
#include "runtime/profile.h"
#include "test/dtensor/cases.h"
#include "test/util/dist.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

TEST_CASE("bitwise mode: every op group, bit for bit with one device", "[dtensor][bitwise]") {
  for (int v : {16, 4}) {  // V = 4 makes more shapes chunk-aligned (more exact Partial paths)
    numerics::ChunksGuard chunks(v);
    for (const OpGroup& g : dtensor_op_groups()) {
      for (const OpCase& c : g.cases) {
        for (const auto& dims : test_meshes()) {
          for (int t = 0; t < 2; ++t) {
            const uint64_t seed = 5000 + 31 * uint64_t(t) + std::hash<std::string>()(c.name) % 1000;
            std::string failure;
            try {
              failure = first_failure(on_ranks(mesh_size(dims), [&](int) {
                numerics::ChunksGuard inner(v);  // V is global, but set it on every rank thread too
                numerics::BitwiseGuard on(true);
                return run_op_case(c, Mesh::world(dims), seed, /*all_bitwise=*/true);
              }));
            } catch (const std::exception& e) {
              failure = std::string("threw: ") + e.what();
            }
            INFO(g.title << " / " << c.name << " on mesh " << mesh_name(dims) << ", trial " << t << ", V " << v);
            CHECK(failure == "");
          }
        }
      }
    }
  }
}

// Data parallelism's weight gradient arrives as a pending sum (Partial over
// dp) and flows back through the weight's transposed view. A view's backward
// only moves elements, so bitwise mode lets the pending sum pass as fast mode
// does (one bucketed all-reduce later) instead of reducing it inside the
// backward -- and the bits still equal one device's.
TEST_CASE("bitwise mode: a dp weight gradient stays pending through a view, no extra communication",
          "[dtensor][bitwise]") {
  const Tensor x = uniform({32, 16}, 41), w = uniform({12, 16}, 42);
  Tensor ref;
  {
    numerics::BitwiseGuard on(true);
    Tensor wl = w.detach().clone().requires_grad_();
    sum(matmul(x, wl.t())).backward();
    ref = wl.grad();
  }
  // Each rank reports "<redistribute calls in the backward>" or a failure.
  auto run = [&](bool bitwise) {
    return on_ranks(2, [&](int) -> std::string {
      numerics::BitwiseGuard on(bitwise);
      MeshPtr mesh = Mesh::world({{"dp", 2}});
      Tensor xd = distribute_tensor(x, mesh, {Shard(0)});
      Tensor wd = distribute_tensor(w, mesh, {Replicate()}).detach().requires_grad_();
      set_grad_placements(wd, Placements{Partial()});  // as DDP does: its buckets finish the sum
      Tensor loss = sum(matmul(xd, wd.t()));
      profile::Profiler p;
      {
        profile::Scope s(&p);
        loss.backward();
      }
      int64_t redistributes = 0;
      for (const auto& r : p.rows())
        if (r.name == "redistribute") redistributes = r.calls;
      const Tensor g = wd.grad();
      if (!g.placements()[0].is_partial_sum()) return "FAIL the weight gradient is not pending: " + g.desc();
      if (bitwise && !bitwise_equal(full_tensor(g), ref)) return "FAIL bits differ from one device";
      return std::to_string(redistributes);
    });
  };
  const auto fast = run(false), bit = run(true);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": fast " << fast[size_t(r)] << ", bitwise " << bit[size_t(r)]);
    CHECK(fast[size_t(r)].rfind("FAIL", 0) != 0);
    CHECK(bit[size_t(r)] == fast[size_t(r)]);  // same communication, and no failure
  }
}

// 16-bit ops whose pieces would be pending sums: matmul and add run widened
// to float32 and give the one-device 16-bit bits; an op not marked exact
// when widened (mul with a broadcast operand: its backward rounds each
// product before summing them) is refused, naming the op, dtypes and
// placements.
TEST_CASE("bitwise mode: 16-bit pending sums run widened, or are refused by name", "[dtensor][bitwise]") {
  const Tensor x = uniform({8, 16}, 51).to(DType::BFloat16), w = uniform({16, 6}, 52).to(DType::BFloat16),
               b = uniform({6}, 53).to(DType::BFloat16);
  Tensor ref_y, ref_gw, ref_gb;
  {
    numerics::BitwiseGuard on(true);
    Tensor wl = w.detach().clone().requires_grad_(), bl = b.detach().clone().requires_grad_();
    Tensor y = add(matmul(x, wl), bl);
    sum(y.to(DType::Float32)).backward();
    ref_y = y.detach(), ref_gw = wl.grad(), ref_gb = bl.grad();
  }
  const auto reports = on_ranks(2, [&](int) -> std::string {
    RankReport rep;
    numerics::BitwiseGuard on(true);
    MeshPtr mesh = Mesh::world({{"dp", 2}});
    // Rows over dp: the weight and bias gradients are sums over both ranks' rows.
    Tensor wd = distribute_tensor(w, mesh, {Replicate()}).detach().requires_grad_();
    Tensor bd = distribute_tensor(b, mesh, {Replicate()}).detach().requires_grad_();
    Tensor y = add(matmul(distribute_tensor(x, mesh, {Shard(0)}), wd), bd);
    sum(y.to(DType::Float32)).backward();
    rep.expect(y.dtype() == DType::BFloat16, "the output is not bfloat16");
    rep.expect(bitwise_equal(full_tensor(y.detach()), ref_y), "output bits differ");
    rep.expect(wd.grad().dtype() == DType::BFloat16 && bitwise_equal(full_tensor(wd.grad()), ref_gw),
               "weight gradient bits differ");
    rep.expect(bitwise_equal(full_tensor(bd.grad()), ref_gb), "bias gradient bits differ");
    // K over tp (row parallel): the output's pieces are pending sums.
    MeshPtr tp = Mesh::world({{"tp", 2}});
    Tensor yk = matmul(distribute_tensor(x, tp, {Shard(1)}), distribute_tensor(w, tp, {Shard(0)}));
    rep.expect(bitwise_equal(full_tensor(yk), matmul(x, w)), "row-parallel output bits differ");
    // cross_entropy of bfloat16 logits over dp: one device sums the tokens'
    // losses in float32 and rounds once (not each token's loss first).
    for (uint64_t seed = 54; seed < 60; ++seed) {
      const Tensor logits = mul(uniform({60, 7}, seed), 8.0).to(DType::BFloat16);  // 1/60: not a bfloat16
      const Tensor targets = randint({60}, seed + 100, 0, 7);
      Tensor ref_l, ref_g;
      {
        Tensor lg = logits.detach().clone().requires_grad_();
        ref_l = cross_entropy(lg, targets);
        ref_l.backward();
        ref_g = lg.grad();
      }
      Tensor ld = distribute_tensor(logits, mesh, {Shard(0)}).detach().requires_grad_();
      Tensor l = cross_entropy(ld, distribute_tensor(targets, mesh, {Shard(0)}));
      l.backward();
      rep.expect(l.dtype() == DType::BFloat16, "the loss is not bfloat16");
      rep.expect(bitwise_equal(full_tensor(l.detach()), ref_l), "cross_entropy bits differ");
      rep.expect(bitwise_equal(full_tensor(ld.grad()), ref_g), "cross_entropy gradient bits differ");
    }
    // Refused: mul's backward rounds each product before sum_to sums them.
    Tensor sd = distribute_tensor(b, mesh, {Replicate()}).detach().requires_grad_();
    try {
      mul(distribute_tensor(x.narrow(1, 0, 6).contiguous(), mesh, {Shard(0)}), sd);
      rep.expect(false, "no error for mul with a 16-bit pending gradient");
    } catch (const Error& e) {
      const std::string m = e.what();
      for (const char* part : {"mul", "bitwise mode cannot give one device's bits", "[8, 6] bfloat16 as [S(0)]",
                               "[6] bfloat16 as [R]", "the gradient of input 1 ([6] bfloat16, replicated) over 'dp'",
                               "keep that operand in float32"})
        rep.expect(m.find(part) != std::string::npos, std::string("the error lacks '") + part + "': " + m);
    }
    return rep.str();
  });
  CHECK(first_failure(reports) == "");
}

// A pending sum over two mesh dims, reduced over the outer one while the
// inner one stays pending (a gradient over ep x dp with ep outer, whose dp
// sum the DDP buckets finish): the pieces must still combine innermost
// first. Rows 1e8, 1, -1e8, 1 sum to 0 in the canonical tree ((r0 + r1) +
// (r2 + r3)) and to 2 outer-first ((r0 + r2) + (r1 + r3)).
TEST_CASE("bitwise mode: reducing an outer pending dim keeps the inner one's order", "[dtensor][bitwise]") {
  const Tensor x = tensor(std::vector<float>{1e8f, 1.0f, -1e8f, 1.0f}, Dims{4});
  Tensor ref;
  {
    numerics::BitwiseGuard on(true);
    ref = sum(x);
  }
  REQUIRE(ref.item<float>() == 0.0f);
  const auto reports = on_ranks(4, [&](int) -> std::string {
    numerics::BitwiseGuard on(true);
    MeshPtr mesh = Mesh::world({{"ep", 2}, {"dp", 2}});
    Tensor s = sum(distribute_tensor(x, mesh, {Shard(0), Shard(0)}));
    if (!(s.placements()[0].is_partial_sum() && s.placements()[1].is_partial_sum()))
      return "the sum is not pending over both dims: " + s.desc();
    Tensor half = redistribute(s, {Replicate(), Partial()});  // ep reduced, dp still pending
    const float got = full_tensor(half).item<float>();
    return got == ref.item<float>() ? "" : fmt::format(FMT_STRING("got {} instead of {}"), got, ref.item<float>());
  });
  CHECK(first_failure(reports) == "");
}

namespace {
using tessel::ShardingContext;
using tessel::ShardingPlan;
// Ops whose `sharding` member is not the protocol's rule: call() on a
// distributed tensor refuses them at compile time (the static_assert in
// dtensor/dist_call.h); here the traits it uses are checked directly.
struct RuleByValueOp {  // a by-value context is still callable: a rule
  ShardingPlan sharding(ShardingContext ctx);
};
struct RuleTakingMutableRefOp {  // not callable with the const context the dispatcher passes
  ShardingPlan sharding(ShardingContext& ctx);
};
struct RuleReturningVoidOp {
  void sharding(const ShardingContext& ctx);
};
struct NoRuleOp {};
}  // namespace

TEST_CASE("a `sharding` member with the wrong signature is detected, not silently ignored", "[dtensor]") {
  using detail::has_sharding_member;
  using detail::has_sharding_rule;
  STATIC_REQUIRE(has_sharding_rule<RuleByValueOp>::value);
  STATIC_REQUIRE(has_sharding_member<RuleTakingMutableRefOp>::value);
  STATIC_REQUIRE_FALSE(has_sharding_rule<RuleTakingMutableRefOp>::value);  // -> the static_assert fires
  STATIC_REQUIRE(has_sharding_member<RuleReturningVoidOp>::value);
  STATIC_REQUIRE_FALSE(has_sharding_rule<RuleReturningVoidOp>::value);
  STATIC_REQUIRE_FALSE(has_sharding_member<NoRuleOp>::value);  // no rule at all: replicated, by design
}
