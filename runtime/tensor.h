#pragma once
// Tensor: a handle to a strided view of a storage block.
//
// The metadata accessors and the `raw::` view functions below are runtime:
// they never record autograd history. The member functions marked
// "differentiable" are defined in autograd/ (autograd/tensor_methods.cc), so
// anything calling them links the autograd library; kernels use raw:: only.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtensor/placement.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/macros.h"
#include "runtime/scalar.h"
#include "runtime/shape.h"
#include "runtime/storage.h"

namespace tessel {

struct AutogradMeta;  // autograd/autograd_meta.h
struct Node;          // autograd/node.h
struct DistInfo;      // below
class Mesh;           // dtensor/mesh.h
using MeshPtr = std::shared_ptr<const Mesh>;

struct TensorOptions {
  DType dtype = DType::Float32;
  Device device = kCPU;
  bool requires_grad = false;

  TensorOptions() = default;
  TensorOptions(DType d) : dtype(d) {}  // NOLINT: implicit so zeros(shape, DType::Int64) reads well
  TensorOptions(Device d) : device(d) {}  // NOLINT
  TensorOptions with_dtype(DType d) const { auto o = *this; o.dtype = d; return o; }
  TensorOptions with_device(Device d) const { auto o = *this; o.device = d; return o; }
  TensorOptions with_requires_grad(bool r = true) const { auto o = *this; o.requires_grad = r; return o; }
};

struct TensorImpl {
  std::shared_ptr<StorageImpl> storage;
  Dims shape;
  Dims strides;   // in elements
  int64_t offset = 0;  // in elements
  DType dtype = DType::Float32;
  Device device;
  std::shared_ptr<AutogradMeta> autograd;  // null: no grad, no history
  // Distributed tensors (docs/design.md §2): shape is the *global* shape, storage
  // is the local piece's (so version counters are shared with it), and dist
  // holds the mesh, the placements and the local piece. Null: a plain tensor.
  std::shared_ptr<const DistInfo> dist;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- metadata (runtime) ---------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Dims& shape() const { return checked()->shape; }
  const Dims& strides() const { return checked()->strides; }
  int dim() const { return checked()->shape.size(); }
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t numel() const { return numel_of(shape()); }
  int64_t offset() const { return checked()->offset; }
  DType dtype() const { return checked()->dtype; }
  Device device() const { return checked()->device; }
  size_t itemsize() const { return tessel::itemsize(dtype()); }
  size_t nbytes() const { return size_t(numel()) * itemsize(); }
  bool is_contiguous() const;
  bool is_floating_point() const { return is_floating(dtype()); }

  // Address of element [0, 0, ...] (null for Meta or empty tensors).
  void* raw_data() const;
  // Typed pointer to element [0, ...]; throws if T is not the tensor's dtype.
  template <class T> T* data() const;

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  const std::shared_ptr<StorageImpl>& storage() const { return checked()->storage; }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }
  bool shares_storage(const Tensor& o) const { return defined() && o.defined() && storage() == o.storage(); }

  // Version of the underlying storage, bumped by every in-place write.
  uint32_t version() const { return storage()->version(); }
  void bump_version() const { storage()->bump_version(); }

  // "Tensor(float32, cpu, shape=[2, 3])" — for errors and logs.
  std::string desc() const;
  // The values, formatted (at most max_elems shown).
  std::string to_string(int64_t max_elems = 64) const;

  // Single element converted to T (one element; CUDA tensors are copied to the host first).
  template <class T> T item() const;
  // All elements in row-major order converted to T (CPU tensors).
  template <class T> std::vector<T> to_vector() const;

  // ---- distribution (docs/design.md §2) ---------------------------------------------
  // A distributed tensor's metadata (shape, dtype, device) is global; its
  // values live in `dist().local` pieces, one per rank. Ops dispatch through
  // their sharding rules; raw_data() refuses distributed tensors.
  bool is_distributed() const { return impl_ && impl_->dist; }
  const DistInfo& dist() const;         // throws if not distributed
  const MeshPtr& mesh() const;          // "
  const Placements& placements() const; // "

  // ---- autograd (differentiable API; defined in autograd/) -------------------
  bool requires_grad() const;
  Tensor& requires_grad_(bool requires = true);
  bool is_leaf() const;
  Tensor grad() const;
  void set_grad(const Tensor& g) const;
  void zero_grad() const;  // drops .grad
  std::shared_ptr<Node> grad_fn() const;
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  Tensor detach() const;
  void retain_grad() const;
  // Hook on the gradient of this tensor; may return a replacement (or an
  // undefined tensor to keep the gradient). Returns a handle for remove_hook.
  int register_hook(std::function<Tensor(const Tensor&)> hook) const;
  void remove_hook(int handle) const;
  // Leaf only: runs after the gradient was accumulated into .grad (DDP buckets).
  int register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const;

  // ---- views and layout (differentiable) --------------------------------------
  Tensor view(const Dims& shape) const;      // no copy; strides must be compatible
  Tensor reshape(const Dims& shape) const;   // view when possible, else copy
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;  // transpose of a 2-D tensor
  Tensor permute(const Dims& order) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const Dims& shape) const;  // -1 keeps a size
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor squeeze() const;
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;

  // ---- in-place (bump the version; refused on tensors that need grad while
  // grad mode is on) ----------------------------------------------------------
  Tensor& fill_(Scalar value);
  Tensor& zero_();
  Tensor& copy_(const Tensor& src);  // broadcasts src, converts dtype
  Tensor& add_(const Tensor& other, Scalar alpha = 1);
  Tensor& sub_(const Tensor& other, Scalar alpha = 1);
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(Scalar s);
  Tensor& div_(const Tensor& other);
  Tensor& add_(Scalar s);

 private:
  TensorImpl* checked() const {
    if (TESSEL_UNLIKELY(!impl_)) throw_undefined();
    return impl_.get();
  }
  [[noreturn]] static void throw_undefined();
  std::shared_ptr<TensorImpl> impl_;
};

