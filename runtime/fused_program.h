#pragma once
// A fused elementwise chain as one kernel's argument (docs/compile.md,
// "Fusion"): plain data, passed by value to a device kernel, evaluated per
// element by kernels/fused_chain.h. runtime/capture_fusion.cc builds it from
// a chain of recorded Elementwise launches; a device's FusedBackend runs it.
//
// The chain's iteration space is [rows, cols] (capture_fusion.cc's row
// layout): element (r, c) of operand k is at
// data + (r * row_stride + c * col_stride) elements. An operand "in a
// register" is an intermediate no one outside the chain reads: it never
// goes to memory, and holds the value rounded to its dtype, as a store and
// a load would.
#include <cstdint>

namespace tessel::capture {

inline constexpr int kMaxFusedSteps = 16;
inline constexpr int kMaxFusedOperands = 16;

// What one launch of the chain computes (the kernel table it came from).
enum class FusedKind : uint8_t {
  Unary,          // out = unary op(x)                    (kernels::unary)
  UnaryBackward,  // dx = op'(x) g, given g, x, y = op(x) (kernels::unary_backward)
  Binary,         // out = op(a, b), arithmetic           (kernels::binary)
  Copy,           // dst = src converted                  (kernels::copy)
  Where,          // out = cond ? a : b                   (kernels::where)
};

// The operand types a fused chain takes: 16/32-bit floats computed in
// float32 (as every unfused kernel computes them), and bool conditions.
enum class FusedType : uint8_t { Float32, BFloat16, Float16, Bool };

struct FusedOperand {
  char* data = nullptr;  // element (0, 0); null in a register
  int64_t row_stride = 0, col_stride = 0;
  FusedType type = FusedType::Float32;
  uint8_t in_register = 0;
};

struct FusedStep {
  FusedKind kind = FusedKind::Unary;
  uint8_t op = 0;               // the table's op enum (UnaryOp, BinaryOp)
  int8_t in[3] = {-1, -1, -1};  // operand indices, in the launch's argument order
  int8_t out = -1;              // the launch's last tensor argument
};

struct FusedProgram {
  int64_t rows = 0, cols = 0;
  int32_t num_steps = 0, num_operands = 0;
  FusedStep steps[kMaxFusedSteps];
  FusedOperand operands[kMaxFusedOperands];
};

}  // namespace tessel::capture
