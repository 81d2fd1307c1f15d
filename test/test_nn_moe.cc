// nn::MoE: against a naive per-token loop over the top-k experts, the
// load-balancing loss, expert counts, thread-count invariance, gradients, errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "autograd/api.h"
#include "nn/nn.h"
#include "runtime/threadpool.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;
using namespace tessel::nn;

namespace {

MoEConfig config(int64_t dim, int64_t hidden, int64_t E, int64_t k = 2) {
  MoEConfig c;
  c.dim = dim;
  c.hidden = hidden;
  c.num_experts = E;
  c.top_k = k;
  return c;
}

struct Reference {
  std::vector<double> out;     // [N, C]
  std::vector<int64_t> counts; // [E]
  double aux = 0;
};

// Token by token: router softmax in double, top-k by sorting, renormalised
// weights, each selected expert run on the token alone.
Reference naive(MoE& m, const Tensor& x2d) {
  const int64_t N = x2d.size(0), C = m.config.dim, E = m.config.num_experts, K = m.config.top_k;
  auto xs = x2d.to_vector<double>();
  auto wg = m.gate->weight.to_vector<double>();  // [E, C]
  Reference r;
  r.out.assign(size_t(N * C), 0.0);
  r.counts.assign(size_t(E), 0);
  std::vector<double> mean_p(size_t(E), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> p(static_cast<size_t>(E), 0.0);
    double mx = -INFINITY, z = 0;
    for (int64_t e = 0; e < E; ++e) {
      double s = 0;
      for (int64_t c = 0; c < C; ++c) s += xs[size_t(n * C + c)] * wg[size_t(e * C + c)];
      p[size_t(e)] = s;
      mx = std::max(mx, s);
    }
    for (auto& v : p) z += (v = std::exp(v - mx));
    for (int64_t e = 0; e < E; ++e) mean_p[size_t(e)] += p[size_t(e)] / z / double(N);
    std::vector<int64_t> order(static_cast<size_t>(E), 0);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[size_t(a)] > p[size_t(b)]; });
    double wsum = 0;
    for (int64_t j = 0; j < K; ++j) wsum += p[size_t(order[size_t(j)])];
    Tensor xn = x2d.narrow(0, n, 1);
    for (int64_t j = 0; j < K; ++j) {
      int64_t e = order[size_t(j)];
      r.counts[size_t(e)]++;
      auto y = m.experts->at<SwiGLU>(size_t(e))->forward(xn).to_vector<double>();
      for (int64_t c = 0; c < C; ++c) r.out[size_t(n * C + c)] += p[size_t(e)] / wsum * y[size_t(c)];
    }
  }
  for (int64_t e = 0; e < E; ++e) r.aux += double(r.counts[size_t(e)]) / double(N * K) * mean_p[size_t(e)];
  r.aux *= double(E);
  return r;
}

}  // namespace

TEST_CASE("MoE matches a naive per-token loop over the top-k experts") {
  for (int64_t k : {1, 2, 3}) {
    auto m = make_model<MoE>(config(8, 12, 4, k));
    m->reset_parameters(7);
    Tensor x = uniform({3, 5, 8}, 2, -2, 2);
    Tensor y = m->forward(x);
    CHECK(y.shape() == Dims{3, 5, 8});
    CHECK(y.dtype() == DType::Float32);
    Reference r = naive(*m, x.reshape({15, 8}));
    INFO("k = " << k);
    CHECK(m->last_expert_counts() == r.counts);
    CHECK(std::accumulate(r.counts.begin(), r.counts.end(), int64_t(0)) == 15 * k);
    auto got = y.to_vector<double>();
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - r.out[i]));
    CHECK(worst < 2e-6);
    Tensor aux = m->last_aux_loss();
    CHECK(aux.dim() == 0);
    CHECK(aux.dtype() == DType::Float32);
    CHECK(aux.item<double>() == Approx(r.aux).epsilon(1e-5));
  }
}

TEST_CASE("MoE: structure, names, 2-D input, the aux loss is 1 for uniform routing") {
  auto m = make_model<MoE>(config(4, 6, 3));
  CHECK(m->gate->weight.shape() == Dims{3, 4});
  CHECK_FALSE(m->gate->bias.defined());
  CHECK(m->experts->size() == 3);
  std::vector<std::string> names;
  for (auto& p : m->named_parameters()) names.push_back(p.name);
  CHECK(names == std::vector<std::string>{"gate.weight", "experts.0.w1.weight", "experts.0.w2.weight",
                                          "experts.0.w3.weight", "experts.1.w1.weight", "experts.1.w2.weight",
                                          "experts.1.w3.weight", "experts.2.w1.weight", "experts.2.w2.weight",
                                          "experts.2.w3.weight"});
  CHECK_FALSE(m->last_aux_loss().defined());
  CHECK(m->last_expert_counts().empty());
  m->reset_parameters(1);
  // A zero router: every probability 1/E, ties pick the lowest indices.
  {
    NoGradGuard g;
    m->gate->weight.zero_();
  }
  Tensor x = uniform({6, 4}, 3);
  Tensor y = m->forward(x);
  CHECK(y.shape() == Dims{6, 4});
  CHECK(m->last_expert_counts() == std::vector<int64_t>{6, 6, 0});
  // f = (1/2, 1/2, 0), P = (1/3, 1/3, 1/3): 3 * (1/6 + 1/6) = 1.
  CHECK(m->last_aux_loss().item<double>() == Approx(1.0).epsilon(1e-6));
  // The output is then the plain average of experts 0 and 1.
  Tensor ref = mul(add(m->experts->at<SwiGLU>(0)->forward(x), m->experts->at<SwiGLU>(1)->forward(x)), 0.5);
  CHECK(allclose(y, ref, 1e-6, 1e-7));
}

