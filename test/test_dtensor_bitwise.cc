// Bitwise mode (docs/numerics.md): every distributed op case of
// test_dtensor_ops — random placements including Partial inputs, uneven
// shapes, 1-D to 3-D meshes — gives outputs AND gradients equal to the
// single-device ones bit for bit. Sharded reductions either compute exact
// subtrees of the canonical order (finished by the rank-order collectives) or
// gather; pending sums never pass through inexact arithmetic.
#include <catch2/catch.hpp>

#include "runtime/numerics.h"
#include "test/dtensor/cases.h"
#include "test/util/dist.h"

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
