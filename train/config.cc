#include "train/config.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include <cmath>
#include <filesystem>
#include <optional>
#include <variant>
#include <vector>

#include "runtime/error.h"

namespace tessel::train {

namespace {

constexpr const char* kOp = "config";

using Member = std::variant<std::string TrainConfig::*, int64_t TrainConfig::*, uint64_t TrainConfig::*,
                            double TrainConfig::*, std::array<double, 2> TrainConfig::*, bool TrainConfig::*>;

struct Field {
  const char* key;   // TOML key; the flag is "--" + key with '_' -> '-'
  Member member;
  const char* help;
};

// One table drives the TOML reader, the flags and to_json.
const std::vector<Field>& fields() {
  using C = TrainConfig;
  static const std::vector<Field> f = {
      {"model", &C::model, "model family"},
      {"model_config", &C::model_config, "size preset of the model family"},
      {"init_from", &C::init_from,
       "fine-tune: start from the weights of a Hugging Face folder, a tessel checkpoint or a run folder (the "
       "model is the folder's; optimizer and schedule start fresh)"},
      {"n_layer", &C::n_layer, "override the preset's layer count (0: preset)"},
      {"dim", &C::dim, "override the preset's model width (0: preset)"},
      {"n_head", &C::n_head, "override the preset's attention heads (0: preset)"},
      {"n_kv_head", &C::n_kv_head, "override the preset's key/value heads (0: preset)"},
      {"hidden", &C::hidden, "override the preset's MLP width (0: preset)"},
      {"dropout", &C::dropout, "override the preset's dropout (-1: preset)"},
      {"capacity_factor", &C::capacity_factor,
       "MoE expert capacity as a multiple of tokens * top_k / experts; slots beyond it are dropped (0: no limit)"},
      {"dtype", &C::dtype,
       "compute dtype: float32 | bfloat16 | float16 (master weights stay float32; float16 scales the loss)"},
      {"loss_scale", &C::loss_scale, "float16: the initial dynamic loss scale (halved after an inf/NaN step)"},
      {"steps", &C::steps, "training steps"},
      {"batch_size", &C::batch_size, "sequences per step (global batch)"},
      {"seq_len", &C::seq_len, "tokens per sequence"},
      {"micro_batches", &C::micro_batches, "gradient-accumulation micro-batches per step"},
      {"lr", &C::lr, "peak learning rate"},
      {"min_lr", &C::min_lr, "minimum learning rate"},
      {"warmup_steps", &C::warmup_steps, "linear warmup steps"},
      {"weight_decay", &C::weight_decay, "AdamW weight decay"},
      {"betas", &C::betas, "AdamW betas: b1,b2"},
      {"grad_clip", &C::grad_clip, "max global gradient norm (0: off)"},
      {"seed", &C::seed, "seed for initialisation, data and sampling"},
      {"eval_every", &C::eval_every,
       "steps between held-out evaluations during training (0: none; the final one after training always runs)"},
      {"eval_batches", &C::eval_batches, "batches per evaluation"},
      {"log_every", &C::log_every, "steps between log lines"},
      {"data", &C::data, "a text file or a folder of text files"},
      {"heldout_percent", &C::heldout_percent, "held-out share of the corpus (the last N%)"},
      {"tokenizer", &C::tokenizer, "byte | gpt2 | hf"},
      {"vocab", &C::vocab, "gpt2 tokenizer: vocab.json"},
      {"merges", &C::merges, "gpt2 tokenizer: merges.txt"},
      {"tokenizer_json", &C::tokenizer_json, "hf tokenizer: a Hugging Face tokenizer.json"},
      {"out_dir", &C::out_dir, "output directory"},
      {"metrics", &C::metrics, "metrics JSONL path (default <out_dir>/metrics.jsonl)"},
      {"sample_length", &C::sample_length, "tokens to sample after training (0: none)"},
      {"temperature", &C::temperature, "sampling temperature (0: greedy)"},
      {"top_k", &C::top_k, "sample among the k most likely tokens (0: all)"},
      {"mesh", &C::mesh,
       "device mesh as named dims, e.g. dp=2,tp=2 (empty: one device); auto: the planner picks the mesh, ZeRO, "
       "micro-batches, sp and recomputation (docs/plan.md)"},
      {"devices", &C::devices, "with --mesh auto: the devices to lay the run out on (0: one per core)"},
      {"backend", &C::backend, "collectives: auto | local (ranks as threads) | mpi (under mpirun)"},
      {"plan", &C::plan, "parallel plan: auto | nanogpt | llama | mixtral | none | FILE.json"},
      {"sequence_parallel", &C::sequence_parallel, "shard the residual stream along the sequence over tp"},
      {"bitwise", &C::bitwise, "bitwise mode: any mesh gives the one-device run's bits"},
      {"profile", &C::profile, "print a per-op time profile of the training steps (rank 0; also TESSEL_PROFILE=1)"},
      {"detect_anomaly", &C::detect_anomaly,
       "stop at the first op, backward or optimizer update that yields an inf/NaN, naming it (slow; finding a NaN)"},
      {"dump", &C::dump, "write per-op forward/backward tensor hashes to FILE (compare with tessel verify)"},
      {"trace", &C::trace,
       "write a timeline (ops, collectives, waits, pipeline, memory) to FILE, every rank merged, for chrome://tracing "
       "or ui.perfetto.dev; each rank's alone to FILE with .rank<r> before the extension (docs/trace.md)"},
      {"trace_steps", &C::trace_steps, "steps the --trace timeline covers, from the first (0: every step)"},
      {"compile", &C::compile,
       "compile mode: record the step's kernels and collectives at steps 2 and 3, replay them from step 4 with no dispatch (the same "
       "bits; with MoE layers: the attention layers only, mixed mode; docs/compile.md)"},
      {"no_fusion", &C::no_fusion,
       "compile mode without fusion: every launch replays alone (fused elementwise chains are the default; the same "
       "bits either way; docs/compile.md)"},
      {"compile_modules", &C::compile_modules,
       "mixed mode: record and replay these modules, forward and backward, the rest eager: none | attention | "
       "blocks (the same bits, on every layout; docs/compile.md)"},
      {"pipeline_schedule", &C::pipeline_schedule, "pipeline schedule with a pp mesh dim: gpipe | 1f1b | interleaved"},
      {"virtual_stages", &C::virtual_stages, "chunks of layers per pp rank (interleaved; 0: 1, or 2 for interleaved)"},
      {"pipeline_split", &C::pipeline_split, "cut the blocks into pipeline stages by: layers | params"},
      {"zero", &C::zero, "data parallelism over dp: 0 DDP | 1 ZeRO-1 | 2 ZeRO-2 | 3 FSDP"},
      {"recompute", &C::recompute,
       "activation recomputation: none | selective (attention cores) | full (each block keeps only its input); same "
       "bits"},
      {"ddp_bucket_mb", &C::ddp_bucket_mb, "gradient bucket size in MiB (DDP, ZeRO-1/2); 0: one per parameter"},
      {"ckpt_every", &C::ckpt_every, "steps between checkpoints (0: none); the last step saves too"},
      {"final_ckpt", &C::final_ckpt,
       "save the final model even with ckpt_every = 0 (<out>/checkpoints/step-N, which `tessel generate --from "
       "<out>` and --init-from read; tessel train's default)"},
      {"keep_last", &C::keep_last, "complete checkpoints to keep (0: all)"},
      {"resume", &C::resume, "continue from the newest complete checkpoint in ckpt_dir, on this run's mesh"},
      {"ckpt_dir", &C::ckpt_dir, "checkpoint directory (default <out_dir>/checkpoints)"},
      {"ckpt_sync", &C::ckpt_sync, "write checkpoints on the training thread (default: in the background)"},
  };
  return f;
}

std::string flag_name(const char* key) {
  std::string s = std::string("--") + key;
  for (char& c : s)
    if (c == '_') c = '-';
  return s;
}

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

const char* toml_type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a floating-point number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date/time";
  }
}

