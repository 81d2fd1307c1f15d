#include "kernels/random.h"

#include <cmath>

namespace tessel::kernels {

static_assert(kRandomMaxDims == kMaxDims, "RandomGeometry must hold every tensor rank");

void check_global_block(const char* op, const Dims& local, const GlobalBlock& block) {
  if (block.is_whole()) return;
  TESSEL_CHECK(block.global_shape.size() == local.size() && block.offset.size() == local.size(), op,
               "block of shape {} needs a global shape and an offset of rank {}, got global shape {} and offset {}",
               local, local.size(), block.global_shape, block.offset);
  for (int d = 0; d < local.size(); ++d) {
    TESSEL_CHECK(block.offset[d] >= 0 && block.global_shape[d] >= 0 &&
                     block.offset[d] + local[d] <= block.global_shape[d],
                 op, "block of shape {} at offset {} does not fit in the global shape {} (dimension {})", local,
                 block.offset, block.global_shape, d);
  }
}

RandomGeometry make_random_geometry(const Tensor& out, const GlobalBlock& block, const Tensor* in) {
  const Dims& shape = out.shape();
  check_global_block("random", shape, block);
  if (in) TESSEL_ASSERT(in->shape() == shape);
  const Dims& global = block.is_whole() ? shape : block.global_shape;
  RandomGeometry g;
  g.numel = out.numel();
  // Row-major strides of the global tensor and the base index.
  int64_t gstride[kMaxDims];
  uint64_t s = 1;
  for (int d = shape.size() - 1; d >= 0; --d) {
    gstride[d] = int64_t(s);
    s *= uint64_t(global[d]);
  }
  for (int d = 0; d < shape.size(); ++d) {
    if (!block.is_whole()) g.base += uint64_t(block.offset[d]) * uint64_t(gstride[d]);
  }
  // Keep dims of size != 1, merging a dim into the next inner one when both the
  // global index and every operand are contiguous across them.
  for (int d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    int64_t os = out.strides()[d], is = in ? in->strides()[d] : 0;
    g.size[g.ndim] = shape[d];
    g.gstride[g.ndim] = gstride[d];
    g.ostride[g.ndim] = os;
    g.istride[g.ndim] = is;
    ++g.ndim;
  }
  if (g.numel == 0) {
    g.ndim = 0;
    return g;
  }
  int n = 0;
  for (int d = 0; d < g.ndim; ++d) {
    if (n > 0) {
      int p = n - 1;
      // Merge p (outer) and d (inner) when stride[p] == stride[d] * size[d] for all.
      if (g.gstride[p] == g.gstride[d] * g.size[d] && g.ostride[p] == g.ostride[d] * g.size[d] &&
          g.istride[p] == g.istride[d] * g.size[d]) {
        g.size[p] *= g.size[d];
        g.gstride[p] = g.gstride[d];
        g.ostride[p] = g.ostride[d];
        g.istride[p] = g.istride[d];
        continue;
      }
    }
    g.size[n] = g.size[d];
    g.gstride[n] = g.gstride[d];
    g.ostride[n] = g.ostride[d];
    g.istride[n] = g.istride[d];
    ++n;
  }
  g.ndim = n;
  return g;
}

uint32_t bernoulli_threshold(double p) {
  TESSEL_ASSERT(p >= 0.0 && p <= 1.0);
  // u01(x) = (x >> 8) * 2^-24 < p  <=>  (x >> 8) < ceil(p * 2^24); exact in double.
  return uint32_t(std::ceil(p * 16777216.0));
}

}  // namespace tessel::kernels
