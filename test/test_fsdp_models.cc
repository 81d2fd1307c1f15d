// FSDP on a model written the way users write them (nn/parallel/fsdp.h
// "Gathering on use"): an entry point `loss(x, y)` that no forward hook
// wraps, blocks called as block->forward(h) or as (*block)(h). Ranks are
// threads (comm::run_local), bitwise mode on every rank and on the one
// device: 30 AdamW steps with clipping give the one-device loss bits at
// every micro-batch and the one-device bits of every parameter, on dp=2 and
// dp=2 x tp=2, with the blocks as FSDP units and with none; ZeRO-1/2 and DDP
// on the same model too. Then the errors that replace wrong gradients, and
// reads of a shard that must not gather its unit.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <map>

#include "autograd/api.h"
#include "dtensor/ops.h"
#include "nn/clip.h"
#include "nn/nn.h"
#include "nn/parallel/data_parallel.h"
#include "nn/parallel/parallelize.h"
#include "runtime/numerics.h"
#include "test/util/dist.h"

using namespace tessel;
using namespace tessel::testing;
using tessel::parallel::DataParallel;
using tessel::parallel::DataParallelOptions;

namespace {

constexpr int64_t kIn = 12, kWidth = 16, kClasses = 5, kBatch = 8;
constexpr int kSteps = 30, kMicro = 2;

// How the model calls its blocks: forward() skips the forward hooks (FSDP's
// fast path), operator() runs them.
enum class Calls { Forward, Operator };

// LayerNorm -> Linear(d, 4d) -> GELU -> Linear(4d, d), plus the residual.
struct Block : nn::UnaryModule {
  std::shared_ptr<nn::LayerNorm> ln;
  std::shared_ptr<nn::Linear> fc1, fc2;
  std::shared_ptr<nn::GELU> act;
  explicit Block(int64_t d) : nn::UnaryModule("Block") {
    ln = child("ln", std::make_shared<nn::LayerNorm>(d));
    fc1 = child("fc1", std::make_shared<nn::Linear>(d, 4 * d));
    act = child("act", std::make_shared<nn::GELU>());
    fc2 = child("fc2", std::make_shared<nn::Linear>(4 * d, d));
  }
  Tensor forward(const Tensor& x) override {
    return x + fc2->forward(act->forward(fc1->forward(ln->forward(x))));
  }
};

// Linear(in, d) -> 2 blocks -> LayerNorm -> Linear(d, classes) -> cross
// entropy, behind `loss(x, y)`: the model's own forward hooks never run.
struct Classifier : nn::Module {
  std::shared_ptr<nn::Linear> inp, head;
  std::shared_ptr<nn::ModuleList> blocks;
  std::shared_ptr<nn::LayerNorm> ln_f;
  Calls calls = Calls::Forward;
  // Multiplies the blocks' output by block 0's LayerNorm weight: a use of a
  // unit's parameter after the unit's forward when block 0 is a hooked unit.
  bool reuse_block0 = false;

  Classifier() : nn::Module("Classifier") {
    inp = child("inp", std::make_shared<nn::Linear>(kIn, kWidth));
    blocks = child("blocks", std::make_shared<nn::ModuleList>());
    for (int i = 0; i < 2; ++i) blocks->push_back(std::make_shared<Block>(kWidth));
    ln_f = child("ln_f", std::make_shared<nn::LayerNorm>(kWidth));
    head = child("head", std::make_shared<nn::Linear>(kWidth, kClasses));
  }
  Block& block(size_t i) const { return *blocks->at<Block>(i); }
  Tensor loss(const Tensor& x, const Tensor& y) {
    Tensor h = inp->forward(x);
    for (size_t i = 0; i < blocks->size(); ++i) h = calls == Calls::Forward ? block(i).forward(h) : block(i)(h);
    if (reuse_block0) h = h * block(0).ln->weight;
    return cross_entropy(head->forward(ln_f->forward(h)), y);
  }
};

std::shared_ptr<Classifier> make_classifier(Calls calls, bool reuse_block0 = false) {
  auto m = nn::make_model<Classifier>();
  m->reset_parameters(17);
  m->calls = calls;
  m->reuse_block0 = reuse_block0;
  return m;
}

// Column-parallel fc1 (its bias too, so it stays whole over dp: no dim left
// to cut), row-parallel fc2; ignored on a mesh without "tp".
parallel::ParallelPlan tp_plan() {
  return parallel::ParallelPlan::from_json(R"J({"name": "classifier-tp", "params": [
      {"match": "blocks\\.\\d+\\.fc1\\.(weight|bias)", "tp": "S(0)"},
      {"match": "blocks\\.\\d+\\.fc2\\.weight", "tp": "S(1)"}]})J");
}

