#include "train/trainer/checkpointing.h"

#include <filesystem>
#include <map>
#include <sstream>

#include "autograd/api.h"
#include "autograd/ops/dist.h"
#include "checkpoint/load.h"
#include "checkpoint/manager.h"
#include "checkpoint/model_config.h"
#include "checkpoint/save.h"
#include "train/atomic_file.h"
#include "train/data.h"
#include "train/metrics.h"

namespace tessel::train {

namespace {

constexpr const char* kOp = "checkpoint";
constexpr const char* kModel = "model.";
constexpr const char* kOptim = "optim.";

checkpoint::NamedTensors state_tensors(const models::LanguageModel& model, const nn::Optimizer& opt) {
  checkpoint::NamedTensors out;
  for (const auto& nt : model.state_dict()) out.emplace_back(kModel + nt.name, nt.tensor);
  for (const auto& nt : opt.state_dict()) out.emplace_back(kOptim + nt.name, nt.tensor);
  return out;
}

}  // namespace

TrainCheckpointer::TrainCheckpointer(const TrainConfig& cfg, const models::LanguageModel& model, nn::Optimizer& opt,
                                     bool main_rank)
    : cfg_(cfg), model_(model), opt_(opt), main_rank_(main_rank), root_(cfg.checkpoint_root()),
      saver_(std::make_unique<checkpoint::Saver>()) {
  if (main_rank_ && (cfg.ckpt_every > 0 || cfg.resume)) checkpoint::prune_checkpoints(root_, 0);
}

TrainCheckpointer::~TrainCheckpointer() = default;

int64_t TrainCheckpointer::resume() {
  if (!cfg_.resume) return 0;
  const auto latest = checkpoint::latest_checkpoint(root_);
  if (!latest) return 0;
  checkpoint::CheckpointReader reader(latest->path);
  const nlohmann::json& st = reader.meta().state;
  TESSEL_CHECK(st.contains("step") && st.contains("rng") && st.contains("model"), kOp,
               "'{}' is not a training checkpoint (its state has no step/rng/model)", latest->path);
  const uint64_t seed = st["rng"].at("seed").get<uint64_t>();
  TESSEL_CHECK(seed == cfg_.seed, kOp,
               "'{}' was trained with seed {} but this run has seed {}: the data order and dropout would differ",
               latest->path, seed, cfg_.seed);
  const models::ModelConfig saved = checkpoint::model_config_from_json(st["model"]);
  TESSEL_CHECK(checkpoint::model_config_to_json(saved) == checkpoint::model_config_to_json(model_.config), kOp,
               "'{}' holds a {} model ({}) but this run builds {}", latest->path, models::arch_name(saved.arch),
               saved.describe(), model_.config.describe());

  // Model: straight into the live parameters, in their layout.
  checkpoint::NamedTensors targets;
  for (const auto& nt : model_.state_dict()) targets.emplace_back(kModel + nt.name, nt.tensor);
  checkpoint::load(reader, targets);

  // Optimizer: its state may not exist yet (it is created at the first
  // step), so each saved tensor gets a target shaped like the saved one and
  // laid out like its parameter; load_state_dict copies them in.
  std::map<std::string, Tensor> params;
  for (const auto& g : opt_.param_groups())
    for (const auto& p : g.params) params[p.name] = p.tensor;
  checkpoint::NamedTensors opt_targets;
  std::vector<nn::NamedTensor> opt_state;
  const std::string prefix = kOptim;
  for (const checkpoint::TensorMeta& t : reader.meta().tensors) {
    if (t.name.rfind(prefix, 0) != 0) continue;
    const std::string key = t.name.substr(prefix.size());
    const size_t dot = key.rfind('.');
    auto it = dot == std::string::npos ? params.end() : params.find(key.substr(0, dot));
    Tensor target;
    if (it != params.end() && it->second.is_distributed() && t.shape == it->second.shape())
      target = zeros(t.shape, it->second.mesh(), it->second.placements(), TensorOptions(t.dtype));
    else
      target = zeros(t.shape, TensorOptions(t.dtype));
    opt_targets.emplace_back(t.name, target);
    opt_state.push_back({key, target});
  }
  checkpoint::load(reader, opt_targets);
  opt_.load_state_dict(opt_state);
  const int64_t step = st["step"].get<int64_t>();
  const LoaderState loader = LoaderState::from_json(st.at("loader").dump());
  TESSEL_CHECK(loader.seed == cfg_.seed && loader.step == step, kOp, "'{}': loader state {} does not match step {}",
               latest->path, st["loader"].dump(), step);
  return step;
}

void TrainCheckpointer::after_step(int64_t done) {
  if (cfg_.ckpt_every <= 0) return;
  if (done % cfg_.ckpt_every != 0 && done != cfg_.steps) return;
  nlohmann::json state;
  state["step"] = done;
  state["rng"] = {{"seed", cfg_.seed}, {"step", done}};
  state["loader"] = nlohmann::json::parse(LoaderState{cfg_.seed, done}.to_json());
  state["model"] = checkpoint::model_config_to_json(model_.config);
  state["optimizer"] = opt_.name();
  state["mesh"] = cfg_.mesh;
  state["config"] = nlohmann::json::parse(cfg_.to_json());
  checkpoint::SaveOptions opts;
  const int64_t keep = cfg_.keep_last;
  const std::string root = root_;
  opts.after_commit = [keep, root](const std::string&) { checkpoint::prune_checkpoints(root, keep); };
  saver_->save(checkpoint::step_dir(root_, done), state_tensors(model_, opt_), state, !cfg_.ckpt_sync, opts);
}

void TrainCheckpointer::finish() { saver_->wait(); }

void truncate_metrics(const std::string& path, int64_t step) {
  if (!std::filesystem::exists(path)) return;
  std::istringstream in(read_file(path, "resume"));
  std::string kept, line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      if (StepMetrics::from_json_line(line).step <= step) kept += line + "\n";
    } catch (const Error&) {
      // a torn last line of a killed run
    }
  }
  write_file_atomic(path, kept);
}

}  // namespace tessel::train
