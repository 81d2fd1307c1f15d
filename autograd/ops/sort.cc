#include "autograd/ops/sort.h"

#include "autograd/function.h"
#include "dtensor/sharding.h"
#include "kernels/indexing.h"
#include "kernels/sort.h"
#include "runtime/numerics.h"

namespace tessel {
namespace {

// sort (k < 0) and topk (k >= 0) share one op: (values, indices) out, the
// values' gradient scattered back through the indices.
struct SortOp {
  static constexpr const char* kName = "sort";
  int d;
  bool descending;  // sort: descending; topk: largest
  bool sorted;      // topk only
  int64_t k;        // -1: sort
  SavedTensor indices;
  Dims in_shape;
  const char* name() const { return k < 0 ? "sort" : "topk"; }

  std::vector<Tensor> forward(const Tensor& x) {
    Dims shape = x.shape();
    if (k >= 0) {
      TESSEL_CHECK(k <= shape[d], "topk", "k = {} is out of range for dimension {} of size {} ({})", k, d, shape[d],
                   x.desc());
      shape[d] = k;
    }
    Tensor values = raw::empty(shape, x.dtype(), x.device());
    Tensor idx = raw::empty(shape, DType::Int64, x.device());
    if (k < 0) kernels::sort(x.device(), x, d, descending, values, idx);
    else kernels::topk(x.device(), x, k, d, descending, sorted, values, idx);
    indices = idx;
    in_shape = x.shape();
    return {values, idx};
  }

  std::vector<Tensor> backward(const GradContext& ctx, std::vector<Tensor>& grads) {
    const Tensor& g = grads[0];
    if (!ctx.needs(0) || !g.defined()) return {Tensor()};
    // The indices of one line are distinct, so each source element receives at
    // most one gradient: the scatter is exact.
    Tensor dx = raw::empty(in_shape, g.dtype(), g.device());
    kernels::scatter_add(g.device(), dx, d, indices.get(), g, numerics::reduction_chunks(), /*accumulate=*/false);
    return {dx};
  }

  // Lines along d are whole; other dims keep their shards.
  ShardingPlan sharding(const ShardingContext& ctx) {
    Placements p = dtensor::unshard(ctx.in[0].placements, {d}, true);
    return {{p}, {p, p}};
  }
};

std::tuple<Tensor, Tensor> run(const Tensor& x, int64_t dim, bool descending, bool sorted, int64_t k,
                               const char* op) {
  if (x.dim() == 0) {  // a scalar sorts like a 1-element vector
    wrap_dim(dim, 0, op);
    auto [v, i] = run(x.reshape({1}), 0, descending, sorted, k, op);
    const Dims shape = k == 0 ? Dims{0} : Dims{};
    return {v.reshape(shape), i.reshape(shape)};
  }
  std::vector<Tensor> out = call(SortOp{wrap_dim(dim, x.dim(), op), descending, sorted, k}, x);
  return {out[0], out[1]};
}

}  // namespace

std::tuple<Tensor, Tensor> sort(const Tensor& x, int64_t dim, bool descending, bool /*stable: always*/) {
  return run(x, dim, descending, true, -1, "sort");
}

Tensor argsort(const Tensor& x, int64_t dim, bool descending, bool stable) {
  return std::get<1>(sort(x, dim, descending, stable));
}

std::tuple<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim, bool largest, bool sorted) {
  TESSEL_CHECK(k >= 0, "topk", "k must be non-negative, got {} ({})", k, x.desc());
  return run(x, dim, largest, sorted, k, "topk");
}

}  // namespace tessel
