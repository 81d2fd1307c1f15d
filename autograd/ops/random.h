#pragma once
// Random tensors and dropout, shard-invariant (docs/design.md §4 level 1).
//
// Every function takes an explicit PhiloxKey {seed, stream}: there is no
// hidden global generator state. An element's value depends only on the key,
// the distribution and the element's *global* coordinates (runtime/philox.h),
// so the optional trailing `block` — where this local tensor sits inside a
// larger global tensor (GlobalBlock{global_shape, offset}) — makes a
// shard draw exactly the slice of the full tensor's values, on any device.
//
// Derive streams from names every rank shares, never from per-rank counters:
//   PhiloxKey key{seed, stream_for("layers.3.attn.dropout", {step, call})};
#include <cstdint>
#include <initializer_list>
#include <string>

#include "kernels/random.h"
#include "runtime/philox.h"
#include "runtime/tensor.h"

namespace tessel {

// GlobalBlock: runtime/global_block.h

// A stream id from a path (a module or parameter name) and counters (step,
// call index, ...): hash_string(path) folded with combine_stream, in order.
uint64_t stream_for(const std::string& path, std::initializer_list<uint64_t> counters = {});

// Uniform [0, 1) (floating dtypes).
Tensor rand(const Dims& shape, PhiloxKey key, TensorOptions opts = {}, const GlobalBlock& block = {});
// Standard normal (floating dtypes; Box-Muller).
Tensor randn(const Dims& shape, PhiloxKey key, TensorOptions opts = {}, const GlobalBlock& block = {});
// Integers uniform in [low, high), high - low <= 2^32 - 1 (any numeric dtype
// that holds the range; int64 by default). Multiply-shift on one 32-bit word:
// each value has probability within 2^-32 of 1/(high - low).
Tensor randint(int64_t low, int64_t high, const Dims& shape, PhiloxKey key,
               TensorOptions opts = TensorOptions(DType::Int64), const GlobalBlock& block = {});
// 1 with probability p, else 0 (bool by default; any dtype gives 0/1). p is
// resolved to multiples of 2^-24.
Tensor bernoulli(const Dims& shape, double p, PhiloxKey key, TensorOptions opts = TensorOptions(DType::Bool),
                 const GlobalBlock& block = {});
// Same shape, dtype and device as t.
Tensor rand_like(const Tensor& t, PhiloxKey key, const GlobalBlock& block = {});
Tensor randn_like(const Tensor& t, PhiloxKey key, const GlobalBlock& block = {});

// Dropout (differentiable): zeroes each element with probability p and scales
// the rest by 1/(1-p) (one multiply, the scale rounded once to x's dtype).
// The kept elements are exactly bernoulli(x.shape, 1 - p, key, ..., block).
// !training or p == 0: returns x itself; p == 1: zeros. Nothing is saved for
// backward: the mask is recomputed from the key (it costs one Philox call per
// four elements, and saves a mask's worth of memory per dropout layer).
Tensor dropout(const Tensor& x, double p, PhiloxKey key, bool training = true, const GlobalBlock& block = {});

}  // namespace tessel