TEST_CASE("MoE: experts without tokens are skipped; the aux loss trains only the router") {
  auto m = make_model<MoE>(config(4, 6, 8));
  m->reset_parameters(2);
  Tensor x = uniform({1, 4}, 5);
  Tensor y = m->forward(x);
  const auto& counts = m->last_expert_counts();
  CHECK(std::count(counts.begin(), counts.end(), 1) == 2);
  sum(y).backward();
  for (int64_t e = 0; e < 8; ++e) {
    INFO("expert " << e);
    CHECK(m->experts->at<SwiGLU>(size_t(e))->w1->weight.grad().defined() == (counts[size_t(e)] > 0));
  }
  CHECK(m->gate->weight.grad().defined());
  m->zero_grad();
  m->forward(uniform({5, 4}, 6));
  m->last_aux_loss().backward();
  CHECK(m->gate->weight.grad().defined());
  CHECK(max_abs_diff(m->gate->weight.grad(), zeros({8, 4})) > 0);
  for (int64_t e = 0; e < 8; ++e) CHECK_FALSE(m->experts->at<SwiGLU>(size_t(e))->w2->weight.grad().defined());
}

TEST_CASE("MoE is bitwise invariant to the thread count (forward and gradients)") {
  const int saved = num_threads();
  auto run = [](int threads) {
    set_num_threads(threads);
    auto m = make_model<MoE>(config(16, 24, 4));
    m->reset_parameters(9);
    Tensor x = uniform({4, 9, 16}, 1).requires_grad_();
    Tensor y = m->forward(x);
    add(sum(mul(y, uniform({4, 9, 16}, 2))), m->last_aux_loss()).backward();
    std::vector<Tensor> out = {y, x.grad()};
    for (auto& p : m->parameters()) out.push_back(p.grad());
    return out;
  };
  auto a = run(1), b = run(3);
  set_num_threads(saved);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("tensor " << i);
    CHECK(bitwise_equal(a[i], b[i]));
  }
}

TEST_CASE("MoE: gradients (float64) of the output and of the aux loss") {
  ConstructionScope f64(kCPU, DType::Float64);
  auto m = make_model<MoE>(config(4, 5, 4));
  m->reset_parameters(3);
  auto e0 = m->experts->at<SwiGLU>(0), e2 = m->experts->at<SwiGLU>(2);
  CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return m->forward(in[0]); },
                  {grad_input_noncontig({2, 3, 4}, 4), m->gate->weight, e0->w1->weight, e2->w2->weight});
  CHECK_GRADCHECK(
      [&](const std::vector<Tensor>& in) {
        m->forward(in[0]);
        return m->last_aux_loss();
      },
      {grad_input({6, 4}, 5), m->gate->weight});
  CHECK(m->last_aux_loss().dtype() == DType::Float64);
}

TEST_CASE("MoE: constructor and forward errors") {
  CHECK_THROWS_WITH(MoE(config(4, 6, 2, 3)), Catch::Contains("MoE") &&
                                                 Catch::Contains("top_k must be in [1, num_experts], got top_k=3 "
                                                                 "with num_experts=2"));
  CHECK_THROWS_WITH(MoE(config(4, 6, 2, 0)), Catch::Contains("top_k=0"));
  CHECK_THROWS_WITH(MoE(config(0, 6, 2)), Catch::Contains("MoE") && Catch::Contains("dim=0, hidden=6, num_experts=2"));
  CHECK_THROWS_WITH(MoE(config(4, 0, 2)), Catch::Contains("hidden=0"));
  CHECK_THROWS_WITH(MoE(config(4, 6, 0, 1)), Catch::Contains("num_experts=0"));
  auto m = make_model<MoE>(config(4, 6, 2));
  m->reset_parameters(1);
  CHECK_THROWS_WITH(m->forward(uniform({3, 5}, 1)), Catch::Contains("MoE") && Catch::Contains("[..., 4]"));
  CHECK_THROWS_WITH(m->forward(empty({3, 4}, kMeta)), Catch::Contains("different devices"));
  CHECK_THROWS_WITH(m->forward(empty({0, 4})), Catch::Contains("no tokens"));
}

TEST_CASE("MoE on Meta (planning): a balanced routing stands in for the router; forget_last_forward clears it") {
  std::shared_ptr<MoE> m;
  {
    ConstructionScope meta(kMeta);
    m = make_model<MoE>(config(4, 6, 4));  // top-2 of 4 experts
  }
  Tensor y = m->forward(empty({6, 4}, kMeta));
  CHECK(y.device().is_meta());
  CHECK(y.shape() == Dims{6, 4});
  CHECK(m->last_expert_counts() == std::vector<int64_t>{3, 3, 3, 3});  // 12 slots, s mod 4
  CHECK(m->last_aux_loss().defined());
  CHECK(routing_choice(empty({3, 2}, TensorOptions(DType::Int64).with_device(kMeta)), 4) ==
        std::vector<int64_t>{0, 1, 2, 3, 0, 1});
  m->forget_last_forward();
  CHECK(!m->last_aux_loss().defined());
  CHECK(m->last_expert_counts().empty());
}
