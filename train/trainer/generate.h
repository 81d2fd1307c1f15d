#pragma once
// `tessel generate`: text from a trained or imported model, on one device or
// a tp / pp / dp mesh (ranks as threads, or MPI ranks under `tessel launch`).
//
//   tessel generate --from runs/fortunes --prompt "The meaning of life"
//   tessel generate --from hf_llama --ids 1,5,9 --ids 1,7 --max-new-tokens 20 --json
//   tessel generate --from hf_gpt2 --prompt "Hello" --temperature 0.8 --top-k 50 --top-p 0.95 --mesh tp=2
//
// --from: a Hugging Face folder, a tessel checkpoint or a run folder
// (train/trainer/pretrained.h). The tokenizer: --tokenizer-json FILE, else
// the folder's tokenizer.json, else the one the checkpoint was trained with
// (its config: byte or gpt2 vocab/merges); token-id prompts need none.
// Sampling: train/sample.h (greedy by default; seeded, per-prompt streams),
// with a KV cache; a prompt stops at the end-of-sequence token when one is
// known (config.json's eos_token_id, the tokenizer's), unless --ignore-eos.
#include <cstdint>
#include <string>
#include <vector>

namespace tessel::train {

struct GenerateConfig {
  std::string from;                   // the model folder
  std::vector<std::string> prompts;   // text prompts
  std::vector<std::string> ids;       // token-id prompts, "1,5,9" each
  int64_t max_new_tokens = 64;
  double temperature = 0.0;           // 0: greedy
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
  std::string mesh;                   // "" one device; "tp=2", "pp=2", "dp=2,tp=2", ...
  bool json = false;                  // one JSON line per prompt
  bool kv_cache = true;
  bool ignore_eos = false;
  std::string tokenizer_json;         // overrides the folder's tokenizer
};

struct GeneratedText {
  std::vector<int64_t> prompt_ids;
  std::vector<int64_t> ids;  // the new tokens
  std::string text;          // their decoding ("" without a tokenizer)
};

struct GenerateResult {
  std::vector<GeneratedText> outputs;  // one per prompt: text prompts first, then id prompts
  double seconds = 0;                  // generation only (no loading)
  int64_t new_tokens = 0;
};

// Checks the config, loads the model and generates; prints (rank 0) unless
// quiet. Every rank returns the same result.
GenerateResult run_generate(const GenerateConfig& cfg, bool quiet = false);

// "1,5,9" -> {1, 5, 9}; errors name the item.
std::vector<int64_t> parse_ids(const std::string& spec);

}  // namespace tessel::train
