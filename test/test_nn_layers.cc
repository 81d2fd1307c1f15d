// Linear, Embedding, LayerNorm, RMSNorm, GELU, SiLU, MLP, SwiGLU: outputs
// equal the raw-op compositions bit for bit, float64 gradient checks, and
// every constructor / forward error.
#include <catch2/catch.hpp>

#include "autograd/api.h"
#include "nn/nn.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;
using namespace tessel::nn;

TEST_CASE("Linear == linear(x, W, b), bitwise; shapes; no-bias variant") {
  auto l = make_model<Linear>(5, 3);
  l->reset_parameters(1);
  CHECK(l->weight.shape() == Dims{3, 5});
  CHECK(l->bias.shape() == Dims{3});
  CHECK(l->in_features == 5);
  CHECK(l->out_features == 3);
  Tensor x = uniform({2, 4, 5}, 2);
  Tensor y = l->forward(x);
  CHECK(y.shape() == Dims{2, 4, 3});
  CHECK(bitwise_equal(y, linear(x, l->weight, l->bias)));
  CHECK(bitwise_equal((*l)(x), y));
  auto nb = make_model<Linear>(5, 3, false);
  nb->reset_parameters(1);
  CHECK_FALSE(nb->bias.defined());
  CHECK(nb->named_parameters().size() == 1);
  CHECK(bitwise_equal(nb->forward(x), matmul(x, nb->weight.t())));
}

TEST_CASE("Linear: gradients (float64) and errors") {
  ConstructionScope f64(kCPU, DType::Float64);
  auto l = make_model<Linear>(4, 3);
  l->reset_parameters(7);
  CHECK(l->weight.dtype() == DType::Float64);
  CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return l->forward(in[0]); },
                  {grad_input_noncontig({2, 3, 4}, 1), l->weight, l->bias});
  CHECK_THROWS_WITH(Linear(0, 3), Catch::Contains("Linear") && Catch::Contains("in_features=0, out_features=3") &&
                                      Catch::Contains("positive"));
  CHECK_THROWS_WITH(Linear(3, -1), Catch::Contains("out_features=-1"));
  CHECK_THROWS_WITH(l->forward(grad_input({2, 5}, 1)),
                    Catch::Contains("Linear") && Catch::Contains("[..., 4]") && Catch::Contains("[2, 5]"));
}

TEST_CASE("Embedding == embedding(W, ids); gradient; errors") {
  auto e = make_model<Embedding>(10, 4);
  e->reset_parameters(3);
  Tensor ids = randint({2, 3}, 5, 0, 10);
  Tensor y = e->forward(ids);
  CHECK(y.shape() == Dims{2, 3, 4});
  CHECK(bitwise_equal(y, embedding(e->weight, ids)));
  CHECK(bitwise_equal(e->forward(ids.to(DType::Int32)), y));
  {
    ConstructionScope f64(kCPU, DType::Float64);
    auto e64 = make_model<Embedding>(6, 3);
    e64->reset_parameters(3);
    Tensor rep = tensor(std::vector<int64_t>{1, 4, 1, 0, 5, 1}, Dims{2, 3});
    CHECK_GRADCHECK([&](const std::vector<Tensor>&) { return e64->forward(rep); }, {e64->weight});
  }
  CHECK_THROWS_WITH(Embedding(0, 4), Catch::Contains("Embedding") && Catch::Contains("num_embeddings=0"));
  CHECK_THROWS_WITH(Embedding(4, 0), Catch::Contains("embedding_dim=0"));
  CHECK_THROWS_WITH(e->forward(tensor(std::vector<int64_t>{3, 10})), Catch::Contains("embedding") &&
                                                                        Catch::Contains("10"));
}

TEST_CASE("LayerNorm == layer_norm, with and without affine / bias") {
  Tensor x = uniform({3, 4, 6}, 1, -2, 2);
  auto ln = make_model<LayerNorm>(6);
  ln->reset_parameters(1);
  {
    NoGradGuard g;
    ln->weight.copy_(uniform({6}, 2));
    ln->bias.copy_(uniform({6}, 3));
  }
  CHECK(bitwise_equal(ln->forward(x), layer_norm(x, {6}, ln->weight, ln->bias, 1e-5)));
  auto nob = make_model<LayerNorm>(6, 1e-3, true, false);
  nob->reset_parameters(1);
  CHECK(nob->named_parameters().size() == 1);
  CHECK_FALSE(nob->bias.defined());
  CHECK(bitwise_equal(nob->forward(x), layer_norm(x, {6}, nob->weight, Tensor(), 1e-3)));
  auto plain = make_model<LayerNorm>(6, 1e-5, false, false);
  CHECK(plain->named_parameters().empty());
  CHECK(bitwise_equal(plain->forward(x), layer_norm(x, {6})));
  CHECK(ln->dim == 6);
  CHECK(ln->eps == 1e-5);
}

TEST_CASE("LayerNorm / RMSNorm: gradients (float64)") {
  ConstructionScope f64(kCPU, DType::Float64);
  auto ln = make_model<LayerNorm>(5);
  auto rms = make_model<RMSNorm>(5, 1e-5);
  ln->reset_parameters(1);
  rms->reset_parameters(1);
  {
    NoGradGuard g;
    ln->weight.copy_(uniform({5}, 2));
    ln->bias.copy_(uniform({5}, 3));
    rms->weight.copy_(uniform({5}, 4));
  }
  CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return ln->forward(in[0]); },
                  {grad_input_noncontig({3, 5}, 5), ln->weight, ln->bias});
  CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return rms->forward(in[0]); },
                  {grad_input_noncontig({2, 2, 5}, 6), rms->weight});
}

