#pragma once
// Optimizers: SGD and AdamW over parameter groups, with fused kernels
// (kernels/optim.h) and path-keyed, serialisable state. docs/optim.md has the
// exact per-element formulas.
//
//   auto groups = nn::default_param_groups(model, /*weight_decay=*/0.1);
//   nn::AdamWOptions o;
//   o.lr = 6e-4;
//   o.betas = {0.9, 0.95};
//   nn::AdamW opt(groups, o);
//   for (int64_t step = 0; ...; ++step) {
//     opt.zero_grad();
//     loss.backward();
//     nn::clip_grad_norm_(model.parameters(), 1.0);
//     opt.set_lr(schedule.lr(step));
//     opt.step();
//   }
//
// Parameters are identified by their path ("layers.3.attn.wq.weight"), so
// state_dict() keys survive rebuilding the model, resharding and reloading.
// The optimizer holds handles to the parameter tensors: build it after
// Module::materialize()/to(), which replace them.
//
// Per parameter the state is created at its first step (zeros) and updated in
// place afterwards: step() allocates nothing in steady state. A parameter
// whose .grad is undefined (unused this step) is skipped: neither it nor its
// state nor its step count changes (PyTorch's behaviour).
#include <array>
#include <map>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nn/module.h"
#include "runtime/tensor.h"

namespace tessel::nn {

struct ParamGroup {
  std::vector<NamedTensor> params;
  // Weight decay of this group; unset: the optimizer's option.
  std::optional<double> weight_decay;
  // The group's lr is optimizer.lr() * lr_scale.
  double lr_scale = 1.0;
  std::string name;  // label for errors ("decay", "no_decay"); optional
};

// Names unnamed tensors by their index: prefix + "0", prefix + "1", ...
std::vector<NamedTensor> index_named(const std::vector<Tensor>& params, const std::string& prefix = "");

// Two groups over the module's parameters (registration order): "decay"
// with the parameters whose ParameterSlot::weight_decay is set (matrices,
// embeddings) and weight_decay = `weight_decay`, and "no_decay" (biases,
// norm weights, other vectors) with weight_decay = 0. Either may be empty.
// A tensor registered under several paths (tied weights) appears once, under
// its first path.
std::vector<ParamGroup> default_param_groups(const Module& module, double weight_decay);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter with a defined .grad (under no-grad).
  void step();
  // set_to_none: drop every .grad (the next backward allocates it from the
  // pool); otherwise zero them in place.
  void zero_grad(bool set_to_none = true);

  double lr() const { return lr_; }
  void set_lr(double lr);  // >= 0

  const std::string& name() const { return name_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Number of step() calls so far (restored by load_state_dict).
  int64_t num_steps() const { return num_steps_; }

  // The state by parameter path: "<path>.step" (int64 scalar: how many updates
  // this parameter received), then the optimizer's buffers
  // ("<path>.exp_avg", "<path>.exp_avg_sq" for AdamW; "<path>.momentum_buffer"
  // for SGD with momentum), for parameters that have state, in parameter
  // order; and "step" (int64 scalar, num_steps()). Buffers are references to
  // the live state (like Module::state_dict); copy them to keep a snapshot.
  std::vector<NamedTensor> state_dict() const;
  // Bytes of state this rank holds once every parameter has been updated:
  // the buffers per parameter times the float32 bytes of its local piece
  // (distributed parameters: their piece only, so sharded optimizer states
  // count their shards).
  int64_t state_bytes() const;

  // Copies state in. Every key must belong to a parameter of this optimizer
  // (or be "step"), shapes must match; a parameter without keys gets fresh
  // state. Nothing is written unless everything checks.
  void load_state_dict(const std::vector<NamedTensor>& state);
  // The checks of load_state_dict alone (throws what it would throw; writes
  // nothing): a caller loading several things checks them all first.
  void check_state_dict(const std::vector<NamedTensor>& state) const;

 protected:
  struct Slot {
    std::string path;
    Tensor param;
    int group = 0;
    int64_t step = 0;             // updates this parameter received
    std::vector<Tensor> buffers;  // empty until the first update (or a load)
  };

  Optimizer(std::string name, std::vector<ParamGroup> groups, double lr, double default_weight_decay);

  // Names of the per-parameter buffers, in order (may depend on options).
  virtual std::vector<std::string> buffer_names() const = 0;
  // One update of slot.param from grad (slot.step already incremented; the
  // buffers exist, zero-filled at the first update). lr and weight_decay are
  // the group's.
  virtual void update(Slot& slot, const Tensor& grad, double lr, double weight_decay) = 0;

  // A state_dict sorted by slot (pointers into the caller's tensors).
  struct ParsedState {
    struct Incoming {
      const Tensor* step = nullptr;
      std::vector<const Tensor*> buffers;
    };
    std::map<size_t, Incoming> incoming;
    const Tensor* global_step = nullptr;
  };
  ParsedState parse_state(const std::vector<NamedTensor>& state) const;

  [[noreturn]] void fail_option(const char* option, double value, const char* requirement) const;
  void step_slots();  // step() without its out-of-memory naming
  // Throws when a layout replaced `p` (AutogradMeta::replaced_by).
  void check_not_replaced(const std::string& path, const Tensor& p) const;
  void check_nonnegative(const char* option, double value) const;

  std::string name_;
  std::vector<ParamGroup> groups_;
  std::vector<double> group_weight_decay_;
  std::vector<Slot> slots_;
  double lr_;
  int64_t num_steps_ = 0;
};

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;  // L2 penalty added to the gradient (coupled)
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<ParamGroup> groups, SGDOptions options);
  SGD(const std::vector<NamedTensor>& params, SGDOptions options);
  SGD(const std::vector<Tensor>& params, SGDOptions options);
  const SGDOptions& options() const { return opts_; }

 protected:
  std::vector<std::string> buffer_names() const override;
  void update(Slot& slot, const Tensor& grad, double lr, double weight_decay) override;

 private:
  SGDOptions opts_;
};

struct AdamWOptions {
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 1e-2;  // decoupled: p *= 1 - lr * weight_decay
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<ParamGroup> groups, AdamWOptions options);
  AdamW(const std::vector<NamedTensor>& params, AdamWOptions options);
  AdamW(const std::vector<Tensor>& params, AdamWOptions options);
  const AdamWOptions& options() const { return opts_; }

 protected:
  std::vector<std::string> buffer_names() const override;
  void update(Slot& slot, const Tensor& grad, double lr, double weight_decay) override;

 private:
  AdamWOptions opts_;
};

}  // namespace tessel::nn
