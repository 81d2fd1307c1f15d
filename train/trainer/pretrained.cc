#include "train/trainer/pretrained.h"

#include <filesystem>
#include <set>

#include "autograd/api.h"
#include "checkpoint/file_io.h"
#include "checkpoint/hf.h"
#include "checkpoint/hf_reader.h"
#include "checkpoint/load.h"
#include "checkpoint/manager.h"
#include "checkpoint/model_config.h"
#include "run/checkpoint.h"
#include "runtime/error.h"

namespace tessel::train {
namespace {

constexpr const char* kOp = "pretrained";

bool is_hf_folder(const std::string& dir) {
  return checkpoint::io::exists(dir + "/config.json") &&
         (checkpoint::io::exists(dir + "/model.safetensors") ||
          checkpoint::io::exists(dir + "/model.safetensors.index.json"));
}

// Parameters and persistent buffers this rank holds (a pipeline stage holds
// the others' as Meta tensors).
std::vector<nn::NamedTensor> held_state(models::LanguageModel& model) {
  std::vector<nn::NamedTensor> out;
  for (auto& nt : model.state_dict())
    if (nt.tensor.defined() && !nt.tensor.device().is_meta()) out.push_back(nt);
  return out;
}

}  // namespace

Pretrained find_pretrained(const std::string& dir) {
  TESSEL_CHECK(std::filesystem::is_directory(dir), kOp, "'{}' is not a directory", dir);
  Pretrained p;
  if (is_hf_folder(dir)) {
    p.kind = Pretrained::Kind::HuggingFace;
    p.path = dir;
    const nlohmann::json config = checkpoint::load_hf_config(dir);
    p.model = checkpoint::model_config_from_hf(config).resolved();
    if (config.contains("eos_token_id")) {
      const auto& e = config["eos_token_id"];
      if (e.is_number_integer()) p.eos_id = e.get<int64_t>();
      if (e.is_array() && !e.empty() && e[0].is_number_integer()) p.eos_id = e[0].get<int64_t>();
    }
    return p;
  }
  std::string step_dir;
  if (checkpoint::io::exists(dir + "/" + checkpoint::kMetadataFile)) {
    step_dir = dir;
  } else if (auto latest = checkpoint::latest_checkpoint(dir)) {
    step_dir = latest->path;
  } else if (auto in_run = checkpoint::latest_checkpoint(dir + "/checkpoints")) {
    step_dir = in_run->path;
  }
  TESSEL_CHECK(!step_dir.empty(), kOp,
               "'{}' is neither a Hugging Face model folder (config.json with model.safetensors or "
               "model.safetensors.index.json), a tessel checkpoint (metadata.json), a checkpoints folder (step-N "
               "inside) nor a run folder with checkpoints/",
               dir);
  p.kind = Pretrained::Kind::Checkpoint;
  p.path = step_dir;
  const checkpoint::CheckpointMeta meta = checkpoint::read_metadata(step_dir);
  TESSEL_CHECK(meta.state.is_object() && meta.state.contains("model"), kOp,
               "checkpoint '{}' records no model config (its state has no \"model\"): save it with `tessel train "
               "--ckpt-every N`, or give a Hugging Face folder",
               step_dir);
  p.model = checkpoint::model_config_from_json(meta.state["model"]).resolved();
  if (meta.state.contains("config") && meta.state["config"].is_object()) p.train_config = meta.state["config"];
  return p;
}

WeightsLoaded load_pretrained_weights(const Pretrained& p, Run<models::LanguageModel>& run) {
  models::LanguageModel& model = run.model();
  const models::ModelConfig& mine = model.config;
  TESSEL_CHECK(mine.arch == p.model.arch, kOp, "'{}' holds a {} model but the run's model is {}", p.path,
               models::arch_name(p.model.arch), models::arch_name(mine.arch));
  const std::vector<nn::NamedTensor> targets = held_state(model);
  std::set<std::string> all_names;
  for (const auto& nt : model.state_dict()) all_names.insert(nt.name);
  WeightsLoaded loaded;
  NoGradGuard no_grad;

  if (p.kind == Pretrained::Kind::Checkpoint) {
    loaded.bytes_read = load_weights(p.path, run);
    loaded.tensors = targets.size();
    return loaded;
  }

  // Hugging Face: the headers, then this rank's pieces, mapped to tessel's
  // names and layouts. A name of the model the rank does not hold (another
  // pipeline stage's) is not a tensor the folder may lack, but the map
  // checks every name of the folder against the whole model.
  checkpoint::HfFolderReader reader(p.path);
  for (const auto& v : checkpoint::hf_views(p.model, reader.tensors()))
    TESSEL_CHECK(all_names.count(v.name), kOp, "'{}' maps to tensor '{}' that this {} does not have", p.path, v.name,
                 mine.describe());
  checkpoint::NamedTensors wanted;
  for (const auto& nt : targets) wanted.emplace_back(nt.name, nt.tensor);
  checkpoint::load_hf(reader, p.model, wanted);
  loaded.tensors = targets.size();
  loaded.bytes_read = reader.bytes_read();
  return loaded;
}

}  // namespace tessel::train
