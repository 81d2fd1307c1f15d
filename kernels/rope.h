#pragma once
// Rotary position embeddings: rotate pairs of features of x[B, T, H, D] by
// position-dependent angles read from cos/sin tables.
//
// Tables: cos, sin are contiguous [P, R/2] in the compute dtype C of x
// (float32 for 16/32-bit x, float64 for float64 x); R = 2 * cos.size(1) <= D
// is the rotary width (R < D: partial rotary, features >= R pass through).
// Position of token (b, t): positions[b, t] when `positions` is defined
// (int64 [B, T], any strides, 0 strides for broadcasting), else offset + t.
// Every position must lie in [0, P): the kernel checks (the error names
// apply_rotary, the position and the table length).
//
// Pairs (x1, x2), for i in [0, R/2):
//   rotate_half (LLaMA / HF):   x1 = x[i],   x2 = x[i + R/2]
//   interleaved (GPT-J / Meta): x1 = x[2i],  x2 = x[2i + 1]
// with c = cos[pos, i], s = sin[pos, i] and x widened to C, the output
// (rounded once to x's dtype) is, with no FMA (each product rounded, then added):
//   forward (angle +theta):  o1 = x1 * c - x2 * s;   o2 = x2 * c + x1 * s
//   inverse (angle -theta):  o1 = x1 * c + x2 * s;   o2 = x2 * c - x1 * s
// The inverse is the backward of the forward (a rotation's transpose).
// x may have any strides; out is contiguous [B, T, H, D] with x's dtype.
#include <cstdint>

#include "kernels/registry.h"
#include "runtime/tensor.h"

namespace tessel::kernels {

inline KernelTable<void(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& positions,
                        int64_t offset, bool interleaved, bool inverse, const Tensor& out)>
    rope_apply{"rope_apply"};

}  // namespace tessel::kernels
