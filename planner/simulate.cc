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
#include "nn/parallel/parallelize.h"
#include "nn/parallel/plan.h"
#include "runtime/comm/comm.h"
#include "runtime/error.h"
#include "runtime/numerics.h"

namespace tessel::planner {
namespace {

RankCost one_rank(const models::ModelConfig& config, const ShardLayout& l, const std::vector<Mesh::DimSpec>& dims) {
  cost::CountScope counting;
  MeshPtr mesh = dims.empty() ? nullptr : Mesh::world(dims);
  std::shared_ptr<models::LanguageModel> model;
  {
    nn::ConstructionScope meta(kMeta);
    model = models::build_model(config);
  }
  const parallel::ParallelPlan plan = parallel::load_plan(models::arch_name(config.arch), l.sequence_parallel);
  if (mesh) parallel::parallelize(*model, mesh, plan);
  if (l.recompute != nn::Recompute::None) nn::apply_recompute(*model, l.recompute);
  model->train();
  RankCost r;
  r.param_bytes = mesh ? parallel::local_parameter_bytes(*model) : [&] {
    int64_t b = 0;
    for (const auto& nt : model->named_parameters()) b += int64_t(nt.tensor.nbytes());
    return b;
  }();
  // The step's counts only: laying the model out may redistribute (Meta) parameters.
  const cost::Counts before = counting.counts();
  Tensor ids = raw::empty({l.batch, l.seq_len}, DType::Int64, kMeta);
  Tensor targets = raw::empty({l.batch, l.seq_len}, DType::Int64, kMeta);
  if (mesh) {
    ids = parallel::distribute_batch(ids, mesh, plan);
    targets = parallel::distribute_batch(targets, mesh, plan);
  }
  Tensor loss;
  {
    std::optional<nn::AutocastScope> autocast;  // as RunOptions::compute runs the forward
    if (l.compute != DType::Float32) autocast.emplace(l.compute);
    loss = model->loss(model->forward(ids), targets);
  }
  loss.backward();
  const cost::Counts c = cost::difference(counting.counts(), before);
  r.gemm_flops = c.gemm_flops;
  r.attention_flops = c.attention_flops;
  r.flops = c.flops();
  r.ops = c.ops;
  r.op_bytes = c.op_bytes;
  r.comm_bytes = c.comm_bytes;
  r.comm_calls = c.comm_calls;
  r.peak_bytes = counting.meta_peak_bytes();
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
  for (const auto* src : {&a, &b}) {
    const int64_t w = src == &a ? wa : wb;
    for (const auto& [k, v] : src->comm_bytes) r.comm_bytes[k] += w * v;
    for (const auto& [k, v] : src->comm_calls) r.comm_calls[k] += w * v;
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

std::string ShardLayout::str() const {
  std::string s = fmt::format(FMT_STRING("tp={} cp={} ep={}"), tp, cp, ep);
  if (sequence_parallel) s += " sp";
  if (recompute != nn::Recompute::None) s += std::string(" recompute=") + nn::recompute_name(recompute);
  if (compute != DType::Float32) s += std::string(" ") + dtype_name(compute);
  return s + fmt::format(FMT_STRING(" micro-batch {}x{}"), batch, seq_len);
}

std::vector<Mesh::DimSpec> mesh_dims(const ShardLayout& l) {
  std::vector<Mesh::DimSpec> dims;
  if (l.cp > 1) dims.push_back({"cp", l.cp});
  if (l.ep > 1) dims.push_back({"ep", l.ep});
  if (l.tp > 1) dims.push_back({"tp", l.tp});
  return dims;
}

int64_t RankCost::total_comm_bytes() const {
  int64_t s = 0;
  for (const auto& [k, v] : comm_bytes) s += v;
  return s;
}

std::vector<RankCost> simulate(const models::ModelConfig& config, const ShardLayout& l) {
  TESSEL_CHECK(l.tp >= 1 && l.cp >= 1 && l.ep >= 1 && l.batch >= 1 && l.seq_len >= 1, "plan",
               "simulate: bad layout {}", l.str());
  const std::vector<Mesh::DimSpec> dims = mesh_dims(l);
  const int n = int(l.tp * l.cp * l.ep);
  numerics::BitwiseGuard bitwise(l.bitwise);
  std::vector<RankCost> out(static_cast<size_t>(n));
  if (n == 1) {
    out[0] = one_rank(config, l, dims);
    return out;
  }
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

ModelCost simulate_per_block(const models::ModelConfig& config, const ShardLayout& l) {
  models::ModelConfig one = config, two = config;
  one.n_layer = 1;
  two.n_layer = 2;
  const RankCost c1 = largest(simulate(one, l)), c2 = largest(simulate(two, l));
  ModelCost m;
  m.block = combine(c2, c1, 1, -1);
  m.base = combine(c1, m.block, 1, -1);
  return m;
}

}  // namespace tessel::planner
