#include "nn/optim.h"

#include <cmath>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "autograd/anomaly.h"
#include "autograd/api.h"
#include "autograd/autograd_meta.h"
#include "dtensor/ops.h"
#include "kernels/optim.h"

namespace tessel::nn {

std::vector<NamedTensor> index_named(const std::vector<Tensor>& params, const std::string& prefix) {
  std::vector<NamedTensor> out;
  out.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) out.push_back({prefix + std::to_string(i), params[i]});
  return out;
}

std::vector<ParamGroup> default_param_groups(const Module& module, double weight_decay) {
  TESSEL_CHECK(std::isfinite(weight_decay) && weight_decay >= 0, "default_param_groups",
               "invalid weight_decay = {} (must be a finite number >= 0)", weight_decay);
  ParamGroup decay, no_decay;
  decay.name = "decay";
  decay.weight_decay = weight_decay;
  no_decay.name = "no_decay";
  no_decay.weight_decay = 0.0;
  std::unordered_set<const TensorImpl*> seen;  // tied parameters: the first path wins
  for (const auto& [path, slot] : module.parameter_slots()) {
    if (!seen.insert(slot->tensor->impl()).second) continue;
    (slot->weight_decay ? decay : no_decay).params.push_back({path, *slot->tensor});
  }
  return {decay, no_decay};
}

// ---- Optimizer -------------------------------------------------------------------------
namespace {
// A state buffer shaped like the parameter: for a distributed parameter, a
// distributed tensor with its placements (only the local piece is allocated).
Tensor state_zeros(const Tensor& param) {
  const TensorOptions o = TensorOptions(DType::Float32).with_device(param.device());
  return param.is_distributed() ? zeros(param.shape(), param.mesh(), param.placements(), o) : zeros(param.shape(), o);
}
}  // namespace

void Optimizer::fail_option(const char* option, double value, const char* requirement) const {
  TESSEL_FAIL(name_, "invalid {} = {} ({})", option, value, requirement);
}

void Optimizer::check_nonnegative(const char* option, double value) const {
  if (!(std::isfinite(value) && value >= 0)) fail_option(option, value, "must be a finite number >= 0");
}

static std::string group_label(const ParamGroup& g, size_t i) {
  return g.name.empty() ? fmt::format(FMT_STRING("group {}"), i) : fmt::format(FMT_STRING("group {} ('{}')"), i, g.name);
}

Optimizer::Optimizer(std::string name, std::vector<ParamGroup> groups, double lr, double default_weight_decay)
    : name_(std::move(name)), groups_(std::move(groups)), lr_(0) {
  set_lr(lr);
  check_nonnegative("weight_decay", default_weight_decay);
  std::unordered_map<const TensorImpl*, std::string> seen_impl;  // -> where it was seen
  std::unordered_map<std::string, size_t> seen_path;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const ParamGroup& g = groups_[gi];
    const std::string where = group_label(g, gi);
    if (!(std::isfinite(g.lr_scale) && g.lr_scale >= 0))
      TESSEL_FAIL(name_, "invalid lr_scale = {} in {} (must be a finite number >= 0)", g.lr_scale, where);
    const double wd = g.weight_decay.value_or(default_weight_decay);
    if (!(std::isfinite(wd) && wd >= 0))
      TESSEL_FAIL(name_, "invalid weight_decay = {} in {} (must be a finite number >= 0)", wd, where);
    group_weight_decay_.push_back(wd);
    for (const NamedTensor& nt : g.params) {
      const Tensor& p = nt.tensor;
      TESSEL_CHECK(p.defined(), name_, "parameter '{}' in {} is undefined", nt.name, where);
      TESSEL_CHECK(p.is_floating_point(), name_,
                   "parameter '{}' has dtype {}; optimizers update floating-point parameters", nt.name,
                   dtype_name(p.dtype()));
      TESSEL_CHECK(p.dtype() == DType::Float32, name_,
                   "parameter '{}' has dtype {}; the fused updates keep float32 master weights", nt.name,
                   dtype_name(p.dtype()));
      TESSEL_CHECK(p.requires_grad(), name_, "parameter '{}' does not require grad", nt.name);
      check_not_replaced(nt.name, p);
      auto [it, fresh] = seen_impl.emplace(p.impl(), fmt::format(FMT_STRING("'{}' in {}"), nt.name, where));
      TESSEL_CHECK(fresh, name_, "a parameter appears twice: as {} and as '{}' in {}", it->second, nt.name, where);
      auto [pit, pfresh] = seen_path.emplace(nt.name, gi);
      TESSEL_CHECK(pfresh, name_, "two parameters share the path '{}' ({} and {})", nt.name,
                   group_label(groups_[pit->second], pit->second), where);
      Slot s;
      s.path = nt.name;
      s.param = p;
      s.group = int(gi);
      slots_.push_back(std::move(s));
    }
  }
  TESSEL_CHECK(!slots_.empty(), name_, "got an empty parameter list");
}

