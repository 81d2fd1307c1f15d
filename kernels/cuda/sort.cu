// CUDA sort / topk: a bitonic network per line over (value, index) pairs
// under a strict *total* order (kernels/sort.h: values ascending with NaN
// last, or descending with NaN first; ties by ascending index). A total order
// has exactly one sorted permutation, so the network's result is the CPU's
// (stable) result, whatever the algorithm. Lines are padded to a power of two
// with entries that order after everything. Up to 2048 entries a line sorts
// in shared memory in one block; longer lines run one kernel per network step.
#include <cstdint>
#include <cuda_runtime.h>
#include <type_traits>

#include "kernels/cuda/call.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/geometry.h"
#include "kernels/cuda/geometry_build.h"
#include "kernels/cuda/launch.h"
#include "kernels/sort.h"
#include "runtime/dtype.h"

// ---- launch interface: what the adapters at the end call ----
namespace tessel::kernels::cuda {

// Lines along `dim` of x, values and indices (operands 0, 1, 2 of g). Writes
// the first `count` entries of each line's sorted order (count = n for sort,
// k for topk). `largest`: descending order (NaN first) instead of ascending
// (NaN last); ties by index. by_index_after: re-sort the kept `count` entries
// by index (topk with sorted = false). work: sort_workspace_bytes.
void launch_sort(DType dtype, const RowGeometry<3>& g, const void* x, void* values, int64_t* indices, bool largest,
                 int64_t count, bool by_index_after, void* work, cudaStream_t stream);
size_t sort_workspace_bytes(DType dtype, int64_t lines, int64_t n, int64_t count);

}  // namespace tessel::kernels::cuda

namespace tessel::kernels::cuda {
namespace {

enum class Order : int { Ascending, Descending, ByIndex };

__device__ __forceinline__ unsigned char* shared_array_bytes() {
  extern __shared__ __align__(16) unsigned char tessel_smem[];
  return tessel_smem;
}

// Does (av, ai) come strictly before (bv, bi)? Padding (index < 0) is last.
template <class C>
__device__ __forceinline__ bool before(C av, int64_t ai, C bv, int64_t bi, Order order) {
  if ((ai < 0) != (bi < 0)) return bi < 0;
  if (ai < 0) return false;
  if (order == Order::ByIndex) return ai < bi;
  const bool an = av != av, bn = bv != bv;
  if (order == Order::Ascending) {
    if (an || bn) return an && bn ? ai < bi : bn;
    if (av < bv) return true;
    if (bv < av) return false;
  } else {
    if (an || bn) return an && bn ? ai < bi : an;
    if (av > bv) return true;
    if (bv > av) return false;
  }
  return ai < bi;
}

// One compare-exchange of the bitonic network: pair (i, i + j) in a block of k.
template <class C>
__device__ __forceinline__ void compare_exchange(C* v, int64_t* ix, int64_t i, int64_t j, int64_t k, Order order) {
  const int64_t l = i + j;
  const bool up = (i & k) == 0;
  const bool swap = up ? before(v[l], ix[l], v[i], ix[i], order) : before(v[i], ix[i], v[l], ix[l], order);
  if (swap) {
    const C tv = v[i];
    v[i] = v[l];
    v[l] = tv;
    const int64_t ti = ix[i];
    ix[i] = ix[l];
    ix[l] = ti;
  }
}

__device__ __forceinline__ int64_t pair_low(int64_t q, int64_t j) { return 2 * j * (q / j) + (q % j); }

template <class T>
__global__ void load_keys_kernel(RowGeometry<3> g, const T* x, acc_t<T>* keys, int64_t* idx, int64_t p2) {
  const int64_t total = g.rows * p2;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t line = e / p2, t = e - line * p2;
    if (t < g.n) {
      keys[e] = acc_t<T>(widen(x[row_offset(g, line, 0) + t * g.inner_stride[0]]));
      idx[e] = t;
    } else {
      keys[e] = acc_t<T>(0);
      idx[e] = -1;
    }
  }
}

template <class C>
__global__ void bitonic_smem_kernel(C* keys, int64_t* idx, int64_t p2, Order order) {
  C* sv = reinterpret_cast<C*>(shared_array_bytes());
  int64_t* si = reinterpret_cast<int64_t*>(shared_array_bytes() + ((p2 * sizeof(C) + 15) / 16) * 16);
  C* kv = keys + blockIdx.x * p2;
  int64_t* ki = idx + blockIdx.x * p2;
  for (int64_t t = threadIdx.x; t < p2; t += blockDim.x) {
    sv[t] = kv[t];
    si[t] = ki[t];
  }
  __syncthreads();
  for (int64_t k = 2; k <= p2; k *= 2)
    for (int64_t j = k / 2; j > 0; j /= 2) {
      for (int64_t q = threadIdx.x; q < p2 / 2; q += blockDim.x) compare_exchange(sv, si, pair_low(q, j), j, k, order);
      __syncthreads();
    }
  for (int64_t t = threadIdx.x; t < p2; t += blockDim.x) {
    kv[t] = sv[t];
    ki[t] = si[t];
  }
}

template <class C>
__global__ void bitonic_step_kernel(C* keys, int64_t* idx, int64_t lines, int64_t p2, int64_t j, int64_t k,
                                    Order order) {
  const int64_t pairs = lines * (p2 / 2);
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs; p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t line = p / (p2 / 2), q = p - line * (p2 / 2);
    compare_exchange(keys + line * p2, idx + line * p2, pair_low(q, j), j, k, order);
  }
}

