// nn::Module behaviour through real layers: paths, named parameters, state
// dicts, train/eval, apply, describe, set_init, containers, meta construction.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>

#include "autograd/api.h"
#include "nn/nn.h"
#include "runtime/allocator.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;
using namespace tessel::nn;

namespace {

// A pre-norm transformer block and a tiny language model, as model code would write them.
struct Block : Module {
  std::shared_ptr<LayerNorm> ln1, ln2;
  std::shared_ptr<Attention> attn;
  std::shared_ptr<MLP> mlp;
  explicit Block(int64_t C) : Module("Block") {
    AttentionConfig a;
    a.dim = C;
    a.n_head = 2;
    a.rope = true;
    a.max_seq_len = 16;
    ln1 = child("ln1", std::make_shared<LayerNorm>(C));
    attn = child("attn", std::make_shared<Attention>(a));
    ln2 = child("ln2", std::make_shared<LayerNorm>(C));
    mlp = child("mlp", std::make_shared<MLP>(C));
  }
  Tensor forward(const Tensor& x) {
    Tensor h = x + attn->forward(ln1->forward(x));
    return h + mlp->forward(ln2->forward(h));
  }
};

struct TinyModel : Module {
  std::shared_ptr<Embedding> emb;
  std::shared_ptr<ModuleList> layers;
  std::shared_ptr<LayerNorm> ln_f;
  std::shared_ptr<Linear> head;
  TinyModel(int64_t V, int64_t C, int64_t L) : Module("TinyModel") {
    emb = child("emb", std::make_shared<Embedding>(V, C));
    layers = child("layers", std::make_shared<ModuleList>());
    for (int64_t i = 0; i < L; ++i) layers->push_back(std::make_shared<Block>(C));
    ln_f = child("ln_f", std::make_shared<LayerNorm>(C));
    head = child("head", std::make_shared<Linear>(C, V, /*bias=*/false));
  }
  Tensor forward(const Tensor& ids) {
    Tensor h = emb->forward(ids);
    for (const auto& l : *layers) h = std::static_pointer_cast<Block>(l)->forward(h);
    return head->forward(ln_f->forward(h));
  }
};

std::vector<std::string> names_of(const std::vector<NamedTensor>& v) {
  std::vector<std::string> out;
  for (const auto& n : v) out.push_back(n.name);
  return out;
}

}  // namespace

TEST_CASE("named_parameters: dotted paths in registration order") {
  auto m = make_model<TinyModel>(11, 8, 2);
  std::vector<std::string> block = {"ln1.weight",    "ln1.bias",      "attn.wq.weight", "attn.wk.weight",
                                    "attn.wv.weight", "attn.wo.weight", "ln2.weight",     "ln2.bias",
                                    "mlp.fc.weight",  "mlp.fc.bias",    "mlp.proj.weight", "mlp.proj.bias"};
  std::vector<std::string> expect = {"emb.weight"};
  for (int l = 0; l < 2; ++l)
    for (const auto& b : block) expect.push_back("layers." + std::to_string(l) + "." + b);
  expect.push_back("ln_f.weight");
  expect.push_back("ln_f.bias");
  expect.push_back("head.weight");
  CHECK(names_of(m->named_parameters()) == expect);
  CHECK(names_of(m->layers->named_parameters(/*recurse=*/false)).empty());
  CHECK(names_of(m->head->named_parameters()) == std::vector<std::string>{"weight"});
  // 11*8 + 2 * (8+8 + 4*64 + 8+8 + 32*8+32 + 8*32+8) + 8+8 + 11*8
  CHECK(m->num_parameters() == 88 + 2 * (16 + 256 + 16 + 288 + 264) + 16 + 88);
  CHECK(m->parameters().size() == expect.size());
  // RoPE tables are (non-persistent) buffers.
  CHECK(names_of(m->named_buffers()) == std::vector<std::string>{"layers.0.attn.rope_cos", "layers.0.attn.rope_sin",
                                                                 "layers.1.attn.rope_cos", "layers.1.attn.rope_sin"});
  // Weight decay flags: matrices yes, vectors no.
  for (const auto& [path, slot] : m->parameter_slots()) CHECK(slot->weight_decay == (slot->tensor->dim() >= 2));
  // for_each_parameter_slot: the same slots in the same order, without paths.
  std::vector<const ParameterSlot*> visited;
  m->for_each_parameter_slot([&](const ParameterSlot& slot) { visited.push_back(&slot); });
  const auto slots = m->parameter_slots();
  REQUIRE(visited.size() == slots.size());
  for (size_t i = 0; i < slots.size(); ++i) CHECK(visited[i] == slots[i].second);
}

