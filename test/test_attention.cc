// Scaled dot-product attention: against a per-head reference, GQA, masks, gradients.
#include <catch2/catch.hpp>

#include <cmath>

#include "autograd/api.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

// Plain double-precision attention for one (batch, head).
static std::vector<double> ref_head(const std::vector<double>& q, const std::vector<double>& k,
                                    const std::vector<double>& v, int64_t T, int64_t D, bool causal) {
  std::vector<double> out(size_t(T * D), 0.0);
  for (int64_t i = 0; i < T; ++i) {
    std::vector<double> s(size_t(T), -INFINITY);
    double m = -INFINITY;
    for (int64_t j = 0; j < T; ++j) {
      if (causal && j > i) continue;
      double d = 0;
      for (int64_t c = 0; c < D; ++c) d += q[size_t(i * D + c)] * k[size_t(j * D + c)];
      s[size_t(j)] = d / std::sqrt(double(D));
      m = std::max(m, s[size_t(j)]);
    }
    double z = 0;
    for (auto& x : s) z += (x = std::exp(x - m));
    for (int64_t j = 0; j < T; ++j)
      for (int64_t c = 0; c < D; ++c) out[size_t(i * D + c)] += s[size_t(j)] / z * v[size_t(j * D + c)];
  }
  return out;
}

TEST_CASE("attention matches a plain reference, with grouped-query heads") {
  const int64_t B = 2, Hq = 4, Hkv = 2, T = 7, D = 8;
  Tensor q = uniform({B, Hq, T, D}, 1, -1, 1, DType::Float64);
  Tensor k = uniform({B, Hkv, T, D}, 2, -1, 1, DType::Float64);
  Tensor v = uniform({B, Hkv, T, D}, 3, -1, 1, DType::Float64);
  for (bool causal : {true, false}) {
    AttentionOptions o;
    o.causal = causal;
    Tensor y = scaled_dot_product_attention(q, k, v, o);
    REQUIRE(y.shape() == Dims{B, Hq, T, D});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hq; ++h) {
        auto r = ref_head(q.select(0, b).select(0, h).to_vector<double>(),
                          k.select(0, b).select(0, h / 2).to_vector<double>(),
                          v.select(0, b).select(0, h / 2).to_vector<double>(), T, D, causal);
        auto got = y.select(0, b).select(0, h).to_vector<double>();
        for (size_t i = 0; i < r.size(); ++i) REQUIRE(got[i] == Approx(r[i]).epsilon(1e-12));
      }
  }
}

TEST_CASE("attention: explicit mask, dropout determinism, errors") {
  Tensor q = uniform({1, 2, 4, 8}, 4), k = uniform({1, 2, 4, 8}, 5), v = uniform({1, 2, 4, 8}, 6);
  AttentionOptions o;
  o.causal = false;
  o.mask = tril(ones({4, 4}, DType::Bool));
  CHECK(allclose(scaled_dot_product_attention(q, k, v, o), scaled_dot_product_attention(q, k, v)));
  AttentionOptions d;
  d.dropout_p = 0.3;
  d.dropout_key = PhiloxKey{7, 9};
  CHECK(bitwise_equal(scaled_dot_product_attention(q, k, v, d), scaled_dot_product_attention(q, k, v, d)));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, uniform({1, 3, 4, 8}, 7), uniform({1, 3, 4, 8}, 8)),
                    Catch::Contains("multiple of key/value heads"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, uniform({1, 2, 5, 8}, 7), uniform({1, 2, 5, 8}, 8)),
                    Catch::Contains("causal"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q.squeeze(0), k, v), Catch::Contains("[B, H, T, D]"));
}

TEST_CASE("gradients of attention (GQA, causal)") {
  CHECK_GRADCHECK(
      [](const std::vector<Tensor>& in) { return scaled_dot_product_attention(in[0], in[1], in[2]); },
      {grad_input({1, 4, 5, 3}, 10), grad_input({1, 2, 5, 3}, 11), grad_input_noncontig({1, 2, 5, 3}, 12)});
}

TEST_CASE("attention dropout with a GlobalBlock: a batch slice gets its slice of the full-batch result") {
  Tensor q = uniform({4, 2, 5, 8}, 21), k = uniform({4, 2, 5, 8}, 22), v = uniform({4, 2, 5, 8}, 23);
  AttentionOptions o;
  o.dropout_p = 0.4;
  o.dropout_key = PhiloxKey{3, 5};
  Tensor full = scaled_dot_product_attention(q, k, v, o);
  for (int64_t off : {0, 1, 3}) {
    AttentionOptions s = o;
    s.dropout_block = GlobalBlock{{4, 2, 5, 5}, {off, 0, 0, 0}};
    Tensor part = scaled_dot_product_attention(q.narrow(0, off, 1), k.narrow(0, off, 1), v.narrow(0, off, 1), s);
    CHECK(bitwise_equal(part, full.narrow(0, off, 1)));
  }
  // Without the block, a slice draws the mask of batch row 0 instead.
  Tensor unplaced = scaled_dot_product_attention(q.narrow(0, 3, 1), k.narrow(0, 3, 1), v.narrow(0, 3, 1), o);
  CHECK_FALSE(bitwise_equal(unplaced, full.narrow(0, 3, 1)));
}
