#include <algorithm>
// TrainConfig: TOML loading, flags overriding the file (whatever their order
// on the command line), errors naming the key/flag/field, validation, JSON,
// and a run that fails validation creating nothing on disk.
#include <catch2/catch.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "runtime/error.h"
#include "test/util/runfiles.h"
#include "train/atomic_file.h"
#include "train/config.h"

using namespace tessel;
using namespace tessel::train;

namespace {

std::string write_toml(const std::string& name, const std::string& content) {
  static const std::string dir = tessel::testing::scratch_dir("train_config");
  const std::string path = dir + "/" + name;
  std::ofstream(path) << content;
  return path;
}

// Parses a command line with add_train_options; returns the config.
TrainConfig parse(std::vector<std::string> args) {
  TrainConfig cfg;
  CLI::App app{"test"};
  add_train_options(app, cfg);
  std::vector<const char*> argv = {"train"};
  for (auto& a : args) argv.push_back(a.c_str());
  app.parse(int(argv.size()), argv.data());
  return cfg;
}

std::string parse_error(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string validation_error(const std::function<void(TrainConfig&)>& edit) {
  TrainConfig c;
  edit(c);
  try {
    c.validate();
  } catch (const Error& e) {
    return e.what();
  }
  return "(valid)";
}

const char* kGoodToml = R"(# a small run
model = "nanogpt"
model_config = "gpt2-mini"
steps = 500
batch_size = 16
seq_len = 128
micro_batches = 4
lr = 1e-3
min_lr = 0          # an integer is fine for a float field
warmup_steps = 50
weight_decay = 0.05
betas = [0.8, 0.99]
grad_clip = 0.5
seed = 1234
dtype = "bfloat16"
eval_every = 25
eval_batches = 3
log_every = 5
data = "corpus.txt"
heldout_percent = 5.0
tokenizer = "gpt2"
vocab = "vocab.json"
merges = "merges.txt"
out_dir = "runs/x"
metrics = "m.jsonl"
sample_length = 64
temperature = 0.0
top_k = 0
)";

}  // namespace

TEST_CASE("TrainConfig defaults are valid", "[config]") {
  TrainConfig c;
  CHECK_NOTHROW(c.validate());
  CHECK(c.metrics_path() == "runs/latest/metrics.jsonl");
  CHECK(c.param_dtype() == DType::Float32);
}

TEST_CASE("TrainConfig::load_toml reads every field", "[config]") {
  TrainConfig c = TrainConfig::from_toml(write_toml("good.toml", kGoodToml));
  CHECK(c.model == "nanogpt");
  CHECK(c.model_config == "gpt2-mini");
  CHECK(c.steps == 500);
  CHECK(c.batch_size == 16);
  CHECK(c.seq_len == 128);
  CHECK(c.micro_batches == 4);
  CHECK(c.lr == 1e-3);
  CHECK(c.min_lr == 0.0);
  CHECK(c.warmup_steps == 50);
  CHECK(c.weight_decay == 0.05);
  CHECK(c.betas[0] == 0.8);
  CHECK(c.betas[1] == 0.99);
  CHECK(c.grad_clip == 0.5);
  CHECK(c.seed == 1234);
  CHECK(c.dtype == "bfloat16");
  CHECK(c.param_dtype() == DType::BFloat16);
  CHECK(c.eval_every == 25);
  CHECK(c.eval_batches == 3);
  CHECK(c.log_every == 5);
  CHECK(c.data == "corpus.txt");
  CHECK(c.heldout_percent == 5.0);
  CHECK(c.tokenizer == "gpt2");
  CHECK(c.vocab == "vocab.json");
  CHECK(c.merges == "merges.txt");
  CHECK(c.out_dir == "runs/x");
  CHECK(c.metrics_path() == "m.jsonl");
  CHECK(c.sample_length == 64);
  CHECK(c.temperature == 0.0);
  CHECK(c.top_k == 0);
  CHECK_NOTHROW(c.validate());
  // Absent keys keep their defaults.
  TrainConfig d = TrainConfig::from_toml(write_toml("partial.toml", "steps = 7\n"));
  CHECK(d.steps == 7);
  CHECK(d.lr == TrainConfig().lr);
}

