#include "autograd/ops/indexing.h"

#include <limits>
#include <string>

#include "autograd/function.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/factory.h"
#include "autograd/ops/reduce.h"
#include "dtensor/sharding.h"
#include "kernels/elementwise.h"
#include "kernels/indexing.h"
#include "runtime/numerics.h"

namespace tessel {
namespace {

void check_index_dtype(const char* op, const Tensor& index, const char* what) {
  TESSEL_CHECK(index.dtype() == DType::Int32 || index.dtype() == DType::Int64, op, "{} must be int32 or int64, got {}",
               what, index.desc());
}

// Every element of `index` must lie in [0, limit). `what` names the index
// argument, `range` says what the range is (for the message).
void check_indices(const char* op, const Tensor& index, int64_t limit, const char* what, const std::string& range) {
  int64_t pos = -1, value = 0;
  // A distributed index is checked piece by piece (each rank its own).
  const Tensor& idx = raw::local_of(index);
  kernels::index_bounds(idx.device(), idx, limit, &pos, &value);
  if (pos < 0) return;
  if (value < 0) {
    TESSEL_FAIL(op,
                "{} {} at position {} of {} is negative; negative indices are not supported (no wrap-around), "
                "valid range is [0, {}) ({})",
                what, value, coordinates_of(idx.shape(), pos).str(), index.desc(), limit, range);
  }
  TESSEL_FAIL(op, "{} {} at position {} of {} is out of range; valid range is [0, {}) ({})", what, value,
              coordinates_of(idx.shape(), pos).str(), index.desc(), limit, range);
}

// `t` as a contiguous tensor viewed with `shape` (no autograd).
Tensor contiguous_as(const Tensor& t, const Dims& shape) {
  Tensor v = raw::try_view(t, shape);
  if (v.defined() && v.is_contiguous()) return v;
  return raw::try_view(detail::contiguous_raw(t), shape);
}

int chunks() { return numerics::reduction_chunks(); }

// out = x.select(dim, index[i]) stacked along dim (index 0-D or 1-D, validated).
Tensor index_select_raw(const Tensor& x, int d, const Tensor& index) {
  Dims out_shape = x.shape();
  out_shape[d] = index.numel();
  Dims xs = x.strides();
  xs[d] = 0;
  Dims is = Dims::filled(x.dim(), 0);
  is[d] = index.dim() == 1 ? index.strides()[0] : 0;
  Tensor out = raw::empty(out_shape, x.dtype(), x.device());
  kernels::gather_strided(x.device(), raw::as_strided(x, out_shape, xs, x.offset()),
                          raw::as_strided(index, out_shape, is, index.offset()), x.strides()[d], x.shape()[d], out);
  return out;
}

// out = x gathered along d at `index` (index has x's rank, validated).
Tensor gather_raw(const Tensor& x, int d, const Tensor& index) {
  Dims xs = x.strides();
  xs[d] = 0;
  Tensor out = raw::empty(index.shape(), x.dtype(), x.device());
  kernels::gather_strided(x.device(), raw::as_strided(x, index.shape(), xs, x.offset()), index, x.strides()[d],
                          x.shape()[d], out);
  return out;
}

// Indices into a piece [start, start + size) of a sharded dim: `valid` marks
// the ones this piece holds, `local` is index - start there and 0 elsewhere.
struct MaskedIndex {
  Tensor valid, local;
};
MaskedIndex mask_index(const Tensor& index, int64_t start, int64_t size) {
  Tensor idx = detail::cast_raw(index, DType::Int64);
  MaskedIndex m;
  m.valid = logical_and(ge(idx, Scalar(start)), lt(idx, Scalar(start + size)));
  m.local = where(m.valid, sub(idx, Scalar(start)), Scalar(int64_t(0)));
  return m;
}

// A new contiguous tensor with `shape` whose value is sum over positions of src
// rows hit by index along d (assign mode of kernels::index_add).
Tensor index_add_into_zeros(const Dims& shape, int d, const Tensor& index, const Tensor& src, int v = 0) {
  Tensor out = raw::empty(shape, src.dtype(), src.device());
  kernels::index_add(src.device(), out, d, index, detail::contiguous_raw(src), v > 0 ? v : chunks(),
                     /*accumulate=*/false);
  return out;
}

// ---- embedding ---------------------------------------------------------------------------
struct EmbeddingOp {
  static constexpr const char* kName = "embedding";
  SavedTensor ids;
  Dims weight_shape;
  // Vocabulary-parallel piece: rows [vocab_start, vocab_start + rows) of
  // vocab_total; ids elsewhere give zero rows (the output is a pending sum).
  int64_t vocab_total = -1, vocab_start = 0;
  SavedTensor valid;
  int grad_chunks = 0;  // of the weight gradient's sum over tokens (0: V); the bitwise rule sets it

