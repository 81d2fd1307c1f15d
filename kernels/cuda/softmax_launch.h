#pragma once
// Launchers of the CUDA softmax kernels (softmax.cu); adapters in softmax.cc.
#include <cuda_runtime.h>

#include "kernels/cuda/geometry.h"
#include "runtime/dtype.h"

namespace tessel::kernels::cuda {

// Operands: x, out.
void launch_softmax_forward(DType dtype, const RowGeometry<2>& g, const void* x, void* out, bool log, int chunks,
                            cudaStream_t stream);
// Operands: g, y, dx.
void launch_softmax_backward(DType dtype, const RowGeometry<3>& geo, const void* g, const void* y, void* dx, bool log,
                             int chunks, cudaStream_t stream);

}  // namespace tessel::kernels::cuda
