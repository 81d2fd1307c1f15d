#pragma once
// Rotary position embeddings (RoPE). Per-element order: kernels/rope.h.
#include <cstdint>
#include <utility>

#include "runtime/tensor.h"

namespace tessel {

// (cos, sin) tables of shape [seq_len, head_dim / 2]:
//   inv_freq_i = 1 / theta^(2i / head_dim)            (std::pow, float64)
//   cos[t, i]  = cos(t * inv_freq_i), sin[t, i] = sin(t * inv_freq_i)
// computed on the host in float64 (tmath::cos/sin on double), then rounded to
// `dtype` (16-bit dtypes via float32, like every tessel cast) and copied to
// `device`, so every device gets identical table bits. These are more
// accurate than tables built in float32 (as HF does), so a comparison with HF
// needs a tolerance at long positions. head_dim must be even and positive;
// pass the rotary width for partial rotary.
std::pair<Tensor, Tensor> rope_cache(int64_t seq_len, int64_t head_dim, double theta = 10000.0,
                                     DType dtype = DType::Float32, Device device = kCPU);

// Rotates x [B, T, H, D] by the angles of positions position_offset + t (KV
// caches pass the number of cached tokens). cos/sin: [P, R/2] tables (any
// floating dtype; converted to x's compute dtype), R <= D rotary width
// (features >= R pass through). interleaved = false: the LLaMA / HF
// "rotate_half" pairing (i, i + R/2); true: adjacent pairs (2i, 2i + 1)
// (GPT-J / original Meta LLaMA). Differentiable w.r.t. x (backward rotates
// by -angle); no gradient flows to the tables.
Tensor apply_rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t position_offset = 0,
                    bool interleaved = false);
// Positions given per token: int64 [T] (shared by the batch) or [B, T].
Tensor apply_rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& positions,
                    bool interleaved = false);

}  // namespace tessel
