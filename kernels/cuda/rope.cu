// CUDA rotary embeddings (kernels/rope.h): one thread per output element,
// products rounded separately and then added (no FMA), as on the CPU.
#include <cstdint>
#include <cuda_runtime.h>
#include <limits>

#include "kernels/cuda/call.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/launch.h"
#include "kernels/elementwise.h"
#include "kernels/rope.h"
#include "runtime/dtype.h"

// ---- launch interface: what the adapter at the end calls ----
namespace tessel::kernels::cuda {

struct RopeArgs {
  int64_t B = 0, T = 0, H = 0, D = 0;
  int64_t sb = 0, st = 0, sh = 0, sd = 0;  // x strides (elements)
  int64_t half = 0, P = 0;                 // table [P, half]
  const int64_t* positions = nullptr;      // [B, T] or null
  int64_t psb = 0, pst = 0;
  int64_t offset = 0;
  bool interleaved = false, inverse = false;
  const void* x = nullptr;
  const void* cos = nullptr;  // compute type
  const void* sin = nullptr;
  void* out = nullptr;        // contiguous [B, T, H, D]
};

void launch_rope(DType dtype, const RopeArgs& a, cudaStream_t stream);
// *bad (preset INT64_MAX) = first b * T + t whose position is outside [0, P).
void launch_rope_check(const RopeArgs& a, int64_t* bad, cudaStream_t stream);

}  // namespace tessel::kernels::cuda

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

// ---- KernelTable adapters: register the CUDA rotary embedding kernel.
namespace tessel::kernels::cuda {
namespace {

void rope_apply_cuda(const Tensor& x, const Tensor& cos_t, const Tensor& sin_t, const Tensor& positions,
                     int64_t offset, bool interleaved, bool inverse, const Tensor& out) {
  CudaCall call("apply_rotary", {&x, &cos_t, &sin_t, &positions, &out});
  if (x.numel() == 0) return;
  RopeArgs a;
  a.B = x.shape()[0];
  a.T = x.shape()[1];
  a.H = x.shape()[2];
  a.D = x.shape()[3];
  a.sb = x.strides()[0];
  a.st = x.strides()[1];
  a.sh = x.strides()[2];
  a.sd = x.strides()[3];
  a.half = cos_t.shape()[1];
  a.P = cos_t.shape()[0];
  a.offset = offset;
  a.interleaved = interleaved;
  a.inverse = inverse;
  a.x = x.raw_data();
  a.cos = cos_t.raw_data();
  a.sin = sin_t.raw_data();
  a.out = out.raw_data();
  int64_t bad_bt = -1;
  // Positions are data: checked on the GPU before the rotation (the op checks
  // the offset form, not a positions tensor's values).
  if (positions.defined()) {
    a.positions = static_cast<const int64_t*>(positions.raw_data());
    a.psb = positions.strides()[0];
    a.pst = positions.strides()[1];
    const int64_t none = std::numeric_limits<int64_t>::max();
    Tensor bad = upload(call, &none, Dims{}, DType::Int64);
    launch_rope_check(a, static_cast<int64_t*>(bad.raw_data()), call.stream());
    int64_t v = none;
    read_back(call, bad, &v, sizeof(v));
    if (v != none) bad_bt = v;
  } else if (a.T > 0 && (offset < 0 || offset + a.T > a.P)) {
    bad_bt = offset < 0 || offset >= a.P ? 0 : a.P - offset;  // batch 0, the first time step outside the table
  }
  if (bad_bt >= 0) {
    const int64_t b = bad_bt / a.T, t = bad_bt % a.T;
    int64_t pos = offset + t;
    if (positions.defined()) {
      Tensor one = scratch(call, Dims{1}, DType::Int64);
      copy(call.dev(), raw::narrow(raw::select(positions, 0, b), 0, t, 1), one);
      read_back(call, one, &pos, sizeof(pos));
    }
    TESSEL_FAIL("apply_rotary",
                "position {} of token (batch {}, time {}) is outside the cos/sin tables, which cover positions [0, {})",
                pos, b, t, a.P);
  }
  launch_rope(x.dtype(), a, call.stream());
}

}  // namespace

TESSEL_REGISTER_KERNEL(rope_apply, DeviceType::CUDA, rope_apply_cuda);

}  // namespace tessel::kernels::cuda
