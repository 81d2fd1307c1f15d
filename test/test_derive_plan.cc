// Plans derived from a traced forward (nn/parallel/derive.h): the shipped
// plans come out unchanged, a user's model gets Megatron's pairs, what fits
// no pattern is reported, and bad input is refused.
#include <catch2/catch.hpp>

#include "autograd/api.h"
#include "models/language_model.h"
#include "nn/nn.h"
#include "nn/parallel/derive.h"
#include "nn/parallel/plan.h"

using namespace tessel;
using parallel::DeriveOptions;
using parallel::DeriveReport;

namespace {

std::shared_ptr<models::LanguageModel> on_meta(const std::string& arch) {
  nn::ConstructionScope meta(kMeta);
  return models::build_model(models::model_config(arch, "tiny"));
}

bool contains(const std::vector<std::string>& lines, const std::string& part) {
  for (const auto& l : lines)
    if (l.find(part) != std::string::npos) return true;
  return false;
}

// A residual MLP with a head over classes (docs/your_model.md's classifier).
struct Block : nn::UnaryModule {
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> fc1, fc2;
  explicit Block(int64_t d) : nn::UnaryModule("Block") {
    norm = child("norm", std::make_shared<nn::LayerNorm>(d));
    fc1 = child("fc1", std::make_shared<nn::Linear>(d, 4 * d));
    fc2 = child("fc2", std::make_shared<nn::Linear>(4 * d, d));
  }
  Tensor forward(const Tensor& x) override { return x + (*fc2)(gelu((*fc1)((*norm)(x)))); }
};

struct Classifier : nn::Module {
  std::shared_ptr<nn::Linear> embed, head, side;
  std::shared_ptr<nn::LayerNorm> norm;
  std::vector<std::shared_ptr<Block>> blocks;
  Classifier() : nn::Module("Classifier") {
    embed = child("embed", std::make_shared<nn::Linear>(12, 32));
    auto list = child("blocks", std::make_shared<nn::ModuleList>());
    for (int i = 0; i < 2; ++i) list->push_back(blocks.emplace_back(std::make_shared<Block>(32)));
    norm = child("norm", std::make_shared<nn::LayerNorm>(32));
    side = child("side", std::make_shared<nn::Linear>(32, 32));
    head = child("head", std::make_shared<nn::Linear>(32, 5));
  }
  Tensor loss(const Tensor& x, const Tensor& y) {
    Tensor h = (*embed)(x);
    for (auto& b : blocks) h = (*b)(h);
    h = layer_norm((*side)(h), {32});  // a Linear whose output is normalised: no pair
    return cross_entropy((*head)((*norm)(h)), y);
  }
};

// A LLaMA-like LM whose feed-forward Linears are the block's own children
// (no MLP module): sequence parallelism has no sublayer to wrap there.
struct FlatBlock : nn::UnaryModule {
  std::shared_ptr<nn::RMSNorm> n1, n2;
  std::shared_ptr<nn::Attention> attn;
  std::shared_ptr<nn::Linear> up, gate, down;
  FlatBlock() : nn::UnaryModule("FlatBlock") {
    n1 = child("n1", std::make_shared<nn::RMSNorm>(48));
    n2 = child("n2", std::make_shared<nn::RMSNorm>(48));
    nn::AttentionConfig a;
    a.dim = 48;
    a.n_head = 4;
    a.rope = true;
    a.max_seq_len = 32;
    attn = child("attn", std::make_shared<nn::Attention>(a));
    up = child("up", std::make_shared<nn::Linear>(48, 128, false));
    gate = child("gate", std::make_shared<nn::Linear>(48, 128, false));
    down = child("down", std::make_shared<nn::Linear>(128, 48, false));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x + (*attn)((*n1)(x));
    Tensor z = (*n2)(h);
    return h + (*down)(silu((*gate)(z)) * (*up)(z));
  }
};

struct FlatLM : nn::StagedModel {
  std::shared_ptr<nn::Embedding> emb;
  std::shared_ptr<nn::RMSNorm> norm;
  std::shared_ptr<nn::Linear> out;
  std::vector<std::shared_ptr<nn::UnaryModule>> bs;
  FlatLM() : nn::StagedModel("FlatLM") {
    emb = child("emb", std::make_shared<nn::Embedding>(100, 48));
    auto list = child("blocks", std::make_shared<nn::ModuleList>());
    for (int i = 0; i < 2; ++i) list->push_back(bs.emplace_back(std::make_shared<FlatBlock>()));
    norm = child("norm", std::make_shared<nn::RMSNorm>(48));
    out = child("out", std::make_shared<nn::Linear>(48, 100, false));
  }
  Tensor embed(const Tensor& ids) override { return (*emb)(ids); }
  const std::vector<std::shared_ptr<nn::UnaryModule>>& blocks() const override { return bs; }
  Tensor head(const Tensor& h) override { return (*out)((*norm)(h)); }
  Tensor stage_loss(const Tensor& logits, const Tensor& y) override {
    return cross_entropy(logits.reshape({-1, 100}), y.reshape({-1}));
  }
  Tensor example_input() const override { return empty({1, 1}, TensorOptions(DType::Int64).with_device(kMeta)); }
};

}  // namespace

