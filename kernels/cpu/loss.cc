// CPU cross-entropy / nll_loss kernels (order of operations: kernels/loss.h).
//
// Parallel over tokens; each token's row is processed with the same row
// primitives as softmax (kernels/cpu/row_ops.h) on a per-task scratch buffer
// (allocated once per parallel range). Counts and the loss reduction are
// computed serially in token order.
#include <cstring>
#include <vector>

#include "kernels/cpu/row_ops.h"
#include "kernels/loss.h"
#include "runtime/tmath.h"

namespace tessel::kernels::cpu {
namespace {

// Target values are data: checked here, where a Meta run never comes; the
// layouts (contiguous [M, K] scores, int64 [M] targets) are the op's
// (autograd/ops/loss.cc).
void check_targets_cpu(const Tensor& targets, int64_t k, int64_t ignore_index, const char* op) {
  const int64_t* t = static_cast<const int64_t*>(targets.raw_data());
  for (int64_t r = 0; r < targets.numel(); ++r) {
    if (t[r] == ignore_index || (t[r] >= 0 && t[r] < k)) continue;
    TESSEL_FAIL(op, "target {} at position {} is out of range: class indices must be in [0, {}) or equal ignore_index ({})",
                t[r], r, k, ignore_index);
  }
}

int64_t count_valid(const int64_t* t, int64_t m, int64_t ignore_index) {
  int64_t c = 0;
  for (int64_t r = 0; r < m; ++r) c += t[r] != ignore_index;
  return c;
}

template <class T>
void ce_forward_typed(const Tensor& logits, const Tensor& targets, int64_t ignore, double eps, const Tensor& losses,
                      const Tensor& row_max_t, const Tensor& sum_exp_t, const Tensor& count, int v) {
  using C = compute_t<T>;
  const int64_t m = logits.shape()[0], k = logits.shape()[1];
  const T* xb = static_cast<const T*>(logits.raw_data());
  const int64_t* tg = static_cast<const int64_t*>(targets.raw_data());
  C* loss_p = static_cast<C*>(losses.raw_data());
  C* max_p = static_cast<C*>(row_max_t.raw_data());
  C* sum_p = static_cast<C*>(sum_exp_t.raw_data());
  const C eps_c = C(eps);
  const bool smooth = eps != 0.0;
  parallel_for(m, row_grain(k), [&](int64_t rb, int64_t re) {
    std::vector<C> scratch;
    for (int64_t r = rb; r < re; ++r) {
      const int64_t t = tg[r];
      if (t == ignore) {
        loss_p[r] = C(0);
        max_p[r] = C(0);
        sum_p[r] = C(0);
        continue;
      }
      if (scratch.empty()) scratch.resize(size_t(2 * k));
      C* e = scratch.data();
      const C* x = row_as_compute<C>(xb + r * k, k, 1, scratch.data() + k);
      const C mx = row_max(x, k);
      for (int64_t i = 0; i < k; ++i) e[i] = tmath::exp(x[i] - mx);
      const C s = row_sum(e, k, v);
      const C lse = tmath::log(s);
      const C nll = lse - (x[t] - mx);
      C loss = nll;
      if (smooth) {
        for (int64_t i = 0; i < k; ++i) e[i] = lse - (x[i] - mx);
        const C sum_nlp = row_sum(e, k, v);
        loss = (C(1) - eps_c) * nll + (eps_c / C(k)) * sum_nlp;
      }
      loss_p[r] = loss;
      max_p[r] = mx;
      sum_p[r] = s;
    }
  });
  *static_cast<int64_t*>(count.raw_data()) = count_valid(tg, m, ignore);
}

template <class C>
C token_scale(const C* g, LossReduction red, int64_t r, int64_t count) {
  switch (red) {
    case LossReduction::None: return g[r];
    case LossReduction::Mean: return g[0] / C(count);
    case LossReduction::Sum: return g[0];
  }
  return g[0];
}

template <class T>
void ce_backward_typed(const Tensor& g, const Tensor& logits, const Tensor& targets, const Tensor& row_max_t,
                       const Tensor& sum_exp_t, const Tensor& count_t, int64_t ignore, double eps, LossReduction red,
                       const Tensor& dlogits) {
  using C = compute_t<T>;
  const int64_t m = logits.shape()[0], k = logits.shape()[1];
  const T* xb = static_cast<const T*>(logits.raw_data());
  T* db = static_cast<T*>(dlogits.raw_data());
  const int64_t* tg = static_cast<const int64_t*>(targets.raw_data());
  const C* gp = static_cast<const C*>(g.raw_data());
  const C* max_p = static_cast<const C*>(row_max_t.raw_data());
  const C* sum_p = static_cast<const C*>(sum_exp_t.raw_data());
  const int64_t count = *static_cast<const int64_t*>(count_t.raw_data());
  const C eps_c = C(eps);
  const C q_miss = eps_c / C(k);
  const C q_hit = (C(1) - eps_c) + q_miss;
  parallel_for(m, row_grain(k), [&](int64_t rb, int64_t re) {
    std::vector<C> scratch;
    for (int64_t r = rb; r < re; ++r) {
      const int64_t t = tg[r];
      T* dr = db + r * k;
      if (t == ignore) {
        for (int64_t i = 0; i < k; ++i) dr[i] = store<T>(C(0));
        continue;
      }
      if (scratch.empty()) scratch.resize(size_t(k));
      const C* x = row_as_compute<C>(xb + r * k, k, 1, scratch.data());
      const C mx = max_p[r], rs = C(1) / sum_p[r];
      const C scale = token_scale(gp, red, r, count);
      for (int64_t i = 0; i < k; ++i) dr[i] = store<T>((tmath::exp(x[i] - mx) * rs - q_miss) * scale);
      dr[t] = store<T>((tmath::exp(x[t] - mx) * rs - q_hit) * scale);
    }
  });
}

template <class T>
void nll_forward_typed(const Tensor& logp, const Tensor& targets, int64_t ignore, const Tensor& losses,
                       const Tensor& count) {
  using C = compute_t<T>;
  const int64_t m = logp.shape()[0], k = logp.shape()[1];
  const T* xb = static_cast<const T*>(logp.raw_data());
  const int64_t* tg = static_cast<const int64_t*>(targets.raw_data());
  C* loss_p = static_cast<C*>(losses.raw_data());
  for (int64_t r = 0; r < m; ++r) loss_p[r] = tg[r] == ignore ? C(0) : -C(load(xb[r * k + tg[r]]));
  *static_cast<int64_t*>(count.raw_data()) = count_valid(tg, m, ignore);
}

template <class T>
void nll_backward_typed(const Tensor& g, const Tensor& targets, const Tensor& count_t, int64_t ignore,
                        LossReduction red, const Tensor& dlogp) {
  using C = compute_t<T>;
  const int64_t m = dlogp.shape()[0], k = dlogp.shape()[1];
  T* db = static_cast<T*>(dlogp.raw_data());
  const int64_t* tg = static_cast<const int64_t*>(targets.raw_data());
  const C* gp = static_cast<const C*>(g.raw_data());
  const int64_t count = *static_cast<const int64_t*>(count_t.raw_data());
  parallel_for(m, row_grain(k), [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      T* dr = db + r * k;
      for (int64_t i = 0; i < k; ++i) dr[i] = store<T>(C(0));
      if (tg[r] != ignore) dr[tg[r]] = store<T>(-token_scale(gp, red, r, count));
    }
  });
}

void ce_forward_cpu(const Tensor& logits, const Tensor& targets, int64_t ignore, double eps, const Tensor& losses,
                    const Tensor& row_max, const Tensor& sum_exp, const Tensor& count, int v) {
  dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
    ce_forward_typed<typename decltype(tag)::type>(logits, targets, ignore, eps, losses, row_max, sum_exp, count, v);
  });
}

