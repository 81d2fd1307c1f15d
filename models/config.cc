#include "models/config.h"

#include <fmt/format.h>

#include "runtime/error.h"

namespace tessel::models {

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::NanoGPT: return "nanogpt";
    case Arch::Llama: return "llama";
    case Arch::Mixtral: return "mixtral";
  }
  return "?";
}

Arch arch_from_name(const std::string& n) {
  if (n == "nanogpt" || n == "gpt2") return Arch::NanoGPT;
  if (n == "llama") return Arch::Llama;
  if (n == "mixtral") return Arch::Mixtral;
  TESSEL_FAIL("model", "unknown model '{}' (known: nanogpt, llama, mixtral)", n);
}

namespace {

// LLaMA's FFN width rule: 2/3 * 4d, rounded up to a multiple of 256.
int64_t llama_hidden(int64_t dim, int64_t multiple = 256) {
  int64_t h = 2 * (4 * dim) / 3;
  return (h + multiple - 1) / multiple * multiple;
}

ModelConfig gpt(const std::string& name, int64_t layers, int64_t dim, int64_t heads, int64_t ctx, int64_t vocab) {
  ModelConfig c;
  c.arch = Arch::NanoGPT;
  c.name = name;
  c.n_layer = layers;
  c.dim = dim;
  c.n_head = heads;
  c.max_seq_len = ctx;
  c.vocab_size = vocab;
  c.tie_embeddings = true;
  c.bias = true;
  c.norm_eps = 1e-5;
  return c;
}

ModelConfig llama(const std::string& name, int64_t layers, int64_t dim, int64_t heads, int64_t kv, int64_t hidden,
                  int64_t ctx, int64_t vocab, double theta) {
  ModelConfig c;
  c.arch = Arch::Llama;
  c.name = name;
  c.n_layer = layers;
  c.dim = dim;
  c.n_head = heads;
  c.n_kv_head = kv;
  c.hidden = hidden;
  c.max_seq_len = ctx;
  c.vocab_size = vocab;
  c.rope_theta = theta;
  c.tie_embeddings = false;
  c.bias = false;
  c.norm_eps = 1e-5;
  return c;
}

std::vector<ModelConfig> all_configs() {
  std::vector<ModelConfig> v;
  // NanoGPT (GPT-2). Vocab 50304 = 50257 padded to a multiple of 64, as in nanoGPT.
  v.push_back(gpt("tiny", 2, 64, 4, 64, 256));
  // tiny with a 16k context: long-sequence and context-parallel runs (docs/parallel.md).
  v.push_back(gpt("tiny-16k", 2, 64, 4, 16384, 256));
  // `tessel train`'s default: the most a 2-core CPU learns in ~3 minutes of
  // bytes (a compute-optimal size for that budget: ~350k parameters).
  v.push_back(gpt("demo", 3, 96, 4, 64, 256));
  v.push_back(gpt("small", 6, 384, 6, 256, 256));  // nanoGPT's character-level model
  v.push_back(gpt("gpt2-124m", 12, 768, 12, 1024, 50304));
  v.push_back(gpt("gpt2-350m", 24, 1024, 16, 1024, 50304));
  v.push_back(gpt("gpt2-774m", 36, 1280, 20, 1024, 50304));
  v.push_back(gpt("gpt2-1558m", 48, 1600, 25, 1024, 50304));
  // LLaMA.
  v.push_back(llama("tiny", 2, 64, 4, 2, 0, 64, 256, 10000.0));
  v.push_back(llama("tiny-16k", 2, 64, 4, 2, 0, 16384, 256, 10000.0));
  v.push_back(llama("demo", 3, 96, 4, 2, 0, 64, 256, 10000.0));  // `tessel train --model llama`
  v.push_back(llama("small", 6, 384, 6, 2, 0, 256, 256, 10000.0));
  v.push_back(llama("llama-7b", 32, 4096, 32, 32, 11008, 4096, 32000, 10000.0));
  v.push_back(llama("llama-13b", 40, 5120, 40, 40, 13824, 4096, 32000, 10000.0));
  v.push_back(llama("llama3-8b", 32, 4096, 32, 8, 14336, 8192, 128256, 500000.0));
  v.push_back(llama("llama3-70b", 80, 8192, 64, 8, 28672, 8192, 128256, 500000.0));
  v.push_back(llama("llama3-405b", 126, 16384, 128, 8, 53248, 8192, 128256, 500000.0));
  // Mixtral: LLaMA blocks with sparse MoE feed-forwards.
  auto mix = [&](ModelConfig c) {
    c.arch = Arch::Mixtral;
    return c;
  };
  ModelConfig mt = mix(llama("tiny", 2, 64, 4, 2, 128, 64, 256, 1e6));
  mt.num_experts = 4;
  v.push_back(mt);
  ModelConfig md = mix(llama("demo", 3, 96, 4, 2, 192, 64, 256, 1e6));  // `tessel train --model mixtral`
  md.num_experts = 4;
  v.push_back(md);
  ModelConfig ms = mix(llama("small", 4, 256, 4, 2, 512, 256, 256, 1e6));
  v.push_back(ms);
  v.push_back(mix(llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32768, 32000, 1e6)));
  return v;
}

}  // namespace

