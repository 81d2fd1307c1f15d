#include "autograd/ops/reduce.h"

#include "autograd/function.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/factory.h"
#include "autograd/ops/indexing.h"
#include "autograd/ops/unary.h"
#include "dtensor/ops.h"
#include "dtensor/redistribute.h"
#include "dtensor/sharding.h"
#include "kernels/reduce.h"
#include "runtime/numerics.h"

namespace tessel {

using kernels::ReduceOp;

namespace {

// Which dims are reduced (bitmask) after validating `dims`.
uint32_t reduce_mask(const Tensor& x, const std::vector<int64_t>& dims, const char* op) {
  if (dims.empty()) return x.dim() == 0 ? 0u : (1u << x.dim()) - 1u;
  uint32_t mask = 0;
  for (int64_t d : dims) {
    int w = wrap_dim(d, x.dim(), op);
    TESSEL_CHECK(!(mask & (1u << w)), op, "dimension {} appears twice in {}", w, fmt::join(dims, ", "));
    mask |= 1u << w;
  }
  return mask;
}

Dims keepdim_shape(const Dims& shape, uint32_t mask) {
  Dims out = shape;
  for (int d = 0; d < shape.size(); ++d)
    if (mask & (1u << d)) out[d] = 1;
  return out;
}

Dims squeezed_shape(const Dims& shape, uint32_t mask) {
  Dims out;
  for (int d = 0; d < shape.size(); ++d)
    if (!(mask & (1u << d))) out.push_back(shape[d]);
  return out;
}

// Gradient of a reduction output, broadcast back to the input's shape.
Tensor expand_grad(const Tensor& g, const Dims& in_shape, uint32_t mask) {
  Tensor gk = g.reshape(keepdim_shape(in_shape, mask));
  return gk.expand(in_shape);
}

// Input dim -> output dim of a reduction (-1 for reduced dims).
std::vector<int> reduce_map(int n, uint32_t mask, bool keepdim) {
  std::vector<int> map(size_t(std::max(n, 1)), -1);
  int o = 0;
  for (int d = 0; d < n; ++d) {
    if (mask & (1u << d)) {  // gone, or kept with size 1 (never sharded)
      map[size_t(d)] = -1;
      if (keepdim) ++o;
    } else {
      map[size_t(d)] = o++;
    }
  }
  return map;
}

Tensor reduce_raw(ReduceOp op, const Tensor& x, uint32_t mask, DType out_dtype, int chunks) {
  Tensor out = raw::empty(keepdim_shape(x.shape(), mask), out_dtype, x.device());
  kernels::reduce(x.device(), op, x, out, chunks > 0 ? chunks : numerics::reduction_chunks());
  return out;
}

std::vector<int> mask_dims(uint32_t mask, int n) {
  std::vector<int> dims;
  for (int d = 0; d < n; ++d)
    if (mask & (1u << d)) dims.push_back(d);
  return dims;
}

// Bitwise mode: the layout of a reduction's input. Partial inputs are reduced
// first (not exact otherwise); sharded reduced dims stay sharded when each
// piece is a whole run of chunks (the rank-order reduction finishes the
// canonical tree), else they are gathered. Sets the local chunk count.
Placements exact_reduction_layout(const ShardingContext& ctx, uint32_t mask, int& chunks) {
  const TensorSpec& x = ctx.in[0];
  Placements in = dtensor::unshard(x.placements, {}, true);
  const std::vector<int> dims = mask_dims(mask, x.dim());
  const int v = numerics::reduction_chunks();
  chunks = dtensor::local_chunks(x.shape, in, *ctx.mesh, dims, v);
  if (chunks == 0) {
    for (int d : dims) in = dtensor::unshard(in, {d}, false);
    chunks = v;
  }
  return in;
}

struct SumOp {
  static constexpr const char* kName = "sum";
  uint32_t mask;
  bool keepdim;
  int chunks = 0;  // 0: numerics::reduction_chunks()
  Dims in_shape;
  // A 16-bit sum accumulates in float32 in the canonical order and rounds
  // once (kernels/cpu/reduce.cc); the backward only expands.
  bool exact_widened() const { return true; }

