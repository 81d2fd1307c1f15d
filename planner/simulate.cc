#include "planner/simulate.h"

#include <algorithm>
#include <exception>
#include <mutex>
#include <optional>
#include <tuple>

#include <fmt/format.h>

#include "autograd/api.h"
#include "dtensor/mesh.h"
#include "models/language_model.h"
#include "nn/autocast.h"
#include "nn/moe.h"
#include "nn/parallel/derive.h"
#include "nn/parallel/parallelize.h"
#include "nn/parallel/plan.h"
#include "runtime/comm/comm.h"
#include "runtime/error.h"
#include "runtime/numerics.h"

namespace tessel::planner {
namespace {

RankCost one_rank(const PlanModel& pm, const ShardLayout& l, const std::vector<Mesh::DimSpec>& dims) {
  cost::CountScope counting;
  MeshPtr mesh = dims.empty() ? nullptr : Mesh::world(dims);
  std::shared_ptr<nn::StagedModel> model;
  {
    nn::ConstructionScope meta(kMeta);
    model = pm.build(pm.n_layer);
  }
  TESSEL_CHECK(model != nullptr, "plan", "'{}': build({}) gave no model", pm.name, pm.n_layer);
  const parallel::ParallelPlan plan = pm.plan_for(*model, l.sequence_parallel);
  if (mesh) parallel::parallelize(*model, mesh, plan);
  if (l.recompute != nn::Recompute::None) nn::apply_recompute(*model, l.recompute);
  // The model was built whole on Meta, then laid out: a real run builds it
  // on Meta too and materialises only its pieces (tessel::parallelize), so
  // the whole parameters never cost memory. The step's peak starts here.
  counting.reset_meta_peak();
  model->train();
  RankCost r;
  r.param_bytes = mesh ? parallel::local_parameter_bytes(*model) : [&] {
    int64_t b = 0;
    for (const auto& nt : model->named_parameters()) b += int64_t(nt.tensor.nbytes());
    return b;
  }();
  // The step's counts only: laying the model out may redistribute (Meta) parameters.
  const cost::Counts before = counting.counts();
  // l.batch sequences on each rank: the ep group's batch is cut over ep
  // (the plans' data layout, {ep: Shard(0)}), so the group holds ep times it.
  Tensor ids = raw::empty({l.batch * l.ep, l.seq_len}, DType::Int64, kMeta);
  Tensor targets = raw::empty({l.batch * l.ep, l.seq_len}, DType::Int64, kMeta);
  if (mesh) {
    ids = parallel::distribute_batch(ids, mesh, plan);
    targets = parallel::distribute_batch(targets, mesh, plan);
  }
  // Memory at two moments besides the peak: when the forward is done, and
  // the most alive from then until the last block's backward is done (the
  // gradient of its input arrives). With many blocks the step's peak is in
  // that window, every block's saved activations still alive; with the one
  // or two simulated it may come later, when the gradients of a large
  // embedding are made. Both scale with the depth (planner.cc takes the max).
  int64_t window_peak = -1;
  bool hooked = false;
  if (!model->blocks().empty()) {
    model->blocks().back()->register_forward_pre_hook([&](nn::Module&, const Tensor& x) {
      if (!hooked && x.requires_grad()) {  // once: a recomputed block runs its forward again
        hooked = true;
        x.register_hook([&](const Tensor& g) {
          window_peak = counting.meta_peak_bytes();
          return g;
        });
      }
      return x;
    });
  }
  Tensor loss;
  {
    std::optional<nn::AutocastScope> autocast;  // as RunOptions::compute runs the forward
    if (l.compute != DType::Float32) autocast.emplace(l.compute);
    loss = model->loss(model->forward(ids), targets);
  }
  r.live_after_forward = counting.meta_live_bytes();
  const int64_t forward_peak = counting.meta_peak_bytes();
  counting.reset_meta_peak();
  loss.backward();
  const cost::Counts c = cost::difference(counting.counts(), before);
  r.gemm_flops = c.gemm_flops;
  r.attention_flops = c.attention_flops;
  r.flops = c.flops();
  r.ops = c.ops;
  r.op_bytes = c.op_bytes;
  r.comm_bytes = c.comm_bytes;
  r.comm_calls = c.comm_calls;
  r.replicated_fallbacks = c.replicated_fallbacks;
  r.peak_bytes = std::max(forward_peak, counting.meta_peak_bytes());
  r.peak_backward_start = window_peak >= 0 ? window_peak : r.peak_bytes;
  return r;
}

RankCost combine(const RankCost& a, const RankCost& b, int64_t wa, int64_t wb) {
  RankCost r;
  r.flops = wa * a.flops + wb * b.flops;
  r.gemm_flops = wa * a.gemm_flops + wb * b.gemm_flops;
  r.attention_flops = wa * a.attention_flops + wb * b.attention_flops;
  r.ops = wa * a.ops + wb * b.ops;
  r.op_bytes = wa * a.op_bytes + wb * b.op_bytes;
  r.param_bytes = wa * a.param_bytes + wb * b.param_bytes;
  r.peak_bytes = wa * a.peak_bytes + wb * b.peak_bytes;
  r.live_after_forward = wa * a.live_after_forward + wb * b.live_after_forward;
  r.peak_backward_start = wa * a.peak_backward_start + wb * b.peak_backward_start;
  for (const auto* src : {&a, &b}) {
    const int64_t w = src == &a ? wa : wb;
    for (const auto& [k, v] : src->comm_bytes) r.comm_bytes[k] += w * v;
    for (const auto& [k, v] : src->comm_calls) r.comm_calls[k] += w * v;
    for (const auto& [k, v] : src->replicated_fallbacks) r.replicated_fallbacks[k] += w * v;
  }
  return r;
}

// The rank with the most work (then memory): the one that sets the pace.
RankCost largest(const std::vector<RankCost>& v) {
  return *std::max_element(v.begin(), v.end(), [](const RankCost& a, const RankCost& b) {
    return std::tie(a.flops, a.peak_bytes) < std::tie(b.flops, b.peak_bytes);
  });
}

}  // namespace

PlanModel::PlanModel(const models::ModelConfig& config)
    : name(config.describe()),
      n_layer(config.n_layer),
      dim(config.dim),
      max_seq_len(config.max_seq_len),
      num_experts(config.arch == models::Arch::Mixtral ? config.num_experts : 0),
      n_head(config.n_head),
      n_kv_head(config.n_kv_head > 0 ? config.n_kv_head : config.n_head),
      build([config](int64_t n) {
        models::ModelConfig c = config;
        c.n_layer = n;
        return std::shared_ptr<nn::StagedModel>(models::build_model(c));
      }),
      // The family's built-in plan (what derive_plan gives for it, test_derive_plan).
      plan([arch = models::arch_name(config.arch)](nn::StagedModel&, bool sp) { return parallel::load_plan(arch, sp); }),
      train_args(fmt::format(FMT_STRING("--model {} --config {}"), models::arch_name(config.arch), config.name)) {}

PlanModel PlanModel::custom(std::string name, int64_t n_layer,
                            std::function<std::shared_ptr<nn::StagedModel>(int64_t n_layer)> build) {
  TESSEL_CHECK(n_layer >= 1 && build != nullptr, "plan", "'{}': needs n_layer >= 1 (got {}) and a build function",
               name, n_layer);
  PlanModel m;
  m.name = std::move(name);
  m.n_layer = n_layer;
  m.build = std::move(build);
  std::shared_ptr<nn::StagedModel> one;
  {
    nn::ConstructionScope meta(kMeta);
    one = m.build(1);
  }
  TESSEL_CHECK(one != nullptr && one->blocks().size() == 1, "plan", "'{}': build(1) must give a model of 1 block, got {}",
               m.name, one ? std::to_string(one->blocks().size()) : "none");
  const Tensor example = one->example_input();
  TESSEL_CHECK(example.defined() && example.dim() == 2, "plan",
               "'{}': the planner lays out token models (example_input() [B, T]); got {}", m.name,
               example.defined() ? example.desc() : "none");
  const Tensor h = one->embed(empty({1, 1}, TensorOptions(example.dtype()).with_device(kMeta)));
  m.dim = h.size(-1);
  for (nn::MoE* moe : nn::moe_layers(*one)) m.num_experts = std::max(m.num_experts, moe->config.num_experts);
  return m;
}

parallel::ParallelPlan PlanModel::plan_for(nn::StagedModel& model, bool sequence_parallel,
                                          parallel::DeriveReport* report) const {
  if (plan) return plan(model, sequence_parallel);
  parallel::DeriveOptions options;
  options.sequence_parallel = sequence_parallel;
  return parallel::derive_plan(model, options, report);
}

std::string ShardLayout::str() const {
  std::string s = fmt::format(FMT_STRING("tp={} cp={} ep={}"), tp, cp, ep);
  if (sequence_parallel) s += " sp";
  if (recompute != nn::Recompute::None) s += std::string(" recompute=") + nn::recompute_name(recompute);
  if (compute != DType::Float32) s += std::string(" ") + dtype_name(compute);
  if (on_mesh) s += " on a mesh";
  return s + fmt::format(FMT_STRING(" micro-batch {}x{}"), batch, seq_len);
}

std::vector<Mesh::DimSpec> mesh_dims(const ShardLayout& l) {
  std::vector<Mesh::DimSpec> dims;
  if (l.cp > 1) dims.push_back({"cp", l.cp});
  if (l.ep > 1) dims.push_back({"ep", l.ep});
  if (l.tp > 1) dims.push_back({"tp", l.tp});
  if (dims.empty() && l.on_mesh) dims.push_back({"dp", 1});
  return dims;
}

int64_t RankCost::total_comm_bytes() const {
  int64_t s = 0;
  for (const auto& [k, v] : comm_bytes) s += v;
  return s;
}

std::vector<RankCost> simulate(const PlanModel& config, const ShardLayout& l) {
  TESSEL_CHECK(l.tp >= 1 && l.cp >= 1 && l.ep >= 1 && l.batch >= 1 && l.seq_len >= 1, "plan",
               "simulate: bad layout {}", l.str());
  const std::vector<Mesh::DimSpec> dims = mesh_dims(l);
  const int n = int(l.tp * l.cp * l.ep);
  numerics::BitwiseGuard bitwise(l.bitwise);
  std::vector<RankCost> out(static_cast<size_t>(n));
  if (dims.empty()) {
    out[0] = one_rank(config, l, dims);
    return out;
  }
  // One thread per rank, each with its world (a 1-device mesh included,
  // whatever the caller's world: rank 0 of an MPI job plans too).
  std::mutex mu;
  std::string error;
  comm::run_local(n, [&](int rank) {
    try {
      out[size_t(rank)] = one_rank(config, l, dims);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lk(mu);
      if (error.empty()) error = e.what();
    }
  });
  TESSEL_CHECK(error.empty(), "plan", "{} on {}: {}", config.describe(), l.str(), error);
  return out;
}

RankCost ModelCost::at(int64_t blocks) const { return combine(base, block, 1, blocks); }

std::map<std::string, int64_t> ops_without_sharding_rule(const PlanModel& pm, int64_t seq_len) {
  ShardLayout l;
  l.seq_len = seq_len;
  l.on_mesh = true;
  std::map<std::string, int64_t> out;
  for (const auto& [op, calls] : simulate_per_block(pm, l).at(pm.n_layer).replicated_fallbacks)
    if (calls > 0) out[op] = calls;
  return out;
}

ModelCost simulate_per_block(const PlanModel& config, const ShardLayout& l) {
  // Two and three blocks: with one, the memory peak can fall in another
  // phase of the step than with more (LLaMA-3 8B with full recomputation:
  // +1380 MiB from one block to two, +1668 MiB per block from two on).
  PlanModel two = config, three = config;
  two.n_layer = 2;
  three.n_layer = 3;
  const RankCost c2 = largest(simulate(two, l)), c3 = largest(simulate(three, l));
  ModelCost m;
  m.block = combine(c3, c2, 1, -1);
  m.base = combine(c2, m.block, 1, -2);
  return m;
}

}  // namespace tessel::planner
