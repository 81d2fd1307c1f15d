#include "dtensor/dist_call.h"


#include <chrono>

#include "dtensor/ops.h"
#include "dtensor/redistribute.h"
#include "runtime/cost.h"
#include "runtime/logging.h"
#include "runtime/numerics.h"

namespace tessel::detail {

DispatchStats& dispatch_stats() {
  thread_local DispatchStats s;
  return s;
}
bool& dispatch_profiling() {
  thread_local bool on = false;
  return on;
}
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

DistCall::DistCall(const char* op, std::vector<const Tensor*> in) : inputs(std::move(in)) {
  ctx.op = op;
  // Use hooks first, in argument order, so the meta run, the sharding rule,
  // the redistribution and the node all see the replacements. A hook may
  // change what later arguments refer to (FSDP installs a whole unit's
  // gathered parameters into the module slots they are read from), so each
  // input is looked at only after the ones before it were resolved.
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorImpl* impl = inputs[i]->impl();
    if (impl == nullptr || impl->dist == nullptr || TESSEL_LIKELY(impl->dist->on_use == nullptr)) continue;
    if (resolved.empty()) resolved.resize(inputs.size());  // once: inputs point into it
    const Tensor self = *inputs[i];  // held: the hook may overwrite the slot inputs[i] points to
    const std::shared_ptr<const DistUseHook> hook = impl->dist->on_use;
    resolved[i] = hook->resolve(self);
    const Tensor& r = resolved[i];
    TESSEL_CHECK(r.defined() && r.is_distributed() && !r.dist().on_use && r.shape() == self.shape() &&
                     r.dtype() == self.dtype(),
                 op, "internal error: the use hook of input {} ({}) returned {}", i, self.desc(), r.desc());
    inputs[i] = &r;
  }
  for (const Tensor* t : inputs) {
    if (!t->defined() || !t->is_distributed()) continue;
    if (!mesh) {
      mesh = t->mesh();
    } else if (!same_mesh(mesh, t->mesh())) {
      TESSEL_FAIL(op, "operands live on different meshes: {} and {}", mesh->str(), t->desc());
    }
  }
  TESSEL_ASSERT(mesh != nullptr);
  ctx.mesh = mesh.get();
  const Placements rep = Placements::replicated(mesh->ndim());
  ctx.in.resize(inputs.size());
  meta_in.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = *inputs[i];
    TensorSpec& s = ctx.in[i];
    if (!t.defined()) continue;
    s.defined = true;
    s.distributed = t.is_distributed();
    s.shape = t.shape();
    s.dtype = t.dtype();
    s.placements = s.distributed ? t.placements() : rep;
    cost::Pause not_the_step;  // global shapes, for the shape run (runtime/cost.h)
    meta_in[i] = raw::empty(t.shape(), t.dtype(), kMeta);
  }
  ctx.grad = false;
  if (GradMode::is_enabled()) {
    for (const Tensor* t : inputs)
      if (t->defined() && t->requires_grad()) ctx.grad = true;
  }
}

void DistCall::set_outputs(const Tensor& meta_out) {
  TensorSpec s;
  s.defined = meta_out.defined();
  if (s.defined) {
    s.shape = meta_out.shape();
    s.dtype = meta_out.dtype();
  }
  ctx.out.push_back(s);
}

void DistCall::set_outputs(const std::vector<Tensor>& meta_out) {
  for (const Tensor& t : meta_out) set_outputs(t);
}

void log_replicated_fallback(const char* op) {
  log_once(std::string("replicated-fallback:") + op,
           "tessel: op '{}' has no sharding rule; its distributed inputs are replicated first", op);
}

void DistCall::finish_plan(bool has_rule) {
  const char* op = ctx.op;
  if (!has_rule) {
    plan = dtensor::replicate(ctx);
    cost::add_replicated_fallback(op);  // the planner reports these (planner/planner.h)
  }
  TESSEL_CHECK(plan.in.size() == ctx.in.size() && plan.out.size() == ctx.out.size(), op,
               "internal error: sharding rule returned {} input / {} output placements for {} inputs / {} outputs",
               plan.in.size(), plan.out.size(), ctx.in.size(), ctx.out.size());
  for (size_t i = 0; i < ctx.in.size(); ++i)
    if (ctx.in[i].defined) dtensor::check_placements(op, *mesh, plan.in[i], ctx.in[i].dim());
  for (size_t i = 0; i < ctx.out.size(); ++i)
    if (ctx.out[i].defined) dtensor::check_placements(op, *mesh, plan.out[i], ctx.out[i].dim());
}

