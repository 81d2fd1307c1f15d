#include "nn/recompute.h"

#include <memory>

#include "autograd/api.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "dtensor/dist_call.h"
#include "nn/attention.h"
#include "nn/container.h"
#include "nn/context.h"
#include "nn/staged.h"
#include "runtime/error.h"

namespace tessel::nn {
namespace {

std::string layout_of(const Tensor& t) {
  std::string s = t.shape().str() + " " + dtype_name(t.dtype());
  if (t.is_distributed()) s += " " + t.placements().str();
  return s;
}

// The backward of a recomputed piece: replays it, then backpropagates
// through the replay. Edges: the inputs, then the parameters.
struct RecomputeNode final : Node {
  std::string who;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  std::vector<SavedTensor> inputs;  // values and versions at the forward
  std::vector<bool> input_requires_grad;
  std::vector<Tensor> params;
  std::vector<uint32_t> param_versions;
  ForwardContext context;
  std::string out_layout;

  const char* name() const override { return "recompute"; }
  void release_saved() override {
    inputs.clear();
    params.clear();
    fn = nullptr;
  }

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    std::vector<Tensor> out(next_edges.size());
    if (!grads[0].defined()) return out;
    TESSEL_CHECK(fn != nullptr, "recompute",
                 "'{}': backward through a recomputed piece whose graph was already freed; call backward(..., "
                 "retain_graph=true) the first time",
                 who);
    std::vector<Tensor> xs;
    for (size_t i = 0; i < inputs.size(); ++i) {
      Tensor x;
      try {
        x = inputs[i].get().detach();
      } catch (const SavedTensorError& e) {
        TESSEL_FAIL("recompute", "'{}': input {} of the recomputed piece: {}", who, i, e.what());
      }
      if (input_requires_grad[i]) x.requires_grad_(true);
      xs.push_back(x);
    }
    for (size_t i = 0; i < params.size(); ++i)
      TESSEL_CHECK(params[i].version() == param_versions[i], "recompute",
                   "'{}': parameter {} ({}) was changed in place between the forward and the backward (version {} "
                   "then, {} now): the replay would compute other values",
                   who, i, params[i].desc(), param_versions[i], params[i].version());
    Tensor y;
    {
      EnableGradGuard grad_on;
      ForwardScope scope(context);
      y = fn(xs);
    }
    TESSEL_CHECK(layout_of(y) == out_layout, "recompute",
                 "'{}': the replay's output is {} but the forward's was {}: the piece does not compute the same "
                 "thing twice",
                 who, layout_of(y), out_layout);
    // Gradients for every input and parameter that has an edge.
    std::vector<Tensor> wrt;
    std::vector<size_t> slot;
    for (size_t i = 0; i < xs.size(); ++i)
      if (next_edges[i].valid()) wrt.push_back(xs[i]), slot.push_back(i);
    for (size_t i = 0; i < params.size(); ++i)
      if (next_edges[xs.size() + i].valid()) wrt.push_back(params[i]), slot.push_back(xs.size() + i);
    if (wrt.empty()) return out;
    std::vector<Tensor> g = autograd::grad({y}, wrt, {grads[0]});
    for (size_t i = 0; i < g.size(); ++i) out[slot[i]] = g[i];
    return out;
  }
};

}  // namespace

Recompute parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::None;
  if (name == "selective") return Recompute::Selective;
  if (name == "full") return Recompute::Full;
  TESSEL_FAIL("recompute", "unknown policy '{}' (none, selective, full)", name);
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::None: return "none";
    case Recompute::Selective: return "selective";
    case Recompute::Full: return "full";
  }
  return "?";
}

Tensor recompute(const std::string& who, const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                 const std::vector<Tensor>& inputs, const std::vector<Tensor>& params) {
  bool needs_grad = false;
  if (GradMode::is_enabled()) {
    for (const Tensor& t : inputs) needs_grad = needs_grad || (t.defined() && t.requires_grad());
    for (const Tensor& p : params) needs_grad = needs_grad || (p.defined() && p.requires_grad());
  }
  if (!needs_grad) return fn(inputs);  // nothing to keep either way
  for (const Tensor& p : params)
    TESSEL_CHECK(!(p.is_distributed() && p.impl()->dist->on_use), "recompute",
                 "'{}': parameter {} is gathered by FSDP (ZeRO-3), whose module hooks a replay would run out of "
                 "order; use recompute with zero <= 2",
                 who, p.desc());
  auto node = std::make_shared<RecomputeNode>();
  node->who = who;
  node->fn = fn;
  node->context = forward_context();
  Tensor y;
  {
    NoGradGuard no_grad;
    y = fn(inputs);
  }
  for (const Tensor& x : inputs) {
    TESSEL_CHECK(!y.shares_storage(x), "recompute",
                 "'{}': the output shares memory with an input ({}), so there is nothing to recompute and its "
                 "history could not be kept apart: do not mark this piece",
                 who, x.desc());
    node->inputs.emplace_back(x);
    node->input_requires_grad.push_back(x.requires_grad());
  }
  for (const Tensor& p : params) {
    node->params.push_back(p);
    node->param_versions.push_back(p.version());
  }
  node->out_layout = layout_of(y);
  std::vector<const Tensor*> edges;
  for (const Tensor& x : inputs) edges.push_back(&x);
  for (const Tensor& p : params) edges.push_back(&p);
  detail::connect(*node, edges);
  node->num_outputs = 1;
  detail::set_history(y, node, 0);
  return y;
}

void UnaryModule::set_recompute(bool on) {
  TESSEL_CHECK(!on || !compiled(), "recompute",
               "'{}' is compiled (mixed mode, set_compiled): a module is either recomputed or compiled, not both",
               path().empty() ? type_name() : path());
  recompute_ = on;
}

Tensor UnaryModule::call_recomputed(const Tensor& x) {
  std::vector<Tensor> params;
  for (const auto& nt : named_parameters()) params.push_back(nt.tensor);
  return nn::recompute(
      path().empty() ? type_name() : path(),
      [this](const std::vector<Tensor>& in) {
        return call_eager(in[0]);
      },
      {x}, params);
}

int apply_recompute(Module& model, Recompute policy) {
  auto* staged = dynamic_cast<StagedModel*>(&model);
  TESSEL_CHECK(policy != Recompute::Full || staged, "recompute",
               "recompute = full marks the blocks of an nn::StagedModel, and {} is not one: mark your own modules "
               "with UnaryModule::set_recompute(true)",
               model.type_name());
  int marked = 0;
  if (staged)
    for (const auto& block : staged->blocks()) {
      block->set_recompute(policy == Recompute::Full);
      marked += policy == Recompute::Full;
    }
  for (const auto& [path, m] : model.named_modules())
    if (auto* attn = dynamic_cast<Attention*>(m)) {
      attn->set_recompute_core(policy == Recompute::Selective);
      marked += policy == Recompute::Selective;
    }
  return marked;
}

}  // namespace tessel::nn