TEST_CASE("buffer_slots: paths and the module's members, recursively or the module's own") {
  auto m = make_model<TinyModel>(11, 8, 2);
  const auto slots = m->buffer_slots();
  const auto named = m->named_buffers();
  // for_each_buffer_slot: the same slots in the same order, without paths;
  // storage(): the storage each one's tensor holds.
  std::vector<const BufferSlot*> visited;
  m->for_each_buffer_slot([&](const BufferSlot& slot) { visited.push_back(&slot); });
  REQUIRE(visited.size() == slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    CHECK(visited[i] == slots[i].second);
    CHECK(visited[i]->storage() == slots[i].second->tensor->storage().get());
  }
  REQUIRE(slots.size() == named.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    CHECK(slots[i].first == named[i].name);
    CHECK(slots[i].second->tensor->is_same(named[i].tensor));
    CHECK_FALSE(slots[i].second->persistent);  // RoPE tables
  }
  CHECK(m->buffer_slots(/*recurse=*/false).empty());
  auto& attn = m->submodule("layers.1.attn");
  const auto own = attn.buffer_slots(/*recurse=*/false);
  REQUIRE(own.size() == 2);
  CHECK(own[0].first == "rope_cos");
  // A slot is the member itself: replacing the tensor through it is what the module sees.
  Tensor meta = empty(own[0].second->tensor->shape(), TensorOptions().with_device(kMeta));
  *own[0].second->tensor = meta;
  CHECK(m->named_buffers()[2].name == "layers.1.attn.rope_cos");
  CHECK(m->named_buffers()[2].tensor.is_same(meta));
}

TEST_CASE("paths: make_model assigns them, path() assigns lazily, re-parenting updates them") {
  auto m = make_model<TinyModel>(11, 8, 2);
  CHECK(m->path().empty());
  CHECK(m->submodule("layers.1.attn.wq").path() == "layers.1.attn.wq");
  CHECK(m->layers->path() == "layers");
  CHECK(m->submodule("layers.0").parent() == m->layers.get());

  // Lazily: built with make_shared (no assign_paths), asked from a leaf.
  auto lazy = std::make_shared<TinyModel>(11, 8, 1);
  CHECK(lazy->submodule("layers.0.mlp.drop").path() == "layers.0.mlp.drop");

  // A block built alone is its own root; attached, it takes its new path.
  auto blk = std::make_shared<Block>(8);
  CHECK(blk->attn->path() == "attn");
  m->layers->push_back(blk);
  CHECK(blk->attn->path() == "layers.2.attn");
  CHECK(blk->path() == "layers.2");
  m->assign_paths();  // harmless again
  CHECK(blk->attn->wo->path() == "layers.2.attn.wo");

  // One parent per module; no cycles.
  CHECK_THROWS_WITH(m->layers->push_back(blk),
                    Catch::Contains("ModuleList") && Catch::Contains("already has a parent at 'layers.2'"));
  auto list = std::make_shared<ModuleList>();
  auto inner = std::make_shared<ModuleList>();
  list->push_back(inner);
  CHECK_THROWS_WITH(inner->push_back(list), Catch::Contains("cycle"));

  // A destroyed parent releases its children.
  auto orphan_parent = std::make_shared<ModuleList>();
  auto orphan = std::make_shared<Linear>(2, 2);
  orphan_parent->push_back(orphan);
  CHECK(orphan->path() == "0");
  orphan_parent.reset();
  CHECK(orphan->parent() == nullptr);
  orphan->assign_paths();
  CHECK(orphan->path().empty());
}

