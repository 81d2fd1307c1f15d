// Pipeline parallelism: the schedule generators and their checker (plain
// data), the stage cut, and training equivalence: NanoGPT (dropout on), LLaMA
// and Mixtral, 20 steps on pp2 with GPipe, 1F1B and interleaved 1F1B, on
// tp2 + sequence parallel x pp2 and on dp2 x tp2 x pp2 (the local backend:
// ranks as threads) give the single-device losses, grad norms and final
// parameters within float tolerance (as test_parallel_train); on pp2 alone
// LLaMA and Mixtral give the same bits. A user's staged model that is not a
// language model (a residual-MLP classifier with dropout, computed buffers
// and an auxiliary loss) trains on pp2 and dp2 x pp2 with the one-device
// bits, built materialised or on Meta; what cannot be pipelined is refused
// with the model's name and the sizes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <atomic>
#include <map>
#include <set>
#include <tuple>

#include "autograd/api.h"
#include "dtensor/ops.h"
#include "nn/clip.h"
#include "nn/nn.h"
#include "nn/parallel/parallelize.h"
#include "nn/parallel/pipeline/partition.h"
#include "nn/parallel/pipeline/pipeline.h"
#include "nn/parallel/pipeline/schedule.h"
#include "run/run.h"
#include "runtime/comm/comm.h"
#include "runtime/numerics.h"
#include "test/util/dist.h"
#include "test/util/runfiles.h"
#include "test/util/util.h"
#include "train/config.h"
#include "train/metrics.h"
#include "train/trainer/trainer.h"

using namespace tessel;
using namespace tessel::parallel::pipeline;
using tessel::train::TrainConfig;

namespace {

// ---- schedules, checked independently of check_schedule ------------------------------

// Every (chunk, mb) forwarded once and backwarded once after it on its rank.
void check_forward_before_backward(const Schedule& s) {
  for (int r = 0; r < s.pp; ++r) {
    std::map<std::pair<int, int>, int> fwd, bwd;
    const auto& l = s.ranks[size_t(r)];
    for (int i = 0; i < int(l.size()); ++i) {
      if (l[size_t(i)].op == Op::Forward) fwd[{l[size_t(i)].chunk, l[size_t(i)].mb}] = i;
      if (l[size_t(i)].op == Op::Backward) bwd[{l[size_t(i)].chunk, l[size_t(i)].mb}] = i;
    }
    REQUIRE(int(fwd.size()) == s.virtual_stages * s.micro_batches);
    REQUIRE(bwd.size() == fwd.size());
    for (auto& [k, i] : fwd) CHECK(i < bwd[k]);
  }
}

// Every send has exactly one matching receive: (kind, stage it goes to, mb).
void check_sends_matched(const Schedule& s) {
  std::multiset<std::tuple<int, int, int>> sent, received;
  for (int r = 0; r < s.pp; ++r) {
    for (const Instr& in : s.ranks[size_t(r)]) {
      const int vs = s.stage_of(r, in.chunk);
      if (in.op == Op::SendAct) sent.insert({0, vs + 1, in.mb});
      if (in.op == Op::SendGrad) sent.insert({1, vs - 1, in.mb});
      if (in.op == Op::RecvAct) received.insert({0, vs, in.mb});
      if (in.op == Op::RecvGrad) received.insert({1, vs, in.mb});
    }
  }
  CHECK(sent == received);
}

// Most (chunk, mb) forwarded and not yet backwarded, per rank.
std::vector<int> in_flight(const Schedule& s) {
  std::vector<int> peak;
  for (const auto& l : s.ranks) {
    int f = 0, p = 0;
    for (const Instr& in : l) {
      if (in.op == Op::Forward) p = std::max(p, ++f);
      if (in.op == Op::Backward) --f;
    }
    peak.push_back(p);
  }
  return peak;
}

std::vector<std::pair<int, int>> forwards(const Schedule& s, int r) {
  std::vector<std::pair<int, int>> v;
  for (const Instr& in : s.ranks[size_t(r)])
    if (in.op == Op::Forward) v.push_back({in.chunk, in.mb});
  return v;
}

}  // namespace

TEST_CASE("GPipe and 1F1B schedules: order, matching, in-flight bound, bubble", "[pipeline][schedule]") {
  for (int pp = 1; pp <= 4; ++pp) {
    for (int m = 1; m <= 8; ++m) {
      INFO("pp " << pp << " M " << m);
      const Schedule g = gpipe(pp, m);
      check_forward_before_backward(g);
      check_sends_matched(g);
      const ScheduleStats gs = check_schedule(g);
      for (int r = 0; r < pp; ++r) CHECK(in_flight(g)[size_t(r)] == m);
      CHECK(gs.peak_in_flight == in_flight(g));
      // Forward 1, backward 2, free communication: 3 (M + pp - 1) per step.
      CHECK(gs.makespan == Approx(3.0 * (m + pp - 1)));
      CHECK(gs.bubble == Approx(double(pp - 1) / double(m + pp - 1)));
      if (m < pp) {
        CHECK_THROWS_WITH(one_f_one_b(pp, m), Catch::Contains("1f1b needs micro_batches >= pp"));
        continue;
      }
      const Schedule f = one_f_one_b(pp, m);
      check_forward_before_backward(f);
      check_sends_matched(f);
      const ScheduleStats fs = check_schedule(f);
      for (int r = 0; r < pp; ++r) CHECK(in_flight(f)[size_t(r)] == std::min(pp - r, m));  // the 1F1B bound
      CHECK(fs.makespan == Approx(gs.makespan));  // same bubble as GPipe, less memory
    }
  }
}

