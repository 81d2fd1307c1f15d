#pragma once
// call(Op{attrs...}, inputs...): runs a differentiable op and records it.
//
// An op is one struct holding everything about it (docs/design.md §1 "one op
// lives in one place"):
//
//   struct SoftmaxOp {
//     static constexpr const char* kName = "softmax";
//     int64_t dim;                       // attributes
//     SavedTensor y;                     // state saved for backward
//     Tensor forward(const Tensor& x);   // checks, allocates, dispatches kernels
//     std::vector<Tensor> backward(const GradContext& ctx, std::vector<Tensor>& grads);
//   };
//   Tensor softmax(const Tensor& x, int64_t dim) { return call(SoftmaxOp{dim}, x); }
//
// Inputs are `const Tensor&` or `const std::vector<Tensor>&` (flattened in
// order). forward returns a Tensor or a std::vector<Tensor>. backward gets one
// gradient per output (undefined for outputs no gradient reached) and returns
// one per tensor input (undefined where ctx.needs(i) is false or none flows).
// forward runs with grad mode off; the node is recorded only if grad mode is on
// and some input requires grad. Floating-point outputs get the history;
// integer outputs (indices) never require grad.
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "autograd/anomaly.h"
#include "autograd/autograd_meta.h"
#include "autograd/grad_context.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "dtensor/dist_call.h"
#include "runtime/cost.h"
#include "runtime/macros.h"
#include "runtime/profile.h"

namespace tessel {

namespace detail {

inline bool any_requires_grad(const Tensor& t) {
  const AutogradMeta* m = t.defined() ? autograd_meta(t) : nullptr;
  return m && m->requires_grad;
}
inline bool any_requires_grad(const std::vector<Tensor>& v) {
  for (const auto& t : v)
    if (any_requires_grad(t)) return true;
  return false;
}
template <class T>
inline bool any_requires_grad(const T&) { return false; }  // non-tensor arguments

// Attaches the node to the outputs (connect() and set_history() are in dist_call.h).
inline uint32_t set_history_all(const Tensor& out, const std::shared_ptr<Node>& node) {
  set_history(out, node, 0);
  return 1;
}
inline uint32_t set_history_all(const std::vector<Tensor>& outs, const std::shared_ptr<Node>& node) {
  for (size_t i = 0; i < outs.size(); ++i) set_history(outs[i], node, uint32_t(i));
  return uint32_t(outs.size());
}

// Bytes of an op's outputs (local pieces of distributed ones), for runtime/cost.h.
inline int64_t local_bytes(const Tensor& t) { return t.defined() ? int64_t(raw::local_of(t).nbytes()) : 0; }
inline int64_t local_bytes(const std::vector<Tensor>& v) {
  int64_t n = 0;
  for (const auto& t : v) n += local_bytes(t);
  return n;
}

template <class Op, class = void>
struct has_dynamic_name : std::false_type {};
template <class Op>
struct has_dynamic_name<Op, std::void_t<decltype(std::declval<const Op&>().name())>> : std::true_type {};

// An op's name: `name()` when the struct has one (ops sharing a struct, like
// add/mul), else its kName.
template <class Op>
const char* op_name(const Op& op) {
  if constexpr (has_dynamic_name<Op>::value) return op.name();
  else return Op::kName;
}

template <class Op>
struct OpNode final : Node {
  std::optional<Op> op;
  const char* name_ = Op::kName;
  const char* name() const override { return name_; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!op) {
      throw SavedTensorError(std::string(name_) +
                             ": backward through a graph whose saved tensors were already freed; "
                             "call backward(..., retain_graph=true) the first time");
    }
    GradContext ctx(needs_from_edges(*this));
    try {
      return op->backward(ctx, grads);
    } catch (const SavedTensorError& e) {
      rethrow_saved_error(name_, e);
    }
  }
  void release_saved() override { op.reset(); }
};

}  // namespace detail

template <class Op, class... Args>
auto call(Op op, const Args&... args) {
  profile::Timer profile_timer(detail::op_name(op));
  if (TESSEL_UNLIKELY((detail::arg_distributed(args) || ...))) {
    auto out = detail::call_distributed(detail::op_name(op), std::move(op), args...);
    if (TESSEL_UNLIKELY(cost::active() != nullptr)) cost::add_op(detail::local_bytes(out));
    return out;
  }
  bool record = GradMode::is_enabled() && (detail::any_requires_grad(args) || ...);
  using Out = std::decay_t<decltype(op.forward(args...))>;
  std::optional<Out> out;
  {
    NoGradGuard no_grad;
    try {
      out.emplace(op.forward(args...));
    } catch (const OutOfMemoryError& e) {
      e.rethrow_in(detail::op_name(op));  // the message names the op that asked
    }
  }
  if (record) {
    auto node = std::make_shared<detail::OpNode<Op>>();
    std::vector<const Tensor*> inputs;
    (detail::collect(inputs, args), ...);
    detail::connect(*node, inputs);
    node->name_ = detail::op_name(op);
    node->op.emplace(std::move(op));
    node->num_outputs = detail::set_history_all(*out, node);
    if (TESSEL_UNLIKELY(anomaly::enabled())) node->forward_module = anomaly::module_path();
  }
  if (TESSEL_UNLIKELY(cost::active() != nullptr)) cost::add_op(detail::local_bytes(*out));
  if (TESSEL_UNLIKELY(anomaly::enabled())) detail::check_anomaly(detail::op_name(op), *out, args...);
  if (TESSEL_UNLIKELY(trace::current() != nullptr)) detail::trace_outputs(detail::op_name(op), *out);
  return std::move(*out);
}

}  // namespace tessel
