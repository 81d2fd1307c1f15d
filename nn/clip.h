#pragma once
// Global gradient-norm clipping (PyTorch's clip_grad_norm_, L2 norm).
//
// The norm is defined bit for bit (docs/optim.md):
//   1. For each parameter with a defined .grad, in the order given,
//      s_i = the canonical sum (kernels/canonical.h, V =
//      numerics::reduction_chunks()) over the gradient's elements in
//      row-major order of float(g)^2 (the square rounded to float, then
//      summed; no FMA). Computed by the fused kernels::sum_squares, which
//      makes no full-size temporary.
//   2. total^2 = the s_i combined by a balanced binary tree over parameters:
//      pad the list with +0 to a power of two, then (s0+s1), (s2+s3), ...,
//      neighbouring pairs of those, and so on (the same tree as the chunk
//      tree of the canonical sum). All in float32.
//   3. total = sqrt(total^2) in float32.
//   4. scale = float(max_norm) / (total + 1e-6f) in float32; when scale < 1
//      every gradient element becomes float(g) * scale, rounded once to the
//      gradient's dtype. Otherwise nothing is written.
// Parameters without a gradient are skipped (they take no leaf of the tree).
// A non-contiguous gradient is copied once to make it contiguous.
#include <vector>

#include "runtime/tensor.h"

namespace tessel::nn {

// The float32 total norm (returned as a double holding the float exactly).
// Gradients must be float32, bfloat16 or float16.
double grad_norm(const std::vector<Tensor>& params);

// Clips the gradients in place so that their global norm is at most
// max_norm; returns the norm before clipping (float32 value as double).
// error_if_nonfinite: throw when the norm is NaN or infinite (otherwise such
// a norm gives scale NaN or 0: NaN is not applied, 0 is).
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, bool error_if_nonfinite = false);

// The pieces of the norm, for strategies that spread the parameters over
// ranks (pipeline stages): step 1 for each parameter, s_i (collective over
// a distributed gradient's mesh), or -1 where there is no gradient; and steps
// 2-3 over such a list (entries < 0 skipped). grad_norm(params) ==
// norm_of_square_sums(square_sums(params)), bit for bit.
std::vector<float> square_sums(const std::vector<Tensor>& params, const char* op = "grad_norm");
float norm_of_square_sums(const std::vector<float>& sums);

}  // namespace tessel::nn
