#pragma once
// Gradient reduction over dp in buckets, driven by backward hooks: DDP and
// ZeRO-1 (all-reduce), ZeRO-2 (reduce-scatter).
//
// Every managed parameter keeps its gradient Partial(sum) on dp
// (set_grad_placements): AccumulateGrad adds each backward's gradient
// unreduced, and a post-accumulate hook tells this reducer the parameter is
// ready. Buckets hold parameters in reverse registration order (about the
// order backward produces gradients), up to a byte cap; a full bucket starts
// its collective at once (async), while backward goes on with the layers
// below. Buckets start strictly in index order, so every rank issues the same
// collectives in the same order even when some parameter had no gradient on
// some rank (its bucket and the later ones then start in finish()).
//
// All-reduce mode (DDP, ZeRO-1): each bucket owns one flat buffer, and the
// parameters' .grad are views into it (installed zeroed at the first
// micro-batch), so accumulation writes straight into the buffer and nothing
// is copied. Micro-batches before the last one communicate nothing.
//
// Reduce-scatter mode (ZeRO-2): every micro-batch's full gradients are
// packed into a staging slot, freed, and reduce-scattered; each rank adds its
// chunk to persistent gradient shards (RankMajorLayout). Full gradients live
// only until their bucket is launched.
//
// A flag per parameter rides along in each collective: a parameter no rank
// had a gradient for keeps an undefined .grad, as on one device (the
// optimizer skips it).
#include <cstdint>
#include <memory>
#include <vector>

#include "nn/parallel/buckets.h"
#include "nn/parallel/dp_param.h"
#include "nn/parallel/staging.h"

namespace tessel::parallel {

class GradReducer {
 public:
  enum class Mode { AllReduce, ReduceScatter };

  // `params` (registration order) must outlive the reducer. bucket_bytes:
  // gradient bytes per bucket (a parameter larger than that gets a bucket
  // of its own); 0: one bucket per parameter.
  GradReducer(std::vector<DpParam*> params, Mode mode, int64_t bucket_bytes);
  // Reduce-scatter mode: the staging ring the buckets use (owned by the
  // caller, which may share it with collectives that never overlap these),
  // with slots of at least slot_numel() elements.
  void set_ring(StagingRing* ring);
  int64_t slot_numel() const { return slot_numel_; }
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Before each backward; `last`: the step's last micro-batch.
  void begin_micro_batch(bool last);
  // After the last backward: starts what has not started, waits for
  // everything, and installs the reduced gradients on DpParam::shard
  // (all-reduce mode: also on DpParam::param, now Replicate on dp).
  void finish();

  Mode mode() const { return mode_; }
  int num_buckets() const { return int(buckets_.size()); }
  // Bytes of the gradients this rank keeps (full pieces or shards).
  int64_t grad_bytes() const;
  // Bytes of the used-flags (the staging ring is its owner's).
  int64_t comm_bytes() const;
  // All-reduce mode: bucket b's flat buffer (gradient pieces, then flags).
  // Free between the optimizer step and the next backward: ZeRO-1 gathers
  // the updated parameters through it.
  const Tensor& flat(size_t b) const { return buckets_[b].flat; }
  // Parameter paths per bucket (for logs and tests).
  std::vector<std::vector<std::string>> bucket_paths() const;

 private:
  struct Bucket {
    std::vector<size_t> members;  // indices into params_
    int ready = 0;
    bool launched = false;
    // all-reduce mode
    Tensor flat;                  // members' full pieces, then one flag per member
    Tensor acc;                   // bitwise mode: the reduced gradients of the earlier micro-batches
    std::vector<Tensor> views;    // the members' gradient pieces inside `flat`
    std::vector<Tensor> flags;    // 1-element views: 1 once the member got a gradient this step
    comm::WorkPtr work;
    // reduce-scatter mode
    std::unique_ptr<ReduceScatterBucket> rs;
  };

  void on_grad(size_t bucket, size_t k);
  void launch_ready();
  void launch(Bucket& b);
  void install_all_reduced();
  void install_reduce_scattered();

  std::vector<DpParam*> params_;
  Mode mode_;
  comm::CommPtr comm_;
  std::vector<Bucket> buckets_;
  std::vector<int> hook_handles_;
  StagingRing* ring_ = nullptr;  // reduce-scatter mode
  int64_t slot_numel_ = 0;
  int micro_ = 0;     // micro-batches begun this step
  bool sync_ = false; // this backward launches buckets
  bool last_ = false; // the step's last micro-batch has begun
  bool per_micro_ = false; // bitwise mode: all-reduce every micro-batch (fixed for the step)
  size_t next_ = 0;   // next bucket to launch
};

}  // namespace tessel::parallel
