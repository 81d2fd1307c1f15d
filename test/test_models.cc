// Reference models: shapes, parameter counts of the real configs (built on
// Meta), init reproducibility, gradients, learning, and config errors.
#include <catch2/catch.hpp>

#include <cmath>

#include "autograd/api.h"
#include "models/gpt.h"
#include "models/llama.h"
#include "nn/nn.h"
#include "runtime/allocator.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::models;
using namespace tessel::testing;

static int64_t count_on_meta(const std::string& arch, const std::string& name) {
  nn::ConstructionScope meta(kMeta);
  return build_model(model_config(arch, name))->num_parameters();
}

TEST_CASE("real configs have the published parameter counts (built on Meta, nothing allocated)") {
  AllocatorStats before = cpu_allocator()->stats();
  // GPT-2 124M with the vocabulary padded to 50304 (nanoGPT): 124,439,808 + 47 * 768.
  CHECK(count_on_meta("nanogpt", "gpt2-124m") == 124439808 + 47 * 768);
  CHECK(count_on_meta("llama", "llama-7b") == 6738415616);
  CHECK(count_on_meta("llama", "llama3-8b") == 8030261248);
  CHECK(count_on_meta("llama", "llama3-70b") == 70553706496);    // Llama 3.1 70B
  CHECK(count_on_meta("llama", "llama3-405b") == 405853388800);  // Llama 3.1 405B
  CHECK(count_on_meta("mixtral", "mixtral-8x7b") == 46702792704);
  AllocatorStats after = cpu_allocator()->stats();
  CHECK(after.current_bytes - before.current_bytes < (1 << 20));  // only small buffers, no parameters
}

TEST_CASE("tiny models: shapes, initial loss near ln(V), gradients for every parameter") {
  for (std::string arch : {"nanogpt", "llama", "mixtral"}) {
    ModelConfig c = model_config(arch, "tiny");
    auto m = make_language_model(c, 42);
    Tensor ids = randint(0, c.vocab_size, {2, 16}, PhiloxKey{1, 2});
    Tensor tgt = randint(0, c.vocab_size, {2, 16}, PhiloxKey{1, 3});
    Tensor logits = m->forward(ids);
    REQUIRE(logits.shape() == Dims{2, 16, c.vocab_size});
    Tensor loss = m->loss(logits, tgt);
    INFO(arch);
    CHECK(std::fabs(loss.item<float>() - std::log(double(c.vocab_size))) < 0.25);
    loss.backward();
    int64_t with_grad = 0, total = 0;
    for (auto& p : m->named_parameters()) {
      ++total;
      if (p.tensor.grad().defined()) ++with_grad;
    }
    if (arch == "mixtral") CHECK(with_grad >= total - 2 * c.num_experts * 3 * c.n_layer);  // idle experts
    else CHECK(with_grad == total);
  }
}

TEST_CASE("a model built on Meta and materialised equals the eager build bit for bit") {
  for (std::string arch : {"nanogpt", "llama", "mixtral"}) {
    ModelConfig c = model_config(arch, "tiny");
    auto eager = make_language_model(c, 7);
    std::shared_ptr<LanguageModel> lazy;
    {
      nn::ConstructionScope meta(kMeta);
      lazy = build_model(c);
    }
    lazy->materialize(kCPU);
    lazy->reset_parameters(7);
    auto on_device = make_language_model(c, 7, kCPU);  // (the same through the device overload)
    auto a = eager->state_dict(), b = lazy->state_dict(), d = on_device->state_dict();
    REQUIRE(a.size() == b.size());
    REQUIRE(a.size() == d.size());
    for (size_t i = 0; i < a.size(); ++i) {
      INFO(a[i].name);
      CHECK(a[i].name == b[i].name);
      CHECK(bitwise_equal(a[i].tensor, b[i].tensor));
      CHECK(bitwise_equal(a[i].tensor, d[i].tensor));
    }
    Tensor ids = randint(0, c.vocab_size, {1, 8}, PhiloxKey{3, 4});
    CHECK(bitwise_equal(eager->forward(ids), lazy->forward(ids)));
  }
}

TEST_CASE("parameter paths follow the documented names") {
  nn::ConstructionScope meta(kMeta);
  auto gpt = build_model(model_config("nanogpt", "tiny"));
  auto names = [](const LanguageModel& m) {
    std::vector<std::string> v;
    for (auto& p : m.named_parameters()) v.push_back(p.name);
    return v;
  };
  auto g = names(*gpt);
  CHECK(g.front() == "wte.weight");
  CHECK(std::find(g.begin(), g.end(), "layers.1.attn.wq.weight") != g.end());
  CHECK(std::find(g.begin(), g.end(), "layers.0.mlp.proj.bias") != g.end());
  auto l = names(*build_model(model_config("llama", "tiny")));
  CHECK(std::find(l.begin(), l.end(), "layers.1.ffn.w3.weight") != l.end());
  CHECK(l.back() == "output.weight");
  auto x = names(*build_model(model_config("mixtral", "tiny")));
  CHECK(std::find(x.begin(), x.end(), "layers.0.ffn.experts.3.w2.weight") != x.end());
  CHECK(std::find(x.begin(), x.end(), "layers.0.ffn.gate.weight") != x.end());
}

TEST_CASE("tiny NanoGPT learns a repeating sequence") {
  ModelConfig c = model_config("nanogpt", "tiny");
  auto m = make_language_model(c, 1);
  std::vector<int64_t> seq;
  for (int i = 0; i < 33; ++i) seq.push_back((i * 7) % 13);
  Tensor all = tensor(seq);
  Tensor x = all.narrow(0, 0, 32).unsqueeze(0), y = all.narrow(0, 1, 32).unsqueeze(0);
  float first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    Tensor loss = m->loss(m->forward(x), y);
    if (step == 0) first = loss.item<float>();
    last = loss.item<float>();
    m->zero_grad();
    loss.backward();
    NoGradGuard g;
    for (auto& p : m->parameters()) p.sub_(p.grad(), 0.1);
  }
  CHECK(last < first * 0.5);
}

TEST_CASE("model and config errors") {
  CHECK_THROWS_WITH(model_config("nanogpt", "gpt5"), Catch::Contains("unknown nanogpt config 'gpt5'") &&
                                                         Catch::Contains("gpt2-124m"));
  CHECK_THROWS_WITH(model_config("bert", "tiny"), Catch::Contains("unknown model 'bert'"));
  ModelConfig c = model_config("llama", "tiny");
  c.n_head = 3;
  CHECK_THROWS_WITH(c.resolved(), Catch::Contains("n_head 3 does not divide dim 64"));
  c = model_config("llama", "tiny");
  c.n_kv_head = 3;
  CHECK_THROWS_WITH(c.resolved(), Catch::Contains("n_kv_head 3 does not divide n_head 4"));
  c = model_config("mixtral", "tiny");
  c.top_k = 9;
  CHECK_THROWS_WITH(c.resolved(), Catch::Contains("top_k 9"));
  auto m = make_language_model(model_config("nanogpt", "tiny"), 1);
  CHECK_THROWS_WITH(m->forward(zeros({1, 65}, DType::Int64)), Catch::Contains("exceeds the context 64"));
}
