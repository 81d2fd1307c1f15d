// CUDA rotary embeddings (kernels/rope.h): one thread per output element,
// products rounded separately and then added (no FMA), as on the CPU.
#include "kernels/cuda/check.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/rope_launch.h"

namespace tessel::kernels::cuda {
namespace {

__device__ __forceinline__ int64_t position_of(const RopeArgs& a, int64_t b, int64_t t) {
  return a.positions ? a.positions[b * a.psb + t * a.pst] : a.offset + t;
}

template <class T>
__global__ void rope_kernel(RopeArgs a) {
  using C = acc_t<T>;
  const T* x = static_cast<const T*>(a.x);
  const C* ct = static_cast<const C*>(a.cos);
  const C* st = static_cast<const C*>(a.sin);
  T* out = static_cast<T*>(a.out);
  const int64_t total = a.B * a.T * a.H * a.D, R = 2 * a.half;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = e % a.D, row = e / a.D;
    const int64_t h = row % a.H, bt = row / a.H, t = bt % a.T, b = bt / a.T;
    const T* xr = x + b * a.sb + t * a.st + h * a.sh;
    if (j >= R) {
      out[e] = xr[j * a.sd];
      continue;
    }
    int64_t i, j1, j2;
    if (a.interleaved) {
      i = j / 2;
      j1 = 2 * i;
      j2 = j1 + 1;
    } else {
      i = j < a.half ? j : j - a.half;
      j1 = i;
      j2 = i + a.half;
    }
    const int64_t pos = position_of(a, b, t);
    const C c = ct[pos * a.half + i], s = st[pos * a.half + i];
    const C x1 = C(widen(xr[j1 * a.sd])), x2 = C(widen(xr[j2 * a.sd]));
    C v;
    if (j == j1) v = a.inverse ? x1 * c + x2 * s : x1 * c - x2 * s;
    else v = a.inverse ? x2 * c - x1 * s : x2 * c + x1 * s;
    out[e] = narrow<T>(v);
  }
}

__global__ void rope_check_kernel(RopeArgs a, int64_t* bad) {
  for (int64_t bt = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; bt < a.B * a.T;
       bt += int64_t(gridDim.x) * blockDim.x) {
    const int64_t pos = position_of(a, bt / a.T, bt % a.T);
    if (pos < 0 || pos >= a.P) atomicMin(reinterpret_cast<unsigned long long*>(bad), (unsigned long long)bt);
  }
}

}  // namespace

void launch_rope(DType dtype, const RopeArgs& a, cudaStream_t s) {
  const int64_t total = a.B * a.T * a.H * a.D;
  if (total == 0) return;
  dispatch_floating(dtype, "apply_rotary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    rope_kernel<T><<<grid_blocks(total), kThreads, 0, s>>>(a);
    TESSEL_CUDA_CHECK_LAUNCH("apply_rotary");
  });
}

void launch_rope_check(const RopeArgs& a, int64_t* bad, cudaStream_t s) {
  if (a.B * a.T == 0) return;
  rope_check_kernel<<<grid_blocks(a.B * a.T), kThreads, 0, s>>>(a, bad);
  TESSEL_CUDA_CHECK_LAUNCH("apply_rotary");
}

}  // namespace tessel::kernels::cuda
