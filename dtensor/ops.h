#pragma once
// Distributed tensors: the user-facing API (docs/design.md §2).
//
//   auto mesh = Mesh::world({{"dp", 2}, {"tp", 2}});
//   Tensor w = distribute_tensor(full_w, mesh, {Replicate(), Shard(0)});
//   Tensor x = randn({8, 64}, key, mesh, {Shard(0), Replicate()});  // no global materialisation
//   Tensor y = matmul(x, w.t());          // sharding rules pick the layout
//   Tensor r = redistribute(y, {Replicate(), Replicate()});
//   Tensor full = full_tensor(y);          // a plain tensor, same on every rank
//
// Every function here is differentiable; the backward of a redistribution is
// its dual collective. All of them are collective over the mesh (every rank
// calls them in the same order), except to_local and the factories.
#include <optional>

#include "autograd/ops/init.h"
#include "dtensor/mesh.h"
#include "runtime/philox.h"
#include "runtime/tensor.h"

namespace tessel {

// `full` holds the whole tensor on every rank (same values); each rank keeps
// its piece (a local slice, no communication). Gradient: the full gradient.
Tensor distribute_tensor(const Tensor& full, const MeshPtr& mesh, const Placements& placements);

// Wraps this rank's piece. Without `global_shape`, the sizes of sharded dims
// are summed over their mesh groups (collective) and must follow the
// ceil-division layout. Gradient: the piece's gradient (Partial -> Replicate).
Tensor from_local(const Tensor& local, const MeshPtr& mesh, const Placements& placements,
                  const std::optional<Dims>& global_shape = std::nullopt);

// This rank's piece (a plain tensor). Its gradient is taken to have
// `grad_placements` (default: t's placements), as in PyTorch's DTensor.
Tensor to_local(const Tensor& t, const std::optional<Placements>& grad_placements = std::nullopt);

// The same global tensor with other placements (the standard collectives).
Tensor redistribute(const Tensor& t, const Placements& placements);

// The whole tensor as a plain tensor on every rank (all-gather / all-reduce).
Tensor full_tensor(const Tensor& t);

// The placements in which AccumulateGrad keeps the gradient of the
// distributed leaf `t` (default, or std::nullopt: t's own placements). A
// Partial(sum) entry defers that mesh dim's reduction: gradients of several
// backward passes add up unreduced, and whoever set it reduces them (DDP
// buckets, nn/parallel/grad_reducer.h). Not a collective.
void set_grad_placements(const Tensor& t, const std::optional<Placements>& placements);

// Factories that create only this rank's piece. Random values depend on
// (key, global coordinates) only: every mesh and placement gives the same
// global tensor (docs/design.md §4 level 1). Partial placements are allowed for
// zeros/empty only.
Tensor empty(const Dims& shape, const MeshPtr& mesh, const Placements& placements, TensorOptions opts = {});
Tensor zeros(const Dims& shape, const MeshPtr& mesh, const Placements& placements, TensorOptions opts = {});
Tensor ones(const Dims& shape, const MeshPtr& mesh, const Placements& placements, TensorOptions opts = {});
Tensor full(const Dims& shape, Scalar value, const MeshPtr& mesh, const Placements& placements,
            TensorOptions opts = {});
Tensor rand(const Dims& shape, PhiloxKey key, const MeshPtr& mesh, const Placements& placements,
            TensorOptions opts = {});
Tensor randn(const Dims& shape, PhiloxKey key, const MeshPtr& mesh, const Placements& placements,
             TensorOptions opts = {});
Tensor randint(int64_t low, int64_t high, const Dims& shape, PhiloxKey key, const MeshPtr& mesh,
               const Placements& placements, TensorOptions opts = TensorOptions(DType::Int64));
Tensor bernoulli(const Dims& shape, double p, PhiloxKey key, const MeshPtr& mesh, const Placements& placements,
                 TensorOptions opts = TensorOptions(DType::Bool));

// The random block of this rank's piece of a tensor (for initialisers that
// fill a distributed parameter's local piece: normal_(to_local(w), key, ...,
// local_random_block(w))).
GlobalBlock local_random_block(const Tensor& t);

}  // namespace tessel