  Tensor forward(const Tensor& weight, const Tensor& id_in) {
    if (vocab_total >= 0) {
      check_index_dtype("embedding", id_in, "ids");
      check_indices("embedding", id_in, vocab_total, "id",
                    fmt::format(FMT_STRING("the rows of the {}-row vocabulary"), vocab_total));
      MaskedIndex m = mask_index(id_in, vocab_start, weight.shape()[0]);
      valid = m.valid;
      ids = m.local;
      weight_shape = weight.shape();
      if (weight.shape()[0] == 0) {  // an empty piece of the vocabulary: contributes zeros
        Dims os = id_in.shape();
        os.push_back(weight.shape()[1]);
        return full(os, -0.0, TensorOptions(weight.dtype()).with_device(weight.device()));
      }
      Tensor out = forward_rows(weight, m.local);
      return where(m.valid.unsqueeze(-1), out, Scalar(-0.0));  // -0: the exact identity of the pending sum
    }
    return forward_rows(weight, id_in);
  }

  Tensor forward_rows(const Tensor& weight, const Tensor& id) {
    TESSEL_CHECK(weight.dim() == 2, "embedding", "weight must be 2-D [num_embeddings, embedding_dim], got {}",
                 weight.desc());
    check_index_dtype("embedding", id, "ids");
    detail::check_same_device("embedding", weight, id);
    TESSEL_CHECK(id.dim() < kMaxDims, "embedding", "ids {} have too many dimensions for the output", id.desc());
    const int64_t V = weight.shape()[0], D = weight.shape()[1];
    check_indices("embedding", id, V, "id", fmt::format(FMT_STRING("the rows of weight {}"), weight.desc()));
    Dims out_shape = id.shape();
    out_shape.push_back(D);
    Dims ws = Dims::filled(id.dim(), 0);
    ws.push_back(weight.strides()[1]);
    Dims is = id.strides();
    is.push_back(0);
    Tensor out = raw::empty(out_shape, weight.dtype(), weight.device());
    kernels::gather_strided(weight.device(), raw::as_strided(weight, out_shape, ws, weight.offset()),
                            raw::as_strided(id, out_shape, is, id.offset()), weight.strides()[0], V, out);
    ids = id;
    weight_shape = weight.shape();
    return out;
  }

  std::vector<Tensor> backward(const GradContext& ctx, std::vector<Tensor>& grads) {
    if (!ctx.needs(0) || !grads[0].defined()) return {Tensor(), Tensor()};
    const Tensor& g = grads[0];
    const Tensor& id = ids.get();
    const int64_t T = id.numel(), D = weight_shape[1];
    if (weight_shape[0] == 0) return {raw::empty(weight_shape, g.dtype(), g.device()), Tensor()};
    Tensor flat_ids = contiguous_as(id, Dims{T});
    Tensor gm = vocab_total >= 0 ? where(valid.get().unsqueeze(-1), g, Scalar(0.0)) : g;
    Tensor g2 = contiguous_as(gm, Dims{T, D});
    return {index_add_into_zeros(weight_shape, 0, flat_ids, g2, grad_chunks), Tensor()};
  }

