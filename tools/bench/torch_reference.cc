#include "tools/bench/torch_reference.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "checkpoint/safetensors.h"
#include "runtime/error.h"

namespace tessel::tools {

nlohmann::json model_config_json(const models::ModelConfig& c) {
  return {{"arch", models::arch_name(c.arch)}, {"name", c.name},
          {"vocab_size", c.vocab_size},        {"max_seq_len", c.max_seq_len},
          {"n_layer", c.n_layer},              {"dim", c.dim},
          {"n_head", c.n_head},                {"n_kv_head", c.n_kv_head},
          {"hidden", c.hidden},                {"norm_eps", c.norm_eps},
          {"rope_theta", c.rope_theta},        {"dropout", c.dropout},
          {"tie_embeddings", c.tie_embeddings}, {"bias", c.bias},
          {"num_experts", c.num_experts},      {"top_k", c.top_k},
          {"aux_loss_coef", c.aux_loss_coef}};
}

nlohmann::json adamw_json(const nn::AdamWOptions& o) {
  return {{"lr", o.lr}, {"betas", {o.betas[0], o.betas[1]}}, {"eps", o.eps}, {"weight_decay", o.weight_decay}};
}

nlohmann::json param_groups_json(const std::vector<nn::ParamGroup>& groups, double default_weight_decay) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& g : groups) {
    nlohmann::json names = nlohmann::json::array();
    for (const auto& p : g.params) names.push_back(p.name);
    out.push_back({{"name", g.name}, {"weight_decay", g.weight_decay.value_or(default_weight_decay)}, {"params", names}});
  }
  return out;
}

void write_reference_inputs(const std::string& dir, const models::LanguageModel& model, const Tensor& ids,
                            const Tensor& targets, nlohmann::json meta) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  checkpoint::NamedTensors weights;
  nlohmann::json names = nlohmann::json::array();
  for (const auto& nt : model.named_parameters()) {
    weights.emplace_back(nt.name, nt.tensor.detach());
    names.push_back(nt.name);
  }
  checkpoint::save_safetensors((fs::path(dir) / "weights.safetensors").string(), weights,
                               {{"model", models::arch_name(model.config.arch)}, {"config", model.config.name}});
  checkpoint::save_safetensors((fs::path(dir) / "batch.safetensors").string(), {{"ids", ids}, {"targets", targets}});
  meta["config"] = model_config_json(model.config);
  meta["batch"] = ids.size(0);
  meta["seq"] = ids.size(1);
  meta["params"] = names;
  const std::string path = (fs::path(dir) / "meta.json").string();
  std::ofstream out(path);
  out << meta.dump(2) << "\n";
  TESSEL_CHECK(out.good(), "reference inputs", "cannot write '{}'", path);
}

std::string reference_python() {
  if (const char* p = std::getenv("TESSEL_PYTHON"); p && *p) return p;
  if (const char* home = std::getenv("HOME")) {
    std::string p = std::string(home) + "/.cache/tessel/venv/bin/python";
    if (std::filesystem::exists(p)) return p;
  }
  return "";
}

std::string repository_root() {
  if (const char* r = std::getenv("TESSEL_ROOT"); r && *r) return r;
  if (const char* r = std::getenv("BUILD_WORKSPACE_DIRECTORY"); r && *r) return r;
  return std::filesystem::current_path().string();
}

}  // namespace tessel::tools
