#pragma once
// Plain scalar references for the loss kernels: kernels/loss.h's order written
// as simply as possible, one token at a time. test/test_loss.cc compares
// kernels/cpu/loss.cc to these bit for bit.
#include <cstdint>
#include <vector>

#include "kernels/canonical.h"
#include "kernels/cpu/softmax_ref.h"
#include "runtime/tmath.h"

namespace tessel::kernels::ref {

template <class C>
struct CrossEntropyRow {
  C loss, row_max, sum_exp;
};

template <class C>
CrossEntropyRow<C> cross_entropy_row(const std::vector<C>& x, int64_t t, double label_smoothing, int v) {
  const int64_t k = int64_t(x.size());
  const C m = row_max(x.data(), k);
  std::vector<C> e(x.size());
  for (size_t i = 0; i < x.size(); ++i) e[i] = tmath::exp(x[i] - m);
  const C s = canonical_sum_ref<C>(e.data(), k, 1, v);
  const C lse = tmath::log(s);
  const C nll = lse - (x[size_t(t)] - m);
  if (label_smoothing == 0.0) return {nll, m, s};
  const C eps = C(label_smoothing);
  std::vector<C> u(x.size());
  for (size_t i = 0; i < x.size(); ++i) u[i] = lse - (x[i] - m);
  const C sum_nlp = canonical_sum_ref<C>(u.data(), k, 1, v);
  return {(C(1) - eps) * nll + (eps / C(k)) * sum_nlp, m, s};
}

template <class C>
std::vector<C> cross_entropy_backward_row(const std::vector<C>& x, int64_t t, C row_max, C sum_exp,
                                          double label_smoothing, C scale) {
  const C eps = C(label_smoothing);
  const C q_miss = eps / C(x.size());
  const C q_hit = (C(1) - eps) + q_miss;
  std::vector<C> dx(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const C p = tmath::exp(x[i] - row_max) * (C(1) / sum_exp);
    dx[i] = (p - (int64_t(i) == t ? q_hit : q_miss)) * scale;
  }
  return dx;
}

// The loss over tokens: canonical sum of the per-token losses (ignored ones
// are +0), divided by the count for "mean".
template <class C>
C reduce_losses(const std::vector<C>& losses, int64_t count, bool mean, int v) {
  const C s = canonical_sum_ref<C>(losses.data(), int64_t(losses.size()), 1, v);
  return mean ? s / C(count) : s;
}

}  // namespace tessel::kernels::ref