TEST_CASE("TOML errors name the key and the file", "[config]") {
  auto err = [](const std::string& name, const std::string& content) {
    const std::string path = write_toml(name, content);
    try {
      TrainConfig::from_toml(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  CHECK_THAT(err("unknown.toml", "steps = 10\nlearning_rate = 0.1\n"),
             Catch::Contains("unknown key 'learning_rate'") && Catch::Contains("unknown.toml") &&
                 Catch::Contains("line 2"));
  CHECK_THAT(err("type.toml", "steps = \"many\"\n"),
             Catch::Contains("key 'steps'") && Catch::Contains("type.toml") && Catch::Contains("must be an integer") &&
                 Catch::Contains("got a string"));
  CHECK_THAT(err("float_int.toml", "batch_size = 1.5\n"),
             Catch::Contains("key 'batch_size'") && Catch::Contains("got a floating-point number"));
  CHECK_THAT(err("lr.toml", "lr = \"fast\"\n"), Catch::Contains("key 'lr'") && Catch::Contains("must be a number"));
  CHECK_THAT(err("betas.toml", "betas = [0.9]\n"),
             Catch::Contains("key 'betas'") && Catch::Contains("an array of two numbers"));
  CHECK_THAT(err("seed.toml", "seed = -1\n"), Catch::Contains("key 'seed'") && Catch::Contains("non-negative"));
  CHECK_THAT(err("name.toml", "model = 3\n"), Catch::Contains("key 'model'") && Catch::Contains("must be a string"));
  CHECK_THAT(err("syntax.toml", "steps = 10\nlr = = 3\n"),
             Catch::Contains("syntax.toml:2") && Catch::Contains("TOML syntax error"));
  CHECK_THAT(err("table.toml", "[optim]\nlr = 1\n"), Catch::Contains("unknown key 'optim'"));
  try {
    TrainConfig::from_toml("/no/such/config.toml");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("/no/such/config.toml") && Catch::Contains("does not exist"));
  }
}

TEST_CASE("flags override the file, whatever their position", "[config]") {
  const std::string path = write_toml("base.toml", "steps = 500\nlr = 0.001\nbatch_size = 16\nbetas = [0.8, 0.99]\n");
  // File only.
  TrainConfig a = parse({"--config-file", path});
  CHECK(a.steps == 500);
  CHECK(a.lr == 0.001);
  CHECK(a.seq_len == TrainConfig().seq_len);  // neither: default
  // Flag after the file, and flag before the file: the flag wins both times.
  TrainConfig b = parse({"--config-file", path, "--steps", "20", "--betas", "0.5,0.6"});
  TrainConfig c = parse({"--steps", "20", "--betas", "0.5,0.6", "--config-file", path});
  for (const TrainConfig* t : {&b, &c}) {
    CHECK(t->steps == 20);
    CHECK(t->betas[0] == 0.5);
    CHECK(t->betas[1] == 0.6);
    CHECK(t->lr == 0.001);        // from the file
    CHECK(t->batch_size == 16);   // from the file
  }
  // Flags without a file.
  TrainConfig d = parse({"--lr", "3e-4", "--model-config", "gpt2-small", "--dtype", "bfloat16", "--seed", "9",
                         "--out-dir", "runs/y", "--top-k", "5"});
  CHECK(d.lr == 3e-4);
  CHECK(d.model_config == "gpt2-small");
  CHECK(d.dtype == "bfloat16");
  CHECK(d.seed == 9);
  CHECK(d.out_dir == "runs/y");
  CHECK(d.top_k == 5);
  // The issue's spellings: --config NAME (model preset) and --out DIR.
  TrainConfig e = parse({"--model", "llama", "--config", "small", "--out", "runs/z"});
  CHECK(e.model == "llama");
  CHECK(e.model_config == "small");
  CHECK(e.out_dir == "runs/z");
  // What was asked for, as against left at its default: `given` (the key names).
  CHECK(e.given == std::set<std::string>{"model", "model_config", "out_dir"});
  CHECK(e.was_given("model"));
  CHECK_FALSE(e.was_given("steps"));
  CHECK(b.given == std::set<std::string>{"steps", "lr", "batch_size", "betas"});  // the file's keys and the flags'
  CHECK(parse({"--bitwise"}).given == std::set<std::string>{"bitwise"});
  CHECK(parse({}).given.empty());
  CHECK(e.to_json().find("given") == std::string::npos);  // not a setting
  // A Hugging Face tokenizer.json (tessel train --tokenizer hf --tokenizer-json FILE).
  TrainConfig f = parse({"--tokenizer", "hf", "--tokenizer-json", "models/llama/tokenizer.json"});
  CHECK(f.tokenizer == "hf");
  CHECK(f.tokenizer_json == "models/llama/tokenizer.json");
  CHECK_NOTHROW(f.validate());
}

TEST_CASE("add_train_options works on a subcommand (tessel train ...)", "[config]") {
  const std::string path = write_toml("sub.toml", "steps = 500\nseq_len = 32\n");
  TrainConfig cfg;
  CLI::App app{"tessel"};
  CLI::App* train = app.add_subcommand("train", "train a model");
  add_train_options(*train, cfg);
  std::vector<const char*> argv = {"tessel", "train", "--steps", "3", "--config-file", path.c_str()};
  app.parse(int(argv.size()), argv.data());
  CHECK(cfg.steps == 3);
  CHECK(cfg.seq_len == 32);
}

TEST_CASE("bad flags and bad files through the CLI are clear errors", "[config]") {
  CHECK_THAT(parse_error({"--steps", "abc"}), Catch::Contains("--steps") && Catch::Contains("abc"));
  CHECK_THAT(parse_error({"--lr", "fast"}), Catch::Contains("--lr") && Catch::Contains("fast"));
  CHECK_THAT(parse_error({"--betas", "0.9"}), Catch::Contains("--betas"));
  CHECK_THAT(parse_error({"--stepz", "3"}), Catch::Contains("--stepz"));
  const std::string bad = write_toml("cli_bad.toml", "stepz = 3\n");
  CHECK_THAT(parse_error({"--config-file", bad}), Catch::Contains("unknown key 'stepz'") && Catch::Contains("cli_bad.toml"));
}

TEST_CASE("validate names the offending field", "[config]") {
  CHECK_THAT(validation_error([](TrainConfig& c) { c.steps = 0; }), Catch::Contains("steps must be positive, got 0"));
  CHECK_THAT(validation_error([](TrainConfig& c) { c.batch_size = -4; }), Catch::Contains("batch_size must be positive"));
  CHECK_THAT(validation_error([](TrainConfig& c) { c.seq_len = 0; }), Catch::Contains("seq_len must be positive"));
  CHECK_THAT(validation_error([](TrainConfig& c) { c.micro_batches = 3; }),
             Catch::Contains("batch_size (32) must be divisible by micro_batches (3)"));
  CHECK_THAT(validation_error([](TrainConfig& c) { c.lr = -1; }), Catch::Contains("lr must be a finite number >= 0"));
  CHECK_THAT(validation_error([](TrainConfig& c) { c.lr = NAN; }), Catch::Contains("lr must be"));
  CHECK_THAT(validation_error([](TrainConfig& c) { c.min_lr = 1; }), Catch::Contains("min_lr (1) must not exceed lr"));
  CHECK_THAT(validation_error([](TrainConfig& c) { c.betas[1] = 1.0; }), Catch::Contains("betas[1] must be in [0, 1)"));
  CHECK_THAT(validation_error([](TrainConfig& c) { c.dtype = "float64"; }),
             Catch::Contains("dtype must be one of float32 | bfloat16 | float16, got 'float64'"));
  CHECK(validation_error([](TrainConfig& c) { c.dtype = "float16"; }) == "(valid)");
  CHECK_THAT(validation_error([](TrainConfig& c) { c.loss_scale = 0; }),
             Catch::Contains("loss_scale must be a finite number > 0, got 0"));
  CHECK_THAT(validation_error([](TrainConfig& c) { c.loss_scale = 1024; }),
             Catch::Contains("loss_scale = 1024 applies to dtype float16 only (loss scaling), got dtype float32"));
  CHECK(validation_error([](TrainConfig& c) { c.dtype = "float16", c.loss_scale = 1024; }) == "(valid)");
  CHECK_THAT(validation_error([](TrainConfig& c) { c.tokenizer = "gpt2"; }), Catch::Contains("vocab must name"));
  CHECK_THAT(validation_error([](TrainConfig& c) { c.tokenizer = "hf"; }),
             Catch::Contains("tokenizer_json (--tokenizer-json) must name a Hugging Face tokenizer.json file when "
                             "tokenizer = hf"));
  CHECK(validation_error([](TrainConfig& c) { c.tokenizer = "hf", c.tokenizer_json = "t.json"; }) == "(valid)");
  CHECK_THAT(validation_error([](TrainConfig& c) { c.tokenizer_json = "t.json"; }),
             Catch::Contains("tokenizer_json = 't.json' applies to tokenizer = hf only, got tokenizer = byte"));
  CHECK_THAT(validation_error([](TrainConfig& c) { c.tokenizer = "sentencepiece"; }),
             Catch::Contains("tokenizer must be one of byte | gpt2 | hf, got 'sentencepiece'"));
  CHECK_THAT(validation_error([](TrainConfig& c) { c.heldout_percent = 0; }),
             Catch::Contains("heldout_percent must be > 0 when eval_every > 0"));
  CHECK_THAT(validation_error([](TrainConfig& c) { c.temperature = -0.5; }), Catch::Contains("temperature"));
  CHECK_THAT(validation_error([](TrainConfig& c) { c.top_k = -1; }), Catch::Contains("top_k must be >= 0"));
  CHECK_THAT(validation_error([](TrainConfig& c) { c.out_dir = ""; }), Catch::Contains("out_dir must not be empty"));
  CHECK(validation_error([](TrainConfig& c) { c.eval_every = 0, c.heldout_percent = 0; }) == "(valid)");
  CHECK_THAT(validation_error([](TrainConfig& c) { c.zero = 4; }), Catch::Contains("zero must be 0 (DDP), 1, 2 or 3"));
  CHECK_THAT(validation_error([](TrainConfig& c) { c.zero = 3, c.mesh = "tp=2"; }),
             Catch::Contains("zero = 3 needs a mesh with a dp dim of size > 1"));
  CHECK_THAT(validation_error([](TrainConfig& c) { c.ddp_bucket_mb = -1; }), Catch::Contains("ddp_bucket_mb"));
  CHECK_THAT(validation_error([](TrainConfig& c) { c.compile_modules = "all"; }), Catch::Contains("compile_modules"));
  CHECK(validation_error([](TrainConfig& c) { c.zero = 2, c.mesh = "dp=2,tp=2"; }) == "(valid)");
}

TEST_CASE("to_json holds every field and loads back through TOML", "[config]") {
  TrainConfig c;
  c.steps = 77;
  c.betas = {0.7, 0.8};
  c.model_config = "m";
  auto j = nlohmann::json::parse(c.to_json());
  const std::vector<std::string> keys = {
      "model", "model_config", "init_from", "n_layer", "dim", "n_head", "n_kv_head", "hidden", "dropout", "dtype", "loss_scale",
      "steps", "batch_size", "seq_len", "micro_batches", "lr", "min_lr", "warmup_steps", "weight_decay",
      "betas", "grad_clip", "seed", "eval_every", "eval_batches", "log_every", "data", "heldout_percent",
      "tokenizer", "vocab", "merges", "tokenizer_json", "out_dir", "metrics", "sample_length", "temperature", "top_k",
      "mesh", "devices", "backend", "plan", "sequence_parallel", "bitwise", "profile", "detect_anomaly", "dump", "trace", "trace_steps", "compile", "no_fusion", "compile_modules", "pipeline_schedule",
      "virtual_stages", "pipeline_split",
      "zero", "recompute", "ddp_bucket_mb", "capacity_factor",
      "ckpt_every", "final_ckpt", "keep_last", "resume", "ckpt_dir", "ckpt_sync"};
  std::vector<std::string> got;
  for (auto it = j.begin(); it != j.end(); ++it) got.push_back(it.key());
  std::sort(got.begin(), got.end());
  std::vector<std::string> want = keys;
  std::sort(want.begin(), want.end());
  CHECK(got == want);
  CHECK(j["steps"] == 77);
  CHECK(j["betas"] == nlohmann::json::array({0.7, 0.8}));
  CHECK(j["model_config"] == "m");
  CHECK(j["seed"] == 1);
  CHECK(j["data"] == "/usr/share/games/fortunes");
  // Every JSON key is a valid TOML key of the file format.
  std::string toml;
  for (auto it = j.begin(); it != j.end(); ++it) toml += it.key() + " = " + it.value().dump() + "\n";
  TrainConfig back = TrainConfig::from_toml(write_toml("roundtrip.toml", toml));
  CHECK(back.to_json() == c.to_json());
}

TEST_CASE("a run that fails validation creates nothing", "[config]") {
  const std::string root = tessel::testing::scratch_dir("no_output");
  TrainConfig c;
  c.out_dir = root + "/run1";
  c.steps = -5;
  // The trainer's order: validate, then create the directory and write files atomically.
  auto start_run = [](const TrainConfig& cfg) {
    cfg.validate();
    OutputDir out(cfg.out_dir);
    out.write("config.json", cfg.to_json());
  };
  CHECK_THROWS_WITH(start_run(c), Catch::Contains("steps must be positive"));
  CHECK_FALSE(std::filesystem::exists(c.out_dir));
  CHECK(std::filesystem::is_empty(root));
  c.steps = 5;
  start_run(c);
  CHECK(std::filesystem::exists(c.out_dir + "/config.json"));
  CHECK_FALSE(std::filesystem::exists(c.out_dir + "/config.json.tmp"));
}

TEST_CASE("AtomicFile: a file is either the previous complete version or the new one", "[config][atomic]") {
  namespace fs = std::filesystem;
  const std::string dir = tessel::testing::scratch_dir("atomic");
  const std::string path = dir + "/state.json";
  write_file_atomic(path, "v1");
  CHECK(read_file(path) == "v1");
  {
    AtomicFile f(path);
    f.write("v2, half written");
    CHECK(fs::exists(path + ".tmp"));
    CHECK(read_file(path) == "v1");  // untouched until commit
  }  // destroyed without commit (an error path)
  CHECK(read_file(path) == "v1");
  CHECK_FALSE(fs::exists(path + ".tmp"));
  try {
    AtomicFile f(path);
    f.write("partial");
    throw std::runtime_error("training diverged");
  } catch (const std::runtime_error&) {
  }
  CHECK(read_file(path) == "v1");
  CHECK_FALSE(fs::exists(path + ".tmp"));
  {
    AtomicFile f(path);
    f.write("v");
    f.write("3");
    f.commit();
    CHECK_THROWS_WITH(f.commit(), Catch::Contains("already committed"));
  }
  CHECK(read_file(path) == "v3");
  CHECK_THROWS_WITH(write_file_atomic(dir + "/missing/x.json", "x"), Catch::Contains("missing/x.json.tmp"));
  CHECK_THROWS_WITH(read_file(dir + "/nothing"), Catch::Contains("nothing") && Catch::Contains("no such file"));

  // OutputDir touches nothing until written to; leftover temporaries can be swept.
  OutputDir out(dir + "/nested/run");
  CHECK_FALSE(out.exists());
  CHECK_FALSE(fs::exists(dir + "/nested"));
  out.write("config.json", "{}");
  CHECK(read_file(out.path("config.json")) == "{}");
  std::ofstream(out.path("ckpt.safetensors.tmp")) << "crashed";
  CHECK(out.remove_temporaries() == 1);
  CHECK_FALSE(fs::exists(out.path("ckpt.safetensors.tmp")));
  CHECK(fs::exists(out.path("config.json")));
}
