#pragma once
// Plain scalar references for kernels/optim.h: one element at a time, the
// formulas of kernels/optim_math.h with V = float. test/test_optim.cc and
// test/test_clip.cc compare kernels/cpu/optim.cc to these bit for bit.
#include <cstdint>

#include "kernels/canonical.h"
#include "kernels/optim_math.h"
#include "runtime/dtype.h"

namespace tessel::kernels::ref {

inline float bcast_scalar(float x) { return x; }

template <class G>
void adamw_step(float* p, const G* g, float* m, float* v, int64_t n, const AdamWScalars& s) {
  const AdamWCoef<float> c = broadcast_coef<float>(s, bcast_scalar);
  for (int64_t i = 0; i < n; ++i) adamw_update<float>(p[i], m[i], v[i], float(g[i]), c, ScalarSqrt());
}

template <class G>
void sgd_step(float* p, const G* g, float* buf, int64_t n, const SGDScalars& s) {
  const SGDCoef<float> c = broadcast_coef<float>(s, bcast_scalar);
  for (int64_t i = 0; i < n; ++i) sgd_update<float>(p[i], s.use_momentum ? buf + i : nullptr, float(g[i]), c, s);
}

template <class T>
float sum_squares(const T* x, int64_t n, int v) {
  return canonical_reduce_ref<float>(
      n, v, 0.0f, [&](int64_t t) { return square_term(float(x[t])); }, SumCombine<float>());
}

}  // namespace tessel::kernels::ref
