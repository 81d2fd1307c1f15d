#include "autograd/ops/init.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "kernels/elementwise.h"
#include "kernels/random.h"
#include "runtime/tmath.h"

namespace tessel {

using kernels::RandomDist;
using kernels::RandomParams;

double calculate_gain(Nonlinearity nl, double negative_slope) {
  switch (nl) {
    case Nonlinearity::Linear:
    case Nonlinearity::Sigmoid: return 1.0;
    case Nonlinearity::Tanh: return 5.0 / 3.0;
    case Nonlinearity::Relu: return std::sqrt(2.0);
    case Nonlinearity::LeakyRelu: return std::sqrt(2.0 / (1.0 + negative_slope * negative_slope));
    case Nonlinearity::Selu: return 3.0 / 4.0;
  }
  return 1.0;
}

Fans compute_fans(const Dims& shape, const char* op) {
  TESSEL_CHECK(shape.size() >= 2, op, "fan in and fan out need a tensor with at least 2 dimensions, got shape {}",
               shape);
  int64_t receptive = 1;
  for (int d = 2; d < shape.size(); ++d) receptive *= shape[d];
  return Fans{shape[1] * receptive, shape[0] * receptive};
}

namespace {

void check_writable(const char* op, const Tensor& t, bool random) {
  TESSEL_CHECK(t.defined(), op, "undefined tensor");
  if (random) TESSEL_CHECK(t.is_floating_point(), op, "needs a floating-point tensor, got {}", t.desc());
  for (int d = 0; d < t.dim(); ++d)
    TESSEL_CHECK(t.strides()[d] != 0 || t.shape()[d] <= 1, op,
                 "in-place write into {} with overlapping memory (an expanded view, strides {})", t.desc(),
                 t.strides());
}

const Dims& global_shape_of(const Tensor& t, const GlobalBlock& block) {
  return block.is_whole() ? t.shape() : block.global_shape;
}

Tensor fill_random(const char* op, const Tensor& t, const RandomParams& p, const GlobalBlock& block) {
  check_writable(op, t, true);
  kernels::check_global_block(op, t.shape(), block);
  NoGradGuard no_grad;
  kernels::random_fill(t.device(), t, p, block);
  t.bump_version();
  return t;
}

// Is there a value of dtype t in [lo, hi) (uniform) or [lo, hi] (trunc normal),
// after rounding the bounds to the compute type? Uniform also needs a finite hi - lo.
bool range_ok(RandomDist dist, DType t, double lo, double hi) {
  return dispatch_floating(t, "range", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    if (dist == RandomDist::Uniform && (!(C(lo) < C(hi)) || !std::isfinite(double(C(hi) - C(lo))))) return false;
    RandomParams p;
    p.dist = dist;
    p.lo = lo;
    p.hi = hi;
    auto k = kernels::rng::make_consts<T, C>(p);
    return kernels::rng::from_storage<C, T>(k.top) >= k.lo;
  });
}

int64_t fan_for(const char* op, const Dims& global, FanMode mode) {
  Fans f = compute_fans(global, op);
  return mode == FanMode::FanIn ? f.fan_in : f.fan_out;
}

bool empty_global(const Tensor& t, const GlobalBlock& block) { return numel_of(global_shape_of(t, block)) == 0; }

}  // namespace

Tensor uniform_(const Tensor& t, PhiloxKey key, double lo, double hi, const GlobalBlock& block) {
  TESSEL_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo < hi, "uniform_", "needs finite lo < hi, got [{}, {})",
               lo, hi);
  check_writable("uniform_", t, true);
  TESSEL_CHECK(range_ok(RandomDist::Uniform, t.dtype(), lo, hi), "uniform_", "no {} value lies in [{}, {}) (or hi - lo overflows)",
               dtype_name(t.dtype()), lo, hi);
  RandomParams p;
  p.dist = RandomDist::Uniform;
  p.key = key;
  p.lo = lo;
  p.hi = hi;
  return fill_random("uniform_", t, p, block);
}

