// Incremental decoding with nn::KVCache on the shipped models: the cached
// forward gives the full forward's logits, generation with the cache gives
// the tokens generation without it gives, batches give each prompt's own
// tokens, and misuse of the cache is an error.
#include <catch2/catch.hpp>

#include "autograd/api.h"
#include "models/language_model.h"
#include "nn/kv_cache.h"
#include "runtime/error.h"
#include "tessel.h"
#include "train/sample.h"

using namespace tessel;
using namespace tessel::models;

namespace {

std::vector<int64_t> random_ids(int64_t n, int64_t vocab, uint64_t seed) {
  return randint(0, vocab, {n}, PhiloxKey{seed, 17}).to_vector<int64_t>();
}

// Largest |a - b| / (1 + |b|) over the elements.
double max_rel_diff(const Tensor& a, const Tensor& b) {
  auto x = a.to_vector<double>(), y = b.to_vector<double>();
  REQUIRE(x.size() == y.size());
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]) / (1 + std::abs(y[i])));
  return m;
}

}  // namespace

TEST_CASE("KV cache: the cached forward computes the full forward's logits", "[generate]") {
  for (std::string arch : {"nanogpt", "llama", "mixtral"}) {
    INFO(arch);
    auto m = make_language_model(model_config(arch, "tiny"), 3);
    m->eval();
    NoGradGuard no_grad;
    const auto ids = random_ids(9, m->config.vocab_size, 1);
    const Tensor full = m->forward(tensor(ids, {1, 9}));  // [1, 9, V]
    nn::KVCache cache(9);
    cache.head_last_position = false;  // every position's logits, to compare them all
    nn::KVCacheScope scope(cache);
    // A prompt of 4, a chunk of 3 (the masked path), then 1 and 1.
    int64_t at = 0;
    for (int64_t t : {4, 3, 1, 1}) {
      std::vector<int64_t> part(ids.begin() + at, ids.begin() + at + t);
      const Tensor got = m->forward(tensor(part, {1, t}));
      cache.advance(t);
      CHECK(cache.num_entries() == size_t(m->config.n_layer));
      CHECK(max_rel_diff(got, full.narrow(1, at, t).contiguous()) < 1e-5);
      at += t;
    }
    CHECK(cache.position() == 9);
    // By default the head computes only the last position: the same bits as
    // that row of the full output (a prompt on an empty cache runs the same
    // ops as the plain forward).
    nn::KVCache last_only(9);
    nn::KVCacheScope scope2(last_only);
    const Tensor got = m->forward(tensor(ids, {1, 9}));
    REQUIRE(got.shape() == Dims{1, 1, m->config.vocab_size});
    CHECK(got.to_vector<float>() == full.narrow(1, 8, 1).contiguous().to_vector<float>());
  }
}

TEST_CASE("KV cache: generation gives the tokens of full recomputation, for one prompt and a batch",
          "[generate]") {
  for (std::string arch : {"nanogpt", "llama", "mixtral"}) {
    INFO(arch);
    auto m = make_language_model(model_config(arch, "tiny"), 5);
    m->eval();
    auto logits_fn = [&](const Tensor& ids) { return m->forward(ids); };
    train::SampleOptions o;
    o.max_new_tokens = 12;
    o.max_context = m->config.max_seq_len;
    const std::vector<std::vector<int64_t>> prompts = {random_ids(6, m->config.vocab_size, 1),
                                                       random_ids(6, m->config.vocab_size, 2),
                                                       random_ids(3, m->config.vocab_size, 3)};
    for (double temperature : {0.0, 0.9}) {
      INFO("temperature " << temperature);
      o.temperature = temperature;
      o.top_k = temperature > 0 ? 20 : 0;
      o.top_p = temperature > 0 ? 0.9 : 1.0;
      o.kv_cache = true;
      const auto cached = train::generate_batch(logits_fn, prompts, o);
      o.kv_cache = false;
      const auto recomputed = train::generate_batch(logits_fn, prompts, o);
      CHECK(cached == recomputed);
      // Each prompt of the batch alone: the same tokens (its own sampling stream).
      o.kv_cache = true;
      CHECK(train::generate(logits_fn, prompts[0], o) == cached[0]);
      for (const auto& c : cached) CHECK(c.size() == 12);
    }
  }
}

