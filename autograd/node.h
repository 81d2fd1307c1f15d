#pragma once
// The autograd graph: nodes are recorded backward functions; edges point from
// a node to the nodes that produced its inputs. The graph is the tape: each
// node carries a sequence number, and the engine runs ready nodes in reverse
// recording order, so backward is deterministic.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/tensor.h"

namespace tessel {

struct Node;

struct Edge {
  std::shared_ptr<Node> fn;  // null: the input needs no gradient
  uint32_t input_nr = 0;     // which output of `fn` the input was
  bool valid() const { return fn != nullptr; }
};

// Shape/dtype/device an input had, to check and convert its gradient.
struct InputMeta {
  Dims shape;
  DType dtype = DType::Float32;
  Device device;
};

using GradHook = std::function<Tensor(const Tensor&)>;

struct Node : std::enable_shared_from_this<Node> {
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  virtual const char* name() const = 0;
  // Gradients w.r.t. the node's outputs in, gradients w.r.t. its inputs out
  // (one per next_edges entry; undefined where none flows).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) = 0;
  // Frees saved tensors after a backward pass without retain_graph.
  virtual void release_saved() {}

  uint64_t seq;                    // recording order (unique, increasing)
  uint32_t num_outputs = 1;
  std::string forward_module;      // anomaly detection: the module the forward ran in
  std::vector<Edge> next_edges;    // one per tensor input
  std::vector<InputMeta> input_meta;
  // Hooks on the gradient of output `nr` (tensor hooks of non-leaf tensors).
  struct PreHook {
    int handle;
    uint32_t output_nr;
    GradHook fn;
  };
  std::vector<PreHook> pre_hooks;
};

// Thrown when a saved tensor is unpacked after an in-place change or after
// its graph was freed; the node adds its op name.
class SavedTensorError : public Error {
 public:
  using Error::Error;
};

// A tensor saved for backward: its values (an alias without autograd
// metadata, so a node saving its own output makes no reference cycle) and the
// storage version at save time.
class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& t);  // NOLINT: implicit so `saved = x;` reads naturally
  // The saved values; throws SavedTensorError if modified in place since.
  const Tensor& get() const;
  bool defined() const { return tensor_.defined(); }
  void release() { tensor_ = Tensor(); released_ = true; }

 private:
  Tensor tensor_;
  uint32_t version_ = 0;
  bool released_ = false;
};

// Next global sequence number for nodes.
uint64_t next_node_seq();
int next_hook_handle();

}  // namespace tessel