std::optional<double> toml_number(const toml::node& n) {
  if (auto v = n.value_exact<double>()) return *v;
  if (auto v = n.value_exact<int64_t>()) return double(*v);
  return std::nullopt;
}

}  // namespace

void TrainConfig::load_toml(const std::string& path) {
  std::error_code ec;
  TESSEL_CHECK(std::filesystem::is_regular_file(path, ec), kOp, "config file '{}' does not exist", path);
  toml::table table;
  try {
    table = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    TESSEL_FAIL(kOp, "{}:{}:{}: TOML syntax error: {}", path, e.source().begin.line, e.source().begin.column,
                e.description());
  }
  for (auto&& [k, node] : table) {
    const std::string key(k.str());
    const Field* field = nullptr;
    for (const Field& f : fields())
      if (key == f.key) field = &f;
    const auto line = node.source().begin.line;
    TESSEL_CHECK(field != nullptr, kOp, "unknown key '{}' in '{}' (line {})", key, path, line);
    given.insert(key);
    auto wrong = [&](const char* expected) {
      TESSEL_FAIL(kOp, "key '{}' in '{}' (line {}) must be {}, got {}", key, path, line, expected,
                  toml_type_name(node));
    };
    std::visit(Overloaded{
                   [&](std::string TrainConfig::*m) {
                     auto v = node.value_exact<std::string>();
                     if (!v) wrong("a string");
                     this->*m = *v;
                   },
                   [&](int64_t TrainConfig::*m) {
                     auto v = node.value_exact<int64_t>();
                     if (!v) wrong("an integer");
                     this->*m = *v;
                   },
                   [&](uint64_t TrainConfig::*m) {
                     auto v = node.value_exact<int64_t>();
                     if (!v) wrong("a non-negative integer");
                     TESSEL_CHECK(*v >= 0, kOp, "key '{}' in '{}' (line {}) must be a non-negative integer, got {}",
                                  key, path, line, *v);
                     this->*m = uint64_t(*v);
                   },
                   [&](double TrainConfig::*m) {
                     auto v = toml_number(node);
                     if (!v) wrong("a number");
                     this->*m = *v;
                   },
                   [&](bool TrainConfig::*m) {
                     auto v = node.value_exact<bool>();
                     if (!v) wrong("a boolean");
                     this->*m = *v;
                   },
                   [&](std::array<double, 2> TrainConfig::*m) {
                     const toml::array* arr = node.as_array();
                     if (!arr || arr->size() != 2) wrong("an array of two numbers");
                     for (size_t i = 0; i < 2; ++i) {
                       auto v = toml_number(*arr->get(i));
                       if (!v) wrong("an array of two numbers");
                       (this->*m)[i] = *v;
                     }
                   },
               },
               field->member);
  }
}