  // Per mesh dim: a vocabulary-sharded weight gives a pending sum (masked
  // lookups); a weight sharded along the embedding dim shards the output's
  // last dim; sharded ids shard the output like themselves; a Partial weight
  // stays Partial (linear).
  ShardingPlan sharding(const ShardingContext& ctx) {
    const TensorSpec& w = ctx.in[0];
    const TensorSpec& ids_spec = ctx.in[1];
    ShardingPlan plan;
    plan.in.resize(2);
    plan.out.resize(1);
    bool vocab = false;
    for (int m = 0; m < ctx.mesh_ndim(); ++m) {
      const Placement pw = w.placements[m], pi = ids_spec.placements[m];
      Placement a = Replicate(), b = Replicate(), o = Replicate();
      if (pw.is_shard(0)) a = pw, o = Partial(), vocab = true;
      else if (pw.is_shard(1)) a = pw, o = Shard(ids_spec.dim());
      else if (pi.is_shard()) b = pi, o = pi;
      else if (pw.is_partial_sum()) a = pw, o = Partial();
      plan.in[0].push_back(a), plan.in[1].push_back(b), plan.out[0].push_back(o);
    }
    if (numerics::bitwise()) {  // the weight gradient sums over tokens: exact pieces or gathered ids
      std::vector<int> tokens;
      for (int d = 0; d < ids_spec.dim(); ++d) tokens.push_back(d);
      grad_chunks = dtensor::local_chunks(ids_spec.shape, plan.in[1], *ctx.mesh, tokens, chunks());
      if (grad_chunks == 0) {
        for (int m = 0; m < ctx.mesh_ndim(); ++m)
          if (plan.in[1][m].is_shard()) plan.in[1][m] = Replicate(), plan.out[0][m] = Replicate();
        grad_chunks = chunks();
      }
    }
    if (vocab) {
      vocab_total = w.shape[0];
      vocab_start = ctx.local(w.shape, plan.in[0]).offset[0];
    }
    return plan;
  }
};

// ---- gather / scatter_add ---------------------------------------------------------------------
void check_gather_shapes(const char* op, const Tensor& x, int d, const Tensor& index) {
  TESSEL_CHECK(index.dim() == x.dim(), op, "index {} must have the rank of the input {}", index.desc(), x.desc());
  for (int e = 0; e < x.dim(); ++e) {
    TESSEL_CHECK(e == d || index.shape()[e] <= x.shape()[e], op,
                 "index {} is larger than input {} at dimension {} (only dimension {} may be larger)", index.desc(),
                 x.desc(), e, d);
  }
}

struct GatherOp {
  static constexpr const char* kName = "gather";
  int d;
  SavedTensor index;
  Dims x_shape;
  // x sharded along d: this piece holds [start, start + x.shape[d]) of `total`;
  // indices elsewhere give 0 (the output is a pending sum).
  int64_t total = -1, start = 0;
  SavedTensor valid;
  int grad_chunks = 0;  // x's gradient sums over positions along d (0: V)

  Tensor forward(const Tensor& x, const Tensor& idx_in) {
    if (total >= 0) {
      check_index_dtype("gather", idx_in, "index");
      check_indices("gather", idx_in, total, "index", fmt::format(FMT_STRING("dimension {} of size {}"), d, total));
      MaskedIndex m = mask_index(idx_in, start, x.shape()[d]);
      valid = m.valid;
      index = m.local;
      x_shape = x.shape();
      if (x.shape()[d] == 0) return full(idx_in.shape(), -0.0, TensorOptions(x.dtype()).with_device(x.device()));
      return where(m.valid, gather_raw(x, d, m.local), Scalar(-0.0));  // -0: the exact identity of the pending sum
    }
    return forward_plain(x, idx_in);
  }

  Tensor forward_plain(const Tensor& x, const Tensor& idx) {
    check_index_dtype("gather", idx, "index");
    detail::check_same_device("gather", x, idx);
    check_gather_shapes("gather", x, d, idx);
    check_indices("gather", idx, x.shape()[d], "index",
                  fmt::format(FMT_STRING("dimension {} of input {}"), d, x.desc()));
    index = idx;
    x_shape = x.shape();
    return gather_raw(x, d, idx);
  }

