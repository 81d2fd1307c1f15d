// The deterministic reduction over ranks for the NCCL backend: one thread per
// element evaluates tree_fold (tree.h), the balanced tree the CPU backends
// evaluate level by level, so every backend combines the ranks' values in the
// same order and gets the same bits (built with --fmad=false: no contraction).
#include <cuda_runtime.h>

#include "runtime/comm/nccl_tree.h"
#include "runtime/comm/tree.h"
#include "runtime/half.h"

namespace tessel::comm::nccl_detail {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

template <class T> struct AccOf { using type = T; };
template <> struct AccOf<f16> { using type = float; };
template <> struct AccOf<bf16> { using type = float; };

template <class T, class Combine>
__global__ void rank_tree_kernel(const T* received, const T* own, int own_rank, int n, int64_t len, T* out, bool avg) {
  using Acc = typename AccOf<T>::type;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < len; k += int64_t(gridDim.x) * blockDim.x) {
    auto get = [&](int s) { return Acc(s == own_rank ? own[k] : received[int64_t(s) * len + k]); };
    Acc v = tree_fold<Acc>(n, get, Combine());
    if (avg) v = v / Acc(n);
    out[k] = T(v);
  }
}

template <class T>
const char* launch_typed(int op, const void* received, const void* own, int own_rank, int n, int64_t len, void* out,
                         cudaStream_t stream) {
  using Acc = typename AccOf<T>::type;
  if (len <= 0) return nullptr;
  const int64_t blocks64 = (len + kThreads - 1) / kThreads;
  const unsigned blocks = unsigned(blocks64 < kMaxBlocks ? blocks64 : kMaxBlocks);
  auto r = static_cast<const T*>(received);
  auto o = static_cast<const T*>(own);
  auto d = static_cast<T*>(out);
  switch (op) {
    case 0: rank_tree_kernel<T, TreeSum<Acc>><<<blocks, kThreads, 0, stream>>>(r, o, own_rank, n, len, d, false); break;
    case 1: rank_tree_kernel<T, TreeSum<Acc>><<<blocks, kThreads, 0, stream>>>(r, o, own_rank, n, len, d, true); break;
    case 2: rank_tree_kernel<T, TreeMax<Acc>><<<blocks, kThreads, 0, stream>>>(r, o, own_rank, n, len, d, false); break;
    case 3: rank_tree_kernel<T, TreeMin<Acc>><<<blocks, kThreads, 0, stream>>>(r, o, own_rank, n, len, d, false); break;
    default: return "unknown reduce op";
  }
  cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace

const char* launch_rank_tree(DType dtype, int op, const void* received, const void* own, int own_rank, int n,
                             int64_t len, void* out, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::Bool: return launch_typed<uint8_t>(op, received, own, own_rank, n, len, out, s);
    case DType::Int32: return launch_typed<int32_t>(op, received, own, own_rank, n, len, out, s);
    case DType::Int64: return launch_typed<int64_t>(op, received, own, own_rank, n, len, out, s);
    case DType::Float16: return launch_typed<f16>(op, received, own, own_rank, n, len, out, s);
    case DType::BFloat16: return launch_typed<bf16>(op, received, own, own_rank, n, len, out, s);
    case DType::Float32: return launch_typed<float>(op, received, own, own_rank, n, len, out, s);
    case DType::Float64: return launch_typed<double>(op, received, own, own_rank, n, len, out, s);
  }
  return "unsupported dtype";
}

}  // namespace tessel::comm::nccl_detail
