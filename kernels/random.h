#pragma once
// Random kernels: fill a tensor with draws from a distribution, and dropout.
//
// A kernel fills a *block* of a global tensor: the local tensor `out` (any
// strides, e.g. a transposed view or one shard) holds the elements
// [offset, offset + out.shape) of a tensor of shape `global_shape`. Every
// element's value is a function of (key, distribution, its global row-major
// linear index) alone (runtime/philox.h, kernels/random_math.h), so any
// decomposition into blocks, any thread count and CPU or CUDA give the same
// bits (docs/design.md §4 level 1).
#include <cstdint>

#include "kernels/random_math.h"
#include "kernels/registry.h"
#include "runtime/global_block.h"
#include "runtime/tensor.h"

namespace tessel::kernels {

// Where a local tensor sits in its global tensor. An empty `global_shape`
// means the local tensor is the whole global tensor (offset all zeros).
using ::tessel::GlobalBlock;  // runtime/global_block.h

// Throws tessel::Error naming `op` unless `block` is a valid placement of a
// tensor of shape `local` (same rank, 0 <= offset, offset + local <= global).
void check_global_block(const char* op, const Dims& local, const GlobalBlock& block);

// The iteration geometry of `out` (and `in`, same shape, for dropout) placed
// at `block`, with size-1 dims dropped and jointly contiguous dims merged.
// Compile mode (runtime/capture.h): how a recorded launch compares and
// re-keys its parameters.
inline void fingerprint(std::string& out, const RandomParams& p) {
  using capture::fingerprint;
  fingerprint(out, p.dist);
  fingerprint(out, p.lo);
  fingerprint(out, p.hi);
  fingerprint(out, p.mean);
  fingerprint(out, p.std);
  fingerprint(out, p.vlo);
  fingerprint(out, p.vhi);
  fingerprint(out, p.threshold);
  fingerprint(out, p.low);
  fingerprint(out, p.range);
}
inline void for_each_key(RandomParams& p, const std::function<void(PhiloxKey&)>& f) { f(p.key); }

RandomGeometry make_random_geometry(const Tensor& out, const GlobalBlock& block, const Tensor* in = nullptr);

// out[...] = draws of params.dist (out: floating for uniform/normal/
// trunc_normal; any dtype for bernoulli; numeric for randint).
inline KernelTable<void(const Tensor& out, const RandomParams& params, const GlobalBlock& block)>
    random_fill{"random_fill"};

// out = keep ? in * scale : 0 with keep = ((bits(e) >> 8) < keep_threshold)
// in the narrow layout (exactly the mask random_fill draws for Bernoulli with
// the same threshold). in and out: same shape and floating dtype, any strides
// (may be the same tensor). Used for dropout's forward and its backward.
inline KernelTable<void(const Tensor& in, const Tensor& out, PhiloxKey key, uint32_t keep_threshold, double scale,
                        const GlobalBlock& block)>
    dropout{"dropout"};

// ceil(p * 2^24): the Bernoulli threshold for probability p in [0, 1].
uint32_t bernoulli_threshold(double p);

}  // namespace tessel::kernels