  std::vector<Tensor> backward(const GradContext& ctx, std::vector<Tensor>& grads) {
    if (!ctx.needs(0) || !grads[0].defined()) return {Tensor(), Tensor()};
    Tensor g = grads[0];
    if (total >= 0) g = where(valid.get(), g, Scalar(0.0));
    Tensor dx = raw::empty(x_shape, g.dtype(), g.device());
    if (dx.numel() == 0) return {dx, Tensor()};
    kernels::scatter_add(g.device(), dx, d, index.get(), g, grad_chunks > 0 ? grad_chunks : chunks(),
                         /*accumulate=*/false);
    return {dx, Tensor()};
  }

  // Per mesh dim: x sharded along the gather dim -> masked gathers, pending
  // sum; x and index sharded alike along another dim (equal sizes there) ->
  // sharded output; index sharded along the gather dim with x replicated ->
  // output sharded there; Partial x stays Partial.
  ShardingPlan sharding(const ShardingContext& ctx) {
    const TensorSpec& x = ctx.in[0];
    const TensorSpec& ix = ctx.in[1];
    ShardingPlan plan;
    plan.in.resize(2);
    plan.out.resize(1);
    bool masked = false;
    for (int m = 0; m < ctx.mesh_ndim(); ++m) {
      const Placement px = x.placements[m], pi = ix.placements[m];
      auto same_size = [&](int e) { return x.shape[e] == ix.shape[e]; };
      Placement a = Replicate(), b = Replicate(), o = Replicate();
      if (px.is_shard(d)) a = px, o = Partial(), masked = true;
      else if (px.is_shard() && same_size(px.dim)) a = px, b = px, o = px;
      else if (pi.is_shard() && pi.dim != d && same_size(pi.dim)) a = pi, b = pi, o = pi;
      else if (pi.is_shard(d)) b = pi, o = pi;
      else if (px.is_partial_sum()) a = px, o = Partial();
      plan.in[0].push_back(a), plan.in[1].push_back(b), plan.out[0].push_back(o);
    }
    if (numerics::bitwise()) {  // an index sharded along d cuts x's gradient sum over positions
      grad_chunks = dtensor::local_chunks(ix.shape, plan.in[1], *ctx.mesh, {d}, chunks());
      if (grad_chunks == 0) {
        for (int m = 0; m < ctx.mesh_ndim(); ++m)
          if (plan.in[1][m].is_shard(d)) plan.in[1][m] = Replicate(), plan.out[0][m] = Replicate();
        grad_chunks = chunks();
      }
    }
    if (masked) {
      total = x.shape[d];
      start = ctx.local(x.shape, plan.in[0]).offset[d];
    }
    return plan;
  }
};

struct ScatterAddOp {
  static constexpr const char* kName = "scatter_add";
  int d;
  SavedTensor index;
  Dims src_shape;

  Tensor forward(const Tensor& x, const Tensor& idx, const Tensor& src) {
    check_index_dtype("scatter_add", idx, "index");
    detail::check_same_device("scatter_add", x, idx);
    detail::check_same_device("scatter_add", x, src);
    TESSEL_CHECK(x.dtype() == src.dtype(), "scatter_add", "source {} must have the dtype of the input {}",
                 src.desc(), x.desc());
    TESSEL_CHECK(idx.dim() == x.dim() && src.dim() == x.dim(), "scatter_add",
                 "input {}, index {} and source {} must have the same rank", x.desc(), idx.desc(), src.desc());
    for (int e = 0; e < x.dim(); ++e) {
      TESSEL_CHECK(idx.shape()[e] <= src.shape()[e], "scatter_add",
                   "index {} is larger than source {} at dimension {}", idx.desc(), src.desc(), e);
      TESSEL_CHECK(e == d || idx.shape()[e] <= x.shape()[e], "scatter_add",
                   "index {} is larger than input {} at dimension {} (only dimension {} may be larger)", idx.desc(),
                   x.desc(), e, d);
    }
    check_indices("scatter_add", idx, x.shape()[d], "index",
                  fmt::format(FMT_STRING("dimension {} of input {}"), d, x.desc()));
    Tensor out = raw::empty(x.shape(), x.dtype(), x.device());
    kernels::copy(x.device(), x, out);
    kernels::scatter_add(x.device(), out, d, idx, src, chunks(), /*accumulate=*/true);
    index = idx;
    src_shape = src.shape();
    return out;
  }

