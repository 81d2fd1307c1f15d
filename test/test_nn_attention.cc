// nn::Attention: equals the raw q/k/v/rope/sdpa/o composition bit for bit,
// RoPE tables and position offsets, causality, gradients, errors.
#include <catch2/catch.hpp>

#include <cmath>

#include "autograd/api.h"
#include "nn/nn.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;
using namespace tessel::nn;

namespace {

AttentionConfig config(int64_t dim, int64_t n_head, int64_t n_kv_head = 0, bool rope = false) {
  AttentionConfig c;
  c.dim = dim;
  c.n_head = n_head;
  c.n_kv_head = n_kv_head;
  c.rope = rope;
  c.max_seq_len = rope ? 32 : 0;
  return c;
}

// The same computation from raw ops.
Tensor manual(const Attention& a, const Tensor& x, int64_t offset) {
  const AttentionConfig& c = a.config;
  const int64_t B = x.size(0), T = x.size(1), H = c.n_head, Hkv = c.n_kv_head, D = c.head_dim;
  Tensor q = linear(x, a.wq->weight, a.wq->bias).reshape({B, T, H, D});
  Tensor k = linear(x, a.wk->weight, a.wk->bias).reshape({B, T, Hkv, D});
  Tensor v = linear(x, a.wv->weight, a.wv->bias).reshape({B, T, Hkv, D});
  if (c.rope) {
    auto [cos, sin] = rope_cache(c.max_seq_len, D, c.rope_theta, x.dtype());
    q = apply_rotary(q, cos, sin, offset, c.rope_interleaved);
    k = apply_rotary(k, cos, sin, offset, c.rope_interleaved);
  }
  Tensor y = scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2));
  return linear(y.transpose(1, 2).reshape({B, T, H * D}), a.wo->weight, a.wo->bias);
}

}  // namespace

TEST_CASE("Attention == manual q/k/v/rope/sdpa/o composition, bitwise (MHA, GQA, bias, rope, offsets)") {
  struct Case {
    int64_t dim, n_head, n_kv_head;
    bool rope, bias, interleaved;
    int64_t head_dim, offset;
  };
  for (Case cs : {Case{16, 4, 0, false, true, false, 0, 0}, Case{16, 4, 2, true, false, false, 0, 0},
                  Case{16, 4, 1, true, false, true, 0, 5}, Case{12, 2, 2, true, true, false, 8, 9}}) {
    AttentionConfig c = config(cs.dim, cs.n_head, cs.n_kv_head, cs.rope);
    c.bias = cs.bias;
    c.rope_interleaved = cs.interleaved;
    c.head_dim = cs.head_dim;
    auto a = make_model<Attention>(c);
    a->reset_parameters(11);
    INFO(a->extra_repr());
    Tensor x = uniform({2, 7, cs.dim}, 3);
    Tensor y = a->forward(x, cs.offset);
    CHECK(y.shape() == Dims{2, 7, cs.dim});
    CHECK(bitwise_equal(y, manual(*a, x, cs.offset)));
    if (cs.offset == 0) CHECK(bitwise_equal((*a)(x), y));
  }
}

TEST_CASE("Attention: resolved config, projection shapes, RoPE buffers") {
  AttentionConfig c = config(16, 4, 2, true);
  auto a = make_model<Attention>(c);
  CHECK(a->config.head_dim == 4);
  CHECK(a->config.n_kv_head == 2);
  CHECK(a->wq->weight.shape() == Dims{16, 16});
  CHECK(a->wk->weight.shape() == Dims{8, 16});
  CHECK(a->wv->weight.shape() == Dims{8, 16});
  CHECK(a->wo->weight.shape() == Dims{16, 16});
  CHECK_FALSE(a->wq->bias.defined());
  auto [cos, sin] = rope_cache(32, 4, 10000.0);
  CHECK(bitwise_equal(a->rope_cos, cos));
  CHECK(bitwise_equal(a->rope_sin, sin));
  CHECK(a->state_dict().size() == 4);  // tables are not persistent
  // Explicit head_dim decouples the width from dim / n_head.
  AttentionConfig w = config(10, 4, 2);
  w.head_dim = 6;
  auto b = make_model<Attention>(w);
  CHECK(b->wq->weight.shape() == Dims{24, 10});
  CHECK(b->wk->weight.shape() == Dims{12, 10});
  CHECK(b->wo->weight.shape() == Dims{10, 24});
  // A float64 build computes float64 tables; init_buffers recomputes them.
  ConstructionScope f64(kCPU, DType::Float64);
  AttentionConfig r = config(8, 2, 0, true);
  r.rope_theta = 500.0;
  auto d = make_model<Attention>(r);
  CHECK(bitwise_equal(d->rope_cos, rope_cache(32, 4, 500.0, DType::Float64).first));
  d->rope_cos = zeros({32, 2}, DType::Float64);
  d->init_buffers();
  CHECK(bitwise_equal(d->rope_cos, rope_cache(32, 4, 500.0, DType::Float64).first));
}