TEST_CASE("submodule: lookup and its error") {
  auto m = make_model<TinyModel>(11, 8, 1);
  CHECK(m->submodule("").type_name() == "TinyModel");
  CHECK(m->submodule("layers.0.ln2").type_name() == "LayerNorm");
  CHECK_THROWS_WITH(m->submodule("layers.3"), Catch::Contains("no submodule '3'"));
}

TEST_CASE("named_modules, named_children and apply visit every module with its path") {
  auto m = make_model<TinyModel>(11, 8, 1);
  std::vector<std::string> seen;
  m->apply([&](Module& mod, const std::string& path) {
    seen.push_back(path + ":" + mod.type_name());
    CHECK(mod.path() == path);
  });
  std::vector<std::string> expect = {
      ":TinyModel",        "emb:Embedding",          "layers:ModuleList",         "layers.0:Block",
      "layers.0.ln1:LayerNorm", "layers.0.attn:Attention", "layers.0.attn.wq:Linear", "layers.0.attn.wk:Linear",
      "layers.0.attn.wv:Linear", "layers.0.attn.wo:Linear", "layers.0.attn.resid_drop:Dropout",
      "layers.0.ln2:LayerNorm", "layers.0.mlp:MLP",        "layers.0.mlp.fc:Linear",  "layers.0.mlp.proj:Linear",
      "layers.0.mlp.drop:Dropout", "ln_f:LayerNorm",      "head:Linear"};
  CHECK(seen == expect);
  CHECK(m->named_modules().size() == expect.size());
  auto kids = m->named_children();
  REQUIRE(kids.size() == 4);
  CHECK(kids[1].first == "layers");
  CHECK(kids[1].second.get() == m->layers.get());
}

TEST_CASE("train() and eval() propagate to every module") {
  auto m = make_model<TinyModel>(11, 8, 2);
  CHECK(m->submodule("layers.1.mlp.drop").is_training());
  m->eval();
  for (auto& [p, mod] : m->named_modules()) CHECK_FALSE(mod->is_training());
  m->layers->train();
  CHECK_FALSE(m->is_training());
  CHECK(m->submodule("layers.0.attn.resid_drop").is_training());
  m->train();
  for (auto& [p, mod] : m->named_modules()) CHECK(mod->is_training());
}

TEST_CASE("state_dict round trip; load_state_dict copies values") {
  auto a = make_model<TinyModel>(11, 8, 2);
  auto b = make_model<TinyModel>(11, 8, 2);
  a->reset_parameters(1);
  b->reset_parameters(2);
  auto sa = a->state_dict();
  CHECK(names_of(sa) == names_of(a->named_parameters()));  // rope buffers are not persistent
  CHECK_FALSE(bitwise_equal(a->head->weight, b->head->weight));
  b->load_state_dict(sa);
  auto pa = a->named_parameters(), pb = b->named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) CHECK(bitwise_equal(pa[i].tensor, pb[i].tensor));
  CHECK_FALSE(b->head->weight.is_same(a->head->weight));  // copied, not aliased
  CHECK(b->head->weight.requires_grad());
  // Same forward afterwards.
  Tensor ids = randint({2, 5}, 3, 0, 11);
  CHECK(bitwise_equal(a->forward(ids), b->forward(ids)));
  // Dtypes convert on load.
  std::vector<NamedTensor> s64;
  for (const auto& n : sa) s64.push_back({n.name, n.tensor.to(DType::Float64)});
  b->reset_parameters(5);
  b->load_state_dict(s64);
  CHECK(bitwise_equal(b->ln_f->weight, a->ln_f->weight));
}

