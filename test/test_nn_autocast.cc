// Mixed precision: which op runs in which dtype under AutocastScope, float32
// master weights and gradients, and a bf16 training step close to float32.
#include <catch2/catch.hpp>

#include <cmath>

#include "autograd/api.h"
#include "nn/nn.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;
using namespace tessel::nn;

TEST_CASE("AutocastScope sets and restores the compute dtype; cast helpers") {
  CHECK_FALSE(autocast_dtype().has_value());
  Tensor f32 = uniform({3}, 1), i64 = randint({3}, 1, 0, 5), f64 = uniform({3}, 1, -1, 1, DType::Float64);
  CHECK(cast_to_compute(f32).is_same(f32));
  {
    AutocastScope bf16(DType::BFloat16);
    CHECK(*autocast_dtype() == DType::BFloat16);
    CHECK(cast_to_compute(f32).dtype() == DType::BFloat16);
    CHECK(cast_to_compute(f64).dtype() == DType::BFloat16);
    CHECK(cast_to_compute(i64).is_same(i64));
    CHECK_FALSE(cast_to_compute(Tensor()).defined());
    {
      AutocastScope f16(DType::Float16);
      CHECK(*autocast_dtype() == DType::Float16);
      AutocastScope off(std::nullopt);
      CHECK_FALSE(autocast_dtype().has_value());
      CHECK(cast_to_compute(f32).is_same(f32));
    }
    CHECK(*autocast_dtype() == DType::BFloat16);
  }
  CHECK_FALSE(autocast_dtype().has_value());
  CHECK(cast_up(f32.to(DType::BFloat16)).dtype() == DType::Float32);
  CHECK(cast_up(f32.to(DType::Float16)).dtype() == DType::Float32);
  CHECK(cast_up(f64).is_same(f64));
  CHECK(cast_up(i64).is_same(i64));
  CHECK_THROWS_WITH(AutocastScope(DType::Int64), Catch::Contains("AutocastScope") && Catch::Contains("int64"));
}

TEST_CASE("autocast: Linear runs in bf16 (bitwise the cast composition), gradients come back float32") {
  auto l = make_model<Linear>(8, 5);
  l->reset_parameters(3);
  Tensor x = uniform({4, 8}, 1).requires_grad_();
  Tensor y;
  {
    AutocastScope bf16(DType::BFloat16);
    y = l->forward(x);
  }
  CHECK(y.dtype() == DType::BFloat16);
  CHECK(bitwise_equal(y, linear(x.to(DType::BFloat16), l->weight.to(DType::BFloat16), l->bias.to(DType::BFloat16))));
  sum(y).backward();
  CHECK(l->weight.dtype() == DType::Float32);
  CHECK(l->weight.grad().dtype() == DType::Float32);
  CHECK(l->bias.grad().dtype() == DType::Float32);
  CHECK(x.grad().dtype() == DType::Float32);
  // Each bias gradient is the sum over 4 rows of bf16 ones: exactly 4.
  for (float g : l->bias.grad().to_vector<float>()) CHECK(g == 4.0f);
}

TEST_CASE("autocast: norms compute in float32; embedding stays float32; activations keep their input dtype") {
  AutocastScope bf16(DType::BFloat16);
  Tensor xb = uniform({3, 6}, 2).to(DType::BFloat16);
  auto ln = make_model<LayerNorm>(6);
  auto rms = make_model<RMSNorm>(6);
  ln->reset_parameters(1);
  rms->reset_parameters(1);
  Tensor a = ln->forward(xb), b = rms->forward(xb);
  CHECK(a.dtype() == DType::Float32);
  CHECK(b.dtype() == DType::Float32);
  CHECK(bitwise_equal(a, layer_norm(xb.to(DType::Float32), {6}, ln->weight, ln->bias)));
  CHECK(bitwise_equal(b, rms_norm(xb.to(DType::Float32), {6}, rms->weight)));
  // A norm of a float32 input is untouched by autocast.
  Tensor x = uniform({3, 6}, 2);
  CHECK(bitwise_equal(ln->forward(x), layer_norm(x, {6}, ln->weight, ln->bias)));
  auto emb = make_model<Embedding>(5, 6);
  emb->reset_parameters(1);
  CHECK(emb->forward(randint({4}, 1, 0, 5)).dtype() == DType::Float32);
  CHECK(GELU().forward(xb).dtype() == DType::BFloat16);
  auto mlp = make_model<MLP>(6, 8);
  mlp->reset_parameters(1);
  CHECK(mlp->forward(x).dtype() == DType::BFloat16);
  auto sw = make_model<SwiGLU>(6, 8);
  sw->reset_parameters(1);
  CHECK(sw->forward(x).dtype() == DType::BFloat16);
  // Attention: projections, rope and sdpa in bf16.
  AttentionConfig c;
  c.dim = 6;
  c.n_head = 3;
  c.rope = true;
  c.max_seq_len = 4;
  auto at = make_model<Attention>(c);
  at->reset_parameters(1);
  CHECK(at->forward(x.reshape({1, 3, 6})).dtype() == DType::BFloat16);
  CHECK(at->rope_cos.dtype() == DType::Float32);
  // MoE: experts in bf16, routing and combine in float32.
  MoEConfig mc;
  mc.dim = 6;
  mc.hidden = 8;
  mc.num_experts = 3;
  auto moe = make_model<MoE>(mc);
  moe->reset_parameters(1);
  Tensor xm = uniform({40, 6}, 8);
  CHECK(moe->forward(xm).dtype() == DType::Float32);
  CHECK(moe->last_aux_loss().dtype() == DType::Float32);
  // The router runs in float32 outside autocast: same routing, same aux loss bits as without autocast.
  auto counts = moe->last_expert_counts();
  Tensor aux = moe->last_aux_loss();
  {
    AutocastScope off(std::nullopt);
    moe->forward(xm);
  }
  CHECK(moe->last_expert_counts() == counts);
  CHECK(bitwise_equal(moe->last_aux_loss(), aux));
}