TEST_CASE("Attention is causal and RoPE makes it depend on relative positions only") {
  auto a = make_model<Attention>(config(16, 4, 2, true));
  a->reset_parameters(3);
  Tensor x = uniform({1, 6, 16}, 1);
  Tensor y = a->forward(x);
  // Changing the last token leaves the earlier outputs untouched.
  Tensor x2 = cat({x.narrow(1, 0, 5), uniform({1, 1, 16}, 2)}, 1);
  Tensor y2 = a->forward(x2);
  CHECK(bitwise_equal(y.narrow(1, 0, 5), y2.narrow(1, 0, 5)));
  CHECK_FALSE(bitwise_equal(y.narrow(1, 5, 1), y2.narrow(1, 5, 1)));
  // Shifting every position by the same offset keeps the scores (up to rounding).
  Tensor ys = a->forward(x, 17);
  CHECK_FALSE(bitwise_equal(ys, y));
  CHECK(allclose(ys, y, 1e-4, 1e-5));
  // Without RoPE the offset changes nothing at all.
  auto n = make_model<Attention>(config(16, 4, 2, false));
  n->reset_parameters(3);
  CHECK(bitwise_equal(n->forward(x, 17), n->forward(x)));
}

TEST_CASE("Attention: gradients (float64) through GQA, RoPE and dropout") {
  ConstructionScope f64(kCPU, DType::Float64);
  AttentionConfig c = config(8, 4, 2, true);
  c.bias = true;
  auto a = make_model<Attention>(c);
  a->reset_parameters(5);
  CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return a->forward(in[0], 2); },
                  {grad_input_noncontig({2, 3, 8}, 1), a->wq->weight, a->wk->bias, a->wv->weight, a->wo->weight});
  AttentionConfig d = config(4, 2, 1, false);
  d.attn_dropout = 0.3;
  d.resid_dropout = 0.2;
  auto ad = make_model<Attention>(d);
  ad->reset_parameters(5);
  ForwardScope scope({1, 2, 0, -1});
  CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return ad->forward(in[0]); },
                  {grad_input({2, 4, 4}, 2), ad->wk->weight});
}

TEST_CASE("Attention: constructor and forward errors name the layer, values and constraint") {
  CHECK_THROWS_WITH(Attention(config(0, 2)), Catch::Contains("Attention") && Catch::Contains("dim=0, n_head=2"));
  CHECK_THROWS_WITH(Attention(config(8, 0)), Catch::Contains("Attention") && Catch::Contains("n_head=0"));
  CHECK_THROWS_WITH(Attention(config(10, 4)), Catch::Contains("Attention") &&
                                                  Catch::Contains("dim (10) must be divisible by n_head (4)"));
  CHECK_THROWS_WITH(Attention(config(12, 6, 4)),
                    Catch::Contains("Attention") && Catch::Contains("n_head (6) must be a multiple of n_kv_head (4)"));
  CHECK_THROWS_WITH(Attention(config(8, 2, -1)), Catch::Contains("n_kv_head=-1"));
  AttentionConfig odd = config(6, 2, 0, true);
  CHECK_THROWS_WITH(Attention(odd), Catch::Contains("rope needs an even head_dim, got head_dim=3"));
  AttentionConfig nolen = config(8, 2, 0, true);
  nolen.max_seq_len = 0;
  CHECK_THROWS_WITH(Attention(nolen), Catch::Contains("rope needs max_seq_len > 0"));
  AttentionConfig theta = config(8, 2, 0, true);
  theta.rope_theta = 0;
  CHECK_THROWS_WITH(Attention(theta), Catch::Contains("rope_theta must be positive"));
  AttentionConfig drop = config(8, 2);
  drop.attn_dropout = 1.5;
  CHECK_THROWS_WITH(Attention(drop), Catch::Contains("attn_dropout=1.5"));
  drop.attn_dropout = 0;
  drop.resid_dropout = -0.1;
  CHECK_THROWS_WITH(Attention(drop), Catch::Contains("resid_dropout=-0.1"));

  auto a = make_model<Attention>(config(8, 2, 0, true));
  CHECK_THROWS_WITH(a->forward(uniform({2, 8}, 1)), Catch::Contains("Attention") && Catch::Contains("[B, T, 8]"));
  CHECK_THROWS_WITH(a->forward(uniform({1, 2, 6}, 1)), Catch::Contains("[1, 2, 6]"));
  CHECK_THROWS_WITH(a->forward(uniform({1, 4, 8}, 1), 30),
                    Catch::Contains("positions 30..33 exceed the RoPE tables (max_seq_len 32)"));
  CHECK_THROWS_WITH(a->forward(uniform({1, 4, 8}, 1), -1), Catch::Contains("position_offset must be >= 0"));
}
