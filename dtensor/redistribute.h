#pragma once
// Redistribution between any two placements of a global tensor (docs/design.md §2),
// on local pieces: no autograd here (dtensor/ops.h wraps it in a
// differentiable op whose backward is the dual collective).
//
// Each mesh dim that changes uses the standard collective over its group:
//   Shard(d) -> Replicate    all-gather along d (uneven chunks: all_gather_v)
//   Partial  -> Replicate    all-reduce
//   Partial  -> Shard(d)     reduce-scatter along d
//   Shard(a) -> Shard(b)     all-to-all
//   Replicate -> Shard(d)    local slice (no communication)
//   Replicate -> Partial     keep on coordinate 0, -0.0 elsewhere (sum);
//                            unchanged (max, min)
// ShardOn(d, c) (dtensor/placement.h) is a Shard(d) with other chunk sizes:
// the same collectives with uneven counts. Changing how one tensor dim is cut
// (Shard(d) <-> ShardOn(d, c), or another owner) goes through Replicate.
// Other changes go through Replicate. Shards of one tensor dim nest in
// mesh-dim order, so a mesh dim can only be changed while no later mesh dim
// cuts the same tensor dim; the planner gathers such later dims first and
// re-shards them afterwards.
#include <string>
#include <vector>

#include "dtensor/mesh.h"
#include "runtime/tensor.h"

namespace tessel::dtensor {

struct RedistStep {
  int mesh_dim;
  Placement from, to;
  const char* collective;  // "all_gather", "all_reduce", "reduce_scatter", "all_to_all", "slice", "zero", "none"
  std::string str() const;
};

// The steps that take `from` to `to` (pure planning; no communication).
std::vector<RedistStep> plan_redistribute(const Mesh& mesh, const Placements& from, const Placements& to);

// This rank's piece of the same global tensor under `to`. Collective over the
// groups of the mesh dims that change (every rank of the mesh must call it).
// Returns `local` itself when nothing changes; otherwise a new contiguous
// tensor (the input is never modified).
Tensor redistribute_local(const Tensor& local, const Dims& global_shape, const Mesh& mesh, const Placements& from,
                          const Placements& to);

// Checks that placements fit the mesh and a tensor of `ndim` dims; errors name `op`.
void check_placements(const char* op, const Mesh& mesh, const Placements& p, int ndim);

}  // namespace tessel::dtensor
