#pragma once
// nn::Module: parameters, buffers and submodules with dotted paths.
//
// A module registers its tensors in its constructor:
//
//   struct Linear : Module {
//     Tensor weight, bias;
//     Linear(int64_t in, int64_t out) : Module("Linear") {
//       param("weight", weight, {out, in}, init::kaiming_uniform(std::sqrt(5.0)));
//       param("bias", bias, {out}, init::uniform_fan_in(in));
//     }
//     Tensor forward(const Tensor& x) const { return linear(x, weight, bias); }
//   };
//
// Parameters are created uninitialised on the construction device
// (ConstructionScope: CPU by default, Meta for planning). Values come only from
// reset_parameters(seed): each parameter's init runs with the Philox key
// {seed, stream_for(path)}, so the values depend on the parameter's path and
// the seed alone — a model built on Meta and materialised later, or built on
// another device, or (later) sharded, initialises to the same bits as an eager
// build. Modules are held by std::shared_ptr and never copied or moved after
// construction (the registry points at their member tensors).
//
// Paths. Each module knows its dotted path from the root of its tree
// (path(): "layers.3.attn", "" for the root). Paths are assigned by the root's
// assign_paths() (make_model does it after construction) and lazily on the
// first path() call when unset (not thread-safe: build with make_model before
// sharing a model between threads); attaching a subtree under a new parent
// clears its paths so they are recomputed. A module has one parent: adding the same
// module under two parents is refused, because path-keyed randomness (dropout
// masks, parameter init) needs one name per site.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/function_ref.h"
#include "runtime/global_block.h"
#include "runtime/philox.h"
#include "runtime/tensor.h"

namespace tessel::nn {

// Fills a tensor given its Philox key (under no-grad). `block` places the
// tensor inside the full parameter when it is a shard (empty: the whole), so
// a shard gets exactly its slice of the full parameter's values.
using InitFn = std::function<void(const Tensor& t, PhiloxKey key, const GlobalBlock& block)>;

// Where and in which dtype constructors create parameters (thread-local).
class ConstructionScope {
 public:
  ConstructionScope(Device device, DType dtype = DType::Float32);
  ~ConstructionScope();
  ConstructionScope(const ConstructionScope&) = delete;
  ConstructionScope& operator=(const ConstructionScope&) = delete;
  static Device device();
  static DType dtype();

 private:
  Device prev_device_;
  DType prev_dtype_;
};

struct ParamOptions {
  // Subject to weight decay in AdamW's default groups. Default: true for
  // tensors with 2+ dimensions (matrices, embeddings), false for vectors
  // (biases, norm weights).
  int weight_decay = -1;  // -1: by rank
};

struct ParameterSlot {
  std::string name;   // local name ("weight")
  Tensor* tensor;     // the module's member
  InitFn init;
  bool weight_decay;
};

struct BufferSlot {
  std::string name;
  Tensor* tensor;
  bool persistent;  // part of state_dict
  // The storage the buffer's tensor (its local piece) holds now; null when
  // undefined. Compile mode's guards compare it: a buffer assigned anew.
  const StorageImpl* storage() const {
    return tensor->defined() ? raw::local_of(*tensor).storage().get() : nullptr;
  }
};

struct NamedTensor {
  std::string name;  // dotted path: "layers.3.attn.wq.weight"
  Tensor tensor;
};

class Module {
 public:
  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& type_name() const { return type_name_; }

  // ---- introspection (registration order, depth first) ----------------------
  std::vector<NamedTensor> named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<NamedTensor> named_buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, Module*>> named_modules() const;  // includes this one as ""
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  // Parameters with their init and weight-decay flag, by path.
  std::vector<std::pair<std::string, const ParameterSlot*>> parameter_slots() const;
  // The same slots in the same order, without building their paths (no
  // allocation: a Run checks its parameters with it at every step).
  void for_each_parameter_slot(FunctionRef<void(const ParameterSlot&)> fn) const;
  // Buffers' slots, recursively, in buffer_slots() order, without paths.
  void for_each_buffer_slot(FunctionRef<void(const BufferSlot&)> fn) const;
  // Buffers by path, through their slots (the module's members), so that a
  // caller can replace one (a pipeline stage drops those it does not run).
  std::vector<std::pair<std::string, const BufferSlot*>> buffer_slots(bool recurse = true) const;
  int64_t num_parameters() const;
  // A module by dotted path ("layers.3.attn"); throws if absent.
  Module& submodule(const std::string& path);

  // ---- paths ----------------------------------------------------------------------
  // Dotted path from the root of this module's tree ("" for the root).
  // Assigned lazily (from the root) when unset.
  const std::string& path() const;
  // Assigns the path of every module in the tree containing this one, from
  // its root. make_model calls it; calling it again is harmless.
  void assign_paths();
  // The parent module (null for a root).
  Module* parent() const { return parent_; }

  // ---- state -------------------------------------------------------------------
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Parameters and persistent buffers by path (references, not copies).
  std::vector<NamedTensor> state_dict() const;
  // Copies values in (shapes must match; dtypes convert). strict: every key
  // must match exactly; otherwise missing/unexpected keys are ignored.
  void load_state_dict(const std::vector<NamedTensor>& state, bool strict = true);
  // fn(module, path) for this module and every descendant.
  void apply(const std::function<void(Module&, const std::string&)>& fn);

