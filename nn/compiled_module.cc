#include "nn/compiled_module.h"

#include <spdlog/spdlog.h>

#include <memory>
#include <vector>

#include "autograd/api.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "dtensor/dist_call.h"
#include "nn/attention.h"
#include "nn/autocast.h"
#include "nn/container.h"
#include "nn/moe.h"
#include "nn/staged.h"
#include "runtime/capture.h"
#include "runtime/profile.h"
#include "runtime/comm/comm.h"
#include "runtime/error.h"
#include "runtime/numerics.h"

namespace tessel::nn {

namespace {
constexpr const char* kOp = "compiled module";

// `t` (a tensor the recording made) as a recorded output.
capture::OutputLayout output_layout(capture::Recorder& rec, const Tensor& t) {
  return capture::layout_of(t.defined() ? rec.output(raw::local_of(t)) : -1, t);
}

std::string describe(const capture::OutputLayout& l) {
  const capture::TensorArg& a = l.local;
  if (a.buffer < 0) return "none";
  std::string s = fmt::format(FMT_STRING("{}@{}+{}{}"), a.buffer, a.shape.str(), a.offset, dtype_name(a.dtype));
  if (l.mesh) s += " " + l.placements.str() + " of " + l.global_shape.str();
  return s;
}

// A copy of `t` with storage of its own, distributed like `t`; its local
// piece in `local`. For the program's inputs (made outside the recording:
// not the step's buffers) and for what a replay hands out (the program's
// buffers are the next call's).
Tensor own_copy(const Tensor& t, Tensor& local) {
  local = raw::local_of(t).contiguous().clone();
  return t.is_distributed() ? raw::make_distributed(local, t.mesh(), t.placements(), t.shape()) : local;
}
Tensor copy_out(capture::Program& p, const capture::OutputLayout& l) {
  Tensor local;
  return own_copy(p.output(l), local);
}

// Every rank that runs the module decides alike whether it is refused: a
// rank running it eagerly while the others replay would reach the
// collectives of its backward (and the data-parallel hooks' reductions) in
// another order. One small all-reduce per recording, over the module's mesh.
bool agreed(const MeshPtr& mesh, bool ok) {
  if (!mesh) return ok;
  Tensor v = raw::empty({1}, DType::Int32);
  v.data<int32_t>()[0] = ok ? 1 : 0;
  for (int d = 0; d < mesh->ndim(); ++d)
    if (mesh->comm(d)) mesh->comm(d)->all_reduce(v, comm::ReduceOp::Min)->wait();
  return v.data<int32_t>()[0] == 1;
}

std::string placement_of(const Tensor& t) {
  return t.is_distributed() ? t.placements().str() + " of " + t.shape().str() : std::string("local");
}
}  // namespace

// Mixed mode's state of one module.
class CompiledModule {
 public:
  enum class State { Warmup, Recording, Ready, Refused };
  State state = State::Warmup;
  std::string key;  // the guard the recordings were made under
  std::unique_ptr<capture::Program> first;  // the first recording, to compare with the second
  std::string first_outputs;                // its outputs' layouts
  std::unique_ptr<capture::Program> program;  // the recording in use
  int64_t forward_launches = 0;               // launches [0, this) are the forward's
  capture::OutputLayout y;                    // the output
  std::string g_placement;                    // the incoming gradient's placements, as recorded
  std::vector<capture::OutputLayout> grads;   // per gradient computed: where it lies (buffer -1: none)
  std::vector<size_t> grad_edges;             // per gradient: its edge (0: the input, 1 + i: parameter i)
  bool busy = false;  // a recorded or replayed call waits for its backward
  ModuleCompileStats stats;

