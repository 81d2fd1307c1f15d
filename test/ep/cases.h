#pragma once
// Expert-parallel MoE cases shared by test_expert_parallel (local backend,
// ranks as threads) and test_expert_parallel_mpi (MPI backend under
// mpirun -np 4): an nn::MoE laid out over an "ep" mesh dim (with dp, tp)
// against the single-device MoE.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/mesh.h"
#include "nn/moe.h"
#include "nn/parallel/plan.h"

namespace tessel::testing {

// A model whose MoE sits at "ffn", like a Mixtral block's.
struct MoEHolder : nn::UnaryModule {
  std::shared_ptr<nn::MoE> ffn;
  explicit MoEHolder(const nn::MoEConfig& c);
  Tensor forward(const Tensor& x) override;
};

nn::MoEConfig moe_test_config(int64_t experts, int64_t top_k, double capacity_factor = 0);

// Experts over "ep"; with tp, Megatron shards inside each expert.
parallel::ParallelPlan ep_test_plan(bool tp);

// How the reference and the layouts compute: bitwise mode (then everything
// must match bit for bit) and an autocast dtype.
struct EpNumerics {
  bool bitwise = false;
  std::optional<DType> compute;
};

struct EpLayout {
  std::vector<Mesh::DimSpec> mesh;
  bool tp = false;
  bool shard_input = true;  // x arrives sharded over dp and ep (else replicated: the MoE slices it)
  EpNumerics numerics;      // must be the reference's
};

// What one forward + backward (loss = sum(y * g) + aux) gives, gathered.
struct EpOutcome {
  Tensor y, x_grad;
  std::vector<std::pair<std::string, Tensor>> grads;  // undefined where no gradient
  std::vector<int64_t> counts, dropped;
  double aux = 0;
};

// The single-device outcome for x, g = uniform(xshape, 21 / 22), parameters from seed 5.
EpOutcome ep_reference(const nn::MoEConfig& cfg, const Dims& xshape, const EpNumerics& numerics = {});

// On this rank of a running world whose size is the layout's: the same model
// parallelized on the layout. "" when it matches `ref` (outputs bit for bit
// without tp, gradients within 1e-5, counts and drops exactly; in bitwise
// mode everything bit for bit), else what differs.
std::string ep_case(const nn::MoEConfig& cfg, const Dims& xshape, const EpLayout& layout, const EpOutcome& ref);

// all_to_all_v on this rank of a world of n ranks: values, the reverse
// exchange as gradient, an error for bad counts. "" when all is well.
std::string all_to_all_case(int rank, int n);

}  // namespace tessel::testing
