#include "nn/parallel/pipeline/executor.h"

#include "autograd/api.h"
#include "nn/autocast.h"
#include "nn/moe.h"
#include "runtime/capture.h"
#include "runtime/timeline.h"

namespace tessel::parallel::pipeline {
namespace {
constexpr const char* kOp = "pipeline executor";

// The instruction's span name on the timeline (runtime/timeline.h).
const char* span_name(Op op) {
  switch (op) {
    case Op::RecvAct: return "pp.recv_act";
    case Op::Forward: return "pp.forward";
    case Op::SendAct: return "pp.send_act";
    case Op::RecvGrad: return "pp.recv_grad";
    case Op::Backward: return "pp.backward";
    case Op::SendGrad: return "pp.send_grad";
  }
  return "pp";
}
// A value the step's statistics read on the host: not part of a compiled
// step (compile mode records no MoE, the only source of these aux values,
// and reads the losses again after a replay).
double host_value(const Tensor& t) {
  capture::Recorder::Unrecorded value_only(capture::active());
  return t.item<double>();
}
}  // namespace

StepStats::StepStats(size_t micro_batches, size_t blocks)
    : stage_loss(micro_batches, -0.0),
      block_aux(micro_batches * blocks, -0.0),
      stage_loss_dtype(micro_batches, 0.0),
      block_aux_dtype(micro_batches * blocks, 0.0) {}

void StepStats::add_loss(size_t mb, const Tensor& stage, const Tensor& loss) {
  stage_loss[mb] = host_value(stage);
  stage_loss_dtype[mb] = double(int(stage.dtype()) + 1);
  loss_sum += host_value(loss);
  losses.push_back(loss.detach());
}

Executor::Executor(const PipelineStage& stage, DType compute)
    : stage_(stage), compute_(compute), p2p_(stage.pp_comm(), stage.stage_mesh()) {}

StepStats Executor::run(const Schedule& s, const std::vector<LaidOutMicroBatch>& mbs) {
  TESSEL_CHECK(s.pp == stage_.pp_size() && s.virtual_stages == stage_.virtual_stages() &&
                   s.micro_batches == int(mbs.size()),
               kOp, "schedule '{}' is for pp = {}, V = {}, M = {}; this pipeline has pp = {}, V = {} and {} micro-batches",
               s.name, s.pp, s.virtual_stages, s.micro_batches, stage_.pp_size(), stage_.virtual_stages(), mbs.size());
  StepStats st(mbs.size(), stage_.model().blocks().size());
  p2p_.reset_wait();
  slots_.assign(size_t(s.virtual_stages * s.micro_batches), Slot{});
  const bool training = stage_.model().is_training() && !s.forward_only;
  for (const Instr& in : s.ranks[size_t(stage_.pp_rank())]) exec(s, in, mbs, training, st);
  p2p_.wait_sends();
  st.comm_wait_s = p2p_.wait_seconds();
  if (!s.forward_only) slots_.assign(slots_.size(), Slot{});
  return st;
}

void Executor::exec(const Schedule& s, const Instr& in, const std::vector<LaidOutMicroBatch>& mbs, bool training,
                    StepStats& st) {
  const int S = s.num_stages(), pp = s.pp;
  const int vs = s.stage_of(stage_.pp_rank(), in.chunk);
  Slot& sl = slots_[size_t(in.chunk * s.micro_batches + in.mb)];
  timeline::Span span(span_name(in.op), "pipeline", [&] {
    return fmt::format(FMT_STRING("\"micro_batch\":{},\"stage\":{},\"chunk\":{}"), in.mb, vs, in.chunk);
  });
  switch (in.op) {
    case Op::RecvAct:
      sl.input = p2p_.recv_act((vs - 1) % pp, vs);
      if (training) sl.input.requires_grad_(true);
      break;
    case Op::Forward:
      forward_chunk(vs, sl, mbs[size_t(in.mb)], in.mb, s.micro_batches, training, st);
      break;
    case Op::SendAct:
      p2p_.send_act(sl.output, (vs + 1) % pp, vs + 1);
      if (training) sl.pending_grad = p2p_.post_recv_grad(sl.output, (vs + 1) % pp, S + vs);
      else sl.output = Tensor();
      break;
    case Op::RecvGrad:
      TESSEL_ASSERT(sl.pending_grad.work != nullptr);
      sl.grad_out = p2p_.wait(sl.pending_grad);
      break;
    case Op::Backward:
      backward_chunk(vs, sl);
      break;
    case Op::SendGrad:
      p2p_.send_grad(sl.grad_in, (vs - 1) % pp, S + vs - 1);
      sl.grad_in = Tensor();
      break;
  }
}

void Executor::forward_chunk(int vs, Slot& sl, const LaidOutMicroBatch& b, int mb, int m, bool training,
                             StepStats& st) {
  nn::StagedModel& model = stage_.model();
  const int S = stage_.num_stages();
  nn::ForwardScope scope(b.ctx);
  std::optional<nn::AutocastScope> autocast;
  if (training && compute_ != DType::Float32) autocast.emplace(compute_);
  Tensor x = vs == 0 ? model.embed(b.inputs) : sl.input;
  const auto& blocks = model.blocks();
  Tensor aux;
  for (int64_t i = stage_.partition().begin(vs); i < stage_.partition().end(vs); ++i) {
    x = (*blocks[size_t(i)])(x);
    if (training) {
      for (const nn::MoE* moe : nn::moe_layers(*blocks[size_t(i)])) {
        st.moe_dropped += moe->last_dropped_tokens();
        st.has_moe = true;
      }
    }
    Tensor a = model.recorded_block_aux_loss(size_t(i));
    if (a.defined()) aux = aux.defined() ? aux + a : a;
    if (a.defined() && training) {
      const size_t k = size_t(mb) * blocks.size() + size_t(i);
      st.block_aux[k] = host_value(a);
      st.block_aux_dtype[k] = double(int(a.dtype()) + 1);
    }
  }
  const double coef = model.aux_loss_coef();
  if (aux.defined() && training && mb == m - 1) {
    st.aux_last += host_value(aux);
    st.has_aux = true;
  }
  if (vs < S - 1) {
    sl.output = x;
    if (aux.defined() && training) {
      st.loss_sum += host_value(aux) * coef;
      Tensor a = aux * coef;
      sl.aux_root = m == 1 ? a : a / double(m);
      if (loss_scale_) sl.aux_root = sl.aux_root * *loss_scale_;  // as GradScaler::scale(loss / M) on one device
    }
    return;
  }
  Tensor output = model.head(x);
  if (!training) {  // forward-only: the head's output is the result
    sl.output = output;
    return;
  }
  // The single-device loss of the micro-batch, restricted to what runs here.
  const Tensor stage = model.stage_loss(output, b.targets);
  const Tensor l = aux.defined() ? stage + aux * coef : stage;
  st.add_loss(size_t(mb), stage, l);
  sl.root = m == 1 ? l : l / double(m);
  if (loss_scale_) sl.root = sl.root * *loss_scale_;  // as GradScaler::scale(loss / M) on one device
}

void Executor::backward_chunk(int vs, Slot& sl) {
  std::optional<nn::AutocastScope> autocast;
  if (compute_ != DType::Float32) autocast.emplace(compute_);
  if (sl.root.defined()) {
    autograd::backward({sl.root});
  } else {
    std::vector<Tensor> roots{sl.output}, grads{sl.grad_out};
    if (sl.aux_root.defined()) roots.push_back(sl.aux_root), grads.push_back(Tensor());
    autograd::backward(roots, grads);
  }
  if (vs > 0) {
    Tensor g = sl.input.grad();
    if (!g.defined()) {  // the chunk ignored its input: its gradient is zero
      NoGradGuard ng;
      g = zeros(raw::local_of(sl.input).shape(), TensorOptions(sl.input.dtype()));
    }
    sl.grad_in = g;
  }
  sl.input = sl.output = sl.root = sl.aux_root = sl.grad_out = Tensor();
}

Tensor Executor::forward(const Tensor& inputs) {
  NoGradGuard ng;
  const Schedule s = forward_only(stage_.pp_size(), 1, stage_.virtual_stages());
  LaidOutMicroBatch b{inputs, Tensor(), nn::forward_context()};
  run(s, {b});
  const int last = stage_.num_stages() - 1;
  Tensor output = slots_[size_t(stage_.virtual_stages() - 1)].output;  // chunk V-1, micro-batch 0 on the last rank
  Tensor out = p2p_.broadcast(output, last % stage_.pp_size());
  slots_.assign(slots_.size(), Slot{});
  return out;
}

}  // namespace tessel::parallel::pipeline