  std::vector<Tensor> backward(const GradContext& ctx, std::vector<Tensor>& grads) {
    const Tensor& g = grads[0];
    if (!g.defined()) return {Tensor(), Tensor(), Tensor()};
    Tensor dx, dsrc;
    if (ctx.needs(0)) dx = g;
    if (ctx.needs(2)) {
      const Tensor& idx = index.get();
      Tensor part = gather_raw(g, d, idx);
      if (idx.shape() == src_shape) {
        dsrc = part;
      } else {  // only the index-shaped corner of src was used
        dsrc = zeros(src_shape, TensorOptions(g.dtype()).with_device(g.device()));
        kernels::copy(g.device(), part, raw::as_strided(dsrc, idx.shape(), dsrc.strides(), 0));
      }
    }
    return {dx, Tensor(), dsrc};
  }

  // Sharded alike along a dim other than d (x, index, source of one size
  // there) stays sharded; x and source both Partial stay Partial; else replicated.
  ShardingPlan sharding(const ShardingContext& ctx) {
    const TensorSpec& x = ctx.in[0];
    const TensorSpec& ix = ctx.in[1];
    const TensorSpec& src = ctx.in[2];
    ShardingPlan plan;
    plan.in.resize(3);
    plan.out.resize(1);
    for (int m = 0; m < ctx.mesh_ndim(); ++m) {
      Placement c = Replicate();
      for (const TensorSpec* t : {&x, &ix, &src}) {
        const Placement p = t->placements[m];
        if (p.is_shard() && p.dim != d && x.shape[p.dim] == ix.shape[p.dim] && x.shape[p.dim] == src.shape[p.dim])
          c = p;
      }
      Placement a = c, b = c, s = c, o = c;
      if (!c.is_shard() && !numerics::bitwise() && x.placements[m].is_partial_sum() &&
          src.placements[m].is_partial_sum())
        a = Partial(), b = Replicate(), s = Partial(), o = Partial();
      plan.in[0].push_back(a), plan.in[1].push_back(b), plan.in[2].push_back(s), plan.out[0].push_back(o);
    }
    return plan;
  }
};

// ---- index_select / index_add ---------------------------------------------------------------
void check_index_vector(const char* op, const Tensor& index) {
  check_index_dtype(op, index, "index");
  TESSEL_CHECK(index.dim() <= 1, op, "index must be 0-D or 1-D, got {}", index.desc());
}

struct IndexSelectOp {
  static constexpr const char* kName = "index_select";
  int d;
  SavedTensor index;
  Dims x_shape;

  int grad_chunks = 0;  // x's gradient sums over index positions (0: V)

  Tensor forward(const Tensor& x, const Tensor& idx) {
    check_index_vector("index_select", idx);
    detail::check_same_device("index_select", x, idx);
    check_indices("index_select", idx, x.shape()[d], "index",
                  fmt::format(FMT_STRING("dimension {} of input {}"), d, x.desc()));
    index = idx;
    x_shape = x.shape();
    return index_select_raw(x, d, idx);
  }

  std::vector<Tensor> backward(const GradContext& ctx, std::vector<Tensor>& grads) {
    if (!ctx.needs(0) || !grads[0].defined()) return {Tensor(), Tensor()};
    return {index_add_into_zeros(x_shape, d, index.get(), grads[0], grad_chunks), Tensor()};
  }

