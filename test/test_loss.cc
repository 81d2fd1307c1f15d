// cross_entropy / nll_loss: values, ignore_index and label smoothing, the
// kernels against the scalar reference of the documented order (bitwise,
// several V), thread-count invariance, 16-bit logits, gradients, errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "autograd/api.h"
#include "kernels/cpu/loss_ref.h"
#include "kernels/loss.h"
#include "runtime/numerics.h"
#include "runtime/threadpool.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;
using kernels::LossReduction;

namespace {

Tensor targets(const std::vector<int64_t>& v, const Dims& shape = {}) { return tensor(v, shape); }

template <class C>
bool bits_equal(C a, C b) {
  return std::memcmp(&a, &b, sizeof(C)) == 0;
}

// Random targets in [0, k) with every third one ignored (ignore_index -100).
Tensor some_ignored(int64_t m, int64_t k, uint64_t seed) {
  auto t = randint({m}, seed, 0, k).to_vector<int64_t>();
  for (size_t i = 0; i < t.size(); i += 3) t[i] = -100;
  return tensor(t);
}

template <class C>
void check_ce_reference(DType dt, int64_t m, int64_t k, double eps, int v) {
  INFO("cross_entropy " << dtype_name(dt) << " [" << m << ", " << k << "] eps " << eps << " V " << v);
  Tensor x = uniform({m, k}, uint64_t(m + k), -6, 6, dt);
  Tensor t = some_ignored(m, k, uint64_t(k));
  const DType acc = accumulate_dtype(dt);
  Tensor losses = raw::empty({m}, acc), mx = raw::empty({m}, acc), se = raw::empty({m}, acc);
  Tensor count = raw::empty(Dims{}, DType::Int64);
  kernels::cross_entropy_forward(kCPU, x, t, -100, eps, losses, mx, se, count, v);
  auto xv = x.to_vector<double>();
  auto tv = t.to_vector<int64_t>();
  auto lv = losses.to_vector<C>(), mv = mx.to_vector<C>(), sv = se.to_vector<C>();
  std::vector<C> ref_losses(static_cast<size_t>(m));
  int64_t valid = 0;
  for (int64_t r = 0; r < m; ++r) {
    if (tv[size_t(r)] == -100) {
      REQUIRE(bits_equal(lv[size_t(r)], C(0)));
      ref_losses[size_t(r)] = C(0);
      continue;
    }
    ++valid;
    std::vector<C> row(xv.begin() + r * k, xv.begin() + (r + 1) * k);
    auto ref = kernels::ref::cross_entropy_row<C>(row, tv[size_t(r)], eps, v);
    REQUIRE(bits_equal(lv[size_t(r)], ref.loss));
    REQUIRE(bits_equal(mv[size_t(r)], ref.row_max));
    REQUIRE(bits_equal(sv[size_t(r)], ref.sum_exp));
    ref_losses[size_t(r)] = ref.loss;
  }
  REQUIRE(count.item<int64_t>() == valid);
  // The reduction over tokens.
  for (bool mean : {true, false}) {
    Tensor out = raw::empty(Dims{}, acc);
    kernels::loss_reduce(kCPU, losses, count, mean, out, v);
    REQUIRE(bits_equal(out.item<C>(), kernels::ref::reduce_losses(ref_losses, valid, mean, v)));
  }
  // Backward, "mean" (scalar g) and "none" (per-token g).
  for (LossReduction red : {LossReduction::Mean, LossReduction::None}) {
    Tensor g = red == LossReduction::None ? uniform({m}, 77, -1, 1, acc) : scalar_tensor(0.75, acc);
    Tensor dx = raw::empty({m, k}, dt);
    kernels::cross_entropy_backward(kCPU, g, x, t, mx, se, count, -100, eps, red, dx);
    auto dv = dx.to_vector<double>();
    auto gv = g.reshape({-1}).to_vector<C>();
    for (int64_t r = 0; r < m; ++r) {
      std::vector<C> expect(static_cast<size_t>(k), C(0));
      if (tv[size_t(r)] != -100) {
        const C scale = red == LossReduction::None ? gv[size_t(r)] : gv[0] / C(valid);
        std::vector<C> row(xv.begin() + r * k, xv.begin() + (r + 1) * k);
        expect = kernels::ref::cross_entropy_backward_row<C>(row, tv[size_t(r)], mv[size_t(r)], sv[size_t(r)], eps,
                                                             scale);
      }
      Tensor got = tensor(std::vector<double>(dv.begin() + r * k, dv.begin() + (r + 1) * k)).to(dt);
      Tensor want = tensor(std::vector<double>(expect.begin(), expect.end()))
                        .to(sizeof(C) == 8 ? DType::Float64 : DType::Float32)
                        .to(dt);
      REQUIRE(bitwise_equal(got, want));
    }
  }
}

}  // namespace