  Tensor forward(const Tensor& x) {
    in_shape = x.shape();
    DType t = is_floating(x.dtype()) ? x.dtype() : DType::Int64;
    Tensor out = reduce_raw(ReduceOp::Sum, x, mask, t, chunks);
    return keepdim ? out : raw::try_view(out, squeezed_shape(x.shape(), mask));
  }
  std::vector<Tensor> backward(const GradContext&, std::vector<Tensor>& grads) {
    return {expand_grad(grads[0], in_shape, mask)};
  }

  // A sum over a sharded dim leaves a pending sum: Partial(sum). Linear, so
  // Partial inputs stay Partial.
  // In bitwise mode the local sum uses the piece's share of the canonical
  // chunks (exact_reduction_layout).
  ShardingPlan sharding(const ShardingContext& ctx) {
    const TensorSpec& x = ctx.in[0];
    Placements in = x.placements;
    if (numerics::bitwise() && is_floating(x.dtype)) in = exact_reduction_layout(ctx, mask, chunks);
    std::vector<int> map = reduce_map(x.dim(), mask, keepdim);
    return {{in}, {dtensor::map_dims(in, map.data(), Partial())}};
  }
};

struct ExtremeOp {  // amax / amin
  static constexpr const char* kName = "amax";
  uint32_t mask;
  bool keepdim;
  bool is_max;
  bool piece = false;  // a local piece of a sharded reduction: may be empty (gives -inf / +inf)
  int chunks = 0;      // 0: numerics::reduction_chunks()
  SavedTensor x, out_keep;
  const char* name() const { return is_max ? "amax" : "amin"; }

  Tensor forward(const Tensor& in) {
    const char* name = is_max ? "amax" : "amin";
    for (int d = 0; d < in.dim(); ++d)
      TESSEL_CHECK(piece || !(mask & (1u << d)) || in.shape()[d] > 0, name, "cannot reduce over empty dimension {} of {}", d,
                   in.desc());
    Tensor out = reduce_raw(is_max ? ReduceOp::Max : ReduceOp::Min, in, mask, in.dtype(), chunks);
    x = in;
    out_keep = out;
    return keepdim ? out : raw::try_view(out, squeezed_shape(in.shape(), mask));
  }
  std::vector<Tensor> backward(const GradContext&, std::vector<Tensor>& grads) {
    const Tensor& xs = x.get();
    Tensor hit = eq(xs, out_keep.get());
    std::vector<int64_t> dims;
    for (int d = 0; d < xs.dim(); ++d)
      if (mask & (1u << d)) dims.push_back(d);
    Tensor count = sum(hit.to(xs.dtype()), dims, /*keepdim=*/true);
    Tensor g = expand_grad(grads[0], xs.shape(), mask);
    return {where(hit, div(g, count), 0.0)};
  }

