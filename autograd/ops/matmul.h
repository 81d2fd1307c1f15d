#pragma once
// Matrix products. All reduce over K in the canonical order (kernels/matmul.h).
#include "runtime/tensor.h"

namespace tessel {

// PyTorch semantics: 1-D·1-D is a dot product; 1-D operands get a dimension
// prepended (left) or appended (right) and removed again; leading (batch)
// dimensions broadcast. A 2-D right operand folds the left operand's leading
// dims into M (one GEMM; the weight gradient then reduces over all tokens).
Tensor matmul(const Tensor& a, const Tensor& b);
// Strict batched product: [B, M, K] x [B, K, N] -> [B, M, N].
Tensor bmm(const Tensor& a, const Tensor& b);
// x[..., in] · weight[out, in]ᵀ + bias[out].
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace tessel