void Optimizer::set_lr(double lr) {
  if (!(std::isfinite(lr) && lr >= 0)) fail_option("lr", lr, "must be a finite number >= 0");
  lr_ = lr;
}

void Optimizer::check_not_replaced(const std::string& path, const Tensor& p) const {
  const AutogradMeta* m = autograd_meta(p);
  if (TESSEL_UNLIKELY(m != nullptr && m->replaced_by != nullptr)) {
    TESSEL_FAIL(name_,
                "parameter '{}' ({}) is no longer the model's: {} replaced it with its laid-out tensor, so updating "
                "it would change nothing the model uses. Build the optimizer after laying the model out (pass an "
                "OptimizerSpec to tessel::parallelize, or use run.optimizer())",
                path, p.desc(), m->replaced_by);
  }
}

void Optimizer::step() {
  try {
    step_slots();
  } catch (const OutOfMemoryError& e) {
    e.rethrow_during(name_ + ".step");
  }
}

void Optimizer::step_slots() {
  NoGradGuard no_grad;
  for (Slot& s : slots_) {
    check_not_replaced(s.path, s.param);
    const Tensor g = s.param.grad();
    if (!g.defined()) continue;  // unused this step
    if (TESSEL_UNLIKELY(g.device() != s.param.device() ||
                        !(g.dtype() == DType::Float32 || is_half(g.dtype())))) {
      TESSEL_FAIL(name_, "parameter '{}' ({}) has gradient {}; expected float32, bfloat16 or float16 on {}", s.path,
                  s.param.desc(), g.desc(), s.param.device().str());
    }
    // A distributed parameter is updated piece by piece: its gradient has its
    // placements (AccumulateGrad sees to it), its state is shaped like its piece.
    if (s.param.is_distributed()) {
      TESSEL_CHECK(g.is_distributed() && g.placements() == s.param.placements(), name_,
                   "parameter '{}' ({}) has gradient {} in another layout", s.path, s.param.desc(), g.desc());
    }
    // The update kernels take the pieces as they are (kernels/optim.h): a
    // gradient set by hand (set_grad checks the global shape only) may have
    // a piece of another shape, e.g. a sharded gradient of a plain parameter.
    TESSEL_CHECK(raw::local_of(g).shape() == raw::local_of(s.param).shape(), name_,
                 "parameter '{}' ({}) has gradient {}, whose local piece {} is not shaped like the parameter's {}",
                 s.path, s.param.desc(), g.desc(), raw::local_of(g).shape(), raw::local_of(s.param).shape());
    if (s.buffers.empty()) {
      for (size_t i = 0, n = buffer_names().size(); i < n; ++i) s.buffers.push_back(state_zeros(s.param));
    }
    ++s.step;
    // Anomaly detection: what was non-finite before the update, named if the update makes the parameter so.
    std::vector<std::pair<std::string, int64_t>> before;
    if (TESSEL_UNLIKELY(anomaly::enabled())) {
      before.emplace_back("gradient", anomaly::count_nonfinite(g));
      before.emplace_back("parameter", anomaly::count_nonfinite(s.param));
      const std::vector<std::string> names = buffer_names();
      for (size_t i = 0; i < names.size(); ++i) before.emplace_back(names[i], anomaly::count_nonfinite(s.buffers[i]));
    }
    update(s, g, lr_ * groups_[size_t(s.group)].lr_scale, group_weight_decay_[size_t(s.group)]);
    s.param.bump_version();
    if (TESSEL_UNLIKELY(anomaly::enabled())) anomaly::check_update(name_, s.path, s.param, before);
  }
  ++num_steps_;
}

