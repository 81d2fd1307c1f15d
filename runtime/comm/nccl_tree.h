#pragma once
// The NCCL backend's reduction over ranks on the GPU (runtime/comm/nccl_tree.cu).
// Plain declarations, no tensor or fmt dependency, so nvcc compiles only
// device-safe headers.
#include <cstdint>

#include "runtime/dtype.h"

namespace tessel::comm::nccl_detail {

// out[k] = the tree over s = 0..n-1 (tree.h, the same order as the CPU
// backends) of contribution s, which is own[k] for s == own_rank and
// received[s * len + k] otherwise; 16-bit floats in float32, avg = sum / n.
// `op` is a ReduceOp value (0 sum, 1 avg, 2 max, 3 min). `out` may be `own`.
// Returns nullptr on success, else a description of the failure. Launches
// asynchronously on `stream` (a cudaStream_t).
const char* launch_rank_tree(DType dtype, int op, const void* received, const void* own, int own_rank, int n,
                             int64_t len, void* out, void* stream);

}  // namespace tessel::comm::nccl_detail