TEST_CASE("cross_entropy values") {
  Tensor x = tensor({1.f, 2.f, 3.f, 1.f, 1.f, 1.f}, {2, 3});
  const float l0 = 2.40760596f, l1 = 1.09861229f;  // -log softmax([1,2,3])[0], log(3)
  CHECK(cross_entropy(x, targets({0, 1})).item<float>() == Approx((l0 + l1) / 2).epsilon(1e-6));
  CHECK(cross_entropy(x, targets({0, 1}), -100, "sum").item<float>() == Approx(l0 + l1).epsilon(1e-6));
  auto none = cross_entropy(x, targets({0, 1}), -100, "none");
  CHECK(none.shape() == Dims{2});
  CHECK(none.to_vector<float>()[0] == Approx(l0).epsilon(1e-6));
  CHECK(none.to_vector<float>()[1] == Approx(l1).epsilon(1e-6));
  CHECK(cross_entropy(x.narrow(0, 0, 1), targets({2})).item<float>() == Approx(0.40760596f).epsilon(1e-6));
  // ignore_index: the mean is over the remaining targets; "none" gives 0 there.
  CHECK(cross_entropy(x, targets({0, -100})).item<float>() == Approx(l0).epsilon(1e-6));
  CHECK(cross_entropy(x, targets({0, 7}), 7).item<float>() == Approx(l0).epsilon(1e-6));
  CHECK(cross_entropy(x, targets({-100, 1}), -100, "none").to_vector<float>()[0] == 0.f);
  // All ignored: mean is NaN (0 / 0, as in PyTorch), sum is 0.
  CHECK(std::isnan(cross_entropy(x, targets({-100, -100})).item<float>()));
  CHECK(cross_entropy(x, targets({-100, -100}), -100, "sum").item<float>() == 0.f);
  // Label smoothing: (1 - e) * nll + e / C * sum_i(-log p_i).
  const float nlp[3] = {2.40760596f, 1.40760596f, 0.40760596f};
  const float smooth = 0.9f * nlp[2] + 0.1f / 3 * (nlp[0] + nlp[1] + nlp[2]);
  CHECK(cross_entropy(x.narrow(0, 0, 1), targets({2}), -100, "mean", 0.1).item<float>() ==
        Approx(smooth).epsilon(1e-6));
  // Leading dims [2, 2] with class dim last; 1-D logits with a scalar target.
  Tensor x3 = tensor({1.f, 2.f, 3.f, 1.f, 1.f, 1.f, 1.f, 2.f, 3.f, 1.f, 1.f, 1.f}, {2, 2, 3});
  Tensor t3 = targets({0, 1, 0, 1}, {2, 2});
  CHECK(cross_entropy(x3, t3).item<float>() == Approx((l0 + l1) / 2).epsilon(1e-6));
  CHECK(cross_entropy(x3, t3, -100, "none").shape() == Dims{2, 2});
  CHECK(cross_entropy(tensor({1.f, 2.f, 3.f}), targets({2}).reshape({})).item<float>() ==
        Approx(0.40760596f).epsilon(1e-6));
  // Gradient of the mean: (softmax - onehot) / count.
  Tensor xg = x.detach().requires_grad_(true);
  cross_entropy(xg, targets({0, -100})).backward();
  auto gv = xg.grad().to_vector<float>();
  CHECK(gv[0] == Approx(0.09003057f - 1.f).epsilon(1e-6));
  CHECK(gv[2] == Approx(0.66524096f).epsilon(1e-6));
  CHECK(gv[3] == 0.f);
  CHECK(gv[5] == 0.f);
}

