// Sampling: the token rule (greedy, temperature, top-k) on known logits, the
// Philox draws it uses, and generation through a fake model whose outputs
// are known, deterministic for a seed.
#include <catch2/catch.hpp>

#include <cmath>

#include "autograd/api.h"
#include "runtime/error.h"
#include "train/sample.h"

using namespace tessel;
using namespace tessel::train;

namespace {

// A fake model over V tokens: at each position the logits favour
// next(id) = (3 id + 1) mod V by `margin` over every other token.
struct FakeModel {
  int64_t V;
  float margin;
  DType dtype = DType::Float32;
  std::vector<int64_t> seen_lengths, seen_batches;
  Tensor operator()(const Tensor& ids) {
    REQUIRE(ids.dim() == 2);
    REQUIRE(ids.dtype() == DType::Int64);
    const int64_t b = ids.size(0), t = ids.size(1);
    seen_lengths.push_back(t);
    seen_batches.push_back(b);
    auto v = ids.to_vector<int64_t>();
    std::vector<float> out(size_t(b * t * V), 0.0f);
    for (int64_t i = 0; i < b * t; ++i) out[size_t(i * V + (3 * v[i] + 1) % V)] = margin;
    return tensor(out, {b, t, V}).to(dtype);
  }
};

}  // namespace

TEST_CASE("sample_uniform is Philox's float64 draw at element n", "[sample]") {
  for (uint64_t seed : {0ull, 1ull, 12345ull}) {
    const PhiloxKey key{seed, stream_for("sample")};
    CHECK(sample_key(seed).stream == key.stream);
    for (int64_t n : {0, 1, 2, 3, 1000001}) {
      const Philox4 r = philox::block(key, uint64_t(n) / 2);
      const double u = philox::u01_double(r.v[2 * (n % 2)], r.v[2 * (n % 2) + 1]);
      CHECK(sample_uniform(seed, n) == u);
      CHECK((u >= 0 && u < 1));
    }
  }
  // The same values as tessel::rand in float64 at those elements.
  Tensor ref = rand({6}, sample_key(7), TensorOptions(DType::Float64));
  auto v = ref.to_vector<double>();
  for (int n = 0; n < 6; ++n) CHECK(sample_uniform(7, n) == v[n]);
}

TEST_CASE("pick_token: greedy, temperature and top-k on known logits", "[sample]") {
  // Greedy: the argmax, the lowest id on ties; u is ignored.
  CHECK(pick_token({0.1, 2.0, -1.0, 2.0}, 0.0, 0, 0.99) == 1);
  CHECK(pick_token({0.1, 2.0, -1.0, 2.0}, 0.0, 2, 0.5) == 1);
  // Uniform logits: the token is floor(u * V).
  for (double u : {0.0, 0.1, 0.2499, 0.25, 0.5, 0.74, 0.999}) {
    CHECK(pick_token({1, 1, 1, 1}, 1.0, 0, u) == int64_t(std::floor(u * 4)));
  }
  // Weights 1 : 3 at temperature 1: p(0) = 0.25.
  const double l3 = std::log(3.0);
  CHECK(pick_token({0, l3}, 1.0, 0, 0.24) == 0);
  CHECK(pick_token({0, l3}, 1.0, 0, 0.26) == 1);
  // Temperature 2 flattens: weights 3^-1/2 : 1, p(0) = 0.366.
  CHECK(pick_token({0, l3}, 2.0, 0, 0.30) == 0);
  CHECK(pick_token({0, l3}, 2.0, 0, 0.40) == 1);
  // A low temperature is nearly greedy.
  CHECK(pick_token({0, l3}, 0.01, 0, 0.999999) == 1);
  // top-k keeps the k largest (lowest ids on ties), sampled in id order.
  CHECK(pick_token({0, 3, 1, 3}, 1.0, 2, 0.49) == 1);
  CHECK(pick_token({0, 3, 1, 3}, 1.0, 2, 0.51) == 3);
  CHECK(pick_token({5, 1, 1, 1}, 1000.0, 2, 0.99) == 1);  // candidates {0, 1}: 2 and 3 are cut
  CHECK(pick_token({5, 1, 1, 1}, 1.0, 1, 0.99) == 0);
  // -inf logits are never drawn.
  CHECK(pick_token({-INFINITY, 0, -INFINITY}, 1.0, 0, 0.999) == 1);
  CHECK_THROWS_WITH(pick_token({0, NAN}, 1.0, 0, 0.5), Catch::Contains("NaN"));
  CHECK_THROWS_AS(pick_token({}, 1.0, 0, 0.5), Error);
}

