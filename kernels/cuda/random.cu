// CUDA random kernels: one thread per output element (grid-stride). Each
// thread finds its element's global index from the block geometry and
// evaluates the per-element definition of kernels/random_math.h, the same
// function the CPU kernels' block path is tested against bit for bit, so CPU
// and CUDA agree bitwise (built with --fmad=false; sqrt and division are the
// IEEE ones by nvcc's defaults).
//
// One Philox call per element (a 4-element block is recomputed by up to four
// threads): simple, and Philox is cheap next to the memory traffic.
#include <cstdint>
#include <cuda_runtime.h>

#include "kernels/random.h"
#include "kernels/random_math.h"
#include "runtime/dtype.h"

// ---- launch interface: what the adapters at the end call ----
namespace tessel::kernels::cuda {

// Each returns nullptr on success, else a description of the failure
// (an unsupported dtype, or the CUDA error of the launch). `stream` is a
// cudaStream_t (null: the default stream). Launches are asynchronous.
const char* launch_random_fill(DType dtype, const RandomParams& params, const RandomGeometry& g, void* out,
                               void* stream);
const char* launch_dropout(DType dtype, PhiloxKey key, uint32_t keep_threshold, double scale, const RandomGeometry& g,
                           const void* in, void* out, void* stream);

}  // namespace tessel::kernels::cuda

namespace tessel::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

struct Where {
  uint64_t e;  // global linear index
  int64_t o;   // output offset (elements)
  int64_t i;   // input offset (elements)
};

__device__ __forceinline__ Where locate(const RandomGeometry& g, int64_t linear) {
  Where w{g.base, 0, 0};
  int64_t rem = linear;
  for (int d = g.ndim - 1; d >= 0; --d) {
    int64_t idx = rem % g.size[d];
    rem /= g.size[d];
    w.e += uint64_t(idx) * uint64_t(g.gstride[d]);
    w.o += idx * g.ostride[d];
    w.i += idx * g.istride[d];
  }
  return w;
}

template <RandomDist D, class T, class C, bool kWide>
__global__ void fill_kernel(RandomGeometry g, rng::DistConsts<T, C> k, T* out) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < g.numel; n += stride) {
    Where w = locate(g, n);
    if constexpr (kWide) {
      out[w.o] = rng::wide_value<D>(k, philox::block(k.key, w.e >> 1), int(w.e & 1));
    } else {
      out[w.o] = rng::narrow_value<D, T, C>(k, philox::block(k.key, w.e >> 2), int(w.e & 3));
    }
  }
}

template <class T, class C>
__global__ void dropout_kernel(RandomGeometry g, PhiloxKey key, uint32_t keep_threshold, C scale, const T* in,
                               T* out) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < g.numel; n += stride) {
    Where w = locate(g, n);
    out[w.o] = rng::dropout_value<T, C>(keep_threshold, scale, philox::bits_at(key, w.e), in[w.i]);
  }
}

