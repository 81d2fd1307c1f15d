#pragma once
// The reductions a collective or a Partial placement can stand for.
#include <cstdint>

namespace tessel::comm {

enum class ReduceOp : uint8_t { Sum, Avg, Max, Min };
const char* reduce_op_name(ReduceOp op);  // "sum", "avg", "max", "min"

}  // namespace tessel::comm
