#include "nn/autocast.h"

#include "runtime/error.h"

namespace tessel::nn {

namespace {
thread_local std::optional<DType> t_compute;
}  // namespace

AutocastScope::AutocastScope(std::optional<DType> compute) : prev_(t_compute) {
  TESSEL_CHECK(!compute || is_floating(*compute), "AutocastScope", "needs a floating compute dtype, got {}",
               dtype_name(*compute));
  t_compute = compute;
}

AutocastScope::~AutocastScope() { t_compute = prev_; }

std::optional<DType> autocast_dtype() { return t_compute; }

Tensor cast_to_compute(const Tensor& t) {
  if (!t_compute || !t.defined() || !t.is_floating_point()) return t;
  return t.to(*t_compute);
}

Tensor cast_up(const Tensor& t) {
  if (!t.defined() || !is_half(t.dtype())) return t;
  return t.to(DType::Float32);
}

}  // namespace tessel::nn
