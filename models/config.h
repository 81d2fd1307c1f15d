#pragma once
// Model configurations: one struct for the three architectures, and the named
// configs from `tiny` (tests) to real sizes.
#include <cstdint>
#include <string>
#include <vector>

namespace tessel::models {

enum class Arch : uint8_t { NanoGPT, Llama, Mixtral };
const char* arch_name(Arch a);
Arch arch_from_name(const std::string& name);  // "nanogpt", "llama", "mixtral"; throws otherwise

struct ModelConfig {
  Arch arch = Arch::NanoGPT;
  std::string name;            // config name ("tiny", "gpt2-124m", ...)
  int64_t vocab_size = 256;
  int64_t max_seq_len = 256;   // learned positions (GPT-2) / RoPE table rows
  int64_t n_layer = 2;
  int64_t dim = 64;
  int64_t n_head = 4;
  int64_t n_kv_head = 0;       // 0: n_head (GPT-2 and LLaMA-7B); fewer: GQA
  int64_t hidden = 0;          // MLP / expert hidden width; 0: 4*dim (GPT-2) or LLaMA's rule
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  double dropout = 0.0;        // GPT-2 embedding/attention/residual dropout
  bool tie_embeddings = true;  // GPT-2: lm_head shares wte
  bool bias = true;            // GPT-2 linear biases
  int64_t num_experts = 8;     // Mixtral
  int64_t top_k = 2;
  double aux_loss_coef = 0.02;  // Mixtral router load-balancing loss weight
  double init_std = 0.02;

  // Resolves 0-valued defaults (n_kv_head, hidden) and validates: heads
  // dividing the width, kv heads dividing heads, top_k <= experts, positive
  // sizes. Errors name the config and the fields.
  ModelConfig resolved() const;
  std::string describe() const;
};

// The named configurations of an architecture.
std::vector<std::string> config_names(Arch arch);
// A named configuration, resolved; throws naming the known configs on an unknown name.
ModelConfig model_config(Arch arch, const std::string& name);
ModelConfig model_config(const std::string& arch, const std::string& name);

}  // namespace tessel::models
