#pragma once
// FSDP (ZeRO-3): parameters live sharded over dp and are gathered one unit
// at a time.
//
// Units: each block of the model (LanguageModel::blocks()) and the root (every
// parameter outside the blocks: embeddings, final norm, head). The lifecycle
// of a unit in one micro-batch:
//
//   forward pre-hook   all-gather its shards into its flat buffer (waiting for
//                      the prefetch when one was started), start the next
//                      unit's all-gather (async prefetch), and swap gathered
//                      copies of the parameters into the module's slots;
//   forward post-hook  swap the shards back and free the buffer (blocks; the
//                      root stays gathered: backward needs it first). The
//                      tensors autograd saved still alias the buffer: the
//                      memory goes back to the allocator, the storage object
//                      (and its version counter) stays (StorageImpl::release);
//   output-grad hook   (fires before any of the unit's backward nodes run)
//                      gather it again, in place into the same storage and
//                      without bumping the version, so the saved tensors see
//                      the values they were saved with; prefetch the unit
//                      backward reaches next;
//   gather node        one autograd node per unit and forward links the
//                      gathered copies to the shards. It runs once every
//                      consumer of the gathered parameters has run — the
//                      unit's post-backward point: it starts the bucketed
//                      reduce-scatter of the unit's gradients (the dual of
//                      the all-gather), frees the buffer again, and passes
//                      nothing on to the shards' AccumulateGrad.
//
// Gradient shards accumulate over micro-batches in the unit's
// ReduceScatterBucket; finish() waits for the last reduce-scatters and sets
// them as the shards' .grad. Parameters with no dim to cut over dp
// (dp_shard.h) stay whole: they pass through the gather node unchanged and
// their gradients are summed over dp by the same reduce-scatter.
//
// Limits: the model must call every unit in every forward on every rank
// (units skipped on some ranks would reorder the collectives), and a unit's
// parameters may only be used inside its forward (the root's: anywhere in
// the model's forward).
#include <cstdint>
#include <memory>
#include <vector>

#include "nn/module.h"
#include "nn/parallel/dp_param.h"

namespace tessel::parallel {

struct FsdpState;

class Fsdp {
 public:
  // `params` (registration order, each Replicate on dp) are sharded now:
  // DpParam::param and ::shard become the shard, and so do the model's
  // slots. `root` is the model: its own forward hooks gather the root unit
  // (LanguageModel::forward runs them); `blocks` are the units, in forward
  // order. `params` must outlive this object.
  Fsdp(nn::Module& root, const std::vector<nn::Module*>& blocks, std::vector<DpParam*> params);
  ~Fsdp();
  Fsdp(const Fsdp&) = delete;
  Fsdp& operator=(const Fsdp&) = delete;

  // After the last backward of a step: waits for the reduce-scatters and
  // sets each shard's .grad (undefined where no rank had a gradient).
  void finish();
  // After the optimizer step: frees any unit still gathered (its values are
  // stale now).
  void after_step();

  int num_units() const;
  int64_t grad_bytes() const;      // gradient shards
  int64_t comm_bytes() const;      // staging slots and flags
  int64_t gathered_bytes() const;  // at most gathered at once: the root and the largest block
  // Unit names and their parameter paths (for logs and tests).
  std::vector<std::pair<std::string, std::vector<std::string>>> units() const;

 private:
  std::shared_ptr<FsdpState> state_;
};

}  // namespace tessel::parallel