ModelConfig ModelConfig::resolved() const {
  ModelConfig c = *this;
  const std::string who = fmt::format(FMT_STRING("{} config '{}'"), arch_name(arch), name);
  TESSEL_CHECK(c.vocab_size > 0 && c.max_seq_len > 0 && c.n_layer > 0 && c.dim > 0 && c.n_head > 0, who,
               "sizes must be positive (vocab_size {}, max_seq_len {}, n_layer {}, dim {}, n_head {})", c.vocab_size,
               c.max_seq_len, c.n_layer, c.dim, c.n_head);
  TESSEL_CHECK(c.dim % c.n_head == 0, who, "n_head {} does not divide dim {}", c.n_head, c.dim);
  if (c.n_kv_head == 0) c.n_kv_head = c.n_head;
  TESSEL_CHECK(c.n_kv_head > 0 && c.n_head % c.n_kv_head == 0, who, "n_kv_head {} does not divide n_head {}",
               c.n_kv_head, c.n_head);
  TESSEL_CHECK(arch != Arch::NanoGPT || c.n_kv_head == c.n_head, who, "GPT-2 has no grouped-query attention");
  if (arch != Arch::NanoGPT) {
    TESSEL_CHECK((c.dim / c.n_head) % 2 == 0, who, "head_dim {} must be even for rotary embeddings",
                 c.dim / c.n_head);
  }
  if (c.hidden == 0) c.hidden = arch == Arch::NanoGPT ? 4 * c.dim : llama_hidden(c.dim);
  TESSEL_CHECK(c.hidden > 0, who, "hidden must be positive, got {}", c.hidden);
  if (arch == Arch::Mixtral) {
    TESSEL_CHECK(c.num_experts > 0 && c.top_k > 0 && c.top_k <= c.num_experts, who,
                 "top_k {} must be in [1, num_experts {}]", c.top_k, c.num_experts);
  }
  TESSEL_CHECK(c.dropout >= 0.0 && c.dropout < 1.0, who, "dropout must be in [0, 1), got {}", c.dropout);
  return c;
}

std::string ModelConfig::describe() const {
  std::string s = fmt::format(FMT_STRING("{} {}: {} layers, dim {}, {} heads"), arch_name(arch), name, n_layer, dim, n_head);
  if (n_kv_head != n_head) s += fmt::format(FMT_STRING(" ({} kv)"), n_kv_head);
  s += fmt::format(FMT_STRING(", hidden {}, vocab {}, context {}"), hidden, vocab_size, max_seq_len);
  if (arch == Arch::Mixtral) s += fmt::format(FMT_STRING(", {} experts top-{}"), num_experts, top_k);
  return s;
}

std::vector<std::string> config_names(Arch arch) {
  std::vector<std::string> out;
  for (const auto& c : all_configs())
    if (c.arch == arch) out.push_back(c.name);
  return out;
}

ModelConfig model_config(Arch arch, const std::string& name) {
  for (const auto& c : all_configs())
    if (c.arch == arch && c.name == name) return c.resolved();
  TESSEL_FAIL("model", "unknown {} config '{}' (known: {})", arch_name(arch), name,
              fmt::join(config_names(arch), ", "));
}

ModelConfig model_config(const std::string& arch, const std::string& name) {
  return model_config(arch_from_name(arch), name);
}

}  // namespace tessel::models