Tensor normal_(const Tensor& t, PhiloxKey key, double mean, double std, const GlobalBlock& block) {
  TESSEL_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0.0, "normal_",
               "needs a finite mean and a finite std >= 0, got mean {} std {}", mean, std);
  RandomParams p;
  p.dist = RandomDist::Normal;
  p.key = key;
  p.mean = mean;
  p.std = std;
  return fill_random("normal_", t, p, block);
}

Tensor trunc_normal_(const Tensor& t, PhiloxKey key, double mean, double std, double a, double b,
                     const GlobalBlock& block) {
  TESSEL_CHECK(std::isfinite(mean) && std::isfinite(std) && std > 0.0, "trunc_normal_",
               "needs a finite mean and a finite std > 0, got mean {} std {}", mean, std);
  TESSEL_CHECK(a < b, "trunc_normal_", "needs bounds a < b, got [{}, {}]", a, b);  // false for NaN
  check_writable("trunc_normal_", t, true);
  TESSEL_CHECK(range_ok(RandomDist::TruncNormal, t.dtype(), a, b), "trunc_normal_", "no {} value lies in [{}, {}]",
               dtype_name(t.dtype()), a, b);
  // Phi(x) = (1 + erf(x / sqrt 2)) / 2, so 2 Phi(x) - 1 = erf(x / sqrt 2).
  const double inv_sqrt2 = 0.7071067811865476;
  RandomParams p;
  p.dist = RandomDist::TruncNormal;
  p.key = key;
  p.mean = mean;
  p.std = std;
  p.lo = a;
  p.hi = b;
  p.vlo = tmath::erf((a - mean) / std * inv_sqrt2);
  p.vhi = tmath::erf((b - mean) / std * inv_sqrt2);
  return fill_random("trunc_normal_", t, p, block);
}

Tensor kaiming_uniform_(const Tensor& t, PhiloxKey key, double a, FanMode mode, Nonlinearity nl,
                        const GlobalBlock& block) {
  check_writable("kaiming_uniform_", t, true);
  kernels::check_global_block("kaiming_uniform_", t.shape(), block);
  int64_t fan = fan_for("kaiming_uniform_", global_shape_of(t, block), mode);
  if (empty_global(t, block)) return t;
  double std = calculate_gain(nl, a) / std::sqrt(double(fan));
  double bound = std::sqrt(3.0) * std;
  return uniform_(t, key, -bound, bound, block);
}

Tensor kaiming_normal_(const Tensor& t, PhiloxKey key, double a, FanMode mode, Nonlinearity nl,
                       const GlobalBlock& block) {
  check_writable("kaiming_normal_", t, true);
  kernels::check_global_block("kaiming_normal_", t.shape(), block);
  int64_t fan = fan_for("kaiming_normal_", global_shape_of(t, block), mode);
  if (empty_global(t, block)) return t;
  return normal_(t, key, 0.0, calculate_gain(nl, a) / std::sqrt(double(fan)), block);
}

Tensor xavier_uniform_(const Tensor& t, PhiloxKey key, double gain, const GlobalBlock& block) {
  check_writable("xavier_uniform_", t, true);
  kernels::check_global_block("xavier_uniform_", t.shape(), block);
  Fans f = compute_fans(global_shape_of(t, block), "xavier_uniform_");
  if (empty_global(t, block)) return t;
  double std = gain * std::sqrt(2.0 / double(f.fan_in + f.fan_out));
  double bound = std::sqrt(3.0) * std;
  return uniform_(t, key, -bound, bound, block);
}

Tensor xavier_normal_(const Tensor& t, PhiloxKey key, double gain, const GlobalBlock& block) {
  check_writable("xavier_normal_", t, true);
  kernels::check_global_block("xavier_normal_", t.shape(), block);
  Fans f = compute_fans(global_shape_of(t, block), "xavier_normal_");
  if (empty_global(t, block)) return t;
  return normal_(t, key, 0.0, gain * std::sqrt(2.0 / double(f.fan_in + f.fan_out)), block);
}

Tensor constant_(const Tensor& t, Scalar value) {
  check_writable("constant_", t, false);
  NoGradGuard no_grad;
  kernels::fill(t.device(), t, value);
  t.bump_version();
  return t;
}
Tensor zeros_(const Tensor& t) { return constant_(t, 0); }
Tensor ones_(const Tensor& t) { return constant_(t, 1); }

}  // namespace tessel