  // x sharded along another dim keeps it; a sharded index shards the output
  // along d; Partial x stays Partial (a selection); x sharded along d is
  // gathered. Bitwise mode: a sharded index must cut the gradient's sum over
  // positions into exact pieces, else it is gathered.
  ShardingPlan sharding(const ShardingContext& ctx) {
    const TensorSpec& x = ctx.in[0];
    const TensorSpec& ix = ctx.in[1];
    ShardingPlan plan;
    plan.in.resize(2);
    plan.out.resize(1);
    for (int m = 0; m < ctx.mesh_ndim(); ++m) {
      const Placement px = x.placements[m], pi = ix.placements[m];
      Placement a = Replicate(), b = Replicate(), o = Replicate();
      if (px.is_shard() && px.dim != d) a = px, o = px;
      else if (pi.is_shard(0) && ix.dim() == 1) b = pi, o = Shard(d);
      else if (px.is_partial_sum()) a = px, o = px;
      plan.in[0].push_back(a), plan.in[1].push_back(b), plan.out[0].push_back(o);
    }
    if (numerics::bitwise() && ix.dim() == 1) {
      grad_chunks = dtensor::local_chunks(ix.shape, plan.in[1], *ctx.mesh, {0}, chunks());
      if (grad_chunks == 0) {
        for (int m = 0; m < ctx.mesh_ndim(); ++m)
          if (plan.in[1][m].is_shard()) plan.in[1][m] = Replicate(), plan.out[0][m] = Replicate();
        grad_chunks = chunks();
      }
    }
    return plan;
  }
};

struct IndexAddOp {
  static constexpr const char* kName = "index_add";
  int d;
  Scalar alpha;
  SavedTensor index;

  bool unit_alpha() const { return alpha.to_double() == 1.0; }

  Tensor forward(const Tensor& x, const Tensor& idx, const Tensor& src) {
    check_index_vector("index_add", idx);
    detail::check_same_device("index_add", x, idx);
    detail::check_same_device("index_add", x, src);
    TESSEL_CHECK(x.dtype() == src.dtype(), "index_add", "source {} must have the dtype of the input {}", src.desc(),
                 x.desc());
    TESSEL_CHECK(!alpha.is_floating() || is_floating(x.dtype()), "index_add",
                 "alpha {} must be an integer for the integer input {}", alpha.to_double(), x.desc());
    Dims want = x.shape();
    want[d] = idx.numel();
    TESSEL_CHECK(src.shape() == want, "index_add",
                 "source {} must have the input's shape with dimension {} equal to the number of indices ({}): {}",
                 src.desc(), d, idx.numel(), want);
    check_indices("index_add", idx, x.shape()[d], "index",
                  fmt::format(FMT_STRING("dimension {} of input {}"), d, x.desc()));
    Tensor out = raw::empty(x.shape(), x.dtype(), x.device());
    kernels::copy(x.device(), x, out);
    Tensor s = unit_alpha() ? src : mul(src, alpha);
    kernels::index_add(x.device(), out, d, idx, detail::contiguous_raw(s), chunks(), /*accumulate=*/true);
    index = idx;
    return out;
  }

  std::vector<Tensor> backward(const GradContext& ctx, std::vector<Tensor>& grads) {
    const Tensor& g = grads[0];
    if (!g.defined()) return {Tensor(), Tensor(), Tensor()};
    Tensor dx, dsrc;
    if (ctx.needs(0)) dx = g;
    if (ctx.needs(2)) {
      dsrc = index_select_raw(g, d, index.get());
      if (!unit_alpha()) dsrc = mul(dsrc, alpha);
    }
    return {dx, Tensor(), dsrc};
  }

  // x and source sharded alike along a dim other than d stay sharded; both
  // Partial stay Partial; otherwise replicated.
  ShardingPlan sharding(const ShardingContext& ctx) {
    const TensorSpec& x = ctx.in[0];
    const TensorSpec& src = ctx.in[2];
    ShardingPlan plan;
    plan.in.resize(3);
    plan.out.resize(1);
    for (int m = 0; m < ctx.mesh_ndim(); ++m) {
      const Placement px = x.placements[m], ps = src.placements[m];
      Placement c = Replicate();
      if (px.is_shard() && px.dim != d) c = px;
      else if (ps.is_shard() && ps.dim != d) c = ps;
      Placement a = c, s = c, o = c;
      if (!c.is_shard() && !numerics::bitwise() && px.is_partial_sum() && ps.is_partial_sum())
        a = px, s = ps, o = Partial();
      plan.in[0].push_back(a), plan.in[1].push_back(Replicate()), plan.in[2].push_back(s), plan.out[0].push_back(o);
    }
    return plan;
  }
};

// ---- tril / triu ------------------------------------------------------------------------------
struct TriangleOp {
  static constexpr const char* kName = "tril";
  int64_t k;
  bool upper;
  const char* name() const { return upper ? "triu" : "tril"; }