TEST_CASE("load_state_dict errors name the keys") {
  auto m = make_model<TinyModel>(11, 8, 1);
  m->reset_parameters(1);
  auto s = m->state_dict();
  auto missing = s;
  missing.erase(missing.begin() + 3);  // layers.0.attn.wq.weight
  CHECK_THROWS_WITH(m->load_state_dict(missing), Catch::Contains("load_state_dict") && Catch::Contains("TinyModel") &&
                                                     Catch::Contains("missing keys [layers.0.attn.wq.weight]"));
  auto extra = s;
  extra.push_back({"layers.0.attn.wz.weight", zeros({2})});
  CHECK_THROWS_WITH(m->load_state_dict(extra), Catch::Contains("unexpected keys [layers.0.attn.wz.weight]"));
  auto bad = s;
  bad[0].tensor = zeros({11, 9});
  CHECK_THROWS_WITH(m->load_state_dict(bad), Catch::Contains("'emb.weight' has shape [11, 8] in the model but "
                                                             "[11, 9] in the state"));
  // Nothing was written by the failed loads.
  CHECK(bitwise_equal(m->emb->weight, s[0].tensor));
  // Non-strict ignores missing and unexpected keys, but not wrong shapes.
  Tensor emb_before = m->emb->weight.clone();
  auto other = make_model<TinyModel>(11, 8, 1);
  other->reset_parameters(9);
  auto partial = other->state_dict();
  partial.erase(partial.begin());  // emb.weight missing
  partial.push_back({"not.a.key", zeros({1})});
  m->load_state_dict(partial, /*strict=*/false);
  CHECK(bitwise_equal(m->head->weight, other->head->weight));
  CHECK(bitwise_equal(m->emb->weight, emb_before));
  CHECK_THROWS_WITH(m->load_state_dict(bad, false), Catch::Contains("'emb.weight'"));
}

TEST_CASE("reset_parameters is keyed by path and seed; set_init replaces an init") {
  auto a = make_model<TinyModel>(11, 8, 2);
  auto b = make_model<TinyModel>(11, 8, 2);
  a->reset_parameters(4);
  b->reset_parameters(4);
  for (size_t i = 0; i < a->parameters().size(); ++i) CHECK(bitwise_equal(a->parameters()[i], b->parameters()[i]));
  // Same shapes at different paths draw different values.
  CHECK_FALSE(bitwise_equal(a->submodule("layers.0.attn.wq").named_parameters()[0].tensor,
                            a->submodule("layers.1.attn.wq").named_parameters()[0].tensor));
  // The value is init(key = {seed, stream_for(path)}).
  Tensor expect = empty({8, 8});
  kaiming_uniform_(expect, parameter_key(4, "layers.1.attn.wk.weight"), std::sqrt(5.0));
  CHECK(bitwise_equal(a->submodule("layers.1.attn.wk").named_parameters()[0].tensor, expect));

  a->set_init("layers.0.mlp.proj.weight", init::normal(0.0, 0.02));
  a->layers->set_init("1.mlp.fc.bias", init::constant(0.5));
  a->head->set_init("weight", init::zeros());
  a->reset_parameters(4);
  Tensor w = a->submodule("layers.0.mlp.proj").named_parameters()[0].tensor;
  Tensor ref = empty({8, 32});
  normal_(ref, parameter_key(4, "layers.0.mlp.proj.weight"), 0.0, 0.02);
  CHECK(bitwise_equal(w, ref));
  for (float v : a->submodule("layers.1.mlp.fc").named_parameters()[1].tensor.to_vector<float>()) CHECK(v == 0.5f);
  for (float v : a->head->weight.to_vector<float>()) CHECK(v == 0.0f);
  CHECK_THROWS_WITH(a->set_init("layers.0.mlp.proj.scale", init::zeros()),
                    Catch::Contains("set_init") && Catch::Contains("Linear has no parameter"));
  CHECK_THROWS_WITH(a->set_init("layers.9.mlp.proj.weight", init::zeros()), Catch::Contains("no submodule '9'"));
  CHECK_THROWS_WITH(a->head->set_init("weight", nullptr), Catch::Contains("null init"));
}

