// softmax / log_softmax: values, the kernels against the scalar reference of
// the documented order (bitwise, several V, layouts, dtypes), thread-count
// invariance, 16-bit inputs, gradients, errors.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>

#include "autograd/api.h"
#include "kernels/cpu/softmax_ref.h"
#include "kernels/softmax.h"
#include "runtime/numerics.h"
#include "runtime/threadpool.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

namespace {

// The rows of t along dim (row-major over the other dims), as doubles.
std::vector<std::vector<double>> rows_along(const Tensor& t, int dim) {
  Tensor p = t.transpose(dim, t.dim() - 1).contiguous();
  const int64_t n = t.shape()[dim];
  auto v = p.to_vector<double>();
  std::vector<std::vector<double>> rows;
  for (size_t i = 0; i < v.size(); i += size_t(n)) rows.emplace_back(v.begin() + i, v.begin() + i + n);
  return rows;
}

template <class C, class S>
std::vector<C> as(const std::vector<S>& v) {
  return std::vector<C>(v.begin(), v.end());
}

// Bits of value v rounded to dtype (v is already representable for the
// dtype's compute type).
uint64_t bits_as(double v, DType dt) {
  switch (dt) {
    case DType::Float64: { uint64_t u; std::memcpy(&u, &v, 8); return u; }
    case DType::Float32: return float_bits(float(v));
    case DType::BFloat16: return bf16(float(v)).bits;
    case DType::Float16: return f16(float(v)).bits;
    default: return 0;
  }
}

// Compares every row of out (along dim) with ref(row of the inputs) bitwise.
template <class RefFn>
bool rows_match(const Tensor& out, int dim, RefFn ref) {
  auto outs = rows_along(out, dim);
  for (size_t r = 0; r < outs.size(); ++r) {
    std::vector<double> expect = ref(r);
    for (size_t i = 0; i < expect.size(); ++i) {
      if (bits_as(outs[r][i], out.dtype()) != bits_as(expect[i], out.dtype())) {
        UNSCOPED_INFO("row " << r << " element " << i << ": got " << outs[r][i] << " expected " << expect[i]);
        return false;
      }
    }
  }
  return true;
}

// Forward and backward of (log_)softmax along dim against the reference.
void check_against_reference(const Tensor& x, int dim, bool log, int v) {
  numerics::ChunksGuard guard(v);
  Tensor y = log ? log_softmax(x, dim) : softmax(x, dim);
  Tensor g = uniform(x.shape(), 99, -1, 1, x.dtype());
  Tensor dx = raw::empty(x.shape(), x.dtype());
  kernels::softmax_backward(kCPU, g, y, dim, log, dx, v);
  auto xr = rows_along(x, dim), yr = rows_along(y, dim), gr = rows_along(g, dim);
  const bool dbl = x.dtype() == DType::Float64;
  INFO("dtype " << dtype_name(x.dtype()) << " shape " << x.shape().str() << " dim " << dim << " log " << log
                << " V " << v);
  CHECK(rows_match(y, dim, [&](size_t r) {
    if (dbl) return kernels::ref::softmax_row<double>(xr[r], v, log);
    return as<double>(kernels::ref::softmax_row<float>(as<float>(xr[r]), v, log));
  }));
  CHECK(rows_match(dx, dim, [&](size_t r) {
    if (dbl) return kernels::ref::softmax_backward_row<double>(gr[r], yr[r], v, log);
    return as<double>(kernels::ref::softmax_backward_row<float>(as<float>(gr[r]), as<float>(yr[r]), v, log));
  }));
}

}  // namespace