// Copies entry t < count of every line from (keys, idx) [lines, src_p2] into
// [lines, dst_p2] (padding the rest).
template <class C>
__global__ void shrink_kernel(const C* keys, const int64_t* idx, int64_t src_p2, C* okeys, int64_t* oidx,
                              int64_t dst_p2, int64_t lines, int64_t count) {
  const int64_t total = lines * dst_p2;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t line = e / dst_p2, t = e - line * dst_p2;
    okeys[e] = t < count ? keys[line * src_p2 + t] : C(0);
    oidx[e] = t < count ? idx[line * src_p2 + t] : -1;
  }
}

template <class T>
__global__ void write_kernel(RowGeometry<3> g, const T* x, const int64_t* idx, int64_t p2, T* values,
                             int64_t* indices, int64_t count) {
  const int64_t total = g.rows * count;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t line = e / count, t = e - line * count;
    const int64_t i = idx[line * p2 + t];
    values[row_offset(g, line, 1) + t * g.inner_stride[1]] = x[row_offset(g, line, 0) + i * g.inner_stride[0]];
    indices[row_offset(g, line, 2) + t * g.inner_stride[2]] = i;
  }
}

int64_t pow2_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

constexpr int64_t kSmemMax = 2048;

template <class C>
size_t smem_bytes(int64_t p2) {
  return ((size_t(p2) * sizeof(C) + 15) / 16) * 16 + size_t(p2) * sizeof(int64_t);
}

template <class C>
void sort_lines(C* keys, int64_t* idx, int64_t lines, int64_t p2, Order order, cudaStream_t s) {
  if (p2 <= 1) return;
  if (p2 <= kSmemMax) {
    const int threads = int(p2 / 2 < 32 ? 32 : (p2 / 2 > 1024 ? 1024 : p2 / 2));
    for (int64_t l0 = 0; l0 < lines; l0 += kMaxBlocks) {
      const int64_t nl = lines - l0 < kMaxBlocks ? lines - l0 : kMaxBlocks;
      bitonic_smem_kernel<C><<<unsigned(nl), threads, smem_bytes<C>(p2), s>>>(keys + l0 * p2, idx + l0 * p2, p2, order);
      TESSEL_CUDA_CHECK_LAUNCH("sort");
    }
    return;
  }
  for (int64_t k = 2; k <= p2; k *= 2)
    for (int64_t j = k / 2; j > 0; j /= 2) {
      bitonic_step_kernel<C><<<grid_blocks(lines * (p2 / 2)), kThreads, 0, s>>>(keys, idx, lines, p2, j, k, order);
      TESSEL_CUDA_CHECK_LAUNCH("sort");
    }
}

}  // namespace

size_t sort_workspace_bytes(DType dtype, int64_t lines, int64_t n, int64_t count) {
  const size_t key = dtype == DType::Float64 || dtype == DType::Int64 ? 8 : 4;
  const size_t one = size_t(lines) * size_t(pow2_at_least(n)) * (key + 8);
  const size_t two = size_t(lines) * size_t(pow2_at_least(count)) * (key + 8);
  return one + two + 64;
}