void ce_backward_cpu(const Tensor& g, const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                     const Tensor& sum_exp, const Tensor& count, int64_t ignore, double eps, LossReduction red,
                     const Tensor& dlogits) {
  dispatch_floating(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
    ce_backward_typed<typename decltype(tag)::type>(g, logits, targets, row_max, sum_exp, count, ignore, eps, red,
                                                    dlogits);
  });
}

void nll_forward_cpu(const Tensor& logp, const Tensor& targets, int64_t ignore, const Tensor& losses,
                     const Tensor& count) {
  dispatch_floating(logp.dtype(), "nll_loss", [&](auto tag) {
    nll_forward_typed<typename decltype(tag)::type>(logp, targets, ignore, losses, count);
  });
}

void nll_backward_cpu(const Tensor& g, const Tensor& targets, const Tensor& count, int64_t ignore, LossReduction red,
                      const Tensor& dlogp) {
  dispatch_floating(dlogp.dtype(), "nll_loss_backward", [&](auto tag) {
    nll_backward_typed<typename decltype(tag)::type>(g, targets, count, ignore, red, dlogp);
  });
}

void loss_reduce_cpu(const Tensor& losses, const Tensor& count_t, bool mean, const Tensor& out, int v) {
  const int64_t count = *static_cast<const int64_t*>(count_t.raw_data());
  auto finish = [&](auto value) {
    using C = decltype(value);
    if (mean) value = value / C(count);
    dispatch_floating(out.dtype(), "loss_reduce", [&](auto tag) {
      using T = typename decltype(tag)::type;
      *static_cast<T*>(out.raw_data()) = store<T>(compute_t<T>(value));
    });
  };
  if (losses.dtype() == DType::Float32) finish(row_sum(static_cast<const float*>(losses.raw_data()), losses.numel(), v));
  else finish(row_sum(static_cast<const double*>(losses.raw_data()), losses.numel(), v));
}

}  // namespace

TESSEL_REGISTER_KERNEL(check_targets, DeviceType::CPU, check_targets_cpu);
TESSEL_REGISTER_KERNEL(cross_entropy_forward, DeviceType::CPU, ce_forward_cpu);
TESSEL_REGISTER_KERNEL(cross_entropy_backward, DeviceType::CPU, ce_backward_cpu);
TESSEL_REGISTER_KERNEL(nll_loss_forward, DeviceType::CPU, nll_forward_cpu);
TESSEL_REGISTER_KERNEL(nll_loss_backward, DeviceType::CPU, nll_backward_cpu);
TESSEL_REGISTER_KERNEL(loss_reduce, DeviceType::CPU, loss_reduce_cpu);

}  // namespace tessel::kernels::cpu