  // Without gradients, a max over a sharded dim is a pending max:
  // Partial(max). With gradients the winners (and ties) must be known
  // globally, so the reduced dims are gathered first.
  ShardingPlan sharding(const ShardingContext& ctx) {
    const TensorSpec& x = ctx.in[0];
    Placements in = dtensor::unshard(x.placements, {}, true);
    if (ctx.grad) {
      for (int d = 0; d < x.dim(); ++d)
        if (mask & (1u << d)) in = dtensor::unshard(in, {d}, false);
    } else if (numerics::bitwise()) {  // the sign of a zero max depends on the tree: keep it canonical
      in = exact_reduction_layout(ctx, mask, chunks);
    }
    std::vector<int> map = reduce_map(x.dim(), mask, keepdim);
    piece = true;  // the global shape was checked by the Meta run
    return {{in}, {dtensor::map_dims(in, map.data(), Partial(is_max ? comm::ReduceOp::Max : comm::ReduceOp::Min))}};
  }
};

Tensor extreme(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, bool is_max) {
  return call(ExtremeOp{reduce_mask(x, dims, is_max ? "amax" : "amin"), keepdim, is_max}, x);
}

Tensor arg_extreme(const Tensor& x, int64_t dim, bool keepdim, bool is_max);

// argmax/argmin of a distributed tensor: the reduced dim gathered, the rest
// computed on the local pieces (indices are global along the reduced dim).
Tensor arg_extreme_distributed(const Tensor& x, int d, bool keepdim, bool is_max) {
  Placements in = dtensor::unshard(x.placements(), {d}, true);
  Tensor xr = redistribute(x, in);
  Tensor local = arg_extreme(raw::local_of(xr), d, keepdim, is_max);
  std::vector<int> map = reduce_map(x.dim(), 1u << d, keepdim);
  Dims shape = keepdim_shape(x.shape(), 1u << d);
  if (!keepdim) shape = squeezed_shape(x.shape(), 1u << d);
  return raw::make_distributed(local, x.mesh(), dtensor::map_dims(in, map.data(), Replicate()), shape);
}

Tensor arg_extreme(const Tensor& x, int64_t dim, bool keepdim, bool is_max) {
  const char* name = is_max ? "argmax" : "argmin";
  int d = wrap_dim(dim, x.dim(), name);
  if (x.is_distributed() && x.dim() > 0) return arg_extreme_distributed(x, d, keepdim, is_max);
  TESSEL_CHECK(x.dim() == 0 || x.shape()[d] > 0, name, "cannot reduce over empty dimension {} of {}", d, x.desc());
  if (x.dim() == 0) return zeros(Dims{}, TensorOptions(DType::Int64).with_device(x.device()));
  uint32_t mask = 1u << d;
  Tensor out = raw::empty(keepdim_shape(x.shape(), mask), DType::Int64, x.device());
  kernels::arg_reduce(x.device(), x, d, is_max, out);
  return keepdim ? out : raw::try_view(out, squeezed_shape(x.shape(), mask));
}

std::tuple<Tensor, Tensor> extreme_with_index(const Tensor& x, int64_t dim, bool keepdim, bool is_max) {
  int d = wrap_dim(dim, x.dim(), is_max ? "max" : "min");
  Tensor idx = arg_extreme(x, d, /*keepdim=*/true, is_max);
  Tensor values = x.dim() == 0 ? x.clone() : gather(x, d, idx);  // differentiable: gradient scattered to idx
  if (!keepdim && x.dim() > 0) {
    values = values.squeeze(d);
    idx = idx.squeeze(d);
  }
  return {values, idx};
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return call(SumOp{reduce_mask(x, dims, "sum"), keepdim}, x);
}

Tensor sum_chunks(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, int chunks) {
  return call(SumOp{reduce_mask(x, dims, "sum"), keepdim, chunks}, x);
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  TESSEL_CHECK(is_floating(x.dtype()), "mean", "needs a floating-point tensor, got {} (convert with .to())",
               x.desc());
  uint32_t mask = reduce_mask(x, dims, "mean");
  int64_t n = 1;
  for (int d = 0; d < x.dim(); ++d)
    if (mask & (1u << d)) n *= x.shape()[d];
  return div(sum(x, dims, keepdim), Scalar(double(n)));
}

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) { return extreme(x, dims, keepdim, true); }
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) { return extreme(x, dims, keepdim, false); }
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) { return arg_extreme(x, dim, keepdim, true); }
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) { return arg_extreme(x, dim, keepdim, false); }
std::tuple<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_with_index(x, dim, keepdim, true);
}
std::tuple<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_with_index(x, dim, keepdim, false);
}

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  TESSEL_CHECK(is_floating(x.dtype()), "var", "needs a floating-point tensor, got {}", x.desc());
  uint32_t mask = reduce_mask(x, dims, "var");
  int64_t n = 1;
  for (int d = 0; d < x.dim(); ++d)
    if (mask & (1u << d)) n *= x.shape()[d];
  Tensor m = mean(x, dims, /*keepdim=*/true);
  Tensor dev = sub(x, m);
  return div(sum(mul(dev, dev), dims, keepdim), Scalar(double(std::max<int64_t>(n - correction, 0))));
}

Tensor stddev(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  return sqrt(var(x, dims, correction, keepdim));
}

}  // namespace tessel