TrainConfig TrainConfig::from_toml(const std::string& path) {
  TrainConfig c;
  c.load_toml(path);
  return c;
}

void TrainConfig::validate() const {
  auto positive = [](const char* name, int64_t v) {
    TESSEL_CHECK(v > 0, kOp, "{} must be positive, got {}", name, v);
  };
  auto non_negative = [](const char* name, double v) {
    TESSEL_CHECK(std::isfinite(v) && v >= 0, kOp, "{} must be a finite number >= 0, got {}", name, v);
  };
  auto one_of = [](const char* name, const std::string& v, std::initializer_list<const char*> allowed) {
    for (const char* a : allowed)
      if (v == a) return;
    TESSEL_FAIL(kOp, "{} must be one of {}, got '{}'", name, fmt::join(allowed, " | "), v);
  };
  auto non_empty = [](const char* name, const std::string& v) {
    TESSEL_CHECK(!v.empty(), kOp, "{} must not be empty", name);
  };
  for (auto [name, v] : {std::pair<const char*, int64_t>{"n_layer", n_layer}, {"dim", dim}, {"n_head", n_head},
                         {"n_kv_head", n_kv_head}, {"hidden", hidden}})
    TESSEL_CHECK(v >= 0, kOp, "{} must be >= 0 (0 keeps the preset), got {}", name, v);
  TESSEL_CHECK(dropout == -1 || (dropout >= 0 && dropout < 1), kOp,
               "dropout must be in [0, 1) (or -1 to keep the preset), got {}", dropout);
  non_negative("capacity_factor", capacity_factor);
  non_empty("model", model);
  non_empty("model_config", model_config);
  one_of("dtype", dtype, {"float32", "bfloat16", "float16"});
  TESSEL_CHECK(loss_scale > 0 && std::isfinite(loss_scale), kOp, "loss_scale must be a finite number > 0, got {}",
               loss_scale);
  TESSEL_CHECK(dtype == "float16" || loss_scale == TrainConfig{}.loss_scale, kOp,
               "loss_scale = {} applies to dtype float16 only (loss scaling), got dtype {}", loss_scale, dtype);
  positive("steps", steps);
  positive("batch_size", batch_size);
  positive("seq_len", seq_len);
  positive("micro_batches", micro_batches);
  TESSEL_CHECK(batch_size % micro_batches == 0, kOp, "batch_size ({}) must be divisible by micro_batches ({})",
               batch_size, micro_batches);
  non_negative("lr", lr);
  non_negative("min_lr", min_lr);
  TESSEL_CHECK(min_lr <= lr, kOp, "min_lr ({}) must not exceed lr ({})", min_lr, lr);
  TESSEL_CHECK(warmup_steps >= 0, kOp, "warmup_steps must be >= 0, got {}", warmup_steps);
  non_negative("weight_decay", weight_decay);
  for (int i = 0; i < 2; ++i) {
    TESSEL_CHECK(betas[i] >= 0 && betas[i] < 1, kOp, "betas[{}] must be in [0, 1), got {}", i, betas[i]);
  }
  non_negative("grad_clip", grad_clip);
  TESSEL_CHECK(eval_every >= 0, kOp, "eval_every must be >= 0, got {}", eval_every);
  if (eval_every > 0) {
    positive("eval_batches", eval_batches);
    TESSEL_CHECK(heldout_percent > 0, kOp, "heldout_percent must be > 0 when eval_every > 0 (got {})",
                 heldout_percent);
  }
  positive("log_every", log_every);
  non_empty("data", data);
  TESSEL_CHECK(heldout_percent >= 0 && heldout_percent < 100, kOp, "heldout_percent must be in [0, 100), got {}",
               heldout_percent);
  one_of("recompute", recompute, {"none", "selective", "full"});
  one_of("compile_modules", compile_modules, {"none", "attention", "blocks"});
  TESSEL_CHECK(recompute == "none" || zero < 3, kOp,
               "recompute = {} with zero = 3: FSDP's parameter gathering does not combine with recomputation yet; "
               "use zero <= 2",
               recompute);
  one_of("tokenizer", tokenizer, {"byte", "gpt2", "hf"});
  if (tokenizer == "gpt2") {
    TESSEL_CHECK(!vocab.empty(), kOp, "vocab must name a vocab.json file when tokenizer = gpt2");
    TESSEL_CHECK(!merges.empty(), kOp, "merges must name a merges.txt file when tokenizer = gpt2");
  }
  if (tokenizer == "hf") {
    TESSEL_CHECK(!tokenizer_json.empty(), kOp,
                 "tokenizer_json (--tokenizer-json) must name a Hugging Face tokenizer.json file when tokenizer = hf");
  } else {
    TESSEL_CHECK(tokenizer_json.empty(), kOp,
                 "tokenizer_json = '{}' applies to tokenizer = hf only, got tokenizer = {}", tokenizer_json, tokenizer);
  }
  non_empty("out_dir", out_dir);
  TESSEL_CHECK(sample_length >= 0, kOp, "sample_length must be >= 0, got {}", sample_length);
  non_negative("temperature", temperature);
  TESSEL_CHECK(top_k >= 0, kOp, "top_k must be >= 0, got {}", top_k);
  one_of("backend", backend, {"auto", "local", "mpi"});
  non_empty("plan", plan);
  one_of("pipeline_schedule", pipeline_schedule, {"gpipe", "1f1b", "interleaved"});
  TESSEL_CHECK(virtual_stages >= 0, kOp, "virtual_stages must be >= 0 (0: automatic), got {}", virtual_stages);
  one_of("pipeline_split", pipeline_split, {"layers", "params"});
  TESSEL_CHECK(devices >= 0, kOp, "devices must be >= 0, got {}", devices);
  TESSEL_CHECK(devices == 0 || mesh == "auto", kOp, "devices = {} applies to mesh = auto only, got mesh '{}'", devices,
               mesh);
  // "auto" is replaced by the planner's mesh (and ZeRO) before anything runs.
  const auto dims = mesh == "auto" ? std::vector<std::pair<std::string, int64_t>>{} : parse_mesh(mesh);
  TESSEL_CHECK(zero >= 0 && zero <= 3, kOp, "zero must be 0 (DDP), 1, 2 or 3 (FSDP), got {}", zero);
  non_negative("ddp_bucket_mb", ddp_bucket_mb);
  if (zero > 0 && mesh != "auto") {
    bool dp = false;
    for (const auto& d : dims) dp = dp || (d.first == "dp" && d.second > 1);
    TESSEL_CHECK(dp, kOp, "zero = {} needs a mesh with a dp dim of size > 1 (e.g. --mesh dp=2), got mesh '{}'", zero,
                 mesh);
  }
  TESSEL_CHECK(ckpt_every >= 0, kOp, "ckpt_every must be >= 0, got {}", ckpt_every);
  TESSEL_CHECK(keep_last >= 0, kOp, "keep_last must be >= 0, got {}", keep_last);
}

