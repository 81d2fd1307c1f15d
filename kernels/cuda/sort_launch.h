#pragma once
// Launchers of the CUDA sort / topk kernels (sort.cu); adapters in sort.cc.
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/geometry.h"
#include "runtime/dtype.h"

namespace tessel::kernels::cuda {

// Lines along `dim` of x, values and indices (operands 0, 1, 2 of g). Writes
// the first `count` entries of each line's sorted order (count = n for sort,
// k for topk). `largest`: descending order (NaN first) instead of ascending
// (NaN last); ties by index. by_index_after: re-sort the kept `count` entries
// by index (topk with sorted = false). work: sort_workspace_bytes.
void launch_sort(DType dtype, const RowGeometry<3>& g, const void* x, void* values, int64_t* indices, bool largest,
                 int64_t count, bool by_index_after, void* work, cudaStream_t stream);
size_t sort_workspace_bytes(DType dtype, int64_t lines, int64_t n, int64_t count);

}  // namespace tessel::kernels::cuda
