// Optimizers: fused kernels against the scalar reference (bitwise), AdamW and
// SGD trajectories against hand computations (float: bitwise; PyTorch's
// published algorithm in double: close), groups and weight decay, skipped
// parameters, state_dict resume (bitwise), no allocation per step, gradient
// accumulation, thread invariance, errors.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>

#include "autograd/api.h"
#include "dtensor/ops.h"
#include "kernels/cpu/optim_ref.h"
#include "kernels/optim.h"
#include "nn/clip.h"
#include "nn/module.h"
#include "nn/optim.h"
#include "nn/schedule.h"
#include "runtime/allocator.h"
#include "runtime/threadpool.h"
#include "test/util/dist.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;
using tessel::nn::NamedTensor;

namespace {

bool same_bits(const std::vector<float>& a, const Tensor& b) {
  auto v = b.contiguous().to_vector<float>();
  return a.size() == v.size() && (a.empty() || std::memcmp(a.data(), v.data(), a.size() * 4) == 0);
}

struct Layer : nn::Module {
  Tensor weight, bias, scale;
  Layer() : Module("Layer") {
    param("weight", weight, {4, 3}, nn::init::normal(0.0, 0.5));
    param("bias", bias, {4}, nn::init::uniform(-0.1, 0.1));
    param("scale", scale, {4}, nn::init::ones());
  }
  Tensor forward(const Tensor& x) const { return linear(x, weight, bias) * scale; }
};

struct Net : nn::Module {
  std::shared_ptr<Layer> layer, head;
  Net() : Module("Net") {
    layer = child("layer", std::make_shared<Layer>());
    head = child("head", std::make_shared<Layer>());
  }
  Tensor forward(const Tensor& x) const { return head->forward(tanh(layer->forward(x)).narrow(1, 0, 3)); }
};

// A mean squared error on data that depends on the step.
Tensor net_loss(const Net& net, int64_t step) {
  Tensor x = uniform({8, 3}, uint64_t(100 + step % 7));
  Tensor y = uniform({8, 4}, uint64_t(200 + step % 5));
  return mean(square(net.forward(x) - y));
}

std::shared_ptr<Net> make_net(uint64_t seed) {
  auto net = std::make_shared<Net>();
  net->reset_parameters(seed);
  return net;
}

std::vector<NamedTensor> snapshot(const std::vector<NamedTensor>& s) {
  NoGradGuard g;
  std::vector<NamedTensor> out;
  for (const auto& nt : s) out.push_back({nt.name, nt.tensor.detach().clone()});
  return out;
}

template <class F>
void with_grad_dtype(DType d, F&& f) {
  switch (d) {
    case DType::Float32: return f(TypeTag<float>{});
    case DType::BFloat16: return f(TypeTag<bf16>{});
    case DType::Float16: return f(TypeTag<f16>{});
    default: FAIL("unexpected dtype");
  }
}

}  // namespace

// ---- kernels vs the scalar reference -----------------------------------------------------
TEST_CASE("adamw_step equals the scalar reference bit for bit") {
  for (int64_t n : {1, 7, 8, 9, 100, 70001}) {
    for (DType gd : {DType::Float32, DType::BFloat16, DType::Float16}) {
      for (int64_t step : {1, 2, 1000}) {
        const uint64_t seed = uint64_t(n * 7 + step);
        Tensor p = uniform({n}, seed), m = uniform({n}, seed + 1, -0.1, 0.1), v = uniform({n}, seed + 2, 0, 0.01);
        Tensor g = uniform({n}, seed + 3, -2, 2, gd);
        auto s = kernels::adamw_scalars(1e-3, 0.9, 0.95, 1e-8, 0.1, step);
        auto pr = p.to_vector<float>(), mr = m.to_vector<float>(), vr = v.to_vector<float>();
        with_grad_dtype(gd, [&](auto tag) {
          using G = typename decltype(tag)::type;
          kernels::ref::adamw_step(pr.data(), g.data<G>(), mr.data(), vr.data(), n, s);
        });
        kernels::adamw_step(kCPU, p, g, m, v, s);
        INFO("n=" << n << " grad " << dtype_name(gd) << " step " << step);
        REQUIRE(same_bits(pr, p));
        REQUIRE(same_bits(mr, m));
        REQUIRE(same_bits(vr, v));
      }
    }
  }
}

TEST_CASE("adamw_step on non-contiguous operands equals the reference") {
  Tensor pbuf = uniform({29, 37}, 1), gbuf = uniform({29, 37}, 2, -1, 1, DType::BFloat16);
  Tensor p = raw::transpose(pbuf, 0, 1), g = raw::transpose(gbuf, 0, 1);  // [37, 29], strided
  Tensor m = zeros({37, 29}), v = zeros({37, 29});
  auto s = kernels::adamw_scalars(0.01, 0.9, 0.999, 1e-8, 0.0, 1);
  auto pr = p.contiguous().to_vector<float>(), mr = m.to_vector<float>(), vr = v.to_vector<float>();
  Tensor gc = g.contiguous();
  kernels::ref::adamw_step(pr.data(), gc.data<bf16>(), mr.data(), vr.data(), p.numel(), s);
  kernels::adamw_step(kCPU, p, g, m, v, s);
  CHECK(same_bits(pr, p));
  CHECK(same_bits(mr, m));
  CHECK(same_bits(vr, v));
}

