#include "nn/module.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

#include "autograd/api.h"
#include "dtensor/ops.h"

namespace tessel::nn {

// ---- construction scope ------------------------------------------------------------
namespace {
thread_local Device t_device = kCPU;
thread_local DType t_dtype = DType::Float32;
}  // namespace

ConstructionScope::ConstructionScope(Device device, DType dtype) : prev_device_(t_device), prev_dtype_(t_dtype) {
  t_device = device;
  t_dtype = dtype;
}
ConstructionScope::~ConstructionScope() {
  t_device = prev_device_;
  t_dtype = prev_dtype_;
}
Device ConstructionScope::device() { return t_device; }
DType ConstructionScope::dtype() { return t_dtype; }

PhiloxKey parameter_key(uint64_t seed, const std::string& path) { return PhiloxKey{seed, stream_for(path)}; }

// ---- registration --------------------------------------------------------------------
void Module::check_name(const std::string& name) const {
  TESSEL_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name_,
               "invalid member name '{}' (non-empty, no dots)", name);
  for (const auto& p : params_) TESSEL_CHECK(p.name != name, type_name_, "'{}' is already registered", name);
  for (const auto& b : buffers_) TESSEL_CHECK(b.name != name, type_name_, "'{}' is already registered", name);
  for (const auto& c : children_) TESSEL_CHECK(c.first != name, type_name_, "'{}' is already registered", name);
}

Tensor& Module::param(const std::string& name, Tensor& slot, const Dims& shape, InitFn init, ParamOptions opts) {
  check_name(name);
  slot = empty(shape, TensorOptions(ConstructionScope::dtype()).with_device(ConstructionScope::device()));
  // NaN until reset_parameters or a load sets it: a model trained without
  // either gets a loud error (tessel::parallelize checks; a forward gives
  // NaN), never whatever the allocator's memory held.
  if (!slot.device().is_meta() && is_floating(slot.dtype())) slot.fill_(std::numeric_limits<double>::quiet_NaN());
  slot.requires_grad_(true);
  bool decay = opts.weight_decay < 0 ? shape.size() >= 2 : opts.weight_decay != 0;
  params_.push_back({name, &slot, std::move(init), decay});
  return slot;
}

Tensor& Module::buffer(const std::string& name, Tensor& slot, Tensor value, bool persistent) {
  check_name(name);
  slot = std::move(value);
  buffers_.push_back({name, &slot, persistent});
  return slot;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_name(name);
  TESSEL_CHECK(m != nullptr, type_name_, "submodule '{}' is null", name);
  TESSEL_CHECK(m->parent_ == nullptr, type_name_,
               "submodule '{}' ({}) already has a parent at '{}'; a module has one path (share tensors, not modules)",
               name, m->type_name_, m->path());
  for (const Module* a = this; a != nullptr; a = a->parent_)
    TESSEL_CHECK(a != m.get(), type_name_, "submodule '{}' would make a cycle (it is this module or an ancestor)", name);
  m->parent_ = this;
  m->clear_paths();  // recomputed from the new root on the next path() call
  children_.emplace_back(name, std::move(m));
}

Module::~Module() {
  for (auto& c : children_)
    if (c.second->parent_ == this) c.second->parent_ = nullptr;
}

// ---- paths ---------------------------------------------------------------------------------
const std::string& Module::path() const {
  if (!path_assigned_) const_cast<Module*>(this)->assign_paths();
  return path_;
}

void Module::assign_paths() {
  Module* root = this;
  while (root->parent_ != nullptr) root = root->parent_;
  root->assign_paths_from("");
}

void Module::assign_paths_from(const std::string& path) {
  path_ = path;
  path_assigned_ = true;
  for (auto& [name, child] : children_) child->assign_paths_from(path.empty() ? name : path + "." + name);
}

void Module::clear_paths() {
  path_assigned_ = false;
  path_.clear();
  for (auto& c : children_) c.second->clear_paths();
}

