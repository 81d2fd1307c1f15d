#pragma once
// Helpers of the CUDA tests (test_*_cuda.cc): moving tensors, comparing a GPU
// result with the CPU's. They build without CUDA; the tests skip at run time
// (TESSEL_REQUIRE_GPU) when no GPU is visible.
#include <functional>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/tensor.h"
#include "test/skip.h"

namespace tessel::testing {

inline const Device kCuda(DeviceType::CUDA, 0);

// A contiguous copy on the GPU / on the CPU (no autograd history).
Tensor to_cuda(const Tensor& t);
Tensor to_cpu(const Tensor& t);

// Same shape and dtype and the same bits, except that any NaN equals any NaN
// (NaN payloads differ between x86 and CUDA).
bool same_bits(const Tensor& a, const Tensor& b);
// "" when a (moved to the CPU) equals b bit for bit, else the first mismatch.
std::string bits_mismatch(const Tensor& a, const Tensor& b);

struct CompareOptions {
  bool bitwise = true;  // else allclose(rtol, atol)
  double rtol = 0, atol = 0;
  bool backward = true;  // also compare the gradients of inputs that require grad
  uint64_t seed = 99;    // of the output gradient
};

// Runs fn on `inputs` (CPU tensors) and on GPU copies of them (leaves that
// require grad where the CPU input does); compares the outputs and, after a
// backward pass with the same random output gradient, the inputs' gradients.
// "" when they agree, else what differs.
std::string compare_with_cpu(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                             const std::vector<Tensor>& inputs, CompareOptions opts = {});

}  // namespace tessel::testing

#define CHECK_CUDA_MATCHES(...)                                                   \
  do {                                                                            \
    const std::string tessel_cmp_ = ::tessel::testing::compare_with_cpu(__VA_ARGS__); \
    INFO(tessel_cmp_);                                                            \
    CHECK(tessel_cmp_.empty());                                                   \
  } while (0)

#define TESSEL_REQUIRE_GPU()                                                                  \
  do {                                                                                        \
    if (!::tessel::cuda_available()) TESSEL_SKIP("no GPU (this test runs on a CUDA device)"); \
  } while (0)

// CHECK that a GPU result equals the CPU's bit for bit, with the first mismatch in the message.
#define CHECK_SAME_BITS(gpu, cpu)                                                 \
  do {                                                                            \
    const std::string tessel_mm_ = ::tessel::testing::bits_mismatch((gpu), (cpu)); \
    INFO(tessel_mm_);                                                             \
    CHECK(tessel_mm_.empty());                                                    \
  } while (0)
