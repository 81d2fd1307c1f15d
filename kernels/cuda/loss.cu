// CUDA cross-entropy (fused with log-softmax) and nll_loss, in the order of
// kernels/loss.h (the CPU's bits for float32): one block per token for the
// forward pass (row max, canonical sum of exp, log), one thread per logit for
// the backward pass, a one-block canonical sum for the reduction over tokens.
#include <cstdint>
#include <cuda_runtime.h>
#include <limits>

#include "kernels/cuda/call.h"
#include "kernels/cuda/canonical.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/launch.h"
#include "kernels/loss.h"
#include "runtime/dtype.h"
#include "runtime/tmath.h"

// ---- launch interface: what the adapters at the end call ----
// Layout
// as kernels/loss.h: scores [M, K] contiguous, targets int64 [M], per-token
// values [M] in the compute type C, count an int64 scalar -- all on the device.
namespace tessel::kernels::cuda {

struct LossArgs {
  int64_t m = 0, k = 0;
  int64_t ignore_index = -100;
  double label_smoothing = 0;
  int chunks = 16;
  LossReduction reduction = LossReduction::Mean;
  const void* scores = nullptr;
  const int64_t* targets = nullptr;
  const void* g = nullptr;      // backward: [M] (None) or a scalar, in C
  void* losses = nullptr;       // [M] C
  void* row_max = nullptr;      // [M] C
  void* sum_exp = nullptr;      // [M] C
  int64_t* count = nullptr;     // scalar
  void* dscores = nullptr;      // backward
};

// *bad_pos (a device int64, preset to INT64_MAX by the launcher) = the first
// position whose target is neither ignore_index nor in [0, k).
void launch_find_bad_target(const int64_t* targets, int64_t m, int64_t k, int64_t ignore_index, int64_t* bad_pos,
                            cudaStream_t stream);
void launch_count_valid(const int64_t* targets, int64_t m, int64_t ignore_index, int64_t* count,
                        cudaStream_t stream);
void launch_cross_entropy_forward(DType dtype, const LossArgs& a, cudaStream_t stream);
void launch_cross_entropy_backward(DType dtype, const LossArgs& a, cudaStream_t stream);
void launch_nll_forward(DType dtype, const LossArgs& a, cudaStream_t stream);
void launch_nll_backward(DType dtype, const LossArgs& a, cudaStream_t stream);
// out (a scalar of out_dtype) = canonical sum of losses [m] (C = loss_dtype), / count when mean.
void launch_loss_reduce(DType loss_dtype, DType out_dtype, const void* losses, int64_t m, const int64_t* count,
                        bool mean, void* out, int chunks, cudaStream_t stream);

}  // namespace tessel::kernels::cuda

namespace tessel::kernels::cuda {
namespace {

__global__ void find_bad_target_kernel(const int64_t* t, int64_t m, int64_t k, int64_t ignore, int64_t* bad) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < m; r += int64_t(gridDim.x) * blockDim.x) {
    const int64_t v = t[r];
    // atomicMin of a position: an integer minimum, the same whatever the order.
    if (v != ignore && (v < 0 || v >= k))
      atomicMin(reinterpret_cast<unsigned long long*>(bad), static_cast<unsigned long long>(r));
  }
}

