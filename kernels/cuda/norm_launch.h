#pragma once
// Launchers of the CUDA LayerNorm / RMSNorm kernels (norm.cu); adapters in
// norm.cc. Layout (kernels/norm.h): x, g, y, dx contiguous [M, N]; weight,
// bias, dweight, dbias contiguous [N] (null: absent); mean, rstd [M] in the
// compute type.
#include <cstdint>

#include <cuda_runtime.h>

#include "runtime/dtype.h"

namespace tessel::kernels::cuda {

struct NormArgs {
  int64_t m = 0, n = 0;
  bool rms = false;
  double eps = 0;
  int chunks = 16;
  const void* x = nullptr;
  const void* g = nullptr;       // backward
  const void* weight = nullptr;  // may be null
  const void* bias = nullptr;    // may be null (forward, layer norm)
  void* y = nullptr;             // forward
  void* mean = nullptr;          // layer norm (forward writes, backward reads)
  void* rstd = nullptr;
  void* dx = nullptr;       // backward, may be null
  void* dweight = nullptr;  // backward, may be null
  void* dbias = nullptr;    // backward, may be null
  void* work = nullptr;     // backward with dweight/dbias: norm_workspace_bytes
};

void launch_norm_forward(DType dtype, const NormArgs& a, cudaStream_t stream);
void launch_norm_backward(DType dtype, const NormArgs& a, cudaStream_t stream);
// Scratch for the column sums of the weight/bias gradients: 2 x V x N values.
size_t norm_workspace_bytes(DType dtype, int64_t n, int chunks);

}  // namespace tessel::kernels::cuda
