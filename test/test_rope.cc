// Rotary embeddings: the host-built tables, rotations of unit vectors against
// independently computed cos/sin, both pairings, partial rotary, positions
// and offsets, the relative-position property, 16-bit inputs, thread-count
// invariance, gradients, errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "autograd/api.h"
#include "runtime/threadpool.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

namespace {

double angle(int64_t t, int64_t i, int64_t dim, double theta = 10000.0) {
  return double(t) * std::pow(theta, -double(2 * i) / double(dim));
}

// Scalar reference of the documented per-element order (kernels/rope.h), in
// float, for a contiguous float32 x [B, T, H, D] and float32 tables.
std::vector<float> rope_ref(const Tensor& x, const Tensor& cos, const Tensor& sin, const std::vector<int64_t>& pos_bt,
                            bool interleaved) {
  auto xv = x.contiguous().to_vector<float>(), cv = cos.to_vector<float>(), sv = sin.to_vector<float>();
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3), half = cos.size(1);
  std::vector<float> out(xv.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t base = ((b * T + t) * H + h) * D, p = pos_bt[size_t(b * T + t)];
        for (int64_t j = 0; j < D; ++j) out[size_t(base + j)] = xv[size_t(base + j)];
        for (int64_t i = 0; i < half; ++i) {
          int64_t j1 = interleaved ? 2 * i : i, j2 = interleaved ? 2 * i + 1 : i + half;
          float x1 = xv[size_t(base + j1)], x2 = xv[size_t(base + j2)];
          float c = cv[size_t(p * half + i)], s = sv[size_t(p * half + i)];
          float a = x1 * c, bb = x2 * s, cc = x2 * c, d = x1 * s;
          out[size_t(base + j1)] = a - bb;
          out[size_t(base + j2)] = cc + d;
        }
      }
  return out;
}

}  // namespace

TEST_CASE("rope_cache tables are float64 values rounded once") {
  auto [c, s] = rope_cache(64, 16);
  CHECK(c.shape() == Dims{64, 8});
  CHECK(c.dtype() == DType::Float32);
  auto cv = c.to_vector<float>(), sv = s.to_vector<float>();
  for (int64_t t = 0; t < 64; ++t)
    for (int64_t i = 0; i < 8; ++i) {
      double a = angle(t, i, 16);
      REQUIRE(cv[size_t(t * 8 + i)] == Approx(std::cos(a)).margin(1e-7));
      REQUIRE(sv[size_t(t * 8 + i)] == Approx(std::sin(a)).margin(1e-7));
    }
  CHECK(cv[0] == 1.f);
  CHECK(sv[0] == 0.f);
  CHECK(cv[8] == float(std::cos(1.0)));  // t = 1, i = 0: angle exactly 1
  CHECK(sv[8] == float(std::sin(1.0)));
  // The float32 table is the float64 table rounded: identical bits whoever builds it.
  auto [c64, s64] = rope_cache(64, 16, 10000.0, DType::Float64);
  CHECK(bitwise_equal(c, c64.to(DType::Float32)));
  CHECK(bitwise_equal(s, s64.to(DType::Float32)));
  auto [cb, sb] = rope_cache(64, 16, 10000.0, DType::BFloat16);
  CHECK(bitwise_equal(cb, c64.to(DType::BFloat16)));
  // Another theta.
  auto [c5, s5] = rope_cache(8, 4, 500000.0);
  CHECK(s5.to_vector<float>()[7 * 2 + 1] == Approx(std::sin(angle(7, 1, 4, 500000.0))).margin(1e-7));
}

TEST_CASE("apply_rotary rotates unit vectors by the position's angles") {
  const int64_t D = 8, half = 4, T = 6;
  auto [c, s] = rope_cache(T, D);
  for (bool interleaved : {false, true}) {
    for (int64_t i = 0; i < half; ++i) {
      const int64_t j1 = interleaved ? 2 * i : i, j2 = interleaved ? 2 * i + 1 : i + half;
      // e_{j1} -> (cos, sin) in the pair's plane; e_{j2} -> (-sin, cos).
      for (int64_t which : {j1, j2}) {
        std::vector<float> xv(size_t(T * D), 0.f);
        for (int64_t t = 0; t < T; ++t) xv[size_t(t * D + which)] = 1.f;
        Tensor x = tensor(xv, {1, T, 1, D});
        auto y = apply_rotary(x, c, s, 0, interleaved).to_vector<float>();
        for (int64_t t = 0; t < T; ++t) {
          const double a = angle(t, i, D);
          const float* yr = y.data() + t * D;
          if (which == j1) {
            CHECK(yr[j1] == Approx(std::cos(a)).margin(1e-6));
            CHECK(yr[j2] == Approx(std::sin(a)).margin(1e-6));
          } else {
            CHECK(yr[j1] == Approx(-std::sin(a)).margin(1e-6));
            CHECK(yr[j2] == Approx(std::cos(a)).margin(1e-6));
          }
          for (int64_t j = 0; j < D; ++j)
            if (j != j1 && j != j2) CHECK(yr[j] == 0.f);
        }
      }
    }
  }
}