TEST_CASE("KV cache: training mode ignores it; misuse is an error", "[generate]") {
  auto m = make_language_model(model_config("llama", "tiny"), 7);
  const auto ids = random_ids(4, m->config.vocab_size, 1);
  nn::KVCache cache(8);
  {
    nn::KVCacheScope scope(cache);
    m->train();
    (void)m->forward(tensor(ids, {1, 4}));  // a training forward: nothing cached
    CHECK(cache.num_entries() == 0);
    m->eval();
    NoGradGuard no_grad;
    (void)m->forward(tensor(ids, {1, 4}));
    // The same positions again before advance(): the layer would hold 8.
    CHECK_THROWS_WITH(m->forward(tensor(ids, {1, 4})), Catch::Contains("appended twice at position 0"));
  }
  CHECK(nn::current_kv_cache() == nullptr);  // the scope restored the previous (none)
  nn::KVCache fresh(6);
  nn::KVCacheScope scope(fresh);
  m->eval();
  NoGradGuard no_grad;
  (void)m->forward(tensor(ids, {1, 4}));
  CHECK_THROWS_WITH(fresh.advance(2), Catch::Contains("holds 4 positions, not 2"));
  fresh.advance(4);
  // Beyond the capacity.
  CHECK_THROWS_WITH(m->forward(tensor(ids, {1, 4})), Catch::Contains("exceed the capacity 6"));
  // Another batch size than the first forward's.
  fresh.reset();
  (void)m->forward(tensor(ids, {1, 4}));
  fresh.advance(4);
  CHECK_THROWS_WITH(m->forward(tensor(std::vector<int64_t>{1, 2}, {2, 1})), Catch::Contains("do not match the cached"));
  CHECK_THROWS_WITH(nn::KVCache(0), Catch::Contains("capacity must be positive"));
}

namespace {
// docs/your_model.md section 7's model, as a user writes it against tessel.h.
struct TinyLM : nn::StagedModel {
  std::shared_ptr<nn::Embedding> tok;
  std::shared_ptr<nn::Linear> out;
  std::vector<std::shared_ptr<nn::UnaryModule>> stack;
  TinyLM() : nn::StagedModel("TinyLM") {
    tok = child("tok", std::make_shared<nn::Embedding>(256, 32));
    nn::AttentionConfig ac;
    ac.dim = 32;
    ac.n_head = 4;
    ac.rope = true;
    ac.max_seq_len = 64;
    stack.push_back(child("attn", std::make_shared<nn::Attention>(ac)));
    out = child("out", std::make_shared<nn::Linear>(32, 256));
  }
  Tensor embed(const Tensor& ids) override { return (*tok)(ids); }
  const std::vector<std::shared_ptr<nn::UnaryModule>>& blocks() const override { return stack; }
  Tensor head(const Tensor& h) override { return (*out)(nn::head_positions(*this, h)); }
  Tensor stage_loss(const Tensor& logits, const Tensor& y) override { return cross_entropy(logits, y); }
  Tensor example_input() const override { return empty({1, 1}, TensorOptions(DType::Int64).with_device(kMeta)); }
};
}  // namespace

TEST_CASE("KV cache: a user's own model through tessel::Run gets the cache, and the same tokens", "[generate]") {
  std::shared_ptr<TinyLM> model;
  {
    nn::ConstructionScope meta(kMeta);
    model = nn::make_model<TinyLM>();
  }
  RunOptions options;
  options.seed = 4;
  auto run = parallelize(model, adamw(), options);
  run.model().eval();
  auto fn = [&](const Tensor& ids) { return run.forward(ids); };
  train::SampleOptions o;
  o.max_new_tokens = 16;
  o.temperature = 0.8;
  o.top_k = 40;
  o.max_context = 64;
  const auto cached = train::generate_batch(fn, {{72, 105}, {84, 104}}, o);
  o.kv_cache = false;
  CHECK(train::generate_batch(fn, {{72, 105}, {84, 104}}, o) == cached);
  CHECK(cached[0].size() == 16);
}