Tensor batch_x(int step, int m) { return randn({kBatch / kMicro, kIn}, PhiloxKey{21, uint64_t(100 * step + m)}); }
Tensor batch_y(int step, int m) {
  return randint(0, kClasses, {kBatch / kMicro}, PhiloxKey{22, uint64_t(100 * step + m)});
}

nn::AdamWOptions adamw() {
  nn::AdamWOptions o;
  o.lr = 1e-2;
  return o;
}

uint32_t bits(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// The loss bits of every micro-batch and every final parameter, by path.
struct Trace {
  std::vector<uint32_t> losses;
  std::map<std::string, std::vector<float>> params;
};

// "" when `got` has `want`'s bits, else where they first differ.
std::string difference(const Trace& want, const Trace& got) {
  if (got.losses.size() != want.losses.size()) return "number of losses " + std::to_string(got.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i)
    if (got.losses[i] != want.losses[i])
      return "loss of step " + std::to_string(i / kMicro) + " micro-batch " + std::to_string(i % kMicro);
  if (got.params.size() != want.params.size()) return "number of parameters " + std::to_string(got.params.size());
  for (const auto& [path, values] : want.params) {
    auto it = got.params.find(path);
    if (it == got.params.end()) return "no parameter " + path;
    if (it->second.size() != values.size() ||
        std::memcmp(it->second.data(), values.data(), values.size() * sizeof(float)) != 0)
      return "parameter " + path + " after the last step";
  }
  return "";
}

Trace one_device(bool reuse_block0) {
  numerics::BitwiseGuard bitwise(true);
  auto model = make_classifier(Calls::Forward, reuse_block0);
  nn::AdamW opt(nn::default_param_groups(*model, 0.1), adamw());
  Trace t;
  for (int step = 0; step < kSteps; ++step) {
    for (int m = 0; m < kMicro; ++m) {
      Tensor loss = model->loss(batch_x(step, m), batch_y(step, m));
      t.losses.push_back(bits(loss.item<float>()));
      (loss / double(kMicro)).backward();
    }
    nn::clip_grad_norm_(model->parameters(), 1.0);
    opt.step();
    opt.zero_grad();
  }
  for (const auto& nt : model->named_parameters()) t.params[nt.name] = nt.tensor.to_vector<float>();
  return t;
}

struct Layout {
  std::vector<Mesh::DimSpec> mesh;
  int zero = 3;
  bool units = true;  // the blocks are FSDP units (else everything is the root)
  Calls calls = Calls::Forward;
  bool reuse_block0 = false;
  std::string str() const {
    return mesh_name(mesh) + " zero=" + std::to_string(zero) + (units ? " blocks as units" : " no units") +
           (calls == Calls::Forward ? ", block->forward(h)" : ", (*block)(h)") +
           (reuse_block0 ? ", block 0's norm weight used after the blocks" : "");
  }
};

// One rank: the model laid out by tp_plan on the layout's mesh, under
// DataParallel. Bitwise mode must be on in the calling thread.
struct Rank {
  std::shared_ptr<Classifier> model;
  MeshPtr mesh;
  parallel::ParallelPlan plan = tp_plan();
  std::unique_ptr<DataParallel> dp;
  std::unique_ptr<nn::AdamW> opt;

  explicit Rank(const Layout& l) : model(make_classifier(l.calls, l.reuse_block0)), mesh(Mesh::world(l.mesh)) {
    parallel::parallelize(*model, mesh, plan);
    std::vector<nn::Module*> blocks;
    if (l.units)
      for (const auto& b : *model->blocks) blocks.push_back(b.get());
    dp = std::make_unique<DataParallel>(*model, blocks, DataParallelOptions{l.zero, 0.001});
    opt = std::make_unique<nn::AdamW>(dp->optimizer_groups(nn::default_param_groups(*model, 0.1)), adamw());
  }
  Tensor loss(int step, int m) {
    return model->loss(parallel::distribute_batch(batch_x(step, m), mesh, plan),
                       parallel::distribute_batch(batch_y(step, m), mesh, plan));
  }
  void step() {
    dp->finish();
    nn::clip_grad_norm_(dp->parameters(), 1.0);
    opt->step();
    dp->after_step();
    opt->zero_grad();
  }
  int64_t gathered_now() const { return dp->memory(*opt).gathered_now; }
};

// "" when every rank gives `want`'s bits.
std::string check_layout(const Layout& l, const Trace& want) {
  std::vector<Trace> got(size_t(mesh_size(l.mesh)));
  auto reports = on_ranks(mesh_size(l.mesh), [&](int rank) -> std::string {
    try {
      numerics::BitwiseGuard bitwise(true);
      Rank r(l);
      Trace& t = got[size_t(rank)];
      for (int step = 0; step < kSteps; ++step) {
        for (int m = 0; m < kMicro; ++m) {
          r.dp->begin_micro_batch(m + 1 == kMicro);
          Tensor loss = r.loss(step, m);
          t.losses.push_back(bits(loss.item<float>()));
          (loss / double(kMicro)).backward();
        }
        r.step();
      }
      if (r.gathered_now() != 0) return "a unit is still gathered after the last step";
      for (const auto& nt : r.model->named_parameters())
        t.params[nt.name] = full_tensor(nt.tensor.detach()).to_vector<float>();
      return difference(want, t);
    } catch (const std::exception& e) {
      return std::string("threw: ") + e.what();
    }
  });
  return first_failure(reports);
}

// The layout's one model, laid out, for a check that returns a report.
std::vector<std::string> on_layout(const Layout& l, const std::function<std::string(Rank&)>& fn) {
  return on_ranks(mesh_size(l.mesh), [&](int) -> std::string {
    try {
      numerics::BitwiseGuard bitwise(true);
      Rank r(l);
      return fn(r);
    } catch (const std::exception& e) {
      return std::string("threw: ") + e.what();
    }
  });
}

// The message of the tessel::Error `fn` throws, or "no error".
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

const std::vector<Mesh::DimSpec> kDp2 = {{"dp", 2}};
const std::vector<Mesh::DimSpec> kDp2Tp2 = {{"dp", 2}, {"tp", 2}};

}  // namespace