TEST_CASE("RMSNorm == rms_norm; errors of both norms") {
  Tensor x = uniform({4, 8}, 1, -3, 3);
  auto rms = make_model<RMSNorm>(8);
  rms->reset_parameters(1);
  {
    NoGradGuard g;
    rms->weight.copy_(uniform({8}, 9));
  }
  CHECK(bitwise_equal(rms->forward(x), rms_norm(x, {8}, rms->weight, 1e-6)));
  CHECK(rms->eps == 1e-6);
  CHECK_THROWS_WITH(RMSNorm(0), Catch::Contains("RMSNorm") && Catch::Contains("dim must be positive, got 0"));
  CHECK_THROWS_WITH(RMSNorm(4, -1.0), Catch::Contains("RMSNorm") && Catch::Contains("eps"));
  CHECK_THROWS_WITH(LayerNorm(-2), Catch::Contains("LayerNorm") && Catch::Contains("got -2"));
  CHECK_THROWS_WITH(LayerNorm(4, std::nan("")), Catch::Contains("eps must be finite"));
  CHECK_THROWS_WITH(LayerNorm(4, 1e-5, false, true), Catch::Contains("bias=true needs affine=true"));
  CHECK_THROWS_WITH(rms->forward(uniform({4, 7}, 1)), Catch::Contains("RMSNorm") && Catch::Contains("[..., 8]"));
  CHECK_THROWS_WITH(LayerNorm(3).forward(uniform({4, 7}, 1)), Catch::Contains("LayerNorm") &&
                                                                  Catch::Contains("[4, 7]"));
}

TEST_CASE("GELU and SiLU modules") {
  Tensor x = uniform({3, 5}, 4, -3, 3);
  CHECK(bitwise_equal(GELU().forward(x), gelu(x, "tanh")));
  CHECK(bitwise_equal(GELU("none").forward(x), gelu(x, "none")));
  CHECK(GELU().approximate == "tanh");
  CHECK(bitwise_equal(SiLU().forward(x), silu(x)));
  CHECK_THROWS_WITH(GELU("fast"), Catch::Contains("GELU") && Catch::Contains("\"fast\""));
}

TEST_CASE("MLP == proj(gelu_tanh(fc(x))), dropout at the end; gradients; errors") {
  auto m = make_model<MLP>(6);
  m->reset_parameters(2);
  CHECK(m->hidden == 24);
  CHECK(m->fc->weight.shape() == Dims{24, 6});
  CHECK(m->proj->weight.shape() == Dims{6, 24});
  Tensor x = uniform({2, 3, 6}, 1);
  Tensor ref = linear(gelu(linear(x, m->fc->weight, m->fc->bias), "tanh"), m->proj->weight, m->proj->bias);
  CHECK(bitwise_equal(m->forward(x), ref));  // dropout p = 0
  auto md = make_model<MLP>(6, 10, false, 0.5);
  md->reset_parameters(2);
  CHECK_FALSE(md->fc->bias.defined());
  Tensor h = linear(gelu(linear(x, md->fc->weight), "tanh"), md->proj->weight);
  CHECK(bitwise_equal(md->forward(x), dropout(h, 0.5, random_key("drop"))));
  md->eval();
  CHECK(bitwise_equal(md->forward(x), h));
  {
    ConstructionScope f64(kCPU, DType::Float64);
    auto m64 = make_model<MLP>(3, 5);
    m64->reset_parameters(4);
    CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return m64->forward(in[0]); },
                    {grad_input_noncontig({2, 3}, 3), m64->fc->weight, m64->proj->bias});
  }
  CHECK_THROWS_WITH(MLP(0), Catch::Contains("MLP") && Catch::Contains("dim=0"));
  CHECK_THROWS_WITH(MLP(4, -3), Catch::Contains("MLP") && Catch::Contains("hidden=-3"));
  CHECK_THROWS_WITH(MLP(4, 8, true, 1.5), Catch::Contains("Dropout") && Catch::Contains("1.5"));
}

TEST_CASE("SwiGLU == w2(silu(w1 x) * w3 x); gradients; errors") {
  auto s = make_model<SwiGLU>(6, 10);
  s->reset_parameters(5);
  CHECK(s->w1->weight.shape() == Dims{10, 6});
  CHECK(s->w3->weight.shape() == Dims{10, 6});
  CHECK(s->w2->weight.shape() == Dims{6, 10});
  CHECK_FALSE(s->w1->bias.defined());
  Tensor x = uniform({2, 4, 6}, 3);
  Tensor ref = linear(mul(silu(linear(x, s->w1->weight)), linear(x, s->w3->weight)), s->w2->weight);
  CHECK(bitwise_equal(s->forward(x), ref));
  {
    ConstructionScope f64(kCPU, DType::Float64);
    auto s64 = make_model<SwiGLU>(3, 4);
    s64->reset_parameters(4);
    CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return s64->forward(in[0]); },
                    {grad_input_noncontig({3, 3}, 3), s64->w1->weight, s64->w2->weight, s64->w3->weight});
  }
  CHECK_THROWS_WITH(SwiGLU(0, 4), Catch::Contains("SwiGLU") && Catch::Contains("dim=0, hidden=4"));
  CHECK_THROWS_WITH(SwiGLU(4, 0), Catch::Contains("SwiGLU") && Catch::Contains("hidden=0"));
}
