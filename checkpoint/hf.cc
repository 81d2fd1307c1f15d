#include "checkpoint/hf.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "autograd/api.h"
#include "checkpoint/file_io.h"
#include "checkpoint/metadata.h"
#include "runtime/error.h"

namespace tessel::checkpoint {
namespace {

constexpr const char* kOp = "hf";
namespace fs = std::filesystem;
using models::Arch;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Named tensors with use tracking: every input must be consumed exactly once.
class Source {
 public:
  Source(const NamedTensors& in, const char* what) : what_(what) {
    for (const auto& [n, t] : in) {
      TESSEL_CHECK(!map_.count(n), kOp, "{} tensor '{}' appears twice", what_, n);
      map_[n] = t;
    }
  }
  bool has(const std::string& n) const { return map_.count(n) > 0; }
  Tensor take(const std::string& n) {
    auto it = map_.find(n);
    TESSEL_CHECK(it != map_.end(), kOp, "missing {} tensor '{}' ({} tensors given)", what_, n, map_.size());
    used_.insert(n);
    return it->second;
  }
  void skip(const std::string& n) { used_.insert(n); }
  // Everything must have been taken.
  void check_all_used() const {
    std::vector<std::string> left;
    for (const auto& [n, t] : map_)
      if (!used_.count(n)) left.push_back(n);
    TESSEL_CHECK(left.empty(), kOp, "{} unexpected {} tensors, e.g. '{}'", left.size(), what_,
                 left.empty() ? "" : left.front());
  }
  const std::map<std::string, Tensor>& all() const { return map_; }