TEST_CASE("nll_loss values") {
  Tensor lp = tensor({-1.f, -2.f, -0.5f, -3.f}, {2, 2});
  CHECK(nll_loss(lp, targets({1, 0})).item<float>() == 1.25f);
  CHECK(nll_loss(lp, targets({1, 0}), -100, "sum").item<float>() == 2.5f);
  CHECK(nll_loss(lp, targets({1, -100}), -100, "none").to_vector<float>() == std::vector<float>{2.f, 0.f});
  CHECK(nll_loss(lp, targets({1, -100})).item<float>() == 2.f);
  CHECK(std::isnan(nll_loss(lp, targets({-100, -100})).item<float>()));
  // nll_loss(log_softmax(x)) agrees with cross_entropy(x).
  Tensor x = uniform({20, 11}, 3, -3, 3);
  Tensor t = some_ignored(20, 11, 4);
  CHECK(nll_loss(log_softmax(x, 1), t).item<float>() == Approx(cross_entropy(x, t).item<float>()).epsilon(1e-6));
  Tensor lpg = lp.detach().requires_grad_(true);
  nll_loss(lpg, targets({1, 0})).backward();
  CHECK(lpg.grad().to_vector<float>() == std::vector<float>{0.f, -0.5f, -0.5f, 0.f});
}

TEST_CASE("loss kernels equal the scalar reference bit for bit") {
  for (int v : {1, 2, 16, 64}) {
    for (double eps : {0.0, 0.1}) {
      check_ce_reference<float>(DType::Float32, 37, 50, eps, v);
      check_ce_reference<float>(DType::Float32, 5, 1003, eps, v);
      check_ce_reference<double>(DType::Float64, 13, 77, eps, v);
      check_ce_reference<float>(DType::BFloat16, 9, 129, eps, v);
    }
  }
  // The loss mean over many tokens (several chunks per token range).
  numerics::ChunksGuard guard(16);
  Tensor x = uniform({3000, 8}, 5, -2, 2);
  Tensor t = some_ignored(3000, 8, 6);
  auto losses = cross_entropy(x, t, -100, "none").to_vector<float>();
  const int64_t count = 2000;
  float expect = kernels::ref::reduce_losses(losses, count, true, 16);
  float got = cross_entropy(x, t).item<float>();
  CHECK(bits_equal(got, expect));
}

TEST_CASE("losses ignore the thread count and the logits layout") {
  Tensor x = uniform({500, 3001}, 9, -5, 5);
  Tensor xt = x.transpose(0, 1).contiguous().transpose(0, 1);
  Tensor t = some_ignored(500, 3001, 10);
  auto run = [&](const Tensor& in, double eps) {
    Tensor xi = in.detach().requires_grad_(true);
    Tensor loss = cross_entropy(xi, t, -100, "mean", eps);
    loss.backward();
    return std::make_pair(loss.detach(), xi.grad());
  };
  for (double eps : {0.0, 0.2}) {
    set_num_threads(1);
    auto a = run(x, eps);
    set_num_threads(3);
    auto b = run(x, eps);
    auto c = run(xt, eps);
    set_num_threads(2);
    CHECK(bitwise_equal(a.first, b.first));
    CHECK(bitwise_equal(a.second, b.second));
    CHECK(bitwise_equal(a.first, c.first));
    CHECK(bitwise_equal(a.second, c.second));
  }
}

TEST_CASE("16-bit logits compute in float32 and round once") {
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    Tensor x = uniform({40, 70}, 12, -4, 4, dt);
    Tensor t = some_ignored(40, 70, 13);
    for (const char* red : {"mean", "sum", "none"}) {
      Tensor a = cross_entropy(x, t, -100, red, 0.05);
      CHECK(a.dtype() == dt);
      CHECK(bitwise_equal(a, cross_entropy(x.to(DType::Float32), t, -100, red, 0.05).to(dt)));
    }
    Tensor xb = x.detach().requires_grad_(true), xf = x.to(DType::Float32).requires_grad_(true);
    cross_entropy(xb, t).backward();
    cross_entropy(xf, t).backward();
    CHECK(bitwise_equal(xb.grad(), xf.grad().to(dt)));
  }
}