// ---- introspection ---------------------------------------------------------------------
static std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

void Module::collect_parameters(const std::string& prefix, bool recurse, std::vector<NamedTensor>& out) const {
  for (const auto& p : params_) out.push_back({join(prefix, p.name), *p.tensor});
  if (!recurse) return;
  for (const auto& [name, child] : children_) child->collect_parameters(join(prefix, name), true, out);
}

void Module::collect_slots(const std::string& prefix,
                           std::vector<std::pair<std::string, const ParameterSlot*>>& out) const {
  for (const auto& p : params_) out.emplace_back(join(prefix, p.name), &p);
  for (const auto& [name, child] : children_) child->collect_slots(join(prefix, name), out);
}

void Module::collect_buffer_slots(const std::string& prefix, bool recurse,
                                  std::vector<std::pair<std::string, const BufferSlot*>>& out) const {
  for (const auto& b : buffers_) out.emplace_back(join(prefix, b.name), &b);
  if (!recurse) return;
  for (const auto& [name, child] : children_) child->collect_buffer_slots(join(prefix, name), true, out);
}

void Module::collect_buffers(const std::string& prefix, bool recurse, bool only_persistent,
                             std::vector<NamedTensor>& out) const {
  for (const auto& b : buffers_)
    if (!only_persistent || b.persistent) out.push_back({join(prefix, b.name), *b.tensor});
  if (!recurse) return;
  for (const auto& [name, child] : children_) child->collect_buffers(join(prefix, name), true, only_persistent, out);
}

void Module::collect_modules(const std::string& prefix, std::vector<std::pair<std::string, Module*>>& out) const {
  out.emplace_back(prefix, const_cast<Module*>(this));
  for (const auto& [name, child] : children_) child->collect_modules(join(prefix, name), out);
}

std::vector<NamedTensor> Module::named_parameters(bool recurse) const {
  std::vector<NamedTensor> out;
  collect_parameters("", recurse, out);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& p : named_parameters(recurse)) out.push_back(p.tensor);
  return out;
}

std::vector<NamedTensor> Module::named_buffers(bool recurse) const {
  std::vector<NamedTensor> out;
  collect_buffers("", recurse, false, out);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() const {
  std::vector<std::pair<std::string, Module*>> out;
  collect_modules("", out);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const { return children_; }

std::vector<std::pair<std::string, const ParameterSlot*>> Module::parameter_slots() const {
  std::vector<std::pair<std::string, const ParameterSlot*>> out;
  collect_slots("", out);
  return out;
}

void Module::for_each_parameter_slot(FunctionRef<void(const ParameterSlot&)> fn) const {
  for (const auto& p : params_) fn(p);
  for (const auto& [name, child] : children_) child->for_each_parameter_slot(fn);
}

void Module::for_each_buffer_slot(FunctionRef<void(const BufferSlot&)> fn) const {
  for (const auto& b : buffers_) fn(b);
  for (const auto& [name, child] : children_) child->for_each_buffer_slot(fn);
}

std::vector<std::pair<std::string, const BufferSlot*>> Module::buffer_slots(bool recurse) const {
  std::vector<std::pair<std::string, const BufferSlot*>> out;
  collect_buffer_slots("", recurse, out);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : named_parameters()) n += p.tensor.numel();
  return n;
}

int Module::register_forward_pre_hook(ForwardPreHook hook) {
  pre_hooks_.emplace_back(next_hook_, std::move(hook));
  return next_hook_++;
}

int Module::register_forward_hook(ForwardHook hook) {
  post_hooks_.emplace_back(next_hook_, std::move(hook));
  return next_hook_++;
}

void Module::remove_forward_hook(int handle) {
  auto drop = [&](auto& v) {
    v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& h) { return h.first == handle; }), v.end());
  };
  drop(pre_hooks_);
  drop(post_hooks_);
}

