// Forward context and shard-invariant dropout: a micro-batch's mask is the
// slice of the full-batch mask, steps and sites draw different masks, eval is
// the identity; the same for attention-probability dropout.
#include <catch2/catch.hpp>

#include "autograd/api.h"
#include "nn/nn.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;
using namespace tessel::nn;

TEST_CASE("ForwardScope sets and restores the thread-local context; validates it") {
  CHECK(forward_context().seed == 0);
  CHECK(forward_context().step == 0);
  CHECK(forward_context().batch_offset == 0);
  CHECK(forward_context().global_batch == -1);
  {
    ForwardScope outer({5, 7, 2, 8});
    CHECK(forward_context().seed == 5);
    CHECK(forward_context().step == 7);
    {
      ForwardScope inner({6, 1});
      CHECK(forward_context().seed == 6);
      CHECK(forward_context().global_batch == -1);
    }
    CHECK(forward_context().batch_offset == 2);
    CHECK(forward_context().global_batch == 8);
  }
  CHECK(forward_context().seed == 0);
  CHECK_THROWS_WITH(ForwardScope({0, 0, -1, 8}), Catch::Contains("ForwardScope") && Catch::Contains("-1 and 8"));
  CHECK_THROWS_WITH(ForwardScope({0, 0, 0, -2}), Catch::Contains("global_batch >= -1"));
  CHECK_THROWS_WITH(ForwardScope({0, 0, 3, -1}), Catch::Contains("batch_offset 3 needs global_batch"));
  CHECK(forward_context().seed == 0);  // a refused scope changes nothing
}

TEST_CASE("set_forward_context sets without a scope, returns the previous one, validates") {
  const ForwardContext prev = set_forward_context({9, 4});
  CHECK(prev.seed == 0);
  CHECK(forward_context().seed == 9);
  CHECK(forward_context().step == 4);
  {
    ForwardScope inner({1, 1});
    CHECK(forward_context().seed == 1);
  }
  CHECK(forward_context().seed == 9);  // a scope restores what was set
  CHECK_THROWS_WITH(set_forward_context({0, 0, 3, -1}), Catch::Contains("set_forward_context") &&
                                                            Catch::Contains("batch_offset 3 needs global_batch"));
  CHECK(forward_context().seed == 9);  // refused: unchanged
  set_forward_context(prev);
  CHECK(forward_context().seed == 0);
}

TEST_CASE("random_key and batch_block") {
  ForwardScope scope({9, 4, 3, 10});
  PhiloxKey k = random_key("layers.2.attn.attn_drop");
  CHECK(k.seed == 9);
  CHECK(k.stream == stream_for("layers.2.attn.attn_drop", {4}));
  GlobalBlock b = batch_block({2, 5, 6}, "X");
  CHECK(b.global_shape == Dims{10, 5, 6});
  CHECK(b.offset == Dims{3, 0, 0});
  CHECK(batch_block({}, "X").is_whole());
  CHECK_THROWS_WITH(batch_block({8, 5}, "Dropout 'x'"),
                    Catch::Contains("Dropout 'x'") && Catch::Contains("8 rows at batch_offset 3") &&
                        Catch::Contains("global_batch 10"));
  ForwardScope whole({9, 4});
  CHECK(batch_block({2, 5}, "X").is_whole());
}

TEST_CASE("Dropout: the mask is bernoulli(key {seed, stream_for(path, {step})}) at global coordinates") {
  auto seq = make_model<Sequential>(std::vector<std::shared_ptr<UnaryModule>>{std::make_shared<Dropout>(0.4),
                                                                               std::make_shared<Dropout>(0.4)});
  auto d0 = std::static_pointer_cast<Dropout>((*seq)[0]);
  Tensor x = uniform({8, 3, 5}, 1, 0.5, 1.5);
  ForwardScope scope({42, 3});
  Tensor y = d0->forward(x);
  CHECK(bitwise_equal(y, dropout(x, 0.4, PhiloxKey{42, stream_for("0", {3})})));
  // Zeros exactly where the mask says, kept values scaled by 1/(1-p).
  Tensor keep = bernoulli({8, 3, 5}, 0.6, PhiloxKey{42, stream_for("0", {3})});
  auto yv = y.to_vector<float>(), xv = x.to_vector<float>();
  auto kv = keep.to_vector<bool>();
  int64_t dropped = 0;
  for (size_t i = 0; i < yv.size(); ++i) {
    CHECK(yv[i] == (kv[i] ? xv[i] * float(1.0 / 0.6) : 0.0f));
    dropped += !kv[i];
  }
  CHECK(dropped > 30);
  CHECK(dropped < 70);
  // Another site (path "1") draws another mask; so does another step or seed.
  auto d1 = std::static_pointer_cast<Dropout>((*seq)[1]);
  CHECK_FALSE(bitwise_equal(d1->forward(x), y));
  {
    ForwardScope next({42, 4});
    CHECK_FALSE(bitwise_equal(d0->forward(x), y));
  }
  {
    ForwardScope other_seed({43, 3});
    CHECK_FALSE(bitwise_equal(d0->forward(x), y));
  }
  // Same (seed, step, site): the same mask (used once per forward, no call counter).
  CHECK(bitwise_equal(d0->forward(x), y));
}