 private:
  const char* what_;
  std::map<std::string, Tensor> map_;
  std::set<std::string> used_;
};

Tensor t2(const Tensor& w) { return w.t().contiguous(); }

void check_shape(const Tensor& t, const Dims& want, const std::string& name) {
  TESSEL_CHECK(t.shape() == want, kOp, "'{}' is {} but the config needs {}", name, t.shape().str(), want.str());
}

// The LLaMA/Mixtral renames of layer i (tessel suffix, HF suffix).
std::vector<std::pair<std::string, std::string>> llama_layer_names(const models::ModelConfig& c, int64_t i) {
  const std::string t = "layers." + std::to_string(i) + ".", h = "model.layers." + std::to_string(i) + ".";
  std::vector<std::pair<std::string, std::string>> v = {
      {t + "attn_norm.weight", h + "input_layernorm.weight"},
      {t + "attn.wq.weight", h + "self_attn.q_proj.weight"},
      {t + "attn.wk.weight", h + "self_attn.k_proj.weight"},
      {t + "attn.wv.weight", h + "self_attn.v_proj.weight"},
      {t + "attn.wo.weight", h + "self_attn.o_proj.weight"},
      {t + "ffn_norm.weight", h + "post_attention_layernorm.weight"},
  };
  if (c.arch == Arch::Llama) {
    v.push_back({t + "ffn.w1.weight", h + "mlp.gate_proj.weight"});
    v.push_back({t + "ffn.w3.weight", h + "mlp.up_proj.weight"});
    v.push_back({t + "ffn.w2.weight", h + "mlp.down_proj.weight"});
  } else {
    v.push_back({t + "ffn.gate.weight", h + "block_sparse_moe.gate.weight"});
    for (int64_t e = 0; e < c.num_experts; ++e)
      for (const char* w : {"w1", "w2", "w3"})
        v.push_back({t + "ffn.experts." + std::to_string(e) + "." + w + ".weight",
                     h + "block_sparse_moe.experts." + std::to_string(e) + "." + w + ".weight"});
  }
  return v;
}

void require_gpt2_bias(const models::ModelConfig& c) {
  TESSEL_CHECK(c.bias, kOp, "Hugging Face GPT-2 has biases in every linear layer; config '{}' has bias = false",
               c.name);
}

}  // namespace

NamedTensors to_hf(const models::ModelConfig& cfg, const NamedTensors& tessel) {
  const models::ModelConfig c = cfg.resolved();
  Source src(tessel, "tessel");
  NamedTensors out;
  NoGradGuard ng;
  auto put = [&](const std::string& hf, const Tensor& t) { out.emplace_back(hf, t.contiguous()); };
  if (c.arch == Arch::NanoGPT) {
    require_gpt2_bias(c);
    put("transformer.wte.weight", src.take("wte.weight"));
    put("transformer.wpe.weight", src.take("wpe.weight"));
    for (int64_t i = 0; i < c.n_layer; ++i) {
      const std::string t = "layers." + std::to_string(i) + ".", h = "transformer.h." + std::to_string(i) + ".";
      for (const char* ln : {"ln_1", "ln_2"})
        for (const char* p : {".weight", ".bias"}) put(h + ln + p, src.take(t + ln + p));
      put(h + "attn.c_attn.weight",
          t2(cat({src.take(t + "attn.wq.weight"), src.take(t + "attn.wk.weight"), src.take(t + "attn.wv.weight")}, 0)));
      put(h + "attn.c_attn.bias",
          cat({src.take(t + "attn.wq.bias"), src.take(t + "attn.wk.bias"), src.take(t + "attn.wv.bias")}, 0));
      put(h + "attn.c_proj.weight", t2(src.take(t + "attn.wo.weight")));
      put(h + "attn.c_proj.bias", src.take(t + "attn.wo.bias"));
      put(h + "mlp.c_fc.weight", t2(src.take(t + "mlp.fc.weight")));
      put(h + "mlp.c_fc.bias", src.take(t + "mlp.fc.bias"));
      put(h + "mlp.c_proj.weight", t2(src.take(t + "mlp.proj.weight")));
      put(h + "mlp.c_proj.bias", src.take(t + "mlp.proj.bias"));
    }
    put("transformer.ln_f.weight", src.take("ln_f.weight"));
    put("transformer.ln_f.bias", src.take("ln_f.bias"));
  } else {
    put("model.embed_tokens.weight", src.take("tok_embeddings.weight"));
    for (int64_t i = 0; i < c.n_layer; ++i)
      for (const auto& [t, h] : llama_layer_names(c, i)) put(h, src.take(t));
    put("model.norm.weight", src.take("norm.weight"));
    put("lm_head.weight", src.take("output.weight"));
  }
  src.check_all_used();
  return out;
}

namespace {

// The one map from Hugging Face tensors to tessel's parameters: put(name, t)
// is called once per parameter with `t` a view (transpose, slice, select) of
// one of `hf_in`'s tensors. from_hf copies the views; hf_views records them.
template <class Put>
void map_from_hf(const models::ModelConfig& cfg, const NamedTensors& hf_in, Put&& put) {
  const models::ModelConfig c = cfg.resolved();
  // The hub's original GPT-2 files name tensors without "transformer.".
  NamedTensors hf = hf_in;
  if (c.arch == Arch::NanoGPT) {
    bool bare = false;
    for (const auto& [n, t] : hf) bare = bare || n == "wte.weight";
    if (bare)
      for (auto& [n, t] : hf)
        if (n != "lm_head.weight") n = "transformer." + n;
  }
  Source src(hf, "Hugging Face");
  for (const auto& [n, t] : src.all())  // buffers some exporters store
    if (ends_with(n, ".attn.bias") || ends_with(n, ".attn.masked_bias") || ends_with(n, "rotary_emb.inv_freq"))
      if (c.arch != Arch::NanoGPT || n.find(".attn.c_attn") == std::string::npos) src.skip(n);
  NoGradGuard ng;
  const int64_t C = c.dim;
  if (c.arch == Arch::NanoGPT) {
    require_gpt2_bias(c);
    put("wte.weight", src.take("transformer.wte.weight"));
    put("wpe.weight", src.take("transformer.wpe.weight"));
    for (int64_t i = 0; i < c.n_layer; ++i) {
      const std::string t = "layers." + std::to_string(i) + ".", h = "transformer.h." + std::to_string(i) + ".";
      for (const char* ln : {"ln_1", "ln_2"})
        for (const char* p : {".weight", ".bias"}) put(t + ln + p, src.take(h + ln + p));
      const Tensor w = src.take(h + "attn.c_attn.weight"), b = src.take(h + "attn.c_attn.bias");
      check_shape(w, {C, 3 * C}, h + "attn.c_attn.weight");
      const Tensor wt = w.t();
      const char* names[] = {"wq", "wk", "wv"};
      for (int k = 0; k < 3; ++k) {
        put(t + "attn." + names[k] + ".weight", wt.slice(0, k * C, (k + 1) * C));
        put(t + "attn." + names[k] + ".bias", b.slice(0, k * C, (k + 1) * C));
      }
      put(t + "attn.wo.weight", src.take(h + "attn.c_proj.weight").t());
      put(t + "attn.wo.bias", src.take(h + "attn.c_proj.bias"));
      put(t + "mlp.fc.weight", src.take(h + "mlp.c_fc.weight").t());
      put(t + "mlp.fc.bias", src.take(h + "mlp.c_fc.bias"));
      put(t + "mlp.proj.weight", src.take(h + "mlp.c_proj.weight").t());
      put(t + "mlp.proj.bias", src.take(h + "mlp.c_proj.bias"));
    }
    put("ln_f.weight", src.take("transformer.ln_f.weight"));
    put("ln_f.bias", src.take("transformer.ln_f.bias"));
    if (src.has("lm_head.weight")) src.skip("lm_head.weight");  // tied to wte
  } else {
    const Tensor embed = src.take("model.embed_tokens.weight");
    put("tok_embeddings.weight", embed);
    for (int64_t i = 0; i < c.n_layer; ++i) {
      const std::string h = "model.layers." + std::to_string(i) + ".";
      const bool fused = c.arch == Arch::Mixtral && src.has(h + "mlp.experts.gate_up_proj");
      for (const auto& [t, name] : llama_layer_names(c, i)) {
        if (!fused || name.find("block_sparse_moe") == std::string::npos) put(t, src.take(name));
      }
      if (fused) {  // transformers 5's in-memory layout
        const std::string tl = "layers." + std::to_string(i) + ".ffn.";
        put(tl + "gate.weight", src.take(h + "mlp.gate.weight"));
        const Tensor gu = src.take(h + "mlp.experts.gate_up_proj"), down = src.take(h + "mlp.experts.down_proj");
        check_shape(gu, {c.num_experts, 2 * c.hidden, C}, h + "mlp.experts.gate_up_proj");
        check_shape(down, {c.num_experts, C, c.hidden}, h + "mlp.experts.down_proj");
        for (int64_t e = 0; e < c.num_experts; ++e) {
          const std::string te = tl + "experts." + std::to_string(e) + ".";
          put(te + "w1.weight", gu.select(0, e).slice(0, 0, c.hidden));
          put(te + "w3.weight", gu.select(0, e).slice(0, c.hidden, 2 * c.hidden));
          put(te + "w2.weight", down.select(0, e));
        }
      }
    }
    put("norm.weight", src.take("model.norm.weight"));
    put("output.weight", src.has("lm_head.weight") ? src.take("lm_head.weight") : embed);  // tied files omit it
  }
  src.check_all_used();
}

}  // namespace

NamedTensors from_hf(const models::ModelConfig& cfg, const NamedTensors& hf) {
  NamedTensors out;
  NoGradGuard ng;
  map_from_hf(cfg, hf, [&](const std::string& name, const Tensor& t) { out.emplace_back(name, t.contiguous()); });
  return out;
}

std::vector<HfView> hf_views(const models::ModelConfig& cfg, const std::vector<TensorSpec>& hf) {
  // Meta tensors of the files' shapes: the map's views keep their strides and
  // offsets, and the storage tells which file tensor each view is of.
  NamedTensors shapes;
  std::map<const StorageImpl*, std::string> file_name;
  for (const TensorSpec& s : hf) {
    shapes.emplace_back(s.name, raw::empty(s.shape, s.dtype, kMeta));
    file_name[shapes.back().second.storage().get()] = s.name;
  }
  std::vector<HfView> out;
  map_from_hf(cfg, shapes, [&](const std::string& name, const Tensor& t) {
    out.push_back(HfView{name, file_name.at(t.storage().get()), t.shape(), t.strides(), t.offset()});
  });
  return out;
}

nlohmann::json hf_config_json(const models::ModelConfig& cfg) {
  const models::ModelConfig c = cfg.resolved();
  nlohmann::json j;
  if (c.arch == Arch::NanoGPT) {
    require_gpt2_bias(c);
    j = {{"model_type", "gpt2"},     {"architectures", {"GPT2LMHeadModel"}},
         {"vocab_size", c.vocab_size}, {"n_positions", c.max_seq_len},
         {"n_embd", c.dim},          {"n_layer", c.n_layer},
         {"n_head", c.n_head},       {"n_inner", c.hidden},
         {"activation_function", "gelu_new"},
         {"layer_norm_epsilon", c.norm_eps},
         {"resid_pdrop", c.dropout}, {"embd_pdrop", c.dropout},
         {"attn_pdrop", c.dropout},  {"initializer_range", c.init_std},
         {"tie_word_embeddings", true}};
  } else {
    j = {{"vocab_size", c.vocab_size},
         {"hidden_size", c.dim},
         {"intermediate_size", c.hidden},
         {"num_hidden_layers", c.n_layer},
         {"num_attention_heads", c.n_head},
         {"num_key_value_heads", c.n_kv_head},
         {"head_dim", c.dim / c.n_head},
         {"max_position_embeddings", c.max_seq_len},
         {"rms_norm_eps", c.norm_eps},
         {"rope_theta", c.rope_theta},  // transformers < 5
         {"rope_parameters", {{"rope_theta", c.rope_theta}, {"rope_type", "default"}}},
         {"hidden_act", "silu"},
         {"initializer_range", c.init_std},
         {"attention_bias", false},
         {"tie_word_embeddings", false}};
    if (c.arch == Arch::Llama) {
      j["model_type"] = "llama";
      j["architectures"] = {"LlamaForCausalLM"};
      j["mlp_bias"] = false;
    } else {
      j["model_type"] = "mixtral";
      j["architectures"] = {"MixtralForCausalLM"};
      j["num_local_experts"] = c.num_experts;
      j["num_experts_per_tok"] = c.top_k;
      j["router_aux_loss_coef"] = c.aux_loss_coef;
      j["output_router_logits"] = false;
      j["sliding_window"] = nullptr;
    }
  }
  j["torch_dtype"] = "float32";
  return j;
}

models::ModelConfig model_config_from_hf(const nlohmann::json& j) {
  auto num = [&](const char* k) -> const nlohmann::json& {
    TESSEL_CHECK(j.contains(k) && j[k].is_number(), kOp, "config.json: '{}' is missing or not a number", k);
    return j[k];
  };
  auto num_or = [&](const char* k, double dflt) { return j.contains(k) && j[k].is_number() ? j[k].get<double>() : dflt; };
  TESSEL_CHECK(j.is_object() && j.contains("model_type") && j["model_type"].is_string(), kOp,
               "config.json has no model_type");
  const std::string type = j["model_type"].get<std::string>();
  models::ModelConfig c;
  c.name = "hf";
  if (type == "gpt2") {
    c.arch = Arch::NanoGPT;
    c.vocab_size = num("vocab_size").get<int64_t>();
    c.max_seq_len = num("n_positions").get<int64_t>();
    c.dim = num("n_embd").get<int64_t>();
    c.n_layer = num("n_layer").get<int64_t>();
    c.n_head = num("n_head").get<int64_t>();
    c.n_kv_head = c.n_head;
    c.hidden = j.contains("n_inner") && j["n_inner"].is_number() ? j["n_inner"].get<int64_t>() : 4 * c.dim;
    c.norm_eps = num_or("layer_norm_epsilon", 1e-5);
    c.dropout = num_or("resid_pdrop", 0.0);
    c.init_std = num_or("initializer_range", 0.02);
    c.tie_embeddings = true;
    c.bias = true;
    const std::string act = j.value("activation_function", "gelu_new");
    TESSEL_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh", kOp,
                 "config.json: activation_function '{}' (tessel's GPT-2 uses the tanh GELU, 'gelu_new')", act);
  } else if (type == "llama" || type == "mixtral") {
    c.arch = type == "llama" ? Arch::Llama : Arch::Mixtral;
    c.vocab_size = num("vocab_size").get<int64_t>();
    c.dim = num("hidden_size").get<int64_t>();
    c.hidden = num("intermediate_size").get<int64_t>();
    c.n_layer = num("num_hidden_layers").get<int64_t>();
    c.n_head = num("num_attention_heads").get<int64_t>();
    c.n_kv_head = j.contains("num_key_value_heads") && j["num_key_value_heads"].is_number()
                      ? j["num_key_value_heads"].get<int64_t>()
                      : c.n_head;
    c.max_seq_len = num("max_position_embeddings").get<int64_t>();
    c.norm_eps = num_or("rms_norm_eps", 1e-6);
    c.rope_theta = num_or("rope_theta", type == "llama" ? 10000.0 : 1e6);
    if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {  // transformers >= 5
      const nlohmann::json& rp = j["rope_parameters"];
      TESSEL_CHECK(rp.value("rope_type", "default") == "default", kOp,
                   "config.json: rope_type '{}' is not supported (tessel's RoPE has no scaling)", rp["rope_type"].dump());
      if (rp.contains("rope_theta") && rp["rope_theta"].is_number()) c.rope_theta = rp["rope_theta"].get<double>();
    }
    if (j.contains("rope_scaling") && j["rope_scaling"].is_object())
      TESSEL_CHECK(j["rope_scaling"].value("rope_type", j["rope_scaling"].value("type", "default")) == "default", kOp,
                   "config.json: rope_scaling {} is not supported (tessel's RoPE has no scaling)",
                   j["rope_scaling"].dump());
    c.init_std = num_or("initializer_range", 0.02);
    c.dropout = 0;
    c.bias = false;
    c.tie_embeddings = false;
    TESSEL_CHECK(!j.value("attention_bias", false) && !j.value("mlp_bias", false), kOp,
                 "config.json: attention/MLP biases are not supported by tessel's {}", type);
    if (j.contains("head_dim") && j["head_dim"].is_number())
      TESSEL_CHECK(j["head_dim"].get<int64_t>() * c.n_head == c.dim, kOp,
                   "config.json: head_dim {} x {} heads != hidden_size {}", j["head_dim"].dump(), c.n_head, c.dim);
    if (c.arch == Arch::Mixtral) {
      c.num_experts = num("num_local_experts").get<int64_t>();
      c.top_k = num("num_experts_per_tok").get<int64_t>();
      c.aux_loss_coef = num_or("router_aux_loss_coef", 0.02);
    }
  } else {
    TESSEL_FAIL(kOp, "config.json: model_type '{}' is not supported (gpt2, llama, mixtral)", type);
  }
  return c.resolved();
}