  void refuse(const std::string& who, const std::string& why) {
    state = State::Refused;
    first.reset();
    program.reset();
    stats.refused = fmt::format(FMT_STRING("'{}': {}"), who, why);
    spdlog::warn("tessel: compiled module '{}' runs eagerly from now on (the same results, without the replay's "
                 "speed): {}",
                 who, why);
  }
};

namespace {

std::string who_of(const UnaryModule& m) { return m.path().empty() ? m.type_name() : m.path(); }

// What a call depends on that the recording does not read from a tensor.
std::string guard_key(const Module& m, const Tensor& x, const std::vector<Tensor>& params) {
  std::string k = fmt::format(FMT_STRING("{} {} {} {} {} {:x} {}|"), x.shape().str(), dtype_name(x.dtype()),
                              x.device().str(), placement_of(x), int(x.requires_grad()),
                              numerics::encode_settings(numerics::current_settings()),
                              autocast_dtype() ? dtype_name(*autocast_dtype()) : "-");
  for (const auto& [path, sub] : m.named_modules()) k.push_back(sub->is_training() ? 't' : 'e');
  k.push_back('|');
  for (const Tensor& p : params)
    k += fmt::format(FMT_STRING("{}:{}:{}:{};"), static_cast<const void*>(raw::local_of(p).storage().get()),
                     raw::local_of(p).offset(), int(p.requires_grad()), placement_of(p));
  k.push_back('|');
  m.for_each_buffer_slot([&](const BufferSlot& slot) {  // (a buffer assigned anew, the old one kept elsewhere too)
    k += fmt::format(FMT_STRING("{};"), static_cast<const void*>(slot.storage()));
  });
  return k;
}

// Why this call cannot be compiled at all ("" if it can).
std::string unsupported(const Tensor& x, const std::vector<Tensor>& params) {
  auto bad = [](const Tensor& t) -> std::string {
    if (t.is_distributed() && t.impl()->dist->on_use)
      return fmt::format(FMT_STRING("parameter {} is an FSDP (ZeRO-3) shard gathered on use -- its unit's forward "
                                    "hooks did not run before this call -- and a replay runs no op that would "
                                    "gather it; call the unit's module through operator()"),
                         t.desc());
    return std::string();
  };
  std::string why = bad(x);
  for (size_t i = 0; i < params.size() && why.empty(); ++i) why = bad(params[i]);
  return why;
}

// The module's node in the step's graph: edges to the input, then to each
// parameter. Its backward finishes a recording (runs autograd::grad through
// the module's own graph under the recorder) or replays the recorded
// backward.
struct CompiledModuleNode final : Node {
  std::shared_ptr<CompiledModule> c;
  std::string who;
  bool open = true;  // this call holds c->busy
  // A recording: the recorder (suspended), the module's graph and its leaves.
  std::unique_ptr<capture::Recorder> rec;
  Tensor y_inner, x_in;
  std::vector<Tensor> params;
  MeshPtr mesh;  // the module's tensors' mesh (null: one device), for agreeing on a refusal

  const char* name() const override { return "compiled_module"; }
  ~CompiledModuleNode() override { close(); }
  void close() {
    if (!open) return;
    open = false;
    c->busy = false;
    rec.reset();  // a recording whose backward never came is dropped
    y_inner = Tensor();
    x_in = Tensor();
    params.clear();
  }
  void release_saved() override { close(); }

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    std::vector<Tensor> out(next_edges.size());
    TESSEL_CHECK(open, kOp, "'{}': backward through a compiled module whose graph was already freed; call "
                 "backward(..., retain_graph=true) the first time", who);
    if (!grads[0].defined()) {
      close();
      return out;
    }
    if (rec) return finish_recording(grads[0]);
    // A replay: the recorded backward on this call's buffers.
    CompiledModule& m = *c;
    // The rest of the step is the same code every call, so the gradient
    // arrives laid out as it was recorded; if not, an error (the recorded
    // backward would read it wrongly), never a guess.
    TESSEL_CHECK(placement_of(grads[0]) == m.g_placement, kOp,
                 "'{}': the gradient of the output arrived as {} ({}), but the recorded backward took {}: call "
                 "set_compiled(false) on this module",
                 who, grads[0].desc(), placement_of(grads[0]), m.g_placement);
    const std::string span = who + " (backward)";
    profile::Timer timer("compile.replay ", span.c_str(), "step");  // (a span naming the module in traces)
    m.program->set_input(1, raw::local_of(grads[0]).contiguous());
    m.program->replay_range(m.forward_launches, m.program->launches());
    for (size_t i = 0; i < m.grads.size(); ++i)
      if (m.grads[i].local.buffer >= 0) out[m.grad_edges[i]] = copy_out(*m.program, m.grads[i]);
    m.program->release_finished(m.program->launches());  // the call's arenas go back: all is copied out
    m.program->release_inputs();                         // and its copies of x and the gradient
    close();
    return out;
  }