std::vector<std::pair<std::string, int64_t>> parse_mesh(const std::string& spec) {
  std::vector<std::pair<std::string, int64_t>> dims;
  if (spec.empty()) return dims;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    if (comma == std::string::npos) comma = spec.size();
    const std::string part = spec.substr(pos, comma - pos);
    const size_t eq = part.find('=');
    TESSEL_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < part.size(), kOp,
                 "mesh '{}': '{}' is not NAME=SIZE (e.g. dp=2,tp=2)", spec, part);
    const std::string name = part.substr(0, eq), size = part.substr(eq + 1);
    TESSEL_CHECK(size.find_first_not_of("0123456789") == std::string::npos && std::stoll(size) > 0, kOp,
                 "mesh '{}': the size of '{}' must be a positive integer, got '{}'", spec, name, size);
    for (const auto& d : dims) TESSEL_CHECK(d.first != name, kOp, "mesh '{}': dim '{}' appears twice", spec, name);
    dims.emplace_back(name, std::stoll(size));
    pos = comma + 1;
  }
  return dims;
}

TrainConfig TrainConfig::cli_defaults() {
  TrainConfig c;
  c.model_config = "demo";
  c.steps = 2000;
  c.lr = 5e-3;
  c.min_lr = 5e-4;
  c.warmup_steps = 50;
  c.final_ckpt = true;
  return c;
}