TEST_CASE("interleaved 1F1B: Megatron's order, matching, smaller bubble", "[pipeline][schedule]") {
  for (int pp : {2, 3, 4}) {
    for (int v : {2, 3}) {
      for (int m : {pp, 2 * pp, 3 * pp}) {
        INFO("pp " << pp << " V " << v << " M " << m);
        const Schedule s = interleaved_1f1b(pp, m, v);
        check_forward_before_backward(s);
        check_sends_matched(s);
        const ScheduleStats st = check_schedule(s);
        for (int r = 0; r < pp; ++r) {
          // Forwards go in groups of pp micro-batches through chunk 0, 1, ...
          const auto fw = forwards(s, r);
          for (int k = 0; k < int(fw.size()); ++k) {
            CHECK(fw[size_t(k)].first == (k / pp) % v);
            CHECK(fw[size_t(k)].second == (k / (pp * v)) * pp + k % pp);
          }
          // Warm-up bounds the activations in flight.
          const int warmup = m == pp ? m * v : std::min((pp - r - 1) * 2 + (v - 1) * pp, m * v);
          CHECK(st.peak_in_flight[size_t(r)] == std::min(warmup + 1, m * v));
        }
        if (m > pp) CHECK(st.bubble < check_schedule(one_f_one_b(pp, m)).bubble);
      }
    }
  }
  CHECK_THROWS_WITH(interleaved_1f1b(2, 3, 2), Catch::Contains("multiple of pp"));
  CHECK_THROWS_WITH(interleaved_1f1b(2, 4, 1), Catch::Contains("virtual_stages >= 2"));
  CHECK_THROWS_WITH(make_schedule("gpipe", 2, 4, 2), Catch::Contains("needs the interleaved schedule"));
  CHECK_THROWS_WITH(make_schedule("zigzag", 2, 4, 1), Catch::Contains("unknown pipeline schedule 'zigzag'"));
}

TEST_CASE("simulate_schedule: a schedule's makespan with stage costs and transfer times", "[pipeline][schedule]") {
  // Uniform stages, forward f and backward b: 1F1B and GPipe finish at
  // (M + pp - 1)(f + b). Transfers of t add at least the first micro-batch's
  // 2 (pp - 1) crossings (more in 1F1B's steady state, where a stage waits
  // for the next stage's gradient).
  const double f = 0.25, b = 0.5, t = 0.125;
  for (int pp : {2, 3, 4}) {
    for (int m : {pp, 2 * pp}) {
      INFO("pp " << pp << " M " << m);
      StageCosts c;
      c.forward_s.assign(size_t(pp), f);
      c.backward_s.assign(size_t(pp), b);
      c.transfer_s = t;
      const ScheduleStats st = simulate_schedule(one_f_one_b(pp, m), c);
      CHECK(st.makespan >= (m + pp - 1) * (f + b) + 2 * (pp - 1) * t - 1e-9);
      CHECK(st.peak_in_flight == check_schedule(one_f_one_b(pp, m)).peak_in_flight);
      c.transfer_s = 0;
      CHECK(simulate_schedule(one_f_one_b(pp, m), c).makespan == Approx((m + pp - 1) * (f + b)));
      CHECK(simulate_schedule(gpipe(pp, m), c).makespan == Approx((m + pp - 1) * (f + b)));
      // Interleaved, V chunks of a stage's work each: the bubble shrinks by V.
      StageCosts ci;
      ci.forward_s.assign(size_t(2 * pp), f / 2);
      ci.backward_s.assign(size_t(2 * pp), b / 2);
      CHECK(simulate_schedule(interleaved_1f1b(pp, m, 2), ci).makespan == Approx((m + (pp - 1) / 2.0) * (f + b)));
    }
  }
  // One micro-batch through 2 stages: f, t, f + b, t, b.
  StageCosts two;
  two.forward_s = {f, f};
  two.backward_s = {b, b};
  two.transfer_s = t;
  CHECK(simulate_schedule(gpipe(2, 1), two).makespan == Approx(2 * (f + b) + 2 * t));
  // A slow last stage (the head) sets the pace: 1F1B's steady state runs at its speed.
  StageCosts slow;
  slow.forward_s = {1, 1, 2};
  slow.backward_s = {2, 2, 4};
  CHECK(simulate_schedule(one_f_one_b(3, 6), slow).makespan == Approx(1 + 1 + 6 * 6 + 2 + 2));
  // Costs that do not match the stages are refused.
  CHECK_THROWS_WITH(simulate_schedule(one_f_one_b(2, 2), slow), Catch::Contains("the schedule has 2 virtual stages"));
}

TEST_CASE("check_schedule names what is wrong", "[pipeline][schedule]") {
  // Rank 1 runs its micro-batches in another order than rank 0 sends them.
  Schedule s = one_f_one_b(2, 2);
  auto& l1 = s.ranks[1];
  for (Instr& in : l1) in.mb = 1 - in.mb;
  CHECK_THROWS_WITH(check_schedule(s), Catch::Contains("disagree on the order"));
  // Backwards in another order than the forwards.
  s = gpipe(2, 2);
  for (Instr& in : s.ranks[0])
    if (in.op == Op::Backward || in.op == Op::RecvGrad) in.mb = 1 - in.mb;
  CHECK_THROWS_WITH(check_schedule(s), Catch::Contains("backwards run the micro-batches in the order [1, 0]"));
  // A missing backward.
  s = gpipe(2, 2);
  s.ranks[0].pop_back();
  CHECK_THROWS_WITH(check_schedule(s), Catch::Contains("rank 0") && Catch::Contains("is missing"));
  // Rank 0 waits for mb 0's gradient before sending mb 0's activation.
  s = gpipe(2, 1);  // rank 0: F0.0 sa0.0 rg0.0 B0.0
  std::swap(s.ranks[0][1], s.ranks[0][2]);
  CHECK_THROWS_WITH(check_schedule(s), Catch::Contains("deadlocks") && Catch::Contains("rank 0 at instruction 1"));
  // Receive before the compute that needs it.
  s = gpipe(2, 1);  // rank 1: ra0.0 F0.0 B0.0 sg0.0
  std::swap(s.ranks[1][0], s.ranks[1][1]);
  CHECK_THROWS_WITH(check_schedule(s), Catch::Contains("RecvAct") && Catch::Contains("must come before Forward"));
}

