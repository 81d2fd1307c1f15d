#include "nn/parallel/pipeline/stage.h"

#include <map>
#include <set>

#include "autograd/api.h"
#include "autograd/ops/dist.h"
#include "kernels/elementwise.h"
#include "runtime/numerics.h"
#include "nn/parallel/parallelize.h"

namespace tessel::parallel::pipeline {
namespace {

constexpr const char* kOp = "pipeline";

// Which of `params` the scalar `out` depends on: autograd::grad on Meta
// tensors walks the graph and allocates nothing.
std::vector<bool> reached(const Tensor& out, const std::vector<Tensor>& params) {
  std::vector<Tensor> g = autograd::grad({sum(out)}, params);
  std::vector<bool> r(params.size());
  for (size_t i = 0; i < g.size(); ++i) r[i] = g[i].defined();
  return r;
}

// The parameters the embedding and the head use (a tied matrix is in both).
void trace_embed_head(models::LanguageModel& m, const std::vector<Tensor>& params, std::vector<bool>& embed,
                      std::vector<bool>& head) {
  EnableGradGuard grad;
  const bool was_training = m.is_training();
  m.eval();  // no dropout draws while tracing
  Tensor ids = empty({1, 1}, TensorOptions(DType::Int64).with_device(kMeta));
  embed = reached(m.embed(ids), params);
  Tensor h = empty({1, 1, m.config.dim}, TensorOptions(DType::Float32).with_device(kMeta));
  head = reached(m.head(h), params);
  m.train(was_training);
}

void materialize_param(Tensor& t) {
  if (!t.device().is_meta()) return;
  TensorOptions o = TensorOptions(t.dtype()).with_device(kCPU);
  t = t.is_distributed() ? empty(t.shape(), t.mesh(), t.placements(), o) : empty(t.shape(), o);
  t.requires_grad_(true);
}

}  // namespace

PipelineStage::PipelineStage(const models::ModelConfig& config, const MeshPtr& mesh, const ParallelPlan& plan,
                             uint64_t seed, const StageOptions& opts)
    : mesh_(mesh), plan_(plan), opts_(opts) {
  TESSEL_CHECK(mesh != nullptr, kOp, "needs a mesh with a 'pp' dim");
  const int pd = mesh->dim_index("pp");
  pp_size_ = int(mesh->size(pd));
  pp_rank_ = mesh->coordinate(pd);
  pp_comm_ = mesh->comm(pd);
  std::vector<std::string> rest;
  for (int d = 0; d < mesh->ndim(); ++d) {
    if (d == pd) continue;
    rest.push_back(mesh->name(d));
    main_group_ = main_group_ && mesh->coordinate(d) == 0;
  }
  if (!rest.empty()) stage_mesh_ = mesh->sub(rest);

  {
    nn::ConstructionScope meta(kMeta);
    model_ = models::build_model(config);
  }
  models::LanguageModel& m = *model_;
  const auto slots = m.parameter_slots();
  std::vector<Tensor> params;
  for (auto& [path, slot] : slots) params.push_back(*slot->tensor);
  std::vector<bool> in_embed, in_head;
  trace_embed_head(m, params, in_embed, in_head);

  // Blocks own their parameters by identity of the slot.
  const auto& blocks = m.blocks();
  std::map<const Tensor*, int> block_of;
  std::vector<int64_t> block_params(blocks.size(), 0);
  for (size_t b = 0; b < blocks.size(); ++b) {
    for (auto& [p, s] : blocks[b]->parameter_slots()) {
      block_of[s->tensor] = int(b);
      block_params[b] += s->tensor->numel();
    }
  }
  int64_t embed_params = 0, head_params = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    const auto& [path, slot] = slots[i];
    const bool in_block = block_of.count(slot->tensor) > 0;
    TESSEL_CHECK(in_block || in_embed[i] || in_head[i], kOp,
                 "parameter '{}' of {} is used by neither embed(), head() nor a block: no stage can hold it", path,
                 m.type_name());
    TESSEL_CHECK(!in_block || !(in_embed[i] || in_head[i]), kOp,
                 "parameter '{}' of {} is used by a block and by embed()/head(); pipeline stages cannot share it",
                 path, m.type_name());
    if (in_embed[i]) embed_params += slot->tensor->numel();
    if (in_head[i]) head_params += slot->tensor->numel();
  }
  const int S = num_stages();
  partition_ = make_partition(opts.split, block_params, embed_params, head_params, S,
                              fmt::format(FMT_STRING("{} config '{}' has {} blocks, fewer than the pp x V = {} x {} = {} "
                                          "stages of mesh {}"),
                                          m.type_name(), config.name, blocks.size(), pp_size_,
                                          opts.virtual_stages, S, mesh->str()));

