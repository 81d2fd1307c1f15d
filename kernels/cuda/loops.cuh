#pragma once
// Elementwise launch helper for the CUDA kernels: a grid-stride loop over the
// elements of an ElemGeometry, calling f(off) with the element offsets of
// every operand. One thread per element and no reduction, so results never
// depend on the launch configuration.
#include <cuda_runtime.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/geometry.h"
#include "kernels/cuda/launch.h"

namespace tessel::kernels::cuda {

template <int N, class F>
__global__ void __launch_bounds__(kThreads) elementwise_kernel(ElemGeometry<N> g, F f) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t off[N];
  if (g.contiguous) {
    for (; i < g.numel; i += step) {
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] = i;
      f(off);
    }
  } else {
    for (; i < g.numel; i += step) {
      elem_offsets(g, i, off);
      f(off);
    }
  }
}

template <int N, class F>
void launch_elementwise(const ElemGeometry<N>& g, const F& f, cudaStream_t stream, const char* op) {
  if (g.numel == 0) return;
  elementwise_kernel<N, F><<<grid_blocks(g.numel), kThreads, 0, stream>>>(g, f);
  TESSEL_CUDA_CHECK_LAUNCH(op);
}

}  // namespace tessel::kernels::cuda