Tensor Module::run_forward_pre_hooks(const Tensor& input) {
  Tensor x = input;
  for (auto& [h, fn] : pre_hooks_) x = fn(*this, x);
  return x;
}

Tensor Module::run_forward_hooks(const Tensor& input, const Tensor& output) {
  Tensor y = output;
  for (auto& [h, fn] : post_hooks_) y = fn(*this, input, y);
  return y;
}

Module& Module::submodule(const std::string& path) {
  if (path.empty()) return *this;
  size_t dot = path.find('.');
  std::string head = path.substr(0, dot);
  for (auto& [name, child] : children_) {
    if (name == head) return dot == std::string::npos ? *child : child->submodule(path.substr(dot + 1));
  }
  TESSEL_FAIL(type_name_, "no submodule '{}' (looking up '{}')", head, path);
}

// ---- state -------------------------------------------------------------------------------
void Module::train(bool on) {
  training_ = on;
  for (auto& c : children_) c.second->train(on);
}

std::vector<NamedTensor> Module::state_dict() const {
  std::vector<NamedTensor> out;
  collect_parameters("", true, out);
  collect_buffers("", true, true, out);
  return out;
}

void Module::load_state_dict(const std::vector<NamedTensor>& state, bool strict) {
  std::vector<NamedTensor> mine = state_dict();
  std::map<std::string, const Tensor*> given;
  for (const auto& s : state) given[s.name] = &s.tensor;
  std::vector<std::string> missing, unexpected;
  std::unordered_set<std::string> known;
  for (const auto& m : mine) {
    known.insert(m.name);
    if (!given.count(m.name)) missing.push_back(m.name);
  }
  for (const auto& s : state)
    if (!known.count(s.name)) unexpected.push_back(s.name);
  if (strict && (!missing.empty() || !unexpected.empty())) {
    TESSEL_FAIL("load_state_dict", "{} does not match: missing keys [{}], unexpected keys [{}]", type_name_,
                fmt::join(missing, ", "), fmt::join(unexpected, ", "));
  }
  // Check every shape first: nothing is written unless everything fits.
  for (const auto& m : mine) {
    auto it = given.find(m.name);
    if (it == given.end()) continue;
    TESSEL_CHECK(it->second->shape() == m.tensor.shape(), "load_state_dict",
                 "'{}' has shape {} in the model but {} in the state", m.name, m.tensor.shape(), it->second->shape());
  }
  NoGradGuard ng;
  for (auto& m : mine) {
    auto it = given.find(m.name);
    if (it != given.end()) const_cast<Tensor&>(m.tensor).copy_(*it->second);
  }
}

void Module::apply(const std::function<void(Module&, const std::string&)>& fn) {
  for (auto& [path, m] : named_modules()) fn(*m, path);
}

// ---- materialisation ------------------------------------------------------------------------
void Module::reset_parameters(uint64_t seed) {
  NoGradGuard ng;
  for (auto& [path, slot] : parameter_slots()) {
    TESSEL_CHECK(!slot->tensor->device().is_meta(), "reset_parameters",
                 "parameter '{}' is on the meta device; call materialize(device) first", path);
    const Tensor& t = *slot->tensor;
    if (t.is_distributed()) {  // the piece draws its slice of the full parameter's values
      slot->init(raw::local_of(t), parameter_key(seed, path), local_random_block(t));
      t.bump_version();
    } else {
      slot->init(t, parameter_key(seed, path), GlobalBlock{});
    }
  }
}

void Module::set_init(const std::string& param_path, InitFn init) {
  size_t dot = param_path.rfind('.');
  Module& owner = dot == std::string::npos ? *this : submodule(param_path.substr(0, dot));
  std::string name = dot == std::string::npos ? param_path : param_path.substr(dot + 1);
  for (auto& p : owner.params_) {
    if (p.name == name) {
      TESSEL_CHECK(init != nullptr, "set_init", "null init for '{}'", param_path);
      p.init = std::move(init);
      return;
    }
  }
  TESSEL_FAIL("set_init", "{} has no parameter '{}'", owner.type_name_, param_path);
}