  // Who holds what.
  std::vector<int> rank_of_block(blocks.size());
  for (int vs = 0; vs < S; ++vs)
    for (int64_t b = partition_.begin(vs); b < partition_.end(vs); ++b) rank_of_block[size_t(b)] = vs % pp_size_;
  std::set<int> tied_ranks;
  for (size_t i = 0; i < slots.size(); ++i) {
    std::set<int> holders;
    auto it = block_of.find(slots[i].second->tensor);
    if (it != block_of.end()) holders.insert(rank_of_block[size_t(it->second)]);
    if (in_embed[i]) holders.insert(0);
    if (in_head[i]) holders.insert((S - 1) % pp_size_);
    ParamHome h;
    h.name = slots[i].first;
    h.primary = *holders.begin();
    h.held = holders.count(pp_rank_) > 0;
    h.tied = holders.size() > 1;
    if (h.tied) tied_ranks.insert(holders.begin(), holders.end());
    homes_.push_back(h);
  }

  // Lay the whole (Meta) model out on the stage mesh: the plan's rules are
  // checked against the whole model, and every stage gets the same layouts.
  if (stage_mesh_) parallelize(m, stage_mesh_, plan_);
  // Materialise and initialise what this rank holds (blocks with their buffers).
  for (size_t b = 0; b < blocks.size(); ++b)
    if (rank_of_block[b] == pp_rank_) blocks[b]->materialize(kCPU);
  NoGradGuard ng;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (!homes_[i].held) continue;
    const auto& [path, slot] = slots[i];
    Tensor& t = *slot->tensor;
    materialize_param(t);
    if (t.is_distributed()) {
      slot->init(raw::local_of(t), nn::parameter_key(seed, path), local_random_block(t));
      t.bump_version();
    } else {
      slot->init(t, nn::parameter_key(seed, path), GlobalBlock{});
    }
    held_.push_back({path, t});
    tied_contrib_.push_back(std::make_shared<std::vector<Tensor>>());
    if (homes_[i].tied) {
      // Bitwise mode: one device adds the tied matrix's embedding and head
      // gradients per micro-batch, then accumulates the micro-batches in
      // order; keep this holder's per-micro-batch gradients for that.
      auto list = tied_contrib_.back();
      t.register_post_accumulate_grad_hook([list](const Tensor& p) {
        if (!numerics::bitwise()) return;
        list->push_back(p.grad());
        p.zero_grad();
      });
    }
  }
  if (pp_comm_ && !tied_ranks.empty()) tied_comm_ = pp_comm_->split(tied_ranks.count(pp_rank_) ? 0 : -1, pp_rank_);
}

std::vector<Tensor> PipelineStage::parameters() const {
  std::vector<Tensor> v;
  for (const auto& p : held_) v.push_back(p.tensor);
  return v;
}

std::vector<std::pair<size_t, Tensor>> PipelineStage::primary_parameters() const {
  std::vector<std::pair<size_t, Tensor>> v;
  size_t k = 0;
  for (size_t i = 0; i < homes_.size(); ++i) {
    if (!homes_[i].held) continue;
    if (homes_[i].primary == pp_rank_) v.emplace_back(i, held_[k].tensor);
    ++k;
  }
  return v;
}

