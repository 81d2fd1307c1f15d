#pragma once
// How call() runs an op when an argument is a distributed tensor (docs/design.md
// §2): every tensor op stays single-device code, and this wrapper makes it
// work on a mesh.
//
//   0. An input whose DistInfo carries a use hook (DistInfo::on_use, e.g.
//      an FSDP parameter shard) is replaced by what the hook returns, before
//      anything below sees it: the op computes on, and its node records, the
//      replacement.
//   1. The op runs once on Meta tensors of the global shapes: shape/dtype
//      checks (errors name global shapes) and the global output shapes.
//   2. Its sharding rule (op.sharding(ctx), dtensor/sharding.h) picks the
//      input and output placements and may localise the op's attributes;
//      without a rule, everything is replicated (logged once).
//   3. Inputs are redistributed where the rule asks (recorded on the tape, so
//      gradients flow back through the dual collectives).
//   4. The op's forward runs on the local pieces; its outputs are wrapped as
//      distributed tensors with the rule's placements.
//   5. When recording, a DistOpNode runs the op's backward on local gradient
//      pieces, redistributed to the dual placements first.
#include <functional>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "autograd/autograd_meta.h"
#include "autograd/grad_context.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/anomaly.h"
#include "autograd/trace.h"
#include "dtensor/sharding.h"
#include "runtime/cost.h"
#include "runtime/numerics.h"

namespace tessel {
namespace detail {

inline bool arg_distributed(const Tensor& t) { return t.is_distributed(); }
inline bool arg_distributed(const std::vector<Tensor>& v) {
  for (const auto& t : v)
    if (t.is_distributed()) return true;
  return false;
}
template <class T>
inline bool arg_distributed(const T&) { return false; }

// `bool partial_exact() const`: the op's backward moves gradient elements
// without arithmetic (each input-gradient element is one output-gradient
// element or +0: views, split), so a pending sum (Partial) may pass through
// it in bitwise mode too -- reducing before or after gives the same bits.
template <class Op, class = void>
struct has_partial_exact : std::false_type {};
template <class Op>
struct has_partial_exact<Op, std::void_t<decltype(std::declval<const Op&>().partial_exact())>> : std::true_type {};

// `bool exact_widened() const`: the op on 16-bit floating inputs gives the
// bits of the same op on their float32 values, rounded once to the 16-bit
// output dtype, forward and backward (its kernels load 16-bit values into
// float, compute in float and round once on store, with no 16-bit
// intermediate). Bitwise mode then runs it widened when its pieces would be
// rounded before they are summed (DistCall::pends_in_16bit).
template <class Op, class = void>
struct has_exact_widened : std::false_type {};
template <class Op>
struct has_exact_widened<Op, std::void_t<decltype(std::declval<const Op&>().exact_widened())>> : std::true_type {};

// The op protocol's sharding rule: `ShardingPlan sharding(const ShardingContext&)`.
template <class Op, class = void>
struct has_sharding_rule : std::false_type {};
template <class Op>
struct has_sharding_rule<Op, std::void_t<decltype(std::declval<Op&>().sharding(std::declval<const ShardingContext&>()))>>
    : std::is_same<decltype(std::declval<Op&>().sharding(std::declval<const ShardingContext&>())), ShardingPlan> {};
// Any (non-overloaded) member named `sharding`: with has_sharding_rule, a
// member that is meant as the rule but has another signature is a compile
// error (call_distributed), not an op that silently replicates its inputs.
template <class Op, class = void>
struct has_sharding_member : std::false_type {};
template <class Op>
struct has_sharding_member<Op, std::void_t<decltype(&Op::sharding)>> : std::true_type {};

// Per-stage time of distributed dispatch (for `tessel bench dispatch`):
// measured only while enabled, per thread.
struct DispatchStats {
  double propagate_s = 0;    // Meta run + sharding rule + plan checks
  double redistribute_s = 0; // placing inputs (the redistribution decision, and any collective)
  double kernel_s = 0;       // the op's forward on the local pieces
  double wrap_s = 0;         // wrapping outputs and recording the node
  int64_t calls = 0;
};
DispatchStats& dispatch_stats();
bool& dispatch_profiling();  // off by default

// What the dispatcher keeps between its steps (non-template parts in dist_call.cc).
struct DistCall {
  ShardingContext ctx;
  MeshPtr mesh;
  std::vector<const Tensor*> inputs;  // the flattened tensor arguments (use hooks resolved)
  std::vector<Tensor> resolved;       // what use hooks returned (inputs point here); empty without hooks
  std::vector<Tensor> meta_in;        // Meta tensors of the global shapes
  std::vector<Tensor> placed;         // inputs after redistribution (distributed or undefined)
  std::vector<Tensor> local_in;       // their local pieces
  ShardingPlan plan;

