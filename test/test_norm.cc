// layer_norm / rms_norm: values, kernels against the scalar reference of the
// documented order (bitwise, several V, dtypes, with and without affine
// parameters), canonical column sums, thread-count invariance, 16-bit inputs,
// gradients (weights and biases included), errors.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>

#include "autograd/api.h"
#include "kernels/cpu/norm_ref.h"
#include "kernels/cpu/row_ops.h"
#include "kernels/norm.h"
#include "runtime/numerics.h"
#include "runtime/threadpool.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

namespace {

template <class C>
std::vector<C> vec(const Tensor& t) {
  if (!t.defined()) return {};
  auto d = t.to_vector<double>();
  return std::vector<C>(d.begin(), d.end());
}

// out (any floating dtype) equals the compute-type values `ref` rounded to its dtype, bit for bit.
template <class C>
bool same_bits(const Tensor& out, const std::vector<C>& ref) {
  Tensor r = tensor(std::vector<double>(ref.begin(), ref.end()), out.shape(), TensorOptions(DType::Float64));
  // Values of the compute type convert to float32/float64 exactly; 16-bit outputs round once from float.
  Tensor expect = sizeof(C) == 8 ? r.to(out.dtype()) : r.to(DType::Float32).to(out.dtype());
  return bitwise_equal(out, expect);
}

struct NormCase {
  int64_t m, n;
  bool weight, bias;
};

template <class C>
void check_norm_reference(bool rms, DType dt, const NormCase& nc, int v) {
  INFO((rms ? "rms_norm" : "layer_norm") << " " << dtype_name(dt) << " [" << nc.m << ", " << nc.n << "] weight "
                                         << nc.weight << " bias " << nc.bias << " V " << v);
  const int64_t m = nc.m, n = nc.n;
  const double eps = 1e-5;
  Tensor x = uniform({m, n}, uint64_t(m * 7 + n), -3, 2, dt);
  Tensor w = nc.weight ? uniform({n}, 3, 0.5, 1.5, dt) : Tensor();
  Tensor b = nc.bias && !rms ? uniform({n}, 4, -1, 1, dt) : Tensor();
  Tensor g = uniform({m, n}, 5, -1, 1, dt);
  const DType acc = accumulate_dtype(dt);
  Tensor y = raw::empty({m, n}, dt), mean = raw::empty({m}, acc), rstd = raw::empty({m}, acc);
  Tensor dx = raw::empty({m, n}, dt), dw = raw::empty({n}, dt), db = raw::empty({n}, dt);
  if (rms) {
    kernels::rms_norm_forward(kCPU, x, w, eps, y, rstd, v);
    kernels::rms_norm_backward(kCPU, g, x, w, rstd, dx, dw, v);
  } else {
    kernels::layer_norm_forward(kCPU, x, w, b, eps, y, mean, rstd, v);
    kernels::layer_norm_backward(kCPU, g, x, w, mean, rstd, dx, dw, db, v);
  }
  auto f = kernels::ref::norm_forward<C>(vec<C>(x), m, n, vec<C>(w), vec<C>(b), eps, rms, v);
  CHECK(same_bits(y, f.y));
  CHECK(same_bits(rstd, f.rstd));
  if (!rms) CHECK(same_bits(mean, f.mean));
  auto bw = kernels::ref::norm_backward<C>(vec<C>(g), vec<C>(x), m, n, vec<C>(w), f.mean, f.rstd, rms, v);
  CHECK(same_bits(dx, bw.dx));
  CHECK(same_bits(dw, bw.dw));
  if (!rms) CHECK(same_bits(db, bw.db));
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("layer_norm and rms_norm values") {
  Tensor x = tensor({1.f, 2.f, 3.f, 4.f});
  // mean 2.5, population variance 1.25.
  const float rs = 1.f / std::sqrt(1.25f + 1e-5f);
  auto y = layer_norm(x, {4}).to_vector<float>();
  CHECK(y[0] == Approx(-1.5f * rs));
  CHECK(y[1] == Approx(-0.5f * rs));
  CHECK(y[3] == Approx(1.5f * rs));
  CHECK(y[0] == Approx(-1.3416355f).epsilon(1e-6));
  Tensor w = tensor({1.f, 2.f, 3.f, 4.f}), b = tensor({0.5f, 0.5f, -1.f, 0.f});
  auto ya = layer_norm(x, {4}, w, b).to_vector<float>();
  CHECK(ya[1] == Approx(-0.5f * rs * 2.f + 0.5f));
  CHECK(ya[2] == Approx(0.5f * rs * 3.f - 1.f));
  // Rows normalise independently; normalized_shape may span several dims.
  Tensor m = tensor({1.f, 2.f, 3.f, 4.f, 10.f, 20.f, 30.f, 40.f}, {2, 2, 2});
  auto y2 = layer_norm(m, {2, 2}).to_vector<float>();
  CHECK(y2[0] == Approx(y[0]).epsilon(1e-5));
  CHECK(y2[4] == Approx(-15.f / std::sqrt(125.f + 1e-5f)).epsilon(1e-5));
  // rms_norm: x / sqrt(mean(x^2) + eps); mean(x^2) = 7.5.
  auto r = rms_norm(x, {4}, w, 1e-6).to_vector<float>();
  const float rr = 1.f / std::sqrt(7.5f + 1e-6f);
  CHECK(r[0] == Approx(1.f * rr));
  CHECK(r[3] == Approx(4.f * rr * 4.f));
  // A constant row: layer_norm gives zeros (var = 0, rstd = 1/sqrt(eps)).
  CHECK(layer_norm(full({3}, 7.0), {3}).to_vector<float>() == std::vector<float>{0, 0, 0});
  CHECK(layer_norm(x.to(DType::Float64), {4}).dtype() == DType::Float64);
  CHECK(layer_norm(zeros({0, 4}), {4}).shape() == Dims{0, 4});
}

TEST_CASE("norm kernels equal the scalar reference bit for bit") {
  const NormCase cases[] = {{5, 37, true, true}, {3, 8, false, false}, {37, 50, true, false},
                            {300, 129, true, true}, {9, 1000, false, true}, {1, 1, true, true}};
  for (int v : {1, 2, 16, 64}) {
    for (const NormCase& nc : cases) {
      for (bool rms : {false, true}) {
        check_norm_reference<float>(rms, DType::Float32, nc, v);
        check_norm_reference<double>(rms, DType::Float64, nc, v);
        check_norm_reference<float>(rms, DType::BFloat16, nc, v);
      }
    }
  }
}

TEST_CASE("canonical column sums equal the reference for any m, n and V") {
  for (int64_t m : {0, 1, 7, 8, 9, 100, 1031}) {
    for (int64_t n : {1, 5, 128, 130, 300}) {
      for (int v : {1, 2, 16, 64}) {
        auto a = uniform({m, n}, uint64_t(m + 3 * n + v)).to_vector<float>();
        std::vector<float> out0(static_cast<size_t>(n)), out1(out0.size());
        kernels::cpu::canonical_col_sums<float, 2>(
            m, n, v,
            [&](int64_t t, int64_t j0, int64_t w, float* const* dst) {
              for (int64_t i = 0; i < w; ++i) {
                dst[0][i] = a[size_t(t * n + j0 + i)];
                dst[1][i] = a[size_t(t * n + j0 + i)] * 3.f;
              }
            },
            {out0.data(), out1.data()});
        std::vector<float> a3(a.size());
        for (size_t i = 0; i < a.size(); ++i) a3[i] = a[i] * 3.f;
        for (int64_t j = 0; j < n; ++j) {
          float r0 = kernels::canonical_sum_ref<float>(a.data() + j, m, n, v);
          float r1 = kernels::canonical_sum_ref<float>(a3.data() + j, m, n, v);
          REQUIRE(std::memcmp(&r0, &out0[size_t(j)], 4) == 0);
          REQUIRE(std::memcmp(&r1, &out1[size_t(j)], 4) == 0);
        }
      }
    }
  }
}

TEST_CASE("norms ignore the thread count and the input layout") {
  Tensor x = uniform({1000, 300}, 21, -2, 2);
  Tensor xt = x.transpose(0, 1).contiguous().transpose(0, 1);
  Tensor g = uniform({1000, 300}, 22);
  auto run = [&](const Tensor& in, bool rms) {
    Tensor xi = in.detach().requires_grad_(true);
    Tensor w = uniform({300}, 23, 0.5, 1.5).requires_grad_(true);
    Tensor b = uniform({300}, 24).requires_grad_(true);
    Tensor y = rms ? rms_norm(xi, {300}, w) : layer_norm(xi, {300}, w, b);
    y.backward(g);
    return std::vector<Tensor>{y.detach(), xi.grad(), w.grad(), rms ? Tensor() : b.grad()};
  };
  for (bool rms : {false, true}) {
    set_num_threads(1);
    auto a = run(x, rms);
    set_num_threads(3);
    auto b = run(x, rms);
    auto c = run(xt, rms);
    set_num_threads(2);
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].defined()) continue;
      CHECK(bitwise_equal(a[i], b[i]));
      CHECK(bitwise_equal(a[i], c[i]));
    }
  }
}