  std::vector<Tensor> finish_recording(const Tensor& g) {
    CompiledModule& m = *c;
    std::vector<Tensor> out(next_edges.size());
    Tensor g_local;
    Tensor g_in = own_copy(g, g_local);  // the program's own (made before it resumes: not the step's)
    std::vector<Tensor> wrt;
    std::vector<size_t> edges;
    if (next_edges[0].valid()) wrt.push_back(x_in), edges.push_back(0);
    for (size_t i = 0; i < params.size(); ++i)
      if (next_edges[1 + i].valid()) wrt.push_back(params[i]), edges.push_back(1 + i);
    rec->resume();
    rec->input(g_local);
    std::vector<Tensor> gs = wrt.empty() ? std::vector<Tensor>() : autograd::grad({y_inner}, wrt, {g_in});
    std::vector<capture::OutputLayout> layouts;
    std::string outputs = "g=" + placement_of(g) + ";";
    for (size_t i = 0; i < gs.size(); ++i) {
      // A gradient that is the incoming one itself (an identity) would be
      // the input buffer: copied, so outputs have buffers of their own.
      if (gs[i].defined() && raw::local_of(gs[i]).shares_storage(g_local)) gs[i] = gs[i].clone();
      layouts.push_back(output_layout(*rec, gs[i]));
      outputs += describe(layouts.back()) + ";";
      out[edges[i]] = gs[i];
    }
    std::unique_ptr<capture::Program> p;
    std::string why;
    const bool second = m.first != nullptr;
    try {
      p = rec->finish(second ? capture::Recorder::Use::Replay : capture::Recorder::Use::CompareOnly);
    } catch (const capture::NotCapturable& e) {
      why = e.what();
    }
    rec.reset();
    // (Both recordings must also split forward and backward at the same launch.)
    outputs += fmt::format(FMT_STRING("y={} forward={}"), describe(m.y), m.forward_launches);
    ++m.stats.recordings;
    if (why.empty() && second) {
      const std::string diff = m.first->difference(*p);
      if (!diff.empty()) why = "two calls recorded differently: " + diff;
      else if (outputs != m.first_outputs)
        why = fmt::format(FMT_STRING("two calls recorded differently: the outputs or the end of the forward differ ({} "
                                     "then {})"),
                          m.first_outputs, outputs);
    }
    if (!agreed(mesh, why.empty()) && why.empty()) why = "another rank's recording of this module was refused";
    if (!why.empty()) {
      m.refuse(who, why);
    } else if (!second) {
      m.first = std::move(p);
      m.first_outputs = outputs;
    } else {
      m.first.reset();
      m.program = std::move(p);
      m.g_placement = placement_of(g);
      m.grads = layouts;
      m.grad_edges = edges;
      m.state = CompiledModule::State::Ready;
      m.stats.launches = m.program->launches();
      m.stats.buffer_bytes = m.program->bytes();
    }
    close();
    return out;
  }
};

std::shared_ptr<CompiledModuleNode> attach(const std::shared_ptr<CompiledModule>& c, const std::string& who,
                                           const Tensor& x, const std::vector<Tensor>& params, Tensor& y_out) {
  auto node = std::make_shared<CompiledModuleNode>();
  node->c = c;
  node->who = who;
  c->busy = true;
  std::vector<const Tensor*> edges{&x};
  for (const Tensor& p : params) edges.push_back(&p);
  detail::connect(*node, edges);
  node->num_outputs = 1;
  detail::set_history(y_out, node, 0);
  return node;
}

}  // namespace

void UnaryModule::set_compiled(bool on) {
  TESSEL_CHECK(!on || !recompute(), kOp,
               "'{}' is marked for recomputation (set_recompute): a module is either recomputed or compiled, not "
               "both",
               who_of(*this));
  if (!on) compiled_.reset();
  else if (!compiled_) compiled_ = std::make_shared<CompiledModule>();
}

ModuleCompileStats UnaryModule::compile_stats() const {
  if (!compiled_) return ModuleCompileStats{};
  ModuleCompileStats s = compiled_->stats;
  s.modules = 1;
  if (compiled_->program) s.held_bytes = compiled_->program->held_bytes();
  return s;
}