TEST_CASE("loss gradients") {
  Tensor t = tensor(std::vector<int64_t>{2, -100, 0, 4, 1, 3});
  auto X = [] { return grad_input_noncontig({6, 5}, 51, -2, 2); };
  for (const char* red : {"mean", "sum", "none"}) {
    std::string r = red;
    CHECK_GRADCHECK([&](const std::vector<Tensor>& v) { return cross_entropy(v[0], t, -100, r); }, {X()});
    CHECK_GRADCHECK([&](const std::vector<Tensor>& v) { return cross_entropy(v[0], t, -100, r, 0.15); }, {X()});
    CHECK_GRADCHECK([&](const std::vector<Tensor>& v) { return nll_loss(v[0], t, -100, r); }, {X()});
  }
  // Leading dims and a custom ignore_index.
  Tensor t3 = tensor(std::vector<int64_t>{1, 0, 3, 3, 2, 1}, {2, 3});
  CHECK_GRADCHECK([&](const std::vector<Tensor>& v) { return cross_entropy(v[0], t3, 3); },
                  {grad_input_noncontig({2, 3, 4}, 52, -2, 2)});
  // Through log_softmax + nll_loss (the unfused path).
  CHECK_GRADCHECK([&](const std::vector<Tensor>& v) { return nll_loss(log_softmax(v[0], 1), t); }, {X()});
}

TEST_CASE("loss errors name the op, the value and the valid range") {
  Tensor x = zeros({3, 5});
  CHECK_THROWS_WITH(cross_entropy(x, targets({0, 5, 1})), Catch::Contains("cross_entropy") &&
                                                              Catch::Contains("target 5 at position 1") &&
                                                              Catch::Contains("[0, 5)"));
  CHECK_THROWS_WITH(cross_entropy(x, targets({0, 1, -1})), Catch::Contains("cross_entropy") &&
                                                               Catch::Contains("target -1 at position 2") &&
                                                               Catch::Contains("ignore_index (-100)"));
  CHECK_THROWS_WITH(cross_entropy(x, targets({0, -100, 2}), 2), Catch::Contains("target -100"));
  CHECK_THROWS_WITH(nll_loss(x, targets({9, 0, 0})),
                    Catch::Contains("nll_loss") && Catch::Contains("target 9") && Catch::Contains("[0, 5)"));
  CHECK_THROWS_WITH(cross_entropy(x, targets({0, 1})), Catch::Contains("cross_entropy") && Catch::Contains("[3]"));
  CHECK_THROWS_WITH(cross_entropy(x, tensor(std::vector<int32_t>{0, 1, 2})),
                    Catch::Contains("cross_entropy") && Catch::Contains("int64"));
  CHECK_THROWS_WITH(cross_entropy(x, targets({0, 1, 2}), -100, "avg"),
                    Catch::Contains("cross_entropy") && Catch::Contains("avg"));
  CHECK_THROWS_WITH(cross_entropy(x, targets({0, 1, 2}), -100, "mean", 1.5),
                    Catch::Contains("cross_entropy") && Catch::Contains("label_smoothing"));
  CHECK_THROWS_WITH(cross_entropy(arange(6).reshape({3, 2}), targets({0, 1, 0})),
                    Catch::Contains("cross_entropy") && Catch::Contains("floating"));
  CHECK_THROWS_WITH(nll_loss(x, targets({0, 1, 2}), -100, "max"), Catch::Contains("nll_loss"));
  CHECK_THROWS_WITH(cross_entropy(scalar_tensor(1.0), targets({0})), Catch::Contains("class dimension"));
}

// The op checks its inputs once and the kernels do not re-check them: every
// error here comes from the op, so it comes on Meta tensors too (no kernel
// runs there), as in a Meta model or before a distributed op.
TEST_CASE("cross_entropy / nll_loss errors come from the op, on Meta tensors too") {
  const Tensor x = meta({3, 4});
  CHECK_THROWS_WITH(cross_entropy(x, meta({2}, DType::Int64)),
                    Catch::Contains("cross_entropy") && Catch::Contains("[3]"));
  CHECK_THROWS_WITH(cross_entropy(x, meta({3}, DType::Int32)),
                    Catch::Contains("cross_entropy") && Catch::Contains("int32"));
  CHECK_THROWS_WITH(nll_loss(meta({3, 4}, DType::Int64), meta({3}, DType::Int64)),
                    Catch::Contains("nll_loss") && Catch::Contains("floating"));
  CHECK(cross_entropy(x, meta({3}, DType::Int64)).shape() == Dims{});
}