TEST_CASE("16-bit norms compute in float32 and round once") {
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    Tensor x = uniform({6, 3, 40}, 31, -3, 3, dt);
    Tensor w = uniform({40}, 32, 0.5, 1.5, dt), b = uniform({40}, 33, -1, 1, dt);
    auto f32 = [](const Tensor& t) { return t.to(DType::Float32); };
    Tensor y = layer_norm(x, {40}, w, b);
    CHECK(y.dtype() == dt);
    CHECK(bitwise_equal(y, layer_norm(f32(x), {40}, f32(w), f32(b)).to(dt)));
    CHECK(bitwise_equal(rms_norm(x, {40}, w), rms_norm(f32(x), {40}, f32(w)).to(dt)));
    // Gradients: summed in float32, rounded once.
    Tensor xb = x.detach().requires_grad_(true), wb = w.detach().requires_grad_(true);
    Tensor xf = f32(x).requires_grad_(true), wf = f32(w).requires_grad_(true);
    Tensor g = uniform({6, 3, 40}, 34, -1, 1, dt);
    layer_norm(xb, {40}, wb).backward(g);
    layer_norm(xf, {40}, wf).backward(f32(g));
    CHECK(bitwise_equal(wb.grad(), wf.grad().to(dt)));
    CHECK(bitwise_equal(xb.grad(), xf.grad().to(dt)));
  }
}

