#pragma once
// Launchers of the CUDA reductions (reduce.cu); adapters in reduce.cc.
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/geometry.h"
#include "kernels/cuda/launch.h"
#include "kernels/reduce.h"

namespace tessel::kernels::cuda {

// Scratch bytes launch_reduce needs for (path, dtype, geometry, V): the column
// path keeps V chunk values per output.
size_t reduce_workspace_bytes(ReducePath path, DType dtype, const ReduceGeometry& g, int chunks);

// out = reduce(x) in the canonical order (floating) or exactly (integer/bool;
// sums are int64). g.n > 0 and g.outputs > 0.
void launch_reduce(ReduceOp op, DType dtype, ReducePath path, const ReduceGeometry& g, const void* x, void* out,
                   int chunks, void* work, cudaStream_t stream);

// out[row] = index of the first max (min) along the row; NaN counts as the
// maximum and the minimum (first NaN wins). Operands: x, out.
void launch_arg_reduce(DType dtype, const RowGeometry<2>& g, const void* x, int64_t* out, bool is_max,
                       cudaStream_t stream);

}  // namespace tessel::kernels::cuda