TEST_CASE("init::uniform_fan_in and the Linear / Embedding / norm default inits") {
  auto lin = make_model<Linear>(64, 300);
  auto emb = make_model<Embedding>(200, 50);
  auto ln = make_model<LayerNorm>(7);
  lin->reset_parameters(3);
  emb->reset_parameters(3);
  ln->reset_parameters(3);
  const double bound = 1.0 / 8.0;
  auto w = lin->weight.to_vector<double>(), b = lin->bias.to_vector<double>();
  double wmax = 0, bmax = 0;
  for (double v : w) wmax = std::max(wmax, std::fabs(v));
  for (double v : b) bmax = std::max(bmax, std::fabs(v));
  CHECK(wmax <= bound);
  CHECK(wmax > 0.95 * bound);  // uniform over the whole range
  CHECK(bmax <= bound);
  CHECK(bmax > 0.9 * bound);
  Tensor ub = empty({300});
  uniform_(ub, parameter_key(3, "bias"), -bound, bound);
  CHECK(bitwise_equal(lin->bias, ub));
  // Embedding: normal(0, 1) by default; configurable.
  auto e = emb->weight.to_vector<double>();
  double m = 0, sq = 0;
  for (double v : e) m += v;
  m /= double(e.size());
  for (double v : e) sq += (v - m) * (v - m);
  CHECK(std::fabs(m) < 0.03);
  CHECK(std::sqrt(sq / double(e.size())) == Approx(1.0).epsilon(0.03));
  auto emb2 = make_model<Embedding>(10, 4, init::constant(0.25));
  emb2->reset_parameters(0);
  for (float v : emb2->weight.to_vector<float>()) CHECK(v == 0.25f);
  for (float v : ln->weight.to_vector<float>()) CHECK(v == 1.0f);
  for (float v : ln->bias.to_vector<float>()) CHECK(v == 0.0f);
  CHECK_THROWS_WITH(init::uniform_fan_in(0), Catch::Contains("fan_in must be positive"));
}

TEST_CASE("describe shows options and parameter shapes") {
  auto m = make_model<MLP>(4, 8, true, 0.1);
  CHECK(m->describe() ==
        "MLP(dim=4, hidden=8)\n"
        "  (fc): Linear(in_features=4, out_features=8, bias=true, weight=[8, 4], bias=[8])\n"
        "  (proj): Linear(in_features=8, out_features=4, bias=true, weight=[4, 8], bias=[4])\n"
        "  (drop): Dropout(p=0.1)");
  auto seq = make_model<Sequential>(std::vector<std::shared_ptr<UnaryModule>>{
      std::make_shared<RMSNorm>(4), std::make_shared<GELU>("none"), std::make_shared<SiLU>()});
  CHECK(seq->describe() ==
        "Sequential()\n"
        "  (0): RMSNorm(dim=4, eps=1e-06, weight=[4])\n"
        "  (1): GELU(approximate=none)\n"
        "  (2): SiLU()");
  AttentionConfig a;
  a.dim = 8;
  a.n_head = 4;
  a.n_kv_head = 2;
  a.rope = true;
  a.max_seq_len = 32;
  a.attn_dropout = 0.1;
  CHECK(Attention(a).extra_repr() ==
        "dim=8, n_head=4, n_kv_head=2, head_dim=2, bias=false, rope(theta=10000, max_seq_len=32, rotate_half), "
        "attn_dropout=0.1");
  CHECK(LayerNorm(3, 1e-5, true, false).extra_repr() == "dim=3, eps=1e-05, affine=true, bias=false");
  CHECK(Embedding(5, 2).extra_repr() == "num_embeddings=5, embedding_dim=2");
  CHECK(SwiGLU(2, 3).extra_repr() == "dim=2, hidden=3");
  MoEConfig mc;
  mc.dim = 2;
  mc.hidden = 3;
  mc.num_experts = 4;
  CHECK(MoE(mc).extra_repr() == "dim=2, hidden=3, num_experts=4, top_k=2");
}

TEST_CASE("to(dtype) converts parameters and buffers; zero_grad drops grads") {
  auto m = make_model<TinyModel>(11, 8, 1);
  m->reset_parameters(1);
  Tensor before = m->head->weight;
  m->to(DType::Float64);
  for (auto& p : m->named_parameters()) {
    CHECK(p.tensor.dtype() == DType::Float64);
    CHECK(p.tensor.requires_grad());
    CHECK(p.tensor.is_leaf());
  }
  for (auto& b : m->named_buffers()) CHECK(b.tensor.dtype() == DType::Float64);
  CHECK(bitwise_equal(m->head->weight, before.to(DType::Float64)));
  Tensor loss = sum(m->forward(randint({2, 3}, 1, 0, 11)));
  loss.backward();
  CHECK(m->head->weight.grad().defined());
  CHECK(m->head->weight.grad().dtype() == DType::Float64);
  m->zero_grad();
  for (auto& p : m->named_parameters()) CHECK_FALSE(p.tensor.grad().defined());
}