__global__ void count_valid_kernel(const int64_t* t, int64_t m, int64_t ignore, int64_t* count) {
  __shared__ int64_t part[256];
  int64_t c = 0;
  for (int64_t r = threadIdx.x; r < m; r += blockDim.x) c += t[r] != ignore;
  part[threadIdx.x] = c;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (int(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *count = part[0];
}

template <class T>
__global__ void ce_forward_kernel(LossArgs a) {
  using C = acc_t<T>;
  C* smem = shared_array<C>();
  const int64_t k = a.k;
  const C eps = C(a.label_smoothing);
  const bool smooth = a.label_smoothing != 0.0;
  C* loss_p = static_cast<C*>(a.losses);
  C* max_p = static_cast<C*>(a.row_max);
  C* sum_p = static_cast<C*>(a.sum_exp);
  for (int64_t r = blockIdx.x; r < a.m; r += gridDim.x) {
    const int64_t t = a.targets[r];
    if (t == a.ignore_index) {
      if (threadIdx.x == 0) loss_p[r] = max_p[r] = sum_p[r] = C(0);
      continue;  // uniform over the block
    }
    const T* xr = static_cast<const T*>(a.scores) + r * k;
    auto xl = [&](int64_t i) { return C(widen(xr[i])); };
    const C mx = block_row_max<C>(k, a.chunks, xl, smem);
    const C s = block_canonical_reduce<C>(
        k, a.chunks, C(0), [&](int64_t i) { return tmath::exp(xl(i) - mx); }, SumCombine<C>(), smem);
    const C lse = tmath::log(s);
    const C nll = lse - (xl(t) - mx);
    C loss = nll;
    if (smooth) {
      const C sum_nlp = block_canonical_reduce<C>(
          k, a.chunks, C(0), [&](int64_t i) { return lse - (xl(i) - mx); }, SumCombine<C>(), smem);
      loss = (C(1) - eps) * nll + (eps / C(k)) * sum_nlp;
    }
    if (threadIdx.x == 0) {
      loss_p[r] = loss;
      max_p[r] = mx;
      sum_p[r] = s;
    }
  }
}

template <class C>
__device__ __forceinline__ C token_scale(const LossArgs& a, int64_t r) {
  const C* g = static_cast<const C*>(a.g);
  switch (a.reduction) {
    case LossReduction::None: return g[r];
    case LossReduction::Mean: return g[0] / C(*a.count);
    case LossReduction::Sum: return g[0];
  }
  return g[0];
}

// One thread per logit: dx = (exp(x - m) * (1 / s) - q) * scale.
template <class T>
__global__ void ce_backward_kernel(LossArgs a, acc_t<T> q_miss, acc_t<T> q_hit) {
  using C = acc_t<T>;
  const int64_t total = a.m * a.k;
  const C* max_p = static_cast<const C*>(a.row_max);
  const C* sum_p = static_cast<const C*>(a.sum_exp);
  const T* x = static_cast<const T*>(a.scores);
  T* dx = static_cast<T*>(a.dscores);
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / a.k, i = e - r * a.k;
    const int64_t t = a.targets[r];
    if (t == a.ignore_index) {
      dx[e] = narrow<T>(C(0));
      continue;
    }
    const C rs = C(1) / sum_p[r];
    const C q = i == t ? q_hit : q_miss;
    dx[e] = narrow<T>((tmath::exp(C(widen(x[e])) - max_p[r]) * rs - q) * token_scale<C>(a, r));
  }
}

template <class T>
__global__ void nll_forward_kernel(LossArgs a) {
  using C = acc_t<T>;
  const T* x = static_cast<const T*>(a.scores);
  C* loss_p = static_cast<C*>(a.losses);
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < a.m; r += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = a.targets[r];
    loss_p[r] = t == a.ignore_index ? C(0) : -C(widen(x[r * a.k + t]));
  }
}

template <class T>
__global__ void nll_backward_kernel(LossArgs a) {
  using C = acc_t<T>;
  const int64_t total = a.m * a.k;
  T* dx = static_cast<T*>(a.dscores);
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / a.k, i = e - r * a.k;
    const int64_t t = a.targets[r];
    dx[e] = narrow<T>(t != a.ignore_index && i == t ? -token_scale<C>(a, r) : C(0));
  }
}

template <class C, class T>
__global__ void loss_reduce_kernel(const C* losses, int64_t m, const int64_t* count, bool mean, T* out, int V) {
  C* smem = shared_array<C>();
  C v = block_canonical_reduce<C>(m, V, C(0), [&](int64_t i) { return losses[i]; }, SumCombine<C>(), smem);
  if (threadIdx.x == 0) {
    if (mean) v = v / C(*count);
    *out = narrow<T>(acc_t<T>(v));
  }
}

unsigned row_blocks(int64_t rows) { return unsigned(rows < kMaxBlocks ? rows : kMaxBlocks); }

}  // namespace

void launch_find_bad_target(const int64_t* targets, int64_t m, int64_t k, int64_t ignore, int64_t* bad,
                            cudaStream_t s) {
  if (m == 0) return;
  find_bad_target_kernel<<<grid_blocks(m), kThreads, 0, s>>>(targets, m, k, ignore, bad);
  TESSEL_CUDA_CHECK_LAUNCH("check_targets");
}

void launch_count_valid(const int64_t* targets, int64_t m, int64_t ignore, int64_t* count, cudaStream_t s) {
  count_valid_kernel<<<1, 256, 0, s>>>(targets, m, ignore, count);
  TESSEL_CUDA_CHECK_LAUNCH("cross_entropy");
}

