// Every op of the foundation on distributed tensors: random placements
// (Replicate, Shard of any dim, Partial) of uneven shapes on 1-D, 2-D and 3-D
// meshes with the local backend. full_tensor() of each output equals the
// single-device result — bit for bit where no cross-shard reduction is
// involved, within float tolerance otherwise — and so do the gradients, which
// come back with the placements of their inputs. The cases are in
// test/dtensor/cases.cc (shared with the MPI run, test_dtensor_mpi).
#include <catch2/catch.hpp>

#include "test/dtensor/cases.h"
#include "test/util/dist.h"

using namespace tessel;
using namespace tessel::testing;

namespace {

void check_group(const std::string& title, int trials = 3) {
  for (const OpGroup& g : dtensor_op_groups()) {
    if (g.title != title) continue;
    for (const OpCase& c : g.cases) {
      for (const auto& dims : test_meshes()) {
        for (int t = 0; t < trials; ++t) {
          const uint64_t seed = 1000 + 31 * uint64_t(t) + std::hash<std::string>()(c.name) % 1000;
          std::string failure;
          try {
            failure = first_failure(on_ranks(mesh_size(dims), [&](int) { return run_op_case(c, Mesh::world(dims), seed); }));
          } catch (const std::exception& e) {
            failure = std::string("threw: ") + e.what();
          }
          INFO(c.name << " on mesh " << mesh_name(dims) << ", trial " << t);
          CHECK(failure == "");
        }
      }
    }
    return;
  }
  FAIL("no op group " << title);
}

}  // namespace

TEST_CASE("pointwise ops with broadcasting", "[dtensor]") { check_group("pointwise ops with broadcasting"); }
TEST_CASE("reductions (sum, mean, var, amax, argmax)", "[dtensor]") { check_group("reductions (sum, mean, var, amax, argmax)"); }
TEST_CASE("matmul: batch, rows, columns and the contracted dim sharded", "[dtensor]") { check_group("matmul: batch, rows, columns and the contracted dim sharded"); }
TEST_CASE("softmax, log_softmax and norms, including over sharded dims", "[dtensor]") { check_group("softmax, log_softmax and norms, including over sharded dims"); }
TEST_CASE("views and reshapes of sharded dims", "[dtensor]") { check_group("views and reshapes of sharded dims"); }
TEST_CASE("cat, stack, split, chunk", "[dtensor]") { check_group("cat, stack, split, chunk"); }
TEST_CASE("embedding (vocabulary-parallel too), gather, index ops", "[dtensor]") { check_group("embedding (vocabulary-parallel too), gather, index ops"); }
TEST_CASE("cross-entropy (vocabulary-parallel, token-parallel, ignore_index, smoothing)", "[dtensor]") { check_group("cross-entropy (vocabulary-parallel, token-parallel, ignore_index, smoothing)"); }
TEST_CASE("triangles, rotary embeddings, sort/topk", "[dtensor]") { check_group("triangles, rotary embeddings, sort/topk"); }
TEST_CASE("attention with sharded heads (causal, GQA)", "[dtensor]") { check_group("attention with sharded heads (causal, GQA)"); }
TEST_CASE("random shapes", "[dtensor]") { check_group("random shapes", 6); }