TEST_CASE("ModuleList: push_back, indexing, typed access, errors") {
  auto list = make_model<ModuleList>(std::vector<std::shared_ptr<Module>>{std::make_shared<Linear>(2, 3)});
  list->push_back(std::make_shared<RMSNorm>(3));
  CHECK(list->size() == 2);
  CHECK_FALSE(list->empty());
  CHECK((*list)[1]->type_name() == "RMSNorm");
  CHECK(list->at<Linear>(0)->out_features == 3);
  CHECK(names_of(list->named_parameters()) == std::vector<std::string>{"0.weight", "0.bias", "1.weight"});
  int n = 0;
  for (const auto& m : *list) n += m != nullptr;
  CHECK(n == 2);
  CHECK_THROWS_WITH((*list)[2], Catch::Contains("ModuleList") && Catch::Contains("index 2 out of range (size 2)"));
  CHECK_THROWS_WITH(list->at<Linear>(1), Catch::Contains("module 1 is a RMSNorm"));
  CHECK(ModuleList().empty());
}

TEST_CASE("Sequential chains its modules") {
  auto seq = make_model<Sequential>();
  seq->push_back(std::make_shared<Linear>(4, 6));
  seq->push_back(std::make_shared<GELU>());
  seq->push_back(std::make_shared<Linear>(6, 2, false));
  seq->reset_parameters(8);
  CHECK(seq->size() == 3);
  Tensor x = uniform({3, 4}, 1);
  auto l0 = std::static_pointer_cast<Linear>((*seq)[0]);
  auto l2 = std::static_pointer_cast<Linear>((*seq)[2]);
  Tensor ref = linear(gelu(linear(x, l0->weight, l0->bias), "tanh"), l2->weight);
  CHECK(bitwise_equal((*seq)(x), ref));
  CHECK(l2->path() == "2");
  CHECK_THROWS_WITH((*seq)[3], Catch::Contains("Sequential") && Catch::Contains("index 3 out of range"));
  // Gradient check through the chain (float64).
  ConstructionScope f64(kCPU, DType::Float64);
  auto s64 = make_model<Sequential>(std::vector<std::shared_ptr<UnaryModule>>{
      std::make_shared<Linear>(3, 4), std::make_shared<SiLU>(), std::make_shared<RMSNorm>(4)});
  s64->reset_parameters(2);
  auto lin = std::static_pointer_cast<Linear>((*s64)[0]);
  CHECK_GRADCHECK([&](const std::vector<Tensor>& in) { return s64->forward(in[0]); },
                  {grad_input_noncontig({2, 3}, 5), lin->weight, lin->bias});
}

namespace {

// Every layer kind, for the meta-device test.
struct Zoo : Module {
  explicit Zoo() : Module("Zoo") {
    AttentionConfig a;
    a.dim = 16;
    a.n_head = 4;
    a.n_kv_head = 2;
    a.rope = true;
    a.max_seq_len = 8;
    MoEConfig mc;
    mc.dim = 16;
    mc.hidden = 24;
    mc.num_experts = 4;
    child("emb", std::make_shared<Embedding>(50, 16));
    child("ln", std::make_shared<LayerNorm>(16));
    child("rms", std::make_shared<RMSNorm>(16));
    child("attn", std::make_shared<Attention>(a));
    child("mlp", std::make_shared<MLP>(16));
    child("ffn", std::make_shared<SwiGLU>(16, 40));
    child("moe", std::make_shared<MoE>(mc));
    child("drop", std::make_shared<Dropout>(0.1));
    auto seq = std::make_shared<Sequential>();
    seq->push_back(std::make_shared<Linear>(16, 8));
    seq->push_back(std::make_shared<GELU>());
    child("seq", seq);
  }
};

}  // namespace

