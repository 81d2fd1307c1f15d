#pragma once
// Launchers of the CUDA unary kernels (unary.cu); adapters in unary.cc.
#include <cuda_runtime.h>

#include "kernels/cuda/geometry.h"
#include "kernels/unary.h"

namespace tessel::kernels::cuda {

// out = op(x). Operands: out, x.
void launch_unary(UnaryOp op, DType dtype, const ElemGeometry<2>& g, void* out, const void* x, cudaStream_t stream);
// dx = op'(x) * g (y = op(x)). Operands: dx, g, x, y.
void launch_unary_backward(UnaryOp op, DType dtype, const ElemGeometry<4>& g, void* dx, const void* grad,
                           const void* x, const void* y, cudaStream_t stream);

}  // namespace tessel::kernels::cuda
