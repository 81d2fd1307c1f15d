#pragma once
// The forward context: what random layers need to know about the step being
// computed, so that their randomness is shard-invariant (docs/design.md §4 level 1).
//
// A random layer (Dropout, attention-probability dropout) draws with
//   key   = {seed, stream_for(site, {step})}        site = the module's path
//   block = the local batch's place in the global batch (dim 0)
// so an element's value depends only on (seed, step, the layer's path, its
// coordinates in the *global* batch). A micro-batch, a data-parallel rank or a
// pipeline stage therefore draws exactly its slice of the full-batch mask,
// whatever the split; there is no per-rank call counter to keep in step.
//
//   for (int64_t m = 0; m < n_micro; ++m) {
//     nn::ForwardScope scope({seed, step, /*batch_offset=*/m * micro, /*global_batch=*/micro * n_micro});
//     loss = model->forward(batch_slice(m)); ...
//   }
//
// The default context (no scope) is {seed 0, step 0, offset 0, global_batch -1}:
// "the local batch is the global batch". Training loops should always set a
// scope, at least with the step, or every step draws the same masks.
#include <cstdint>
#include <string>

#include "runtime/global_block.h"
#include "runtime/philox.h"
#include "runtime/shape.h"

namespace tessel::nn {

struct ForwardContext {
  uint64_t seed = 0;          // the run's seed
  uint64_t step = 0;          // the training step (every rank and micro-batch agrees on it)
  int64_t batch_offset = 0;   // first global batch row of the local batch
  int64_t global_batch = -1;  // rows in the global batch; -1: the local batch is the whole batch
};

// Sets the thread-local forward context for its lifetime (restores the
// previous one after). Validates: batch_offset >= 0, global_batch >= -1, and
// batch_offset == 0 when global_batch == -1.
class ForwardScope {
 public:
  explicit ForwardScope(const ForwardContext& ctx);
  ~ForwardScope();
  ForwardScope(const ForwardScope&) = delete;
  ForwardScope& operator=(const ForwardScope&) = delete;

 private:
  ForwardContext prev_;
};

// The context in effect on this thread.
const ForwardContext& forward_context();
// Sets it without a scope (validated like ForwardScope); returns the previous
// one. For owners of a longer span than a scope, e.g. a tessel::Run keeps
// {seed, step} in effect between its steps (run/run.h).
ForwardContext set_forward_context(const ForwardContext& ctx);

// The Philox key of the random site `site` (a module path, e.g.
// "layers.3.attn.attn_drop") at the current seed and step:
// {seed, stream_for(site, {step})}.
PhiloxKey random_key(const std::string& site);

// Where a local tensor whose dim 0 is the batch sits in the global batch:
// global shape = local shape with dim 0 = global_batch, offset [batch_offset,
// 0, ...]. Whole (empty) when global_batch == -1 or the tensor is 0-D. `who`
// names the layer in the error raised when the local batch does not fit.
GlobalBlock batch_block(const Dims& local_shape, const std::string& who);

}  // namespace tessel::nn