TEST_CASE("pick_token's frequencies follow the softmax", "[sample]") {
  const std::vector<double> logits = {0, std::log(3.0), std::log(6.0), -2};  // top-3: weights 1, 3, 6
  std::vector<int> count(4, 0);
  const int n = 20000;
  for (int i = 0; i < n; ++i) count[pick_token(logits, 1.0, 3, sample_uniform(99, i))]++;
  CHECK(count[3] == 0);
  CHECK(count[0] / double(n) == Approx(0.1).margin(0.01));
  CHECK(count[1] / double(n) == Approx(0.3).margin(0.015));
  CHECK(count[2] / double(n) == Approx(0.6).margin(0.015));
}

TEST_CASE("generate: greedy follows the model's argmax", "[sample]") {
  FakeModel model{11, 10.0f};
  SampleOptions o;
  o.kv_cache = false;  // a fake model: no attention layers to cache (test_generate.cc has the cache)
  o.max_new_tokens = 8;
  o.temperature = 0;
  auto out = generate(std::ref(model), {1}, o);
  std::vector<int64_t> expect;
  int64_t id = 1;
  for (int i = 0; i < 8; ++i) expect.push_back(id = (3 * id + 1) % 11);
  CHECK(out == expect);  // 4, 2, 7, 0, 1, 4, 2, 7
  CHECK(expect == std::vector<int64_t>{4, 2, 7, 0, 1, 4, 2, 7});
  // The model saw the whole sequence each time: lengths 1..8.
  CHECK(model.seen_lengths == std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8});
  // max_context crops to the last tokens; bfloat16 logits work too.
  FakeModel cropped{11, 10.0f, DType::BFloat16};
  o.max_context = 3;
  CHECK(generate(std::ref(cropped), {5, 9, 1}, o) == expect);
  CHECK(cropped.seen_lengths == std::vector<int64_t>(8, 3));
}

TEST_CASE("generate: sampling is deterministic for a seed and uses draw n for token n", "[sample]") {
  FakeModel flat{16, 0.0f};  // all logits equal: token n = floor(u_n * 16)
  SampleOptions o;
  o.kv_cache = false;
  o.max_new_tokens = 40;
  o.temperature = 0.8;
  o.seed = 2024;
  auto a = generate(std::ref(flat), {0}, o);
  auto b = generate(std::ref(flat), {0}, o);
  CHECK(a == b);
  for (int64_t n = 0; n < 40; ++n) CHECK(a[n] == int64_t(std::floor(sample_uniform(2024, n) * 16)));
  o.seed = 2025;
  CHECK(generate(std::ref(flat), {0}, o) != a);
  // With a confident model and top_k = 1, sampling equals greedy.
  FakeModel sharp{11, 3.0f};
  o.top_k = 1;
  o.temperature = 1.5;
  o.max_new_tokens = 5;
  CHECK(generate(std::ref(sharp), {1}, o) == std::vector<int64_t>{4, 2, 7, 0, 1});
}

TEST_CASE("generate: errors", "[sample]") {
  SampleOptions o;
  o.max_new_tokens = 1;
  o.kv_cache = false;
  FakeModel model{5, 1.0f};
  CHECK_THROWS_WITH(generate(std::ref(model), {}, o), Catch::Contains("at least one token"));
  auto wrong = [](const Tensor& ids) { return zeros({ids.size(1), 5}); };
  CHECK_THROWS_WITH(generate(wrong, {1, 2}, o), Catch::Contains("[1, 2, V]"));
  CHECK_THROWS_WITH(generate_batch(std::ref(model), {{1}, {}}, o), Catch::Contains("prompt 1 is empty"));
  CHECK_THROWS_WITH(generate_batch(std::ref(model), {}, o), Catch::Contains("no prompts"));
  o.top_p = 0;
  CHECK_THROWS_WITH(generate(std::ref(model), {1}, o), Catch::Contains("top_p must be in (0, 1]"));
  // A function that runs no tessel attention cannot use the KV cache: an
  // error, never tokens computed from the last token alone.
  o.top_p = 1;
  o.kv_cache = true;
  CHECK_THROWS_WITH(generate(std::ref(model), {1, 2}, o), Catch::Contains("no layer used the KV cache"));
  // With the cache, prompt + new tokens - 1 must fit the context.
  o.max_context = 4;
  o.max_new_tokens = 3;
  CHECK_THROWS_WITH(generate(std::ref(model), {1, 2, 3}, o), Catch::Contains("exceeds the model's context of 4"));
}

