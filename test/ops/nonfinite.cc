// count_nonfinite (kernels/nonfinite.h), the kernel behind anomaly detection:
// against the scalar reference and std::isfinite for every floating dtype,
// strided inputs and a count that accumulates; thread-count invariance; the
// GPU against the CPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/api.h"
#include "kernels/nonfinite.h"
#include "runtime/threadpool.h"
#include "test/util/cuda.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

namespace {

// A [rows, cols] tensor of dtype dt with inf, -inf and NaN planted at every
// 7th, 11th and 13th element; and how many of its elements std::isfinite rejects.
Tensor planted_nonfinite(int64_t rows, int64_t cols, DType dt, int64_t& expected) {
  std::vector<double> v = uniform({rows, cols}, 21, -5, 5, DType::Float64).to_vector<double>();
  for (size_t i = 0; i < v.size(); ++i) {
    if (i % 13 == 0) v[i] = std::numeric_limits<double>::quiet_NaN();
    else if (i % 11 == 0) v[i] = -INFINITY;
    else if (i % 7 == 0) v[i] = INFINITY;
  }
  Tensor t = tensor(v, {rows, cols}, DType::Float64).to(dt);
  expected = 0;
  for (double e : t.to(DType::Float64).to_vector<double>()) expected += !std::isfinite(e);
  return t;
}

int64_t count_with_kernel(const Tensor& x, int64_t start = 0) {
  Tensor count = tensor(std::vector<int64_t>{start}, {1}, DType::Int64).to(x.device());
  kernels::count_nonfinite(x.device(), x, count);
  return count.to(kCPU).item<int64_t>();
}

}  // namespace

TEST_CASE("count_nonfinite: the scalar reference is std::isfinite's complement", "[nonfinite]") {
  for (double v : {0.0, -0.0, 1.0, -3.5e300, 1e-310, std::numeric_limits<double>::max()})
    CHECK_FALSE(kernels::nonfinite_value<double>(v));
  for (float v : {0.0f, -0.0f, 1.0f, -3.5e30f, 1e-40f, std::numeric_limits<float>::max()})
    CHECK_FALSE(kernels::nonfinite_value<float>(v));
  for (double v : {double(INFINITY), -double(INFINITY), std::numeric_limits<double>::quiet_NaN()}) {
    CHECK(kernels::nonfinite_value<double>(v));
    CHECK(kernels::nonfinite_value<float>(float(v)));
  }
}

TEST_CASE("count_nonfinite counts inf, -inf and NaN in every floating dtype, any strides, accumulating", "[nonfinite]") {
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16}) {
    INFO(dtype_name(dt));
    int64_t expected = 0;
    Tensor x = planted_nonfinite(37, 53, dt, expected);
    REQUIRE(expected > 300);
    CHECK(count_with_kernel(x) == expected);
    CHECK(count_with_kernel(x.t()) == expected);        // strided
    CHECK(count_with_kernel(x, 5) == expected + 5);     // adds to the count
    const std::vector<double> row = x.narrow(0, 0, 1).to(DType::Float64).contiguous().to_vector<double>();
    CHECK(count_with_kernel(x.narrow(0, 0, 1)) ==  // the first row alone
          int64_t(std::count_if(row.begin(), row.end(), [](double e) { return !std::isfinite(e); })));
    CHECK(count_with_kernel(uniform({64, 9}, 3, -1e4, 1e4, dt)) == 0);
  }
  // Values that overflow float16 (70000 > 65504) are inf once stored.
  CHECK(count_with_kernel(tensor({70000.0f, 1.0f}, {2}).to(DType::Float16)) == 1);
}

TEST_CASE("count_nonfinite gives the same count on 1 and 4 threads (a tensor larger than a chunk)", "[nonfinite]") {
  int64_t expected = 0;
  Tensor x = planted_nonfinite(400, 300, DType::Float32, expected);
  const int threads = num_threads();
  set_num_threads(1);
  const int64_t one = count_with_kernel(x);
  set_num_threads(4);
  const int64_t four = count_with_kernel(x);
  set_num_threads(threads);
  CHECK(one == expected);
  CHECK(four == expected);
}

TEST_CASE("CUDA count_nonfinite equals the CPU's count", "[nonfinite][cuda]") {
  TESSEL_REQUIRE_GPU();
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16}) {
    INFO(dtype_name(dt));
    int64_t expected = 0;
    Tensor x = planted_nonfinite(129, 65, dt, expected);
    CHECK(count_with_kernel(to_cuda(x)) == expected);
    CHECK(count_with_kernel(to_cuda(x).t(), 3) == expected + 3);
  }
}
