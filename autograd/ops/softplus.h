#pragma once
// softplus: the example op family of docs/adding_an_op.md.
#include "runtime/tensor.h"

namespace tessel {

// log(1 + exp(beta * x)) / beta, and x itself where beta * x > threshold
// (PyTorch's torch.nn.functional.softplus). x floating; beta > 0; both
// finite. Arithmetic: kernels/softplus.h.
Tensor softplus(const Tensor& x, double beta = 1.0, double threshold = 20.0);

}  // namespace tessel