TEST_CASE("softmax and log_softmax values") {
  Tensor x = tensor({1.f, 2.f, 3.f});
  auto s = softmax(x, 0).to_vector<float>();
  CHECK(s[0] == Approx(0.09003057f).epsilon(1e-6));
  CHECK(s[1] == Approx(0.24472847f).epsilon(1e-6));
  CHECK(s[2] == Approx(0.66524096f).epsilon(1e-6));
  auto l = log_softmax(x, -1).to_vector<float>();
  CHECK(l[0] == Approx(-2.40760596f).epsilon(1e-6));
  CHECK(l[1] == Approx(-1.40760596f).epsilon(1e-6));
  CHECK(l[2] == Approx(-0.40760596f).epsilon(1e-6));
  // Stable for large values; uniform rows; -inf entries get probability 0.
  CHECK(softmax(tensor({1000.f, 1000.f}), 0).to_vector<float>() == std::vector<float>{0.5f, 0.5f});
  CHECK(softmax(zeros({4}), 0).to_vector<float>() == std::vector<float>{0.25f, 0.25f, 0.25f, 0.25f});
  CHECK(softmax(tensor({0.f, -INFINITY}), 0).to_vector<float>() == std::vector<float>{1.f, 0.f});
  CHECK(log_softmax(tensor({0.f, -INFINITY}), 0).to_vector<float>() == std::vector<float>{0.f, -INFINITY});
  // An all -inf row is NaN, as in PyTorch; NaN spreads over its row only.
  Tensor bad = softmax(tensor({-INFINITY, -INFINITY, 1.f, NAN}, {2, 2}), 1);
  auto bv = bad.to_vector<float>();
  CHECK((std::isnan(bv[0]) && std::isnan(bv[1]) && std::isnan(bv[2]) && std::isnan(bv[3])));
  Tensor good = softmax(tensor({-INFINITY, -INFINITY, 1.f, 2.f}, {2, 2}), 1);
  CHECK(good.to_vector<float>()[3] == Approx(0.7310586f));
  // Along dim 0 of a matrix: columns sum to one.
  Tensor m = tensor({1.f, 2.f, 3.f, 4.f, 6.f, 8.f}, {2, 3});
  auto c = softmax(m, 0).to_vector<float>();
  CHECK(c[0] == Approx(1.f / (1.f + std::exp(3.f))));
  CHECK(c[5] == Approx(1.f / (1.f + std::exp(-5.f))));
  // Scalars and empty tensors.
  CHECK(softmax(scalar_tensor(3.0), 0).item<float>() == 1.f);
  CHECK(log_softmax(scalar_tensor(3.0), -1).item<float>() == 0.f);
  CHECK(softmax(zeros({0, 5}), 1).shape() == Dims{0, 5});
  // Float64 keeps its dtype.
  CHECK(softmax(tensor({1.f, 2.f}).to(DType::Float64), 0).dtype() == DType::Float64);
}

TEST_CASE("softmax kernels equal the scalar reference bit for bit") {
  for (int v : {1, 2, 16, 64}) {
    for (bool log : {false, true}) {
      for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16}) {
        check_against_reference(uniform({5, 37}, 1, -4, 4, dt), 1, log, v);
        check_against_reference(uniform({3, 1000}, 2, -8, 8, dt), 1, log, v);
        check_against_reference(uniform({2, 70, 3}, 3, -4, 4, dt), 1, log, v);        // strided rows
        check_against_reference(uniform({9, 6}, 4, -4, 4, dt).transpose(0, 1), 1, log, v);  // transposed
        check_against_reference(uniform({4, 9}, 5, -4, 4, dt), 0, log, v);
      }
    }
  }
}

TEST_CASE("softmax ignores layout and the thread count") {
  Tensor x = uniform({300, 2001}, 7, -6, 6);
  Tensor xt = x.transpose(0, 1).contiguous().transpose(0, 1);  // same values, column-major
  Tensor g = uniform({300, 2001}, 8);
  for (bool log : {false, true}) {
    set_num_threads(1);
    Tensor a = log ? log_softmax(x, 1) : softmax(x, 1);
    Tensor da = raw::empty(x.shape(), x.dtype());
    kernels::softmax_backward(kCPU, g, a, 1, log, da, numerics::reduction_chunks());
    set_num_threads(3);
    Tensor b = log ? log_softmax(x, 1) : softmax(x, 1);
    Tensor db = raw::empty(x.shape(), x.dtype());
    kernels::softmax_backward(kCPU, g, b, 1, log, db, numerics::reduction_chunks());
    CHECK(bitwise_equal(a, b));
    CHECK(bitwise_equal(da, db));
    CHECK(bitwise_equal(a, log ? log_softmax(xt, 1) : softmax(xt, 1)));
    set_num_threads(2);
  }
}

