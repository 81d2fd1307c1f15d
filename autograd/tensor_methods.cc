// Tensor's differentiable member functions (declared in runtime/tensor.h).
#include <algorithm>

#include "autograd/autograd_meta.h"
#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/graph_info.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/factory.h"
#include "autograd/ops/reduce.h"
#include "dtensor/mesh.h"
#include "dtensor/ops.h"
#include "dtensor/sharding.h"
#include "kernels/elementwise.h"

namespace tessel {

// ---- autograd state ---------------------------------------------------------------
bool Tensor::requires_grad() const {
  const AutogradMeta* m = defined() ? autograd_meta(*this) : nullptr;
  return m && m->requires_grad;
}

Tensor& Tensor::requires_grad_(bool r) {
  AutogradMeta& m = ensure_autograd_meta(*this);
  TESSEL_CHECK(!m.grad_fn || r, "requires_grad_", "cannot turn off requires_grad on a non-leaf tensor {}; use detach()",
               desc());
  TESSEL_CHECK(!r || is_floating(dtype()), "requires_grad_", "only floating-point tensors can require grad, got {}",
               desc());
  m.requires_grad = r;
  return *this;
}

bool Tensor::is_leaf() const {
  const AutogradMeta* m = autograd_meta(*this);
  return !m || !m->grad_fn;
}

Tensor Tensor::grad() const {
  const AutogradMeta* m = autograd_meta(*this);
  return m ? m->grad : Tensor();
}

void Tensor::set_grad(const Tensor& g) const {
  if (g.defined()) {
    TESSEL_CHECK(g.shape() == shape(), "set_grad", "gradient {} does not match tensor {}", g.desc(), desc());
  }
  ensure_autograd_meta(*this).grad = g;
}

void Tensor::zero_grad() const {
  if (AutogradMeta* m = autograd_meta(*this)) m->grad = Tensor();
}

std::shared_ptr<Node> Tensor::grad_fn() const {
  const AutogradMeta* m = autograd_meta(*this);
  return m ? m->grad_fn : nullptr;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd::backward({*this}, {gradient}, retain_graph);
}

Tensor Tensor::detach() const { return raw::alias(*this); }

void Tensor::retain_grad() const {
  AutogradMeta& m = ensure_autograd_meta(*this);
  if (!m.grad_fn || m.retains_grad) return;
  m.retains_grad = true;
  std::weak_ptr<TensorImpl> weak = impl_ptr();
  m.grad_fn->pre_hooks.push_back({next_hook_handle(), m.output_nr, [weak](const Tensor& g) {
                                    if (auto impl = weak.lock()) {
                                      Tensor self(impl);
                                      AutogradMeta& mm = ensure_autograd_meta(self);
                                      mm.grad = mm.grad.defined() ? add(mm.grad, g) : g.clone();
                                    }
                                    return Tensor();
                                  }});
}

int Tensor::register_hook(std::function<Tensor(const Tensor&)> hook) const {
  TESSEL_CHECK(requires_grad(), "register_hook", "tensor {} does not require grad", desc());
  AutogradMeta& m = ensure_autograd_meta(*this);
  int handle = next_hook_handle();
  if (m.grad_fn) {
    m.grad_fn->pre_hooks.push_back({handle, m.output_nr, std::move(hook)});
  } else {
    m.hooks.push_back({handle, std::move(hook)});
  }
  return handle;
}

void Tensor::remove_hook(int handle) const {
  AutogradMeta* m = autograd_meta(*this);
  if (!m) return;
  m->hooks.erase(std::remove_if(m->hooks.begin(), m->hooks.end(), [&](auto& h) { return h.handle == handle; }),
                 m->hooks.end());
  m->post_accumulate_hooks.erase(std::remove_if(m->post_accumulate_hooks.begin(), m->post_accumulate_hooks.end(),
                                                [&](auto& h) { return h.handle == handle; }),
                                 m->post_accumulate_hooks.end());
  if (m->grad_fn) {
    auto& hs = m->grad_fn->pre_hooks;
    hs.erase(std::remove_if(hs.begin(), hs.end(), [&](auto& h) { return h.handle == handle; }), hs.end());
  }
}

int Tensor::register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const {
  TESSEL_CHECK(requires_grad() && is_leaf(), "register_post_accumulate_grad_hook",
               "needs a leaf tensor that requires grad, got {}", desc());
  int handle = next_hook_handle();
  ensure_autograd_meta(*this).post_accumulate_hooks.push_back({handle, std::move(hook)});
  return handle;
}

// ---- views -------------------------------------------------------------------------
namespace {

enum class ViewKind : uint8_t { Reshape, Transpose, Permute, Slice, Select, Expand, Unsqueeze, Squeeze };

// One op for every no-copy layout change. Gradients go back through the
// inverse layout change (or, for slices and selects, into a zero tensor).
struct ViewOp {
  static constexpr const char* kName = "view";
  ViewKind kind;
  Dims arg;        // shape (Reshape/Expand) or permutation
  int64_t a = 0, b = 0, c = 0, d = 0;  // dims / indices, by kind
  Dims in_shape;
  bool copy_ok = false;  // Reshape of a local piece may copy (distributed reshape/view)

