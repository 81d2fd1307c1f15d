#include "runtime/tensor.h"

#include <cmath>
#include <sstream>

#include "dtensor/mesh.h"
#include "runtime/capture.h"

namespace tessel {

void Tensor::throw_undefined() { TESSEL_FAIL("tensor", "operation on an undefined tensor"); }

int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "stride")]; }
bool Tensor::is_contiguous() const { return raw::is_contiguous(shape(), strides()); }

namespace {
FullTensorHook g_full_tensor_hook = nullptr;
HostCopyHook g_host_copy_hook = nullptr;
DeviceCopyHook g_device_copy_hook = nullptr;

// Values of a distributed tensor, gathered, and of a device tensor, copied to
// the host (item, to_vector, printing).
Tensor readable(const Tensor& t, const char* op) {
  Tensor r = t;
  if (t.is_distributed()) {
    TESSEL_CHECK(g_full_tensor_hook, op, "reading the values of distributed tensor {} needs the parallel library",
                 t.desc());
    r = g_full_tensor_hook(t);
  }
  if (r.device().is_cuda()) {
    TESSEL_CHECK(g_host_copy_hook, op, "reading the values of {} needs the CUDA kernels (//kernels/cuda)", r.desc());
    r = g_host_copy_hook(r);
  }
  return r;
}
}  // namespace

void set_full_tensor_hook(FullTensorHook hook) { g_full_tensor_hook = hook; }
void set_host_copy_hook(HostCopyHook hook) { g_host_copy_hook = hook; }
void set_device_copy_hook(DeviceCopyHook hook) { g_device_copy_hook = hook; }

void device_copy(const Tensor& src, const Tensor& dst) {
  TESSEL_CHECK(src.shape() == dst.shape() && src.dtype() == dst.dtype() && src.device() == dst.device() &&
                   !dst.device().is_cpu(),
               "device_copy", "copies between tensors of one shape, dtype and (non-CPU) device; got {} into {}",
               src.desc(), dst.desc());
  TESSEL_CHECK(g_device_copy_hook, "device_copy", "copying {} on {} needs the CUDA kernels (//kernels/cuda)",
               src.desc(), src.device().str());
  g_device_copy_hook(src, dst);
}

const DistInfo& Tensor::dist() const {
  TESSEL_CHECK(is_distributed(), "dist", "{} is not a distributed tensor", desc());
  return *impl_->dist;
}
const MeshPtr& Tensor::mesh() const { return dist().mesh; }
const Placements& Tensor::placements() const { return dist().placements; }

void* Tensor::raw_data() const {
  const TensorImpl* t = checked();
  if (TESSEL_UNLIKELY(t->dist != nullptr)) {
    TESSEL_FAIL("raw_data", "{} is distributed: its values are per-rank pieces (use to_local() or full_tensor(); "
                "an op reaching here has no sharding support)", desc());
  }
  if (!t->storage || !t->storage->data()) return nullptr;
  // Compile mode: op code (not a kernel) touching values on the host.
  if (TESSEL_UNLIKELY(capture::active() != nullptr) && capture::active()->depth == 0) capture::active()->host_access(*this);
  return static_cast<char*>(t->storage->data()) + t->offset * int64_t(tessel::itemsize(t->dtype));
}

std::string Tensor::desc() const {
  if (!defined()) return "Tensor(undefined)";
  if (is_distributed()) {
    return fmt::format(FMT_STRING("Tensor({}, {}, shape={}, mesh={}, placements={})"), dtype_name(dtype()), device().str(),
                       shape().str(), impl_->dist->mesh->str(), impl_->dist->placements.str());
  }
  return fmt::format(FMT_STRING("Tensor({}, {}, shape={})"), dtype_name(dtype()), device().str(), shape().str());
}

