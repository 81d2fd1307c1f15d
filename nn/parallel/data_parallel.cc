#include "nn/parallel/data_parallel.h"

#include <algorithm>
#include <unordered_map>

#include "autograd/api.h"
#include "dtensor/ops.h"
#include "nn/parallel/buckets.h"
#include "nn/parallel/fsdp.h"
#include "nn/parallel/grad_reducer.h"
#include "nn/parallel/staging.h"

namespace tessel::parallel {
namespace {
constexpr const char* kOp = "data parallel";
// One slot: a bucket's collective runs while the next bucket's gradients are
// computed (backward) or packed (after the step); its memory is one bucket.
constexpr int kStagingSlots = 1;
const char* stage_name(int zero) {
  switch (zero) {
    case 0: return "DDP";
    case 1: return "ZeRO-1";
    case 2: return "ZeRO-2";
    default: return "FSDP";
  }
}
}  // namespace

bool DataParallel::applies(const Mesh& mesh, const std::string& dim) {
  for (int d = 0; d < mesh.ndim(); ++d)
    if (mesh.name(d) == dim) return mesh.size(d) > 1;
  return false;
}

DataParallel::DataParallel(nn::Module& model, const std::vector<nn::Module*>& blocks, DataParallelOptions options)
    : opts_(std::move(options)) {
  TESSEL_CHECK(opts_.zero >= 0 && opts_.zero <= 3, kOp, "zero must be 0 (DDP), 1, 2 or 3 (FSDP), got {}", opts_.zero);
  TESSEL_CHECK(opts_.bucket_mb >= 0, kOp, "bucket_mb must be >= 0, got {}", opts_.bucket_mb);

  // One DpParam per distinct tensor (tied parameters share one, with all their slots).
  std::unordered_map<const TensorImpl*, size_t> seen;
  std::vector<DpParam> all;
  for (const auto& [path, slot] : model.parameter_slots()) {
    const Tensor& t = *slot->tensor;
    TESSEL_CHECK(t.is_distributed(), kOp,
                 "parameter '{}' ({}) is not distributed; lay the model out on a mesh first (parallelize)", path,
                 t.desc());
    if (!mesh_) {
      mesh_ = t.mesh();
      dp_ = mesh_->dim_index(opts_.dim);
    }
    TESSEL_CHECK(same_mesh(mesh_, t.mesh()), kOp, "parameter '{}' lives on mesh {}, others on {}", path,
                 t.mesh()->str(), mesh_->str());
    auto [it, fresh] = seen.emplace(t.impl(), all.size());
    if (!fresh) {
      all[it->second].slots.push_back(slot->tensor);
      continue;
    }
    all.push_back(DpParam{path, {slot->tensor}, t, t, DpShard{}});
  }
  TESSEL_CHECK(mesh_ != nullptr, kOp, "the model has no parameters");
  TESSEL_CHECK(mesh_->size(dp_) > 1, kOp, "the '{}' dim of mesh {} has size 1: no data parallelism to apply",
               opts_.dim, mesh_->str());
  for (DpParam& p : all) {
    if (p.param.requires_grad() && p.param.placements()[dp_].is_replicate()) {
      p.geo = make_dp_shard(p.param, dp_, p.path);
      params_.push_back(std::move(p));
    } else {
      unmanaged_.push_back(p.param);
    }
  }
  TESSEL_CHECK(!params_.empty(), kOp, "no parameter of the model is Replicate on '{}'", opts_.dim);
  std::vector<DpParam*> ptrs;
  for (DpParam& p : params_) ptrs.push_back(&p);

  const int64_t bucket_bytes = int64_t(opts_.bucket_mb * 1024.0 * 1024.0);
  if (opts_.zero == 3) {
    fsdp_ = std::make_unique<Fsdp>(model, blocks, ptrs);
    return;
  }
  if (opts_.zero >= 1) {  // the optimizer updates this rank's chunk of each parameter
    NoGradGuard ng;
    for (DpParam& p : params_) {
      if (!p.geo.is_sharded()) continue;
      p.shard = raw::make_distributed(p.geo.chunk(raw::local_of(p.param), p.geo.dp_rank), mesh_, p.geo.sharded,
                                      p.geo.global);
      p.shard.requires_grad_(true);
    }
  }
  reducer_ = std::make_unique<GradReducer>(
      ptrs, opts_.zero == 2 ? GradReducer::Mode::ReduceScatter : GradReducer::Mode::AllReduce, bucket_bytes);
  int64_t slot_numel = reducer_->slot_numel(), in_numel = 0;
  if (opts_.zero >= 1) {
    // All-gather buckets after the step: the same grouping as the gradients.
    std::unordered_map<std::string, size_t> by_path;
    for (size_t i = 0; i < params_.size(); ++i) by_path[params_[i].path] = i;
    const auto paths = reducer_->bucket_paths();
    for (size_t bi = 0; bi < paths.size(); ++bi) {
      const auto& bucket = paths[bi];
      std::vector<size_t> members;
      std::vector<const DpShard*> geos;
      for (const std::string& path : bucket) {
        const size_t i = by_path.at(path);
        if (!params_[i].geo.is_sharded()) continue;  // whole on every rank already
        members.push_back(i);
        geos.push_back(&params_[i].geo);
      }
      if (members.empty()) continue;
      gathers_.push_back(std::make_unique<AllGatherBucket>(geos, mesh_->comm(dp_), params_[0].param.device()));
      gather_members_.push_back(members);
      gather_bucket_.push_back(bi);
      slot_numel = std::max(slot_numel, gathers_.back()->slot_numel());
      in_numel = std::max(in_numel, gathers_.back()->block_numel());
    }
  }
  const Device dev = params_[0].param.device();
  if (opts_.zero == 1 && in_numel > 0) gather_in_ = raw::empty({in_numel}, DType::Float32, dev);
  if (opts_.zero == 2) {
    ring_ = std::make_unique<StagingRing>(kStagingSlots, slot_numel, DType::Float32, dev);
    reducer_->set_ring(ring_.get());
  }
}

DataParallel::~DataParallel() = default;

std::vector<nn::ParamGroup> DataParallel::optimizer_groups(std::vector<nn::ParamGroup> groups) const {
  std::unordered_map<const TensorImpl*, const DpParam*> by_impl;
  for (const DpParam& p : params_) by_impl[p.param.impl()] = &p;
  for (nn::ParamGroup& g : groups) {
    for (nn::NamedTensor& nt : g.params) {
      auto it = by_impl.find(nt.tensor.impl());
      if (it != by_impl.end()) nt.tensor = it->second->shard;
    }
  }
  return groups;
}

std::vector<Tensor> DataParallel::parameters() const {
  std::vector<Tensor> out;
  for (const DpParam& p : params_) out.push_back(p.shard);
  for (const Tensor& t : unmanaged_) out.push_back(t);
  return out;
}

void DataParallel::begin_micro_batch(bool last) {
  if (reducer_) reducer_->begin_micro_batch(last);
}

void DataParallel::finish() {
  if (reducer_) reducer_->finish();
  if (fsdp_) fsdp_->finish();
}

void DataParallel::after_step() {
  if (fsdp_) fsdp_->after_step();
  if (gathers_.empty()) return;
  NoGradGuard ng;
  for (size_t b = 0; b < gathers_.size(); ++b) {
    std::vector<Tensor> mine, full;
    for (size_t i : gather_members_[b]) {
      mine.push_back(raw::local_of(params_[i].shard));
      full.push_back(raw::local_of(params_[i].param));
    }
    auto unpack = [this, b, full](const Tensor& gathered) {
      gathers_[b]->unpack(gathered, full);
      for (size_t i : gather_members_[b]) params_[i].param.bump_version();
    };
    if (opts_.zero == 1) {  // the gradients were used: gather into their bucket
      for (size_t i : gather_members_[b]) {
        params_[i].param.zero_grad();
        params_[i].shard.zero_grad();
      }
      const Tensor& out = reducer_->flat(gather_bucket_[b]);
      gathers_[b]->launch(gather_in_, out, mine)->wait();
      unpack(out);
    } else {
      gathers_[b]->launch(*ring_, mine, unpack);
    }
  }
  if (ring_) ring_->complete_all();
}

DataParallelMemory DataParallel::memory(const nn::Optimizer& opt) const {
  DataParallelMemory m;
  for (const DpParam& p : params_) m.params += int64_t(raw::local_of(p.param).nbytes());
  for (const Tensor& t : unmanaged_) {
    m.params += int64_t(raw::local_of(t).nbytes());
    m.grads += int64_t(raw::local_of(t).nbytes());
  }
  m.optimizer = opt.state_bytes();
  if (reducer_) {
    m.grads += reducer_->grad_bytes();
    m.comm += reducer_->comm_bytes();
  }
  if (ring_) m.comm += ring_->bytes();
  if (gather_in_.defined()) m.comm += int64_t(gather_in_.nbytes());
  if (fsdp_) {
    m.grads += fsdp_->grad_bytes();
    m.comm += fsdp_->comm_bytes();
    m.gathered = fsdp_->gathered_bytes();
    m.gathered_now = fsdp_->gathered_bytes_now();
  }
  return m;
}

std::string DataParallel::describe() const {
  const std::string over = fmt::format(FMT_STRING("{} over {}={}"), stage_name(opts_.zero), opts_.dim, mesh_->size(dp_));
  if (fsdp_) {
    const int n = fsdp_->num_units();
    return n == 1 ? fmt::format(FMT_STRING("{}: 1 unit (the whole model)"), over)
                  : fmt::format(FMT_STRING("{}: {} units (root + blocks)"), over, n);
  }
  const int n = reducer_->num_buckets();
  return fmt::format(FMT_STRING("{}: {} bucket{} of <= {} MiB"), over, n, n == 1 ? "" : "s", opts_.bucket_mb);
}

std::vector<std::vector<std::string>> DataParallel::buckets() const {
  if (reducer_) return reducer_->bucket_paths();
  std::vector<std::vector<std::string>> out;
  for (auto& [name, paths] : fsdp_->units()) out.push_back(paths);
  return out;
}

}  // namespace tessel::parallel