unsigned grid_for(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

const char* check_launch() {
  cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

template <RandomDist D, class T>
const char* fill_typed(const RandomParams& p, const RandomGeometry& g, void* out, cudaStream_t s) {
  if (g.numel == 0) return nullptr;
  if constexpr (std::is_same_v<T, double> && D != RandomDist::Bernoulli && D != RandomDist::Randint) {
    auto k = rng::make_consts<double, double>(p);
    fill_kernel<D, double, double, true><<<grid_for(g.numel), kThreads, 0, s>>>(g, k, static_cast<double*>(out));
  } else {
    using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
    auto k = rng::make_consts<T, C>(p);
    fill_kernel<D, T, C, false><<<grid_for(g.numel), kThreads, 0, s>>>(g, k, static_cast<T*>(out));
  }
  return check_launch();
}

template <RandomDist D>
const char* fill_dist(DType dtype, const RandomParams& p, const RandomGeometry& g, void* out, cudaStream_t s) {
  constexpr bool kAny = D == RandomDist::Bernoulli;
  constexpr bool kNumeric = kAny || D == RandomDist::Randint;
  switch (dtype) {
    case DType::Float32: return fill_typed<D, float>(p, g, out, s);
    case DType::Float64: return fill_typed<D, double>(p, g, out, s);
    case DType::Float16: return fill_typed<D, f16>(p, g, out, s);
    case DType::BFloat16: return fill_typed<D, bf16>(p, g, out, s);
    case DType::Int32:
      if constexpr (kNumeric) return fill_typed<D, int32_t>(p, g, out, s);
      break;
    case DType::Int64:
      if constexpr (kNumeric) return fill_typed<D, int64_t>(p, g, out, s);
      break;
    case DType::Bool:
      if constexpr (kAny) return fill_typed<D, bool>(p, g, out, s);
      break;
  }
  return "unsupported dtype for this distribution";
}

template <class T>
const char* dropout_typed(PhiloxKey key, uint32_t thr, double scale, const RandomGeometry& g, const void* in,
                          void* out, cudaStream_t s) {
  if (g.numel == 0) return nullptr;
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  dropout_kernel<T, C><<<grid_for(g.numel), kThreads, 0, s>>>(g, key, thr, C(scale), static_cast<const T*>(in),
                                                              static_cast<T*>(out));
  return check_launch();
}

}  // namespace

const char* launch_random_fill(DType dtype, const RandomParams& p, const RandomGeometry& g, void* out,
                               void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (p.dist) {
    case RandomDist::Uniform: return fill_dist<RandomDist::Uniform>(dtype, p, g, out, s);
    case RandomDist::Normal: return fill_dist<RandomDist::Normal>(dtype, p, g, out, s);
    case RandomDist::Bernoulli: return fill_dist<RandomDist::Bernoulli>(dtype, p, g, out, s);
    case RandomDist::Randint: return fill_dist<RandomDist::Randint>(dtype, p, g, out, s);
    case RandomDist::TruncNormal: return fill_dist<RandomDist::TruncNormal>(dtype, p, g, out, s);
  }
  return "unknown distribution";
}

const char* launch_dropout(DType dtype, PhiloxKey key, uint32_t keep_threshold, double scale, const RandomGeometry& g,
                           const void* in, void* out, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::Float32: return dropout_typed<float>(key, keep_threshold, scale, g, in, out, s);
    case DType::Float64: return dropout_typed<double>(key, keep_threshold, scale, g, in, out, s);
    case DType::Float16: return dropout_typed<f16>(key, keep_threshold, scale, g, in, out, s);
    case DType::BFloat16: return dropout_typed<bf16>(key, keep_threshold, scale, g, in, out, s);
    default: return "dropout needs a floating-point dtype";
  }
}

}  // namespace tessel::kernels::cuda

// ---- KernelTable adapters: register the CUDA random kernels in the random
// KernelTables: build the block geometry on the host and launch.
namespace tessel::kernels::cuda {
namespace {

// What stays checked here is the device (these adapters take no CudaCall,
// which would) and the launch; shapes and dtypes are the op's.
void check_device(const char* op, const Tensor& t) {
  TESSEL_CHECK(t.device().is_cuda(), op, "expected a CUDA tensor, got {}", t.desc());
}

void random_fill_cuda(const Tensor& out, const RandomParams& p, const GlobalBlock& block) {
  check_device(random_dist_name(p.dist), out);
  RandomGeometry g = make_random_geometry(out, block);
  const char* err = launch_random_fill(out.dtype(), p, g, out.raw_data(), nullptr);
  TESSEL_CHECK(err == nullptr, random_dist_name(p.dist), "CUDA kernel for {} failed: {}", out.desc(), err);
}

void dropout_cuda(const Tensor& in, const Tensor& out, PhiloxKey key, uint32_t keep_threshold, double scale,
                  const GlobalBlock& block) {
  check_device("dropout", in);
  check_device("dropout", out);
  RandomGeometry g = make_random_geometry(out, block, &in);
  const char* err = launch_dropout(out.dtype(), key, keep_threshold, scale, g, in.raw_data(), out.raw_data(), nullptr);
  TESSEL_CHECK(err == nullptr, "dropout", "CUDA kernel for {} failed: {}", out.desc(), err);
}

}  // namespace

TESSEL_REGISTER_KERNEL(random_fill, DeviceType::CUDA, random_fill_cuda);
TESSEL_REGISTER_KERNEL(dropout, DeviceType::CUDA, dropout_cuda);

}  // namespace tessel::kernels::cuda