TEST_CASE("Dropout: micro-batches and data-parallel ranks get their slice of the full-batch mask, bitwise") {
  auto d = make_model<Dropout>(0.3);
  Tensor x = uniform({12, 4, 6}, 2);
  Tensor full;
  {
    ForwardScope scope({7, 11});
    full = d->forward(x);
  }
  {
    ForwardScope scope({7, 11, 0, 12});  // explicit global batch = local batch
    CHECK(bitwise_equal(d->forward(x), full));
  }
  for (int64_t micro : {1, 3, 4, 6}) {
    for (int64_t off = 0; off < 12; off += micro) {
      ForwardScope scope({7, 11, off, 12});
      INFO("micro " << micro << " offset " << off);
      CHECK(bitwise_equal(d->forward(x.narrow(0, off, micro)), full.narrow(0, off, micro)));
    }
  }
  // Uneven split, rank order irrelevant.
  {
    ForwardScope scope({7, 11, 5, 12});
    CHECK(bitwise_equal(d->forward(x.narrow(0, 5, 7)), full.narrow(0, 5, 7)));
  }
  // A slice placed at the wrong offset gets another mask.
  {
    ForwardScope scope({7, 11, 0, 12});
    CHECK_FALSE(bitwise_equal(d->forward(x.narrow(0, 6, 6)), full.narrow(0, 6, 6)));
  }
  // Gradients follow the same mask.
  Tensor xg = x.narrow(0, 4, 4).detach().requires_grad_();
  {
    ForwardScope scope({7, 11, 4, 12});
    sum(d->forward(xg)).backward();
  }
  Tensor ones_full;
  {
    ForwardScope scope({7, 11});
    ones_full = d->forward(ones({12, 4, 6}));
  }
  CHECK(bitwise_equal(xg.grad(), ones_full.narrow(0, 4, 4)));
  // The local batch must fit in the global one.
  ForwardScope bad({7, 11, 10, 12});
  CHECK_THROWS_WITH(d->forward(x.narrow(0, 0, 4)),
                    Catch::Contains("Dropout ''") && Catch::Contains("4 rows at batch_offset 10") &&
                        Catch::Contains("global_batch 12"));
}

TEST_CASE("Dropout: eval mode and p = 0 are the identity; p = 1 zeroes; errors") {
  auto d = make_model<Dropout>(0.5);
  Tensor x = uniform({4, 4}, 3);
  d->eval();
  CHECK(d->forward(x).is_same(x));
  d->train();
  CHECK_FALSE(bitwise_equal(d->forward(x), x));
  auto z = make_model<Dropout>(0.0);
  CHECK(z->forward(x).is_same(x));
  auto one = make_model<Dropout>(1.0);
  for (float v : one->forward(x).to_vector<float>()) CHECK(v == 0.0f);
  CHECK(Dropout().p == 0.5);
  CHECK_THROWS_WITH(Dropout(1.01), Catch::Contains("Dropout") && Catch::Contains("p must be in [0, 1], got 1.01"));
  CHECK_THROWS_WITH(Dropout(-0.2), Catch::Contains("got -0.2"));
  CHECK_THROWS_WITH(Dropout(std::nan("")), Catch::Contains("p must be in [0, 1]"));
}

TEST_CASE("Attention dropout: site path + '.attn_drop', micro-batch outputs are slices of the full batch") {
  AttentionConfig c;
  c.dim = 8;
  c.n_head = 2;
  c.rope = true;
  c.max_seq_len = 8;
  c.attn_dropout = 0.25;
  c.resid_dropout = 0.1;
  auto list = make_model<ModuleList>(std::vector<std::shared_ptr<Module>>{std::make_shared<Attention>(c)});
  list->reset_parameters(3);
  auto a = list->at<Attention>(0);
  CHECK(a->resid_drop->path() == "0.resid_drop");
  Tensor x = uniform({6, 5, 8}, 4);
  Tensor full;
  {
    ForwardScope scope({1, 9});
    full = a->forward(x);
  }
  for (int64_t off : {0, 2, 4}) {
    ForwardScope scope({1, 9, off, 6});
    CHECK(bitwise_equal(a->forward(x.narrow(0, off, 2)), full.narrow(0, off, 2)));
  }
  // The probabilities' mask uses the key of site "0.attn_drop" at [B, H, T, T] global coordinates.
  {
    ForwardScope scope({1, 9, 2, 6});
    Tensor xs = x.narrow(0, 2, 2);
    const int64_t B = 2, T = 5, H = 2, D = 4;
    Tensor q = apply_rotary(linear(xs, a->wq->weight).reshape({B, T, H, D}), a->rope_cos, a->rope_sin);
    Tensor k = apply_rotary(linear(xs, a->wk->weight).reshape({B, T, H, D}), a->rope_cos, a->rope_sin);
    Tensor v = linear(xs, a->wv->weight).reshape({B, T, H, D});
    AttentionOptions o;
    o.dropout_p = 0.25;
    o.dropout_key = PhiloxKey{1, stream_for("0.attn_drop", {9})};
    o.dropout_block = GlobalBlock{{6, H, T, T}, {2, 0, 0, 0}};
    Tensor y = scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), o);
    y = linear(y.transpose(1, 2).reshape({B, T, H * D}), a->wo->weight);
    y = dropout(y, 0.1, PhiloxKey{1, stream_for("0.resid_drop", {9})}, true, GlobalBlock{{6, T, 8}, {2, 0, 0}});
    CHECK(bitwise_equal(a->forward(xs), y));
  }
  // Different steps differ; eval mode is deterministic and dropout-free.
  {
    ForwardScope scope({1, 10});
    CHECK_FALSE(bitwise_equal(a->forward(x), full));
  }
  a->eval();
  Tensor e1 = a->forward(x);
  {
    ForwardScope scope({1, 10});
    CHECK(bitwise_equal(a->forward(x), e1));
  }
  AttentionConfig nd = c;
  nd.attn_dropout = 0;
  nd.resid_dropout = 0;
  auto plain = make_model<Attention>(nd);
  plain->load_state_dict(a->state_dict());
  CHECK(bitwise_equal(plain->forward(x), e1));
}