  Tensor forward(const Tensor& x) {
    in_shape = x.shape();
    switch (kind) {
      case ViewKind::Reshape: {
        Tensor v = raw::try_view(x, arg);
        if (!v.defined() && copy_ok) v = raw::try_view(detail::contiguous_raw(x), arg);
        TESSEL_CHECK(v.defined(), "view",
                     "cannot view {} with strides {} as shape {} without a copy (use reshape)", x.desc(),
                     x.strides(), arg);
        return v;
      }
      case ViewKind::Transpose: return raw::transpose(x, a, b);
      case ViewKind::Permute: return raw::permute(x, arg);
      case ViewKind::Slice: return raw::slice(x, a, b, c, d);
      case ViewKind::Select: return raw::select(x, a, b);
      case ViewKind::Expand: return raw::expand(x, arg);
      case ViewKind::Unsqueeze: return raw::unsqueeze(x, a);
      case ViewKind::Squeeze: return raw::squeeze(x, a);
    }
    return Tensor();
  }

  std::vector<Tensor> backward(const GradContext&, std::vector<Tensor>& grads) {
    const Tensor& g = grads[0];
    switch (kind) {
      case ViewKind::Reshape:
      case ViewKind::Unsqueeze:
      case ViewKind::Squeeze: return {g.reshape(in_shape)};
      case ViewKind::Transpose: return {g.transpose(a, b)};
      case ViewKind::Permute: {
        Dims inv = Dims::filled(arg.size(), 0);
        for (int i = 0; i < arg.size(); ++i) inv[wrap_dim(arg[i], arg.size(), "permute")] = i;
        return {g.permute(inv)};
      }
      case ViewKind::Expand: return {sum_to(g, in_shape)};
      case ViewKind::Slice:
      case ViewKind::Select: {
        Tensor z = zeros(in_shape, TensorOptions(g.dtype()).with_device(g.device()));
        Tensor dst = kind == ViewKind::Slice ? raw::slice(z, a, b, c, d) : raw::select(z, a, b);
        kernels::copy(g.device(), g, dst);
        return {z};
      }
    }
    return {Tensor()};
  }
  // Every kind but Expand (whose backward sums) moves gradient elements
  // without arithmetic: a pending sum may pass through in bitwise mode.
  bool partial_exact() const { return kind != ViewKind::Expand; }

