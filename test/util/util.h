#pragma once
// Test helpers: deterministic random tensors, bitwise comparison, gradcheck.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace tessel::testing {

// Deterministic pseudo-random values (std::mt19937_64, independent of tessel's RNG)
// uniform in [lo, hi), as `dtype` on CPU.
Tensor uniform(const Dims& shape, uint64_t seed, double lo = -1.0, double hi = 1.0, DType dtype = DType::Float32);
// Integers in [lo, hi).
Tensor randint(const Dims& shape, uint64_t seed, int64_t lo, int64_t hi, DType dtype = DType::Int64);

// A Meta tensor (shape and dtype, no memory): ops run their checks on it and
// no kernel runs, as in a Meta model or call()'s run before a distributed op.
Tensor meta(const Dims& shape, DType dtype = DType::Float32);

// True when a and b have the same shape, dtype and identical bits everywhere.
bool bitwise_equal(const Tensor& a, const Tensor& b);
// Largest |a - b| (as double) and whether every element is within atol + rtol*|b|.
double max_abs_diff(const Tensor& a, const Tensor& b);
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-6);

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-6;
  double rtol = 1e-4;
  uint64_t seed = 1234;
};

// Checks the vector-Jacobian product of fn (analytical, through backward) against
// central finite differences, for a random output gradient. Inputs should be
// float64; those with requires_grad set are checked (they may be
// non-contiguous views). Returns "" on success, else a description of the
// first mismatch.
std::string gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs,
                      GradcheckOptions opts = {});

// A float64 leaf requiring grad with uniform values (for gradcheck).
Tensor grad_input(const Dims& shape, uint64_t seed, double lo = -1.0, double hi = 1.0);
// The same values as a non-contiguous leaf: storage laid out transposed (dims 0 and last swapped).
Tensor grad_input_noncontig(const Dims& shape, uint64_t seed, double lo = -1.0, double hi = 1.0);

}  // namespace tessel::testing

#define CHECK_GRADCHECK(...)                                      \
  do {                                                            \
    std::string gc_msg_ = ::tessel::testing::gradcheck(__VA_ARGS__); \
    INFO(gc_msg_);                                                \
    CHECK(gc_msg_.empty());                                       \
  } while (0)
