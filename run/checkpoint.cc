#include "run/checkpoint.h"

#include <map>
#include <set>

#include "autograd/api.h"
#include "checkpoint/load.h"
#include "checkpoint/manager.h"
#include "checkpoint/save.h"
#include "dtensor/ops.h"
#include "run/run_state.h"
#include "runtime/comm/comm.h"

namespace tessel {
namespace {

constexpr const char* kOp = "checkpoint";
constexpr const char* kModel = "model.";
constexpr const char* kOptim = "optim.";
const std::set<std::string> kReserved = {"step",       "rng",         "optimizer", "mesh", "model_type",
                                         "lr_schedule", "loss_scaling"};

// A pipeline stage's model holds the other stages' parameters as Meta
// tensors: each rank saves and loads what it holds; the checkpoint's plan
// takes every tensor from the ranks holding it.
bool held(const Tensor& t) { return t.defined() && !t.device().is_meta(); }

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

nlohmann::json schedule_json(const nn::LrSchedule& s) {
  return {{"kind", nn::schedule_name(s.kind)},
          {"max_lr", s.max_lr},
          {"min_lr", s.min_lr},
          {"warmup_steps", s.warmup_steps},
          {"total_steps", s.total_steps}};
}

int world_rank() { return comm::has_world() ? comm::world()->rank() : 0; }

void save_run(const std::string& dir, RunBase& run, const nlohmann::json& extra, bool async,
              const checkpoint::SaveOptions& options) {
  RunState& s = run.state();
  TESSEL_CHECK(extra.is_object(), kOp, "save '{}': the extra state must be a JSON object, got {}", dir, extra.dump());
  for (const auto& [key, value] : extra.items())
    TESSEL_CHECK(!kReserved.count(key), kOp, "save '{}': extra key '{}' is reserved for the run's own state ({})", dir,
                 key, fmt::join(kReserved, ", "));
  TESSEL_CHECK(s.micro == 0, kOp,
               "save '{}' in the middle of step {} ({} backward pass(es) done): save between steps, after "
               "run.step_optimizer()",
               dir, s.step + 1, s.micro);
  checkpoint::NamedTensors tensors;
  for (const auto& nt : s.model->state_dict())
    if (held(nt.tensor)) tensors.emplace_back(kModel + nt.name, nt.tensor);
  for (const auto& nt : s.opt->state_dict()) tensors.emplace_back(kOptim + nt.name, nt.tensor);
  nlohmann::json state = extra;
  state["step"] = s.step;
  state["rng"] = {{"seed", s.options.seed}, {"step", s.step}};
  state["optimizer"] = s.opt->name();
  state["mesh"] = s.mesh ? s.mesh->str() : "one device";
  state["model_type"] = s.model_type;
  if (s.options.lr_schedule) state["lr_schedule"] = schedule_json(*s.options.lr_schedule);
  if (s.scaler) state["loss_scaling"] = {{"scale", s.scaler->get_scale()}, {"growth_tracker", s.scaler->growth_tracker()}};
  if (!s.saver) s.saver = std::make_unique<checkpoint::Saver>();
  s.saver->save(dir, tensors, state, async, options);
}

}  // namespace

void save(const std::string& dir, RunBase& run, const nlohmann::json& extra, bool async) {
  save_run(dir, run, extra, async, {});
}

void wait_for_save(RunBase& run) {
  RunState& s = run.state();
  if (s.saver) s.saver->wait();
}

namespace {
nlohmann::json caller_keys(const nlohmann::json& state) {
  nlohmann::json extra = nlohmann::json::object();
  for (const auto& [key, value] : state.items())
    if (!kReserved.count(key)) extra[key] = value;
  return extra;
}
}  // namespace

namespace {
// The model's tensors this rank holds, as checkpoint targets "model.<path>"
// (straight into the live tensors, in their layout), after checking that
// both sides have the same tensors with the same dtypes and shapes: a
// checkpoint of another model is refused whole. `elsewhere` gets the tensors
// another pipeline stage holds.
checkpoint::NamedTensors model_targets(const checkpoint::CheckpointReader& reader, const std::string& dir,
                                       RunState& s, std::set<std::string>* elsewhere) {
  const std::string saved_type = reader.meta().state.value("model_type", std::string("(unknown)"));
  std::set<std::string> saved_model;
  for (const checkpoint::TensorMeta& t : reader.meta().tensors)
    if (starts_with(t.name, kModel)) saved_model.insert(t.name.substr(std::char_traits<char>::length(kModel)));
  checkpoint::NamedTensors targets;
  std::set<std::string> mine;
  for (const auto& nt : s.model->state_dict()) {
    mine.insert(nt.name);
    if (!held(nt.tensor)) {
      if (elsewhere) elsewhere->insert(nt.name);
      continue;
    }
    TESSEL_CHECK(saved_model.count(nt.name), kOp,
                 "'{}' (a {} checkpoint) has no tensor '{}{}' that this {} has ({} model tensors saved): a checkpoint "
                 "of another model",
                 dir, saved_type, kModel, nt.name, s.model_type, saved_model.size());
    targets.emplace_back(kModel + nt.name, nt.tensor);
  }
  for (const std::string& name : saved_model)
    TESSEL_CHECK(mine.count(name), kOp,
                 "'{}' (a {} checkpoint) holds tensor '{}{}' that this {} does not have: a checkpoint of another model",
                 dir, saved_type, kModel, name, s.model_type);
  for (const auto& [name, t] : targets) {
    const checkpoint::TensorMeta* m = reader.meta().find(name);
    TESSEL_CHECK(m->dtype == t.dtype() && m->shape == t.shape(), kOp,
                 "'{}' (a {} checkpoint): tensor '{}' is {} {} but this {}'s is {} {}: a checkpoint of another model",
                 dir, saved_type, name, dtype_name(m->dtype), m->shape.str(), s.model_type, dtype_name(t.dtype()),
                 t.shape().str());
  }
  return targets;
}
}  // namespace

uint64_t load_weights(const std::string& dir, RunBase& run) {
  RunState& s = run.state();
  wait_for_save(run);
  checkpoint::CheckpointReader reader(dir);
  const checkpoint::NamedTensors targets = model_targets(reader, dir, s, nullptr);
  return checkpoint::load(reader, targets).bytes_read;
}

nlohmann::json load(const std::string& dir, RunBase& run, const LoadCheck& check) {
  RunState& s = run.state();
  wait_for_save(run);
  TESSEL_CHECK(s.micro == 0, kOp, "load '{}' in the middle of step {} ({} backward pass(es) done)", dir, s.step + 1,
               s.micro);
  checkpoint::CheckpointReader reader(dir);
  const nlohmann::json& st = reader.meta().state;
  TESSEL_CHECK(st.is_object() && st.contains("step") && st.contains("rng") && st["rng"].contains("seed"), kOp,
               "'{}' is not a training checkpoint (its state has no step and rng seed): {}", dir, st.dump());
  const std::string saved_type = st.value("model_type", std::string("(unknown)"));
  const uint64_t seed = st["rng"]["seed"].get<uint64_t>();
  TESSEL_CHECK(seed == s.options.seed, kOp,
               "'{}' was trained with seed {} but this run has seed {} (RunOptions::seed): dropout masks and the "
               "data order would differ from the run that saved it",
               dir, seed, s.options.seed);
  if (check) check(caller_keys(st), st["step"].get<int64_t>());

  std::set<std::string> elsewhere;  // parameters another pipeline stage holds
  checkpoint::NamedTensors targets = model_targets(reader, dir, s, &elsewhere);

  const std::string saved_opt = st.value("optimizer", std::string());
  TESSEL_CHECK(saved_opt.empty() || saved_opt == s.opt->name(), kOp,
               "'{}' holds the state of a {} optimizer but this run's optimizer is {}: resuming needs the same "
               "optimizer",
               dir, saved_opt, s.opt->name());

  // Optimizer: its state may not exist yet (it is created at the first
  // step), so each saved tensor gets a target shaped like the saved one and
  // laid out like its parameter; load_state_dict copies them in.
  std::map<std::string, Tensor> params;
  for (const auto& g : s.opt->param_groups())
    for (const auto& p : g.params) params[p.name] = p.tensor;
  std::vector<nn::NamedTensor> opt_state;
  for (const checkpoint::TensorMeta& t : reader.meta().tensors) {
    if (!starts_with(t.name, kOptim)) continue;
    const std::string key = t.name.substr(std::char_traits<char>::length(kOptim));
    const size_t dot = key.rfind('.');
    const std::string path = dot == std::string::npos ? "" : key.substr(0, dot);
    if (elsewhere.count(path)) continue;
    auto it = params.find(path);
    TESSEL_CHECK(key == "step" || it != params.end(), kOp,
                 "'{}' holds optimizer state '{}' for parameter '{}', which this run's {} does not update", dir, key,
                 path, s.opt->name());
    Tensor target;
    if (it != params.end() && it->second.is_distributed() && t.shape == it->second.shape())
      target = zeros(t.shape, it->second.mesh(), it->second.placements(), TensorOptions(t.dtype));
    else
      target = zeros(t.shape, TensorOptions(t.dtype));
    targets.emplace_back(t.name, target);
    opt_state.push_back({key, target});
  }
  // Everything is checked before anything is written: the optimizer's keys
  // here, every target's presence, shape and dtype in checkpoint::load.
  s.opt->check_state_dict(opt_state);
  // Loss scaling resumes where it was (the scale and its clean-step count),
  // so the resumed run skips and scales exactly as the uninterrupted one.
  const bool saved_scaling = st.contains("loss_scaling");
  TESSEL_CHECK(saved_scaling == bool(s.scaler), kOp,
               "'{}' was saved {} loss scaling but this run has {} (RunOptions::loss_scaling): resuming needs the "
               "same setting",
               dir, saved_scaling ? "with" : "without", s.scaler ? "it" : "none");
  checkpoint::load(reader, targets);
  s.opt->load_state_dict(opt_state);
  if (s.scaler) {
    s.scaler->set_scale(st["loss_scaling"]["scale"].get<double>());
    s.scaler->set_growth_tracker(st["loss_scaling"]["growth_tracker"].get<int64_t>());
  }
  s.step = st["step"].get<int64_t>();
  s.micro = 0;
  s.set_step_context();
  return caller_keys(st);
}

// ---- Checkpoints -------------------------------------------------------------------------------
Checkpoints::Checkpoints(std::string root) : Checkpoints(std::move(root), Options{}) {}

Checkpoints::Checkpoints(std::string root, Options options) : root_(std::move(root)), options_(options) {
  TESSEL_CHECK(!root_.empty(), kOp, "Checkpoints: the root folder is empty");
  TESSEL_CHECK(options_.every >= 0 && options_.keep_last >= 0, kOp,
               "Checkpoints: every ({}) and keep_last ({}) must be >= 0", options_.every, options_.keep_last);
  if (world_rank() == 0) checkpoint::prune_checkpoints(root_, 0);
}

Checkpoints::~Checkpoints() = default;

std::optional<nlohmann::json> Checkpoints::resume(RunBase& run, const LoadCheck& check) {
  const auto latest = checkpoint::latest_checkpoint(root_);
  if (!latest) return std::nullopt;
  return load(latest->path, run, check);
}

bool Checkpoints::after_step(RunBase& run, bool last, const nlohmann::json& extra) {
  const int64_t n = run.step();
  if (!last && !(options_.every > 0 && n % options_.every == 0)) return false;
  save(run, extra);
  return true;
}

void Checkpoints::save(RunBase& run, const nlohmann::json& extra) {
  checkpoint::SaveOptions o;
  const int64_t keep = options_.keep_last;
  const std::string root = root_;
  o.after_commit = [keep, root](const std::string&) { checkpoint::prune_checkpoints(root, keep); };
  save_run(checkpoint::step_dir(root_, run.step()), run, extra, options_.async, o);
}

}  // namespace tessel