TEST_CASE("FSDP of a model with loss(x, y): one device's bits on dp=2 and dp=2 x tp=2, with and without units",
          "[fsdp][bitwise]") {
  const Trace want = one_device(false);
  REQUIRE(want.losses.size() == size_t(kSteps * kMicro));
  REQUIRE(want.losses.front() != want.losses.back());  // it trains
  for (const auto& mesh : {kDp2, kDp2Tp2}) {
    for (bool units : {true, false}) {
      for (Calls calls : {Calls::Forward, Calls::Operator}) {
        const Layout l{mesh, 3, units, calls};
        INFO(l.str());
        CHECK(check_layout(l, want) == "");
      }
    }
  }
}

TEST_CASE("DDP, ZeRO-1 and ZeRO-2 of the same model: one device's bits", "[fsdp][bitwise][zero]") {
  const Trace want = one_device(false);
  for (const auto& mesh : {kDp2, kDp2Tp2}) {
    for (int zero : {0, 1, 2}) {
      const Layout l{mesh, zero, true, Calls::Forward};
      INFO(l.str());
      CHECK(check_layout(l, want) == "");
    }
  }
}

TEST_CASE("FSDP: a parameter used after its unit's forward is an error naming it; in the root it trains",
          "[fsdp][errors]") {
  // Block 0 is a hooked unit: its post-hook released it before the use.
  const Layout hooked{kDp2, 3, true, Calls::Operator, /*reuse_block0=*/true};
  const auto reports = on_layout(hooked, [](Rank& r) -> std::string {
    r.dp->begin_micro_batch(true);
    return error_of([&] { r.loss(0, 0); });
  });
  for (const std::string& msg : reports) {
    CHECK_THAT(msg, Catch::Contains("fsdp: parameter 'blocks.0.ln.weight'") &&
                        Catch::Contains("of FSDP unit 'blocks.0' is used after that unit's forward ended") &&
                        Catch::Contains("Use the parameter inside the forward of 'blocks.0'") &&
                        Catch::Contains("leave that module out of DataParallel's blocks"));
  }
  // What the message suggests: without units, block 0 belongs to the root.
  const Trace want = one_device(true);
  for (Calls calls : {Calls::Forward, Calls::Operator}) {
    const Layout l{kDp2, 3, false, calls, true};
    INFO(l.str());
    CHECK(check_layout(l, want) == "");
  }
}

TEST_CASE("FSDP: a hooked unit gathered again before the first forward's backward is an error; under NoGradGuard "
          "it is fine",
          "[fsdp][errors]") {
  const Layout hooked{kDp2, 3, true, Calls::Operator};
  const auto twice = on_layout(hooked, [](Rank& r) -> std::string {
    r.dp->begin_micro_batch(true);
    Tensor first = r.loss(0, 0);
    return error_of([&] { r.loss(0, 1); });
  });
  for (const std::string& msg : twice) {
    CHECK_THAT(msg, Catch::Contains("fsdp: unit 'blocks.0' (parameters blocks.0.ln.weight, ...) is gathered "
                                    "again while its gathered copy from an earlier forward still awaits its "
                                    "backward") &&
                        Catch::Contains("Call backward before the next forward"));
  }

  // An evaluation forward between a forward and its backward: the gradient
  // is the one of the forward alone.
  const auto eval = on_layout(hooked, [](Rank& r) -> std::string {
    r.dp->begin_micro_batch(true);
    Tensor loss = r.loss(0, 0);
    Tensor again;
    {
      NoGradGuard ng;
      again = r.loss(0, 0);
    }
    if (bits(again.item<float>()) != bits(loss.item<float>())) return "the evaluation's loss differs";
    loss.backward();
    r.dp->finish();
    std::vector<Tensor> with_eval;
    for (const Tensor& p : r.dp->parameters()) with_eval.push_back(full_tensor(p.grad()));
    r.opt->zero_grad();
    r.dp->begin_micro_batch(true);
    r.loss(0, 0).backward();
    r.dp->finish();
    const std::vector<Tensor> ps = r.dp->parameters();
    for (size_t i = 0; i < ps.size(); ++i) {
      const auto a = with_eval[i].to_vector<float>(), b = full_tensor(ps[i].grad()).to_vector<float>();
      if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0) return "gradient " + std::to_string(i);
    }
    return "";
  });
  CHECK(first_failure(eval) == "");
}

