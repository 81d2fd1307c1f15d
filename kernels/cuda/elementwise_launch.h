#pragma once
// Launchers of the elementwise CUDA kernels (elementwise.cu, copy.cu); the
// KernelTable adapters are in elementwise.cc. Operand 0 of every geometry is
// the output. All launches are asynchronous on `stream`.
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/geometry.h"
#include "kernels/elementwise.h"

namespace tessel::kernels::cuda {

// out = op(a, b); a and b have dtype `dtype`, out has it too (bool for
// comparisons and logical ops). Operands: out, a, b.
void launch_binary(BinaryOp op, DType dtype, const ElemGeometry<3>& g, void* out, const void* a, const void* b,
                   cudaStream_t stream);
// dst = convert(src). Operands: dst, src.
void launch_copy(DType dst_dtype, DType src_dtype, const ElemGeometry<2>& g, void* dst, const void* src,
                 cudaStream_t stream);
// dst = value (its bytes, already converted to dtype, in the low bytes).
void launch_fill(DType dtype, uint64_t value_bits, const ElemGeometry<1>& g, void* dst, cudaStream_t stream);
// out = cond ? a : b. Operands: out, cond, a, b.
void launch_where(DType dtype, const ElemGeometry<4>& g, void* out, const bool* cond, const void* a, const void* b,
                  cudaStream_t stream);

}  // namespace tessel::kernels::cuda
