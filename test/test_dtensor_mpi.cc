// Distributed tensors on the MPI backend (ranks as processes, under
// `mpirun -np 4` via test/mpi_test.sh): the op cases of test_dtensor_ops on
// a 1-D mesh of 4 and a 2x2 mesh, redistribution between random layouts,
// and the shard-invariant random factories. Every rank runs every case.
#include <catch2/catch.hpp>

#include <random>

#include "autograd/api.h"
#include "dtensor/ops.h"
#include "runtime/comm/comm.h"
#include "test/dtensor/cases.h"
#include "test/util/dist.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

namespace {

std::vector<MeshPtr> meshes() {
  comm::init_mpi();  // idempotent
  return {Mesh::world({{"x", comm::world()->size()}}), Mesh::world({{"dp", 2}, {"tp", comm::world()->size() / 2}})};
}

}  // namespace

TEST_CASE("dtensor mpi: every op group on 1-D and 2-D meshes", "[dtensor][mpi]") {
  std::vector<MeshPtr> ms = meshes();
  for (const OpGroup& g : dtensor_op_groups()) {
    for (const OpCase& c : g.cases) {
      for (const MeshPtr& mesh : ms) {
        const uint64_t seed = 77 + std::hash<std::string>()(c.name) % 1000;
        std::string failure = run_op_case(c, mesh, seed);
        INFO(c.name << " on mesh " << mesh->str());
        CHECK(failure == "");
      }
    }
  }
}

TEST_CASE("dtensor mpi: redistribute between random layouts is exact", "[dtensor][mpi]") {
  for (const MeshPtr& mesh : meshes()) {
    std::mt19937_64 gen(5);
    const Dims shape{7, 6, 3};
    Tensor full = uniform(shape, 3);
    for (int t = 0; t < 20; ++t) {
      Placements a = random_placements(gen, mesh->ndim(), shape.size(), true);
      Placements b = random_placements(gen, mesh->ndim(), shape.size(), true);
      Tensor y = redistribute(distribute_tensor(full, mesh, a), b);
      INFO(a.str() << " -> " << b.str() << " on " << mesh->str());
      CHECK(bitwise_equal(full_tensor(y), full));
    }
  }
}

TEST_CASE("dtensor mpi: random factories are shard-invariant", "[dtensor][mpi][rng]") {
  const PhiloxKey key{3, 17};
  Tensor want = randn({9, 5}, key);
  for (const MeshPtr& mesh : meshes()) {
    std::mt19937_64 gen(9);
    for (int t = 0; t < 6; ++t) {
      Placements p = random_placements(gen, mesh->ndim(), 2, false);
      INFO(p.str() << " on " << mesh->str());
      CHECK(bitwise_equal(full_tensor(randn({9, 5}, key, mesh, p)), want));
    }
  }
}
