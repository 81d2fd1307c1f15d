#include "nn/parallel/pipeline/stage.h"

#include <map>
#include <set>

#include "autograd/api.h"
#include "dtensor/ops.h"
#include "kernels/elementwise.h"
#include "nn/parallel/parallelize.h"
#include "runtime/numerics.h"

namespace tessel::parallel::pipeline {
namespace {

constexpr const char* kOp = "pipeline";

Tensor meta_like(const Tensor& t) { return empty(t.shape(), TensorOptions(t.dtype()).with_device(kMeta)); }

// Which of `params` the scalar `out` depends on: autograd::grad on Meta
// tensors walks the graph and allocates nothing.
std::vector<bool> reached(const Tensor& out, const std::vector<Tensor>& params) {
  std::vector<bool> r(params.size(), false);
  if (!out.requires_grad()) return r;  // a stage without parameters
  std::vector<Tensor> g = autograd::grad({sum(out)}, params);
  for (size_t i = 0; i < g.size(); ++i) r[i] = g[i].defined();
  return r;
}

// For the lifetime of the guard, every parameter of `m` is a fresh Meta leaf
// requiring grad (whatever the original's device or requires_grad: tracing
// asks which parameters a gradient reaches), every buffer with values a Meta
// tensor of its shape and dtype, and the model is in eval mode (no dropout
// draws): tracing then computes and allocates nothing, whether the model was
// built on Meta or materialised. Everything is put back after, on errors too.
class MetaTrace {
 public:
  explicit MetaTrace(nn::StagedModel& m) : m_(m), was_training_(m.is_training()) {
    for (auto& [path, slot] : m.parameter_slots()) swap_out(*slot->tensor, true);
    for (auto& [path, slot] : m.buffer_slots()) swap_out(*slot->tensor, false);
    m.eval();
  }
  ~MetaTrace() {
    m_.train(was_training_);
    for (auto& [slot, value] : saved_) *slot = value;
  }
  MetaTrace(const MetaTrace&) = delete;
  MetaTrace& operator=(const MetaTrace&) = delete;

 private:
  void swap_out(Tensor& t, bool param) {
    if (!t.defined() || (!param && t.device().is_meta())) return;
    saved_.emplace_back(&t, t);
    t = meta_like(t);
    if (param) t.requires_grad_(true);
  }
  nn::StagedModel& m_;
  bool was_training_;
  std::vector<std::pair<Tensor*, Tensor>> saved_;
};

// The parameters (model order) the embedding and the head use (a tied matrix is in both).
void trace_embed_head(nn::StagedModel& m, std::vector<bool>& embed, std::vector<bool>& head) {
  EnableGradGuard grad;
  MetaTrace meta(m);
  std::vector<Tensor> params;
  for (auto& [path, slot] : m.parameter_slots()) params.push_back(*slot->tensor);
  Tensor example = m.example_input();
  TESSEL_CHECK(example.defined(), kOp, "{}::example_input() returned an undefined tensor (it must be shaped like "
               "a batch of one sample)", m.type_name());
  if (!example.device().is_meta()) example = meta_like(example);
  try {
    Tensor h = m.embed(example);
    embed = reached(h, params);
    head = reached(m.head(h.detach()), params);  // detached: what head() alone uses
  } catch (const Error& e) {
    TESSEL_FAIL(kOp, "{}: tracing embed() on its example_input() {} and head() on embed's output, on Meta, failed: {}",
                m.type_name(), example.desc(), e.what());
  }
}

void materialize_param(Tensor& t) {
  if (!t.device().is_meta()) return;
  TensorOptions o = TensorOptions(t.dtype()).with_device(kCPU);
  t = t.is_distributed() ? empty(t.shape(), t.mesh(), t.placements(), o) : empty(t.shape(), o);
  t.requires_grad_(true);
}

// A parameter this rank does not hold: a Meta leaf of its shape (its memory is dropped).
void drop_param(Tensor& t) {
  if (t.device().is_meta()) return;
  t = meta_like(t);
  t.requires_grad_(true);
}

// Module m's own buffers (not its children's): held ones get memory when on
// Meta, m then refilling its computed ones (init_buffers, as
// Module::materialize does); the others become Meta.
void place_own_buffers(nn::Module& m, bool held) {
  bool materialised = false;
  for (auto& [name, slot] : m.buffer_slots(/*recurse=*/false)) {
    Tensor& t = *slot->tensor;
    if (!t.defined() || t.device().is_meta() != held) continue;
    t = held ? empty(t.shape(), TensorOptions(t.dtype()).with_device(kCPU)) : meta_like(t);
    materialised = materialised || held;
  }
  if (materialised) m.init_buffers();
}

}  // namespace

bool has_pipeline_dim(const Mesh& mesh) {
  for (int d = 0; d < mesh.ndim(); ++d)
    if (mesh.name(d) == "pp") return true;
  return false;
}

PipelineStage::PipelineStage(std::shared_ptr<nn::StagedModel> model, const MeshPtr& mesh, const ParallelPlan& plan,
                             uint64_t seed, const StageOptions& opts)
    : model_(std::move(model)), mesh_(mesh), plan_(plan), opts_(opts) {
  TESSEL_CHECK(model_ != nullptr, kOp, "needs a model (got a null nn::StagedModel)");
  nn::StagedModel& m = *model_;
  TESSEL_CHECK(mesh != nullptr && has_pipeline_dim(*mesh), kOp, "{} needs a mesh with a 'pp' dim, got {}",
               m.type_name(), mesh ? mesh->str() : "(none)");
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

  m.assign_paths();  // parameter init and dropout keys use the paths (make_model assigns them; make_shared does not)
  const auto slots = m.parameter_slots();
  for (const auto& [path, slot] : slots)
    TESSEL_CHECK(!slot->tensor->is_distributed(), kOp,
                 "parameter '{}' of {} is already distributed ({}): pass the plain model, the pipeline lays each "
                 "stage out with the plan", path, m.type_name(), slot->tensor->desc());
  std::vector<bool> in_embed, in_head;
  trace_embed_head(m, in_embed, in_head);

  // Blocks own the parameters (and buffers) under their module, by identity of the slot.
  std::map<const Tensor*, std::string> path_of;
  for (const auto& [path, slot] : slots) path_of.emplace(slot->tensor, path);
  const auto& blocks = m.blocks();
  std::map<const Tensor*, int> block_of;
  std::map<const nn::Module*, int> module_block;
  std::vector<int64_t> block_params(blocks.size(), 0);
  for (size_t b = 0; b < blocks.size(); ++b) {
    TESSEL_CHECK(blocks[b] != nullptr, kOp, "block {} of {} is null", b, m.type_name());
    for (auto& [p, s] : blocks[b]->parameter_slots()) {
      TESSEL_CHECK(path_of.count(s->tensor), kOp,
                   "block {} of {} is not a submodule of the model (its parameter '{}' is not the model's): "
                   "register the blocks as children (e.g. in an nn::ModuleList)", b, m.type_name(), p);
      auto [it, fresh] = block_of.emplace(s->tensor, int(b));
      TESSEL_CHECK(fresh, kOp,
                   "{}: blocks {} and {} share the parameter '{}'; a block's parameters must be its own (each "
                   "block runs on one stage)", m.type_name(), it->second, b, path_of[s->tensor]);
      block_params[b] += s->tensor->numel();
    }
    for (auto& [p, mod] : blocks[b]->named_modules()) module_block.emplace(mod, int(b));
  }
  int64_t embed_params = 0, head_params = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    const auto& [path, slot] = slots[i];
    const bool in_block = block_of.count(slot->tensor) > 0;
    TESSEL_CHECK(in_block || in_embed[i] || in_head[i], kOp,
                 "parameter '{}' {} of {} is used by neither embed(), head() nor a block: no stage can hold it", path,
                 slot->tensor->shape(), m.type_name());
    TESSEL_CHECK(!in_block || !(in_embed[i] || in_head[i]), kOp,
                 "parameter '{}' of {} is used by a block and by embed()/head(); pipeline stages cannot share it",
                 path, m.type_name());
    if (in_embed[i]) embed_params += slot->tensor->numel();
    if (in_head[i]) head_params += slot->tensor->numel();
  }
  const int S = num_stages();
  partition_ = make_partition(opts.split, block_params, embed_params, head_params, S,
                              fmt::format(FMT_STRING("{} has {} blocks, fewer than the pp x V = {} x {} = {} stages "
                                                     "of mesh {}"),
                                          m.type_name(), blocks.size(), pp_size_, opts.virtual_stages, S,
                                          mesh->str()));