TEST_CASE("sgd_step equals the scalar reference bit for bit, every flag combination") {
  for (int64_t n : {1, 9, 1000, 70001}) {
    for (DType gd : {DType::Float32, DType::BFloat16}) {
      for (double wd : {0.0, 0.01}) {
        for (double momentum : {0.0, 0.9}) {
          for (double dampening : {0.0, 0.25}) {
            for (bool nesterov : {false, true}) {
              for (bool first : {false, true}) {
                if (nesterov && (momentum == 0 || dampening != 0)) continue;
                const uint64_t seed = uint64_t(n + 31 * int(momentum * 10) + 7 * int(first));
                Tensor p = uniform({n}, seed), g = uniform({n}, seed + 1, -1, 1, gd);
                Tensor buf = momentum != 0 ? uniform({n}, seed + 2) : Tensor();
                auto s = kernels::sgd_scalars(0.05, momentum, dampening, wd, nesterov, first);
                auto pr = p.to_vector<float>();
                std::vector<float> br = buf.defined() ? buf.to_vector<float>() : std::vector<float>(size_t(n));
                with_grad_dtype(gd, [&](auto tag) {
                  using G = typename decltype(tag)::type;
                  kernels::ref::sgd_step(pr.data(), g.data<G>(), br.data(), n, s);
                });
                kernels::sgd_step(kCPU, p, g, buf, s);
                INFO("n=" << n << " wd=" << wd << " momentum=" << momentum << " dampening=" << dampening
                          << " nesterov=" << nesterov << " first=" << first);
                REQUIRE(same_bits(pr, p));
                if (buf.defined()) REQUIRE(same_bits(br, buf));
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("host scalars: computed in double, rounded once, beta^t by squaring") {
  CHECK(kernels::ipow(0.9, 0) == 1.0);
  CHECK(kernels::ipow(0.9, 1) == 0.9);
  CHECK(kernels::ipow(0.5, 10) == 1.0 / 1024);
  CHECK(kernels::ipow(0.999, 1000) == Approx(std::pow(0.999, 1000)).epsilon(1e-13));
  auto s = kernels::adamw_scalars(1e-3, 0.9, 0.999, 1e-8, 0.1, 3);
  CHECK(s.beta1 == 0.9f);
  CHECK(s.one_minus_beta1 == float(1.0 - 0.9));
  CHECK(s.one_minus_beta2 == float(1.0 - 0.999));
  CHECK(s.decay == float(1.0 - 1e-3 * 0.1));
  CHECK(s.step_size == float(1e-3 / (1.0 - 0.9 * 0.9 * 0.9)));
  CHECK(s.bias_correction2_sqrt == float(std::sqrt(1.0 - 0.999 * 0.999 * 0.999)));
  CHECK(s.eps == 1e-8f);
  CHECK(kernels::adamw_scalars(1e-3, 0.9, 0.999, 1e-8, 0.0, 1).decay == 1.0f);
  CHECK_THROWS_WITH(kernels::adamw_scalars(1e-3, 0.9, 0.999, 1e-8, 0.0, 0), Catch::Contains("step"));
}

// ---- trajectories against hand computations ----------------------------------------------
// Problem: minimise sum((p - c)^2); the gradient 2 (p - c) is computed by hand
// from the current parameter (float for the optimizer, double for PyTorch's
// algorithm in double).
TEST_CASE("AdamW trajectory: the documented float formula bit for bit, PyTorch's algorithm in double closely") {
  const std::vector<float> p0 = {0.5f, -1.25f, 2.0f, 0.0f, 3.0f};
  const std::vector<float> c = {1.0f, 1.0f, -1.0f, 0.25f, 3.0f};
  const double lr = 0.1, b1 = 0.9, b2 = 0.99, eps = 1e-8, wd = 0.05;
  const int steps = 6;

  Tensor p = tensor(p0).requires_grad_();
  nn::AdamWOptions o;
  o.lr = lr;
  o.betas = {b1, b2};
  o.eps = eps;
  o.weight_decay = wd;
  nn::AdamW opt({p}, o);

  // Hand float simulation of docs/optim.md's expressions.
  std::vector<float> pf = p0, mf(5, 0.0f), vf(5, 0.0f);
  // PyTorch's AdamW (torch.optim.AdamW documentation) in double.
  std::vector<double> pd(p0.begin(), p0.end()), md(5, 0.0), vd(5, 0.0);

  for (int t = 1; t <= steps; ++t) {
    std::vector<float> g(5);
    for (int i = 0; i < 5; ++i) g[size_t(i)] = 2.0f * (pf[size_t(i)] - c[size_t(i)]);
    p.set_grad(tensor(g));
    opt.step();

    const float beta1 = float(b1), beta2 = float(b2), omb1 = float(1 - b1), omb2 = float(1 - b2);
    const float decay = float(1 - lr * wd), step_size = float(lr / (1 - kernels::ipow(b1, t)));
    const float bc2_sqrt = float(std::sqrt(1 - kernels::ipow(b2, t))), epsf = float(eps);
    for (size_t i = 0; i < 5; ++i) {
      mf[i] = beta1 * mf[i] + omb1 * g[i];
      vf[i] = beta2 * vf[i] + omb2 * (g[i] * g[i]);
      const float denom = std::sqrt(vf[i]) / bc2_sqrt + epsf;
      pf[i] = pf[i] * decay - step_size * (mf[i] / denom);
    }
    for (size_t i = 0; i < 5; ++i) {
      const double gd = 2.0 * (pd[i] - double(c[i]));
      pd[i] -= lr * wd * pd[i];
      md[i] = b1 * md[i] + (1 - b1) * gd;
      vd[i] = b2 * vd[i] + (1 - b2) * gd * gd;
      const double mhat = md[i] / (1 - std::pow(b1, t)), vhat = vd[i] / (1 - std::pow(b2, t));
      pd[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
    INFO("step " << t);
    REQUIRE(same_bits(pf, p));
    auto pv = p.to_vector<float>();
    for (size_t i = 0; i < 5; ++i) CHECK(pv[i] == Approx(pd[i]).margin(1e-6).epsilon(1e-5));
  }
  auto sd = opt.state_dict();
  CHECK(sd[0].name == "step");
  CHECK(sd[0].tensor.item<int64_t>() == steps);
  CHECK(sd[1].name == "0.step");
  CHECK(sd[1].tensor.item<int64_t>() == steps);
  CHECK(sd[2].name == "0.exp_avg");
  CHECK(same_bits(mf, sd[2].tensor));
  CHECK(sd[3].name == "0.exp_avg_sq");
  CHECK(same_bits(vf, sd[3].tensor));
}

TEST_CASE("AdamW first step moves each coordinate by lr (PyTorch's known first-step property)") {
  // With m_hat = g and v_hat = g^2, the update is lr * g / (|g| + eps) = lr * sign(g).
  Tensor p = tensor({1.0f, 1.0f, 1.0f}).requires_grad_();
  nn::AdamWOptions o;
  o.lr = 0.5;
  o.weight_decay = 0.0;
  nn::AdamW opt({p}, o);
  p.set_grad(tensor({3.0f, -0.25f, 0.0f}));
  opt.step();
  auto v = p.to_vector<float>();
  CHECK(v[0] == Approx(0.5).epsilon(1e-6));
  CHECK(v[1] == Approx(1.5).epsilon(1e-6));
  CHECK(v[2] == 1.0f);
}

TEST_CASE("SGD trajectories: float formula bit for bit, PyTorch's algorithm in double closely") {
  struct Case {
    double momentum, dampening, wd;
    bool nesterov;
  };
  for (Case k : {Case{0, 0, 0, false}, Case{0, 0, 0.1, false}, Case{0.9, 0, 0, false}, Case{0.9, 0.3, 0.01, false},
                 Case{0.8, 0, 0.05, true}}) {
    const std::vector<float> p0 = {0.5f, -1.25f, 2.0f};
    const std::vector<float> c = {1.0f, 1.0f, -1.0f};
    const double lr = 0.05;
    Tensor p = tensor(p0).requires_grad_();
    nn::SGDOptions o;
    o.lr = lr;
    o.momentum = k.momentum;
    o.dampening = k.dampening;
    o.weight_decay = k.wd;
    o.nesterov = k.nesterov;
    nn::SGD opt({p}, o);
    std::vector<float> pf = p0, bf(3, 0.0f);
    std::vector<double> pd(p0.begin(), p0.end()), bd(3, 0.0);
    for (int t = 1; t <= 5; ++t) {
      std::vector<float> g(3);
      for (size_t i = 0; i < 3; ++i) g[i] = 2.0f * (pf[i] - c[i]);
      p.set_grad(tensor(g));
      opt.step();
      for (size_t i = 0; i < 3; ++i) {
        float d = g[i];
        if (k.wd != 0) d = d + float(k.wd) * pf[i];
        if (k.momentum != 0) {
          bf[i] = t == 1 ? d : float(k.momentum) * bf[i] + float(1 - k.dampening) * d;
          d = k.nesterov ? d + float(k.momentum) * bf[i] : bf[i];
        }
        pf[i] = pf[i] - float(lr) * d;
        // torch.optim.SGD's documented algorithm, in double.
        double gd = 2.0 * (pd[i] - double(c[i]));
        if (k.wd != 0) gd += k.wd * pd[i];
        if (k.momentum != 0) {
          bd[i] = t == 1 ? gd : k.momentum * bd[i] + (1 - k.dampening) * gd;
          gd = k.nesterov ? gd + k.momentum * bd[i] : bd[i];
        }
        pd[i] -= lr * gd;
      }
      INFO("momentum " << k.momentum << " dampening " << k.dampening << " wd " << k.wd << " nesterov "
                       << k.nesterov << " step " << t);
      REQUIRE(same_bits(pf, p));
      auto pv = p.to_vector<float>();
      for (size_t i = 0; i < 3; ++i) CHECK(pv[i] == Approx(pd[i]).margin(1e-6).epsilon(1e-5));
    }
  }
}

TEST_CASE("optimizer steps do not depend on the thread count") {
  auto run = [](int threads) {
    const int prev = num_threads();
    set_num_threads(threads);
    Tensor a = uniform({300001}, 1).requires_grad_(), b = uniform({517, 263}, 2).requires_grad_();
    nn::AdamW adam({a, b}, nn::AdamWOptions{});
    nn::SGDOptions so;
    so.momentum = 0.9;
    so.nesterov = true;
    Tensor c = uniform({200003}, 3).requires_grad_();
    nn::SGD sgd({c}, so);
    for (int t = 0; t < 3; ++t) {
      a.set_grad(uniform({300001}, 10 + t));
      b.set_grad(uniform({517, 263}, 20 + t, -1, 1, DType::BFloat16));
      c.set_grad(uniform({200003}, 30 + t));
      adam.step();
      sgd.step();
    }
    set_num_threads(prev);
    return std::vector<Tensor>{a.detach(), b.detach(), c.detach()};
  };
  auto one = run(1), two = run(2), three = run(3);
  for (size_t i = 0; i < one.size(); ++i) {
    CHECK(bitwise_equal(one[i], two[i]));
    CHECK(bitwise_equal(one[i], three[i]));
  }
}

// ---- groups -------------------------------------------------------------------------------------
TEST_CASE("default_param_groups: matrices decay, vectors do not, and the no-decay group really skips decay") {
  auto net = make_net(3);
  auto groups = nn::default_param_groups(*net, 0.1);
  REQUIRE(groups.size() == 2);
  std::vector<std::string> decay, no_decay;
  for (auto& nt : groups[0].params) decay.push_back(nt.name);
  for (auto& nt : groups[1].params) no_decay.push_back(nt.name);
  CHECK(decay == std::vector<std::string>{"layer.weight", "head.weight"});
  CHECK(no_decay == std::vector<std::string>{"layer.bias", "layer.scale", "head.bias", "head.scale"});
  CHECK(*groups[0].weight_decay == 0.1);
  CHECK(*groups[1].weight_decay == 0.0);

  // Zero gradients: AdamW's adaptive term is exactly 0, only decay acts.
  auto before = snapshot(net->state_dict());
  nn::AdamWOptions o;
  o.lr = 0.01;
  o.weight_decay = 0.5;  // the groups' own values win
  nn::AdamW opt(groups, o);
  for (auto& p : net->parameters()) p.set_grad(zeros(p.shape()));
  opt.step();
  const float decay_factor = float(1.0 - 0.01 * 0.1);
  for (auto& [name, t] : net->state_dict()) {
    const Tensor& b = std::find_if(before.begin(), before.end(), [&](auto& x) { return x.name == name; })->tensor;
    INFO(name);
    if (name.find("weight") != std::string::npos) {
      std::vector<float> expect = b.to_vector<float>();
      for (float& x : expect) x = x * decay_factor;
      CHECK(same_bits(expect, t));
      CHECK(!bitwise_equal(b, t));
    } else {
      CHECK(bitwise_equal(b, t.detach()));
    }
  }
}

TEST_CASE("default_param_groups lists a tied parameter once, under its first path") {
  auto net = make_net(3);
  net->head->weight = net->layer->weight;  // tie
  auto groups = nn::default_param_groups(*net, 0.1);
  REQUIRE(groups[0].params.size() == 1);
  CHECK(groups[0].params[0].name == "layer.weight");
  nn::AdamW opt(groups, nn::AdamWOptions{});  // no "appears twice"
  net_loss(*net, 0).backward();
  opt.step();
  CHECK(net->head->weight.is_same(net->layer->weight));
}

TEST_CASE("group lr_scale multiplies the optimizer's lr; set_lr changes every group") {
  auto a = make_net(5), b = make_net(5);
  auto ga = nn::default_param_groups(*a, 0.1);
  for (auto& g : ga) g.lr_scale = 0.5;
  nn::AdamWOptions oa;
  oa.lr = 0.02;
  nn::AdamW opt_a(ga, oa);
  nn::AdamWOptions ob;
  ob.lr = 0.01;
  nn::AdamW opt_b(nn::default_param_groups(*b, 0.1), ob);
  for (int s = 0; s < 3; ++s) {
    opt_a.zero_grad();
    net_loss(*a, s).backward();
    opt_a.step();
    opt_b.zero_grad();
    net_loss(*b, s).backward();
    opt_b.step();
  }
  auto sa = a->state_dict(), sb = b->state_dict();
  for (size_t i = 0; i < sa.size(); ++i) CHECK(bitwise_equal(sa[i].tensor.detach(), sb[i].tensor.detach()));
  opt_a.set_lr(0.04);
  CHECK(opt_a.lr() == 0.04);
}

TEST_CASE("parameters without a gradient are skipped: value, state and step count unchanged") {
  Tensor used = uniform({6}, 1).requires_grad_(), unused = uniform({6}, 2).requires_grad_();
  Tensor unused0 = unused.detach().clone();
  nn::AdamW opt(std::vector<NamedTensor>{{"used", used}, {"unused", unused}}, nn::AdamWOptions{});
  used.set_grad(ones({6}));
  opt.step();
  opt.step();
  CHECK(bitwise_equal(unused.detach(), unused0));
  std::map<std::string, Tensor> sd;
  for (auto& nt : opt.state_dict()) sd[nt.name] = nt.tensor;
  CHECK(sd.count("used.step") == 1);
  CHECK(sd.count("unused.step") == 0);
  CHECK(sd.count("unused.exp_avg") == 0);
  unused.set_grad(ones({6}));
  opt.step();
  sd.clear();
  for (auto& nt : opt.state_dict()) sd[nt.name] = nt.tensor;
  CHECK(sd["used.step"].item<int64_t>() == 3);
  CHECK(sd["unused.step"].item<int64_t>() == 1);  // its own bias correction starts at t = 1
  CHECK(sd["step"].item<int64_t>() == 3);
}

TEST_CASE("zero_grad drops the gradients or zeroes them in place") {
  Tensor p = uniform({4}, 1).requires_grad_();
  nn::SGD opt({p}, nn::SGDOptions{});
  p.set_grad(ones({4}));
  Tensor g = p.grad();
  opt.zero_grad(false);
  CHECK(p.grad().is_same(g));
  CHECK(p.grad().to_vector<float>() == std::vector<float>(4, 0.0f));
  opt.zero_grad();
  CHECK(!p.grad().defined());
}

TEST_CASE("low-precision gradients are widened exactly") {
  Tensor a = uniform({1000}, 1).requires_grad_(), b = a.detach().clone().requires_grad_();
  nn::AdamW oa({a}, nn::AdamWOptions{}), ob({b}, nn::AdamWOptions{});
  for (int t = 0; t < 3; ++t) {
    Tensor g16 = uniform({1000}, uint64_t(5 + t), -1, 1, DType::BFloat16);
    a.set_grad(g16);
    b.set_grad(g16.to(DType::Float32));
    oa.step();
    ob.step();
  }
  CHECK(bitwise_equal(a.detach(), b.detach()));
}

// ---- state_dict --------------------------------------------------------------------------------
namespace {

template <class Opt, class Options>
void check_resume(Options options) {
  const auto sched = nn::LrSchedule::cosine(0.05, 0.005, 3, 10);
  auto run = [&](Net& net, nn::Optimizer& opt, int from, int to) {
    for (int s = from; s < to; ++s) {
      opt.zero_grad();
      net_loss(net, s).backward();
      nn::clip_grad_norm_(net.parameters(), 0.5);
      opt.set_lr(sched.lr(s));
      opt.step();
    }
  };
  auto a = make_net(7);
  Opt opt_a(nn::default_param_groups(*a, 0.1), options);
  run(*a, opt_a, 0, 10);

  auto b = make_net(7);
  Opt opt_b(nn::default_param_groups(*b, 0.1), options);
  run(*b, opt_b, 0, 5);
  auto model_ckpt = snapshot(b->state_dict());
  auto opt_ckpt = snapshot(opt_b.state_dict());

  auto c = make_net(99);  // different values, same paths: state is keyed by path
  c->load_state_dict(model_ckpt);
  Opt opt_c(nn::default_param_groups(*c, 0.1), options);
  opt_c.load_state_dict(opt_ckpt);
  CHECK(opt_c.num_steps() == 5);
  run(*c, opt_c, 5, 10);

  auto sa = a->state_dict(), sc = c->state_dict();
  REQUIRE(sa.size() == sc.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    INFO(sa[i].name);
    CHECK(bitwise_equal(sa[i].tensor.detach(), sc[i].tensor.detach()));
  }
  auto oa = opt_a.state_dict(), oc = opt_c.state_dict();
  REQUIRE(oa.size() == oc.size());
  for (size_t i = 0; i < oa.size(); ++i) {
    INFO(oa[i].name);
    CHECK(oa[i].name == oc[i].name);
    CHECK(bitwise_equal(oa[i].tensor, oc[i].tensor));
  }
}

}  // namespace

TEST_CASE("state_dict round trip resumes bit for bit: 10 steps == 5 steps, save, load, 5 steps") {
  SECTION("AdamW") {
    nn::AdamWOptions o;
    o.betas = {0.9, 0.95};
    check_resume<nn::AdamW>(o);
  }
  SECTION("SGD with nesterov momentum") {
    nn::SGDOptions o;
    o.momentum = 0.9;
    o.nesterov = true;
    o.weight_decay = 0.01;
    check_resume<nn::SGD>(o);
  }
  SECTION("SGD with dampened momentum") {
    nn::SGDOptions o;
    o.momentum = 0.5;
    o.dampening = 0.5;
    check_resume<nn::SGD>(o);
  }
}

TEST_CASE("state_dict keys are parameter paths") {
  auto net = make_net(1);
  nn::AdamW opt(nn::default_param_groups(*net, 0.1), nn::AdamWOptions{});
  CHECK(opt.state_dict().size() == 1);  // only "step" before the first update
  net_loss(*net, 0).backward();
  opt.step();
  std::vector<std::string> keys;
  for (auto& nt : opt.state_dict()) keys.push_back(nt.name);
  CHECK(keys == std::vector<std::string>{"step",
                                         "layer.weight.step", "layer.weight.exp_avg", "layer.weight.exp_avg_sq",
                                         "head.weight.step", "head.weight.exp_avg", "head.weight.exp_avg_sq",
                                         "layer.bias.step", "layer.bias.exp_avg", "layer.bias.exp_avg_sq",
                                         "layer.scale.step", "layer.scale.exp_avg", "layer.scale.exp_avg_sq",
                                         "head.bias.step", "head.bias.exp_avg", "head.bias.exp_avg_sq",
                                         "head.scale.step", "head.scale.exp_avg", "head.scale.exp_avg_sq"});
  // Loading an empty state resets to fresh.
  opt.load_state_dict({});
  CHECK(opt.state_dict().size() == 1);
  CHECK(opt.num_steps() == 0);
}

TEST_CASE("load_state_dict errors name the key and write nothing") {
  auto net = make_net(1);
  nn::AdamW opt(nn::default_param_groups(*net, 0.1), nn::AdamWOptions{});
  net_loss(*net, 0).backward();
  opt.step();
  auto good = snapshot(opt.state_dict());
  auto with = [&](const std::string& key, Tensor t) {
    auto s = good;
    for (auto& nt : s)
      if (nt.name == key) nt.tensor = t;
    return s;
  };
  CHECK_THROWS_WITH(opt.load_state_dict(with("layer.weight.exp_avg", zeros({3, 4}))),
                    Catch::Contains("AdamW") && Catch::Contains("layer.weight.exp_avg") && Catch::Contains("[3, 4]"));
  auto extra = good;
  extra.push_back({"layer.nothing.exp_avg", zeros({4})});
  CHECK_THROWS_WITH(opt.load_state_dict(extra), Catch::Contains("unexpected key 'layer.nothing.exp_avg'"));
  auto bad_field = good;
  bad_field.push_back({"layer.bias.momentum_buffer", zeros({4})});
  CHECK_THROWS_WITH(opt.load_state_dict(bad_field), Catch::Contains("unexpected key 'layer.bias.momentum_buffer'"));
  auto missing = good;
  missing.erase(std::remove_if(missing.begin(), missing.end(),
                               [](auto& nt) { return nt.name == "head.bias.exp_avg_sq"; }),
                missing.end());
  CHECK_THROWS_WITH(opt.load_state_dict(missing), Catch::Contains("missing key 'head.bias.exp_avg_sq'"));
  CHECK_THROWS_WITH(opt.load_state_dict(with("head.bias.step", scalar_tensor(1.5))),
                    Catch::Contains("head.bias.step") && Catch::Contains("integer"));
  // check_state_dict throws exactly what load_state_dict would, and accepts what it accepts.
  CHECK_THROWS_WITH(opt.check_state_dict(missing), Catch::Contains("missing key 'head.bias.exp_avg_sq'"));
  CHECK_THROWS_WITH(opt.check_state_dict(bad_field), Catch::Contains("unexpected key 'layer.bias.momentum_buffer'"));
  CHECK_NOTHROW(opt.check_state_dict(good));
  // The failed loads changed nothing.
  auto now = opt.state_dict();
  REQUIRE(now.size() == good.size());
  for (size_t i = 0; i < now.size(); ++i) CHECK(bitwise_equal(now[i].tensor, good[i].tensor));
}

// ---- allocation ---------------------------------------------------------------------------------
TEST_CASE("optimizer steps allocate nothing in steady state") {
  auto net = make_net(11);
  nn::AdamW adam(nn::default_param_groups(*net, 0.1), nn::AdamWOptions{});
  const auto sched = nn::LrSchedule::cosine(1e-2, 1e-3, 2, 30);
  auto iteration = [&](int s) {
    adam.zero_grad();
    net_loss(*net, s).backward();
    nn::clip_grad_norm_(net->parameters(), 1.0);
    adam.set_lr(sched.lr(s));
    adam.step();
  };
  for (int s = 0; s < 4; ++s) iteration(s);  // state created at the first step, pool warmed
  Allocator* a = cpu_allocator();
  AllocatorStats before = a->stats();
  for (int s = 4; s < 20; ++s) iteration(s);
  AllocatorStats after = a->stats();
  // Without the pool (TESSEL_CPU_ALLOCATOR=system) every request reaches the
  // system; what follows (no requests at all) holds either way.
  if (cpu_allocator_pools()) CHECK(after.system_allocs == before.system_allocs);

  // step() itself requests no memory at all.
  net_loss(*net, 0).backward();
  before = a->stats();
  adam.step();
  CHECK(a->stats().requests == before.requests);

  nn::SGDOptions so;
  so.momentum = 0.9;
  nn::SGD sgd(net->parameters(), so);
  sgd.step();  // creates the momentum buffers
  before = a->stats();
  sgd.step();
  sgd.step();
  CHECK(a->stats().requests == before.requests);
}

// ---- gradient accumulation ------------------------------------------------------------------
// Documented usage (docs/optim.md): scale each micro-batch's mean loss by
// 1/n_micro and call backward() n_micro times; the engine adds into .grad.
TEST_CASE("accumulating 4 micro-batches of a mean loss matches the full-batch gradient") {
  auto net = make_net(21);
  Tensor x = uniform({16, 3}, 5), y = uniform({16, 4}, 6);
  auto loss_of = [&](const Tensor& xs, const Tensor& ys) { return mean(square(net->forward(xs) - ys)); };
  net->zero_grad();
  loss_of(x, y).backward();
  std::vector<Tensor> full;
  for (auto& p : net->parameters()) full.push_back(p.grad().clone());

  net->zero_grad();
  const int n_micro = 4;
  for (int k = 0; k < n_micro; ++k)
    (loss_of(x.narrow(0, 4 * k, 4), y.narrow(0, 4 * k, 4)) * (1.0 / n_micro)).backward();
  auto params = net->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    // Close, not bitwise: the micro-batch split changes the summation tree
    // (bitwise equality across splits is the bitwise mode's job).
    CHECK(allclose(params[i].grad(), full[i], 1e-5, 1e-6));
  }
}

// ---- errors ---------------------------------------------------------------------------------------
TEST_CASE("optimizer errors name the optimizer, the option and the value") {
  Tensor p = uniform({3}, 1).requires_grad_();
  auto adam = [&](auto set) {
    nn::AdamWOptions o;
    set(o);
    nn::AdamW opt({p}, o);
  };
  auto sgd = [&](auto set) {
    nn::SGDOptions o;
    set(o);
    nn::SGD opt({p}, o);
  };
  CHECK_THROWS_WITH(adam([](auto& o) { o.lr = -0.1; }), Catch::Contains("AdamW") && Catch::Contains("lr = -0.1"));
  CHECK_THROWS_WITH(adam([](auto& o) { o.betas = {1.0, 0.999}; }),
                    Catch::Contains("AdamW") && Catch::Contains("betas[0] = 1") && Catch::Contains("[0, 1)"));
  CHECK_THROWS_WITH(adam([](auto& o) { o.betas = {0.9, -0.5}; }),
                    Catch::Contains("AdamW") && Catch::Contains("betas[1] = -0.5"));
  CHECK_THROWS_WITH(adam([](auto& o) { o.eps = 0.0; }), Catch::Contains("AdamW") && Catch::Contains("eps = 0"));
  CHECK_THROWS_WITH(adam([](auto& o) { o.eps = -1e-8; }), Catch::Contains("AdamW") && Catch::Contains("eps = -1e-08"));
  CHECK_THROWS_WITH(adam([](auto& o) { o.weight_decay = -1; }),
                    Catch::Contains("AdamW") && Catch::Contains("weight_decay = -1"));
  CHECK_THROWS_WITH(sgd([](auto& o) { o.lr = -1; }), Catch::Contains("SGD") && Catch::Contains("lr = -1"));
  CHECK_THROWS_WITH(sgd([](auto& o) { o.momentum = -0.5; }),
                    Catch::Contains("SGD") && Catch::Contains("momentum = -0.5"));
  CHECK_THROWS_WITH(sgd([](auto& o) { o.nesterov = true; }),
                    Catch::Contains("SGD") && Catch::Contains("nesterov") && Catch::Contains("momentum = 0"));
  CHECK_THROWS_WITH(sgd([](auto& o) {
                      o.nesterov = true;
                      o.momentum = 0.9;
                      o.dampening = 0.1;
                    }),
                    Catch::Contains("SGD") && Catch::Contains("nesterov") && Catch::Contains("dampening = 0.1"));
  CHECK_THROWS_WITH(sgd([](auto& o) { o.dampening = 2; }), Catch::Contains("SGD") && Catch::Contains("dampening = 2"));

  nn::AdamW ok({p}, nn::AdamWOptions{});
  CHECK_THROWS_WITH(ok.set_lr(-3), Catch::Contains("AdamW") && Catch::Contains("lr = -3"));
  CHECK_THROWS_WITH(ok.set_lr(NAN), Catch::Contains("AdamW") && Catch::Contains("lr = nan"));

  // Parameters.
  Tensor q = uniform({2}, 2).requires_grad_();
  nn::ParamGroup g1{{{"p", p}}, std::nullopt, 1.0, "first"};
  nn::ParamGroup g2{{{"q", q}, {"p_again", p}}, std::nullopt, 1.0, "second"};
  CHECK_THROWS_WITH(nn::AdamW({g1, g2}, nn::AdamWOptions{}),
                    Catch::Contains("AdamW") && Catch::Contains("appears twice") && Catch::Contains("'p'") &&
                        Catch::Contains("'p_again'"));
  CHECK_THROWS_WITH(nn::SGD(std::vector<NamedTensor>{{"a", p}, {"a", q}}, nn::SGDOptions{}),
                    Catch::Contains("SGD") && Catch::Contains("share the path 'a'"));
  CHECK_THROWS_WITH(nn::AdamW(std::vector<NamedTensor>{{"idx", arange(4)}}, nn::AdamWOptions{}),
                    Catch::Contains("AdamW") && Catch::Contains("'idx'") && Catch::Contains("int64") &&
                        Catch::Contains("floating"));
  CHECK_THROWS_WITH(nn::AdamW(std::vector<NamedTensor>{{"h", zeros({2}, DType::BFloat16).requires_grad_()}},
                              nn::AdamWOptions{}),
                    Catch::Contains("AdamW") && Catch::Contains("'h'") && Catch::Contains("bfloat16") &&
                        Catch::Contains("float32"));
  CHECK_THROWS_WITH(nn::SGD(std::vector<NamedTensor>{{"frozen", zeros({2})}}, nn::SGDOptions{}),
                    Catch::Contains("SGD") && Catch::Contains("'frozen'") && Catch::Contains("require grad"));
  CHECK_THROWS_WITH(nn::SGD(std::vector<Tensor>{}, nn::SGDOptions{}),
                    Catch::Contains("SGD") && Catch::Contains("empty parameter list"));
  nn::ParamGroup neg{{{"q", q}}, -0.1, 1.0, "neg"};
  CHECK_THROWS_WITH(nn::AdamW({neg}, nn::AdamWOptions{}),
                    Catch::Contains("AdamW") && Catch::Contains("weight_decay = -0.1") && Catch::Contains("'neg'"));
  nn::ParamGroup scale{{{"q", q}}, std::nullopt, -1.0, ""};
  CHECK_THROWS_WITH(nn::AdamW({scale}, nn::AdamWOptions{}),
                    Catch::Contains("AdamW") && Catch::Contains("lr_scale = -1"));
  CHECK_THROWS_WITH(nn::default_param_groups(*make_net(1), -1.0),
                    Catch::Contains("default_param_groups") && Catch::Contains("weight_decay = -1"));

  // Gradients of the wrong dtype.
  nn::AdamW opt({q}, nn::AdamWOptions{});
  q.set_grad(zeros({2}, DType::Float64));
  CHECK_THROWS_WITH(opt.step(), Catch::Contains("AdamW") && Catch::Contains("'0'") && Catch::Contains("float64"));
}

// set_grad checks the global shape only: a sharded gradient of a plain
// parameter has a piece of another shape. The optimizer refuses it (the
// update kernels take the pieces as they are and check the state only).
TEST_CASE("optimizers refuse a gradient whose local piece is not shaped like the parameter") {
  const auto reports = on_ranks(2, [](int) {
    RankReport rep;
    MeshPtr mesh = Mesh::world({{"tp", 2}});
    Tensor w = ones({4}).requires_grad_();
    nn::SGD sgd(std::vector<Tensor>{w}, nn::SGDOptions{});
    nn::AdamW adamw(std::vector<Tensor>{w}, nn::AdamWOptions{});
    w.set_grad(distribute_tensor(ones({4}), mesh, {Shard(0)}));
    for (nn::Optimizer* opt : {static_cast<nn::Optimizer*>(&sgd), static_cast<nn::Optimizer*>(&adamw)}) {
      std::string msg;
      try {
        opt->step();
      } catch (const Error& e) {
        msg = e.what();
      }
      const std::string name = opt == &sgd ? "SGD" : "AdamW";
      rep.expect(msg.find(name + ": parameter '0'") != std::string::npos && msg.find("[2]") != std::string::npos,
                 name + " did not refuse the gradient: '" + msg + "'");
    }
    rep.expect(w.to_vector<float>() == std::vector<float>{1, 1, 1, 1}, "the parameter changed");
    return rep.str();
  });
  CHECK(first_failure(reports) == "");
}

// ---- timing ---------------------------------------------------------------------------------------
TEST_CASE("AdamW step timing, GPT-2 small (124M float32 parameters)", "[.bench]") {
  set_num_threads(2);
  std::vector<Dims> shapes = {{50257, 768}, {1024, 768}};
  for (int l = 0; l < 12; ++l) {
    for (Dims d : {Dims{768}, Dims{768}, Dims{2304, 768}, Dims{2304}, Dims{768, 768}, Dims{768}, Dims{768},
                   Dims{768}, Dims{3072, 768}, Dims{3072}, Dims{768, 3072}, Dims{768}})
      shapes.push_back(d);
  }
  shapes.push_back({768});
  shapes.push_back({768});
  std::vector<Tensor> params;
  int64_t total = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor p = full(shapes[i], 0.01).requires_grad_();
    p.set_grad(full(shapes[i], 1e-3));
    total += p.numel();
    params.push_back(p);
  }
  nn::AdamW opt(params, nn::AdamWOptions{});
  opt.step();  // creates the state
  for (int it = 0; it < 5; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    opt.step();
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    double gbs = double(total) * 28 / (ms * 1e6);  // read p, g, m, v; write p, m, v
    WARN("AdamW step over " << total << " parameters: " << ms << " ms (" << gbs << " GB/s effective)");
  }
  for (int it = 0; it < 3; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    double norm = nn::clip_grad_norm_(params, 1e9);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    WARN("grad norm over " << total << " parameters: " << ms << " ms (norm " << norm << ")");
  }
}