TEST_CASE("apply_rotary equals the scalar reference; offsets, positions and partial rotary") {
  auto [c, s] = rope_cache(32, 16);
  Tensor x = uniform({2, 5, 3, 16}, 1);
  for (bool interleaved : {false, true}) {
    std::vector<int64_t> pos(10);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t t = 0; t < 5; ++t) pos[size_t(b * 5 + t)] = 7 + t;
    Tensor y = apply_rotary(x, c, s, 7, interleaved);
    CHECK(y.to_vector<float>() == rope_ref(x, c, s, pos, interleaved));
    // Explicit positions [T] and [B, T] give the same bits as the offset.
    CHECK(bitwise_equal(y, apply_rotary(x, c, s, arange(7, 12), interleaved)));
    CHECK(bitwise_equal(y, apply_rotary(x, c, s, arange(7, 12).reshape({1, 5}).expand({2, 5}), interleaved)));
    // Per-batch positions (e.g. left padding).
    std::vector<int64_t> pb = {0, 1, 2, 3, 4, 3, 4, 5, 6, 7};
    CHECK(apply_rotary(x, c, s, tensor(pb, {2, 5}), interleaved).to_vector<float>() ==
          rope_ref(x, c, s, pb, interleaved));
    // A strided x (a view into a wider tensor) gives the same result.
    Tensor wide = uniform({2, 5, 3, 40}, 1);
    Tensor xs = wide.narrow(3, 8, 16);
    CHECK(apply_rotary(xs, c, s, 7, interleaved).to_vector<float>() == rope_ref(xs, c, s, pos, interleaved));
    // Partial rotary: tables for the first 8 of 16 features; the rest pass through.
    auto [c8, s8] = rope_cache(32, 8);
    Tensor yp = apply_rotary(x, c8, s8, 7, interleaved);
    CHECK(yp.to_vector<float>() == rope_ref(x, c8, s8, pos, interleaved));
    CHECK(bitwise_equal(yp.narrow(3, 8, 8), x.narrow(3, 8, 8)));
  }
  // Rotating a prefix and the rest with an offset equals rotating everything.
  Tensor full = apply_rotary(x, c, s);
  CHECK(bitwise_equal(full.narrow(1, 2, 3), apply_rotary(x.narrow(1, 2, 3).contiguous(), c, s, 2)));
}

TEST_CASE("rotary dot products depend only on the relative position") {
  auto [c, s] = rope_cache(64, 32, 10000.0, DType::Float64);
  Tensor q = uniform({1, 1, 1, 32}, 3, -1, 1, DType::Float64);
  Tensor k = uniform({1, 1, 1, 32}, 4, -1, 1, DType::Float64);
  auto dot = [&](int64_t m, int64_t n) {
    return sum(apply_rotary(q, c, s, m) * apply_rotary(k, c, s, n)).item<double>();
  };
  CHECK(dot(5, 3) == Approx(dot(40, 38)).epsilon(1e-12));
  CHECK(dot(10, 0) == Approx(dot(50, 40)).epsilon(1e-12));
  // And the rotation keeps norms.
  Tensor r = apply_rotary(q, c, s, 17);
  CHECK(sum(r * r).item<double>() == Approx(sum(q * q).item<double>()).epsilon(1e-13));
}

TEST_CASE("16-bit rotary computes in float32 and rounds once; threads do not matter") {
  auto [c, s] = rope_cache(16, 8);
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    Tensor x = uniform({2, 16, 4, 8}, 5, -2, 2, dt);
    Tensor y = apply_rotary(x, c, s);
    CHECK(y.dtype() == dt);
    CHECK(bitwise_equal(y, apply_rotary(x.to(DType::Float32), c, s).to(dt)));
    // 16-bit tables are widened to float32.
    auto [cb, sb] = rope_cache(16, 8, 10000.0, dt);
    CHECK(bitwise_equal(apply_rotary(x, cb, sb), apply_rotary(x.to(DType::Float32), cb.to(DType::Float32),
                                                              sb.to(DType::Float32)).to(dt)));
  }
  auto [cl, sl] = rope_cache(512, 64);
  Tensor x = uniform({4, 512, 8, 64}, 6);
  set_num_threads(1);
  Tensor a = apply_rotary(x, cl, sl);
  set_num_threads(3);
  Tensor b = apply_rotary(x, cl, sl);
  set_num_threads(2);
  CHECK(bitwise_equal(a, b));
}

