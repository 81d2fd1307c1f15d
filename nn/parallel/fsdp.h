#pragma once
// FSDP (ZeRO-3): parameters live sharded over dp and are gathered one unit
// at a time.
//
// Units: each block given to DataParallel (LanguageModel::blocks()), in
// forward order, and the root (every other parameter: embeddings, final
// norm, head; with no blocks, all of them). Each unit gathers on one of two
// paths.
//
// The fast path: the unit's module is called as (*m)(x), so its forward
// hooks run (LanguageModel::forward runs the root's). In one micro-batch:
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
// Gathering on use: a model need not call its units through operator() (an
// entry point like `loss(x, y)` never runs the root's hooks; a block called
// as block->forward(x) never runs its own). Every shard carries a use hook
// (DistInfo::on_use, runtime/tensor.h): an op (call()) that gets a shard
// computes on the unit's gathered copy instead -- gathering and installing
// the unit first, with its gather node, if no copy is there -- so values and
// gradients are the same as on the fast path (bit for bit). Nothing tells
// FSDP when such a unit's forward ends, so it stays gathered until its
// post-backward (or after_step): the memory saving is lost for it, and a
// warning says so once per unit. Without grad mode, a use gets a copy
// without a node that is never put in the slots (a later training forward
// must not read a copy that leads no gradient back). Reads that are no op
// (redistribute, full_tensor, to_local, raw::local_of, the optimizer,
// checkpoints, param_hash) see the shard as it is and gather nothing.
//
// Errors rather than wrong gradients (tessel::Error naming the parameter and
// its unit):
//   * a gradient reaching a shard's own AccumulateGrad: something used the
//     shard outside the gathering (e.g. an op on redistribute(shard)), and
//     finish() would overwrite that gradient with the unit's reduce-scatter;
//   * in grad mode, a unit gathered again while its gathered copy of an
//     earlier forward still awaits its backward: a parameter used after its
//     unit's forward ended (its module's post-hook released it), a second
//     forward before the first one's backward, or a module called twice in
//     one forward. A second gather node would reduce-scatter the unit twice,
//     which changes the summation order (and the first to run would free the
//     buffer under the other's saved tensors). Under NoGradGuard, gathering
//     again is fine. (A unit gathered on use is still installed at a second
//     forward, which reuses its copies and their one node: one backward of
//     both losses is exact; separate backwards reduce-scatter once each, as
//     gradient accumulation does, and the second fails where it needs a
//     saved parameter the first one's post-backward released.)
//
// Gradient shards accumulate over micro-batches in the unit's
// ReduceScatterBucket; finish() waits for the last reduce-scatters and sets
// them as the shards' .grad. Parameters with no dim to cut over dp
// (dp_shard.h) stay whole: they pass through the gather node unchanged and
// their gradients are summed over dp by the same reduce-scatter; they carry
// the use hook and the gradient check too.
//
// Limits: the model must use every unit in every forward on every rank
// (units skipped on some ranks would reorder the collectives), and ops that
// pick a decomposition by their operands' placements before call() (e.g.
// softmax over a sharded dim) see a shard's dp placement, not the gathered
// one, when a raw shard is passed to them.
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
  // slots. `root` is the model: its forward hooks (when the model runs them,
  // as LanguageModel::forward does) gather the root unit; `blocks` are the
  // other units, in forward order (may be empty: everything is the root).
  // `params` must outlive this object; destroying it leaves the shards as
  // plain distributed tensors (no use hook).
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
  int64_t gathered_bytes() const;  // at most gathered at once on the fast path: the root and the largest block
  int64_t gathered_bytes_now() const;  // gathered at this moment
  // Unit names and their parameter paths (for logs and tests).
  std::vector<std::pair<std::string, std::vector<std::string>>> units() const;

 private:
  std::shared_ptr<FsdpState> state_;
};

}  // namespace tessel::parallel