void Optimizer::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (Slot& s : slots_) {
    if (set_to_none) {
      s.param.zero_grad();
    } else if (Tensor g = s.param.grad(); g.defined()) {
      g.zero_();
    }
  }
}

std::vector<NamedTensor> Optimizer::state_dict() const {
  const std::vector<std::string> names = buffer_names();
  std::vector<NamedTensor> out;
  out.push_back({"step", scalar_tensor(num_steps_, DType::Int64)});
  for (const Slot& s : slots_) {
    if (s.step == 0 && s.buffers.empty()) continue;
    out.push_back({s.path + ".step", scalar_tensor(s.step, DType::Int64)});
    for (size_t i = 0; i < s.buffers.size(); ++i) out.push_back({s.path + "." + names[i], s.buffers[i]});
  }
  return out;
}

int64_t Optimizer::state_bytes() const {
  const int64_t per_element = int64_t(buffer_names().size()) * int64_t(itemsize(DType::Float32));
  int64_t n = 0;
  for (const Slot& s : slots_) n += raw::local_of(s.param).numel() * per_element;
  return n;
}

Optimizer::ParsedState Optimizer::parse_state(const std::vector<NamedTensor>& state) const {
  const std::vector<std::string> names = buffer_names();
  std::unordered_map<std::string, size_t> slot_of;
  for (size_t i = 0; i < slots_.size(); ++i) slot_of[slots_[i].path] = i;

  // Sort every key into (slot, field); throw at the first key that does not fit.
  ParsedState parsed;
  auto check_step = [&](const std::string& key, const Tensor& t) {
    TESSEL_CHECK(t.defined() && t.numel() == 1 && !t.is_floating_point() && t.dtype() != DType::Bool, name_,
                 "load_state_dict: '{}' must be one integer, got {}", key, t.defined() ? t.desc() : "undefined");
    TESSEL_CHECK(t.item<int64_t>() >= 0, name_, "load_state_dict: '{}' is negative ({})", key, t.item<int64_t>());
  };
  for (const NamedTensor& nt : state) {
    if (nt.name == "step") {
      check_step(nt.name, nt.tensor);
      parsed.global_step = &nt.tensor;
      continue;
    }
    const size_t dot = nt.name.rfind('.');
    auto it = dot == std::string::npos ? slot_of.end() : slot_of.find(nt.name.substr(0, dot));
    TESSEL_CHECK(it != slot_of.end(), name_, "load_state_dict: unexpected key '{}' (no such parameter)", nt.name);
    const std::string field = nt.name.substr(dot + 1);
    ParsedState::Incoming& in = parsed.incoming[it->second];
    in.buffers.resize(names.size(), nullptr);
    if (field == "step") {
      check_step(nt.name, nt.tensor);
      in.step = &nt.tensor;
      continue;
    }
    size_t b = 0;
    while (b < names.size() && names[b] != field) ++b;
    TESSEL_CHECK(b < names.size(), name_, "load_state_dict: unexpected key '{}' (this optimizer keeps [{}])",
                 nt.name, fmt::join(names, ", "));
    const Slot& s = slots_[it->second];
    TESSEL_CHECK(nt.tensor.defined() && nt.tensor.shape() == s.param.shape(), name_,
                 "load_state_dict: '{}' is {} but parameter '{}' is {}", nt.name,
                 nt.tensor.defined() ? nt.tensor.desc() : "undefined", s.path, s.param.desc());
    in.buffers[b] = &nt.tensor;
  }
  for (const auto& [i, in] : parsed.incoming) {
    TESSEL_CHECK(in.step != nullptr, name_, "load_state_dict: missing key '{}.step'", slots_[i].path);
    for (size_t b = 0; b < names.size(); ++b)
      TESSEL_CHECK(in.buffers[b] != nullptr, name_, "load_state_dict: missing key '{}.{}'", slots_[i].path,
                   names[b]);
  }
  return parsed;
}

void Optimizer::check_state_dict(const std::vector<NamedTensor>& state) const { (void)parse_state(state); }

