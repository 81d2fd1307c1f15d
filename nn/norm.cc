#include "nn/norm.h"

#include <cmath>

#include "autograd/api.h"
#include "nn/autocast.h"

namespace tessel::nn {

namespace {
void check_options(const char* layer, int64_t dim, double eps) {
  TESSEL_CHECK(dim > 0, layer, "dim must be positive, got {}", dim);
  TESSEL_CHECK(eps >= 0.0 && std::isfinite(eps), layer, "eps must be finite and >= 0, got {}", eps);
}

void check_input(const char* layer, const std::string& path, const Tensor& x, int64_t dim) {
  TESSEL_CHECK(x.dim() >= 1 && x.size(-1) == dim, layer, "'{}' expects input [..., {}] (dim), got {}", path, dim,
               x.desc());
}

// The dtype a norm computes in: float32 at least, promoted with the weight's.
DType norm_dtype(const Tensor& x, const Tensor& weight) {
  DType t = cast_up(x).dtype();
  if (weight.defined()) t = promote_types(t, is_half(weight.dtype()) ? DType::Float32 : weight.dtype());
  return t;
}

Tensor cast(const Tensor& t, DType d) { return t.defined() ? t.to(d) : t; }
}  // namespace

LayerNorm::LayerNorm(int64_t d, double e, bool affine, bool with_bias) : UnaryModule("LayerNorm"), dim(d), eps(e) {
  check_options("LayerNorm", d, e);
  TESSEL_CHECK(affine || !with_bias, "LayerNorm", "bias=true needs affine=true (dim={})", d);
  if (affine) param("weight", weight, {d}, init::ones());
  if (affine && with_bias) param("bias", bias, {d}, init::zeros());
}

Tensor LayerNorm::forward(const Tensor& x) {
  check_input("LayerNorm", path(), x, dim);
  DType t = norm_dtype(x, weight);
  return layer_norm(x.to(t), {dim}, cast(weight, t), cast(bias, t), eps);
}

std::string LayerNorm::extra_repr() const {
  return fmt::format(FMT_STRING("dim={}, eps={}, affine={}, bias={}"), dim, eps, weight.defined(), bias.defined());
}

RMSNorm::RMSNorm(int64_t d, double e) : UnaryModule("RMSNorm"), dim(d), eps(e) {
  check_options("RMSNorm", d, e);
  param("weight", weight, {d}, init::ones());
}

Tensor RMSNorm::forward(const Tensor& x) {
  check_input("RMSNorm", path(), x, dim);
  DType t = norm_dtype(x, weight);
  return rms_norm(x.to(t), {dim}, weight.to(t), eps);
}

std::string RMSNorm::extra_repr() const { return fmt::format(FMT_STRING("dim={}, eps={}"), dim, eps); }

}  // namespace tessel::nn