TEST_CASE("meta construction allocates nothing; materialize + reset_parameters equals an eager build") {
  auto eager = make_model<Zoo>();
  eager->reset_parameters(123);

  std::shared_ptr<Zoo> lazy;
  {
    AllocatorStats before = cpu_allocator()->stats();
    ConstructionScope meta(kMeta);
    lazy = make_model<Zoo>();
    AllocatorStats after = cpu_allocator()->stats();
    CHECK(after.requests == before.requests);
    CHECK(after.current_bytes == before.current_bytes);
  }
  CHECK(lazy->num_parameters() == eager->num_parameters());
  CHECK(lazy->num_parameters() == 50 * 16 + 32 + 16 + (16 * 16 * 2 + 16 * 8 * 2) + (16 * 64 * 2 + 64 + 16) +
                                      3 * 16 * 40 + (16 * 4 + 4 * 3 * 16 * 24) + (16 * 8 + 8));
  for (auto& p : lazy->named_parameters()) {
    CHECK(p.tensor.device().is_meta());
    CHECK(p.tensor.requires_grad());
  }
  for (auto& b : lazy->named_buffers()) CHECK(b.tensor.device().is_meta());
  CHECK_THROWS_WITH(lazy->reset_parameters(123), Catch::Contains("meta device") && Catch::Contains("emb.weight"));

  lazy->materialize(kCPU);
  lazy->reset_parameters(123);
  auto pe = eager->named_parameters(), pl = lazy->named_parameters();
  REQUIRE(pe.size() == pl.size());
  for (size_t i = 0; i < pe.size(); ++i) {
    INFO(pe[i].name);
    CHECK(pe[i].name == pl[i].name);
    CHECK(pl[i].tensor.device() == kCPU);
    CHECK(pl[i].tensor.requires_grad());
    CHECK(bitwise_equal(pe[i].tensor, pl[i].tensor));
  }
  auto be = eager->named_buffers(), bl = lazy->named_buffers();
  REQUIRE(be.size() == 2);
  REQUIRE(bl.size() == 2);
  for (size_t i = 0; i < be.size(); ++i) CHECK(bitwise_equal(be[i].tensor, bl[i].tensor));
  // And they compute the same.
  Tensor x = uniform({2, 5, 16}, 4);
  auto& ae = static_cast<Attention&>(eager->submodule("attn"));
  auto& al = static_cast<Attention&>(lazy->submodule("attn"));
  CHECK(bitwise_equal(ae.forward(x, 3), al.forward(x, 3)));
  auto& me = static_cast<MoE&>(eager->submodule("moe"));
  auto& ml = static_cast<MoE&>(lazy->submodule("moe"));
  CHECK(bitwise_equal(me.forward(x), ml.forward(x)));
}

TEST_CASE("forward hooks run around (*m)(x), in registration order, and can be removed", "[nn]") {
  auto lin = nn::make_model<nn::Linear>(3, 2, false);
  lin->reset_parameters(1);
  Tensor x = ones({1, 3});
  std::vector<std::string> seen;
  int pre = lin->register_forward_pre_hook([&](nn::Module& m, const Tensor& in) {
    seen.push_back("pre:" + m.type_name());
    return in * 2.0;
  });
  int post = lin->register_forward_hook([&](nn::Module&, const Tensor& in, const Tensor& out) {
    seen.push_back("post");
    CHECK(in.to_vector<float>() == std::vector<float>{2, 2, 2});  // the pre-hook's input
    return out + 1.0;
  });
  Tensor direct = lin->forward(x);  // hooks do not run on a direct forward()
  CHECK(seen.empty());
  Tensor hooked = (*lin)(x);
  CHECK(seen == std::vector<std::string>{"pre:Linear", "post"});
  CHECK(allclose(hooked, direct * 2.0 + 1.0));
  lin->remove_forward_hook(pre);
  lin->remove_forward_hook(post);
  CHECK_FALSE(lin->has_forward_hooks());
  CHECK(bitwise_equal((*lin)(x), direct));
}