TEST_CASE("forward-only schedule runs every chunk once per micro-batch", "[pipeline][schedule]") {
  const Schedule s = forward_only(3, 2, 2);
  const ScheduleStats st = check_schedule(s);
  for (int r = 0; r < 3; ++r) CHECK(forwards(s, r).size() == 4);
  for (int p : st.peak_in_flight) CHECK(p == 0);
}

TEST_CASE("partitions by layer count and by parameter count", "[pipeline][partition]") {
  CHECK(partition_by_layers(5, 2).str() == "[0, 3) [3, 5)");
  CHECK(partition_by_layers(8, 4).str() == "[0, 2) [2, 4) [4, 6) [6, 8)");
  // The embedding weighs two blocks: stage 0 gets one block.
  CHECK(partition_by_params({1, 1, 1, 1}, 2, 0, 2).str() == "[0, 1) [1, 4)");
  CHECK(partition_by_params({1, 1, 1, 1}, 0, 2, 2).str() == "[0, 3) [3, 4)");
  CHECK(partition_by_params({5, 1, 1, 1, 1, 1}, 0, 0, 3).str() == "[0, 1) [1, 3) [3, 6)");
  CHECK_THROWS_WITH(partition_by_layers(3, 4), Catch::Contains("3 blocks cannot fill 4 pipeline stages"));
  CHECK_THROWS_WITH(make_partition("flops", {1, 1}, 0, 0, 2, "m"), Catch::Contains("unknown split 'flops'"));
  CHECK_THROWS_WITH(make_partition("params", {1, 1}, 0, 0, 3, "model m"),
                    Catch::Contains("model m: every stage needs at least one block"));
}

// ---- the stage cut ----------------------------------------------------------------------

TEST_CASE("each rank holds only its stage's parameters; tied wte on the first and last", "[pipeline][stage]") {
  models::ModelConfig mc = models::model_config("nanogpt", "tiny");
  mc.n_layer = 4;
  // Each rank reports what it found wrong (Catch2 must not assert on a rank).
  const auto reports = testing::on_ranks(2, [&](int rank) {
    testing::RankReport rep;
    MeshPtr mesh = Mesh::world({{"pp", 2}});
    std::shared_ptr<models::LanguageModel> model;
    {
      nn::ConstructionScope meta(kMeta);
      model = models::build_model(mc);
    }
    PipelineStage stage(model, mesh, parallel::builtin_plan("none"), 1, StageOptions{});
    std::set<std::string> held;
    for (const auto& p : stage.named_parameters()) {
      held.insert(p.name);
      rep.expect(p.tensor.device() == kCPU, p.name + " is held but not on the CPU");
    }
    rep.expect(held.count("wte.weight") == 1, "wte.weight not held");  // tied: embedding on rank 0, LM head on rank 1
    rep.expect(held.count("wpe.weight") == size_t(rank == 0), "wpe.weight held on the wrong rank");
    rep.expect(held.count("ln_f.weight") == size_t(rank == 1), "ln_f.weight held on the wrong rank");
    rep.expect(held.count("layers.1.attn.wq.weight") == size_t(rank == 0), "layers.1 held on the wrong rank");
    rep.expect(held.count("layers.2.attn.wq.weight") == size_t(rank == 1), "layers.2 held on the wrong rank");
    for (const auto& p : stage.model().named_parameters())
      if (!held.count(p.name)) rep.expect(p.tensor.device().is_meta(), p.name + " allocated but not held");
    for (const ParamHome& h : stage.homes()) {
      if (h.name == "wte.weight") rep.expect(h.tied && h.primary == 0, "wte.weight not tied to rank 0");
      else rep.expect(!h.tied, h.name + " tied");
    }
    // Values are the single-device ones: (seed, path) alone decide them.
    auto ref = models::make_language_model(mc, 1);
    for (const auto& p : stage.named_parameters())
      for (const auto& q : ref->named_parameters())
        if (p.name == q.name)
          rep.expect(testing::bitwise_equal(p.tensor.detach(), q.tensor.detach()), p.name + " differs from one device");
    return rep.str();
  });
  CHECK(testing::first_failure(reports) == "");
}

// ---- a user's staged model: not a language model ----------------------------------------

namespace {

constexpr int64_t kFeatures = 8, kDim = 16, kClasses = 5;

// Filled with `value` where constructed with values; on Meta without (the
// owner's init_buffers() fills it after materialisation, as RoPE tables).
Tensor computed_buffer(double value) {
  const Device d = nn::ConstructionScope::device();
  return d.is_meta() ? empty({1}, TensorOptions().with_device(kMeta)) : full({1}, value);
}

// LayerNorm -> Linear -> GELU -> Linear -> Dropout, times a fixed residual
// scale (a computed buffer), plus the input. A penalised block also keeps
// an auxiliary loss, the mean square of its update (an activation penalty).
class ResidualMLP : public nn::UnaryModule {
 public:
  ResidualMLP(double dropout, bool penalised, double residual_scale)
      : nn::UnaryModule("ResidualMLP"), penalised(penalised), scale_value(residual_scale) {
    norm = child("norm", std::make_shared<nn::LayerNorm>(kDim));
    fc = child("fc", std::make_shared<nn::Linear>(kDim, 2 * kDim));
    act = child("act", std::make_shared<nn::GELU>());
    proj = child("proj", std::make_shared<nn::Linear>(2 * kDim, kDim));
    drop = child("drop", std::make_shared<nn::Dropout>(dropout));
    buffer("scale", scale, computed_buffer(scale_value), /*persistent=*/false);
  }
  Tensor forward(const Tensor& x) override {
    Tensor update = (*drop)((*proj)((*act)((*fc)((*norm)(x))))) * scale;
    if (penalised) aux = mean(square(update));
    return x + update;
  }
  void init_buffers() override {
    if (!scale.device().is_meta()) scale.fill_(scale_value);
  }

