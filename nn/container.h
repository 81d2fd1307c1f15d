#pragma once
// UnaryModule (a module with Tensor forward(const Tensor&)), ModuleList and
// Sequential.
#include <cstddef>
#include <memory>
#include <vector>

#include "autograd/anomaly.h"
#include "nn/compiled_module.h"
#include "nn/module.h"
#include "runtime/macros.h"

namespace tessel::nn {

class CompiledModule;  // nn/compiled_module.cc

// A module mapping one tensor to one tensor: what Sequential chains.
class UnaryModule : public Module {
 public:
  using Module::Module;
  virtual Tensor forward(const Tensor& x) = 0;
  // forward(x) with the forward hooks around it (call submodules this way).
  Tensor operator()(const Tensor& x) {
    if (TESSEL_UNLIKELY(recompute_)) return call_recomputed(x);
    if (TESSEL_UNLIKELY(compiled_ != nullptr)) return call_compiled(x);
    return call_eager(x);
  }

  // Activation recomputation of this module's calls (nn/recompute.h):
  // operator() keeps only its input and its backward runs the call again,
  // hooks included. nn::apply_recompute sets it on a model's blocks.
  // (Not with set_compiled on the same module: an error.)
  void set_recompute(bool on);
  bool recompute() const { return recompute_; }

  // Mixed mode (nn/compiled_module.h): this module's training calls are
  // recorded and replayed, forward and backward, while the rest of the step
  // runs eagerly. nn::apply_compile_modules sets it on blocks or attention
  // layers. Turning it off (or on again) drops the recordings.
  void set_compiled(bool on);  // nn/compiled_module.cc
  bool compiled() const { return compiled_ != nullptr; }
  // What mixed mode did for this module (zeros when not compiled).
  ModuleCompileStats compile_stats() const;  // nn/compiled_module.cc
  // The next training call records again (nn::record_modules_again).
  void forget_recording() const;  // nn/compiled_module.cc

 private:
  Tensor call_recomputed(const Tensor& x);  // nn/recompute.cc
  Tensor call_compiled(const Tensor& x);    // nn/compiled_module.cc
  // The recorded or replayed forward(x), between the forward hooks.
  Tensor compiled_forward(const std::shared_ptr<CompiledModule>& c, const Tensor& x);  // nn/compiled_module.cc
  Tensor call_eager(const Tensor& x) {
    if (TESSEL_UNLIKELY(anomaly::enabled())) {  // messages name the module an op ran in
      anomaly::ModuleScope scope(path());
      return call_hooked(x);
    }
    return call_hooked(x);
  }
  bool recompute_ = false;
  std::shared_ptr<CompiledModule> compiled_;  // mixed mode's state (null: eager)

  Tensor call_hooked(const Tensor& x) {
    if (!has_forward_hooks()) return forward(x);
    Tensor in = run_forward_pre_hooks(x);
    return run_forward_hooks(in, forward(in));
  }
};

// Submodules named "0", "1", ... in order (paths "layers.3.attn...").
// Has no forward: the owner iterates.
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  explicit ModuleList(const std::vector<std::shared_ptr<Module>>& modules);

  void push_back(std::shared_ptr<Module> m);
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  // Bounds-checked (tessel::Error naming the index and the size).
  const std::shared_ptr<Module>& operator[](size_t i) const;
  // The module at i as an M (throws if it is not one).
  template <class M>
  std::shared_ptr<M> at(size_t i) const {
    auto m = std::dynamic_pointer_cast<M>((*this)[i]);
    if (!m) type_error(i);
    return m;
  }
  std::vector<std::shared_ptr<Module>>::const_iterator begin() const { return items_.begin(); }
  std::vector<std::shared_ptr<Module>>::const_iterator end() const { return items_.end(); }

 private:
  [[noreturn]] void type_error(size_t i) const;
  std::vector<std::shared_ptr<Module>> items_;
};

// Applies its modules in order: forward(x) = m_n(...m_1(m_0(x))). Children
// are named "0", "1", ...
class Sequential : public UnaryModule {
 public:
  Sequential() : UnaryModule("Sequential") {}
  explicit Sequential(const std::vector<std::shared_ptr<UnaryModule>>& modules);

  void push_back(std::shared_ptr<UnaryModule> m);
  size_t size() const { return items_.size(); }
  const std::shared_ptr<UnaryModule>& operator[](size_t i) const;
  Tensor forward(const Tensor& x) override;

 private:
  std::vector<std::shared_ptr<UnaryModule>> items_;
};

}  // namespace tessel::nn