  DistCall(const char* op, std::vector<const Tensor*> in);
  void set_outputs(const Tensor& meta_out);
  void set_outputs(const std::vector<Tensor>& meta_out);
  void finish_plan(bool has_rule);  // validates the plan (or builds the fallback)
  void place_inputs();              // redistribution (recorded when grad mode is on)
  // Bitwise mode: the plan leaves a pending sum (Partial) in a 16-bit
  // floating tensor -- an output, or (when recording) an input's gradient.
  // Each piece would be rounded to 16 bits before the pieces are summed,
  // which one device never does: such a call runs widened to float32
  // (call_widened) or is refused (refuse_16bit_pending_sum).
  bool pends_in_16bit() const;
  [[noreturn]] void refuse_16bit_pending_sum() const;
  // Bit m set: every defined input and output is Replicate on mesh dim m
  // (gradients pass through there as they come).
  uint32_t replicated_dims() const;
  // Calls found(is_output, index, mesh dim) for each pending sum the plan
  // leaves in a 16-bit tensor, until it returns true (defined in dist_call.cc).
  template <class F>
  void each_16bit_pending_sum(F&& found) const;
  Tensor wrap(const Tensor& local_out, size_t i) const;
  std::vector<Tensor> wrap(const std::vector<Tensor>& local_out) const;
};

// Gradient placements of one recorded distributed call.
struct DistGradInfo {
  MeshPtr mesh;
  const char* op = "";
  std::vector<Placements> in, out;  // forward placements
  std::vector<Dims> in_shape, out_shape;  // global
  std::vector<bool> in_defined;
  uint32_t passthrough = 0;  // mesh dims where everything is Replicate
  bool partial_exact = false;  // the backward only moves elements (has_partial_exact)

