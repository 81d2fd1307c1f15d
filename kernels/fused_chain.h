#pragma once
// A fused elementwise chain evaluated per element (runtime/fused_program.h;
// docs/compile.md "Fusion"), written once for host and device: CUDA's
// fused backend runs fused_eval in one kernel over the chain's elements
// (kernels/cuda/fused_chain.cu), and host_fused_backend() runs it on the
// host -- which is how the CPU tests check it against the unfused kernels,
// bit for bit.
//
// Why the bits are the unfused launches': each step computes exactly what
// its kernel computes for that element -- the same expression
// (kernels/unary_math.h; the binary ops below, as kernels/cuda/
// elementwise.cu and the CPU's write them) in float32, which is what every
// kernel computes 16- and 32-bit floats in -- and rounds it once to its
// output's dtype; `copy` to the same dtype and `where` move bits. An
// intermediate kept in a register holds its dtype's bits, as a store and
// a load would. (Builds contract no multiply-add:
// -ffp-contract=off on the host, --fmad=false in nvcc.)
#include <cstdint>

#include "kernels/elementwise.h"
#include "kernels/unary.h"
#include "kernels/unary_math.h"
#include "runtime/fused_program.h"
#include "runtime/half.h"
#include "runtime/macros.h"

namespace tessel::kernels {

// The arithmetic binary ops a fused chain takes (the others compare or
// take bools, or call the platform's pow).
constexpr bool fusable_binary(BinaryOp op) { return op <= BinaryOp::Minimum && op != BinaryOp::Pow; }
// The unary ops of floating tensors (LogicalNot takes bools).
constexpr bool fusable_unary(UnaryOp op) { return op != UnaryOp::LogicalNot; }

TESSEL_HOST_DEVICE_INLINE float fused_binary(BinaryOp op, float a, float b) {
  switch (op) {
    case BinaryOp::Add: return a + b;
    case BinaryOp::Sub: return a - b;
    case BinaryOp::Mul: return a * b;
    case BinaryOp::Div: return a / b;
    case BinaryOp::Maximum: return a != a ? a : (b != b ? b : (a > b ? a : b));  // NaN wins, as nan_max
    case BinaryOp::Minimum: return a != a ? a : (b != b ? b : (a < b ? a : b));
    default: return 0.0f;  // (not fusable: never described)
  }
}

#define TESSEL_FUSED_UNARY_CASES(X)                                                                         \
  X(Neg) X(Abs) X(Sign) X(Exp) X(Log) X(Log1p) X(Expm1) X(Sqrt) X(Rsqrt) X(Sin) X(Cos) X(Tanh) X(Sigmoid) \
  X(Relu) X(Gelu) X(GeluErf) X(Silu) X(Square) X(Reciprocal) X(Erf) X(Floor) X(Ceil) X(Round)

TESSEL_HOST_DEVICE_INLINE float fused_unary(UnaryOp op, float x) {
  switch (op) {
#define X(OP) \
  case UnaryOp::OP: return UnaryFn<UnaryOp::OP>::template fwd<float>(x);
    TESSEL_FUSED_UNARY_CASES(X)
#undef X
    default: return 0.0f;
  }
}

TESSEL_HOST_DEVICE_INLINE float fused_unary_backward(UnaryOp op, float g, float x, float y) {
  switch (op) {
#define X(OP) \
  case UnaryOp::OP: return UnaryFn<UnaryOp::OP>::template bwd<float>(g, x, y);
    TESSEL_FUSED_UNARY_CASES(X)
#undef X
    default: return 0.0f;
  }
}

// Values travel as the bits of their operand's dtype (a float32's bits, a
// 16-bit float's 16 bits, a bool's 0 or 1), so that `copy` to the same
// dtype and `where` move bits as their kernels do (a NaN's payload too),
// and arithmetic sees them as float.
TESSEL_HOST_DEVICE_INLINE float fused_float(capture::FusedType t, uint32_t bits) {
  switch (t) {
    case capture::FusedType::Float32: return bits_float(bits);
    case capture::FusedType::BFloat16: return static_cast<float>(bf16::from_bits(uint16_t(bits)));
    case capture::FusedType::Float16: return f16::to_float(uint16_t(bits));
    case capture::FusedType::Bool: return bits != 0 ? 1.0f : 0.0f;
  }
  return 0.0f;
}
// v rounded once to dtype t (as the kernels' narrow), as t's bits.
TESSEL_HOST_DEVICE_INLINE uint32_t fused_round(capture::FusedType t, float v) {
  switch (t) {
    case capture::FusedType::Float32: return float_bits(v);
    case capture::FusedType::BFloat16: return bf16::from_float(v);
    case capture::FusedType::Float16: return f16::from_float(v);
    case capture::FusedType::Bool: return v != 0.0f ? 1u : 0u;
  }
  return 0u;
}

// Element (r, c) of operand k, as its dtype's bits.
TESSEL_HOST_DEVICE_INLINE uint32_t fused_load(const capture::FusedOperand& o, int64_t r, int64_t c,
                                              const uint32_t* reg, int k) {
  if (o.in_register) return reg[k];
  const int64_t at = r * o.row_stride + c * o.col_stride;
  switch (o.type) {
    case capture::FusedType::Float32: return reinterpret_cast<const uint32_t*>(o.data)[at];
    case capture::FusedType::BFloat16:
    case capture::FusedType::Float16: return reinterpret_cast<const uint16_t*>(o.data)[at];
    case capture::FusedType::Bool: return reinterpret_cast<const bool*>(o.data)[at] ? 1u : 0u;
  }
  return 0u;
}

TESSEL_HOST_DEVICE_INLINE void fused_store(const capture::FusedOperand& o, int64_t r, int64_t c, uint32_t* reg,
                                           int k, uint32_t bits) {
  if (o.in_register) {
    reg[k] = bits;
    return;
  }
  const int64_t at = r * o.row_stride + c * o.col_stride;
  switch (o.type) {
    case capture::FusedType::Float32: reinterpret_cast<uint32_t*>(o.data)[at] = bits; return;
    case capture::FusedType::BFloat16:
    case capture::FusedType::Float16: reinterpret_cast<uint16_t*>(o.data)[at] = uint16_t(bits); return;
    case capture::FusedType::Bool: reinterpret_cast<bool*>(o.data)[at] = bits != 0; return;
  }
}

// Every step of the chain, in order, for element (r, c).
TESSEL_HOST_DEVICE_INLINE void fused_eval(const capture::FusedProgram& p, int64_t r, int64_t c) {
  uint32_t reg[capture::kMaxFusedOperands];
  for (int s = 0; s < p.num_steps; ++s) {
    const capture::FusedStep& st = p.steps[s];
    auto bits = [&](int j) { return fused_load(p.operands[st.in[j]], r, c, reg, st.in[j]); };
    auto in = [&](int j) { return fused_float(p.operands[st.in[j]].type, bits(j)); };
    const capture::FusedType out = p.operands[st.out].type;
    uint32_t v = 0;
    switch (st.kind) {
      case capture::FusedKind::Unary: v = fused_round(out, fused_unary(UnaryOp(st.op), in(0))); break;
      case capture::FusedKind::UnaryBackward:
        v = fused_round(out, fused_unary_backward(UnaryOp(st.op), in(0), in(1), in(2)));
        break;
      case capture::FusedKind::Binary: v = fused_round(out, fused_binary(BinaryOp(st.op), in(0), in(1))); break;
      case capture::FusedKind::Copy:
        v = p.operands[st.in[0]].type == out ? bits(0) : fused_round(out, in(0));
        break;
      case capture::FusedKind::Where: v = bits(0) != 0 ? bits(1) : bits(2); break;
    }
    fused_store(p.operands[st.out], r, c, reg, st.out, v);
  }
}

// The fused steps' descriptions (KernelTable::set_fusion of unary,
// unary_backward, binary, copy and where). Registered by whoever provides
// a fused backend (the CUDA backend; host_fused_backend), once.
void register_fusion();

// A FusedBackend that runs fused_eval on the host, element by element:
// for tests, set as the CPU's (capture::set_fused_backend) to run CPU
// chains as a device runs them. Registers the descriptions.
capture::FusedBackend* host_fused_backend();

}  // namespace tessel::kernels