TEST_CASE("16-bit softmax computes in float32 and rounds once") {
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    Tensor x = uniform({7, 130}, 11, -5, 5, dt);
    Tensor xf = x.to(DType::Float32);
    CHECK(softmax(x, 1).dtype() == dt);
    CHECK(bitwise_equal(softmax(x, 1), softmax(xf, 1).to(dt)));
    CHECK(bitwise_equal(log_softmax(x, 1), log_softmax(xf, 1).to(dt)));
    CHECK(bitwise_equal(softmax(x, 0), softmax(xf, 0).to(dt)));
  }
}

TEST_CASE("softmax gradients") {
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return softmax(v[0], 1); }, {grad_input_noncontig({4, 7}, 1)});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return softmax(v[0], 0); }, {grad_input_noncontig({5, 3}, 2)});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return softmax(v[0], 1); },
                  {grad_input_noncontig({3, 4, 5}, 3, -3, 3)});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return log_softmax(v[0], -1); },
                  {grad_input_noncontig({4, 9}, 4, -3, 3)});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return log_softmax(v[0], 0); },
                  {grad_input_noncontig({6, 2, 3}, 5)});
  // Composed: the gradient of sum(softmax) along the row is zero.
  Tensor x = grad_input({3, 5}, 6);
  sum(softmax(x, 1)).backward();
  CHECK(max_abs_diff(x.grad(), zeros({3, 5}, DType::Float64)) < 1e-14);
}

TEST_CASE("softmax errors") {
  CHECK_THROWS_WITH(softmax(arange(4), 0), Catch::Contains("softmax") && Catch::Contains("floating"));
  CHECK_THROWS_WITH(log_softmax(zeros({2, 3}), 2), Catch::Contains("log_softmax") && Catch::Contains("out of range"));
  CHECK_THROWS_WITH(softmax(scalar_tensor(1.0), 1), Catch::Contains("softmax") && Catch::Contains("out of range"));
}

TEST_CASE("softmax timing [8192, 50304] float32", "[.bench]") {
  // Wall time, and process CPU time / threads (what the wall time would be on
  // an otherwise idle machine with perfect scaling).
  set_num_threads(2);
  Tensor x = uniform({8192, 50304}, 1, -5, 5);
  Tensor y = softmax(x, 1);  // warm-up
  Tensor dx = raw::empty(x.shape(), x.dtype());
  auto cpu_ms = [] {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
  };
  using ms = std::chrono::duration<double, std::milli>;
  for (int it = 0; it < 2; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    double c0 = cpu_ms();
    y = softmax(x, 1);
    auto t1 = std::chrono::steady_clock::now();
    double c1 = cpu_ms();
    kernels::softmax_backward(kCPU, y, y, 1, false, dx, numerics::reduction_chunks());
    auto t2 = std::chrono::steady_clock::now();
    double c2 = cpu_ms();
    const double fwd = ms(t1 - t0).count(), bwd = ms(t2 - t1).count();
    WARN("softmax forward " << fwd << " ms wall (" << (c1 - c0) / 2 << " ms CPU/2), backward " << bwd << " ms wall ("
                            << (c2 - c1) / 2 << " ms CPU/2)");
  }
}

// The op checks its inputs once and the kernels do not re-check them: every
// error here comes from the op, so it comes on Meta tensors too (no kernel
// runs there), as in a Meta model or before a distributed op.
TEST_CASE("softmax errors come from the op, on Meta tensors too") {
  CHECK_THROWS_WITH(softmax(meta({4}, DType::Int64), 0), Catch::Contains("softmax") && Catch::Contains("int64"));
  CHECK_THROWS_WITH(log_softmax(meta({2, 3}), 2), Catch::Contains("log_softmax") && Catch::Contains("out of range"));
  CHECK(log_softmax(meta({2, 3}), 1).shape() == Dims{2, 3});
}