  // Local pieces of the output gradients in their dual placements; records
  // the pass-through mode per mesh dim for wrap_inputs.
  std::vector<Tensor> localize(std::vector<Tensor>& grads, Placements& mode) const;
  std::vector<Tensor> wrap_inputs(std::vector<Tensor>& local_grads, const Placements& mode) const;
};
DistGradInfo make_grad_info(const DistCall& c, const char* op);

template <class Op>
struct DistOpNode final : Node {
  std::optional<Op> op;
  const char* name_ = "";
  DistGradInfo info;
  const char* name() const override { return name_; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  void release_saved() override { op.reset(); }
};

// Argument i of the op, with tensors replaced by entries of `repl` in order.
template <class A>
auto map_arg(const A& a, const std::vector<Tensor>& repl, size_t& k) {
  if constexpr (std::is_same_v<A, Tensor>) {
    return Tensor(repl[k++]);
  } else if constexpr (std::is_same_v<A, std::vector<Tensor>>) {
    std::vector<Tensor> v;
    v.reserve(a.size());
    for (size_t i = 0; i < a.size(); ++i) v.push_back(repl[k++]);
    return v;
  } else {
    return std::cref(a);
  }
}

template <class T>
const T& unwrap_ref(const std::reference_wrapper<T>& r) { return r.get(); }
template <class T>
const T& unwrap_ref(const T& t) { return t; }

template <class Op, class... Args>
auto run_forward(Op& op, const std::vector<Tensor>& repl, const Args&... args) {
  size_t k = 0;
  auto mapped = std::tuple{map_arg(args, repl, k)...};  // braced init: left to right
  return std::apply([&](auto&... xs) { return op.forward(unwrap_ref(xs)...); }, mapped);
}

inline void collect(std::vector<const Tensor*>& out, const Tensor& t) { out.push_back(&t); }
inline void collect(std::vector<const Tensor*>& out, const std::vector<Tensor>& v) {
  for (const auto& t : v) out.push_back(&t);
}
template <class T>
inline void collect(std::vector<const Tensor*>&, const T&) {}

void connect(Node& node, const std::vector<const Tensor*>& inputs);
void set_history(const Tensor& out, const std::shared_ptr<Node>& node, uint32_t output_nr);
std::vector<bool> needs_from_edges(const Node& node);
[[noreturn]] void rethrow_saved_error(const char* op, const SavedTensorError& e);
void log_replicated_fallback(const char* op);

double now_seconds();

// Anomaly detection (autograd/anomaly.h): an op's outputs and inputs.
inline void collect_outputs(std::vector<const Tensor*>& v, const Tensor& out) { v.push_back(&out); }
inline void collect_outputs(std::vector<const Tensor*>& v, const std::vector<Tensor>& out) {
  for (const Tensor& t : out) v.push_back(&t);
}
template <class Out, class... Args>
void check_anomaly(const char* name, const Out& out, const Args&... args) {
  std::vector<const Tensor*> inputs, outputs;
  (collect(inputs, args), ...);
  collect_outputs(outputs, out);
  anomaly::check_forward(name, inputs, outputs);
}

// Op tracing (autograd/trace.h): the outputs of a forward op.
template <class Out>
void trace_outputs(const char* name, const Out& out) {
  if (trace::current() == nullptr) return;
  if constexpr (std::is_same_v<Out, Tensor>) {
    trace::forward_output(name, 0, out);
  } else if constexpr (std::is_same_v<Out, std::vector<Tensor>>) {
    for (size_t i = 0; i < out.size(); ++i) trace::forward_output(name, int(i), out[i]);
  }
}

Tensor widen_16bit(const Tensor& t);  // a 16-bit floating tensor as float32 (differentiable); else t
Tensor round_to(const Tensor& t, const TensorSpec& s);  // t cast to s's dtype when they differ

// What an op's forward returns: Tensor or std::vector<Tensor>.
template <class Op, class... Args>
using ForwardResult = std::decay_t<decltype(std::declval<Op&>().forward(std::declval<const Args&>()...))>;

template <class Op, class... Args>
ForwardResult<Op, Args...> call_distributed(const char* name, Op op, const Args&... args);

// The op on the float32 values of its 16-bit inputs, its outputs rounded to
// their 16-bit dtypes afterwards: the rounding (a narrowing cast) reduces a
// pending sum first, and the widening casts' backward rounds each input's
// gradient once it is complete. Same bits as the 16-bit op on one device
// (has_exact_widened).
template <class Op, class... Args>
ForwardResult<Op, Args...> call_widened(const char* name, Op op, const DistCall& c, const Args&... args) {
  std::vector<Tensor> wide;
  wide.reserve(c.inputs.size());
  for (const Tensor* t : c.inputs) wide.push_back(widen_16bit(*t));
  size_t k = 0;
  auto mapped = std::tuple{map_arg(args, wide, k)...};
  auto out = std::apply([&](auto&... xs) { return call_distributed(name, std::move(op), unwrap_ref(xs)...); }, mapped);
  if constexpr (std::is_same_v<ForwardResult<Op, Args...>, Tensor>) {
    return round_to(out, c.ctx.out[0]);
  } else {
    for (size_t i = 0; i < out.size(); ++i) out[i] = round_to(out[i], c.ctx.out[i]);
    return out;
  }
}

template <class Op, class... Args>
ForwardResult<Op, Args...> call_distributed(const char* name, Op op, const Args&... args) {
  static_assert(!has_sharding_member<Op>::value || has_sharding_rule<Op>::value,
                "this op has a member named `sharding` that is not a sharding rule: it must be "
                "`ShardingPlan sharding(const ShardingContext& ctx)` (dtensor/sharding.h); as written the op "
                "would replicate its inputs on every mesh");
  const bool prof = dispatch_profiling();
  double t0 = prof ? now_seconds() : 0, t1 = 0, t2 = 0, t3 = 0;
  std::vector<const Tensor*> inputs;
  (collect(inputs, args), ...);
  DistCall c(name, std::move(inputs));
  {
    NoGradGuard ng;
    cost::Pause not_the_step;  // global shapes: not this rank's work or memory (runtime/cost.h)
    Op meta_op = op;
    c.set_outputs(run_forward(meta_op, c.meta_in, args...));
  }
  std::optional<Op> unplanned;  // the op before its sharding rule localised it, for call_widened
  if constexpr (has_exact_widened<Op>::value) {
    if (numerics::bitwise()) unplanned.emplace(op);
  }
  if constexpr (has_sharding_rule<Op>::value) {
    c.plan = op.sharding(c.ctx);
    c.finish_plan(true);
  } else {
    log_replicated_fallback(name);
    c.finish_plan(false);
  }
  if (numerics::bitwise() && c.pends_in_16bit()) {
    if constexpr (has_exact_widened<Op>::value) {
      if (unplanned->exact_widened()) return call_widened(name, std::move(*unplanned), c, args...);
    }
    c.refuse_16bit_pending_sum();
  }
  if (prof) t1 = now_seconds();
  c.place_inputs();
  if (prof) t2 = now_seconds();
  using Out = std::decay_t<decltype(op.forward(args...))>;
  std::optional<Out> local_out;
  {
    NoGradGuard ng;
    try {
      local_out.emplace(run_forward(op, c.local_in, args...));
    } catch (const OutOfMemoryError& e) {
      e.rethrow_in(name);  // the message names the op that asked
    }
  }
  if (prof) t3 = now_seconds();
  Out out;
  if constexpr (std::is_same_v<Out, Tensor>) out = c.wrap(*local_out, 0);
  else out = c.wrap(*local_out);
  bool record = false;
  if (GradMode::is_enabled()) {
    for (const Tensor& t : c.placed)
      if (t.defined() && t.requires_grad()) record = true;
  }
  if (record) {
    auto node = std::make_shared<DistOpNode<Op>>();
    std::vector<const Tensor*> placed;
    for (const Tensor& t : c.placed) placed.push_back(&t);
    connect(*node, placed);
    node->name_ = name;
    node->info = make_grad_info(c, name);
    if (TESSEL_UNLIKELY(anomaly::enabled())) node->forward_module = anomaly::module_path();
    if constexpr (has_partial_exact<Op>::value) node->info.partial_exact = op.partial_exact();
    node->op.emplace(std::move(op));
    if constexpr (std::is_same_v<Out, Tensor>) {
      set_history(out, node, 0);
      node->num_outputs = 1;
    } else {
      for (size_t i = 0; i < out.size(); ++i) set_history(out[i], node, uint32_t(i));
      node->num_outputs = uint32_t(out.size());
    }
  }
  if (prof) {
    DispatchStats& s = dispatch_stats();
    s.propagate_s += t1 - t0;
    s.redistribute_s += t2 - t1;
    s.kernel_s += t3 - t2;
    s.wrap_s += now_seconds() - t3;
    ++s.calls;
  }
  if (TESSEL_UNLIKELY(anomaly::enabled())) check_anomaly(name, out, args...);
  trace_outputs(name, out);
  return out;
}

template <class Op>
std::vector<Tensor> DistOpNode<Op>::apply(std::vector<Tensor>&& grads) {
  if (!op) {
    throw SavedTensorError(std::string(name_) +
                           ": backward through a graph whose saved tensors were already freed; "
                           "call backward(..., retain_graph=true) the first time");
  }
  Placements mode;
  std::vector<Tensor> local = info.localize(grads, mode);
  GradContext ctx(needs_from_edges(*this));
  std::vector<Tensor> local_grads;
  try {
    local_grads = op->backward(ctx, local);
  } catch (const SavedTensorError& e) {
    rethrow_saved_error(name_, e);
  }
  return info.wrap_inputs(local_grads, mode);
}

}  // namespace detail
}  // namespace tessel