void launch_cross_entropy_forward(DType dtype, const LossArgs& a, cudaStream_t s) {
  launch_count_valid(a.targets, a.m, a.ignore_index, a.count, s);
  if (a.m == 0) return;
  dispatch_floating(dtype, "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    ce_forward_kernel<T><<<row_blocks(a.m), row_block_threads(a.chunks), size_t(a.chunks) * sizeof(acc_t<T>), s>>>(a);
    TESSEL_CUDA_CHECK_LAUNCH("cross_entropy");
  });
}

void launch_cross_entropy_backward(DType dtype, const LossArgs& a, cudaStream_t s) {
  if (a.m == 0 || a.k == 0) return;
  dispatch_floating(dtype, "cross_entropy_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = acc_t<T>;
    // As the CPU computes them (host arithmetic in C is the same IEEE arithmetic).
    const C eps = C(a.label_smoothing);
    const C q_miss = eps / C(a.k);
    const C q_hit = (C(1) - eps) + q_miss;
    ce_backward_kernel<T><<<grid_blocks(a.m * a.k), kThreads, 0, s>>>(a, q_miss, q_hit);
    TESSEL_CUDA_CHECK_LAUNCH("cross_entropy_backward");
  });
}

void launch_nll_forward(DType dtype, const LossArgs& a, cudaStream_t s) {
  launch_count_valid(a.targets, a.m, a.ignore_index, a.count, s);
  if (a.m == 0) return;
  dispatch_floating(dtype, "nll_loss", [&](auto tag) {
    using T = typename decltype(tag)::type;
    nll_forward_kernel<T><<<grid_blocks(a.m), kThreads, 0, s>>>(a);
    TESSEL_CUDA_CHECK_LAUNCH("nll_loss");
  });
}

void launch_nll_backward(DType dtype, const LossArgs& a, cudaStream_t s) {
  if (a.m == 0 || a.k == 0) return;
  dispatch_floating(dtype, "nll_loss_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    nll_backward_kernel<T><<<grid_blocks(a.m * a.k), kThreads, 0, s>>>(a);
    TESSEL_CUDA_CHECK_LAUNCH("nll_loss_backward");
  });
}

void launch_loss_reduce(DType loss_dtype, DType out_dtype, const void* losses, int64_t m, const int64_t* count,
                        bool mean, void* out, int V, cudaStream_t s) {
  auto run = [&](auto ctag) {
    using C = typename decltype(ctag)::type;
    dispatch_floating(out_dtype, "loss_reduce", [&](auto tag) {
      using T = typename decltype(tag)::type;
      loss_reduce_kernel<C, T><<<1, row_block_threads(V), size_t(V) * sizeof(C), s>>>(
          static_cast<const C*>(losses), m, count, mean, static_cast<T*>(out), V);
      TESSEL_CUDA_CHECK_LAUNCH("loss_reduce");
    });
  };
  if (loss_dtype == DType::Float64) run(TypeTag<double>{});
  else run(TypeTag<float>{});
}

}  // namespace tessel::kernels::cuda