TEST_CASE("rotary gradients (rotation by -angle)") {
  auto [c, s] = rope_cache(12, 8, 10000.0, DType::Float64);
  auto [c4, s4] = rope_cache(12, 4, 10000.0, DType::Float64);
  auto X = [] { return grad_input_noncontig({2, 5, 3, 8}, 61); };
  for (bool il : {false, true}) {
    CHECK_GRADCHECK([&](const std::vector<Tensor>& v) { return apply_rotary(v[0], c, s, 0, il); }, {X()});
    CHECK_GRADCHECK([&](const std::vector<Tensor>& v) { return apply_rotary(v[0], c, s, 4, il); }, {X()});
    CHECK_GRADCHECK([&](const std::vector<Tensor>& v) { return apply_rotary(v[0], c4, s4, 2, il); }, {X()});
    Tensor pos = tensor(std::vector<int64_t>{3, 1, 4, 1, 5, 9, 2, 6, 5, 3}, {2, 5});
    CHECK_GRADCHECK([&](const std::vector<Tensor>& v) { return apply_rotary(v[0], c, s, pos, il); }, {X()});
  }
  // The backward of a rotation is the inverse rotation: grad of sum(y * g) is rot(-angle) g.
  auto [c32, s32] = rope_cache(6, 8);
  Tensor x = uniform({1, 6, 2, 8}, 62).requires_grad_(true);
  Tensor g = uniform({1, 6, 2, 8}, 63);
  apply_rotary(x, c32, s32).backward(g);
  CHECK(max_abs_diff(apply_rotary(x.grad(), c32, s32), g) < 1e-6);
}

TEST_CASE("rotary errors") {
  auto [c, s] = rope_cache(8, 8);
  CHECK_THROWS_WITH(rope_cache(8, 7), Catch::Contains("rope_cache") && Catch::Contains("even"));
  CHECK_THROWS_WITH(rope_cache(8, 8, 10000.0, DType::Int64), Catch::Contains("rope_cache") && Catch::Contains("dtype"));
  CHECK_THROWS_WITH(apply_rotary(zeros({2, 8, 8}), c, s), Catch::Contains("apply_rotary") && Catch::Contains("[batch"));
  CHECK_THROWS_WITH(apply_rotary(zeros({1, 4, 2, 6}), c, s), Catch::Contains("apply_rotary") && Catch::Contains("exceeds"));
  CHECK_THROWS_WITH(apply_rotary(zeros({1, 4, 2, 8}), c, s, 5),
                    Catch::Contains("apply_rotary") && Catch::Contains("[5, 9)") && Catch::Contains("[0, 8)"));
  CHECK_THROWS_WITH(apply_rotary(zeros({1, 2, 2, 8}), c, s, tensor(std::vector<int64_t>{3, 8})),
                    Catch::Contains("apply_rotary") && Catch::Contains("position 8") && Catch::Contains("[0, 8)"));
  CHECK_THROWS_WITH(apply_rotary(zeros({1, 2, 2, 8}), c, s, tensor(std::vector<int64_t>{-1, 0})),
                    Catch::Contains("position -1"));
  CHECK_THROWS_WITH(apply_rotary(zeros({1, 2, 2, 8}), c, s, tensor(std::vector<int64_t>{0, 1, 2})),
                    Catch::Contains("apply_rotary") && Catch::Contains("positions"));
  CHECK_THROWS_WITH(apply_rotary(zeros({1, 2, 2, 8}), c, s, tensor({0.f, 1.f})),
                    Catch::Contains("apply_rotary") && Catch::Contains("int64"));
  CHECK_THROWS_WITH(apply_rotary(zeros({1, 2, 2, 8}), c, s.narrow(0, 0, 4)),
                    Catch::Contains("apply_rotary") && Catch::Contains("cos"));
}

// The op checks its inputs once and the kernels do not re-check them: every
// error here comes from the op, so it comes on Meta tensors too (no kernel
// runs there), as in a Meta model or before a distributed op.
TEST_CASE("apply_rotary errors come from the op, on Meta tensors too") {
  const Tensor c = meta({8, 4}), s = meta({8, 4});
  CHECK_THROWS_WITH(apply_rotary(meta({2, 8, 8}), c, s), Catch::Contains("apply_rotary") && Catch::Contains("[batch"));
  CHECK_THROWS_WITH(apply_rotary(meta({1, 4, 2, 6}), c, s),
                    Catch::Contains("apply_rotary") && Catch::Contains("exceeds"));
  CHECK_THROWS_WITH(apply_rotary(meta({1, 4, 2, 8}), c, meta({8, 3})),
                    Catch::Contains("apply_rotary") && Catch::Contains("cos"));
  CHECK_THROWS_WITH(apply_rotary(meta({1, 4, 2, 8}), c, s, 5),
                    Catch::Contains("apply_rotary") && Catch::Contains("[5, 9)"));
  CHECK_THROWS_WITH(apply_rotary(meta({1, 2, 2, 8}), c, s, meta({3}, DType::Int64)),
                    Catch::Contains("apply_rotary") && Catch::Contains("positions"));
  CHECK(apply_rotary(meta({1, 4, 2, 8}), c, s).shape() == Dims{1, 4, 2, 8});
}