  // Views keep Partial (they are linear) and move shards with their dims; a
  // shard the view cannot carry (a sliced, selected or expanded dim, a reshape
  // that would not keep chunks contiguous) is gathered first.
  ShardingPlan sharding(const ShardingContext& ctx) {
    const TensorSpec& x = ctx.in[0];
    const Dims& out_shape = ctx.out[0].shape;
    const int n = x.dim();
    Placements in = x.placements, out;
    std::vector<int> map(size_t(std::max(n, 1)), -1);  // input dim -> output dim
    switch (kind) {
      case ViewKind::Transpose:
        for (int i = 0; i < n; ++i) map[size_t(i)] = i == a ? int(b) : i == b ? int(a) : i;
        break;
      case ViewKind::Permute:
        for (int i = 0; i < n; ++i) map[size_t(wrap_dim(arg[i], n, "permute"))] = i;
        break;
      case ViewKind::Unsqueeze:
        for (int i = 0; i < n; ++i) map[size_t(i)] = i < a ? i : i + 1;
        break;
      case ViewKind::Squeeze:
        if (x.shape[int(a)] != 1) {
          for (int i = 0; i < n; ++i) map[size_t(i)] = i;
        } else {
          in = dtensor::unshard(in, {int(a)}, false);
          for (int i = 0; i < n; ++i) map[size_t(i)] = i < a ? i : i == a ? -1 : i - 1;
        }
        break;
      case ViewKind::Slice:
      case ViewKind::Select:
        in = dtensor::unshard(in, {int(a)}, false);
        for (int i = 0; i < n; ++i)
          map[size_t(i)] = kind == ViewKind::Slice ? i : i < a ? i : i == a ? -1 : i - 1;
        break;
      case ViewKind::Expand: {
        const int lead = out_shape.size() - n;
        for (int i = 0; i < n; ++i) {
          map[size_t(i)] = i + lead;
          if (x.shape[i] != out_shape[i + lead]) in = dtensor::unshard(in, {i}, false);
        }
        break;
      }
      case ViewKind::Reshape:
        in = reshape_placements(ctx, map);
        break;
    }
    out = dtensor::map_dims(in, map.data(), Replicate());
    // The local piece's attributes.
    if (kind == ViewKind::Expand || kind == ViewKind::Reshape) arg = ctx.local(out_shape, out).shape;
    if (kind == ViewKind::Reshape) copy_ok = true;
    return {{in}, {out}};
  }