TEST_CASE("FSDP: a gradient reaching a shard directly is an error naming the parameter and its unit",
          "[fsdp][errors]") {
  for (Calls calls : {Calls::Forward, Calls::Operator}) {
    const Layout l{kDp2, 3, true, calls};
    INFO(l.str());
    const auto reports = on_layout(l, [](Rank& r) -> std::string {
      // A penalty written on full_tensor: it reads the shard as it is (no
      // gathering), so its gradient arrives at the shard itself.
      const Tensor shard = r.model->block(1).fc1->weight;
      r.dp->begin_micro_batch(true);
      Tensor loss = r.loss(0, 0) + 1e-3 * sum(square(full_tensor(shard)));
      return error_of([&] { loss.backward(); });
    });
    for (const std::string& msg : reports) {
      CHECK_THAT(msg, Catch::Contains("fsdp: a gradient reached the shard of parameter 'blocks.1.fc1.weight'") &&
                          Catch::Contains("FSDP unit 'blocks.1') directly"));
    }
  }
}

TEST_CASE("FSDP: redistribute and full_tensor read a shard without gathering; a unit gathered on use stays "
          "gathered until its backward",
          "[fsdp]") {
  auto single = make_classifier(Calls::Forward);
  const std::vector<float> fc1 = single->block(0).fc1->weight.to_vector<float>();
  // Bytes of the gathered parameters: everything, and the root alone.
  int64_t all = 0, root = 0;
  for (const auto& nt : single->named_parameters()) {
    all += nt.tensor.numel() * 4;
    if (nt.name.rfind("blocks.", 0) != 0) root += nt.tensor.numel() * 4;
  }
  for (Calls calls : {Calls::Forward, Calls::Operator}) {
    const Layout l{kDp2, 3, true, calls};
    INFO(l.str());
    const auto reports = on_layout(l, [&](Rank& r) -> std::string {
      const Tensor shard = r.model->block(0).fc1->weight;
      const Tensor whole = full_tensor(shard);
      const Tensor replicated = redistribute(shard, Placements{Replicate()});
      if (r.gathered_now() != 0) return "reading the shard gathered " + std::to_string(r.gathered_now()) + " bytes";
      if (!r.model->block(0).fc1->weight.is_same(shard)) return "reading the shard installed its unit";
      const auto got = whole.to_vector<float>(), rep = full_tensor(replicated).to_vector<float>();
      if (std::memcmp(got.data(), fc1.data(), fc1.size() * 4) != 0 ||
          std::memcmp(rep.data(), fc1.data(), fc1.size() * 4) != 0)
        return "the shard's full value is not the parameter's";
      {
        // An op without grad mode gathers (a copy without a gather node,
        // not installed); after_step frees it.
        NoGradGuard ng;
        Tensor s = sum(shard);
        if (r.gathered_now() == 0) return "an op on a shard did not gather it";
        if (!r.model->block(0).fc1->weight.is_same(shard)) return "a no-grad use installed its unit";
        r.dp->after_step();
        if (r.gathered_now() != 0) return "after_step left a unit gathered";
      }
      r.dp->begin_micro_batch(true);
      Tensor loss = r.loss(0, 0);
      // Gathered on use: every unit (block->forward) or only the root ((*block)(h) frees each block).
      const int64_t want = r.model->calls == Calls::Forward ? all : root;
      if (r.gathered_now() != want)
        return "after forward " + std::to_string(r.gathered_now()) + " bytes gathered, expected " +
               std::to_string(want);
      loss.backward();
      if (r.gathered_now() != 0) return "after backward " + std::to_string(r.gathered_now()) + " bytes gathered";
      if (!r.model->block(0).fc1->weight.is_same(shard)) return "after backward the slot is not the shard";
      r.step();
      return "";
    });
    CHECK(first_failure(reports) == "");
  }
}
