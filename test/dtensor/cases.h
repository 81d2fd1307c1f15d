#pragma once
// The distributed op cases shared by test_dtensor_ops (local backend, every
// mesh) and test_dtensor_mpi (MPI backend under mpirun -np 4).
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "dtensor/mesh.h"
#include "dtensor/ops.h"

namespace tessel::testing {

// Turns plain tensors into distributed ones with random placements (or, in
// the reference run, leaves them alone).
struct Distributor {
  MeshPtr mesh;  // null: reference run
  std::mt19937_64* gen = nullptr;
  Tensor operator()(const Tensor& t, bool allow_partial = false) const;
};

struct OpCase {
  std::string name;
  std::vector<Dims> shapes;  // float32 inputs, uniform in [-1, 1)
  std::function<std::vector<Tensor>(const std::vector<Tensor>&, const Distributor&)> fn;
  bool bitwise = false;  // outputs compared bit for bit
  bool grad = true;      // input gradients compared (within tolerance)
  bool partial = true;   // inputs may start as Partial(sum)
  // When set, the input shapes of a run are drawn from its seed (the same on
  // every rank) instead of `shapes`.
  std::function<std::vector<Dims>(uint64_t seed)> random_shapes;
};

struct OpGroup {
  std::string title;
  std::vector<OpCase> cases;
};

// Every group of op cases.
std::vector<OpGroup> dtensor_op_groups();

// Runs one case on this rank (all ranks of `mesh` call it with the same seed):
// "" when the distributed outputs and gradients match the single-device ones.
// With all_bitwise, outputs and gradients must equal the single-device ones
// bit for bit (what bitwise mode promises for every op).
std::string run_op_case(const OpCase& c, const MeshPtr& mesh, uint64_t seed, bool all_bitwise = false);

}  // namespace tessel::testing