void launch_sort(DType dtype, const RowGeometry<3>& g, const void* x, void* values, int64_t* indices, bool largest,
                 int64_t count, bool by_index_after, void* work, cudaStream_t s) {
  if (g.rows == 0 || count == 0) return;
  dispatch_all(dtype, "sort", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = acc_t<T>;
    const int64_t p2 = pow2_at_least(g.n);
    // Workspace: keys [rows, p2] (aligned to 8), idx [rows, p2], then the re-sort buffers.
    char* w = static_cast<char*>(work);
    auto take = [&](size_t bytes) {
      char* p = w;
      w += (bytes + 7) / 8 * 8;
      return p;
    };
    C* keys = reinterpret_cast<C*>(take(size_t(g.rows * p2) * sizeof(C)));
    int64_t* idx = reinterpret_cast<int64_t*>(take(size_t(g.rows * p2) * 8));
    load_keys_kernel<T><<<grid_blocks(g.rows * p2), kThreads, 0, s>>>(g, static_cast<const T*>(x), keys, idx, p2);
    TESSEL_CUDA_CHECK_LAUNCH("sort");
    sort_lines<C>(keys, idx, g.rows, p2, largest ? Order::Descending : Order::Ascending, s);
    int64_t* out_idx = idx;
    int64_t out_p2 = p2;
    if (by_index_after) {
      const int64_t q2 = pow2_at_least(count);
      C* k2 = reinterpret_cast<C*>(take(size_t(g.rows * q2) * sizeof(C)));
      int64_t* i2 = reinterpret_cast<int64_t*>(take(size_t(g.rows * q2) * 8));
      shrink_kernel<C><<<grid_blocks(g.rows * q2), kThreads, 0, s>>>(keys, idx, p2, k2, i2, q2, g.rows, count);
      TESSEL_CUDA_CHECK_LAUNCH("topk");
      sort_lines<C>(k2, i2, g.rows, q2, Order::ByIndex, s);
      out_idx = i2;
      out_p2 = q2;
    }
    write_kernel<T><<<grid_blocks(g.rows * count), kThreads, 0, s>>>(g, static_cast<const T*>(x), out_idx, out_p2,
                                                                     static_cast<T*>(values), indices, count);
    TESSEL_CUDA_CHECK_LAUNCH("sort");
  });
}

}  // namespace tessel::kernels::cuda

// ---- KernelTable adapters: register the CUDA sort / topk kernels.
namespace tessel::kernels::cuda {
namespace {

void run(const CudaCall& call, const Tensor& x, int d, const Tensor& values, const Tensor& indices, bool descending,
         int64_t count, bool by_index_after) {
  const RowGeometry<3> g = make_row_geometry<3>(x.shape(), d, {&x.strides(), &values.strides(), &indices.strides()});
  Tensor work = scratch(call, Dims{int64_t(sort_workspace_bytes(x.dtype(), g.rows, g.n, count))}, DType::Bool);
  launch_sort(x.dtype(), g, x.raw_data(), values.raw_data(), static_cast<int64_t*>(indices.raw_data()), descending,
              count, by_index_after, work.raw_data(), call.stream());
}

void sort_cuda(const Tensor& x, int64_t dim, bool descending, const Tensor& values, const Tensor& indices) {
  CudaCall call("sort", {&x, &values, &indices});
  const int d = wrap_dim(dim, x.dim(), "sort");
  if (x.numel() == 0) return;
  run(call, x, d, values, indices, descending, x.shape()[d], false);
}

void topk_cuda(const Tensor& x, int64_t k, int64_t dim, bool largest, bool sorted, const Tensor& values,
               const Tensor& indices) {
  CudaCall call("topk", {&x, &values, &indices});
  const int d = wrap_dim(dim, x.dim(), "topk");
  if (values.numel() == 0) return;
  run(call, x, d, values, indices, largest, k, !sorted);
}

}  // namespace

TESSEL_REGISTER_KERNEL(sort, DeviceType::CUDA, sort_cuda);
TESSEL_REGISTER_KERNEL(topk, DeviceType::CUDA, topk_cuda);

}  // namespace tessel::kernels::cuda