void for_each_element(const Dims& shape, const Dims& strides, int64_t offset,
                      const std::function<void(int64_t, int64_t)>& fn) {
  int n = shape.size();
  int64_t total = numel_of(shape);
  if (total == 0) return;
  Dims idx = Dims::filled(n, 0);
  int64_t off = offset;
  for (int64_t linear = 0; linear < total; ++linear) {
    fn(linear, off);
    for (int d = n - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

namespace {

template <class Out>
std::vector<Out> gather_values(const Tensor& t, const char* op) {
  TESSEL_CHECK(!t.device().is_meta(), op, "cannot read values of a meta tensor {}", t.desc());
  TESSEL_CHECK(t.device().is_cpu(), op, "reading values needs a CPU tensor, got {} (use .to(kCPU))", t.desc());
  std::vector<Out> out(size_t(t.numel()));
  if (out.empty()) return out;
  if (TESSEL_UNLIKELY(capture::active() != nullptr) && capture::active()->depth == 0) capture::active()->host_access(t);
  const char* base = static_cast<const char*>(t.storage()->data());
  dispatch_all(t.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = reinterpret_cast<const T*>(base);
    for_each_element(t.shape(), t.strides(), t.offset(), [&](int64_t i, int64_t off) {
      if constexpr (std::is_same_v<T, f16> || std::is_same_v<T, bf16>) {
        float v = static_cast<float>(p[off]);
        if constexpr (std::is_same_v<Out, f16> || std::is_same_v<Out, bf16>) out[size_t(i)] = Out(v);
        else out[size_t(i)] = static_cast<Out>(v);
      } else if constexpr (std::is_same_v<Out, f16> || std::is_same_v<Out, bf16>) {
        out[size_t(i)] = Out(static_cast<float>(p[off]));
      } else {
        out[size_t(i)] = static_cast<Out>(p[off]);
      }
    });
  });
  return out;
}

}  // namespace

template <class T> T Tensor::item() const {
  TESSEL_CHECK(numel() == 1, "item", "needs a tensor with one element, got {}", desc());
  return gather_values<T>(readable(*this, "item"), "item")[0];
}

template <class T> std::vector<T> Tensor::to_vector() const {
  return gather_values<T>(readable(*this, "to_vector"), "to_vector");
}

#define TESSEL_INSTANTIATE(T)                        \
  template T Tensor::item<T>() const;                \
  template std::vector<T> Tensor::to_vector<T>() const;
TESSEL_INSTANTIATE(bool)
TESSEL_INSTANTIATE(int32_t)
TESSEL_INSTANTIATE(int64_t)
TESSEL_INSTANTIATE(float)
TESSEL_INSTANTIATE(double)
TESSEL_INSTANTIATE(f16)
TESSEL_INSTANTIATE(bf16)
#undef TESSEL_INSTANTIATE

std::string Tensor::to_string(int64_t max_elems) const {
  if (!defined()) return "Tensor(undefined)";
  if (is_distributed()) {  // collective: every rank must print
    Tensor full = readable(*this, "to_string");
    return desc() + full.to_string(max_elems).substr(full.desc().size());
  }
  std::ostringstream os;
  os << desc();
  if (device().is_meta() || (device().is_cuda() && !g_host_copy_hook)) return os.str();
  std::vector<double> v;
  if (dtype() == DType::Int64) {
    auto iv = to_vector<int64_t>();
    v.assign(iv.begin(), iv.end());
  } else {
    v = to_vector<double>();
  }
  os << " [";
  int64_t n = int64_t(v.size());
  for (int64_t i = 0; i < n && i < max_elems; ++i) {
    if (i) os << ", ";
    if (is_floating(dtype())) os << fmt::format(FMT_STRING("{:.6g}"), v[size_t(i)]);
    else os << int64_t(v[size_t(i)]);
  }
  if (n > max_elems) os << ", ... (" << n << " elements)";
  os << "]";
  return os.str();
}

namespace raw {

bool is_contiguous(const Dims& shape, const Dims& strides) {
  int64_t expected = 1;
  for (int i = shape.size() - 1; i >= 0; --i) {
    if (shape[i] == 1) continue;
    if (shape[i] == 0) return true;
    if (strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

Tensor empty(const Dims& shape, DType dtype, Device device) {
  for (int64_t s : shape) TESSEL_CHECK(s >= 0, "empty", "negative size in shape {}", shape);
  auto impl = std::make_shared<TensorImpl>();
  int64_t n = numel_of(shape);
  impl->storage = std::make_shared<StorageImpl>(size_t(n) * tessel::itemsize(dtype), device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->device = device;
  return Tensor(std::move(impl));
}

Tensor empty_like(const Tensor& t) { return empty(t.shape(), t.dtype(), t.device()); }

Tensor make_distributed(const Tensor& local, MeshPtr mesh, const Placements& placements, const Dims& global_shape) {
  TESSEL_ASSERT(local.defined() && !local.is_distributed() && mesh);
  TESSEL_ASSERT(placements.size() == mesh->ndim());
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = local.storage();
  impl->shape = global_shape;
  impl->strides = contiguous_strides(global_shape);
  impl->dtype = local.dtype();
  impl->device = local.device();
  auto info = std::make_shared<DistInfo>();
  info->mesh = std::move(mesh);
  info->placements = placements;
  info->local = local.impl()->autograd ? alias(local) : local;
  impl->dist = std::move(info);
  return Tensor(std::move(impl));
}

Tensor from_blob(void* data, const Dims& shape, DType dtype, Device device) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<StorageImpl>(data, size_t(numel_of(shape)) * tessel::itemsize(dtype), device,
                                                std::function<void(void*)>());
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->device = device;
  return Tensor(std::move(impl));
}

Tensor as_strided(const Tensor& t, const Dims& shape, const Dims& strides, int64_t offset) {
  TESSEL_CHECK(!t.is_distributed(), "as_strided",
               "{} is distributed; views of distributed tensors go through the differentiable view ops", t.desc());
  TESSEL_CHECK(shape.size() == strides.size(), "as_strided", "shape {} and strides {} differ in length", shape, strides);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.storage();
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = t.dtype();
  impl->device = t.device();
  return Tensor(std::move(impl));
}

void set_use_hook(const Tensor& t, std::shared_ptr<const DistUseHook> hook) {
  TESSEL_CHECK(t.is_distributed(), "set_use_hook", "{} is not distributed", t.desc());
  auto info = std::make_shared<DistInfo>(*t.impl()->dist);  // DistInfo is shared and immutable: replace it
  info->on_use = std::move(hook);
  t.impl()->dist = std::move(info);
}

Tensor alias(const Tensor& t) {
  if (t.is_distributed()) {
    auto impl = std::make_shared<TensorImpl>(*t.impl());
    impl->autograd = nullptr;
    if (impl->dist->on_use) {  // see DistInfo::on_use
      auto info = std::make_shared<DistInfo>(*impl->dist);
      info->on_use = nullptr;
      impl->dist = std::move(info);
    }
    return Tensor(std::move(impl));
  }
  return as_strided(t, t.shape(), t.strides(), t.offset());
}

Tensor transpose(const Tensor& t, int64_t d0, int64_t d1) {
  int a = wrap_dim(d0, t.dim(), "transpose"), b = wrap_dim(d1, t.dim(), "transpose");
  Dims sh = t.shape(), st = t.strides();
  std::swap(sh[a], sh[b]);
  std::swap(st[a], st[b]);
  return as_strided(t, sh, st, t.offset());
}

Tensor permute(const Tensor& t, const Dims& order) {
  int n = t.dim();
  TESSEL_CHECK(order.size() == n, "permute", "order {} has {} entries for a tensor of shape {}", order, order.size(),
               t.shape());
  Dims sh = Dims::filled(n, 0), st = Dims::filled(n, 0);
  bool seen[kMaxDims] = {};
  for (int i = 0; i < n; ++i) {
    int d = wrap_dim(order[i], n, "permute");
    TESSEL_CHECK(!seen[d], "permute", "order {} repeats dimension {}", order, d);
    seen[d] = true;
    sh[i] = t.shape()[d];
    st[i] = t.strides()[d];
  }
  return as_strided(t, sh, st, t.offset());
}

Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step) {
  int d = wrap_dim(dim, t.dim(), "slice");
  TESSEL_CHECK(step > 0, "slice", "step must be positive, got {}", step);
  int64_t n = t.shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::min(std::max<int64_t>(start, 0), n);
  end = std::min(std::max<int64_t>(end, start), n);
  Dims sh = t.shape(), st = t.strides();
  sh[d] = (end - start + step - 1) / step;
  st[d] = t.strides()[d] * step;
  return as_strided(t, sh, st, t.offset() + start * t.strides()[d]);
}

Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  int d = wrap_dim(dim, t.dim(), "narrow");
  int64_t n = t.shape()[d];
  if (start < 0) start += n;
  TESSEL_CHECK(start >= 0 && length >= 0 && start + length <= n, "narrow",
               "range [{}, {}) is out of bounds for dimension {} of size {} (shape {})", start, start + length, d, n,
               t.shape());
  Dims sh = t.shape();
  sh[d] = length;
  return as_strided(t, sh, t.strides(), t.offset() + start * t.strides()[d]);
}

Tensor select(const Tensor& t, int64_t dim, int64_t index) {
  int d = wrap_dim(dim, t.dim(), "select");
  int64_t n = t.shape()[d];
  TESSEL_CHECK(index >= -n && index < n, "select", "index {} is out of range for dimension {} of size {} (shape {})",
               index, d, n, t.shape());
  if (index < 0) index += n;
  Dims sh = t.shape(), st = t.strides();
  sh.erase(d);
  st.erase(d);
  return as_strided(t, sh, st, t.offset() + index * t.strides()[d]);
}

Tensor expand(const Tensor& t, const Dims& shape) {
  int n = shape.size(), m = t.dim();
  TESSEL_CHECK(n >= m, "expand", "cannot expand shape {} to fewer dimensions {}", t.shape(), shape);
  Dims sh = Dims::filled(n, 0), st = Dims::filled(n, 0);
  for (int i = 0; i < n; ++i) {
    int j = i - (n - m);
    int64_t want = shape[i];
    if (j < 0) {
      TESSEL_CHECK(want >= 0, "expand", "size -1 not allowed in a new leading dimension (shape {} to {})", t.shape(),
                   shape);
      sh[i] = want;
      st[i] = 0;
      continue;
    }
    int64_t have = t.shape()[j];
    if (want == -1) want = have;
    TESSEL_CHECK(have == want || have == 1, "expand", "cannot expand shape {} to {} (dimension {}: {} vs {})",
                 t.shape(), shape, i, have, want);
    sh[i] = want;
    st[i] = have == want ? t.strides()[j] : 0;
  }
  return as_strided(t, sh, st, t.offset());
}

Tensor unsqueeze(const Tensor& t, int64_t dim) {
  int d = wrap_dim(dim, t.dim() + 1, "unsqueeze");
  Dims sh = t.shape(), st = t.strides();
  int64_t s = d < t.dim() ? t.strides()[d] * t.shape()[d] : 1;
  sh.insert(d, 1);
  st.insert(d, s);
  return as_strided(t, sh, st, t.offset());
}

Tensor squeeze(const Tensor& t, int64_t dim) {
  int d = wrap_dim(dim, t.dim(), "squeeze");
  if (t.shape()[d] != 1) return alias(t);
  Dims sh = t.shape(), st = t.strides();
  sh.erase(d);
  st.erase(d);
  return as_strided(t, sh, st, t.offset());
}

Dims infer_shape(const Dims& shape, int64_t numel, const char* op) {
  Dims out = shape;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      TESSEL_CHECK(infer < 0, op, "only one dimension can be -1 in shape {}", shape);
      infer = i;
    } else {
      TESSEL_CHECK(out[i] >= 0, op, "invalid size {} in shape {}", out[i], shape);
      known *= out[i];
    }
  }
  if (infer >= 0) {
    TESSEL_CHECK(known != 0 && numel % known == 0, op, "shape {} is invalid for {} elements", shape, numel);
    out[infer] = numel / known;
  }
  TESSEL_CHECK(numel_of(out) == numel, op, "shape {} is invalid for {} elements", shape, numel);
  return out;
}

Tensor try_view(const Tensor& t, const Dims& shape_in) {
  Dims shape = infer_shape(shape_in, t.numel(), "view");
  if (t.is_contiguous() || t.numel() == 0) return as_strided(t, shape, contiguous_strides(shape), t.offset());
  // Non-contiguous: the old dims fall into chunks that are contiguous among
  // themselves; each chunk must map onto whole new dims (PyTorch's rule).
  const Dims& os = t.shape();
  const Dims& ost = t.strides();
  Dims nst = Dims::filled(shape.size(), 0);
  int view_d = shape.size() - 1;
  int64_t chunk_base_stride = ost.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int td = os.size() - 1; td >= 0; --td) {
    tensor_numel *= os[td];
    bool chunk_end = td == 0 || (os[td - 1] != 1 && ost[td - 1] != tensor_numel * chunk_base_stride);
    if (!chunk_end) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
      nst[view_d] = view_numel * chunk_base_stride;
      view_numel *= shape[view_d];
      --view_d;
    }
    if (view_numel != tensor_numel) return Tensor();
    if (td > 0) {
      chunk_base_stride = ost[td - 1];
      tensor_numel = 1;
      view_numel = 1;
    }
  }
  if (view_d != -1) return Tensor();
  return as_strided(t, shape, nst, t.offset());
}

}  // namespace raw
}  // namespace tessel