  // ---- materialisation and initialisation ----------------------------------------
  // Runs every parameter's init with key {seed, stream_for(path)}.
  void reset_parameters(uint64_t seed);
  // Replaces the init of a registered parameter, by dotted path relative to
  // this module ("weight", "layers.0.mlp.proj.weight"): e.g. GPT-2's
  // normal(0, 0.02) in place of a Linear's default. Throws if absent.
  void set_init(const std::string& param_path, InitFn init);
  // Replaces every Meta parameter and buffer with uninitialised memory on
  // `device` (then call reset_parameters). Buffers are re-created by
  // init_buffers().
  void materialize(Device device);
  // Converts parameters and buffers (floating ones) to `dtype`.
  void to(DType dtype);
  void zero_grad();
  // Called after materialize(): modules with computed buffers (RoPE tables) fill them.
  virtual void init_buffers() {}

  // ---- forward hooks ---------------------------------------------------------------
  // Run around forward() when a module is called as (*m)(x) (UnaryModule::
  // operator()), not by a direct forward() call — like PyTorch's __call__.
  // A pre-hook may replace the input, a hook the output (return it
  // unchanged otherwise). Parallel plans use them for input/output layouts,
  // FSDP to gather parameters. Handles are unique per module.
  using ForwardPreHook = std::function<Tensor(Module& m, const Tensor& input)>;
  using ForwardHook = std::function<Tensor(Module& m, const Tensor& input, const Tensor& output)>;
  int register_forward_pre_hook(ForwardPreHook hook);
  int register_forward_hook(ForwardHook hook);
  void remove_forward_hook(int handle);
  bool has_forward_hooks() const { return !pre_hooks_.empty() || !post_hooks_.empty(); }
  Tensor run_forward_pre_hooks(const Tensor& input);
  Tensor run_forward_hooks(const Tensor& input, const Tensor& output);

  // Tree of modules with their options (extra_repr) and parameter shapes:
  //   Linear(in_features=4, out_features=8, bias=true, weight=[8, 4], bias=[8])
  std::string describe(int indent = 0) const;
  // Options shown by describe() ("in_features=4, out_features=8"); "" by default.
  virtual std::string extra_repr() const { return ""; }

 protected:
  // Creates `slot` as an uninitialised leaf requiring grad (on the
  // construction device and dtype) and registers it.
  Tensor& param(const std::string& name, Tensor& slot, const Dims& shape, InitFn init, ParamOptions opts = {});
  // Registers an existing tensor as a buffer.
  Tensor& buffer(const std::string& name, Tensor& slot, Tensor value, bool persistent = true);
  template <class M>
  std::shared_ptr<M> child(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }
  void add_child(const std::string& name, std::shared_ptr<Module> m);

 private:
  void collect_parameters(const std::string& prefix, bool recurse, std::vector<NamedTensor>& out) const;
  void collect_slots(const std::string& prefix, std::vector<std::pair<std::string, const ParameterSlot*>>& out) const;
  void collect_buffer_slots(const std::string& prefix, bool recurse,
                            std::vector<std::pair<std::string, const BufferSlot*>>& out) const;
  void collect_buffers(const std::string& prefix, bool recurse, bool only_persistent,
                       std::vector<NamedTensor>& out) const;
  void collect_modules(const std::string& prefix, std::vector<std::pair<std::string, Module*>>& out) const;
  void check_name(const std::string& name) const;
  void assign_paths_from(const std::string& path);
  void clear_paths();

  std::string type_name_;
  bool training_ = true;
  std::vector<ParameterSlot> params_;
  std::vector<BufferSlot> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<std::pair<int, ForwardPreHook>> pre_hooks_;
  std::vector<std::pair<int, ForwardHook>> post_hooks_;
  int next_hook_ = 1;
  Module* parent_ = nullptr;            // cleared by the parent's destructor
  mutable std::string path_;            // valid when path_assigned_
  mutable bool path_assigned_ = false;
};

// Builds a model (or any module tree) and assigns its paths:
//   auto model = nn::make_model<GPT>(config);  model->reset_parameters(seed);
template <class M, class... Args>
std::shared_ptr<M> make_model(Args&&... args) {
  auto m = std::make_shared<M>(std::forward<Args>(args)...);
  m->assign_paths();
  return m;
}

// Init functions for ParameterSlot::init.
namespace init {
InitFn zeros();
InitFn ones();
InitFn constant(double v);
InitFn normal(double mean, double std);
InitFn uniform(double lo, double hi);
InitFn trunc_normal(double mean, double std, double a, double b);
// PyTorch's nn.Linear default: kaiming_uniform(a = sqrt 5) for the weight.
InitFn kaiming_uniform(double a);
InitFn xavier_uniform(double gain = 1.0);
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)): PyTorch's nn.Linear bias default (fan_in
// given explicitly, since a bias has no input dimension of its own).
InitFn uniform_fan_in(int64_t fan_in);
}  // namespace init

// stream_for(path) used by reset_parameters (exposed for tests/tools).
PhiloxKey parameter_key(uint64_t seed, const std::string& path);

}  // namespace tessel::nn