std::string TrainConfig::to_json(int indent) const {
  nlohmann::ordered_json j;
  for (const Field& f : fields()) {
    std::visit([&](auto m) { j[f.key] = this->*m; }, f.member);
  }
  return j.dump(indent);
}

std::string TrainConfig::metrics_path() const {
  if (!metrics.empty()) return metrics;
  return (std::filesystem::path(out_dir) / "metrics.jsonl").string();
}

std::string TrainConfig::checkpoint_root() const {
  if (!ckpt_dir.empty()) return ckpt_dir;
  return (std::filesystem::path(out_dir) / "checkpoints").string();
}

DType TrainConfig::param_dtype() const {
  if (dtype == "bfloat16") return DType::BFloat16;
  if (dtype == "float16") return DType::Float16;
  TESSEL_CHECK(dtype == "float32", kOp, "dtype must be one of float32 | bfloat16 | float16, got '{}'", dtype);
  return DType::Float32;
}

void add_train_options(CLI::App& app, TrainConfig& cfg) {
  // Defined first so that its callback (loading the file) runs before the
  // flags' callbacks: CLI11 runs option callbacks in definition order after
  // parsing, whatever the order on the command line.
  app.add_option_function<std::string>(
         "--config-file",
         [&cfg](const std::string& path) {
           try {
             cfg.load_toml(path);
           } catch (const Error& e) {
             throw CLI::FileError(e.what());
           }
         },
         "TOML file with training settings (flags override it)")
      ->type_name("FILE");
  for (const Field& f : fields()) {
    // The spelling: --config NAME is the model preset, --out DIR the output folder.
    std::string flag = flag_name(f.key);
    if (f.key == std::string("model_config")) flag = "--config," + flag;
    if (f.key == std::string("out_dir")) flag = "--out," + flag;
    std::visit(Overloaded{
                   [&](bool TrainConfig::*m) {
                     app.add_flag_function(
                         flag,
                         [&cfg, m, key = f.key](int64_t n) {
                           cfg.*m = n > 0;
                           cfg.given.insert(key);
                         },
                         f.help);
                   },
                   [&](std::array<double, 2> TrainConfig::*m) {
                     app.add_option_function<std::vector<double>>(
                            flag,
                            [&cfg, m, key = f.key](const std::vector<double>& v) {
                              (cfg.*m) = {v[0], v[1]};
                              cfg.given.insert(key);
                            },
                            f.help)
                         ->expected(2)
                         ->delimiter(',')
                         ->default_str(fmt::format(FMT_STRING("{},{}"), (cfg.*m)[0], (cfg.*m)[1]));
                   },
                   [&](auto m) {
                     using T = std::remove_reference_t<decltype(cfg.*m)>;
                     // --help shows each flag's default (cfg's value when the flags are registered).
                     app.add_option_function<T>(
                            flag,
                            [&cfg, m, key = f.key](const T& v) {
                              cfg.*m = v;
                              cfg.given.insert(key);
                            },
                            f.help)
                         ->default_str(fmt::format(FMT_STRING("{}"), cfg.*m));
                   },
               },
               f.member);
  }
}

}  // namespace tessel::train