Tensor UnaryModule::call_compiled(const Tensor& x) {
  std::shared_ptr<CompiledModule> c = compiled_;
  // Eager: calls without gradients; inside a whole-step recording (which
  // records this module with the step); anomaly detection; for good after
  // a refusal.
  if (!GradMode::is_enabled() || capture::active() != nullptr || anomaly::enabled()) return call_eager(x);
  if (c->state == CompiledModule::State::Refused) {
    ++c->stats.calls;  // (still a training call: the counts add up to what ran)
    return call_eager(x);
  }
  // The forward hooks run eagerly around the recorded (or replayed) forward,
  // at every call: they are the caller's host work, not the module's --
  // FSDP gathers the parameters in them and releases them after, a module
  // layout redistributes the input and the output -- and a replay runs no
  // code of the module's. So the parameters the recording sees are the ones
  // the pre-hooks installed (FSDP's gathered copies).
  if (!has_forward_hooks()) return compiled_forward(c, x);
  Tensor in = run_forward_pre_hooks(x);
  return run_forward_hooks(in, compiled_forward(c, in));
}

Tensor UnaryModule::compiled_forward(const std::shared_ptr<CompiledModule>& c, const Tensor& x) {
  CompiledModule& m = *c;
  std::vector<Tensor> params = parameters();
  bool needs_grad = x.requires_grad();
  for (const Tensor& p : params) needs_grad = needs_grad || p.requires_grad();
  if (!needs_grad) return forward(x);
  const std::string who = who_of(*this);
  ++m.stats.calls;
  if (const std::string why = unsupported(x, params); !why.empty()) {
    m.refuse(who, why);
    return forward(x);
  }
  if (m.busy) {  // the recording's buffers wait for another call's backward
    ++m.stats.busy;
    return forward(x);
  }
  const std::string key = guard_key(*this, x, params);
  if (m.state == CompiledModule::State::Warmup) {
    // The first call eagerly: what it builds lazily (caches), later calls reuse.
    m.state = CompiledModule::State::Recording;
    m.key = key;
    return forward(x);
  }
  // A tensor from before the call that the recording reads and that its
  // owner has since replaced (held by the recording alone now): the replay
  // would read the old one.
  const capture::Program* recorded = m.program ? m.program.get() : m.first.get();
  if (key != m.key || (recorded && !recorded->replaced_outside().empty())) {  // another shape, mode, parameter or tensor: record again
    if (m.state == CompiledModule::State::Ready || m.first) ++m.stats.recaptures;
    m.first.reset();
    m.program.reset();
    m.state = CompiledModule::State::Recording;
    m.key = key;
  }

  if (m.state == CompiledModule::State::Ready) {
    profile::Timer timer("compile.replay ", who.c_str(), "step");  // (a span naming the module in traces)
    m.program->set_input(0, raw::local_of(x).contiguous());
    m.program->replay_range(0, m.forward_launches);
    Tensor y = copy_out(*m.program, m.y);  // the arena's is reused by the next call
    m.program->release_finished(m.forward_launches);  // the forward's temporaries go back until the backward
    ++m.stats.replayed;
    attach(c, who, x, params, y);
    return y;
  }

  // Recording: the forward now, the backward when the engine reaches the node.
  Tensor x_local;
  Tensor x_in = own_copy(x.detach(), x_local);  // the program's own input buffer (made before the recorder)
  if (x.requires_grad()) x_in.requires_grad_(true);
  auto rec = std::make_unique<capture::Recorder>(fmt::format(FMT_STRING("module '{}'"), who));
  rec->remake_blocks = true;  // replayed for every micro-batch: where it sits in the batch is per call
  rec->outputs_read_per_part = true;  // y after the forward, the gradients after the backward: copy_out
  rec->input(x_local);
  Tensor y;
  try {
    y = forward(x_in);
  } catch (...) {
    rec.reset();
    throw;
  }
  if (!y.defined() || raw::local_of(y).shares_storage(x_local) || !y.requires_grad()) {
    rec.reset();
    m.refuse(who, fmt::format(FMT_STRING("its output {} is not a new local tensor with a gradient (compile a module "
                                         "that computes something)"),
                              y.defined() ? y.desc() : std::string("(undefined)")));
    return forward(x);
  }
  const capture::OutputLayout y_layout = output_layout(*rec, y);
  const int64_t forward_launches = rec->launches();
  m.forward_launches = forward_launches;
  m.y = y_layout;
  rec->suspend();
  Tensor y_out = y.detach();
  auto node = attach(c, who, x, params, y_out);
  node->rec = std::move(rec);
  node->y_inner = y;
  node->x_in = x_in;
  node->params = params;
  if (x.is_distributed()) node->mesh = x.mesh();
  else if (y.is_distributed()) node->mesh = y.mesh();
  for (size_t i = 0; i < params.size() && !node->mesh; ++i)
    if (params[i].is_distributed()) node->mesh = params[i].mesh();
  return y_out;
}