  const bool penalised;
  const double scale_value;
  Tensor scale, aux;
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> fc, proj;
  std::shared_ptr<nn::GELU> act;
  std::shared_ptr<nn::Dropout> drop;
};

// Features [B, 8] -> Linear -> residual MLP blocks -> LayerNorm -> Linear ->
// logits [B, 5] times a temperature (a computed buffer outside the blocks);
// loss: cross-entropy against class ids [B] plus 0.01 x the odd blocks'
// activation penalties.
class Classifier : public nn::StagedModel {
 public:
  explicit Classifier(int64_t n_blocks = 4, std::string type = "Classifier") : nn::StagedModel(std::move(type)) {
    proj_in = child("proj_in", std::make_shared<nn::Linear>(kFeatures, kDim));
    layers = child("layers", std::make_shared<nn::ModuleList>());
    for (int64_t i = 0; i < n_blocks; ++i) {
      blocks_.push_back(std::make_shared<ResidualMLP>(0.1, i % 2 == 1, 1.0 / std::sqrt(double(n_blocks))));
      layers->push_back(blocks_.back());
    }
    norm = child("norm", std::make_shared<nn::LayerNorm>(kDim));
    out = child("out", std::make_shared<nn::Linear>(kDim, kClasses));
    buffer("temperature", temperature, computed_buffer(0.5));
  }
  Tensor embed(const Tensor& x) override { return (*proj_in)(x); }
  const std::vector<std::shared_ptr<nn::UnaryModule>>& blocks() const override { return blocks_; }
  Tensor head(const Tensor& h) override { return (*out)((*norm)(h)) * temperature; }
  Tensor stage_loss(const Tensor& logits, const Tensor& classes) override { return cross_entropy(logits, classes); }
  Tensor block_aux_loss(size_t i) const override {
    return std::static_pointer_cast<ResidualMLP>(blocks_.at(i))->aux;
  }
  double aux_loss_coef() const override { return 0.01; }
  Tensor example_input() const override { return empty({1, kFeatures}, TensorOptions().with_device(kMeta)); }
  void init_buffers() override {
    if (!temperature.device().is_meta()) temperature.fill_(0.5);
  }

  Tensor temperature;
  std::shared_ptr<nn::Linear> proj_in, out;
  std::shared_ptr<nn::ModuleList> layers;
  std::shared_ptr<nn::LayerNorm> norm;