TEST_CASE("derive_plan: the shipped plans come out of the trace unchanged") {
  for (const std::string arch : {"nanogpt", "llama", "mixtral"}) {
    for (const bool sp : {false, true}) {
      CAPTURE(arch, sp);
      auto model = on_meta(arch);
      DeriveOptions o;
      o.sequence_parallel = sp;
      DeriveReport report;
      const parallel::ParallelPlan derived = parallel::derive_plan(*model, o, &report);
      const std::string want = parallel::plan_layout(parallel::builtin_plan(arch, sp), *model);
      CHECK(parallel::plan_layout(derived, *model) == want);
      // The builtin plans shard something: the comparison is not of two empty layouts.
      CHECK(want.find("tp: S(0)") != std::string::npos);
      CHECK(want.find("tp: S(1)") != std::string::npos);
      INFO(report.str());
      CHECK(contains(report.found, "-> row layers.N.attn.wo"));
      if (sp) CHECK(contains(report.found, "sequence parallel"));
      // The model is untouched: still on Meta, not laid out.
      for (const auto& nt : model->named_parameters()) CHECK(nt.tensor.device().is_meta());
    }
  }
}

TEST_CASE("derive_plan: every shipped config gives its family's plan") {
  // Real sizes too (on Meta: nothing allocated). NanoGPT small has as many
  // positions as tokens (256): its position table must stay replicated.
  for (const std::string arch : {"nanogpt", "llama", "mixtral"}) {
    for (const std::string& name : models::config_names(models::arch_from_name(arch))) {
      CAPTURE(arch, name);
      std::shared_ptr<models::LanguageModel> model;
      {
        nn::ConstructionScope meta(kMeta);
        model = models::build_model(models::model_config(arch, name));
      }
      DeriveOptions sp;
      sp.sequence_parallel = true;
      CHECK(parallel::plan_layout(parallel::derive_plan(*model, sp), *model) ==
            parallel::plan_layout(parallel::builtin_plan(arch, true), *model));
    }
  }
}

TEST_CASE("derive_plan: the rules read like hand-written ones") {
  auto model = on_meta("llama");
  const parallel::ParallelPlan p = parallel::derive_plan(*model);
  std::vector<std::string> rules;
  for (const auto& r : p.params) rules.push_back(r.match + " " + r.layout.str());
  CHECK(rules == std::vector<std::string>{
                     "tok_embeddings\\.weight {tp: S(0)}",
                     "layers\\.\\d+\\.attn\\.(wq|wk|wv)\\.weight {tp: S(0)}",
                     "layers\\.\\d+\\.attn\\.wo\\.weight {tp: S(1)}",
                     "layers\\.\\d+\\.ffn\\.(w1|w3)\\.weight {tp: S(0)}",
                     "layers\\.\\d+\\.ffn\\.w2\\.weight {tp: S(1)}",
                     "output\\.weight {tp: S(0)}",
                 });
  // The mixtral router feeds a softmax over the experts: replicated, and said so.
  DeriveReport report;
  parallel::derive_plan(*on_meta("mixtral"), {}, &report);
  INFO(report.str());
  CHECK(contains(report.replicated, "layers.N.ffn.gate"));
  CHECK(contains(report.found, "experts of"));
}

