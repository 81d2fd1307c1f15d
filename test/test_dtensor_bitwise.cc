// Bitwise mode (docs/numerics.md): every distributed op case of
// test_dtensor_ops — random placements including Partial inputs, uneven
// shapes, 1-D to 3-D meshes — gives outputs AND gradients equal to the
// single-device ones bit for bit. Sharded reductions either compute exact
// subtrees of the canonical order (finished by the rank-order collectives) or
// gather; pending sums never pass through inexact arithmetic.
#include <catch2/catch.hpp>

#include "autograd/api.h"
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