void save_hf(const std::string& dir, const models::ModelConfig& config, const NamedTensors& hf,
             uint64_t max_shard_bytes) {
  io::make_dir(dir, kOp);
  io::write_file_atomic(dir + "/config.json", hf_config_json(config).dump(2) + "\n", kOp);
  std::vector<NamedTensors> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (const auto& nt : hf) {
    const uint64_t n = nt.second.nbytes();
    if (in_shard > 0 && in_shard + n > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(nt);
    in_shard += n;
    total += n;
  }
  const std::map<std::string, std::string> meta{{"format", "pt"}};
  if (shards.size() == 1) {
    save_safetensors(dir + "/model.safetensors", shards[0], meta);
    return;
  }
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = fmt::format(FMT_STRING("model-{:05d}-of-{:05d}.safetensors"), i + 1, shards.size());
    save_safetensors(dir + "/" + name, shards[i], meta);
    for (const auto& nt : shards[i]) weight_map[nt.first] = name;
  }
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = weight_map;
  io::write_file_atomic(dir + "/model.safetensors.index.json", index.dump(2) + "\n", kOp);
}

NamedTensors load_hf_tensors(const std::string& dir) {
  const std::string index = dir + "/model.safetensors.index.json", single = dir + "/model.safetensors";
  if (!io::exists(index)) {
    TESSEL_CHECK(io::exists(single), kOp, "'{}' has neither model.safetensors nor model.safetensors.index.json", dir);
    return load_safetensors(single).tensors;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(io::read_file(index, kOp));
  } catch (const nlohmann::json::exception& e) {
    TESSEL_FAIL(kOp, "'{}' is not valid JSON: {}", index, e.what());
  }
  TESSEL_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), kOp, "'{}' has no weight_map object", index);
  std::map<std::string, std::vector<std::string>> by_file;
  for (const auto& [name, file] : j["weight_map"].items()) {
    TESSEL_CHECK(file.is_string() && is_plain_file_name(file.get<std::string>()), kOp,
                 "'{}': tensor '{}' maps to {}, not a file name", index, name, file.dump());
    by_file[file.get<std::string>()].push_back(name);
  }
  NamedTensors out;
  for (const auto& [file, names] : by_file) {
    const SafetensorsFile f = load_safetensors(dir + "/" + file);
    for (const std::string& n : names) out.emplace_back(n, f.at(n));
  }
  return out;
}

nlohmann::json load_hf_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  try {
    return nlohmann::json::parse(io::read_file(path, kOp));
  } catch (const nlohmann::json::exception& e) {
    TESSEL_FAIL(kOp, "'{}' is not valid JSON: {}", path, e.what());
  }
}

}  // namespace tessel::checkpoint