TEST_CASE("derive_plan: a model of one's own gets Megatron's pairs; the rest stays replicated with a reason") {
  auto model = nn::make_model<Classifier>();
  model->reset_parameters(1);
  const std::vector<float> before = model->blocks[0]->fc1->weight.to_vector<float>();
  const Tensor x = empty({4, 12}, TensorOptions().with_device(kMeta));
  const Tensor y = empty({4}, TensorOptions(DType::Int64).with_device(kMeta));
  DeriveReport report;
  const parallel::ParallelPlan p = parallel::derive_plan(*model, [&] { return model->loss(x, y); }, {}, &report);
  INFO(report.str());
  std::string want =
      "param blocks.0.fc1.weight {tp: S(0)}\nparam blocks.0.fc1.bias {tp: S(0)}\nparam blocks.0.fc2.weight {tp: S(1)}\n"
      "param blocks.1.fc1.weight {tp: S(0)}\nparam blocks.1.fc1.bias {tp: S(0)}\nparam blocks.1.fc2.weight {tp: S(1)}\n"
      "param head.weight {tp: S(0)}\nparam head.bias {tp: S(0)}\n"
      "data {dp: S(0), ep: S(0), cp: S(1)}\n";
  CHECK(parallel::plan_layout(p, *model) == want);
  CHECK(contains(report.replicated, "side: its output reaches layer_norm"));
  CHECK(contains(report.replicated, "embed: its output reaches layer_norm"));
  // The real parameters are back, values unchanged.
  CHECK(!model->blocks[0]->fc1->weight.device().is_meta());
  CHECK(model->blocks[0]->fc1->weight.to_vector<float>() == before);
  CHECK(model->blocks[0]->fc1->weight.requires_grad());
}

TEST_CASE("derive_plan: sequence parallelism without a sublayer: the Linears gather and scatter themselves") {
  std::shared_ptr<FlatLM> model;
  {
    nn::ConstructionScope meta(kMeta);
    model = nn::make_model<FlatLM>();
  }
  DeriveOptions sp;
  sp.sequence_parallel = true;
  DeriveReport report;
  const std::string layout = parallel::plan_layout(parallel::derive_plan(*model, sp, &report), *model);
  INFO(layout << report.str());
  // Attention has its module; the feed-forward pair is the block's own.
  CHECK_THAT(layout, Catch::Contains("module blocks.0.attn input {tp: R} output {tp: S(1)}"));
  CHECK_THAT(layout, Catch::Contains("module blocks.1.up input {tp: R} output {}"));
  CHECK_THAT(layout, Catch::Contains("module blocks.1.gate input {tp: R} output {}"));
  CHECK_THAT(layout, Catch::Contains("module blocks.1.down input {} output {tp: S(1)}"));
  CHECK_THAT(layout, Catch::Contains("module emb input {} output {tp: S(1)}"));
  CHECK_THAT(layout, Catch::Contains("module norm input {} output {tp: R}"));
  CHECK_THAT(layout, Catch::Contains("param blocks.0.down.weight {tp: S(1)}"));
  CHECK(contains(report.found, "gathering"));
}

TEST_CASE("derive_plan: errors") {
  auto model = nn::make_model<Classifier>();
  const Tensor x = empty({4, 12}, TensorOptions().with_device(kMeta));
  const Tensor y = empty({4}, TensorOptions(DType::Int64).with_device(kMeta));
  // Sequence parallelism needs a [B, T, C] stream and a token embedding.
  DeriveOptions sp;
  sp.sequence_parallel = true;
  CHECK_THROWS_WITH(parallel::derive_plan(*model, [&] { return model->loss(x, y); }, sp),
                    Catch::Contains("sequence parallelism needs one token embedding"));
  // A forward on real inputs cannot mix with the Meta stand-ins.
  CHECK_THROWS_WITH(parallel::derive_plan(*model, [&] { return model->loss(zeros({4, 12}), zeros({4}, DType::Int64)); }),
                    Catch::Contains("inputs must be Meta tensors"));
  // Nothing that depends on a parameter.
  CHECK_THROWS_WITH(parallel::derive_plan(*model, [&] { return x; }), Catch::Contains("which no parameter reaches"));
  // The parameters are back after a failed trace.
  for (const auto& nt : model->named_parameters()) CHECK(!nt.tensor.device().is_meta());
}