  Tensor forward(const Tensor& x) {
    TESSEL_CHECK(x.dim() >= 2, name(), "expects a tensor with at least 2 dimensions, got {}", x.desc());
    Tensor out = raw::empty(x.shape(), x.dtype(), x.device());
    kernels::triangle(x.device(), x, k, upper, out);
    return out;
  }

  std::vector<Tensor> backward(const GradContext&, std::vector<Tensor>& grads) {
    const Tensor& g = grads[0];
    if (!g.defined()) return {Tensor()};
    Tensor dx = raw::empty(g.shape(), g.dtype(), g.device());
    kernels::triangle(g.device(), g, k, upper, dx);
    return {dx};
  }

  // Any layout works: a piece at rows r0.., columns c0.. keeps the global
  // diagonal with k + r0 - c0. Linear, so Partial stays Partial.
  ShardingPlan sharding(const ShardingContext& ctx) {
    const TensorSpec& x = ctx.in[0];
    LocalGeometry g = ctx.local(x.shape, x.placements);
    k += g.offset[x.dim() - 2] - g.offset[x.dim() - 1];
    return {{x.placements}, {x.placements}};
  }
};

// 0-dim inputs index like 1-element vectors.
Tensor as_vector(const Tensor& t) { return t.dim() == 0 ? t.reshape({1}) : t; }

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& ids) { return call(EmbeddingOp{}, weight, ids); }

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  if (x.dim() == 0) {
    wrap_dim(dim, 0, "gather");
    TESSEL_CHECK(index.dim() == 0, "gather", "index {} must have the rank of the input {}", index.desc(), x.desc());
    return gather(as_vector(x), 0, as_vector(index)).reshape({});
  }
  return call(GatherOp{wrap_dim(dim, x.dim(), "gather")}, x, index);
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  if (x.dim() == 0) {
    wrap_dim(dim, 0, "scatter_add");
    TESSEL_CHECK(index.dim() == 0 && src.dim() == 0, "scatter_add",
                 "input {}, index {} and source {} must have the same rank", x.desc(), index.desc(), src.desc());
    return scatter_add(as_vector(x), 0, as_vector(index), as_vector(src)).reshape({});
  }
  return call(ScatterAddOp{wrap_dim(dim, x.dim(), "scatter_add")}, x, index, src);
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  if (x.dim() == 0) {
    wrap_dim(dim, 0, "index_select");
    return index_select(as_vector(x), 0, index).reshape({});
  }
  return call(IndexSelectOp{wrap_dim(dim, x.dim(), "index_select")}, x, index);
}

Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src, Scalar alpha) {
  if (x.dim() == 0) {
    wrap_dim(dim, 0, "index_add");
    return index_add(as_vector(x), 0, index, as_vector(src), alpha).reshape({});
  }
  return call(IndexAddOp{wrap_dim(dim, x.dim(), "index_add"), alpha}, x, index, src);
}

Tensor tril(const Tensor& x, int64_t k) { return call(TriangleOp{k, false}, x); }
Tensor triu(const Tensor& x, int64_t k) { return call(TriangleOp{k, true}, x); }

Tensor one_hot(const Tensor& ids, int64_t num_classes) {
  check_index_dtype("one_hot", ids, "ids");
  TESSEL_CHECK(num_classes >= -1, "one_hot", "num_classes must be -1 (infer) or >= 0, got {}", num_classes);
  if (num_classes == -1) {
    TESSEL_CHECK(ids.numel() > 0, "one_hot", "cannot infer num_classes from empty ids {}; pass num_classes",
                 ids.desc());
    check_indices("one_hot", ids, std::numeric_limits<int64_t>::max(), "id", "inferring num_classes");
    num_classes = amax(ids).to(DType::Int64).item<int64_t>() + 1;
  }
  check_indices("one_hot", ids, num_classes, "id", fmt::format(FMT_STRING("num_classes = {}"), num_classes));
  Tensor classes = arange(num_classes).to(ids.device());
  return eq(ids.unsqueeze(-1), classes).to(DType::Int64);
}

}  // namespace tessel
