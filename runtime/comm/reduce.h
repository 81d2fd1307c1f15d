#pragma once
// The deterministic reduction over ranks on the CPU (local and MPI backends).
#include <cstdint>

#include "runtime/comm/comm.h"
#include "runtime/dtype.h"

namespace tessel::comm {

// out[k] = tree over r = 0..n-1 of src[r][k] (tree.h), for k in [0, count).
// 16-bit floats combine in float32 and round once; Avg divides the tree sum
// by n before rounding. `out` may alias one of the sources (element k is
// written only after every src[r][k] was read). Throws for combinations the
// contract does not define (Sum/Avg of bool, Avg of integers).
void tree_reduce(DType dtype, ReduceOp op, const void* const* src, int n, int64_t count, void* out);

// Throws tessel::Error("<where>: ...") when `op` is not defined for `dtype`.
void check_reduce_dtype(const std::string& where, DType dtype, ReduceOp op);

}  // namespace tessel::comm