// grad = c_0 + c_1 + ... (in order), c_k = the holders' micro-batch k
// gradients summed (two terms: exact in any order), as one device computes it.
void PipelineStage::sync_tied_bitwise(const nn::NamedTensor& p, std::vector<Tensor>& contrib) const {
  const int64_t m = int64_t(contrib.size());
  const Tensor last = contrib.back();
  const Tensor piece = raw::local_of(last);
  const int64_t n = piece.numel();
  Tensor buf = raw::empty({m, n}, piece.dtype(), piece.device());
  for (int64_t k = 0; k < m; ++k) {
    const Tensor c = raw::local_of(contrib[size_t(k)]);
    TESSEL_CHECK(c.numel() == n && c.dtype() == piece.dtype(), kOp,
                 "tied parameter '{}': micro-batch gradients differ in layout ({} vs {})", p.name, c.desc(),
                 piece.desc());
    kernels::copy(piece.device(), c.is_contiguous() ? c.view({n}) : c.contiguous().view({n}), buf.select(0, k));
  }
  int64_t count = m;
  Tensor mcount = raw::empty({1}, DType::Int64);
  mcount.data<int64_t>()[0] = m;
  tied_comm_->all_reduce(mcount, comm::ReduceOp::Max)->wait();
  TESSEL_CHECK(mcount.data<int64_t>()[0] == count, kOp,
               "tied parameter '{}': {} micro-batch gradients on pp rank {}, another holder has {}", p.name, m,
               pp_rank_, mcount.data<int64_t>()[0]);
  tied_comm_->all_reduce(buf, comm::ReduceOp::Sum)->wait();
  Tensor acc = buf.select(0, 0).clone();
  for (int64_t k = 1; k < m; ++k) kernels::binary(acc.device(), kernels::BinaryOp::Add, acc, buf.select(0, k), acc);
  Tensor grad = last.is_distributed() ? last : last.clone();
  Tensor dst = raw::local_of(grad);
  kernels::copy(dst.device(), acc.view(dst.shape()), dst);
  grad.bump_version();
  p.tensor.set_grad(grad);
  contrib.clear();
}

void PipelineStage::sync_tied_grads() const {
  if (!tied_comm_) return;
  NoGradGuard ng;
  size_t k = 0;
  for (const ParamHome& h : homes_) {
    if (!h.held) continue;
    const nn::NamedTensor& p = held_[k++];
    if (!h.tied) continue;
    std::vector<Tensor>& contrib = *tied_contrib_[k - 1];
    if (!contrib.empty()) {
      sync_tied_bitwise(p, contrib);
      continue;
    }
    Tensor g = p.tensor.grad();
    TESSEL_CHECK(g.defined(), kOp, "tied parameter '{}' has no gradient on pp rank {} (both holders must use it)",
                 p.name, pp_rank_);
    Tensor local = raw::local_of(g);
    Tensor buf = local.is_contiguous() ? local : local.contiguous();
    tied_comm_->all_reduce(buf, comm::ReduceOp::Sum)->wait();
    if (!buf.is_same(local)) local.copy_(buf);
    g.bump_version();
  }
}

Tensor PipelineStage::layout(const Tensor& ids) const {
  return stage_mesh_ ? distribute_batch(ids, stage_mesh_, plan_) : ids;
}

std::string PipelineStage::describe() const {
  std::vector<std::string> parts;
  for (int c = 0; c < virtual_stages(); ++c) {
    const int vs = stage_of(c);
    std::string s = fmt::format(FMT_STRING("stage {} blocks [{}, {})"), vs, partition_.begin(vs), partition_.end(vs));
    if (vs == 0) s = "embed + " + s;
    if (vs == num_stages() - 1) s += " + head";
    parts.push_back(s);
  }
  return fmt::format(FMT_STRING("pp rank {} of {}: {}; {} parameter tensors"), pp_rank_, pp_size_, fmt::join(parts, ", "),
                     held_.size());
}

}  // namespace tessel::parallel::pipeline