// What an op computes on in place of a distributed tensor that carries it
// (DistInfo::on_use). FSDP (nn/parallel/fsdp.h) keeps each parameter as its
// dp shard and gives the shard one that returns the gathered parameter: the
// op -- and the autograd node it records -- then see the gathered copy, so
// the gradient flows through FSDP's gather node whether or not the module's
// forward hooks ran. Only call()'s distributed path (dtensor/dist_call.h)
// consults it, before anything else; what reads a tensor as it is
// (redistribute, full_tensor, to_local, raw::local_of, kernels, optimizer
// steps, checkpoints) never does.
struct DistUseHook {
  virtual ~DistUseHook() = default;
  // The tensor an op uses in place of `self`: distributed, of self's global
  // shape and dtype, without a use hook of its own. May communicate (every
  // rank uses the same tensors in the same order) and may throw.
  virtual Tensor resolve(const Tensor& self) const = 0;
};

struct DistInfo {
  MeshPtr mesh;
  Placements placements;
  Tensor local;  // this rank's piece: plain, no autograd metadata
  // Null for nearly every tensor (call() pays one pointer test per
  // distributed input). Not carried by raw::alias / detach(): a detached
  // shard is plain data, and resolving it would bring back the history
  // detach() dropped.
  std::shared_ptr<const DistUseHook> on_use;
};

template <class T> T* Tensor::data() const {
  if (TESSEL_UNLIKELY(dtype_v<T> != dtype())) {
    TESSEL_FAIL("data", "requested {} pointer from {}", dtype_name(dtype_v<T>), desc());
  }
  return static_cast<T*>(raw_data());
}

// Tensor operations outside autograd: nothing here records history, whatever
// its inputs' requires_grad -- "raw" means "below the tape". They are what
// kernels, op implementations, optimizers and checkpoints use. Most are views
// (alias, transpose, slice, expand, ...: metadata only, never a copy);
// empty/empty_like/from_blob make storage (uninitialised or wrapped); the
// distributed helpers wrap or unwrap local pieces without communicating.
namespace raw {

// A distributed tensor over this rank's `local` piece (no autograd, no
// communication; the caller vouches that local matches the placements).
Tensor make_distributed(const Tensor& local, MeshPtr mesh, const Placements& placements, const Dims& global_shape);
// Sets (null: clears) the use hook of distributed `t` (DistInfo::on_use).
// Every handle on t's TensorImpl sees it; views and aliases made later do not.
void set_use_hook(const Tensor& t, std::shared_ptr<const DistUseHook> hook);
// The local piece of a distributed tensor; t itself otherwise.
inline const Tensor& local_of(const Tensor& t) {
  return t.defined() && t.impl()->dist ? t.impl()->dist->local : t;
}

// Allocates uninitialised contiguous memory.
Tensor empty(const Dims& shape, DType dtype, Device device = kCPU);
Tensor empty_like(const Tensor& t);  // contiguous, same shape/dtype/device
// Wraps a buffer owned by the caller (not freed by tessel).
Tensor from_blob(void* data, const Dims& shape, DType dtype, Device device = kCPU);
Tensor as_strided(const Tensor& t, const Dims& shape, const Dims& strides, int64_t offset);
// A new handle on the same storage and layout, without autograd metadata.
Tensor alias(const Tensor& t);
Tensor transpose(const Tensor& t, int64_t d0, int64_t d1);
Tensor permute(const Tensor& t, const Dims& order);
Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length);
Tensor select(const Tensor& t, int64_t dim, int64_t index);
Tensor expand(const Tensor& t, const Dims& shape);  // broadcasting view, -1 keeps a size
Tensor unsqueeze(const Tensor& t, int64_t dim);
Tensor squeeze(const Tensor& t, int64_t dim);
// View with a new shape if the strides allow it; undefined Tensor otherwise.
// One -1 in `shape` is inferred.
Tensor try_view(const Tensor& t, const Dims& shape);
Dims infer_shape(const Dims& shape, int64_t numel, const char* op);
bool is_contiguous(const Dims& shape, const Dims& strides);

}  // namespace raw

// Calls fn(linear_index, element_offset) for every element of a strided
// layout in row-major order. Slow generic path for tests, printing and
// rarely-used layouts; kernels use their own loops.
void for_each_element(const Dims& shape, const Dims& strides, int64_t offset,
                      const std::function<void(int64_t, int64_t)>& fn);

// How item()/to_vector()/to_string() read a distributed tensor: the parallel
// layer installs a function returning the full (replicated) local tensor.
using FullTensorHook = Tensor (*)(const Tensor&);
void set_full_tensor_hook(FullTensorHook hook);

// How item()/to_vector()/to_string() read a CUDA tensor: the CUDA kernels
// (kernels/cuda) install a function returning a contiguous CPU copy.
using HostCopyHook = Tensor (*)(const Tensor&);
void set_host_copy_hook(HostCopyHook hook);

// How runtime code copies between two tensors of one CUDA device (compile
// mode's replay filling its input buffers: runtime/capture.h): the CUDA
// kernels install a function that queues kernels::copy on the current stream.
using DeviceCopyHook = void (*)(const Tensor& src, const Tensor& dst);
void set_device_copy_hook(DeviceCopyHook hook);
// src into dst (same shape, dtype and device; not the CPU): through the hook.
void device_copy(const Tensor& src, const Tensor& dst);

}  // namespace tessel