// ---- KernelTable adapters: register the CUDA loss kernels.
namespace tessel::kernels::cuda {
namespace {

// Target values are data: checked here (on the GPU, the first bad one read
// back), where a Meta run never comes; the layouts (contiguous [M, K] scores,
// int64 [M] targets) are the op's (autograd/ops/loss.cc).
void check_targets_cuda(const Tensor& targets, int64_t k, int64_t ignore_index, const char* op) {
  CudaCall call(op, {&targets});
  const int64_t m = targets.numel();
  if (m == 0) return;
  const int64_t none = std::numeric_limits<int64_t>::max();
  Tensor bad = upload(call, &none, Dims{}, DType::Int64);
  launch_find_bad_target(static_cast<const int64_t*>(targets.raw_data()), m, k, ignore_index,
                         static_cast<int64_t*>(bad.raw_data()), call.stream());
  int64_t pos = none;
  read_back(call, bad, &pos, sizeof(pos));  // synchronises: the error is raised here, like the CPU's
  if (pos == none) return;
  int64_t value = 0;
  read_back(call, raw::narrow(targets, 0, pos, 1), &value, sizeof(value));
  TESSEL_FAIL(op, "target {} at position {} is out of range: class indices must be in [0, {}) or equal ignore_index ({})",
              value, pos, k, ignore_index);
}

LossArgs args(const Tensor& x, const Tensor& targets, int64_t ignore_index) {
  LossArgs a;
  a.m = x.shape()[0];
  a.k = x.shape()[1];
  a.ignore_index = ignore_index;
  a.scores = x.raw_data();
  a.targets = static_cast<const int64_t*>(targets.raw_data());
  return a;
}

void ce_forward_cuda(const Tensor& logits, const Tensor& targets, int64_t ignore, double eps, const Tensor& losses,
                     const Tensor& row_max, const Tensor& sum_exp, const Tensor& count, int v) {
  CudaCall call("cross_entropy", {&logits, &targets, &losses, &row_max, &sum_exp, &count});
  LossArgs a = args(logits, targets, ignore);
  a.label_smoothing = eps;
  a.chunks = v;
  a.losses = losses.raw_data();
  a.row_max = row_max.raw_data();
  a.sum_exp = sum_exp.raw_data();
  a.count = static_cast<int64_t*>(count.raw_data());
  launch_cross_entropy_forward(logits.dtype(), a, call.stream());
}

void ce_backward_cuda(const Tensor& g, const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                      const Tensor& sum_exp, const Tensor& count, int64_t ignore, double eps, LossReduction red,
                      const Tensor& dlogits) {
  CudaCall call("cross_entropy_backward", {&g, &logits, &targets, &row_max, &sum_exp, &count, &dlogits});
  LossArgs a = args(logits, targets, ignore);
  a.label_smoothing = eps;
  a.reduction = red;
  a.g = g.raw_data();
  a.row_max = row_max.raw_data();
  a.sum_exp = sum_exp.raw_data();
  a.count = static_cast<int64_t*>(count.raw_data());
  a.dscores = dlogits.raw_data();
  launch_cross_entropy_backward(logits.dtype(), a, call.stream());
}

void nll_forward_cuda(const Tensor& logp, const Tensor& targets, int64_t ignore, const Tensor& losses,
                      const Tensor& count) {
  CudaCall call("nll_loss", {&logp, &targets, &losses, &count});
  LossArgs a = args(logp, targets, ignore);
  a.losses = losses.raw_data();
  a.count = static_cast<int64_t*>(count.raw_data());
  launch_nll_forward(logp.dtype(), a, call.stream());
}

void nll_backward_cuda(const Tensor& g, const Tensor& targets, const Tensor& count, int64_t ignore, LossReduction red,
                       const Tensor& dlogp) {
  CudaCall call("nll_loss_backward", {&g, &targets, &count, &dlogp});
  LossArgs a;
  a.m = dlogp.shape()[0];
  a.k = dlogp.shape()[1];
  a.ignore_index = ignore;
  a.reduction = red;
  a.targets = static_cast<const int64_t*>(targets.raw_data());
  a.g = g.raw_data();
  a.count = static_cast<int64_t*>(count.raw_data());
  a.dscores = dlogp.raw_data();
  launch_nll_backward(dlogp.dtype(), a, call.stream());
}

void loss_reduce_cuda(const Tensor& losses, const Tensor& count, bool mean, const Tensor& out, int v) {
  CudaCall call("loss_reduce", {&losses, &count, &out});
  launch_loss_reduce(losses.dtype(), out.dtype(), losses.raw_data(), losses.numel(),
                     static_cast<const int64_t*>(count.raw_data()), mean, out.raw_data(), v, call.stream());
}

}  // namespace

TESSEL_REGISTER_KERNEL(check_targets, DeviceType::CUDA, check_targets_cuda);
TESSEL_REGISTER_KERNEL(cross_entropy_forward, DeviceType::CUDA, ce_forward_cuda);
TESSEL_REGISTER_KERNEL(cross_entropy_backward, DeviceType::CUDA, ce_backward_cuda);
TESSEL_REGISTER_KERNEL(nll_loss_forward, DeviceType::CUDA, nll_forward_cuda);
TESSEL_REGISTER_KERNEL(nll_loss_backward, DeviceType::CUDA, nll_backward_cuda);
TESSEL_REGISTER_KERNEL(loss_reduce, DeviceType::CUDA, loss_reduce_cuda);

}  // namespace tessel::kernels::cuda
