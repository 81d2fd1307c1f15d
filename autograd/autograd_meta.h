#pragma once
// Per-tensor autograd state (TensorImpl::autograd).
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "autograd/node.h"

namespace tessel {

struct AutogradMeta {
  bool requires_grad = false;  // leaves: set by the user; non-leaves: true when grad_fn is set
  Tensor grad;                 // accumulated gradient (leaves, and non-leaves that retain_grad)
  std::shared_ptr<Node> grad_fn;  // null for leaves
  uint32_t output_nr = 0;         // which output of grad_fn this tensor is
  std::weak_ptr<Node> grad_accumulator;  // leaves: shared by every graph using the leaf
  bool retains_grad = false;
  struct Hook {
    int handle;
    GradHook fn;
  };
  std::vector<Hook> hooks;  // leaves (non-leaf hooks live on grad_fn)
  struct PostHook {
    int handle;
    std::function<void(const Tensor&)> fn;
  };
  std::vector<PostHook> post_accumulate_hooks;
  // Distributed leaves: the placements .grad is kept in (unset: the leaf's
  // own). AccumulateGrad redistributes every incoming gradient to them after
  // the hooks ran. Data parallelism sets Partial(sum) on the dp dim, so that
  // gradients accumulate unreduced over micro-batches and its buckets do the
  // reduction (set_grad_placements, nn/parallel/grad_reducer.h).
  std::optional<Placements> grad_placements;
  // A parameter that a layout replaced by another tensor (tessel::parallelize
  // lays a model out and the model holds the new tensors): says by what.
  // Optimizers refuse such a tensor, so one built over the old parameters
  // fails instead of silently updating tensors the model no longer uses.
  const char* replaced_by = nullptr;
};

// Accessors that create the meta on demand.
AutogradMeta* autograd_meta(const Tensor& t);           // may be null
AutogradMeta& ensure_autograd_meta(const Tensor& t);

// The edge a gradient for `t` flows into: (grad_fn, output_nr) for non-leaves,
// (the leaf's AccumulateGrad, 0) for leaves that require grad, else invalid.
Edge gradient_edge(const Tensor& t);

// Node that accumulates incoming gradients into a leaf's .grad.
struct AccumulateGrad final : Node {
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf);
  const char* name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  std::shared_ptr<TensorImpl> leaf;
};

}  // namespace tessel
