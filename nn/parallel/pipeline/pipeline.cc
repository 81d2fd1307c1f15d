#include "nn/parallel/pipeline/pipeline.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "autograd/api.h"
#include "dtensor/ops.h"
#include "kernels/optim.h"
#include "nn/clip.h"
#include "runtime/capture.h"
#include "runtime/numerics.h"

namespace tessel::parallel::pipeline {
namespace {
constexpr const char* kOp = "pipeline";

// Bitwise mode: the step's loss as the one-device loop computes it
// (nn::StagedModel::loss, in training). Every rank gets each micro-batch's
// stage loss and per-block aux losses with their dtypes (each piece from the
// one rank that computed it, the others add -0.0 and dtype 0: exact) and
// evaluates the one-device expression with the same ops:
// sum_m (stage_m + (aux_m0 + aux_m1 + ...) * coef), blocks without an aux
// loss skipped.
// The step's loss sum with one device's arithmetic, and the last
// micro-batch's aux loss as one device's StagedModel::aux_loss() gives it.
struct BitwiseLoss {
  double loss_sum = 0;
  std::optional<double> aux_last;
};

BitwiseLoss bitwise_loss_sum(const StepStats& st, const PipelineStage& stage) {
  NoGradGuard ng;
  const size_t m = st.stage_loss.size(), nb = m ? st.block_aux.size() / m : 0;
  Tensor buf = raw::empty({int64_t(2 * (m + m * nb))}, DType::Float64);
  double* b = buf.data<double>();
  double* stage_val = b;
  double* stage_dt = stage_val + m;
  double* aux_val = stage_dt + m;
  double* aux_dt = aux_val + m * nb;
  std::copy(st.stage_loss.begin(), st.stage_loss.end(), stage_val);
  std::copy(st.stage_loss_dtype.begin(), st.stage_loss_dtype.end(), stage_dt);
  std::copy(st.block_aux.begin(), st.block_aux.end(), aux_val);
  std::copy(st.block_aux_dtype.begin(), st.block_aux_dtype.end(), aux_dt);
  if (const auto& c = stage.pp_comm()) c->all_reduce(buf, comm::ReduceOp::Sum)->wait();
  // A scalar of the dtype the piece had (its code is DType + 1).
  auto scalar = [](double v, double code) {
    Tensor t = raw::empty({}, DType::Float64);
    t.data<double>()[0] = v;
    return t.to(DType(int(code) - 1));
  };
  const double coef = stage.model().aux_loss_coef();
  BitwiseLoss out;
  double& sum = out.loss_sum;
  for (size_t k = 0; k < m; ++k) {
    TESSEL_CHECK(stage_dt[k] > 0, kOp, "micro-batch {}: no pp rank computed the loss", k);
    Tensor l = scalar(stage_val[k], stage_dt[k]);
    Tensor aux;
    for (size_t i = 0; i < nb; ++i) {
      const size_t j = k * nb + i;
      if (aux_dt[j] == 0) continue;
      Tensor a = scalar(aux_val[j], aux_dt[j]);
      aux = aux.defined() ? aux + a : a;
    }
    if (aux.defined()) l = l + aux * coef;
    if (aux.defined() && k + 1 == m) out.aux_last = aux.item<double>();
    sum += l.item<double>();
  }
  return out;
}
}  // namespace

Pipeline::Pipeline(std::shared_ptr<nn::StagedModel> model, const MeshPtr& mesh, const ParallelPlan& plan,
                   uint64_t seed, int64_t micro_batches, const PipelineOptions& opts)
    : opts_(opts) {
  TESSEL_CHECK(model != nullptr, kOp, "needs a model (got a null nn::StagedModel)");
  TESSEL_CHECK(mesh && has_pipeline_dim(*mesh), kOp, "{}: mesh {} has no 'pp' dim", model->type_name(),
               mesh ? mesh->str() : "(none)");
  const int pp = int(mesh->size(mesh->dim_index("pp")));
  try {
    schedule_ = make_schedule(opts.schedule, pp, int(micro_batches), opts.virtual_stages);
  } catch (const Error& e) {
    TESSEL_FAIL(kOp, "mesh {}: {}", mesh->str(), e.what());
  }
  stats_ = check_schedule(schedule_);
  stage_ = std::make_unique<PipelineStage>(std::move(model), mesh, plan, seed,
                                           StageOptions{opts.virtual_stages, opts.split});
  executor_ = std::make_unique<Executor>(*stage_, opts.compute);
}

std::vector<nn::ParamGroup> Pipeline::param_groups(double weight_decay) const {
  std::set<std::string> held;
  for (const auto& p : stage_->named_parameters()) held.insert(p.name);
  std::vector<nn::ParamGroup> groups = nn::default_param_groups(model(), weight_decay);
  for (auto& g : groups) {
    std::vector<nn::NamedTensor> kept;
    for (auto& p : g.params)
      if (held.count(p.name)) kept.push_back(p);
    g.params = std::move(kept);
  }
  return groups;
}

int64_t Pipeline::local_parameter_bytes() const {
  int64_t n = 0;
  for (const auto& p : stage_->named_parameters()) n += int64_t(raw::local_of(p.tensor).nbytes());
  return n;
}

PipelineStepResult Pipeline::train_step(uint64_t seed, uint64_t step, int64_t global_batch,
                                        const std::vector<MicroBatch>& micro_batches) {
  TESSEL_CHECK(model().is_training(), kOp, "train_step needs the model in training mode (model().train())");
  std::vector<LaidOutMicroBatch> mbs;
  mbs.reserve(micro_batches.size());
  for (const MicroBatch& b : micro_batches)
    mbs.push_back({stage_->layout(b.inputs), stage_->layout(b.targets), {seed, step, b.first_sample, global_batch}});
  tied_synced_ = false;
  const StepStats st = executor_->run(schedule_, mbs);
  PipelineStepResult r;
  {
    // Host values: a compiled step (docs/compile.md) records the schedule's
    // kernels and collectives only, and does this again after each replay
    // (replayed_step).
    capture::Recorder::Unrecorded host_values(capture::active());
    r = summarize(st, micro_batches.size());
  }
  r.stage_losses = st.losses;
  return r;
}

PipelineStepResult Pipeline::replayed_step(const std::vector<Tensor>& stage_losses, int64_t micro_batches) {
  tied_synced_ = false;
  StepStats st(size_t(micro_batches), model().blocks().size());
  TESSEL_CHECK(stage_losses.empty() || int64_t(stage_losses.size()) == micro_batches, kOp,
               "replayed_step: {} micro-batch losses for {} micro-batches", stage_losses.size(), micro_batches);
  // As Executor::forward_chunk notes them; no aux losses (MoE is not replayed).
  for (size_t k = 0; k < stage_losses.size(); ++k) st.add_loss(k, stage_losses[k], stage_losses[k]);
  PipelineStepResult r = summarize(st, size_t(micro_batches));
  r.stage_losses = stage_losses;
  return r;
}

PipelineStepResult Pipeline::summarize(const StepStats& st, size_t micro_batches) const {
  // The step's loss and aux loss are spread over the stages: sum them over pp.
  Tensor sums = raw::empty({6}, DType::Float64);
  double* s = sums.data<double>();
  s[0] = st.loss_sum;
  s[1] = st.aux_last;
  s[2] = st.has_aux ? 1.0 : 0.0;
  s[3] = st.comm_wait_s;
  s[4] = double(st.moe_dropped);  // exact in double
  s[5] = st.has_moe ? 1.0 : 0.0;
  if (const auto& c = stage_->pp_comm()) c->all_reduce(sums, comm::ReduceOp::Sum)->wait();
  PipelineStepResult r;
  r.loss_sum = s[0];
  if (s[2] > 0) r.aux_loss = s[1];
  if (numerics::bitwise()) {
    const BitwiseLoss b = bitwise_loss_sum(st, *stage_);
    r.loss_sum = b.loss_sum;
    if (b.aux_last) r.aux_loss = b.aux_last;  // one device's float sum over the blocks, not a double one
  }
  r.loss = r.loss_sum / double(micro_batches);
  r.comm_wait_s = st.comm_wait_s;
  r.comm_wait_mean_s = s[3] / double(stage_->pp_size());
  if (s[5] > 0) r.moe_dropped_tokens = int64_t(s[4]);
  return r;
}

void Pipeline::set_loss_scale(std::optional<double> scale) { executor_->set_loss_scale(scale); }

void Pipeline::finish_gradients() {
  if (tied_synced_) return;
  stage_->sync_tied_grads();
  tied_synced_ = true;
}

double Pipeline::clip_grad_norm_(double max_norm) {
  TESSEL_CHECK(max_norm >= 0, kOp, "invalid max_norm = {} (must be >= 0)", max_norm);
  finish_gradients();
  // The norm of nn::clip_grad_norm_ over the whole model, bit for bit: each
  // rank computes the per-parameter sums of squares of the parameters it
  // counts, the list is completed over pp (each entry comes from one rank, the
  // others add +0: exact), and every rank combines it in model order.
  const auto prim = stage_->primary_parameters();
  std::vector<Tensor> tensors;
  for (const auto& [i, t] : prim) tensors.push_back(t);
  const std::vector<float> mine = nn::square_sums(tensors, "pipeline clip_grad_norm_");
  const int64_t n = int64_t(stage_->homes().size());
  Tensor buf = raw::empty({2 * n}, DType::Float32);  // [sums..., has a gradient...]
  float* b = buf.data<float>();
  std::fill(b, b + 2 * n, 0.0f);
  for (size_t k = 0; k < prim.size(); ++k) {
    if (mine[k] < 0) continue;
    b[prim[k].first] = mine[k];
    b[n + int64_t(prim[k].first)] = 1.0f;
  }
  if (const auto& c = stage_->pp_comm()) c->all_reduce(buf, comm::ReduceOp::Sum)->wait();
  std::vector<float> all(size_t(n), -1.0f);
  for (int64_t i = 0; i < n; ++i)
    if (b[n + i] > 0) all[size_t(i)] = b[i];
  const float total = nn::norm_of_square_sums(all);
  if (max_norm > 0) {
    const float scale = float(max_norm) / (total + 1e-6f);
    if (scale < 1.0f) {
      NoGradGuard ng;
      for (const Tensor& p : stage_->parameters()) {
        Tensor g = p.grad();
        if (!g.defined()) continue;
        kernels::scale_inplace(g.device(), raw::local_of(g), scale);
        g.bump_version();
      }
    }
  }
  return double(total);
}

Tensor Pipeline::forward(const Tensor& inputs) { return executor_->forward(inputs); }

std::vector<std::pair<std::string, Tensor>> Pipeline::gather_parameters() const {
  NoGradGuard ng;
  const auto all = model().named_parameters();
  const auto& homes = stage_->homes();
  const int me = stage_->pp_rank();
  const bool main = stage_->in_main_group();
  const int tag = 2 * stage_->num_stages();  // after the activation and gradient tags
  std::vector<std::pair<std::string, Tensor>> out;
  std::vector<comm::WorkPtr> sends;
  std::vector<Tensor> keep;
  for (size_t i = 0; i < all.size(); ++i) {
    const ParamHome& h = homes[i];
    const Tensor& t = all[i].tensor;
    Tensor full;
    if (h.primary == me) full = t.is_distributed() ? full_tensor(t.detach()) : t.detach();  // collective on the stage mesh
    if (!main) continue;
    if (me == 0) {
      if (h.primary != 0) {
        full = raw::empty(t.shape(), t.dtype());
        stage_->pp_comm()->recv(full, h.primary, tag);
      }
      out.emplace_back(h.name, full);
    } else if (h.primary == me) {
      keep.push_back(full.is_contiguous() ? full : full.contiguous());
      sends.push_back(stage_->pp_comm()->send(keep.back(), 0, tag, /*async=*/true));
    }
  }
  for (auto& w : sends) w->wait();
  return out;
}

}  // namespace tessel::parallel::pipeline
