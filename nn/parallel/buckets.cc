#include "nn/parallel/buckets.h"

#include "kernels/elementwise.h"
#include "runtime/capture.h"

namespace tessel::parallel {

// ---- layout ---------------------------------------------------------------------------------
RankMajorLayout::RankMajorLayout(std::vector<const DpShard*> members, bool with_replicated, int64_t extras)
    : members_(std::move(members)), extras_(extras) {
  TESSEL_CHECK(!members_.empty(), "RankMajorLayout", "a bucket needs at least one member");
  const int64_t n = members_[0]->dp_size;
  included_.resize(members_.size());
  for (size_t k = 0; k < members_.size(); ++k) included_[k] = members_[k]->is_sharded() || with_replicated;
  counts_.assign(size_t(n), 0);
  block_offsets_.assign(size_t(n), 0);
  offsets_.assign(size_t(n), std::vector<int64_t>(members_.size(), -1));
  for (int64_t r = 0; r < n; ++r) {
    int64_t at = 0;
    for (size_t k = 0; k < members_.size(); ++k) {
      if (!included_[k]) continue;
      offsets_[size_t(r)][k] = at;
      at += members_[k]->numel(r);
    }
    counts_[size_t(r)] = at + extras_;
    block_offsets_[size_t(r)] = total_;
    total_ += counts_[size_t(r)];
  }
}

Tensor RankMajorLayout::block(const Tensor& buf, int64_t r) const {
  return raw::narrow(buf, 0, block_offset(r), counts_[size_t(r)]);
}

Tensor RankMajorLayout::chunk_in_block(const Tensor& block, size_t k, int64_t r) const {
  const DpShard& m = *members_[k];
  const Dims shape = m.chunk_shape(r);
  return raw::as_strided(block, shape, contiguous_strides(shape), block.offset() + offset(k, r));
}

void RankMajorLayout::pack_all(const std::vector<Tensor>& full_pieces, const Tensor& buf) const {
  const Device dev = buf.device();
  for (int64_t r = 0; r < ranks(); ++r) {
    const Tensor b = block(buf, r);
    for (size_t k = 0; k < members_.size(); ++k) {
      if (!included_[k]) continue;
      const Tensor dst = chunk_in_block(b, k, r);
      if (full_pieces[k].defined()) kernels::copy(dev, members_[k]->chunk(full_pieces[k], r), dst);
      else kernels::fill(dev, dst, Scalar(0.0));
    }
  }
}

void RankMajorLayout::pack_block(const std::vector<Tensor>& chunks, int64_t r, const Tensor& block) const {
  for (size_t k = 0; k < members_.size(); ++k)
    if (included_[k]) kernels::copy(block.device(), chunks[k], chunk_in_block(block, k, r));
}

void RankMajorLayout::unpack_all(const Tensor& buf, const std::vector<Tensor>& full_pieces) const {
  for (int64_t r = 0; r < ranks(); ++r) {
    const Tensor b = block(buf, r);
    for (size_t k = 0; k < members_.size(); ++k)
      if (included_[k]) kernels::copy(buf.device(), chunk_in_block(b, k, r), members_[k]->chunk(full_pieces[k], r));
  }
}

// ---- reduce-scatter ------------------------------------------------------------------------
ReduceScatterBucket::ReduceScatterBucket(std::vector<const DpShard*> members, comm::CommPtr dp, Device device)
    : layout_(members, /*with_replicated=*/true, /*extras=*/int64_t(members.size())), comm_(std::move(dp)) {
  const int64_t me = layout_.member(0).dp_rank;
  accumulated_ = raw::empty({layout_.counts()[size_t(me)]}, DType::Float32, device);
  kernels::fill(device, accumulated_, Scalar(0.0));
}

int64_t ReduceScatterBucket::slot_numel() const {
  const int64_t me = layout_.member(0).dp_rank;
  return layout_.total() + layout_.counts()[size_t(me)];
}

void ReduceScatterBucket::launch(StagingRing& ring, const std::vector<Tensor>& grads) {
  TESSEL_CHECK(grads.size() == layout_.size(), "ReduceScatterBucket", "got {} gradients for {} members",
               grads.size(), layout_.size());
  TESSEL_CHECK(ring.numel() >= slot_numel(), "ReduceScatterBucket", "ring slots of {} elements; the bucket needs {}",
               ring.numel(), slot_numel());
  const int64_t me = layout_.member(0).dp_rank;
  StagingRing::Slot& slot = ring.acquire();
  const Device dev = slot.buffer.device();
  const Tensor in = raw::narrow(slot.buffer, 0, 0, layout_.total());
  const Tensor out = raw::narrow(slot.buffer, 0, layout_.total(), layout_.counts()[size_t(me)]);
  layout_.pack_all(grads, in);
  for (int64_t r = 0; r < layout_.ranks(); ++r) {
    const int64_t at = layout_.block_offset(r) + layout_.extras_offset(r);
    for (size_t k = 0; k < grads.size(); ++k)
      kernels::fill(dev, raw::narrow(in, 0, at + int64_t(k), 1), Scalar(grads[k].defined() ? 1.0 : 0.0));
  }
  slot.work = comm_->reduce_scatter_v(in, out, layout_.counts(), comm::ReduceOp::Sum, /*async=*/true);
  slot.on_done = [this, out] {
    const Device d = out.device();
    if (fresh_) kernels::copy(d, out, accumulated_);
    else kernels::binary(d, kernels::BinaryOp::Add, accumulated_, out, accumulated_);
    fresh_ = false;
  };
}

Tensor ReduceScatterBucket::shard_grad(size_t k) const {
  return layout_.chunk_in_block(accumulated_, k, layout_.member(0).dp_rank);
}

bool ReduceScatterBucket::used(size_t k) const {
  if (fresh_) return false;  // nothing arrived since reset()
  const int64_t me = layout_.member(0).dp_rank;
  Tensor flag = raw::narrow(accumulated_, 0, layout_.extras_offset(me) + int64_t(k), 1);
  if (flag.device() != kCPU) flag = flag.to(kCPU);
  // Reduce-scattered over every rank's flag, so alike on every rank; it only picks host work.
  if (TESSEL_UNLIKELY(capture::active() != nullptr)) capture::active()->checked_read(flag);
  return flag.data<float>()[0] > 0;
}

int64_t ReduceScatterBucket::shard_bytes() const {
  return int64_t(accumulated_.nbytes()) - flag_bytes();
}

int64_t ReduceScatterBucket::flag_bytes() const { return int64_t(layout_.size()) * int64_t(sizeof(float)); }

// ---- all-gather ---------------------------------------------------------------------------------
AllGatherBucket::AllGatherBucket(std::vector<const DpShard*> members, comm::CommPtr dp, Device)
    : layout_(std::move(members), /*with_replicated=*/false, /*extras=*/0), comm_(std::move(dp)) {}

int64_t AllGatherBucket::slot_numel() const { return layout_.total() + layout_.counts()[size_t(layout_.member(0).dp_rank)]; }

StagingRing::Slot& AllGatherBucket::launch(StagingRing& ring, const std::vector<Tensor>& mine,
                                           std::function<void(const Tensor& gathered)> on_gathered) {
  TESSEL_CHECK(ring.numel() >= slot_numel(), "AllGatherBucket", "ring slots of {} elements; the bucket needs {}",
               ring.numel(), slot_numel());
  StagingRing::Slot& slot = ring.acquire();
  const Tensor out = raw::narrow(slot.buffer, 0, 0, layout_.total());
  slot.work = launch(raw::narrow(slot.buffer, 0, layout_.total(), block_numel()), out, mine);
  slot.on_done = [out, fn = std::move(on_gathered)] { fn(out); };
  return slot;
}

comm::WorkPtr AllGatherBucket::launch(const Tensor& in, const Tensor& out, const std::vector<Tensor>& mine) {
  TESSEL_CHECK(in.numel() >= block_numel() && out.numel() >= layout_.total(), "AllGatherBucket",
               "needs buffers of {} (in) and {} (out) elements, got {} and {}", block_numel(), layout_.total(),
               in.desc(), out.desc());
  const Tensor i = raw::narrow(in, 0, 0, block_numel()), o = raw::narrow(out, 0, 0, layout_.total());
  const bool overlap = i.shares_storage(o) && i.offset() < o.offset() + o.numel() && o.offset() < i.offset() + i.numel();
  TESSEL_CHECK(!overlap, "AllGatherBucket", "the input block {} overlaps the output {}", i.desc(), o.desc());
  layout_.pack_block(mine, layout_.member(0).dp_rank, i);
  return comm_->all_gather_v(i, o, layout_.counts(), /*async=*/true);
}

}  // namespace tessel::parallel