 protected:
  std::vector<std::shared_ptr<nn::UnaryModule>> blocks_;
};

constexpr uint64_t kSeed = 11;
constexpr int64_t kBatch = 8, kSteps = 10;

std::shared_ptr<Classifier> classifier(bool on_meta, int64_t n_blocks = 4) {
  if (on_meta) {
    nn::ConstructionScope meta(kMeta);
    return nn::make_model<Classifier>(n_blocks);
  }
  auto m = nn::make_model<Classifier>(n_blocks);
  m->reset_parameters(kSeed);
  return m;
}

// Micro-batch m of M of step `step`'s batch (the same on every rank): random
// features, and as class the index of the largest of the first five (a rule
// the model can learn, so the loss falls).
MicroBatch classifier_batch(int64_t step, int64_t m, int64_t M) {
  const int64_t b = kBatch / M;
  Tensor x = testing::uniform({kBatch, kFeatures}, 100 + uint64_t(step));
  Tensor y = empty({kBatch}, TensorOptions(DType::Int64));
  const float* xs = x.data<float>();
  for (int64_t i = 0; i < kBatch; ++i) {
    const float* row = xs + i * kFeatures;
    y.data<int64_t>()[i] = std::max_element(row, row + kClasses) - row;
  }
  return {x.narrow(0, m * b, b).contiguous(), y.narrow(0, m * b, b).contiguous(), m * b};
}

nn::AdamWOptions classifier_adamw() {
  nn::AdamWOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  return o;
}

struct ClassifierRun {
  std::vector<double> loss_sums, grad_norms;
  std::vector<std::pair<std::string, Tensor>> params;  // after the last step, full
  Tensor eval_output;                                   // of the first batch's inputs, in eval mode
};

// The one-device loop a pipeline must reproduce: loss(forward(x), y) per
// micro-batch, backward of loss / M, clipping at 1, AdamW.
ClassifierRun train_classifier_one_device(int64_t M) {
  numerics::BitwiseGuard bitwise(true);
  ClassifierRun r;
  auto model = classifier(false);
  nn::AdamW opt(nn::default_param_groups(*model, 0.1), classifier_adamw());
  for (int64_t step = 0; step < kSteps; ++step) {
    double loss_sum = 0;
    for (int64_t m = 0; m < M; ++m) {
      const MicroBatch b = classifier_batch(step, m, M);
      nn::ForwardScope scope({kSeed, uint64_t(step), b.first_sample, kBatch});
      Tensor loss = model->loss(model->forward(b.inputs), b.targets);
      loss_sum += loss.item<double>();
      (M == 1 ? loss : loss / double(M)).backward();
    }
    r.loss_sums.push_back(loss_sum);
    r.grad_norms.push_back(nn::clip_grad_norm_(model->parameters(), 1.0));
    opt.step();
    opt.zero_grad();
  }
  NoGradGuard ng;
  for (const auto& p : model->named_parameters()) r.params.emplace_back(p.name, p.tensor.detach().clone());
  model->eval();
  r.eval_output = model->forward(classifier_batch(0, 0, 1).inputs);
  return r;
}

// The same loop pipelined on `dims` (ranks as threads, bitwise mode); rank
// 0's losses, norms and gathered parameters. Every rank builds its own model.
ClassifierRun train_classifier_pipelined(const std::vector<Mesh::DimSpec>& dims, const std::string& schedule,
                                         bool on_meta, int64_t M) {
  int world = 1;
  for (const auto& d : dims) world *= int(d.size);
  ClassifierRun r;
  std::atomic<bool> no_aux_loss{false};  // checked after the ranks finish: Catch2 must not assert on a rank
  comm::run_local(world, [&](int rank) {
    numerics::BitwiseGuard bitwise(true);
    MeshPtr mesh = Mesh::world(dims);
    PipelineOptions o;
    o.schedule = schedule;
    Pipeline pipe(classifier(on_meta), mesh, parallel::builtin_plan("none"), kSeed, M, o);
    nn::AdamW opt(pipe.param_groups(0.1), classifier_adamw());
    for (int64_t step = 0; step < kSteps; ++step) {
      std::vector<MicroBatch> mbs;
      for (int64_t m = 0; m < M; ++m) mbs.push_back(classifier_batch(step, m, M));
      const PipelineStepResult res = pipe.train_step(kSeed, uint64_t(step), kBatch, mbs);
      const double norm = pipe.clip_grad_norm_(1.0);
      opt.step();
      opt.zero_grad();
      if (!res.aux_loss.has_value()) no_aux_loss = true;  // the odd blocks' penalties, summed over the stages
      if (rank == 0) r.loss_sums.push_back(res.loss_sum), r.grad_norms.push_back(norm);
    }
    auto params = pipe.gather_parameters();
    pipe.model().eval();
    Tensor out = pipe.forward(pipe.layout(classifier_batch(0, 0, 1).inputs));  // every rank gets the output
    Tensor full = out.is_distributed() ? full_tensor(out) : out;
    if (rank == 0) r.params = params, r.eval_output = full;
  });
  CHECK_FALSE(no_aux_loss);
  return r;
}

void check_same_bits(const ClassifierRun& ref, const ClassifierRun& got, const std::string& what) {
  INFO(what);
  REQUIRE(got.loss_sums.size() == ref.loss_sums.size());
  for (size_t i = 0; i < ref.loss_sums.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(got.loss_sums[i] == ref.loss_sums[i]);
    CHECK(got.grad_norms[i] == ref.grad_norms[i]);
  }
  REQUIRE(got.params.size() == ref.params.size());
  for (size_t i = 0; i < ref.params.size(); ++i) {
    INFO("parameter " << ref.params[i].first);
    CHECK(got.params[i].first == ref.params[i].first);
    CHECK(testing::bitwise_equal(got.params[i].second, ref.params[i].second));
  }
  CHECK(testing::bitwise_equal(got.eval_output, ref.eval_output));
}

}  // namespace

TEST_CASE("StagedModel: forward runs the stages, loss adds the blocks' aux losses in training",
          "[pipeline][staged]") {
  auto m = classifier(false);
  const MicroBatch b = classifier_batch(0, 0, 1);
  nn::ForwardScope scope({kSeed, 0, 0, kBatch});
  Tensor h = m->embed(b.inputs);
  for (const auto& blk : m->blocks()) h = (*blk)(h);
  const Tensor by_hand = m->head(h);
  const Tensor out = m->forward(b.inputs);
  CHECK(out.shape() == Dims{kBatch, kClasses});
  CHECK(testing::bitwise_equal(out, by_hand));  // same dropout masks: same scope, same paths
  // aux_loss: the penalised (odd) blocks' losses in block order; the even ones have none.
  CHECK_FALSE(m->block_aux_loss(0).defined());
  const Tensor aux = m->aux_loss();
  CHECK(testing::bitwise_equal(aux, m->block_aux_loss(1) + m->block_aux_loss(3)));
  CHECK(aux.item<double>() > 0);
  const Tensor ce = cross_entropy(out, b.targets);
  CHECK(testing::bitwise_equal(m->loss(out, b.targets), ce + aux * 0.01));
  m->eval();  // evaluation: the loss alone
  CHECK(testing::bitwise_equal(m->loss(out, b.targets), ce));
  CHECK(m->example_input().device().is_meta());
}

