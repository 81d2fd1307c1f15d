#pragma once
// Launchers of the CUDA optimizer kernels (optim.cu); adapters in optim.cc.
#include <cuda_runtime.h>

#include "kernels/cuda/geometry.h"
#include "kernels/optim.h"

namespace tessel::kernels::cuda {

// Operands: param, grad, exp_avg, exp_avg_sq (grad: float32/bfloat16/float16).
void launch_adamw(DType grad_dtype, const ElemGeometry<4>& g, float* p, const void* grad, float* m, float* v,
                  const AdamWScalars& s, cudaStream_t stream);
// Operands: param, grad[, momentum_buf] (buf null when !s.use_momentum; then g has 2 operands used).
void launch_sgd(DType grad_dtype, const ElemGeometry<3>& g, float* p, const void* grad, float* buf,
                const SGDScalars& s, cudaStream_t stream);
// out (one float) = canonical sum of square_term(x[t]) over contiguous x[0..n).
void launch_sum_squares(DType dtype, const void* x, int64_t n, int chunks, float* out, cudaStream_t stream);
// x = x * s (in float, rounded once).
void launch_scale(DType dtype, const ElemGeometry<1>& g, void* x, float s, cudaStream_t stream);
// x = x * inv_scale, *found_inf = 1 if any element was inf/NaN.
void launch_amp_unscale(DType dtype, const ElemGeometry<1>& g, void* x, float inv_scale, float* found_inf,
                        cudaStream_t stream);

}  // namespace tessel::kernels::cuda
