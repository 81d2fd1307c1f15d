#pragma once
// Flat buffers for the dp collectives of ZeRO and FSDP: one reduce-scatter
// or one all-gather moves a whole bucket of parameters.
//
// Rank-major layout: the buffer is dp blocks in rank order; block r holds,
// for each member in order, rank r's chunk of it (DpShard::chunk), then
// `extras` floats. A reduce-scatter over it leaves each rank its own block
// summed over the ranks; an all-gather of every rank's block rebuilds it.
// Members replicated over dp (no dim to cut) are either left out (all-gather:
// they are whole already) or carried whole in every block (reduce-scatter:
// each rank receives the sum of every rank's piece, an all-reduce of them).
// The extras of a reduce-scatter carry one "had a gradient" flag per member,
// so ranks learn which parameters no rank used, in the same collective.
#include <cstdint>
#include <functional>
#include <vector>

#include "nn/parallel/dp_shard.h"
#include "nn/parallel/staging.h"
#include "runtime/comm/comm.h"

namespace tessel::parallel {

class RankMajorLayout {
 public:
  RankMajorLayout() = default;
  // with_replicated: carry members that are not sharded whole in every block.
  RankMajorLayout(std::vector<const DpShard*> members, bool with_replicated, int64_t extras);

  size_t size() const { return members_.size(); }
  const DpShard& member(size_t k) const { return *members_[k]; }
  bool included(size_t k) const { return included_[k]; }
  int64_t ranks() const { return int64_t(counts_.size()); }
  // Elements of each block, rank order (the counts of the _v collectives).
  const std::vector<int64_t>& counts() const { return counts_; }
  int64_t total() const { return total_; }
  int64_t block_offset(int64_t r) const { return block_offsets_[size_t(r)]; }
  // Where member k's chunk sits inside block r (relative to the block).
  int64_t offset(size_t k, int64_t r) const { return offsets_[size_t(r)][k]; }
  int64_t extras_offset(int64_t r) const { return counts_[size_t(r)] - extras_; }

  // Member k's chunk inside `block` (the block of rank r alone), shaped.
  Tensor chunk_in_block(const Tensor& block, size_t k, int64_t r) const;
  // Block r of `buf` (all blocks) as a flat view.
  Tensor block(const Tensor& buf, int64_t r) const;
  // Copies rank r's chunk of each member's full local piece into block r of
  // `buf`, for every r; undefined pieces are written as zeros.
  void pack_all(const std::vector<Tensor>& full_pieces, const Tensor& buf) const;
  // Copies `chunks[k]` (member k's chunk of this rank, r) into `block`.
  void pack_block(const std::vector<Tensor>& chunks, int64_t r, const Tensor& block) const;
  // Copies every block of `buf` into the members' full local pieces.
  void unpack_all(const Tensor& buf, const std::vector<Tensor>& full_pieces) const;

 private:
  std::vector<const DpShard*> members_;
  std::vector<bool> included_;
  std::vector<int64_t> counts_, block_offsets_;
  std::vector<std::vector<int64_t>> offsets_;  // [rank][member]
  int64_t extras_ = 0;
  int64_t total_ = 0;
};

// Gradients of a bucket, reduce-scattered over dp and accumulated per shard.
class ReduceScatterBucket {
 public:
  ReduceScatterBucket(std::vector<const DpShard*> members, comm::CommPtr dp, Device device);

  // Elements a ring slot needs (the full bucket plus this rank's block).
  int64_t slot_numel() const;
  // Starts the reduce-scatter of one backward's unreduced gradients
  // (`grads[k]`: member k's full local piece, pending over dp; undefined
  // when this rank has none). The data is copied out before returning, so
  // the gradients can be freed at once. On completion the result is added to
  // the accumulated shards (or replaces them after reset()).
  void launch(StagingRing& ring, const std::vector<Tensor>& grads);
  // After the launches completed: member k's summed gradient shard (this
  // rank's chunk, a view into the bucket), and whether any rank had a
  // gradient for it since reset() (false when nothing completed since).
  Tensor shard_grad(size_t k) const;
  bool used(size_t k) const;
  // The next completion overwrites the accumulated shards.
  void reset() { fresh_ = true; }
  // Bytes held between steps: the accumulated shards and flags.
  int64_t shard_bytes() const;
  int64_t flag_bytes() const;
  const RankMajorLayout& layout() const { return layout_; }

 private:
  RankMajorLayout layout_;
  comm::CommPtr comm_;
  Tensor accumulated_;  // this rank's block: shards, then one flag per member
  bool fresh_ = true;
};

// Parameters of a bucket, all-gathered over dp from their shards.
class AllGatherBucket {
 public:
  AllGatherBucket(std::vector<const DpShard*> members, comm::CommPtr dp, Device device);

  bool empty() const { return layout_.total() == 0; }
  int64_t slot_numel() const;
  // Starts gathering: `mine[k]` is this rank's chunk of member k (undefined
  // for members that are not sharded). On completion `on_gathered` gets the
  // gathered blocks; unpack() spreads them into full local pieces. Returns
  // the slot (for StagingRing::complete).
  StagingRing::Slot& launch(StagingRing& ring, const std::vector<Tensor>& mine,
                            std::function<void(const Tensor& gathered)> on_gathered);
  // The same with buffers of the caller's: `in` (at least this rank's block)
  // receives `mine`, `out` (at least layout().total() elements) the blocks.
  comm::WorkPtr launch(const Tensor& in, const Tensor& out, const std::vector<Tensor>& mine);
  int64_t block_numel() const { return layout_.counts()[size_t(layout_.member(0).dp_rank)]; }
  void unpack(const Tensor& gathered, const std::vector<Tensor>& full_pieces) const {
    layout_.unpack_all(gathered, full_pieces);
  }
  const RankMajorLayout& layout() const { return layout_; }

 private:
  RankMajorLayout layout_;
  comm::CommPtr comm_;
};

}  // namespace tessel::parallel
