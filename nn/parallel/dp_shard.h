#pragma once
// How one parameter is split over the dp mesh dim by ZeRO and FSDP.
//
// A parameter is cut along the first tensor dim d that no other mesh dim
// cuts: its dp placement becomes Shard(d), and dp rank r keeps chunk r
// (ceil-division) of its local piece along d. Because no later mesh dim cuts
// d, that chunk is exactly the local piece of the Shard(d) placement: a shard
// is an ordinary distributed tensor (the optimizer, clipping, full_tensor
// and checkpoints work on it unchanged), and gathering it back is one
// all-gather over dp alone, whatever tp does on the other dims.
//
// A parameter whose every dim is already cut by another mesh dim (a 1-D
// column-parallel bias under tp) has no such d. It stays replicated over dp:
// its gradient is all-reduced, its optimizer state is kept whole.
#include <cstdint>

#include "dtensor/mesh.h"
#include "dtensor/placement.h"
#include "runtime/tensor.h"

namespace tessel::parallel {

struct DpShard {
  int dp = -1;          // index of the dp mesh dim
  int64_t dp_size = 1;  // its size
  int64_t dp_rank = 0;  // this rank's coordinate on it
  int dim = -1;         // the tensor dim cut over dp; -1: replicated over dp
  Dims global;          // the parameter's global shape
  Dims full_local;      // the local piece with dp Replicate (what the model computes with)
  Placements full;      // dp Replicate
  Placements pending;   // dp Partial(sum): an unreduced gradient
  Placements sharded;   // dp Shard(dim); == full when dim < 0

  bool is_sharded() const { return dim >= 0; }
  // Rank r's range along `dim` of the full local piece (the whole dim when
  // not sharded).
  Range range(int64_t r) const;
  // Elements of rank r's chunk (the whole piece when not sharded).
  int64_t numel(int64_t r) const;
  Dims chunk_shape(int64_t r) const;
  // Rank r's chunk of a full local piece: a view (strided when dim > 0).
  Tensor chunk(const Tensor& full_piece, int64_t r) const;
};

// The split of `param` (distributed, Replicate on mesh dim `dp`).
DpShard make_dp_shard(const Tensor& param, int dp, const std::string& path);

}  // namespace tessel::parallel
