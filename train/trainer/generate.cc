#include "train/trainer/generate.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "nn/parallel/plan.h"
#include "run/run.h"
#include "runtime/comm/comm.h"
#include "runtime/error.h"
#include "train/config.h"
#include "train/sample.h"
#include "train/hf_tokenizer.h"
#include "train/tokenizer.h"
#include "train/trainer/pretrained.h"

namespace tessel::train {
namespace {

constexpr const char* kOp = "generate";

// The tokenizer for `p` (nullptr when none is known).
std::shared_ptr<Tokenizer> find_tokenizer(const GenerateConfig& cfg, const Pretrained& p) {
  if (!cfg.tokenizer_json.empty()) return make_tokenizer("hf", cfg.tokenizer_json);
  if (p.kind == Pretrained::Kind::HuggingFace) return load_tokenizer_dir(p.path);
  if (p.train_config) {
    const nlohmann::json& c = *p.train_config;
    const std::string kind = c.value("tokenizer", std::string("byte"));
    if (kind == "hf") return make_tokenizer("hf", c.value("tokenizer_json", std::string()));
    return make_tokenizer(kind, c.value("vocab", std::string()), c.value("merges", std::string()));
  }
  return nullptr;
}

// config.json's eos_token_id, or the tokenizer's.
int64_t find_eos(const Pretrained& p, const Tokenizer* tok) {
  if (p.eos_id) return *p.eos_id;
  if (tok) {
    if (auto e = tok->eos_id()) return *e;
  }
  return -1;
}

std::string decode(const Tokenizer* tok, const std::vector<int64_t>& ids) {
  if (!tok) return "";
  std::vector<int32_t> v(ids.begin(), ids.end());
  return tok->decode(v);
}

GenerateResult generate_on_rank(const GenerateConfig& cfg, bool quiet) {
  const bool main_rank = !comm::has_world() || comm::world()->rank() == 0;
  const Pretrained p = find_pretrained(cfg.from);
  const std::shared_ptr<Tokenizer> tok = find_tokenizer(cfg, p);
  const int64_t V = p.model.vocab_size;

  // ---- prompts: everything is checked before the model is loaded ------------------------
  std::vector<std::vector<int64_t>> prompts;
  TESSEL_CHECK(!cfg.prompts.empty() || !cfg.ids.empty(), kOp, "no prompt: give --prompt TEXT or --ids 1,5,9");
  if (!cfg.prompts.empty()) {
    TESSEL_CHECK(tok, kOp,
                 "text prompts need a tokenizer, and '{}' has none (no tokenizer.json, no training config): give "
                 "--tokenizer-json FILE, or token ids with --ids",
                 cfg.from);
  }
  for (const std::string& text : cfg.prompts) {
    std::vector<int64_t> ids;
    for (int32_t t : tok->encode(text)) ids.push_back(t);
    TESSEL_CHECK(!ids.empty(), kOp, "the prompt \"{}\" encodes to no tokens", text);
    prompts.push_back(std::move(ids));
  }
  for (const std::string& spec : cfg.ids) prompts.push_back(parse_ids(spec));
  // The context: the model's, or the sequence length its run trained on
  // (positions beyond it were never trained).
  int64_t context = p.model.max_seq_len;
  if (p.train_config && p.train_config->contains("seq_len") && (*p.train_config)["seq_len"].is_number_integer())
    context = std::min(context, (*p.train_config)["seq_len"].get<int64_t>());
  bool kv_cache = cfg.kv_cache;
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (int64_t id : prompts[i])
      TESSEL_CHECK(id >= 0 && id < V, kOp, "prompt {}: token id {} is outside the model's vocabulary of {}", i, id,
                   V);
    TESSEL_CHECK(int64_t(prompts[i].size()) <= context, kOp,
                 "prompt {} has {} tokens, more than the model's context of {}{}", i, prompts[i].size(), context,
                 context < p.model.max_seq_len ? " (the sequence length it was trained on)" : "");
    // Longer than the context in all: slide a window over the last `context`
    // tokens, recomputing each step (a cache cannot slide).
    if (int64_t(prompts[i].size()) + cfg.max_new_tokens - 1 > context) kv_cache = false;
  }
  if (kv_cache != cfg.kv_cache && main_rank && !quiet)
    std::fprintf(stderr,
                 "tessel generate: prompt + %lld new tokens exceed the context of %lld: the last %lld tokens are fed "
                 "each step, without a KV cache (slower)\n",
                 (long long)cfg.max_new_tokens, (long long)context, (long long)context);

