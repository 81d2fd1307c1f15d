#pragma once
// Launcher of the CUDA rotary embedding kernel (rope.cu); adapter in rope.cc.
#include <cstdint>

#include <cuda_runtime.h>

#include "runtime/dtype.h"

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
