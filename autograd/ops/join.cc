#include "autograd/ops/join.h"

#include "autograd/function.h"
#include "autograd/ops/common.h"
#include "dtensor/sharding.h"
#include "kernels/elementwise.h"

namespace tessel {
namespace {

// cat and stack: copies of every input into narrow()ed views of the output;
// the gradients are the matching views of the output gradient.
struct JoinOp {
  static constexpr const char* kName = "cat";
  bool is_stack;
  int64_t dim;
  int d = 0;
  std::vector<int64_t> lengths;  // per input along d; -1: a skipped empty input
  const char* name() const { return is_stack ? "stack" : "cat"; }

  // cat's legacy rule: a 1-D tensor with no elements joins anything.
  static bool skippable(const Tensor& t) { return t.dim() == 1 && t.shape()[0] == 0; }

  Tensor forward(const std::vector<Tensor>& xs) {
    const char* op = name();
    TESSEL_CHECK(!xs.empty(), op, "expects at least one tensor, got none");
    for (size_t i = 0; i < xs.size(); ++i)
      TESSEL_CHECK(xs[i].defined(), op, "tensor {} of {} is undefined", i, xs.size());
    DType dtype = xs[0].dtype();
    for (size_t i = 1; i < xs.size(); ++i) {
      detail::check_same_device(op, xs[0], xs[i]);
      dtype = promote_types(dtype, xs[i].dtype());
    }
    std::vector<Tensor> parts(xs.size());
    lengths.assign(xs.size(), -1);
    Dims out_shape;
    if (is_stack) {
      d = wrap_dim(dim, xs[0].dim() + 1, op);
      for (size_t i = 0; i < xs.size(); ++i) {
        TESSEL_CHECK(xs[i].shape() == xs[0].shape(), op,
                     "expects tensors of one shape, but tensor {} is {} and tensor 0 is {}", i, xs[i].desc(),
                     xs[0].desc());
        parts[i] = raw::unsqueeze(xs[i], d);
        lengths[i] = 1;
      }
      out_shape = xs[0].shape();
      out_shape.insert(d, int64_t(xs.size()));
    } else {
      size_t ref = 0;
      while (ref < xs.size() && skippable(xs[ref])) ++ref;
      if (ref == xs.size()) ref = 0;  // all empty vectors: join them as they are
      const Tensor& r = xs[ref];
      TESSEL_CHECK(r.dim() > 0, op, "zero-dimensional tensor {} cannot be concatenated (tensor {})", r.desc(), ref);
      d = wrap_dim(dim, r.dim(), op);
      int64_t total = 0;
      for (size_t i = 0; i < xs.size(); ++i) {
        const Tensor& x = xs[i];
        if (i != ref && skippable(x) && !skippable(r)) continue;
        bool ok = x.dim() == r.dim();
        for (int e = 0; ok && e < r.dim(); ++e) ok = e == d || x.shape()[e] == r.shape()[e];
        TESSEL_CHECK(ok, op,
                     "tensor {} {} does not match tensor {} {}: shapes may differ only in dimension {}", i, x.desc(),
                     ref, r.desc(), d);
        parts[i] = x;
        lengths[i] = x.shape()[d];
        total += lengths[i];
      }
      out_shape = r.shape();
      out_shape[d] = total;
    }
    Tensor out = raw::empty(out_shape, dtype, xs[0].device());
    int64_t offset = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      if (lengths[i] < 0) continue;
      kernels::copy(out.device(), parts[i], raw::narrow(out, d, offset, lengths[i]));
      offset += lengths[i];
    }
    return out;
  }

  std::vector<Tensor> backward(const GradContext& ctx, std::vector<Tensor>& grads) {
    const Tensor& g = grads[0];
    std::vector<Tensor> out(lengths.size());
    if (!g.defined()) return out;
    int64_t offset = 0;
    for (size_t i = 0; i < lengths.size(); ++i) {
      if (lengths[i] < 0) {  // a skipped empty vector: its gradient is empty too
        if (ctx.needs(i)) out[i] = raw::empty(Dims{0}, g.dtype(), g.device());
        continue;
      }
      if (ctx.needs(i)) out[i] = is_stack ? raw::select(g, d, offset) : raw::narrow(g, d, offset, lengths[i]);
      offset += lengths[i];
    }
    return out;
  }