TEST_CASE("a user's staged model on pp2: each rank keeps the values of what it holds, the rest is Meta",
          "[pipeline][stage][staged]") {
  // The stage's seed initialises only Meta parameters: a materialised model
  // keeps the values it was built with (seed kSeed here), one built on Meta
  // gets those of (stage seed, path).
  const uint64_t stage_seed = kSeed + 1;
  auto reference = [](uint64_t seed) {
    auto m = nn::make_model<Classifier>();
    m->reset_parameters(seed);
    return m;
  };
  for (bool on_meta : {false, true}) {
    INFO((on_meta ? "built on Meta" : "materialised"));
    const auto ref = reference(on_meta ? stage_seed : kSeed);
    // Each rank reports what it found wrong (Catch2 must not assert on a rank).
    const auto reports = testing::on_ranks(2, [&](int rank) {
      testing::RankReport rep;
      auto model = classifier(on_meta);
      PipelineStage stage(model, Mesh::world({{"pp", 2}}), parallel::builtin_plan("none"), stage_seed,
                          StageOptions{});
      rep.expect(&stage.model() == model.get(), "stage.model() is not the model passed");
      rep.expect(model->is_training(), "tracing left the model in eval mode");
      rep.expect(stage.partition().str() == "[0, 2) [2, 4)", "partition " + stage.partition().str());
      std::set<std::string> held;
      for (const auto& p : stage.named_parameters()) held.insert(p.name);
      for (const std::string name : {"proj_in.weight", "layers.1.fc.weight"})
        rep.expect(held.count(name) == size_t(rank == 0), name + " held on the wrong rank");
      for (const std::string name : {"layers.2.fc.weight", "out.weight"})
        rep.expect(held.count(name) == size_t(rank == 1), name + " held on the wrong rank");
      const auto ref_params = ref->named_parameters();
      const auto params = model->named_parameters();
      if (params.size() != ref_params.size()) return std::string("parameter counts differ from the reference");
      for (size_t i = 0; i < params.size(); ++i) {
        const std::string& name = params[i].name;
        if (held.count(name)) {
          rep.expect(params[i].tensor.device() == kCPU, name + " held but not on the CPU");
          rep.expect(params[i].tensor.requires_grad(), name + " held but does not require grad");
          rep.expect(testing::bitwise_equal(params[i].tensor.detach(), ref_params[i].tensor.detach()),
                     name + " differs from the reference");
        } else {
          rep.expect(params[i].tensor.device().is_meta(), name + " not held but allocated");  // memory dropped
        }
      }
      for (const ParamHome& h : stage.homes()) rep.expect(!h.tied, h.name + " tied");
      // Buffers: a block's where the block runs; the temperature (outside the
      // blocks) on the ranks that run embed or head: both here.
      for (size_t b = 0; b < 4; ++b) {
        const Tensor& scale = std::static_pointer_cast<ResidualMLP>(model->blocks()[b])->scale;
        const std::string what = "block " + std::to_string(b) + "'s scale";
        if ((b < 2) == (rank == 0)) rep.expect(scale.item<double>() == 0.5, what + " is not 0.5");
        else rep.expect(scale.device().is_meta(), what + " allocated on a rank that does not run it");
      }
      rep.expect(model->temperature.item<double>() == 0.5, "temperature is not 0.5");
      const std::string expected = rank == 0 ? "pp rank 0 of 2: embed + stage 0 blocks [0, 2); 14 parameter tensors"
                                             : "pp rank 1 of 2: stage 1 blocks [2, 4) + head; 16 parameter tensors";
      rep.expect(stage.describe() == expected, "describe() gave '" + stage.describe() + "'");
      return rep.str();
    });
    CHECK(testing::first_failure(reports) == "");
  }
}

TEST_CASE("a user's staged model trains on pp2 (1F1B, GPipe) and dp2 x pp2 with the one-device bits",
          "[pipeline][train][staged]") {
  const ClassifierRun ref = train_classifier_one_device(2);
  REQUIRE(ref.loss_sums.size() == size_t(kSteps));
  CHECK(ref.loss_sums.back() < ref.loss_sums.front());
  // Materialised on the CPU with its values, as a user who initialised (or
  // loaded) the weights passes it.
  check_same_bits(ref, train_classifier_pipelined({{"pp", 2}}, "1f1b", false, 2), "pp=2 1f1b, materialised");
  check_same_bits(ref, train_classifier_pipelined({{"pp", 2}}, "gpipe", false, 2), "pp=2 gpipe, materialised");
  // Built on Meta: the stages initialise from (seed, path), the values of the materialised model.
  check_same_bits(ref, train_classifier_pipelined({{"pp", 2}}, "1f1b", true, 2), "pp=2 1f1b, on Meta");
  check_same_bits(ref, train_classifier_pipelined({{"dp", 2}, {"pp", 2}}, "1f1b", false, 2), "dp=2 x pp=2 1f1b");
  // Four micro-batches of two rows: the data-parallel halves are single rows.
  check_same_bits(train_classifier_one_device(4), train_classifier_pipelined({{"dp", 2}, {"pp", 2}}, "gpipe", true, 4),
                  "dp=2 x pp=2 gpipe, on Meta, 4 micro-batches");
}

namespace {

// A Classifier with a parameter that neither embed(), head() nor a block uses.
class ClassifierWithUnused : public Classifier {
 public:
  ClassifierWithUnused() : Classifier(4, "ClassifierWithUnused") {
    unused = child("unused", std::make_shared<nn::Linear>(3, 2, /*bias=*/false));
  }
  std::shared_ptr<nn::Linear> unused;
};

// A Classifier whose blocks() lists block 0 twice.
class ClassifierRepeatingABlock : public Classifier {
 public:
  ClassifierRepeatingABlock() : Classifier(2, "ClassifierRepeatingABlock") { blocks_.push_back(blocks_[0]); }
};

// A Classifier with a block that is not one of its submodules.
class ClassifierWithStrayBlock : public Classifier {
 public:
  ClassifierWithStrayBlock() : Classifier(2, "ClassifierWithStrayBlock") {
    blocks_.push_back(std::make_shared<ResidualMLP>(0.0, false, 1.0));
  }
};

}  // namespace

