// CUDA optimizer kernels (AdamW, SGD), the gradient norm / clipping, the AMP
// unscale and GradScaler against the CPU: per-element updates and the
// canonical sum of squares bit for bit. Skips without a GPU.
#include <catch2/catch.hpp>

#include "autograd/api.h"
#include "kernels/amp.h"
#include "kernels/optim.h"
#include "nn/clip.h"
#include "nn/grad_scaler.h"
#include "nn/optim.h"
#include "runtime/numerics.h"
#include "test/util/cuda.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

TEST_CASE("CUDA adamw_step and sgd_step equal the CPU bit for bit") {
  TESSEL_REQUIRE_GPU();
  const auto s = kernels::adamw_scalars(6e-4, 0.9, 0.95, 1e-8, 0.1, 7);
  for (DType gd : {DType::Float32, DType::BFloat16, DType::Float16}) {
    INFO(dtype_name(gd));
    Tensor p = uniform({257, 33}, 71), g = uniform({257, 33}, 72, -1, 1, gd);
    Tensor m = uniform({257, 33}, 73, -0.1, 0.1), v = uniform({257, 33}, 74, 0, 0.01);
    Tensor pd = to_cuda(p), md = to_cuda(m), vd = to_cuda(v);
    kernels::adamw_step(kCPU, p, g, m, v, s);
    kernels::adamw_step(kCuda, pd, to_cuda(g), md, vd, s);
    CHECK_SAME_BITS(pd, p);
    CHECK_SAME_BITS(md, m);
    CHECK_SAME_BITS(vd, v);
    for (bool nesterov : {false, true})
      for (bool first : {false, true}) {
        const auto ss = kernels::sgd_scalars(0.1, 0.9, 0.1, 0.01, nesterov, first);
        Tensor q = uniform({100}, 75), b = uniform({100}, 76), gq = uniform({100}, 77, -1, 1, gd);
        Tensor qd = to_cuda(q), bd = to_cuda(b);
        kernels::sgd_step(kCPU, q, gq, b, ss);
        kernels::sgd_step(kCuda, qd, to_cuda(gq), bd, ss);
        CHECK_SAME_BITS(qd, q);
        CHECK_SAME_BITS(bd, b);
      }
  }
}

TEST_CASE("CUDA sum_squares, grad norm and clipping equal the CPU") {
  TESSEL_REQUIRE_GPU();
  for (int v : {1, 16, 1024}) {
    for (int64_t n : {0, 1, 1000, 2 * 1000 * 1000 + 3}) {
      Tensor x = uniform({n}, 78, -3, 3);
      Tensor c = zeros({1}), g = zeros({1}, TensorOptions().with_device(kCuda));
      kernels::sum_squares(kCPU, x, v, c);
      kernels::sum_squares(kCuda, to_cuda(x), v, g);
      INFO("V " << v << " n " << n);
      CHECK_SAME_BITS(g, c);
    }
  }
  // 16-bit gradients, and chunks of several shared-memory tiles (4096
  // elements) with a partial last one, around the tiles' edges; the last
  // size is GPT-2's token embedding gradient (50257 x 768).
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    for (int v : {1, 16}) {
      for (int64_t n : {int64_t(4096) * v, int64_t(4096) * v - 1, int64_t(4096) * v + 1, int64_t(3 * 4096 + 5) * v + 7,
                        int64_t(38597376)}) {
        Tensor x = uniform({n}, 79, -3, 3, dt);
        Tensor c = zeros({1}), g = zeros({1}, TensorOptions().with_device(kCuda));
        kernels::sum_squares(kCPU, x, v, c);
        kernels::sum_squares(kCuda, to_cuda(x), v, g);
        INFO(dtype_name(dt) << " V " << v << " n " << n);
        CHECK_SAME_BITS(g, c);
      }
    }
  }
  // clip_grad_norm_ over several parameters on the GPU.
  std::vector<Tensor> pc, pg;
  for (int i = 0; i < 5; ++i) {
    Tensor p = uniform({37 + i, 11}, uint64_t(80 + i)).requires_grad_();
    p.set_grad(uniform({37 + i, 11}, uint64_t(90 + i), -5, 5));
    Tensor q = to_cuda(p.detach()).requires_grad_();
    q.set_grad(to_cuda(p.grad()));
    pc.push_back(p);
    pg.push_back(q);
  }
  const double nc = nn::clip_grad_norm_(pc, 1.0), ng = nn::clip_grad_norm_(pg, 1.0);
  CHECK(nc == ng);
  for (size_t i = 0; i < pc.size(); ++i) CHECK_SAME_BITS(pg[i].grad(), pc[i].grad());
}

TEST_CASE("CUDA AdamW optimizer trajectory equals the CPU's") {
  TESSEL_REQUIRE_GPU();
  Tensor wc = uniform({64, 32}, 95).requires_grad_();
  Tensor wg = to_cuda(wc.detach()).requires_grad_();
  Tensor x = uniform({16, 32}, 96);
  nn::AdamWOptions o;
  o.lr = 1e-2;
  nn::AdamW oc(std::vector<Tensor>{wc}, o), og(std::vector<Tensor>{wg}, o);
  for (int step = 0; step < 5; ++step) {
    oc.zero_grad();
    og.zero_grad();
    mean(square(matmul(x, wc.t()))).backward();
    mean(square(matmul(to_cuda(x), wg.t()))).backward();
    oc.step();
    og.step();
  }
  CHECK_SAME_BITS(wg, wc);
}

TEST_CASE("CUDA amp_unscale and GradScaler equal the CPU") {
  TESSEL_REQUIRE_GPU();
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    Tensor x = uniform({55, 9}, 97, -100, 100, dt);
    Tensor xd = to_cuda(x);
    Tensor fc = zeros(Dims{}), fg = zeros(Dims{}, TensorOptions().with_device(kCuda));
    kernels::amp_unscale(kCPU, x, fc, 1.0f / 3.0f);
    kernels::amp_unscale(kCuda, xd, fg, 1.0f / 3.0f);
    CHECK_SAME_BITS(xd, x);
    CHECK(fg.item<float>() == 0.0f);
    raw::select(xd, 0, 4).fill_(INFINITY);
    kernels::amp_unscale(kCuda, xd, fg, 1.0f);
    CHECK(fg.item<float>() == 1.0f);
  }
  Tensor w = to_cuda(ones({3})).requires_grad_();
  nn::SGDOptions so;
  so.lr = 1.0;
  nn::SGD opt(std::vector<Tensor>{w}, so);
  nn::GradScaler scaler;
  w.set_grad(to_cuda(tensor(std::vector<float>{1.0f, NAN, 0.0f}, Dims{3})));
  CHECK(!scaler.step(opt));
  scaler.update();
  CHECK(scaler.get_scale() == 32768.0);
  CHECK(w.to_vector<float>() == std::vector<float>{1, 1, 1});
}