TEST_CASE("norm gradients, weights and biases included") {
  auto X = [] { return grad_input_noncontig({4, 3, 6}, 41); };
  auto W = [](Dims s) { return grad_input(s, 42, 0.5, 1.5); };
  auto B = [](Dims s) { return grad_input(s, 43); };
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return layer_norm(v[0], {6}, v[1], v[2]); }, {X(), W({6}), B({6})});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return layer_norm(v[0], {3, 6}, v[1], v[2]); },
                  {X(), W({3, 6}), B({3, 6})});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return layer_norm(v[0], {6}); }, {X()});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return layer_norm(v[0], {6}, Tensor(), v[1]); }, {X(), B({6})});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return layer_norm(v[0], {6}, v[1]); }, {X(), W({6})});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return rms_norm(v[0], {6}, v[1]); }, {X(), W({6})});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return rms_norm(v[0], {3, 6}); }, {X()});
  // Only the weight requires grad (frozen input).
  Tensor xc = uniform({5, 6}, 44, -1, 1, DType::Float64);
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return rms_norm(v[0], {6}, v[1]); }, {xc, W({6})});
}

TEST_CASE("norm errors") {
  Tensor x = zeros({2, 3, 4});
  CHECK_THROWS_WITH(layer_norm(x, {3}), Catch::Contains("layer_norm") && Catch::Contains("normalized_shape [3]"));
  CHECK_THROWS_WITH(layer_norm(x, {}), Catch::Contains("layer_norm") && Catch::Contains("empty"));
  CHECK_THROWS_WITH(layer_norm(x, {1, 2, 3, 4}), Catch::Contains("layer_norm") && Catch::Contains("more dims"));
  CHECK_THROWS_WITH(layer_norm(x, {4}, zeros({3})), Catch::Contains("layer_norm") && Catch::Contains("weight"));
  CHECK_THROWS_WITH(layer_norm(x, {4}, Tensor(), zeros({5})), Catch::Contains("layer_norm") && Catch::Contains("bias"));
  CHECK_THROWS_WITH(layer_norm(x, {4}, zeros({4}, DType::Float64)),
                    Catch::Contains("layer_norm") && Catch::Contains("dtype"));
  CHECK_THROWS_WITH(layer_norm(x, {4}, Tensor(), Tensor(), -1.0), Catch::Contains("eps"));
  CHECK_THROWS_WITH(layer_norm(arange(4), {4}), Catch::Contains("layer_norm") && Catch::Contains("floating"));
  CHECK_THROWS_WITH(rms_norm(x, {2}), Catch::Contains("rms_norm") && Catch::Contains("normalized_shape"));
  CHECK_THROWS_WITH(rms_norm(x, {4}, zeros({2, 2})), Catch::Contains("rms_norm") && Catch::Contains("weight"));
}