TEST_CASE("a staged model that cannot be pipelined: errors name the model and the sizes", "[pipeline][staged]") {
  auto expect = [](const std::function<std::shared_ptr<nn::StagedModel>()>& make,
                   const std::vector<Mesh::DimSpec>& dims, const std::vector<std::string>& needles) {
    std::string what;
    try {
      comm::run_local(2, [&](int) {
        Pipeline pipe(make(), Mesh::world(dims), parallel::builtin_plan("none"), kSeed, 2, PipelineOptions{});
      });
    } catch (const Error& e) {
      what = e.what();
    }
    INFO(what);
    REQUIRE_FALSE(what.empty());
    for (const auto& n : needles) CHECK_THAT(what, Catch::Contains(n));
  };
  const std::vector<Mesh::DimSpec> pp2{{"pp", 2}};
  expect([] { return nn::make_model<ClassifierWithUnused>(); }, pp2,
         {"parameter 'unused.weight' [2, 3] of ClassifierWithUnused is used by neither embed(), head() nor a block"});
  expect([] { return classifier(false); }, {{"dp", 2}}, {"Classifier: mesh (dp=2) has no 'pp' dim"});
  expect([] { return classifier(true, 1); }, pp2,
         {"Classifier has 1 blocks, fewer than the pp x V = 2 x 1 = 2 stages of mesh (pp=2)"});
  expect([] { return nn::make_model<ClassifierRepeatingABlock>(); }, pp2,
         {"ClassifierRepeatingABlock: blocks 0 and 2 share the parameter 'layers.0.norm.weight'"});
  expect([] { return nn::make_model<ClassifierWithStrayBlock>(); }, pp2,
         {"block 2 of ClassifierWithStrayBlock is not a submodule of the model (its parameter 'norm.weight' is not "
          "the model's)"});
  expect([] { return std::shared_ptr<nn::StagedModel>(); }, pp2, {"needs a model (got a null nn::StagedModel)"});
  // A model already laid out on a mesh: the pipeline lays out the plain one itself.
  expect(
      [] {
        auto m = classifier(false);
        parallel::parallelize(*m, Mesh::world({{"dp", 2}}), parallel::builtin_plan("none"));
        return m;
      },
      pp2, {"parameter 'proj_in.weight' of Classifier is already distributed"});
}

// ---- training equivalence ----------------------------------------------------------------

namespace {

struct TrainedRun {
  std::vector<double> losses, grad_norms, comm_wait, comm_wait_mean;
  std::vector<std::pair<std::string, Tensor>> params;
  std::string param_hash;
  double heldout = 0;
};

TrainConfig base(const std::string& model, const std::string& out) {
  TrainConfig c;
  c.model = model;
  c.model_config = "tiny";
  c.n_layer = 4;  // pp 2 x V 2 needs four blocks
  c.steps = 20;
  c.batch_size = 8;
  c.seq_len = 16;
  c.micro_batches = 4;
  c.eval_every = 0;
  c.eval_batches = 2;
  c.sample_length = 0;
  c.lr = 3e-3;
  c.min_lr = 3e-4;
  c.warmup_steps = 5;
  c.dropout = model == "nanogpt" ? 0.1 : -1;
  c.out_dir = out;
  return c;
}

TrainedRun run(TrainConfig c) {
  TrainedRun r;
  train::TrainHooks h;
  h.quiet = true;
  h.keep_params = true;
  h.on_step = [&](const train::StepMetrics& m) {
    r.losses.push_back(*m.loss);
    r.grad_norms.push_back(*m.grad_norm);
    for (auto& [k, v] : m.extras) {
      if (k == "comm_wait_s") r.comm_wait.push_back(v);
      if (k == "comm_wait_mean_s") r.comm_wait_mean.push_back(v);
    }
  };
  train::TrainResult res = train::run_training(c, h);
  r.params = res.final_params;
  r.param_hash = res.param_hash;
  r.heldout = res.heldout_loss;
  return r;
}

std::string scratch(const std::string& name) {
  return (std::filesystem::path(tessel::testing::scratch_dir("pipeline")) / name).string();
}

void check_same(const TrainedRun& ref, const TrainedRun& got, const std::string& what) {
  INFO(what);
  REQUIRE(got.losses.size() == ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(got.losses[i] == Approx(ref.losses[i]).epsilon(2e-5));
    CHECK(got.grad_norms[i] == Approx(ref.grad_norms[i]).epsilon(1e-4));
  }
  CHECK(got.heldout == Approx(ref.heldout).epsilon(2e-5));  // the forward-only path
  REQUIRE(got.params.size() == ref.params.size());
  for (size_t i = 0; i < ref.params.size(); ++i) {
    INFO("parameter " << ref.params[i].first);
    CHECK(got.params[i].first == ref.params[i].first);
    CHECK(testing::allclose(got.params[i].second, ref.params[i].second, 1e-4, 2e-5));
  }
  // The metrics' hash covers every stage's parameters.
  CHECK(got.param_hash == train::param_hash(got.params));
  CHECK(got.comm_wait.size() == got.losses.size());
  CHECK(got.comm_wait_mean.size() == got.losses.size());
}

}  // namespace

TEST_CASE("20 steps on pp2 (gpipe, 1f1b, interleaved), tp2+sp x pp2 and dp2 x tp2 x pp2 match one device",
          "[pipeline][train]") {
  for (std::string model : {"nanogpt", "llama", "mixtral"}) {
    const TrainedRun ref = run(base(model, scratch(model + "_ref")));
    REQUIRE(ref.losses.size() == 20);
    CHECK(ref.losses.back() < ref.losses.front());
    struct Layout {
      const char* mesh;
      const char* schedule;
      const char* split;
      bool sp;
    };
    for (Layout l : {Layout{"pp=2", "gpipe", "layers", false}, Layout{"pp=2", "1f1b", "params", false},
                     Layout{"pp=2", "interleaved", "layers", false}, Layout{"tp=2,pp=2", "gpipe", "layers", true},
                     Layout{"dp=2,tp=2,pp=2", "1f1b", "layers", false},
                     Layout{"dp=2,tp=2,pp=2", "interleaved", "layers", false}}) {
      TrainConfig c = base(model, scratch(model + "_pp"));
      c.mesh = l.mesh;
      c.pipeline_schedule = l.schedule;
      c.pipeline_split = l.split;
      c.sequence_parallel = l.sp;
      const TrainedRun got = run(c);
      check_same(ref, got,
                 model + " on " + l.mesh + (l.sp ? " + sp " : " ") + l.schedule + " split by " + l.split);
      if (model != "nanogpt" && std::string(l.mesh) == "pp=2") {
        // Pipeline stages alone change no arithmetic: each micro-batch's
        // gradients accumulate in the same order, and the norm is combined
        // in the single-device order. (NanoGPT's tied wte sums its embedding
        // and LM-head gradients in another order; dp/tp have their own.)
        INFO(model << " on pp=2 " << l.schedule << ": bitwise");
        for (size_t i = 0; i < ref.grad_norms.size(); ++i) CHECK(got.grad_norms[i] == ref.grad_norms[i]);
        for (size_t i = 0; i < ref.params.size(); ++i)
          CHECK(testing::bitwise_equal(got.params[i].second, ref.params[i].second));
      }
    }
  }
}