  // ---- the model, on this rank's mesh -------------------------------------------------------
  const auto dims = parse_mesh(cfg.mesh);
  std::vector<Mesh::DimSpec> spec;
  for (const auto& [name, size] : dims) spec.push_back({name, size});
  const MeshPtr mesh = spec.empty() ? nullptr : Mesh::world(spec);
  std::shared_ptr<models::LanguageModel> model;
  {
    nn::ConstructionScope meta(kMeta);
    model = models::build_model(p.model);
  }
  const parallel::ParallelPlan plan = parallel::load_plan(models::arch_name(p.model.arch));
  RunOptions options;
  options.pipeline_schedule = "gpipe";  // one forward per token: no backward to interleave
  Run<models::LanguageModel> run = parallelize(model, mesh, plan, adamw({}), options);
  const WeightsLoaded loaded = load_pretrained_weights(p, run);
  run.model().eval();
  if (main_rank && !quiet && !cfg.json) {
    std::printf("tessel generate: %s from %s %s (%zu tensors, %.1f MiB read by rank 0)%s\n",
                p.model.describe().c_str(), p.kind_name(), p.path.c_str(), loaded.tensors,
                double(loaded.bytes_read) / (1024.0 * 1024.0), mesh ? (", " + run.describe()).c_str() : "");
    std::fflush(stdout);
  }

  // ---- generate ------------------------------------------------------------------------------
  SampleOptions so;
  so.max_new_tokens = cfg.max_new_tokens;
  so.temperature = cfg.temperature;
  so.top_k = cfg.top_k;
  so.top_p = cfg.top_p;
  so.seed = cfg.seed;
  so.max_context = context;
  so.kv_cache = kv_cache;
  so.eos_id = cfg.ignore_eos ? -1 : find_eos(p, tok.get());
  auto logits_fn = [&](const Tensor& ids) { return run.forward(ids); };
  const auto t0 = std::chrono::steady_clock::now();
  const auto out = generate_batch(logits_fn, prompts, so);
  GenerateResult result;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (size_t i = 0; i < prompts.size(); ++i) {
    GeneratedText g;
    g.prompt_ids = prompts[i];
    g.ids = out[i];
    g.text = decode(tok.get(), g.ids);
    result.new_tokens += int64_t(g.ids.size());
    result.outputs.push_back(std::move(g));
  }
  if (!main_rank || quiet) return result;
  for (size_t i = 0; i < result.outputs.size(); ++i) {
    const GeneratedText& g = result.outputs[i];
    if (cfg.json) {
      nlohmann::json j = {{"prompt", i}, {"prompt_ids", g.prompt_ids}, {"ids", g.ids}};
      if (tok) {
        j["prompt_text"] = decode(tok.get(), g.prompt_ids);
        j["text"] = g.text;
      }
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::printf("--- prompt %zu (%zu tokens) ---\n", i, g.prompt_ids.size());
      if (tok)
        std::printf("%s%s\n", decode(tok.get(), g.prompt_ids).c_str(), g.text.c_str());
      else
        std::printf("%s\n", nlohmann::json(g.ids).dump().c_str());
    }
  }
  if (!cfg.json)
    std::printf("  %lld new tokens for %zu prompt(s) in %.2f s (%.1f tokens/s)\n", (long long)result.new_tokens,
                prompts.size(), result.seconds, double(result.new_tokens) / std::max(result.seconds, 1e-9));
  std::fflush(stdout);
  return result;
}

}  // namespace

std::vector<int64_t> parse_ids(const std::string& spec) {
  std::vector<int64_t> ids;
  size_t start = 0;
  while (start <= spec.size()) {
    const size_t comma = spec.find(',', start);
    const std::string item = spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TESSEL_CHECK(!item.empty() && used == item.size(), kOp,
                 "--ids \"{}\": \"{}\" is not a token id (give comma-separated integers, e.g. 1,5,9)", spec, item);
    ids.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ids;
}

GenerateResult run_generate(const GenerateConfig& cfg, bool quiet) {
  TESSEL_CHECK(!cfg.from.empty(), kOp, "--from DIR is required (a Hugging Face folder, a checkpoint or a run folder)");
  TESSEL_CHECK(cfg.max_new_tokens >= 1, kOp, "--max-new-tokens must be >= 1, got {}", cfg.max_new_tokens);
  int64_t devices = 1;
  for (const auto& [name, size] : parse_mesh(cfg.mesh)) devices *= size;
  if (comm::is_mpi_launch()) comm::init_mpi();
  if (comm::has_world() || devices == 1) return generate_on_rank(cfg, quiet);
  std::vector<GenerateResult> results(static_cast<size_t>(devices));
  comm::run_local(int(devices), [&](int rank) { results[size_t(rank)] = generate_on_rank(cfg, quiet); });
  return results[0];
}

}  // namespace tessel::train