  // Reshape: input dims and output dims fall into groups with equal products.
  // A shard survives when it cuts the first dim of its group and the chunks of
  // the flattened group stay the same (ceil(I/n) * rest_in == ceil(O/n) * rest_out;
  // cut over several mesh dims: equal pieces on both sides), or when the group
  // is one dim to one dim.
  Placements reshape_placements(const ShardingContext& ctx, std::vector<int>& map) const {
    const TensorSpec& x = ctx.in[0];
    const Dims& I = x.shape;
    const Dims& O = ctx.out[0].shape;
    Placements in = x.placements;
    if (numel_of(I) == 0) return dtensor::unshard(in, {0, 1, 2, 3, 4, 5, 6, 7}, false);
    int i = 0, j = 0;
    while (i < I.size() || j < O.size()) {
      const int i0 = i, j0 = j;
      int64_t pi = 1, pj = 1;
      if (i < I.size()) pi *= I[i++];
      if (j < O.size()) pj *= O[j++];
      while (pi != pj) {
        if (pi < pj) pi *= I[i++];
        else pj *= O[j++];
      }
      const bool one_to_one = i - i0 == 1 && j - j0 == 1;
      int i1 = i0, j1 = j0;  // the first dims of the group that are not 1
      while (i1 + 1 < i && I[i1] == 1) ++i1;
      while (j1 + 1 < j && O[j1] == 1) ++j1;
      for (int d = i0; d < i; ++d) {
        int cuts = 0;
        for (int m = 0; m < in.size(); ++m) cuts += in[m].is_shard(d);
        if (cuts == 0) continue;
        bool ok = false;
        if (one_to_one) {
          ok = true;
        } else if (d == i1 && cuts == 1 && I[d] > 1 && j1 < j) {
          int m = 0;
          while (!in[m].is_shard(d)) ++m;
          const int64_t nm = ctx.mesh->size(m);
          int64_t rest_in = 1, rest_out = 1;
          for (int e = i1 + 1; e < i; ++e) rest_in *= I[e];
          for (int e = j1 + 1; e < j; ++e) rest_out *= O[e];
          ok = (I[d] + nm - 1) / nm * rest_in == (O[j1] + nm - 1) / nm * rest_out;
        } else if (d == i1 && cuts > 1 && I[d] > 1 && j1 < j) {
          // Cut over several mesh dims (the batch over dp and ep): the pieces
          // nest, so with equal pieces at every level (the product of the
          // mesh sizes divides both dims) every cut of the input lands on a
          // cut of the output: I[d] * rest_in == O[j1] * rest_out.
          int64_t pieces = 1;
          bool plain = true;
          for (int m = 0; m < in.size(); ++m)
            if (in[m].is_shard(d)) pieces *= ctx.mesh->size(m), plain = plain && !in[m].is_owned();
          ok = plain && I[d] % pieces == 0 && O[j1] % pieces == 0;
        }
        if (ok) map[size_t(d)] = one_to_one ? j0 : j1;
        else in = dtensor::unshard(in, {d}, false);
      }
    }
    return in;
  }
};

Tensor view_op(const Tensor& x, ViewOp op) { return call(std::move(op), x); }

ViewInfo::Kind info_kind(ViewKind k) {
  switch (k) {
    case ViewKind::Reshape: return ViewInfo::Kind::Reshape;
    case ViewKind::Transpose: return ViewInfo::Kind::Transpose;
    case ViewKind::Permute: return ViewInfo::Kind::Permute;
    case ViewKind::Slice: return ViewInfo::Kind::Slice;
    case ViewKind::Select: return ViewInfo::Kind::Select;
    case ViewKind::Expand: return ViewInfo::Kind::Expand;
    case ViewKind::Unsqueeze: return ViewInfo::Kind::Unsqueeze;
    case ViewKind::Squeeze: return ViewInfo::Kind::Squeeze;
  }
  return ViewInfo::Kind::Reshape;
}

struct CloneOp {
  static constexpr const char* kName = "clone";
  Tensor forward(const Tensor& x) {
    Tensor out = raw::empty(x.shape(), x.dtype(), x.device());
    kernels::copy(x.device(), x, out);
    return out;
  }
  std::vector<Tensor> backward(const GradContext&, std::vector<Tensor>& grads) { return {grads[0]}; }
  ShardingPlan sharding(const ShardingContext& ctx) { return dtensor::pointwise_exact(ctx, {0b1}, true); }
};

struct CastOp {
  static constexpr const char* kName = "to";
  DType to;
  DType from = DType::Float32;
  Tensor forward(const Tensor& x) {
    from = x.dtype();
    return detail::cast_raw(x, to);
  }
  std::vector<Tensor> backward(const GradContext&, std::vector<Tensor>& grads) {
    return {is_floating(from) ? grads[0].to(from) : Tensor()};
  }
  // A widening float cast commutes with the pending sum; a narrowing one rounds
  // each piece, so Partial inputs are reduced first.
  ShardingPlan sharding(const ShardingContext& ctx) {
    const DType f = ctx.in[0].dtype;
    const bool widening = is_floating(f) && is_floating(to) && itemsize(to) > itemsize(f);
    return widening ? dtensor::pointwise(ctx, {0b1}) : dtensor::pointwise(ctx);
  }
};

void check_inplace(const Tensor& t, const char* op) {
  TESSEL_CHECK(!(GradMode::is_enabled() && t.requires_grad()), op,
               "in-place operation on {} which requires grad; run it under NoGradGuard or use the out-of-place op",
               t.desc());
  for (int d = 0; d < t.dim(); ++d)
    TESSEL_CHECK(t.strides()[d] != 0 || t.shape()[d] <= 1, op,
                 "in-place write into {} with overlapping memory (an expanded view, strides {})", t.desc(),
                 t.strides());
}

}  // namespace

std::optional<ViewInfo> view_info(const Node& node) {
  const auto* n = dynamic_cast<const detail::OpNode<ViewOp>*>(&node);
  if (n == nullptr || !n->op) return std::nullopt;
  const ViewOp& op = *n->op;
  ViewInfo v;
  v.kind = info_kind(op.kind);
  v.in_shape = op.in_shape;
  v.shape = op.arg;
  v.dim = op.a;
  v.dim2 = op.b;
  return v;
}

Tensor Tensor::view(const Dims& shape) const {
  ViewOp op{ViewKind::Reshape};
  op.arg = raw::infer_shape(shape, numel(), "view");
  return view_op(*this, op);
}

Tensor Tensor::reshape(const Dims& shape) const {
  Dims target = raw::infer_shape(shape, numel(), "reshape");
  if (target == this->shape()) return *this;
  if (is_distributed()) return view(target);  // the local piece copies when it must
  if (raw::try_view(*this, target).defined()) return view(target);
  return contiguous().view(target);
}

Tensor Tensor::flatten(int64_t start, int64_t end) const {
  if (dim() == 0) return reshape({1});
  int s = wrap_dim(start, dim(), "flatten"), e = wrap_dim(end, dim(), "flatten");
  TESSEL_CHECK(s <= e, "flatten", "start_dim {} is after end_dim {}", s, e);
  Dims out;
  for (int d = 0; d < s; ++d) out.push_back(shape()[d]);
  int64_t m = 1;
  for (int d = s; d <= e; ++d) m *= shape()[d];
  out.push_back(m);
  for (int d = e + 1; d < dim(); ++d) out.push_back(shape()[d]);
  return reshape(out);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  ViewOp op{ViewKind::Transpose};
  op.a = wrap_dim(d0, dim(), "transpose");
  op.b = wrap_dim(d1, dim(), "transpose");
  return view_op(*this, op);
}

Tensor Tensor::t() const {
  TESSEL_CHECK(dim() <= 2, "t", "expects a tensor with at most 2 dimensions, got {}", desc());
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::permute(const Dims& order) const {
  ViewOp op{ViewKind::Permute};
  op.arg = order;
  return view_op(*this, op);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  ViewOp op{ViewKind::Slice};
  op.a = wrap_dim(d, dim(), "slice");
  op.b = start;
  op.c = end;
  op.d = step;
  return view_op(*this, op);
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  int w = wrap_dim(d, dim(), "narrow");
  int64_t n = shape()[w];
  int64_t s = start < 0 ? start + n : start;
  TESSEL_CHECK(s >= 0 && length >= 0 && s + length <= n, "narrow",
               "range [{}, {}) is out of bounds for dimension {} of size {} ({})", s, s + length, w, n, desc());
  return slice(w, s, s + length);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  ViewOp op{ViewKind::Select};
  op.a = wrap_dim(d, dim(), "select");
  int64_t n = shape()[op.a];
  TESSEL_CHECK(index >= -n && index < n, "select", "index {} is out of range for dimension {} of size {} ({})",
               index, op.a, n, desc());
  op.b = index < 0 ? index + n : index;
  return view_op(*this, op);
}

Tensor Tensor::expand(const Dims& shape) const {
  ViewOp op{ViewKind::Expand};
  op.arg = shape;
  return view_op(*this, op);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  ViewOp op{ViewKind::Unsqueeze};
  op.a = wrap_dim(d, dim() + 1, "unsqueeze");
  return view_op(*this, op);
}

Tensor Tensor::squeeze(int64_t d) const {
  ViewOp op{ViewKind::Squeeze};
  op.a = wrap_dim(d, dim(), "squeeze");
  return view_op(*this, op);
}

Tensor Tensor::squeeze() const {
  Dims out;
  for (int64_t s : shape())
    if (s != 1) out.push_back(s);
  return reshape(out);
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }
Tensor Tensor::clone() const { return call(CloneOp{}, *this); }

Tensor Tensor::to(DType t) const {
  if (t == dtype()) return *this;
  return call(CastOp{t}, *this);
}

namespace {
// A copy to another device (CPU <-> CUDA, CUDA <-> CUDA); the gradient goes
// back to the source device. The copy runs in the CUDA kernel table whenever
// either side is a GPU (kernels/cuda/copy.cu handles every direction).
struct ToDeviceOp {
  static constexpr const char* kName = "to";
  Device to;
  Device from = kCPU;
  Tensor forward(const Tensor& x) {
    from = x.device();
    TESSEL_CHECK(!x.is_distributed(), "to", "moving distributed tensor {} to {} is not supported (move its local "
                 "pieces)", x.desc(), to.str());
    Tensor out = raw::empty(x.shape(), x.dtype(), to);
    kernels::copy(to.is_cuda() ? to : from, x, out);
    return out;
  }
  std::vector<Tensor> backward(const GradContext&, std::vector<Tensor>& grads) { return {grads[0].to(from)}; }
};
}  // namespace

Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  if (d.is_meta()) return raw::empty(shape(), dtype(), d);
  TESSEL_CHECK(!device().is_meta(), "to", "cannot copy the values of meta tensor {} to {}", desc(), d.str());
  TESSEL_CHECK(!d.is_cuda() || cuda_available(), "to", "cannot copy {} to {}: {}", desc(), d.str(),
#ifdef TESSEL_WITH_CUDA
               "no CUDA device is available"
#else
               "this build has no CUDA support"
#endif
  );
  return call(ToDeviceOp{d}, *this);
}

// ---- in-place ----------------------------------------------------------------------
// On a distributed tensor, in-place ops write its local piece. A value that is
// not the piece's own (another layout, a plain tensor) is redistributed to
// this tensor's placements first; a Partial piece holds its share (the value
// on coordinate 0 of the Partial mesh dims, zero elsewhere).
namespace {

bool partial_root(const Tensor& t) {
  const Mesh& mesh = *t.mesh();
  for (int m = 0; m < mesh.ndim(); ++m)
    if (t.placements()[m].is_partial() && mesh.coordinate(m) != 0) return false;
  return true;
}

// `v` (plain or distributed, same global shape after broadcasting) as a
// distributed tensor with t's mesh and placements.
Tensor as_layout_of(const Tensor& t, const Tensor& v, const char* op) {
  NoGradGuard ng;
  Tensor full = v.shape() == t.shape() ? v : v.expand(t.shape());
  if (full.is_distributed()) {
    TESSEL_CHECK(same_mesh(full.mesh(), t.mesh()), op, "{} and {} live on different meshes", v.desc(), t.desc());
    return redistribute(full, t.placements());
  }
  return distribute_tensor(full.contiguous(), t.mesh(), t.placements());
}

}  // namespace

Tensor& Tensor::fill_(Scalar value) {
  check_inplace(*this, "fill_");
  if (is_distributed()) {
    Tensor local = dist().local;
    local.fill_(placements().any_partial() && !partial_root(*this) ? Scalar(0) : value);
    return *this;
  }
  kernels::fill(device(), *this, value);
  bump_version();
  return *this;
}

Tensor& Tensor::zero_() { return fill_(0); }

Tensor& Tensor::copy_(const Tensor& src) {
  check_inplace(*this, "copy_");
  if (is_distributed() || src.is_distributed()) {
    TESSEL_CHECK(is_distributed(), "copy_", "cannot copy distributed {} into plain {} (use full_tensor or to_local)",
                 src.desc(), desc());
    Tensor local = dist().local;
    local.copy_(raw::local_of(as_layout_of(*this, src, "copy_")));
    return *this;
  }
  detail::check_same_device("copy_", *this, src);
  Dims b = broadcast_shapes(src.shape(), shape(), "copy_");
  TESSEL_CHECK(b == shape(), "copy_", "source {} does not broadcast to destination {}", src.desc(), desc());
  // A source overlapping the destination is copied out first.
  Tensor s = shares_storage(src) ? raw::empty(src.shape(), src.dtype(), src.device()) : src;
  if (!s.is_same(src)) kernels::copy(device(), src, s);
  kernels::copy(device(), raw::expand(s, shape()), *this);
  bump_version();
  return *this;
}

namespace {
Tensor& binary_inplace(Tensor& self, const Tensor& other, kernels::BinaryOp op, const char* name);

// Distributed: add/sub need the operand in this tensor's layout; mul/div
// need it non-Partial where this tensor is Partial (linear in one factor).
Tensor& binary_inplace_distributed(Tensor& self, const Tensor& other, kernels::BinaryOp op, const char* name) {
  check_inplace(self, name);
  TESSEL_CHECK(self.is_distributed(), name, "cannot write a distributed result into plain {} (operand {})",
               self.desc(), other.desc());
  const bool additive = op == kernels::BinaryOp::Add || op == kernels::BinaryOp::Sub;
  if (!other.is_distributed() && other.dim() == 0) {  // a scalar: applies to the piece as it is
    Tensor local = self.dist().local;
    if (!additive || !self.placements().any_partial() || partial_root(self)) binary_inplace(local, other, op, name);
    return self;
  }
  Tensor o;
  if (additive || !self.placements().any_partial()) {
    o = as_layout_of(self, other, name);
  } else {
    NoGradGuard ng;
    Tensor full = other.shape() == self.shape() ? other : other.expand(self.shape());
    Placements want = dtensor::unshard(self.placements(), {}, true);
    o = full.is_distributed() ? redistribute(full, want) : distribute_tensor(full.contiguous(), self.mesh(), want);
  }
  Tensor local = self.dist().local;
  binary_inplace(local, raw::local_of(o), op, name);
  return self;
}

Tensor& binary_inplace(Tensor& self, const Tensor& other, kernels::BinaryOp op, const char* name) {
  if (self.is_distributed() || other.is_distributed()) return binary_inplace_distributed(self, other, op, name);
  check_inplace(self, name);
  detail::check_same_device(name, self, other);
  TESSEL_CHECK(is_floating(self.dtype()) || !is_floating(other.dtype()), name,
               "result of {} with {} cannot be stored in {}", other.desc(), self.desc(), self.desc());
  Dims b = broadcast_shapes(other.shape(), self.shape(), name);
  TESSEL_CHECK(b == self.shape(), name, "{} does not broadcast to {}", other.desc(), self.desc());
  Tensor o = detail::cast_raw(other, self.dtype());
  if (o.shares_storage(self)) {  // read the operand from a private copy
    Tensor c = raw::empty(o.shape(), o.dtype(), o.device());
    kernels::copy(o.device(), o, c);
    o = c;
  }
  kernels::binary(self.device(), op, self, raw::expand(o, self.shape()), self);
  self.bump_version();
  return self;
}
}  // namespace

Tensor& Tensor::add_(const Tensor& other, Scalar alpha) {
  if (!alpha.is_floating() && alpha.to_int() == 1) return binary_inplace(*this, other, kernels::BinaryOp::Add, "add_");
  NoGradGuard g;
  return binary_inplace(*this, mul(other, alpha), kernels::BinaryOp::Add, "add_");
}
Tensor& Tensor::sub_(const Tensor& other, Scalar alpha) {
  if (!alpha.is_floating() && alpha.to_int() == 1) return binary_inplace(*this, other, kernels::BinaryOp::Sub, "sub_");
  NoGradGuard g;
  return binary_inplace(*this, mul(other, alpha), kernels::BinaryOp::Sub, "sub_");
}
Tensor& Tensor::mul_(const Tensor& other) { return binary_inplace(*this, other, kernels::BinaryOp::Mul, "mul_"); }
Tensor& Tensor::div_(const Tensor& other) { return binary_inplace(*this, other, kernels::BinaryOp::Div, "div_"); }
Tensor& Tensor::mul_(Scalar s) {
  return binary_inplace(*this, detail::scalar_raw(s, dtype(), device()), kernels::BinaryOp::Mul, "mul_");
}
Tensor& Tensor::add_(Scalar s) {
  return binary_inplace(*this, detail::scalar_raw(s, dtype(), device()), kernels::BinaryOp::Add, "add_");
}

}  // namespace tessel
