#include "autograd/ops/rope.h"

#include <cmath>
#include <vector>

#include "autograd/function.h"
#include "autograd/ops/common.h"
#include "autograd/ops/factory.h"
#include "dtensor/sharding.h"
#include "kernels/rope.h"
#include "runtime/numerics.h"
#include "runtime/tmath.h"

namespace tessel {
namespace {

struct RotaryOp {
  static constexpr const char* kName = "apply_rotary";
  int64_t offset;
  bool interleaved;
  SavedTensor positions;  // int64 [B, T] view, or undefined: offset + t
  SavedTensor cos_c, sin_c;  // the tables in x's compute dtype, contiguous

  Tensor forward(const Tensor& x, const Tensor& cos, const Tensor& sin) {
    const DType acc = accumulate_dtype(x.dtype());
    Tensor c = detail::contiguous_raw(detail::cast_raw(cos, acc));
    Tensor s = detail::contiguous_raw(detail::cast_raw(sin, acc));
    Tensor out = raw::empty(x.shape(), x.dtype(), x.device());
    kernels::rope_apply(x.device(), x, c, s, positions.get(), offset, interleaved, /*inverse=*/false, out);
    cos_c = c;
    sin_c = s;
    return out;
  }

  std::vector<Tensor> backward(const GradContext& ctx, std::vector<Tensor>& grads) {
    if (!ctx.needs(0)) return {Tensor(), Tensor(), Tensor()};
    Tensor g = grads[0];
    Tensor dx = raw::empty(g.shape(), g.dtype(), g.device());
    kernels::rope_apply(g.device(), g, cos_c.get(), sin_c.get(), positions.get(), offset, interleaved, /*inverse=*/true, dx);
    return {dx, Tensor(), Tensor()};
  }

  // x [B, T, H, D]: batch and heads may be sharded; time too when positions
  // come from the offset (a piece starting at t0 rotates by offset + t0); the
  // rotated pairs of the head dim must be whole. Linear in x: Partial stays.
  ShardingPlan sharding(const ShardingContext& ctx) {
    const TensorSpec& x = ctx.in[0];
    Placements p = dtensor::unshard(x.placements, {3}, numerics::bitwise());  // rotation arithmetic: not exact on a pending sum
    if (positions.defined()) p = dtensor::unshard(p, {0, 1}, false);
    const Placements r = Placements::replicated(ctx.mesh_ndim());
    offset += ctx.local(x.shape, p).offset[1];
    return {{p, r, r}, {p}};
  }
};

void check_rotary(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const char* op = "apply_rotary";
  detail::check_floating(op, x);
  TESSEL_CHECK(x.dim() == 4, op, "x must be [batch, time, heads, head_dim], got {}", x.desc());
  TESSEL_CHECK(cos.dim() == 2 && cos.shape() == sin.shape(), op, "cos {} and sin {} must be [positions, rotary_dim / 2]",
               cos.desc(), sin.desc());
  detail::check_floating(op, cos);
  detail::check_floating(op, sin);
  TESSEL_CHECK(2 * cos.shape()[1] <= x.shape()[3], op,
               "rotary width 2 * {} (from cos {}) exceeds head_dim {} of x {}", cos.shape()[1], cos.desc(),
               x.shape()[3], x.desc());
  detail::check_same_device(op, x, cos);
  detail::check_same_device(op, x, sin);
}

}  // namespace

std::pair<Tensor, Tensor> rope_cache(int64_t seq_len, int64_t head_dim, double theta, DType dtype, Device device) {
  const char* op = "rope_cache";
  TESSEL_CHECK(head_dim > 0 && head_dim % 2 == 0, op, "head_dim must be even and positive, got {}", head_dim);
  TESSEL_CHECK(seq_len >= 0, op, "seq_len must be non-negative, got {}", seq_len);
  TESSEL_CHECK(theta > 0, op, "theta must be positive, got {}", theta);
  TESSEL_CHECK(is_floating(dtype), op, "dtype must be floating point, got {}", dtype_name(dtype));
  const int64_t half = head_dim / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv_freq[size_t(i)] = 1.0 / std::pow(theta, double(2 * i) / double(head_dim));
  std::vector<double> c(static_cast<size_t>(seq_len * half)), s(c.size());
  for (int64_t t = 0; t < seq_len; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = double(t) * inv_freq[size_t(i)];
      c[size_t(t * half + i)] = tmath::cos(angle);
      s[size_t(t * half + i)] = tmath::sin(angle);
    }
  TensorOptions opts = TensorOptions(dtype).with_device(device);
  return {tensor(c, {seq_len, half}, opts), tensor(s, {seq_len, half}, opts)};
}

Tensor apply_rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t position_offset,
                    bool interleaved) {
  check_rotary(x, cos, sin);
  TESSEL_CHECK(position_offset >= 0 && position_offset + x.shape()[1] <= cos.shape()[0], "apply_rotary",
               "positions [{}, {}) are outside the cos/sin tables, which cover positions [0, {})", position_offset,
               position_offset + x.shape()[1], cos.shape()[0]);
  return call(RotaryOp{position_offset, interleaved, Tensor()}, x, cos, sin);
}

Tensor apply_rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& positions,
                    bool interleaved) {
  check_rotary(x, cos, sin);
  const char* op = "apply_rotary";
  TESSEL_CHECK(positions.dtype() == DType::Int64, op, "positions must be int64, got {}", positions.desc());
  detail::check_same_device(op, x, positions);
  const int64_t B = x.shape()[0], T = x.shape()[1];
  Tensor pos;
  if (positions.dim() == 1 && positions.shape()[0] == T) pos = raw::expand(raw::unsqueeze(positions, 0), {B, T});
  else if (positions.dim() == 2 && positions.shape() == Dims{B, T}) pos = raw::alias(positions);
  else TESSEL_FAIL(op, "positions {} must be [{}] or [{}, {}] for x {}", positions.desc(), T, B, T, x.desc());
  return call(RotaryOp{0, interleaved, pos}, x, cos, sin);
}

}  // namespace tessel
