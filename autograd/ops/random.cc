#include "autograd/ops/random.h"

#include <cmath>
#include <limits>

#include "autograd/function.h"
#include "autograd/ops/common.h"
#include "dtensor/ops.h"
#include "dtensor/sharding.h"

namespace tessel {

using kernels::RandomDist;
using kernels::RandomParams;

uint64_t stream_for(const std::string& path, std::initializer_list<uint64_t> counters) {
  uint64_t s = hash_string(path.c_str());
  for (uint64_t c : counters) s = combine_stream(s, c);
  return s;
}

namespace {

void check_floating_dtype(const char* op, DType t) {
  TESSEL_CHECK(is_floating(t), op, "needs a floating-point dtype, got {}", dtype_name(t));
}

void check_probability(const char* op, double p) {
  TESSEL_CHECK(p >= 0.0 && p <= 1.0, op, "probability p must be in [0, 1], got {}", p);  // false for NaN
}

Tensor random_tensor(const char* op, const Dims& shape, TensorOptions opts, const RandomParams& params,
                     const GlobalBlock& block) {
  kernels::check_global_block(op, shape, block);
  Tensor t = raw::empty(shape, opts.dtype, opts.device);
  kernels::random_fill(t.device(), t, params, block);
  if (opts.requires_grad) t.requires_grad_(true);
  return t;
}

TensorOptions options_of(const Tensor& t) { return TensorOptions(t.dtype()).with_device(t.device()); }

}  // namespace

Tensor rand(const Dims& shape, PhiloxKey key, TensorOptions opts, const GlobalBlock& block) {
  check_floating_dtype("rand", opts.dtype);
  RandomParams p;
  p.dist = RandomDist::Uniform;
  p.key = key;
  p.lo = 0.0;
  p.hi = 1.0;
  return random_tensor("rand", shape, opts, p, block);
}

Tensor randn(const Dims& shape, PhiloxKey key, TensorOptions opts, const GlobalBlock& block) {
  check_floating_dtype("randn", opts.dtype);
  RandomParams p;
  p.dist = RandomDist::Normal;
  p.key = key;
  return random_tensor("randn", shape, opts, p, block);
}

Tensor randint(int64_t low, int64_t high, const Dims& shape, PhiloxKey key, TensorOptions opts,
               const GlobalBlock& block) {
  TESSEL_CHECK(opts.dtype != DType::Bool, "randint", "needs a numeric dtype, got bool");
  TESSEL_CHECK(low < high, "randint", "empty range: low {} must be < high {}", low, high);
  __int128 range = __int128(high) - __int128(low);
  TESSEL_CHECK(range <= __int128(UINT32_MAX), "randint",
               "range high - low = {} - {} exceeds 2^32 - 1, the limit of the 32-bit multiply-shift method", high,
               low);
  if (opts.dtype == DType::Int32) {
    TESSEL_CHECK(low >= std::numeric_limits<int32_t>::min() && high - 1 <= std::numeric_limits<int32_t>::max(),
                 "randint", "range [{}, {}) does not fit in int32", low, high);
  }
  RandomParams p;
  p.dist = RandomDist::Randint;
  p.key = key;
  p.low = low;
  p.range = uint32_t(range);
  return random_tensor("randint", shape, opts, p, block);
}

Tensor bernoulli(const Dims& shape, double p, PhiloxKey key, TensorOptions opts, const GlobalBlock& block) {
  check_probability("bernoulli", p);
  RandomParams params;
  params.dist = RandomDist::Bernoulli;
  params.key = key;
  params.threshold = kernels::bernoulli_threshold(p);
  return random_tensor("bernoulli", shape, opts, params, block);
}

Tensor rand_like(const Tensor& t, PhiloxKey key, const GlobalBlock& block) {
  if (t.is_distributed() && block.is_whole())
    return rand(t.shape(), key, t.mesh(), dtensor::unshard(t.placements(), {}, true), options_of(t));
  return rand(t.shape(), key, options_of(t), block);
}
Tensor randn_like(const Tensor& t, PhiloxKey key, const GlobalBlock& block) {
  if (t.is_distributed() && block.is_whole())
    return randn(t.shape(), key, t.mesh(), dtensor::unshard(t.placements(), {}, true), options_of(t));
  return randn(t.shape(), key, options_of(t), block);
}

namespace {

// Forward and backward are the same kernel: out = keep ? in * scale : 0, with
// the mask recomputed from the key (nothing saved but the key).
struct DropoutOp {
  static constexpr const char* kName = "dropout";
  PhiloxKey key;
  uint32_t keep_threshold;
  double scale;
  GlobalBlock block;
  DType dtype = DType::Float32;

  Tensor forward(const Tensor& x) {
    dtype = x.dtype();
    Tensor out = raw::empty(x.shape(), x.dtype(), x.device());
    kernels::dropout(x.device(), x, out, key, keep_threshold, scale, block);
    return out;
  }

  std::vector<Tensor> backward(const GradContext&, std::vector<Tensor>& grads) {
    Tensor g = detail::cast_raw(grads[0], dtype);
    Tensor dx = raw::empty(g.shape(), g.dtype(), g.device());
    kernels::dropout(g.device(), g, dx, key, keep_threshold, scale, block);
    return {dx};
  }

  // Pointwise and linear; a piece draws the mask of its own global
  // coordinates (docs/design.md §4 level 1), so every layout gives the same mask.
  ShardingPlan sharding(const ShardingContext& ctx) {
    ShardingPlan plan = dtensor::pointwise_exact(ctx, {0b1}, false);  // x * scale: not exact on a pending sum
    const Dims& shape = ctx.in[0].shape;
    LocalGeometry g = ctx.local(shape, plan.out[0]);
    if (block.is_whole()) {
      block = g.block(shape);
    } else {
      for (int d = 0; d < shape.size(); ++d) block.offset[d] += g.offset[d];
    }
    return plan;
  }
};

}  // namespace

Tensor dropout(const Tensor& x, double p, PhiloxKey key, bool training, const GlobalBlock& block) {
  check_probability("dropout", p);
  TESSEL_CHECK(x.is_floating_point(), "dropout", "expected a floating-point tensor, got {}", x.desc());
  kernels::check_global_block("dropout", x.shape(), block);
  if (!training || p == 0.0) return x;
  // Keep with probability 1 - p; p == 1 keeps nothing (the scale is never used).
  double scale = p == 1.0 ? 0.0 : 1.0 / (1.0 - p);
  return call(DropoutOp{key, kernels::bernoulli_threshold(1.0 - p), scale, block}, x);
}

}  // namespace tessel