void Optimizer::load_state_dict(const std::vector<NamedTensor>& state) {
  const ParsedState parsed = parse_state(state);  // nothing is written unless everything checks
  const size_t n_buffers = buffer_names().size();
  NoGradGuard no_grad;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    auto it = parsed.incoming.find(i);
    if (it == parsed.incoming.end()) {  // fresh state
      s.step = 0;
      s.buffers.clear();
      continue;
    }
    s.step = it->second.step->item<int64_t>();
    if (s.buffers.size() != n_buffers) {
      s.buffers.clear();
      for (size_t b = 0; b < n_buffers; ++b) s.buffers.push_back(state_zeros(s.param));
    }
    for (size_t b = 0; b < n_buffers; ++b) s.buffers[b].copy_(*it->second.buffers[b]);
  }
  num_steps_ = parsed.global_step ? parsed.global_step->item<int64_t>() : 0;
}

// ---- SGD -------------------------------------------------------------------------------
SGD::SGD(std::vector<ParamGroup> groups, SGDOptions options)
    : Optimizer("SGD", std::move(groups), options.lr, options.weight_decay), opts_(options) {
  check_nonnegative("momentum", opts_.momentum);
  if (!(std::isfinite(opts_.dampening) && opts_.dampening >= 0 && opts_.dampening <= 1))
    fail_option("dampening", opts_.dampening, "must be in [0, 1]");
  if (opts_.nesterov && !(opts_.momentum > 0 && opts_.dampening == 0))
    TESSEL_FAIL(name_, "invalid nesterov = true with momentum = {} and dampening = {} (nesterov needs momentum > 0 "
                "and dampening = 0)", opts_.momentum, opts_.dampening);
}

SGD::SGD(const std::vector<NamedTensor>& params, SGDOptions options)
    : SGD(std::vector<ParamGroup>{ParamGroup{params, std::nullopt, 1.0, ""}}, options) {}

SGD::SGD(const std::vector<Tensor>& params, SGDOptions options) : SGD(index_named(params), options) {}

std::vector<std::string> SGD::buffer_names() const {
  if (opts_.momentum == 0) return {};
  return {"momentum_buffer"};
}

void SGD::update(Slot& slot, const Tensor& grad, double lr, double weight_decay) {
  // PyTorch starts the momentum buffer at the first update's d (buf = d).
  // Buffers are created zero-filled with the state; the first update of a
  // parameter (step 1, nothing loaded) initialises it.
  const bool first = slot.step == 1;
  const kernels::SGDScalars s =
      kernels::sgd_scalars(lr, opts_.momentum, opts_.dampening, weight_decay, opts_.nesterov, first);
  kernels::sgd_step(slot.param.device(), raw::local_of(slot.param), raw::local_of(grad),
                    s.use_momentum ? raw::local_of(slot.buffers[0]) : Tensor(), s);
}

// ---- AdamW -----------------------------------------------------------------------------
AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions options)
    : Optimizer("AdamW", std::move(groups), options.lr, options.weight_decay), opts_(options) {
  if (!(opts_.betas[0] >= 0 && opts_.betas[0] < 1)) fail_option("betas[0]", opts_.betas[0], "must be in [0, 1)");
  if (!(opts_.betas[1] >= 0 && opts_.betas[1] < 1)) fail_option("betas[1]", opts_.betas[1], "must be in [0, 1)");
  if (!(std::isfinite(opts_.eps) && opts_.eps > 0)) fail_option("eps", opts_.eps, "must be a finite number > 0");
}

AdamW::AdamW(const std::vector<NamedTensor>& params, AdamWOptions options)
    : AdamW(std::vector<ParamGroup>{ParamGroup{params, std::nullopt, 1.0, ""}}, options) {}

AdamW::AdamW(const std::vector<Tensor>& params, AdamWOptions options) : AdamW(index_named(params), options) {}

std::vector<std::string> AdamW::buffer_names() const { return {"exp_avg", "exp_avg_sq"}; }

void AdamW::update(Slot& slot, const Tensor& grad, double lr, double weight_decay) {
  const kernels::AdamWScalars s =
      kernels::adamw_scalars(lr, opts_.betas[0], opts_.betas[1], opts_.eps, weight_decay, slot.step);
  kernels::adamw_step(slot.param.device(), raw::local_of(slot.param), raw::local_of(grad),
                      raw::local_of(slot.buffers[0]), raw::local_of(slot.buffers[1]), s);
}

}  // namespace tessel::nn