void DistCall::place_inputs() {
  placed.resize(inputs.size());
  local_in.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = *inputs[i];
    if (!t.defined()) continue;
    if (t.is_distributed()) {
      placed[i] = t.placements() == plan.in[i] ? t : redistribute(t, plan.in[i]);
    } else {
      placed[i] = distribute_tensor(t, mesh, plan.in[i]);
    }
    local_in[i] = raw::local_of(placed[i]);
  }
}

Tensor DistCall::wrap(const Tensor& local_out, size_t i) const {
  if (!local_out.defined()) return local_out;
  const TensorSpec& s = ctx.out[i];
  const Placements& p = plan.out[i];
  LocalGeometry g = ctx.local(s.shape, p);
  TESSEL_CHECK(local_out.shape() == g.shape, ctx.op,
               "internal error: sharding rule gives output {} placements {} (local piece {} expected) but the local "
               "op produced {}",
               i, p, g.shape, local_out.shape());
  return raw::make_distributed(local_out, mesh, p, s.shape);
}

std::vector<Tensor> DistCall::wrap(const std::vector<Tensor>& local_out) const {
  std::vector<Tensor> out;
  out.reserve(local_out.size());
  for (size_t i = 0; i < local_out.size(); ++i) out.push_back(wrap(local_out[i], i));
  return out;
}

uint32_t DistCall::replicated_dims() const {
  uint32_t dims = 0;
  for (int m = 0; m < mesh->ndim(); ++m) {
    bool all_r = true;
    for (size_t i = 0; i < ctx.in.size(); ++i)
      if (ctx.in[i].defined && !plan.in[i][m].is_replicate()) all_r = false;
    for (size_t i = 0; i < ctx.out.size(); ++i)
      if (ctx.out[i].defined && !plan.out[i][m].is_replicate()) all_r = false;
    if (all_r) dims |= 1u << m;
  }
  return dims;
}

// Calls found(is_output, index, mesh dim) for each pending sum the plan would
// leave in a 16-bit tensor -- an output planned Partial, or (when recording)
// the gradient of a 16-bit input that is Replicate on a dim where something
// else is cut (on dims where everything is Replicate the gradient passes
// through as it comes) -- until found returns true.
template <class F>
void DistCall::each_16bit_pending_sum(F&& found) const {
  for (size_t i = 0; i < ctx.out.size(); ++i) {
    if (!ctx.out[i].defined || !is_half(ctx.out[i].dtype)) continue;
    for (int m = 0; m < mesh->ndim(); ++m)
      if (plan.out[i][m].is_partial_sum() && mesh->size(m) > 1 && found(true, i, m)) return;
  }
  if (!ctx.grad) return;
  const uint32_t passthrough = replicated_dims();
  for (size_t i = 0; i < ctx.in.size(); ++i) {
    if (!ctx.in[i].defined || !is_half(ctx.in[i].dtype) || !inputs[i]->requires_grad()) continue;
    for (int m = 0; m < mesh->ndim(); ++m)
      if (mesh->size(m) > 1 && !(passthrough >> m & 1u) && plan.in[i][m].is_replicate() && found(false, i, m))
        return;
  }
}

bool DistCall::pends_in_16bit() const {
  bool any = false;
  each_16bit_pending_sum([&](bool, size_t, int) { return any = true; });
  return any;
}