TEST_CASE("a language model built on Meta and pipelined by tessel::parallelize: each stage its own values",
          "[pipeline][train]") {
  const models::ModelConfig mc = [] {
    models::ModelConfig m = models::model_config("llama", "tiny");
    m.n_layer = 4;
    return m;
  }();
  RunOptions o;
  o.seed = 7;
  o.micro_batches = 2;
  // char, not bool: std::vector<bool> packs the ranks' flags into one word, which two
  // rank threads writing at once is a data race (ThreadSanitizer found it).
  std::vector<char> head_meta(2), head_equal(2), is_pipelined(2);
  comm::run_local(2, [&](int rank) {
    std::shared_ptr<models::LanguageModel> lm;
    {
      nn::ConstructionScope meta(kMeta);
      lm = models::build_model(mc);
    }
    auto run = parallelize(lm, Mesh::world({{"pp", 2}}), parallel::builtin_plan("llama"), adamw(), o);
    is_pipelined[size_t(rank)] = run.pipeline() != nullptr && run.pipeline()->schedule().name == "1f1b";
    // The output layer lives on the last rank, initialised from (seed, path) as on one device.
    const Tensor out = run.model().submodule("output").parameters()[0];
    head_meta[size_t(rank)] = out.device().is_meta();
    if (!out.device().is_meta()) {
      auto ref = models::make_language_model(mc, 7);
      head_equal[size_t(rank)] = testing::bitwise_equal(out.detach(), ref->submodule("output").parameters()[0].detach());
    }
  });
  CHECK(is_pipelined[0]);
  CHECK(is_pipelined[1]);
  CHECK(head_meta[0]);
  CHECK_FALSE(head_meta[1]);
  CHECK(head_equal[1]);
}

TEST_CASE("bad pipeline settings fail before anything is written", "[pipeline][train]") {
  auto expect = [](TrainConfig c, const std::string& needle) {
    std::string out = scratch("bad");
    c.out_dir = out;
    CHECK_THROWS_WITH(train::run_training(c, {nullptr, true}), Catch::Contains(needle));
    CHECK_FALSE(std::filesystem::exists(out));
  };
  TrainConfig c = base("nanogpt", "");
  c.steps = 1;
  TrainConfig bad = c;
  bad.mesh = "pp=2";
  bad.micro_batches = 1;
  expect(bad, "1f1b needs micro_batches >= pp");
  bad = c;
  bad.mesh = "pp=2";
  bad.pipeline_schedule = "interleaved";
  bad.micro_batches = 2;
  bad.n_layer = 2;
  expect(bad, "has 2 blocks, fewer than the pp x V = 2 x 2 = 4 stages of mesh (pp=2)");
  bad = c;
  bad.mesh = "pp=2";
  bad.pipeline_schedule = "interleaved";
  bad.micro_batches = 8;
  bad.batch_size = 8;
  bad.virtual_stages = 3;
  expect(bad, "has 4 blocks, fewer than the pp x V = 2 x 3 = 6 stages");
  bad = c;
  bad.mesh = "pp=2";
  bad.pipeline_schedule = "interleaved";
  bad.batch_size = 6;
  bad.micro_batches = 3;
  expect(bad, "multiple of pp");
  bad = c;
  bad.mesh = "pp=2";
  bad.pipeline_schedule = "gpipe";
  bad.virtual_stages = 2;
  expect(bad, "needs the interleaved schedule");
  bad = c;
  bad.mesh = "pp=2";
  bad.pipeline_schedule = "zigzag";
  expect(bad, "pipeline_schedule must be one of gpipe | 1f1b | interleaved");
  bad = c;
  bad.mesh = "pp=2";
  bad.pipeline_split = "flops";
  expect(bad, "pipeline_split must be one of layers | params");
}


// Not run by default: prints the schedules and the simulated bubbles quoted
// in docs/parallel.md (test_pipeline "[.print]").
TEST_CASE("print schedules and bubbles", "[.print]") {
  std::printf("%s\n%s\n%s\n", gpipe(2, 4).str().c_str(), one_f_one_b(2, 4).str().c_str(),
              interleaved_1f1b(2, 4, 2).str().c_str());
  std::printf("pp  M  gpipe  1f1b  interleaved V=2  V=4   | peak in flight on rank 0: gpipe 1f1b V=2 V=4\n");
  for (int pp : {2, 4, 8}) {
    for (int m : {pp, 2 * pp, 4 * pp}) {
      auto g = check_schedule(gpipe(pp, m)), f = check_schedule(one_f_one_b(pp, m));
      auto i2 = check_schedule(interleaved_1f1b(pp, m, 2)), i4 = check_schedule(interleaved_1f1b(pp, m, 4));
      std::printf("%2d %2d  %.3f  %.3f  %.3f           %.3f | %d %d %d %d\n", pp, m, g.bubble, f.bubble, i2.bubble,
                  i4.bubble, g.peak_in_flight[0], f.peak_in_flight[0], i2.peak_in_flight[0], i4.peak_in_flight[0]);
    }
  }
}
