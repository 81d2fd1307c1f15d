#pragma once
// Batched matrix multiply: out[b] = a[b] · bm[b].
//
// Per output element the arithmetic is the canonical K-order (docs/numerics.md):
// K split into `chunks` (V) chunks of ceil(K/V); inside a chunk
// acc = fma(a[i,k], b[k,j], acc) for ascending k starting from +0; chunk
// results combined by the balanced tree; `accumulate` adds the result to the
// existing out value with one final add. Independent of tiling, threads,
// the ISA path and the position of the element.
#include "kernels/registry.h"
#include "runtime/tensor.h"

namespace tessel::kernels {

// a: [B, M, K], b: [B, K, N] (any strides, batch stride may be 0),
// out: [B, M, N] with unit column stride. float32/float64; float16/bfloat16
// are widened to float32 and the result rounded once.
inline KernelTable<void(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate, int chunks)> bmm{"bmm"};

}  // namespace tessel::kernels
