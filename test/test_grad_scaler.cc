// nn::GradScaler (dynamic loss scaling) and the amp_unscale kernel, on the CPU.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "autograd/api.h"
#include "dtensor/ops.h"
#include "kernels/amp.h"
#include "nn/grad_scaler.h"
#include "nn/optim.h"
#include "test/util/dist.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

TEST_CASE("amp_unscale multiplies in float, rounds once, flags inf and NaN") {
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    INFO(dtype_name(dt));
    Tensor x = uniform({37, 5}, 3, -100, 100, dt);
    Tensor ref = raw::empty(x.shape(), dt);
    {
      auto v = x.to_vector<float>();
      for (auto& e : v) e = e * (1.0f / 1024.0f);
      ref = tensor(v, x.shape()).to(dt);
    }
    Tensor flag = zeros(Dims{});
    kernels::amp_unscale(kCPU, x, flag, 1.0f / 1024.0f);
    CHECK(bitwise_equal(x, ref));
    CHECK(flag.item<float>() == 0.0f);
    // Strided view with one inf: flagged, finite elements still scaled.
    Tensor y = uniform({6, 4}, 4, -1, 1, dt);
    Tensor yt = raw::transpose(y, 0, 1);
    raw::select(raw::select(y, 0, 2), 0, 3).fill_(INFINITY);
    kernels::amp_unscale(kCPU, yt, flag, 0.5f);
    CHECK(flag.item<float>() == 1.0f);
    // The flag stays set across tensors.
    Tensor z = ones({3}, TensorOptions(dt));
    kernels::amp_unscale(kCPU, z, flag, 0.5f);
    CHECK(flag.item<float>() == 1.0f);
    Tensor n = full({2}, NAN, TensorOptions(dt));
    Tensor f2 = zeros(Dims{});
    kernels::amp_unscale(kCPU, n, f2, 1.0f);
    CHECK(f2.item<float>() == 1.0f);
  }
  CHECK_THROWS_WITH(kernels::amp_unscale(kCPU, zeros({2}, TensorOptions(DType::Float64)), zeros(Dims{}), 1.0f),
                    Catch::Contains("amp_unscale"));
}

TEST_CASE("GradScaler: scaled backward, unscaled step equals the unscaled training step") {
  auto make = [] {
    Tensor w = uniform({4, 3}, 1, -1, 1).requires_grad_();
    return w;
  };
  Tensor x = uniform({5, 3}, 2, -1, 1);
  // Reference: plain SGD on the true gradient.
  Tensor w_ref = make();
  nn::SGDOptions so;
  so.lr = 0.1;
  nn::SGD ref_opt(std::vector<Tensor>{w_ref}, so);
  mean(square(matmul(x, w_ref.t()))).backward();
  ref_opt.step();
  // Scaled: a power-of-two scale makes the unscaled gradient exact.
  Tensor w = make();
  nn::SGD opt(std::vector<Tensor>{w}, so);
  nn::GradScaler scaler;
  CHECK(scaler.get_scale() == 65536.0);
  scaler.scale(mean(square(matmul(x, w.t())))).backward();
  CHECK(scaler.step(opt));
  scaler.update();
  CHECK(!scaler.found_inf());
  CHECK(bitwise_equal(w, w_ref));
  CHECK(scaler.growth_tracker() == 1);
}

TEST_CASE("GradScaler: an inf gradient skips the step and backs off; growth after the interval") {
  nn::GradScalerOptions o;
  o.init_scale = 8.0;
  o.growth_interval = 2;
  nn::GradScaler scaler(o);
  Tensor w = ones({3}).requires_grad_();
  nn::SGDOptions so;
  so.lr = 1.0;
  nn::SGD opt(std::vector<Tensor>{w}, so);
  // Step 1: an overflowing gradient.
  w.set_grad(tensor(std::vector<float>{1.0f, INFINITY, 2.0f}, Dims{3}));
  CHECK(!scaler.step(opt));
  scaler.update();
  CHECK(scaler.found_inf());
  CHECK(scaler.get_scale() == 4.0);
  CHECK(w.to_vector<float>() == std::vector<float>{1, 1, 1});
  CHECK(opt.num_steps() == 0);
  // Steps 2 and 3: clean; the scale doubles after two of them.
  for (int i = 0; i < 2; ++i) {
    w.set_grad(full({3}, 4.0));
    CHECK(scaler.step(opt));
    scaler.update();
  }
  CHECK(scaler.get_scale() == 8.0);
  CHECK(scaler.growth_tracker() == 0);
  CHECK(w.to_vector<float>() == std::vector<float>{-1, -1, -1});  // two steps of lr * 4 / 4
  // unscale_ twice in one step is an error; update() resets it.
  w.set_grad(full({3}, 1.0));
  scaler.unscale_(opt);
  CHECK_THROWS_WITH(scaler.unscale_(opt), Catch::Contains("GradScaler") && Catch::Contains("already"));
  scaler.update();
  // Disabled: identity.
  nn::GradScalerOptions off;
  off.enabled = false;
  nn::GradScaler none(off);
  Tensor l = full(Dims{}, 3.0);
  CHECK(none.scale(l).item<float>() == 3.0f);
  w.set_grad(full({3}, 1.0));
  CHECK(none.step(opt));
  CHECK_THROWS_WITH(nn::GradScaler(nn::GradScalerOptions{0.0}), Catch::Contains("init_scale"));
}

// A gradient sharded over tp=2 with an inf in rank 1's piece only: both
// ranks skip the step (the flag is combined over the mesh); a clean step
// unscales each piece and steps on both.
TEST_CASE("GradScaler: an inf in one rank's piece of a sharded gradient skips the step on every rank") {
  const auto reports = on_ranks(2, [](int rank) {
    RankReport rep;
    MeshPtr mesh = Mesh::world({{"tp", 2}});
    Tensor w = distribute_tensor(ones({4}), mesh, {Shard(0)}).requires_grad_();
    nn::SGDOptions so;
    so.lr = 1.0;
    nn::SGD opt(std::vector<Tensor>{w}, so);
    nn::GradScalerOptions o;
    o.init_scale = 4.0;
    nn::GradScaler scaler(o);
    w.set_grad(distribute_tensor(tensor(std::vector<float>{4, 4, 4, INFINITY}, Dims{4}), mesh, {Shard(0)}));
    rep.expect(!scaler.step(opt), "rank " + std::to_string(rank) + " stepped despite the inf on rank 1");
    scaler.update();
    rep.expect(scaler.get_scale() == 2.0, "the scale did not back off");
    rep.expect(raw::local_of(w).to_vector<float>() == std::vector<float>{1, 1}, "parameters changed");
    w.set_grad(distribute_tensor(full({4}, 2.0), mesh, {Shard(0)}));
    rep.expect(scaler.step(opt), "a clean step was skipped");
    scaler.update();
    rep.expect(raw::local_of(w).to_vector<float>() == std::vector<float>{0, 0}, "the clean step is not lr * 2 / 2");
    return rep.str();
  });
  CHECK(first_failure(reports) == "");
}