  // Inputs sharded alike along a dim other than the joined one stay sharded
  // (stack shifts dims at and after the new one); all Partial stay Partial.
  ShardingPlan sharding(const ShardingContext& ctx) {
    const int n = ctx.in[0].dim();
    bool same_rank = true;
    for (const TensorSpec& s : ctx.in) same_rank = same_rank && s.dim() == n;
    const int jd = same_rank && n > 0 ? wrap_dim(dim, is_stack ? n + 1 : n, name()) : -1;
    ShardingPlan plan;
    plan.in.resize(ctx.in.size());
    plan.out.resize(1);
    for (int m = 0; m < ctx.mesh_ndim(); ++m) {
      Placement c = Replicate();
      const Placement first = ctx.in[0].placements[m];
      bool all_partial = true;
      for (const TensorSpec& s : ctx.in) all_partial = all_partial && s.placements[m].is_partial_sum();
      if (same_rank && first.is_shard() && (is_stack || first.dim != jd)) c = first;
      else if (same_rank && all_partial) c = Partial();
      for (auto& p : plan.in) p.push_back(c);
      Placement o = c;
      if (c.is_shard() && is_stack && c.dim >= jd) o = Shard(c.dim + 1);
      plan.out[0].push_back(o);
    }
    return plan;
  }
};

// split and chunk: views of x; the gradient assembles the pieces' gradients
// (zeros for pieces nothing used).
struct SplitOp {
  static constexpr const char* kName = "split";
  const char* op;
  int d;
  std::vector<int64_t> sizes;
  Dims in_shape;
  const char* name() const { return op; }
  // The backward assembles the pieces' gradients (zeros where none): no arithmetic.
  bool partial_exact() const { return true; }

  std::vector<Tensor> forward(const Tensor& x) {
    in_shape = x.shape();
    std::vector<Tensor> outs;
    outs.reserve(sizes.size());
    int64_t offset = 0;
    for (int64_t s : sizes) {
      outs.push_back(raw::narrow(x, d, offset, s));
      offset += s;
    }
    return outs;
  }

  std::vector<Tensor> backward(const GradContext& ctx, std::vector<Tensor>& grads) {
    const Tensor* any = nullptr;
    for (const Tensor& g : grads)
      if (g.defined()) any = &g;
    if (!ctx.needs(0) || !any) return {Tensor()};
    Tensor dx = raw::empty(in_shape, any->dtype(), any->device());
    int64_t offset = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      Tensor part = raw::narrow(dx, d, offset, sizes[i]);
      if (grads[i].defined()) kernels::copy(dx.device(), grads[i], part);
      else kernels::fill(dx.device(), part, Scalar(0));
      offset += sizes[i];
    }
    return {dx};
  }

  // Pieces keep x's layout; x sharded along the split dim is gathered.
  ShardingPlan sharding(const ShardingContext& ctx) {
    Placements p = dtensor::unshard(ctx.in[0].placements, {d}, false);
    return {{p}, std::vector<Placements>(ctx.out.size(), p)};
  }
};

int split_dim(const Tensor& x, int64_t dim, const char* op) {
  TESSEL_CHECK(x.dim() > 0, op, "cannot split a zero-dimensional tensor {}", x.desc());
  return wrap_dim(dim, x.dim(), op);
}

std::vector<Tensor> split_with_sizes(const Tensor& x, std::vector<int64_t> sizes, int d, const char* op) {
  return call(SplitOp{op, d, std::move(sizes)}, x);
}

}  // namespace

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) { return call(JoinOp{false, dim}, xs); }
Tensor stack(const std::vector<Tensor>& xs, int64_t dim) { return call(JoinOp{true, dim}, xs); }

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  const int d = split_dim(x, dim, "split");
  const int64_t n = x.shape()[d];
  TESSEL_CHECK(split_size > 0 || (split_size == 0 && n == 0), "split",
               "split_size must be positive, got {} for dimension {} of {}", split_size, d, x.desc());
  const int64_t pieces = split_size == 0 ? 1 : std::max<int64_t>((n + split_size - 1) / split_size, 1);
  std::vector<int64_t> sizes(size_t(pieces), split_size);
  sizes.back() = n - split_size * (pieces - 1);
  return split_with_sizes(x, std::move(sizes), d, "split");
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  const int d = split_dim(x, dim, "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    TESSEL_CHECK(s >= 0, "split", "sizes {} contain a negative size (splitting dimension {} of {})",
                 fmt::join(sizes, ", "), d, x.desc());
    total += s;
  }
  TESSEL_CHECK(total == x.shape()[d], "split", "sizes [{}] sum to {} but dimension {} of {} has size {}",
               fmt::join(sizes, ", "), total, d, x.desc(), x.shape()[d]);
  return split_with_sizes(x, sizes, d, "split");
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  const int d = split_dim(x, dim, "chunk");
  TESSEL_CHECK(chunks > 0, "chunk", "number of chunks must be positive, got {} ({})", chunks, x.desc());
  const int64_t n = x.shape()[d];
  if (n == 0) return split_with_sizes(x, std::vector<int64_t>(size_t(chunks), 0), d, "chunk");
  const int64_t size = (n + chunks - 1) / chunks;
  const int64_t pieces = (n + size - 1) / size;
  std::vector<int64_t> sizes(size_t(pieces), size);
  sizes.back() = n - size * (pieces - 1);
  return split_with_sizes(x, std::move(sizes), d, "chunk");
}

}  // namespace tessel