  // Who holds what.
  std::vector<int> rank_of_block(blocks.size());
  for (int vs = 0; vs < S; ++vs)
    for (int64_t b = partition_.begin(vs); b < partition_.end(vs); ++b) rank_of_block[size_t(b)] = vs % pp_size_;
  const bool holds_ends = pp_rank_ == 0 || pp_rank_ == (S - 1) % pp_size_;  // embed / head
  std::set<int> tied_ranks;
  std::vector<bool> had_values(slots.size());
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
    // What this rank does not hold is dropped before the layout, so that no
    // rank slices (or keeps) values it will never use.
    Tensor& t = *slots[i].second->tensor;
    had_values[i] = !t.device().is_meta();
    if (!h.held) drop_param(t);
  }

  // Lay the whole model out on the stage mesh: the plan's rules are checked
  // against the whole model, every stage gets the same layouts, and held
  // parameters with values keep them (each rank keeps its piece).
  if (stage_mesh_) parallelize(m, stage_mesh_, plan_);
  // Buffers: a held block's, and those outside the blocks on the ranks that
  // run embed or head (which of the two uses them is not traced: buffers get
  // no gradient); the others become Meta.
  for (auto& [path, mod] : m.named_modules()) {
    auto it = module_block.find(mod);
    place_own_buffers(*mod, it == module_block.end() ? holds_ends : rank_of_block[size_t(it->second)] == pp_rank_);
  }
  // Materialise and initialise the held Meta parameters; held ones with values keep them.
  NoGradGuard ng;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (!homes_[i].held) continue;
    const auto& [path, slot] = slots[i];
    Tensor& t = *slot->tensor;
    if (!had_values[i]) {
      materialize_param(t);
      if (t.is_distributed()) {
        slot->init(raw::local_of(t), nn::parameter_key(seed, path), local_random_block(t));
        t.bump_version();
      } else {
        slot->init(t, nn::parameter_key(seed, path), GlobalBlock{});
      }
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

std::vector<std::vector<Tensor>> PipelineStage::tied_contributions() const {
  std::vector<std::vector<Tensor>> v;
  for (const auto& list : tied_contrib_) v.push_back(*list);
  return v;
}

void PipelineStage::set_tied_contributions(const std::vector<std::vector<Tensor>>& contributions) const {
  TESSEL_CHECK(contributions.size() == tied_contrib_.size(), kOp, "set_tied_contributions: {} lists for {} parameters",
               contributions.size(), tied_contrib_.size());
  for (size_t i = 0; i < contributions.size(); ++i) *tied_contrib_[i] = contributions[i];
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

Tensor PipelineStage::layout(const Tensor& batch) const {
  return stage_mesh_ ? distribute_batch(batch, stage_mesh_, plan_) : batch;
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