TEST_CASE("layer_norm timing [8192, 768] float32", "[.bench]") {
  // Wall time, and process CPU time / threads (idle-machine estimate).
  set_num_threads(2);
  Tensor x = uniform({8192, 768}, 1, -2, 2).requires_grad_(true);
  Tensor w = uniform({768}, 2).requires_grad_(true), b = uniform({768}, 3).requires_grad_(true);
  Tensor g = uniform({8192, 768}, 4);
  auto cpu_ms = [] {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
  };
  for (int it = 0; it < 5; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    double c0 = cpu_ms();
    Tensor y = layer_norm(x, {768}, w, b);
    double fwd = ms_since(t0), c1 = cpu_ms();
    auto t1 = std::chrono::steady_clock::now();
    y.backward(g);
    double bwd = ms_since(t1), c2 = cpu_ms();
    x.zero_grad();
    w.zero_grad();
    b.zero_grad();
    WARN("layer_norm forward " << fwd << " ms wall (" << (c1 - c0) / 2 << " ms CPU/2), backward " << bwd
                               << " ms wall (" << (c2 - c1) / 2 << " ms CPU/2)");
  }
}

// The op checks its inputs once and the kernels do not re-check them: every
// error here comes from the op, so it comes on Meta tensors too (no kernel
// runs there), as in a Meta model or before a distributed op.
TEST_CASE("layer_norm / rms_norm errors come from the op, on Meta tensors too") {
  const Tensor x = meta({2, 4});
  CHECK_THROWS_WITH(layer_norm(x, {3}), Catch::Contains("layer_norm") && Catch::Contains("normalized_shape [3]"));
  CHECK_THROWS_WITH(layer_norm(x, {4}, meta({3})), Catch::Contains("layer_norm") && Catch::Contains("weight"));
  CHECK_THROWS_WITH(layer_norm(x, {4}, meta({4}, DType::Float64)),
                    Catch::Contains("layer_norm") && Catch::Contains("float64"));
  CHECK_THROWS_WITH(layer_norm(x, {4}, Tensor(), meta({5})), Catch::Contains("layer_norm") && Catch::Contains("bias"));
  CHECK_THROWS_WITH(rms_norm(meta({4}, DType::Int64), {4}), Catch::Contains("rms_norm") && Catch::Contains("floating"));
  CHECK(rms_norm(x, {4}, meta({4})).shape() == Dims{2, 4});
}
