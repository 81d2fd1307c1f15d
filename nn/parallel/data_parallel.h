#pragma once
// Data parallelism over the dp mesh dim: DDP, ZeRO-1, ZeRO-2 and FSDP
// (ZeRO-3). They act on the dp dim only, so they compose with whatever the
// plan does on the others (tensor parallelism): a parameter's tp layout is
// kept, and dp cuts a tensor dim tp leaves alone (dp_shard.h).
//
//   parallelize(*model, mesh, plan);          // parameters Replicate on dp
//   parallel::DataParallel dp(*model, blocks, {/*zero=*/2});
//   nn::AdamW opt(dp.optimizer_groups(nn::default_param_groups(*model, wd)), o);
//   for (step ...) {
//     for (m ...) {
//       dp.begin_micro_batch(m + 1 == n_micro);
//       (loss_of(m) / n_micro).backward();
//     }
//     dp.finish();                             // reduced gradients in place
//     nn::clip_grad_norm_(dp.parameters(), 1.0);
//     opt.step();
//     dp.after_step();                         // ZeRO-1/2: all-gather the updated shards
//     opt.zero_grad();
//   }
//
//   stage      parameters  gradients  optimizer  dp communication per step
//   0 DDP      whole       whole      whole      all-reduce per bucket, last micro-batch only
//   1 ZeRO-1   whole       whole      1/dp       the same + all-gather of the parameters after the step
//   2 ZeRO-2   whole       1/dp       1/dp       reduce-scatter per bucket and micro-batch + all-gather after the step
//   3 FSDP     1/dp        1/dp       1/dp       all-gather per unit in forward and in backward, reduce-scatter per unit
//
// (1/dp: ceil-division chunks; parameters with no dim to cut stay whole,
// dp_shard.h.) The loss is the mean over the global batch, so every
// reduction is a plain sum. grad_reducer.h (DDP, ZeRO-1/2) and fsdp.h (FSDP)
// describe the mechanics; docs/parallel.md the design.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dtensor/mesh.h"
#include "nn/module.h"
#include "nn/optim.h"
#include "nn/parallel/dp_param.h"

namespace tessel::parallel {

class GradReducer;
class Fsdp;
class AllGatherBucket;
class StagingRing;

struct DataParallelOptions {
  int zero = 0;            // 0 DDP, 1 ZeRO-1, 2 ZeRO-2, 3 FSDP
  double bucket_mb = 25;   // DDP/ZeRO-1/2 bucket size in MiB of gradients; 0: one bucket per parameter
  std::string dim = "dp";  // the mesh dim
};

// Per-rank bytes, counted from the tensors this rank holds.
struct DataParallelMemory {
  int64_t params = 0;     // parameters (local pieces; FSDP: shards)
  int64_t grads = 0;      // gradients kept between backward and step (pieces or shards)
  int64_t optimizer = 0;  // optimizer state (Optimizer::state_bytes)
  int64_t comm = 0;       // staging buffers of the collectives and used-flags
  int64_t gathered = 0;   // FSDP: parameters gathered at once (root and the largest block)
  int64_t gathered_now = 0;  // FSDP: parameters gathered at this moment (units gathered on use count too)
};

class DataParallel {
 public:
  // Whether `mesh` has a dim `dim` of size > 1 (else there is nothing to do).
  static bool applies(const Mesh& mesh, const std::string& dim = "dp");

  // `model`'s parameters are laid out on one mesh (parallelize); those
  // Replicate on the dp dim are managed (others are left as they are).
  // `blocks` are FSDP's units in forward order; every other parameter
  // belongs to the root unit (with no blocks: all of them). Called through
  // operator() (forward hooks) a unit is gathered for its forward only and
  // freed after it; used any other way (model.loss(x, y), block->forward(x))
  // it is gathered on first use and stays gathered until its backward --
  // the same values, without the memory saving (fsdp.h). FSDP shards the
  // parameters here, replacing the model's tensors: build the optimizer
  // afterwards.
  DataParallel(nn::Module& model, const std::vector<nn::Module*>& blocks, DataParallelOptions options);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // The groups with each parameter replaced by what this rank updates
  // (ZeRO-1/2: a distributed view of its dp chunk; otherwise itself).
  std::vector<nn::ParamGroup> optimizer_groups(std::vector<nn::ParamGroup> groups) const;
  // What the optimizer updates: after finish(), their .grad hold the reduced
  // gradients (clip these).
  std::vector<Tensor> parameters() const;

  // Before each backward; `last`: the step's last micro-batch.
  void begin_micro_batch(bool last);
  // After the step's last backward, before clipping and the optimizer.
  void finish();
  // After the optimizer step. ZeRO-1 gathers the parameters through the
  // gradient buckets: the gradients are dropped here.
  void after_step();

  const DataParallelOptions& options() const { return opts_; }
  DataParallelMemory memory(const nn::Optimizer& opt) const;
  // "ZeRO-2 over dp=2: 3 buckets of <= 25 MiB", ...
  std::string describe() const;
  // The gradient buckets' parameter paths (FSDP: per unit).
  std::vector<std::vector<std::string>> buckets() const;

 private:
  DataParallelOptions opts_;
  MeshPtr mesh_;
  int dp_ = -1;
  std::vector<DpParam> params_;      // managed
  std::vector<Tensor> unmanaged_;    // parameters not Replicate on dp
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<Fsdp> fsdp_;
  // ZeRO-1/2: all-gather of the updated shards after the step.
  std::vector<std::unique_ptr<AllGatherBucket>> gathers_;
  std::vector<std::vector<size_t>> gather_members_;
  std::vector<size_t> gather_bucket_;  // the gradient bucket each one mirrors
  Tensor gather_in_;                   // ZeRO-1: this rank's block (the gradient buckets take the rest)
  // ZeRO-2: staging for the reduce-scatters and the all-gathers; they
  // never run at the same time (backward / after the step), so they share it.
  std::unique_ptr<StagingRing> ring_;
};

}  // namespace tessel::parallel