void Module::materialize(Device device) {
  for (auto& [path, m] : named_modules()) {
    for (auto& p : m->params_) {
      Tensor& t = *p.tensor;
      if (!t.device().is_meta()) continue;
      TensorOptions o = TensorOptions(t.dtype()).with_device(device);
      t = t.is_distributed() ? empty(t.shape(), t.mesh(), t.placements(), o) : empty(t.shape(), o);
      t.requires_grad_(true);
    }
    for (auto& b : m->buffers_) {
      Tensor& t = *b.tensor;
      if (t.defined() && t.device().is_meta()) t = empty(t.shape(), TensorOptions(t.dtype()).with_device(device));
    }
    m->init_buffers();
  }
}

void Module::to(DType dtype) {
  NoGradGuard ng;
  for (auto& [path, m] : named_modules()) {
    for (auto& p : m->params_) {
      Tensor& t = *p.tensor;
      if (!is_floating(t.dtype()) || t.dtype() == dtype) continue;
      t = t.to(dtype).detach();
      t.requires_grad_(true);
    }
    for (auto& b : m->buffers_) {
      Tensor& t = *b.tensor;
      if (t.defined() && is_floating(t.dtype()) && t.dtype() != dtype) t = t.to(dtype);
    }
  }
}

void Module::zero_grad() {
  for (auto& p : named_parameters()) p.tensor.zero_grad();
}

std::string Module::describe(int indent) const {
  std::string pad(size_t(indent) * 2, ' ');
  std::string s = type_name_ + "(" + extra_repr();
  bool first = s.back() == '(';
  for (const auto& p : params_) {
    s += fmt::format(FMT_STRING("{}{}={}"), first ? "" : ", ", p.name, p.tensor->shape().str());
    first = false;
  }
  s += ")";
  for (const auto& [name, child] : children_) s += "\n" + pad + "  (" + name + "): " + child->describe(indent + 1);
  return s;
}

// ---- init functions ----------------------------------------------------------------------------
namespace init {
InitFn zeros() {
  return [](const Tensor& t, PhiloxKey, const GlobalBlock&) { zeros_(t); };
}
InitFn ones() {
  return [](const Tensor& t, PhiloxKey, const GlobalBlock&) { ones_(t); };
}
InitFn constant(double v) {
  return [v](const Tensor& t, PhiloxKey, const GlobalBlock&) { constant_(t, v); };
}
InitFn normal(double mean, double std) {
  return [=](const Tensor& t, PhiloxKey k, const GlobalBlock& b) { normal_(t, k, mean, std, b); };
}
InitFn uniform(double lo, double hi) {
  return [=](const Tensor& t, PhiloxKey k, const GlobalBlock& b) { uniform_(t, k, lo, hi, b); };
}
InitFn trunc_normal(double mean, double std, double a, double b) {
  return [=](const Tensor& t, PhiloxKey k, const GlobalBlock& blk) { trunc_normal_(t, k, mean, std, a, b, blk); };
}
InitFn kaiming_uniform(double a) {
  return [=](const Tensor& t, PhiloxKey k, const GlobalBlock& b) {
    kaiming_uniform_(t, k, a, FanMode::FanIn, Nonlinearity::LeakyRelu, b);
  };
}
InitFn xavier_uniform(double gain) {
  return [=](const Tensor& t, PhiloxKey k, const GlobalBlock& b) { xavier_uniform_(t, k, gain, b); };
}
InitFn uniform_fan_in(int64_t fan_in) {
  TESSEL_CHECK(fan_in > 0, "init::uniform_fan_in", "fan_in must be positive, got {}", fan_in);
  const double bound = 1.0 / std::sqrt(double(fan_in));
  return uniform(-bound, bound);
}
}  // namespace init

}  // namespace tessel::nn
