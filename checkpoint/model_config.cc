#include "checkpoint/model_config.h"

#include "runtime/error.h"

namespace tessel::checkpoint {

nlohmann::json model_config_to_json(const models::ModelConfig& c) {
  return {{"arch", models::arch_name(c.arch)},
          {"name", c.name},
          {"vocab_size", c.vocab_size},
          {"max_seq_len", c.max_seq_len},
          {"n_layer", c.n_layer},
          {"dim", c.dim},
          {"n_head", c.n_head},
          {"n_kv_head", c.n_kv_head},
          {"hidden", c.hidden},
          {"norm_eps", c.norm_eps},
          {"rope_theta", c.rope_theta},
          {"dropout", c.dropout},
          {"tie_embeddings", c.tie_embeddings},
          {"bias", c.bias},
          {"num_experts", c.num_experts},
          {"top_k", c.top_k},
          {"aux_loss_coef", c.aux_loss_coef},
          {"init_std", c.init_std}};
}

models::ModelConfig model_config_from_json(const nlohmann::json& j) {
  TESSEL_CHECK(j.is_object(), "model config", "expected an object, got {}", j.dump());
  auto get = [&](const char* k) -> const nlohmann::json& {
    TESSEL_CHECK(j.contains(k), "model config", "missing field '{}' in {}", k, j.dump());
    return j[k];
  };
  models::ModelConfig c;
  try {
    c.arch = models::arch_from_name(get("arch").get<std::string>());
    c.name = get("name").get<std::string>();
    c.vocab_size = get("vocab_size").get<int64_t>();
    c.max_seq_len = get("max_seq_len").get<int64_t>();
    c.n_layer = get("n_layer").get<int64_t>();
    c.dim = get("dim").get<int64_t>();
    c.n_head = get("n_head").get<int64_t>();
    c.n_kv_head = get("n_kv_head").get<int64_t>();
    c.hidden = get("hidden").get<int64_t>();
    c.norm_eps = get("norm_eps").get<double>();
    c.rope_theta = get("rope_theta").get<double>();
    c.dropout = get("dropout").get<double>();
    c.tie_embeddings = get("tie_embeddings").get<bool>();
    c.bias = get("bias").get<bool>();
    c.num_experts = get("num_experts").get<int64_t>();
    c.top_k = get("top_k").get<int64_t>();
    c.aux_loss_coef = get("aux_loss_coef").get<double>();
    c.init_std = get("init_std").get<double>();
  } catch (const nlohmann::json::exception& e) {
    TESSEL_FAIL("model config", "a field has the wrong type: {}", e.what());
  }
  return c.resolved();
}

}  // namespace tessel::checkpoint