namespace {

// A small LLaMA/Mixtral-like model touching every autocast rule.
struct Net : Module {
  std::shared_ptr<Embedding> emb;
  std::shared_ptr<RMSNorm> n1, n2, nf;
  std::shared_ptr<Attention> attn;
  std::shared_ptr<MoE> moe;
  std::shared_ptr<LayerNorm> n3;
  std::shared_ptr<MLP> mlp;
  std::shared_ptr<Linear> head;
  Net() : Module("Net") {
    AttentionConfig a;
    a.dim = 32;
    a.n_head = 4;
    a.n_kv_head = 2;
    a.rope = true;
    a.max_seq_len = 16;
    MoEConfig m;
    m.dim = 32;
    m.hidden = 48;
    m.num_experts = 4;
    emb = child("emb", std::make_shared<Embedding>(40, 32, init::normal(0.0, 0.5)));
    n1 = child("n1", std::make_shared<RMSNorm>(32));
    attn = child("attn", std::make_shared<Attention>(a));
    n2 = child("n2", std::make_shared<RMSNorm>(32));
    moe = child("moe", std::make_shared<MoE>(m));
    n3 = child("n3", std::make_shared<LayerNorm>(32));
    mlp = child("mlp", std::make_shared<MLP>(32));
    nf = child("nf", std::make_shared<RMSNorm>(32));
    head = child("head", std::make_shared<Linear>(32, 40, false));
  }
  Tensor loss(const Tensor& ids, const Tensor& targets) {
    Tensor h = emb->forward(ids);
    h = h + attn->forward(n1->forward(h));
    h = h + moe->forward(n2->forward(h));
    h = h + mlp->forward(n3->forward(h));
    Tensor logits = cast_up(head->forward(nf->forward(h)));
    return cross_entropy(logits, targets) + mul(moe->last_aux_loss(), 0.01);
  }
};

}  // namespace

TEST_CASE("autocast bf16: float32 master weights, float32 grads close to the float32 run") {
  auto net = make_model<Net>();
  net->reset_parameters(5);
  Tensor ids = randint({2, 12}, 1, 0, 40), tgt = randint({2, 12}, 2, 0, 40);
  std::vector<Tensor> before;
  for (auto& p : net->parameters()) before.push_back(p.clone());

  Tensor l32 = net->loss(ids, tgt);
  l32.backward();
  const std::vector<int64_t> routed = net->moe->last_expert_counts();
  std::vector<Tensor> g32;
  for (auto& p : net->parameters()) g32.push_back(p.grad());
  net->zero_grad();

  Tensor l16;
  {
    AutocastScope bf16(DType::BFloat16);
    l16 = net->loss(ids, tgt);
    l16.backward();
  }
  CHECK(l16.dtype() == DType::Float32);
  CHECK(net->moe->last_expert_counts() == routed);
  CHECK(l16.item<double>() == Approx(l32.item<double>()).epsilon(1e-2));
  auto named = net->named_parameters();
  for (size_t i = 0; i < named.size(); ++i) {
    INFO(named[i].name);
    const Tensor& p = named[i].tensor;
    CHECK(p.dtype() == DType::Float32);          // master weights stay float32...
    CHECK(bitwise_equal(p, before[i]));          // ...untouched
    Tensor g = p.grad();
    REQUIRE(g.defined() == g32[i].defined());    // same experts routed (routing is float32 and the logits close)
    if (!g.defined()) continue;
    CHECK(g.dtype() == DType::Float32);
    // Tolerance: max |g_bf16 - g_fp32| <= 3% of max |g_fp32|, per tensor. bf16 keeps 8 significant
    // bits (relative rounding 2^-9 ~ 0.2%); the worst tensor of this model is at ~1.2%.
    double scale = max_abs_diff(g32[i], zeros_like(g32[i]));
    double err = max_abs_diff(g, g32[i]);
    CHECK(err <= 0.03 * scale);
    CHECK(err > 0);  // the bf16 run really computed in bf16
  }
}
