#include "run/run.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <regex>
#include <set>
#include <unordered_set>

#include "autograd/anomaly.h"
#include "autograd/api.h"
#include "autograd/autograd_meta.h"
#include "autograd/engine.h"
#include "autograd/trace.h"
#include "checkpoint/save.h"
#include "dtensor/ops.h"
#include "nn/autocast.h"
#include "nn/clip.h"
#include "nn/kv_cache.h"
#include "nn/moe.h"
#include "nn/parallel/parallelize.h"
#include "nn/parallel/plan.h"
#include "nn/parallel/pipeline/pipeline.h"
#include "nn/recompute.h"
#include "nn/staged.h"
#include "run/run_state.h"
#include "run/trace.h"
#include "runtime/comm/comm.h"
#include "runtime/logging.h"
#include "runtime/numerics.h"
#include "runtime/profile.h"
#include "train/data.h"
#include "train/metrics.h"

namespace tessel {
namespace {

constexpr const char* kOp = "tessel::parallelize";
constexpr const char* kRun = "tessel::Run";

// Default groups: decay (matrices, embeddings) / no_decay (vectors).
std::function<std::vector<nn::ParamGroup>(const nn::Module&)> default_groups(double weight_decay) {
  return [weight_decay](const nn::Module& m) { return nn::default_param_groups(m, weight_decay); };
}

// Every mesh dim of size > 1 must mean something to this run: "dp" (data
// parallel), "pp" (pipeline), or a dim the plan lays something out on.
// Otherwise the ranks along it would all compute the same thing -- most
// likely a typo in a dim name, never what was meant.
void check_mesh_dims(const Mesh& mesh, const parallel::ParallelPlan& plan, const std::string& model_type) {
  std::set<std::string> rules, data;  // dims the plan's rules lay parameters/modules out on; dims the batch is cut over
  auto add = [](std::set<std::string>& to, const parallel::DimLayout& l) {
    for (const auto& [name, p] : l.dims) to.insert(name);
  };
  for (const auto& r : plan.params) add(rules, r.layout);
  for (const auto& r : plan.modules) {
    add(rules, r.input);
    add(rules, r.output);
  }
  for (const auto& r : plan.experts) rules.insert(r.dim);
  add(data, plan.data);
  auto list = [](const std::set<std::string>& dims) {
    return dims.empty() ? std::string("none") : fmt::format(FMT_STRING("{}"), fmt::join(dims, ", "));
  };
  for (int d = 0; d < mesh.ndim(); ++d) {
    const std::string& name = mesh.name(d);
    if (mesh.size(d) == 1 || name == "dp" || name == "pp" || rules.count(name) || data.count(name)) continue;
    TESSEL_FAIL(kOp,
                "mesh {}: dim '{}' (size {}) means nothing to {}'s run: plan '{}' lays parameters or modules out on "
                "{}, its data layout cuts the batch over {}, and tessel itself uses 'dp' (data parallel) and 'pp' "
                "(pipeline stages). Every rank along '{}' would compute the same thing",
                mesh.str(), name, mesh.size(d), model_type, plan.name.empty() ? "(unnamed)" : plan.name, list(rules),
                list(data), name);
  }
}

// The modules of `model` whose path fully matches `pattern`, in registration
// order (FSDP units).
std::vector<nn::Module*> matching_modules(nn::Module& model, const std::string& pattern) {
  std::regex re;
  try {
    re = parallel::compile_regex(pattern);
  } catch (const std::regex_error& e) {
    TESSEL_FAIL(kOp, "RunOptions::fsdp_units '{}' is not a valid regex: {}", pattern, e.what());
  }
  std::vector<nn::Module*> out;
  for (auto& [path, m] : model.named_modules())
    if (!path.empty() && std::regex_match(path, re)) out.push_back(m);
  TESSEL_CHECK(!out.empty(), kOp, "RunOptions::fsdp_units '{}' matches no module of {} (modules: {})", pattern,
               model.type_name(), [&] {
                 std::vector<std::string> names;
                 for (auto& [path, m] : model.named_modules())
                   if (!path.empty() && names.size() < 12) names.push_back(path);
                 return fmt::format(FMT_STRING("{}{}"), fmt::join(names, ", "), names.size() == 12 ? ", ..." : "");
               }());
  return out;
}

// Marks the tensors `before` holds that the model no longer holds (so an
// optimizer built over them fails, nn::Optimizer::check_not_replaced).
void mark_replaced(const std::vector<Tensor>& before, const nn::Module& model) {
  std::unordered_set<const TensorImpl*> now;
  for (const auto& [path, slot] : model.parameter_slots()) now.insert(slot->tensor->impl());
  for (const Tensor& t : before)
    if (t.defined() && !now.count(t.impl())) ensure_autograd_meta(t).replaced_by = "tessel::parallelize";
}

bool has_dim(const Mesh& mesh, const std::string& name) {
  for (int d = 0; d < mesh.ndim(); ++d)
    if (mesh.name(d) == name) return true;
  return false;
}

// A pipeline stage's model keeps the other stages' parameters as Meta
// tensors: its optimizer updates what this rank holds.
std::vector<nn::ParamGroup> held_only(std::vector<nn::ParamGroup> groups) {
  for (nn::ParamGroup& g : groups) {
    std::vector<nn::NamedTensor> kept;
    for (nn::NamedTensor& p : g.params)
      if (!p.tensor.device().is_meta()) kept.push_back(std::move(p));
    g.params = std::move(kept);
  }
  return groups;
}

// nn::Module::param fills a new parameter with NaN: one still holding a
// non-finite value was never set (no reset_parameters, no load), or was
// loaded from a broken file. Training it gives NaN at best.
void check_parameters_set(const nn::Module& m, const char* model_type) {
  for (const auto& [path, slot] : m.parameter_slots()) {
    const Tensor& t = *slot->tensor;
    if (t.device().is_meta()) continue;
    const int64_t bad = anomaly::count_nonfinite(t);
    TESSEL_CHECK(bad == 0, kOp,
                 "parameter '{}' of {} ({}) holds {} non-finite value(s) of {}: never set (a new parameter is NaN "
                 "until reset_parameters or a load), or loaded with inf/NaN. Call model->reset_parameters(seed) or "
                 "load weights (tessel::load) before the first step, or build the model on "
                 "the Meta device (nn::ConstructionScope) and let parallelize initialise it",
                 path, model_type, t.desc(), bad, t.numel());
  }
}

bool any_meta(const nn::Module& m) {
  for (const Tensor& t : m.parameters())
    if (t.device().is_meta()) return true;
  return false;
}

}  // namespace

// ---- optimizer specs ---------------------------------------------------------------------------
namespace {
// An optimizer of type Opt over the default decay / no_decay groups.
template <class Opt, class Options>
OptimizerSpec default_spec(const char* name, const Options& o) {
  OptimizerSpec s;
  s.name = name;
  s.groups = default_groups(o.weight_decay);
  s.make = [o](std::vector<nn::ParamGroup> g) { return std::make_unique<Opt>(std::move(g), o); };
  return s;
}
}  // namespace

OptimizerSpec adamw(const nn::AdamWOptions& o) { return default_spec<nn::AdamW>("adamw", o); }
OptimizerSpec sgd(const nn::SGDOptions& o) { return default_spec<nn::SGD>("sgd", o); }

// ---- RunState ----------------------------------------------------------------------------------
RunState::~RunState() {
  if (observer) autograd::remove_backward_observer(observer);
  if (saver) {
    try {
      saver->wait();
    } catch (const std::exception& e) {
      // A destructor must not throw; Saver logs the error as well.
    }
  }
  nn::set_forward_context(caller_context);
  if (trace_scope) {
    // Ended before write_trace(): no collective is safe here, so each rank
    // writes its own file and the merged one is left out.
    try {
      finish_trace(/*merge=*/false);
      spdlog::warn("tessel::Run: the trace ended with the Run before write_trace(): each rank wrote {}, no merged {}",
                   detail::trace_rank_path(options.trace, trace->rank()), options.trace);
    } catch (const std::exception& e) {
      spdlog::warn("tessel::Run: writing the trace failed: {}", e.what());
    }
  }
}

std::string RunState::finish_trace(bool merge) {
  if (!trace_scope) return trace_written;
  trace_scope.reset();  // stop recording: the gather's own collectives are not part of the run
  const std::string meta = fmt::format(
      FMT_STRING("\"tessel\":{{\"model\":{},\"mesh\":{},\"first_step\":{},\"last_step\":{},\"dropped_events\":{}}}"),
      timeline::json_string(model_type), timeline::json_string(mesh ? mesh->str() : "one device"),
      (trace_first_step < 0 ? step : trace_first_step) + 1, step, trace->dropped());
  trace_written = detail::write_trace_files(*trace, options.trace, merge, mesh ? mesh->device() : kCPU, meta);
  return trace_written;
}

void RunState::on_backward() {
  TESSEL_CHECK(micro < options.micro_batches, kRun,
               "backward pass {} of step {} of {}, but micro_batches = {}: call run.step_optimizer() after each "
               "step's backward passes (or raise RunOptions::micro_batches for gradient accumulation)",
               micro + 1, step + 1, model_type, options.micro_batches);
  ++micro;
  TESSEL_CHECK(!scaler || scaled >= micro, kRun,
               "backward pass {} of step {} of {} without run.scale_loss: loss scaling is on "
               "(RunOptions::loss_scaling), so backpropagate run.scale_loss(loss) (forward_backward does it); an "
               "unscaled backward would be divided by the scale ({}) at the step",
               micro, step + 1, model_type, scaler->get_scale());
  if (dp) {
    profile::Timer timer("dp.begin_micro_batch", nullptr, "step");
    dp->begin_micro_batch(micro == options.micro_batches);
  }
}

void RunState::set_step_context() const {
  nn::set_forward_context({options.seed, uint64_t(step), 0, -1});
  anomaly::set_step(step + 1);  // the step being run, as the metrics number it
}

void RunState::check_parameters_unchanged() const {
  // At every step: first without a path string. The same slots holding the
  // same tensors, in the same order, is the common case.
  size_t k = 0;
  bool unchanged = true;
  model->for_each_parameter_slot([&](const nn::ParameterSlot& slot) {
    unchanged = unchanged && k < param_slots.size() && &slot == param_slots[k] && slot.tensor->impl() == param_impls[k];
    ++k;
  });
  if (unchanged && k == param_slots.size()) return;
  // Something changed: find what, by path, and say so.
  const auto slots = model->parameter_slots();
  if (slots.size() == param_paths.size()) {
    bool same = true;
    for (size_t i = 0; i < slots.size() && same; ++i) {
      same = slots[i].first == param_paths[i];
      // The same path holding another tensor: `module.weight = t` after
      // parallelize. The forward would read the new tensor while the
      // optimizer (and the gradient reduction) keep the one laid out.
      TESSEL_CHECK(!same || slots[i].second->tensor->impl() == param_impls[i], kRun,
                   "parameter '{}' of {} was assigned a new tensor ({}) after tessel::parallelize: the optimizer and "
                   "the layout keep the tensor parallelize laid out, so the step would train neither. Change a "
                   "parameter's values in place (under NoGradGuard, p.copy_(values)) or with tessel::load",
                   slots[i].first, model_type, slots[i].second->tensor->desc());
    }
    if (same) return;
  }
  std::set<std::string> before(param_paths.begin(), param_paths.end());
  for (const auto& [path, slot] : slots)
    TESSEL_CHECK(before.count(path), kRun,
                 "parameter '{}' ({}) was added to {} after tessel::parallelize: it is not laid out on the mesh and "
                 "no optimizer updates it. Register every parameter before parallelize",
                 path, slot->tensor->desc(), model_type);
  TESSEL_FAIL(kRun, "{} has {} parameters, {} when tessel::parallelize laid it out: modules were removed", model_type,
              slots.size(), param_paths.size());
}

void RunState::check_same_on_every_rank(const Tensor& full) const {
  if (!options.check_inputs || !comm::has_world() || comm::world()->size() == 1) return;
  // Not part of a compiled step: a replay runs the check itself (accept_input).
  capture::Recorder::Unrecorded guard(capture::active());
  // max(h) == -max(-h) iff every rank has the same h (as signed 64-bit values).
  // trace::tensor_hash covers the dtype and the values; the shape is mixed in too.
  uint64_t hash = trace::tensor_hash(full);
  for (int d = 0; d < full.dim(); ++d) hash = (hash ^ uint64_t(full.size(d))) * 1099511628211ull;
  const int64_t h = int64_t(hash >> 1);
  Tensor v = raw::empty({2}, DType::Int64);
  v.data<int64_t>()[0] = h;
  v.data<int64_t>()[1] = -h;
  comm::world()->all_reduce(v, comm::ReduceOp::Max)->wait();
  const bool same = v.data<int64_t>()[0] == -v.data<int64_t>()[1];
  TESSEL_CHECK(same, kRun,
               "input: the ranks passed different tensors ({} here, on rank {}): run.input takes the GLOBAL batch, "
               "the same on every rank, and keeps this rank's rows of it. A loader keyed by (seed, step) gives every "
               "rank the same batch (docs/your_model.md); passing each rank's own rows would drop the others' data "
               "(RunOptions::check_inputs = false turns this check off)",
               full.desc(), comm::world()->rank());
}

namespace detail {

RunStatePtr make_run_state(std::shared_ptr<nn::Module> model, MeshPtr mesh, parallel::ParallelPlan plan,
                                         OptimizerSpec spec, RunOptions o, RunLossFn loss, const char* model_type) {
  TESSEL_CHECK(spec.make != nullptr, kOp, "the OptimizerSpec has no make function (use tessel::adamw(...) or sgd(...))");
  TESSEL_CHECK(o.zero >= 0 && o.zero <= 3, kOp, "RunOptions::zero must be 0 (DDP), 1, 2 or 3 (FSDP), got {}", o.zero);
  TESSEL_CHECK(o.micro_batches >= 1, kOp, "RunOptions::micro_batches must be >= 1, got {}", o.micro_batches);
  TESSEL_CHECK(o.clip >= 0, kOp, "RunOptions::clip must be >= 0 (0: no clipping), got {}", o.clip);
  if (o.lr_schedule) o.lr_schedule->validate();
  numerics::check_no_contraction(kOp);
  if (mesh) {
    const int world = comm::has_world() ? comm::world()->size() : 1;
    TESSEL_CHECK(mesh->num_devices() == world, kOp, "mesh {} has {} devices but the job has {} ranks", mesh->str(),
                 mesh->num_devices(), world);
    check_mesh_dims(*mesh, plan, model_type);
  }
  RunStatePtr s(new RunState);
  s->model = std::move(model);
  s->model_type = model_type;
  s->cp_at_start = context_parallel_attention_count();
  s->mesh = std::move(mesh);
  s->plan = std::move(plan);
  s->options = std::move(o);
  s->spec = std::move(spec);
  s->loss = std::move(loss);
  nn::Module& m = *s->model;
  const RunOptions& opts = s->options;

  if (opts.recompute != nn::Recompute::None) {
    TESSEL_CHECK(opts.zero < 3, kOp,
                 "RunOptions::recompute = {} with zero = 3: FSDP gathers parameters in module hooks that a replay "
                 "would run out of order; use zero <= 2 with recomputation",
                 nn::recompute_name(opts.recompute));
  }
  // Before the layout: pipeline stages and plans keep the same block objects.
  // (None leaves alone what the model marked itself.)
  if (opts.recompute != nn::Recompute::None) nn::apply_recompute(m, opts.recompute);
  if (opts.compile && opts.compile_modules == nn::CompileModules::None && !opts.detect_anomaly &&
      !nn::moe_layers(m).empty()) {
    // MoE routing is host work (the router's choices sort the tokens by
    // expert) that a whole-step recording refuses: the step is split around
    // it instead -- the attention layers compiled (mixed mode), the MoE
    // layers and the rest eager (docs/compile.md, "Mixed mode").
    s->options.compile = false;
    s->options.compile_modules = nn::CompileModules::Attention;
    if (!comm::has_world() || comm::world()->rank() == 0)
      spdlog::info("tessel::Run: {} has MoE layers, whose routing a whole-step recording cannot replay: compile mode "
                   "compiles its attention layers (mixed mode) and runs the MoE layers and the rest eagerly",
                   model_type);
  }
  if (opts.compile_modules != nn::CompileModules::None) {
    TESSEL_CHECK(!opts.compile || nn::moe_layers(m).empty(), kOp,
                 "RunOptions::compile_modules = {} with compile on {}, a model with MoE layers: there compile alone "
                 "is already mixed mode (its attention layers compiled, the MoE layers eager); set one of the two",
                 nn::compile_modules_name(opts.compile_modules), model_type);
    const char* with = opts.compile          ? "compile (the whole step is recorded already)"
                       : opts.detect_anomaly ? "detect_anomaly (it reads every op's output)"
                                             : nullptr;
    TESSEL_CHECK(with == nullptr, kOp, "RunOptions::compile_modules = {} with {}: not in this version",
                 nn::compile_modules_name(opts.compile_modules), with);
    TESSEL_CHECK(opts.compile_modules != nn::CompileModules::Blocks || opts.recompute != nn::Recompute::Full, kOp,
                 "RunOptions::compile_modules = blocks with recompute = full: a block is either recomputed or "
                 "compiled, not both; compile the attention layers (compile_modules = attention) or recompute "
                 "selectively (recompute = selective)");
    nn::apply_compile_modules(m, opts.compile_modules);
  }

  std::vector<Tensor> before = m.parameters();
  if (s->mesh && parallel::pipeline::has_pipeline_dim(*s->mesh)) {
    // A "pp" dim: the model's stages go to their ranks (each keeps and, on
    // Meta, initialises only what it holds); the plan lays each stage out on
    // the other dims, and the pipeline reduces its own dp gradients.
    auto staged = std::dynamic_pointer_cast<nn::StagedModel>(s->model);
    TESSEL_CHECK(staged != nullptr, kOp,
                 "mesh {} has a 'pp' dim but {} is not an nn::StagedModel: a pipeline needs the model as a chain "
                 "of stages (embed, blocks, head; nn/staged.h)",
                 s->mesh->str(), model_type);
    TESSEL_CHECK(opts.zero == 0, kOp,
                 "RunOptions::zero = {} with a 'pp' dim (mesh {}): a pipeline reduces its dp gradients itself "
                 "(DDP); ZeRO and FSDP do not combine with pipeline stages yet",
                 opts.zero, s->mesh->str());
    // The pipeline computes each micro-batch's loss on the last stage by the
    // model's stage_loss (and its blocks' aux losses): a loss function of the
    // caller's own would be ignored -- an error, not a run that silently
    // trains on another loss.
    TESSEL_CHECK(!s->loss || s->loss.target_type() == staged_loss().target_type(), kOp,
                 "mesh {} has a 'pp' dim and {} was given a loss function of its own: a pipeline computes each "
                 "micro-batch's loss on its last stage by the model's stage_loss(output, target) (plus its blocks' "
                 "aux losses), so that function would not run; put the loss in {}'s stage_loss, or use a mesh "
                 "without pp",
                 s->mesh->str(), model_type, model_type);
    parallel::pipeline::PipelineOptions po;
    po.schedule = opts.pipeline_schedule;
    po.virtual_stages = opts.virtual_stages > 0 ? opts.virtual_stages : opts.pipeline_schedule == "interleaved" ? 2 : 1;
    po.split = opts.pipeline_split;
    po.compute = opts.compute;
    s->pipe = std::make_unique<parallel::pipeline::Pipeline>(staged, s->mesh, s->plan, opts.seed, opts.micro_batches,
                                                             po);
  } else if (s->mesh) {
    parallel::parallelize(m, s->mesh, s->plan);
  }
  if (!s->pipe && any_meta(m)) {
    // Built on Meta: only this rank's pieces are created, and initialised to
    // the single-device model's values from (seed, path).
    m.materialize(kCPU);
    m.reset_parameters(opts.seed);
  }
  if (!s->pipe && s->mesh && parallel::DataParallel::applies(*s->mesh)) {
    std::vector<nn::Module*> units;
    if (!opts.fsdp_units.empty()) {
      units = matching_modules(m, opts.fsdp_units);
    } else if (auto* staged = dynamic_cast<nn::StagedModel*>(&m)) {
      for (const auto& b : staged->blocks()) units.push_back(b.get());
    }
    s->dp = std::make_unique<parallel::DataParallel>(
        m, units, parallel::DataParallelOptions{opts.zero, opts.bucket_mb});
  }
  mark_replaced(before, m);
  before.clear();
  for (const auto& [path, slot] : m.parameter_slots()) {
    s->param_paths.push_back(path);
    s->param_impls.push_back(slot->tensor->impl());
    s->param_slots.push_back(slot);
  }

  auto groups = s->spec.groups ? s->spec.groups(m) : nn::default_param_groups(m, 0.0);
  if (s->pipe) groups = held_only(std::move(groups));
  s->opt = s->spec.make(s->dp ? s->dp->optimizer_groups(std::move(groups)) : std::move(groups));
  TESSEL_CHECK(s->opt != nullptr, kOp, "the OptimizerSpec '{}' made no optimizer", s->spec.name);
  s->params = s->dp ? s->dp->parameters() : s->pipe ? s->pipe->stage().parameters() : m.parameters();

  if (opts.loss_scaling) s->scaler.emplace(*opts.loss_scaling);
  if (opts.detect_anomaly) s->anomaly.emplace(true);
  if (s->mesh && comm::has_world() && comm::world()->size() > 1) {
    // Compile mode agrees with the other ranks at every decision (a
    // collective): every rank must be in it, or none.
    // So does mixed mode (a replayed module's collectives against an eager one's).
    const int32_t modules = int32_t(opts.compile_modules);
    Tensor v = raw::empty({4}, DType::Int32);
    v.data<int32_t>()[0] = opts.compile ? 1 : 0;
    v.data<int32_t>()[1] = opts.compile ? -1 : 0;
    v.data<int32_t>()[2] = modules;
    v.data<int32_t>()[3] = -modules;
    comm::world()->all_reduce(v, comm::ReduceOp::Max)->wait();
    TESSEL_CHECK(v.data<int32_t>()[0] == -v.data<int32_t>()[1], kOp,
                 "RunOptions::compile is {} here (rank {}) but not on every rank of mesh {}: set it alike on every rank",
                 opts.compile, comm::world()->rank(), s->mesh->str());
    TESSEL_CHECK(v.data<int32_t>()[2] == -v.data<int32_t>()[3], kOp,
                 "RunOptions::compile_modules is {} here (rank {}) but not on every rank of mesh {}: set it alike on "
                 "every rank",
                 nn::compile_modules_name(opts.compile_modules), comm::world()->rank(), s->mesh->str());
  }
  if (opts.compile) {
    // What this version records (docs/compile.md): kernels and collectives
    // of forward, backward and the data-parallel gradient reduction.
    // (MoE layers made it mixed mode above.)
    TESSEL_CHECK(!opts.detect_anomaly, kOp,
                 "RunOptions::compile with anomaly detection (it reads every op's output on the host) on {}{}: compile "
                 "mode does not record it in this version; run eagerly (compile = false)",
                 model_type, s->mesh ? " (mesh " + s->mesh->str() + ")" : std::string());
    s->compiled.stats.enabled = true;
  }
  if (!opts.trace.empty()) {
    TESSEL_CHECK(opts.trace_steps >= 0, kOp, "RunOptions::trace_steps must be >= 0 (0: until write_trace), got {}",
                 opts.trace_steps);
    if ((opts.compile || opts.compile_modules != nn::CompileModules::None) && opts.trace_steps > 0 &&
        opts.trace_steps <= 3 && (!comm::has_world() || comm::world()->rank() == 0))
      spdlog::info("tessel::Run: the timeline covers {} step(s), and compile mode replays from step 4: it will show "
                   "eager steps only (trace_steps = 6, --trace-steps 6, shows replays too)",
                   opts.trace_steps);
    const bool world = comm::has_world() && comm::world()->size() > 1;
    detail::prepare_trace_file(opts.trace, world ? comm::world()->rank() : 0, world ? comm::world()->size() : 1);
    s->trace = std::make_unique<timeline::Recorder>(world ? comm::world()->rank() : 0);
    if (s->mesh) s->trace->set_memory_device(s->mesh->device());
    if (world) comm::world()->barrier();  // one origin for every rank's clock
    s->trace->set_origin_now();
    s->trace_scope.emplace(s->trace.get());
  }
  s->caller_context = nn::forward_context();
  s->set_step_context();
  RunState* raw_state = s.get();
  if (!s->pipe) s->observer = autograd::add_backward_observer([raw_state] { raw_state->on_backward(); });
  return s;
}

RunLossFn staged_loss() {
  return [](nn::Module& m, const Tensor& x, const Tensor& y) {
    auto& staged = static_cast<nn::StagedModel&>(m);
    return staged.loss(staged.forward(x), y);
  };
}
bool is_staged(const nn::Module& m) { return dynamic_cast<const nn::StagedModel*>(&m) != nullptr; }

}  // namespace detail

void RunStateDeleter::operator()(RunState* s) const { delete s; }

// ---- RunBase -----------------------------------------------------------------------------------
RunBase::RunBase(RunStatePtr state) : state_(std::move(state)) {}
RunBase::RunBase(RunBase&&) noexcept = default;
RunBase& RunBase::operator=(RunBase&&) noexcept = default;
RunBase::~RunBase() = default;

int64_t RunBase::step() const { return state_->step; }
const MeshPtr& RunBase::mesh() const { return state_->mesh; }
const parallel::ParallelPlan& RunBase::plan() const { return state_->plan; }
const RunOptions& RunBase::options() const { return state_->options; }
nn::Module& RunBase::module() const { return *state_->model; }
nn::Optimizer& RunBase::optimizer() const { return *state_->opt; }
parallel::DataParallel* RunBase::data_parallel() const { return state_->dp.get(); }
parallel::pipeline::Pipeline* RunBase::pipeline() const { return state_->pipe.get(); }

// What both input() overloads check: a plain tensor, the same on every rank.
void RunState::accept_input(const Tensor& full) {
  TESSEL_CHECK(full.defined(), kRun, "input: the tensor is undefined");
  TESSEL_CHECK(!full.is_distributed(), kRun, "input: {} is distributed already; pass the plain global batch",
               full.desc());
  ++inputs;
  if (mesh) check_same_on_every_rank(full);
}

Tensor RunBase::input(const Tensor& full) const {
  RunState& s = *state_;
  s.accept_input(full);
  if (!s.mesh) return full;
  if (s.pipe) return s.pipe->layout(full);
  return parallel::distribute_batch(full, s.mesh, s.plan);
}

Tensor RunBase::input(const Tensor& full, const parallel::DimLayout& layout) const {
  RunState& s = *state_;
  s.accept_input(full);
  if (!s.mesh) return full;
  for (const auto& [name, p] : layout.dims)
    TESSEL_CHECK(has_dim(*s.mesh, name), kRun, "input: layout {} names dim '{}' that mesh {} lacks", layout.str(),
                 name, s.mesh->str());
  return distribute_tensor(full, s.mesh, layout.on(*s.mesh, Placements::replicated(s.mesh->ndim())));
}

nn::ForwardContext RunBase::forward_context(int64_t first_sample, int64_t global_batch) const {
  return {state_->options.seed, uint64_t(state_->step), first_sample, global_batch};
}

namespace {

// A "cp" mesh dim cuts the sequences along time so that attention works on
// a piece of the queries (docs/parallel.md "Context parallelism"). After the
// first step's forwards, before its update: a run whose attention gathered
// the whole sequence, or that has no attention at all, did not get what the
// mesh asks for -- an error, not a silently slower (or pointless) run.
int context_parallel_dim(const RunState& s) {
  if (!s.mesh) return -1;
  for (int d = 0; d < s.mesh->ndim(); ++d)
    if (s.mesh->name(d) == "cp" && s.mesh->size(d) > 1) return d;
  return -1;
}

void check_context_parallel(const RunState& s) {
  const int cp = context_parallel_dim(s);
  if (cp < 0) return;
  const ContextParallelAttentionCount now = context_parallel_attention_count();
  const int64_t local = now.local - s.cp_at_start.local, gathered = now.gathered - s.cp_at_start.gathered,
                whole = now.whole - s.cp_at_start.whole;
  const int v = numerics::reduction_chunks();
  TESSEL_CHECK(local + gathered + whole > 0, kRun,
               "mesh {}: the cp dim (size {}) cuts each sequence along time for context-parallel attention, but {}'s "
               "first step ran no attention on distributed inputs: the model has no attention (use dp), or it does "
               "not run on the inputs the Run laid out",
               s.mesh->str(), s.mesh->size(cp), s.model_type);
  // The step never called run.input(): every rank holds whole sequences.
  TESSEL_CHECK(s.inputs > 0 || local > 0, kRun,
               "mesh {}: {}'s first step ran without run.input(): every cp rank computed the whole sequences (the "
               "result would be right, but context parallelism would save nothing); lay the inputs out with "
               "run.input(batch), or use run.forward_backward(inputs, targets)",
               s.mesh->str(), s.model_type);
  if (numerics::bitwise() && gathered == 0 && local == 0) {
    // Bitwise mode keeps a weight gradient's sum over a micro-batch's tokens
    // in the one-device order, which pieces cut along time (inside each
    // sequence) are not whole subtrees of: the linear layers gather time.
    if (s.mesh->my_rank() == 0)
      spdlog::warn(
          "tessel::Run: mesh {}: bitwise mode gathered the sequences before attention in {} of {}'s attention "
          "calls: weight gradients are summed over a micro-batch's tokens in the one-device order ({} canonical "
          "chunks), and each rank's piece must be a consecutive run of whole chunks -- which pieces of several "
          "sequences per rank, a cp dim before dp in the mesh, or a sequence length that is not "
          "a multiple of {} (with cp dividing {}) are not. cp gives the one-device bits but divides no work; one "
          "sequence per micro-batch and dp rank, dp before cp and such a length, or fast mode, keep each rank's "
          "piece (docs/parallel.md \"Context parallelism\")",
          s.mesh->str(), whole, s.model_type, v, v, v);
    return;
  }
  TESSEL_CHECK(gathered == 0 && whole == 0, kRun,
               "mesh {}: context parallelism over cp={}: {} of {}'s {} attention call(s) in the first step ran on "
               "the whole sequence on every rank (only causal attention without an explicit mask, by the fused CPU "
               "kernel, keeps the queries local -- and in bitwise mode only when each rank's piece is a whole run of "
               "the {} canonical chunks: a sequence length that is a multiple of {} with cp dividing {}). The result "
               "would be right but would save nothing",
               s.mesh->str(), s.mesh->size(cp), gathered + whole, s.model_type, local + gathered + whole, v, v, v);
}

}  // namespace

StepReport RunBase::step_optimizer() {
  RunState& s = *state_;
  // The trace's steps count from the first one taken (after a checkpoint's load, not from 0).
  if (s.trace_scope && s.trace_first_step < 0) s.trace_first_step = s.step;
  TESSEL_CHECK(s.micro == s.options.micro_batches, kRun,
               "step_optimizer after {} backward pass(es) in step {} of {}, but micro_batches = {}{}", s.micro,
               s.step + 1, s.model_type, s.options.micro_batches,
               s.micro == 0 ? " (no backward since the last step on the thread that called parallelize)" : "");
  s.check_parameters_unchanged();
  // A step whose backward ran in a loop of the caller's own ran eagerly.
  if (s.options.compile && !s.compiled.forward_backward_this_step) ++s.compiled.stats.eager_steps;
  if (s.options.compile && !s.compiled.forward_backward_this_step && !s.compiled.warned_own_loop) {
    s.compiled.warned_own_loop = true;
    const std::string why = fmt::format(
        FMT_STRING("RunOptions::compile records the steps of run.forward_backward(inputs, targets); step {} of {} ran "
                   "its backward in a loop of its own, which runs eagerly (docs/compile.md)"),
        s.step + 1, s.model_type);
    if (s.compiled.stats.refused.empty()) s.compiled.stats.refused = why;  // compile_stats() says so too
    if (!s.mesh || s.mesh->my_rank() == 0) spdlog::warn("tessel::Run: {}", why);
  }
  s.compiled.forward_backward_this_step = false;
  if (!s.cp_checked) {
    s.cp_checked = true;
    check_context_parallel(s);
  }
  if (!s.parameters_checked) {
    // Before the first update (not at parallelize: parallelize, then load a
    // checkpoint, is how a run resumes): this rank's pieces.
    s.parameters_checked = true;
    check_parameters_set(*s.model, s.model_type.c_str());
  }
  if (s.dp && s.inputs == 0 && !s.warned_no_input && s.mesh->my_rank() == 0) {
    spdlog::warn(
        "tessel::Run: step {} of {} ran on mesh {} without run.input(): every data-parallel rank computed the whole "
        "batch (the result is right, but data parallelism saves nothing); lay inputs out with run.input(batch)",
        s.step + 1, s.model_type, s.mesh->str());
    s.warned_no_input = true;
  }
  if (s.dp && !std::exchange(s.dp_finished, false)) {  // (compile mode finished it in forward_backward)
    profile::Timer timer("dp.finish", nullptr, "step");
    s.dp->finish();
  }
  StepReport r;
  if (s.scaler) {
    // Unscale first: the norm, the clipping and the update see the true
    // gradients. The inf/NaN flag is combined over the mesh, so every rank
    // skips or steps alike.
    profile::Timer timer("loss_scaling.unscale", nullptr, "step");
    r.loss_scale = s.scaler->get_scale();
    if (s.pipe) s.pipe->finish_gradients();  // tied gradients complete before they are unscaled
    s.scaler->unscale_(*s.opt);
    // unscale_ combined the flag over the gradients' mesh; a pipeline stage's
    // gradients live on its stage's sub-mesh, so the stages agree here.
    if (s.pipe) s.scaler->combine_found_inf(*s.mesh);
    r.skipped = s.scaler->found_inf();
  }
  {
    profile::Timer timer("clip_grad_norm", nullptr, "step");
    r.grad_norm = s.pipe                             ? s.pipe->clip_grad_norm_(s.options.clip)
                  : s.options.clip > 0 && !r.skipped ? nn::clip_grad_norm_(s.params, s.options.clip)
                                                     : nn::grad_norm(s.params);
  }
  if (!r.skipped && s.options.stop_on_nonfinite && !std::isfinite(r.grad_norm)) {
    // The norm is global, so every rank stops here alike, before the update.
    const std::optional<double> loss = std::exchange(s.last_loss, std::nullopt);
    TESSEL_FAIL(kRun,
                "step {} of {}: the global gradient norm is {}{}; stopped before the update, so the parameters and "
                "optimizer state are those after step {} (and the newest checkpoint is intact). To find the op that "
                "produced it, rerun from the last checkpoint with --detect-anomaly (RunOptions::detect_anomaly); "
                "RunOptions::stop_on_nonfinite = false trains on",
                s.step + 1, s.model_type, r.grad_norm,
                loss ? TESSEL_FORMAT(" (the step's loss was {})", *loss) : std::string(), s.step);
  }
  s.last_loss.reset();
  if (s.options.lr_schedule) s.opt->set_lr(s.options.lr_schedule->lr(s.step));
  r.lr = s.opt->lr();
  {
    profile::Timer timer("optimizer.step", nullptr, "optimizer");
    if (!r.skipped) s.opt->step();  // a skipped step leaves parameters and optimizer state as they were
    if (s.dp) s.dp->after_step();
    s.opt->zero_grad();
  }
  if (s.scaler) s.scaler->update();
  if (s.compiled.program) {
    // The replayed step's losses and gradients are used (zero_grad dropped
    // the parameters' views): the arena goes back to the allocator until
    // the next replay, as eager's step buffers are freed by now -- unless
    // the caller still holds a view of it (a gradient kept), which keeps it.
    s.compiled.losses.clear();
    s.compiled.grads.clear();
    s.compiled.tied.clear();
    s.compiled.program->release_unheld();
  }
  s.scaled = 0;
  ++s.step;
  s.micro = 0;
  s.inputs = 0;
  s.set_step_context();
  r.step = s.step;
  if (s.trace_scope) {
    const int64_t t = s.trace->now_ns();
    s.trace->span(fmt::format(FMT_STRING("step {}"), s.step), "step", s.trace_step_start_ns, t,
                  fmt::format(FMT_STRING("\"step\":{}"), s.step));
    s.trace_step_start_ns = t;
    if (s.options.trace_steps > 0 && s.step - s.trace_first_step >= s.options.trace_steps) s.finish_trace(true);
  }
  return r;
}

std::string RunBase::write_trace() { return state_->finish_trace(/*merge=*/true); }

Tensor RunBase::scale_loss(const Tensor& loss) {
  RunState& s = *state_;
  if (!s.scaler) return loss;
  TESSEL_CHECK(loss.dtype() != DType::Float16, kRun,
               "scale_loss: the loss {} is float16, so loss x {} overflows float16 (max 65504) and the scale would be "
               "set by the loss, not by the gradients; compute the loss in float32, e.g. "
               "cross_entropy(nn::cast_up(logits), targets)",
               loss.desc(), s.scaler->get_scale());
  ++s.scaled;
  return s.scaler->scale(loss);
}

double RunBase::loss_scale() const { return state_->scaler ? state_->scaler->get_scale() : 1.0; }

// ---- forward_backward, eager and compiled ------------------------------------------------------
namespace {

// The micro-batches' forwards and backwards; the losses' sum in out.loss_sum.
// Under a capture (compile mode), the losses are marked as outputs (read
// again after each replay) and their reads are not recorded.
StepLoss eager_forward_backward(RunBase& run, const Tensor& inputs, const Tensor& targets,
                                std::vector<Tensor>* losses) {
  RunState& s = run.state();
  const int64_t batch = inputs.size(0), m = s.options.micro_batches;
  StepLoss out;
  const bool moe = !nn::moe_layers(*s.model).empty();
  int64_t dropped = 0;
  for (int64_t k = 0; k < m; ++k) {
    const train::SampleRange r = train::split_range(batch, m, k);
    nn::ForwardScope scope(run.forward_context(r.begin, batch));
    std::optional<nn::AutocastScope> autocast;
    if (s.options.compute != DType::Float32) autocast.emplace(s.options.compute);
    Tensor x = run.input(m == 1 ? inputs : inputs.narrow(0, r.begin, r.size()));
    Tensor y = run.input(m == 1 ? targets : targets.narrow(0, r.begin, r.size()));
    Tensor loss = s.loss(*s.model, x, y);
    {
      profile::Timer timer("loss.item", nullptr, "step");
      capture::Recorder::Unrecorded value_only(capture::active());  // a value for the log, read again after a replay
      out.loss_sum += loss.item<double>();
    }
    if (losses) losses->push_back(loss.detach());  // (not its graph: the micro-batch's activations go at its backward)
    if (moe) dropped += nn::dropped_tokens(*s.model);
    run.scale_loss(m == 1 ? loss : loss / double(m)).backward();
  }
  if (moe) out.moe_dropped_tokens = dropped;
  if (s.options.compile && s.dp) {
    // Compile mode finishes the data-parallel reduction here, inside the
    // step it records (step_optimizer would otherwise): the same work,
    // earlier, so that a replay leaves the reduced gradients.
    profile::Timer timer("dp.finish", nullptr, "step");
    s.dp->finish();
    s.dp_finished = true;
  }
  return out;
}

// A pipeline's step result as forward_backward reports it.
StepLoss pipeline_loss(const parallel::pipeline::PipelineStepResult& r) {
  StepLoss out;
  out.loss = r.loss;
  out.loss_sum = r.loss_sum;
  out.aux_loss = r.aux_loss;
  out.comm_wait_s = r.comm_wait_s;
  out.comm_wait_mean_s = r.comm_wait_mean_s;
  out.moe_dropped_tokens = r.moe_dropped_tokens;
  return out;
}

// The pipeline's step: its schedule runs every micro-batch's forward and
// backward on this rank's stage. Under a capture (compile mode), the last
// stage's micro-batch losses go to `losses` (read again after a replay).
StepLoss eager_pipeline_step(RunBase& run, const Tensor& inputs, const Tensor& targets, std::vector<Tensor>* losses) {
  RunState& s = run.state();
  const int64_t batch = inputs.size(0), m = s.options.micro_batches;
  std::vector<parallel::pipeline::MicroBatch> mbs;
  for (int64_t k = 0; k < m; ++k) {
    const train::SampleRange r = train::split_range(batch, m, k);
    mbs.push_back({m == 1 ? inputs : inputs.narrow(0, r.begin, r.size()),
                   m == 1 ? targets : targets.narrow(0, r.begin, r.size()), r.begin});
  }
  if (s.scaler) s.pipe->set_loss_scale(s.scaler->get_scale());
  const auto r = s.pipe->train_step(s.options.seed, uint64_t(s.step), batch, mbs);
  if (losses) *losses = r.stage_losses;
  s.micro = m;  // the schedule ran every micro-batch's backward
  return pipeline_loss(r);
}

// The step as eager mode runs it: the pipeline's schedule, or the micro-batch loop.
StepLoss eager_step(RunBase& run, const Tensor& inputs, const Tensor& targets, std::vector<Tensor>* losses) {
  return run.state().pipe ? eager_pipeline_step(run, inputs, targets, losses)
                          : eager_forward_backward(run, inputs, targets, losses);
}

// Compile mode (RunOptions::compile): step 1 eager; steps 2 and 3 eager
// under a capture::Recorder; if their recordings agree, later steps replay
// the second. What a replay leaves behind is what the eager step leaves:
// the gradients (the recorded tensors, installed again on their
// parameters) and the losses' values. The guard before each replay: the
// same input shapes and dtypes, the same parameter tensors.
//
// On a mesh every rank records and replays its own program; the programs
// issue the collectives eager issued, in the same order. Each decision
// (use a recording, replay this step, stop) is agreed by all ranks first
// (agree), so that no rank replays while another runs eagerly.
// `reporter`: this rank prints the warning (one rank per reason: the
// lowest that had one of its own).
void stop_compiling(RunState& s, const std::string& why, bool reporter) {
  RunState::Compiled& c = s.compiled;
  c.stats.refused = why;
  c.stats.replaying = false;
  c.previous.reset();
  c.program.reset();
  c.grads.clear();
  c.tied.clear();
  c.losses.clear();
  c.output_layouts.clear();
  if (reporter)
    spdlog::warn("tessel::Run: compile mode stopped; {} runs eagerly from step {} on (the same results, without "
                 "the replay's speed): {}",
                 s.model_type, s.step + 1, why);
}

// The lowest world rank where `ok` is false, or -1 if it holds on every
// rank of the job (one all-reduce; none on one device).
int first_failing_rank(const RunState& s, bool ok) {
  if (!s.mesh || !comm::has_world() || comm::world()->size() == 1) return ok ? -1 : 0;
  constexpr int32_t kNone = std::numeric_limits<int32_t>::max();
  Tensor v = raw::empty({1}, DType::Int32);
  v.data<int32_t>()[0] = ok ? kNone : int32_t(comm::world()->rank());
  comm::world()->all_reduce(v, comm::ReduceOp::Min)->wait();
  const int32_t r = v.data<int32_t>()[0];
  return r == kNone ? -1 : int(r);
}
bool agree(const RunState& s, bool ok) { return first_failing_rank(s, ok) < 0; }
int world_rank() { return comm::has_world() ? comm::world()->rank() : 0; }

// What the step depends on that no tensor carries and a replay would not
// see: each module's train()/eval() (dropout), each parameter's
// requires_grad (frozen parameters get no gradient), and which tensor each
// registered buffer is.
std::vector<char> module_state(const RunState& s) {
  std::vector<char> v;
  for (const auto& [path, m] : s.model->named_modules()) v.push_back(char(m->is_training()));
  for (const Tensor& p : s.model->parameters()) v.push_back(char(p.requires_grad()));
  // Each registered buffer's storage: one assigned anew is seen even while
  // the old one lives on elsewhere (Program::replaced_outside sees the rest).
  s.model->for_each_buffer_slot([&](const nn::BufferSlot& slot) {
    const StorageImpl* st = slot.storage();
    const char* bytes = reinterpret_cast<const char*>(&st);
    v.insert(v.end(), bytes, bytes + sizeof st);
  });
  return v;
}

// Loss scaling: the scale the recorded loss was multiplied by (a kernel's
// argument). It grows after clean steps and backs off after an overflow; a
// replay at another scale would scale the gradients by the old one and
// unscale them by the new one, so a new scale records again. 0: no scaling.
double loss_scale_of(const RunState& s) { return s.scaler ? s.scaler->get_scale() : 0.0; }

bool same_parameters(const RunState& s) {
  const RunState::Compiled& c = s.compiled;
  if (c.param_storages.size() != s.params.size()) return false;
  for (size_t i = 0; i < s.params.size(); ++i)
    if (s.params[i].storage().get() != c.param_storages[i]) return false;
  return true;
}

// What changed since the step was recorded that a replay would not see
// ("" if nothing): the guard before every replay (docs/compile.md, "Guards").
std::string changed_since_recording(RunState& s, const Tensor& inputs, const Tensor& targets) {
  RunState::Compiled& c = s.compiled;
  if (std::exchange(c.record_again, false)) return "run.record_again() was called";
  if (inputs.shape() != c.input_shape || targets.shape() != c.target_shape || inputs.dtype() != c.input_dtype ||
      targets.dtype() != c.target_dtype)
    return fmt::format(FMT_STRING("the inputs and targets are {} {} and {} {}; the recording took {} {} and {} {}"),
                       dtype_name(inputs.dtype()), inputs.shape().str(), dtype_name(targets.dtype()),
                       targets.shape().str(), dtype_name(c.input_dtype), c.input_shape.str(),
                       dtype_name(c.target_dtype), c.target_shape.str());
  if (!same_parameters(s)) return "a parameter's memory was replaced (a load)";
  if (!(numerics::current_settings() == c.numerics)) return "the numerics settings (bitwise mode, V, GEMM mode) changed";
  if (module_state(s) != c.module_state)
    return "a module's train()/eval(), a parameter's requires_grad or a registered buffer's tensor changed";
  if (loss_scale_of(s) != c.loss_scale)
    return fmt::format(FMT_STRING("the loss scale is {}; the recording multiplied by {}"), loss_scale_of(s),
                       c.loss_scale);
  if (nn::autocast_dtype() != c.autocast) {
    auto name = [](const std::optional<DType>& d) { return d ? std::string(dtype_name(*d)) : std::string("none"); };
    return fmt::format(FMT_STRING("the autocast around forward_backward is {}; the recording ran under {}"),
                       name(nn::autocast_dtype()), name(c.autocast));
  }
  const capture::Program& p = c.program ? *c.program : *c.previous;
  return p.replaced_outside();
}

// Where the recorded `t` (a loss or a gradient) lies in buffer `buffer`.
RunState::Compiled::OutputLayout output_layout(int buffer, const Tensor& t, int param) {
  RunState::Compiled::OutputLayout o;
  o.where = capture::layout_of(buffer, t);
  o.param = param;
  return o;
}

// The losses and gradients a replay leaves: views of the program's buffers
// (the arena's, made by the first replay), distributed where eager's were.
void make_output_views(RunState& s) {
  RunState::Compiled& c = s.compiled;
  c.losses.clear();
  c.grads.clear();
  c.tied.clear();
  if (s.pipe) c.tied.resize(s.params.size());
  for (const RunState::Compiled::OutputLayout& o : c.output_layouts) {
    const Tensor t = c.program->output(o.where);
    if (o.param < 0) c.losses.push_back(t);
    else if (o.contribution >= 0) c.tied[size_t(o.param)].push_back(t);  // (in micro-batch order)
    else c.grads.emplace_back(s.params[size_t(o.param)], t);
  }
}

StepLoss compiled_forward_backward(RunBase& run, const Tensor& inputs, const Tensor& targets) {
  RunState& s = run.state();
  RunState::Compiled& c = s.compiled;
  if (!c.stats.refused.empty() || !c.warmed_up) {
    // Step 1 creates what later steps reuse (caches, lazily built buffers):
    // recordings start at step 2.
    c.warmed_up = true;
    ++c.stats.eager_steps;
    return eager_step(run, inputs, targets, nullptr);
  }
  if (c.program || c.previous) {
    const std::string changed = changed_since_recording(s, inputs, targets);
    if (!agree(s, changed.empty())) {  // record again for the new shapes (or the parameters a load replaced)
      if (!s.mesh || s.mesh->my_rank() == 0)
        spdlog::info("tessel::Run: compile mode records {}'s step again at step {}: {}", s.model_type, s.step + 1,
                     changed.empty() ? std::string("another rank's step changed") : changed);
      ++c.stats.recaptures;
      c.previous.reset();
      c.program.reset();
      c.output_layouts.clear();
      c.stats.replaying = false;
    }
  }
  if (c.program) {
    // What run.input does eagerly: the batch must be the same on every rank.
    if (s.mesh && !s.pipe) {  // (a pipeline's eager step does not check it either)
      s.accept_input(inputs);
      s.accept_input(targets);
    }
    profile::Timer timer("compile.replay", nullptr, "step");
    // The replay reads the batch where it is (no copy; eager reads it there too).
    c.program->bind_input(0, inputs.contiguous());
    c.program->bind_input(1, targets.contiguous());
    try {
      nn::ForwardScope scope(run.forward_context(0, inputs.size(0)));  // the keys' producers read it
      c.program->replay();
      make_output_views(s);  // (dropped after step_optimizer, so the arena can go back between steps)
    } catch (const capture::ReplayDiverged& e) {
      // Nothing after the check ran, and the parameters are untouched: the
      // step runs eagerly instead (every rank read the same values, so every
      // rank is here).
      stop_compiling(s, e.what(), !s.mesh || s.mesh->my_rank() == 0);
      ++c.stats.eager_steps;
      return eager_step(run, inputs, targets, nullptr);
    }
    for (const auto& [param, grad] : c.grads) param.set_grad(grad);
    if (s.pipe) s.pipe->stage().set_tied_contributions(c.tied);  // (bitwise mode; empty lists otherwise)
    StepLoss out;
    if (s.pipe) out = pipeline_loss(s.pipe->replayed_step(c.losses, s.options.micro_batches));  // (over pp)
    else
      for (const Tensor& loss : c.losses) out.loss_sum += loss.item<double>();
    s.micro = s.options.micro_batches;
    s.dp_finished = s.dp != nullptr;
    ++c.stats.replays;
    return out;
  }

  // Record this step while running it eagerly.
  // The program's input buffers: on the CPU the batch itself when each of
  // its tensors is a whole storage of its own (the replays bind theirs in
  // its place: Program::bind_input), else a copy (made before the
  // recording: an input, not a temporary of the step; on a GPU the replays
  // copy the batch into it).
  Tensor x, y;
  {
    NoGradGuard no_grad;
    auto whole = [](const Tensor& t) {
      return t.is_contiguous() && t.offset() == 0 && t.storage() && t.nbytes() == int64_t(t.storage()->nbytes());
    };
    const bool own = inputs.device().is_cpu() && whole(inputs) && whole(targets) &&
                     inputs.storage() != targets.storage();
    x = own ? inputs : inputs.clone();
    y = own ? targets : targets.clone();
  }
  std::vector<Tensor> losses;
  std::vector<std::vector<Tensor>> tied;
  std::unique_ptr<capture::Program> program;
  std::vector<int> outputs;
  StepLoss out;
  std::string refused;
  {
    capture::Recorder rec(fmt::format(FMT_STRING("{}'s forward_backward at step {}"), s.model_type, s.step + 1));
    rec.fuse_elementwise = s.options.compile_fusion;
    rec.input(x);
    rec.input(y);
    out = eager_step(run, x, y, &losses);
    for (const Tensor& loss : losses) outputs.push_back(rec.output(raw::local_of(loss)));
    for (const Tensor& p : s.params) {
      Tensor g = p.grad();
      outputs.push_back(g.defined() ? rec.output(raw::local_of(g)) : -1);
    }
    // A pipeline in bitwise mode keeps the tied gradients per micro-batch
    // (PipelineStage::tied_contributions) for step_optimizer to sum.
    if (s.pipe) tied = s.pipe->stage().tied_contributions();
    for (const std::vector<Tensor>& list : tied)
      for (const Tensor& t : list) outputs.push_back(rec.output(raw::local_of(t)));
    try {
      // The first of two recordings is only compared with the second: it
      // holds no memory (the step's peak stays eager's).
      program = rec.finish(c.previous ? capture::Recorder::Use::Replay : capture::Recorder::Use::CompareOnly);
    } catch (const capture::NotCapturable& e) {
      refused = e.what();
    }
  }
  ++c.stats.eager_steps;
  if (const int failed = first_failing_rank(s, refused.empty()); failed >= 0) {
    stop_compiling(s,
                   refused.empty() ? fmt::format(FMT_STRING("rank {}'s recording was refused (its warning says why)"), failed)
                                   : refused,
                   failed == world_rank());
    return out;
  }
  ++c.stats.captures;
  if (!c.previous) {
    c.previous = std::move(program);
    c.prev_outputs = std::move(outputs);
    c.input_shape = inputs.shape();
    c.target_shape = targets.shape();
    c.input_dtype = inputs.dtype();
    c.target_dtype = targets.dtype();
    c.numerics = numerics::current_settings();
    c.param_storages.clear();
    for (const Tensor& p : s.params) c.param_storages.push_back(p.storage().get());
    c.module_state = module_state(s);
    c.loss_scale = loss_scale_of(s);
    c.autocast = nn::autocast_dtype();
    return out;
  }
  std::string diff = c.previous->difference(*program);
  if (diff.empty() && outputs != c.prev_outputs)
    diff = "the losses or gradients came out in other buffers (another control flow)";
  if (const int failed = first_failing_rank(s, diff.empty()); failed >= 0) {
    stop_compiling(s,
                   diff.empty() ? fmt::format(FMT_STRING("rank {}'s two recordings differ (its warning says how)"), failed)
                                : fmt::format(FMT_STRING("steps {} and {} recorded differently: {}"), s.step, s.step + 1, diff),
                   failed == world_rank());
    return out;
  }
  c.previous.reset();
  c.program = std::move(program);
  c.program->use_graphs(s.options.compile_graphs);  // (a GPU's kernels; nothing on the CPU)
  // Where the losses and gradients lie: the first replay makes views of
  // them (the arena does not exist before; this step's eager tensors are
  // the ones step_optimizer uses now).
  c.losses.clear();
  c.grads.clear();
  c.tied.clear();
  c.output_layouts.clear();
  for (size_t i = 0; i < losses.size(); ++i) c.output_layouts.push_back(output_layout(outputs[i], losses[i], -1));
  for (size_t i = 0; i < s.params.size(); ++i) {
    const int id = outputs[losses.size() + i];
    if (id >= 0) c.output_layouts.push_back(output_layout(id, s.params[i].grad(), int(i)));
  }
  size_t next = losses.size() + s.params.size();
  for (size_t i = 0; i < tied.size(); ++i)
    for (size_t k = 0; k < tied[i].size(); ++k) {
      c.output_layouts.push_back(output_layout(outputs[next++], tied[i][k], int(i)));
      c.output_layouts.back().contribution = int(k);
    }
  c.stats.replaying = true;
  c.stats.launches = c.program->launches();
  c.stats.buffer_bytes = c.program->bytes();
  c.stats.fused_chains = c.program->fused_chains();
  c.stats.fused_launches = c.program->fused_launches();
  return out;
}

}  // namespace

StepLoss RunBase::forward_backward(const Tensor& inputs, const Tensor& targets) {
  RunState& s = *state_;
  TESSEL_CHECK(inputs.defined() && targets.defined() && inputs.dim() >= 1 && targets.dim() >= 1, kRun,
               "forward_backward needs inputs and targets with a batch dim, got {} and {}", inputs.desc(),
               targets.desc());
  const int64_t batch = inputs.size(0), m = s.options.micro_batches;
  TESSEL_CHECK(targets.size(0) == batch, kRun, "forward_backward: inputs {} and targets {} differ in batch size",
               inputs.desc(), targets.desc());
  TESSEL_CHECK(batch >= m, kRun, "forward_backward: a batch of {} rows cannot fill micro_batches = {}", batch, m);
  TESSEL_CHECK(s.loss != nullptr, kRun,
               "forward_backward needs a loss: {} is not an nn::StagedModel and has no loss(inputs, targets); pass "
               "one to tessel::parallelize (RunLossFn)",
               s.model_type);
  TESSEL_CHECK(s.micro == 0, kRun, "forward_backward: {} backward pass(es) already ran in step {}", s.micro,
               s.step + 1);
  s.check_parameters_unchanged();
  StepLoss out;
  s.compiled.forward_backward_this_step = true;
  if (s.options.compile) out = compiled_forward_backward(*this, inputs, targets);
  else out = eager_step(*this, inputs, targets, nullptr);
  out.loss = out.loss_sum / double(m);
  s.last_loss = out.loss;
  return out;
}

CompileStats RunBase::compile_stats() const {
  CompileStats c = state_->compiled.stats;
  if (const capture::Program* p = state_->compiled.program.get()) {
    c.held_bytes = p->held_bytes();  // (now)
    const capture::Program::GraphStats g = p->graph_stats();
    c.graphs = g.graphs;
    c.graph_launches = g.graph_launches;
    c.graph_captures = g.captures;
    c.graph_refused = g.refused;
    c.graph_refusal = g.last_refusal;
  }
  c.modules = nn::compiled_module_stats(*state_->model);
  return c;
}

void RunBase::record_again() {
  state_->compiled.record_again = true;
  nn::record_modules_again(*state_->model);  // mixed mode's compiled modules too
}

Tensor RunBase::forward(const Tensor& inputs) {
  RunState& s = *state_;
  NoGradGuard ng;
  if (s.pipe) return s.pipe->forward(input(inputs));
  auto* staged = dynamic_cast<nn::StagedModel*>(s.model.get());
  TESSEL_CHECK(staged != nullptr, kRun,
               "forward needs an nn::StagedModel (embed, blocks, head); {} is not one: call its own methods on "
               "run.input(...) instead",
               s.model_type);
  // Context parallelism cuts sequences along time for training. Decoding
  // appends one position at a time to a KV cache, and a sampled prefix need
  // not divide by cp: those inputs are replicated over cp instead (every cp
  // rank computes the whole sequence; the same result).
  const int cp = context_parallel_dim(s);
  if (cp >= 0 && (nn::current_kv_cache() != nullptr || inputs.dim() < 2 || inputs.size(1) % s.mesh->size(cp) != 0)) {
    s.accept_input(inputs);
    Placements p = s.plan.data.on(*s.mesh, Placements::replicated(s.mesh->ndim()));
    p[cp] = Replicate();
    return staged->forward(distribute_tensor(inputs, s.mesh, p));
  }
  return staged->forward(input(inputs));
}

std::vector<std::pair<std::string, Tensor>> RunBase::full_parameters() const {
  const RunState& s = *state_;
  if (s.pipe) return s.pipe->gather_parameters();
  NoGradGuard ng;
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [name, t] : s.model->named_parameters()) out.emplace_back(name, full_tensor(t.detach()));
  return out;
}

std::string RunBase::param_hash() const {
  const RunState& s = *state_;
  if (s.pipe) return train::param_hash(s.pipe->gather_parameters());
  return train::param_hash(s.model->named_parameters());
}

std::string RunBase::describe() const {
  const RunState& s = *state_;
  if (!s.mesh) return "one device";
  std::string d = fmt::format(FMT_STRING("mesh {} ({} backend), plan {}"), s.mesh->str(),
                              comm::has_world() ? comm::world()->backend() : "no", s.plan.name);
  if (s.dp) d += ", " + s.dp->describe();
  return d;
}

parallel::DataParallelMemory RunBase::memory() const {
  const RunState& s = *state_;
  if (s.dp) return s.dp->memory(*s.opt);
  parallel::DataParallelMemory mem;
  mem.params = mem.grads = s.pipe ? s.pipe->local_parameter_bytes() : parallel::local_parameter_bytes(*s.model);
  mem.optimizer = s.opt->state_bytes();
  return mem;
}

}  // namespace tessel