TEST_CASE("pick_token: top-p keeps the smallest nucleus", "[sample]") {
  // Weights 1, 2, 3, 4 (total 10) at temperature 1.
  const std::vector<double> z = {0, std::log(2.0), std::log(3.0), std::log(4.0)};
  // top_p 0.4: {3} (4 >= 4). Any u picks 3.
  for (double u : {0.0, 0.5, 0.999}) CHECK(pick_token(z, 1.0, 0, u, 0.4) == 3);
  // top_p 0.5: {3, 2} (7 >= 5): weights 3 : 4 in id order 2, 3.
  CHECK(pick_token(z, 1.0, 0, 3.0 / 7 - 1e-9, 0.5) == 2);
  CHECK(pick_token(z, 1.0, 0, 3.0 / 7 + 1e-9, 0.5) == 3);
  // top_p 0.75: {3, 2, 1} (9 >= 7.5); 0 is never drawn.
  CHECK(pick_token(z, 1.0, 0, 0.0, 0.75) == 1);
  CHECK(pick_token(z, 1.0, 0, 2.0 / 9 + 1e-9, 0.75) == 2);
  // top_p 1 keeps all: u = 0 picks 0.
  CHECK(pick_token(z, 1.0, 0, 0.0, 1.0) == 0);
  // Combined with top-k: top-2 {2, 3}, then p 0.5 of 7: {3}.
  CHECK(pick_token(z, 1.0, 2, 0.0, 0.5) == 3);
  CHECK_THROWS_WITH(pick_token(z, 1.0, 0, 0.5, 1.5), Catch::Contains("top_p"));
}

TEST_CASE("sample_uniform: prompt p's stream starts at element p * 2^32", "[sample]") {
  const PhiloxKey key = sample_key(5);
  for (int64_t p : {0, 1, 7}) {
    for (int64_t n : {0, 1, 2, 9}) {
      const uint64_t e = (uint64_t(p) << 32) + uint64_t(n);
      const Philox4 r = philox::block(key, e / 2);
      CHECK(sample_uniform(5, n, p) == philox::u01_double(r.v[2 * (e % 2)], r.v[2 * (e % 2) + 1]));
    }
  }
  CHECK(sample_uniform(5, 3) == sample_uniform(5, 3, 0));
  CHECK_THROWS_AS(sample_uniform(5, int64_t(1) << 32), Error);
}

TEST_CASE("generate_batch: prompts of one length share a batch; each gets its own tokens", "[sample]") {
  FakeModel flat{16, 0.0f};
  SampleOptions o;
  o.kv_cache = false;
  o.max_new_tokens = 6;
  o.temperature = 1.0;
  o.seed = 11;
  const std::vector<std::vector<int64_t>> prompts = {{1, 2}, {3}, {4, 5}, {6}};
  auto out = generate_batch(std::ref(flat), prompts, o);
  REQUIRE(out.size() == 4);
  for (int64_t p = 0; p < 4; ++p) {
    REQUIRE(out[size_t(p)].size() == 6);
    for (int64_t n = 0; n < 6; ++n) CHECK(out[size_t(p)][size_t(n)] == int64_t(std::floor(sample_uniform(11, n, p) * 16)));
  }
  // Two groups of two: batches of 2 rows, the length-2 group first.
  CHECK(flat.seen_batches == std::vector<int64_t>(12, 2));
  CHECK(flat.seen_lengths == std::vector<int64_t>{2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6});
  // eos_id ends a prompt after it (kept); the others go on.
  FakeModel sharp{11, 10.0f};  // 1 -> 4 -> 2 -> 7 -> 0; 3 -> 10 -> 9 -> 6 -> 8
  o.temperature = 0;
  o.eos_id = 2;
  o.max_new_tokens = 4;
  auto ended = generate_batch(std::ref(sharp), {{1}, {3}}, o);
  CHECK(ended[0] == std::vector<int64_t>{4, 2});
  CHECK(ended[1] == std::vector<int64_t>{10, 9, 6, 8});
}

TEST_CASE("known_words: the share of a sample's words found in a reference text", "[sample]") {
  // Words: runs of >= 2 letters, lower-cased; the reference keeps those seen >= min_count times.
  const std::string ref = "The cat sat on the mat. THE CAT! Don't PANIC -- 42 towels, the cat.";
  const auto all = word_set(ref, 1);
  CHECK(all.count("the"));
  CHECK(all.count("don"));
  CHECK(!all.count("t"));  // one letter
  CHECK(!all.count("42"));
  CHECK(all.size() == 8);  // the cat sat on mat don panic towels
  const auto common = word_set(ref, 3);
  CHECK(common == std::unordered_set<std::string>{"the", "cat"});
  const KnownWords k = known_words("the Cat flurbed on a MAT", all);
  CHECK(k.words == 5);  // "a" is one letter
  CHECK(k.known == 4);  // the, cat, on, mat
  CHECK(k.share() == Approx(4.0 / 5));
  CHECK(known_words("the Cat flurbed on a MAT", common).known == 2);
  CHECK(known_words("12 -- !! a", all).words == 0);
  CHECK(known_words("", all).share() == 0.0);
}