void DistCall::refuse_16bit_pending_sum() const {
  std::string ins, outs, pending;
  for (size_t i = 0; i < ctx.in.size(); ++i)
    if (ctx.in[i].defined)
      ins += TESSEL_FORMAT("{}{} {} as {}", ins.empty() ? "" : ", ", ctx.in[i].shape, dtype_name(ctx.in[i].dtype),
                           plan.in[i]);
  for (size_t i = 0; i < ctx.out.size(); ++i)
    if (ctx.out[i].defined)
      outs += TESSEL_FORMAT("{}{} {} as {}", outs.empty() ? "" : ", ", ctx.out[i].shape, dtype_name(ctx.out[i].dtype),
                            plan.out[i]);
  each_16bit_pending_sum([&](bool is_output, size_t i, int m) {
    const char* sep = pending.empty() ? "" : ", ";
    if (is_output)
      pending += TESSEL_FORMAT("{}output {} over '{}'", sep, i, mesh->name(m));
    else
      pending += TESSEL_FORMAT("{}the gradient of input {} ({} {}, replicated) over '{}'", sep, i, ctx.in[i].shape,
                               dtype_name(ctx.in[i].dtype), mesh->name(m));
    return false;  // all of them
  });
  TESSEL_FAIL(ctx.op,
              "bitwise mode cannot give one device's bits for this op in 16-bit floats on mesh {}: inputs {}; "
              "outputs {}. Pending sums in 16 bits: {} -- each rank's piece would be rounded before the pieces are "
              "summed, which one device never does, and this op has no exact float32 form (exact_widened, "
              "dtensor/dist_call.h). Fix: keep that operand in float32 (a float32 operand makes the op compute in "
              "float32: e.g. a learned scale kept float32, not cast to 16 bits), or run without bitwise mode",
              mesh->str(), ins, outs, pending);
}

Tensor widen_16bit(const Tensor& t) {
  return t.defined() && is_half(t.dtype()) ? t.to(DType::Float32) : t;
}

Tensor round_to(const Tensor& t, const TensorSpec& s) {
  return t.defined() && s.defined && t.dtype() != s.dtype ? t.to(s.dtype) : t;
}

DistGradInfo make_grad_info(const DistCall& c, const char* op) {
  DistGradInfo g;
  g.mesh = c.mesh;
  g.op = op;
  g.in = c.plan.in;
  g.out = c.plan.out;
  for (const TensorSpec& s : c.ctx.in) {
    g.in_shape.push_back(s.shape);
    g.in_defined.push_back(s.defined);
  }
  for (const TensorSpec& s : c.ctx.out) g.out_shape.push_back(s.shape);
  g.passthrough = c.replicated_dims();
  return g;
}

std::vector<Tensor> DistGradInfo::localize(std::vector<Tensor>& grads, Placements& mode) const {
  const int nd = mesh->ndim();
  mode = Placements::replicated(nd);
  // Bitwise mode: a pending-sum gradient is reduced before an op's backward
  // touches it (the backward's arithmetic does not commute with the sum),
  // unless that backward only moves elements (views: the weight-gradient
  // sums of data parallelism stay pending through a transposed weight).
  const bool keep_partial = !numerics::bitwise() || partial_exact;
  for (int m = 0; m < nd && keep_partial; ++m) {
    if (!(passthrough >> m & 1u)) continue;
    for (const Tensor& g : grads)
      if (g.defined() && g.is_distributed() && g.placements()[m].is_partial_sum()) mode[m] = Partial();
  }
  std::vector<Tensor> local(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    if (!g.defined()) continue;
    Placements want;
    for (int m = 0; m < nd; ++m) want.push_back(passthrough >> m & 1u ? mode[m] : dtensor::dual(out[i][m], op));
    if (!g.is_distributed()) {  // a plain gradient (e.g. the engine's seed of ones): the full value on every rank
      const Tensor& lg = g;
      local[i] = dtensor::redistribute_local(lg, out_shape[i], *mesh, Placements::replicated(nd), want);
    } else {
      local[i] = dtensor::redistribute_local(g.dist().local, out_shape[i], *mesh, g.placements(), want);
    }
  }
  return local;
}

std::vector<Tensor> DistGradInfo::wrap_inputs(std::vector<Tensor>& local_grads, const Placements& mode) const {
  const int nd = mesh->ndim();
  std::vector<Tensor> out(local_grads.size());
  for (size_t i = 0; i < local_grads.size(); ++i) {
    const Tensor& lg = local_grads[i];
    if (!lg.defined() || i >= in.size() || !in_defined[i]) continue;
    Placements p;
    for (int m = 0; m < nd; ++m) p.push_back(passthrough >> m & 1u ? mode[m] : dtensor::dual(in[i][m], op));
    LocalGeometry geo = local_geometry(in_shape[i], mesh->shape(), p, mesh->coords());
    TESSEL_CHECK(lg.shape() == geo.shape, std::string("backward of ") + op,
                 "internal error: local gradient {} of input {} does not match placements {} of global shape {} "
                 "(expected local {})",
                 lg.shape(), i, p, in_shape[i], geo.shape);
    out[i] = raw::make_distributed(lg, mesh, p, in_shape[i]);
  }
  return out;
}

}  // namespace tessel::detail