CompileModules parse_compile_modules(const std::string& name) {
  if (name == "none") return CompileModules::None;
  if (name == "attention") return CompileModules::Attention;
  if (name == "blocks") return CompileModules::Blocks;
  TESSEL_FAIL(kOp, "unknown choice '{}' of modules to compile (none, attention, blocks)", name);
}

const char* compile_modules_name(CompileModules which) {
  switch (which) {
    case CompileModules::None: return "none";
    case CompileModules::Attention: return "attention";
    case CompileModules::Blocks: return "blocks";
  }
  return "?";
}

int apply_compile_modules(Module& model, CompileModules which) {
  auto* staged = dynamic_cast<StagedModel*>(&model);
  TESSEL_CHECK(which != CompileModules::Blocks || staged, kOp,
               "compile_modules = blocks marks the blocks of an nn::StagedModel, and {} is not one: mark your own "
               "modules with UnaryModule::set_compiled(true)",
               model.type_name());
  int marked = 0;
  if (staged)
    for (const auto& block : staged->blocks()) {
      // An MoE layer routes tokens on the host (a recording refuses it) and
      // leaves its router loss in the block (a side output no replay makes).
      TESSEL_CHECK(which != CompileModules::Blocks || moe_layers(*block).empty(), kOp,
                   "compile_modules = blocks: block '{}' holds an MoE layer, which routes tokens on the host and "
                   "hands out its router loss beside the block's output; compile the attention layers "
                   "(compile_modules = attention) and let the MoE layers run eagerly",
                   block->path());
      block->set_compiled(which == CompileModules::Blocks);
      marked += which == CompileModules::Blocks;
    }
  for (const auto& [path, m] : model.named_modules())
    if (auto* attn = dynamic_cast<Attention*>(m)) {
      attn->set_compiled(which == CompileModules::Attention);
      marked += which == CompileModules::Attention;
    }
  // Asked for, and nothing to mark: an error, not a run that is silently eager.
  TESSEL_CHECK(which == CompileModules::None || marked > 0, kOp,
               "compile_modules = {} marks {}, and {} has none: nothing would be compiled. Mark your own modules "
               "with UnaryModule::set_compiled(true), or compile the whole step (RunOptions::compile)",
               compile_modules_name(which),
               which == CompileModules::Attention ? "every nn::Attention module" : "the blocks of an nn::StagedModel",
               model.type_name());
  return marked;
}

void record_modules_again(const Module& root) {
  for (const auto& [path, m] : root.named_modules()) {
    auto* u = dynamic_cast<const UnaryModule*>(m);
    if (u && u->compiled()) u->forget_recording();
  }
}

void UnaryModule::forget_recording() const {
  // The next call's guard differs from this one, so it records again; a
  // call in flight keeps replaying the recording it began with.
  if (compiled_) compiled_->key.clear();
}

ModuleCompileStats compiled_module_stats(const Module& root) {
  ModuleCompileStats s;
  for (const auto& [path, m] : root.named_modules()) {
    auto* u = dynamic_cast<const UnaryModule*>(m);
    if (!u || !u->compiled()) continue;
    const ModuleCompileStats one = u->compile_stats();
    s.modules += 1;
    s.calls += one.calls;
    s.replayed += one.replayed;
    s.recordings += one.recordings;
    s.recaptures += one.recaptures;
    s.busy += one.busy;
    s.launches += one.launches;
    s.buffer_bytes += one.buffer_bytes;
    s.held_bytes += one.held_bytes;
    if (s.refused.empty()) s.refused = one.refused;
  }
  return s;
}

}  // namespace tessel::nn
