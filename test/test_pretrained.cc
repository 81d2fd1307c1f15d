// Fine-tuning and generation from saved weights: `--init-from` a Hugging Face
// folder or a tessel checkpoint gives the same bits on one device and on
// dp=2,tp=2 (bitwise mode), `tessel generate` gives the same tokens on every
// layout, and bad folders, flags and prompts are clear errors.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "autograd/api.h"
#include "checkpoint/hf.h"
#include "checkpoint/load.h"
#include "checkpoint/manager.h"
#include "test/util/runfiles.h"
#include "run/checkpoint.h"
#include "train/atomic_file.h"
#include "train/config.h"
#include "train/data.h"
#include "train/metrics.h"
#include "train/tokenizer.h"
#include "train/trainer/generate.h"
#include "train/trainer/pretrained.h"
#include "train/trainer/trainer.h"

using namespace tessel;
using namespace tessel::train;
namespace fs = std::filesystem;

namespace {

std::string scratch(const std::string& name) {
  static const std::string root = tessel::testing::scratch_dir("pretrained");  // emptied once per process
  return (fs::path(root) / name).string();
}

TrainConfig tiny(const std::string& model, const std::string& out) {
  TrainConfig c;
  c.model = model;
  c.model_config = "tiny";
  c.steps = 3;
  c.batch_size = 8;
  c.seq_len = 32;
  c.eval_every = 0;
  c.sample_length = 0;
  c.out_dir = out;
  return c;
}

// A trained tiny model saved as a tessel run (checkpoint at its last step)
// and as a Hugging Face folder; returns {run folder, HF folder}.
std::pair<std::string, std::string> saved_model(const std::string& model) {
  const std::string run = scratch(model + "_run"), hf = scratch(model + "_hf");
  if (fs::exists(hf)) return {run, hf};
  TrainConfig c = tiny(model, run);
  c.ckpt_every = 3;
  run_training(c, {nullptr, /*quiet=*/true});
  const auto latest = checkpoint::latest_checkpoint(run + "/checkpoints");
  REQUIRE(latest);
  checkpoint::CheckpointReader reader(latest->path);
  checkpoint::NamedTensors params;
  for (const auto& t : reader.meta().tensors)
    if (t.name.rfind("model.", 0) == 0) params.emplace_back(t.name.substr(6), checkpoint::read_tensor(reader, t.name));
  const models::ModelConfig mc = find_pretrained(run).model;
  checkpoint::save_hf(hf, mc, checkpoint::to_hf(mc, params));
  return {run, hf};
}

std::vector<StepMetrics> fine_tune(const std::string& from, const std::string& out, const std::string& mesh) {
  TrainConfig c = tiny("nanogpt", out);  // the family flag is ignored: the folder says llama
  c.init_from = from;
  c.mesh = mesh;
  c.bitwise = true;
  run_training(c, {nullptr, /*quiet=*/true});
  return read_metrics(fs::path(out) / "metrics.jsonl");
}

}  // namespace

TEST_CASE("--init-from: HF folder and checkpoint, one device and dp=2,tp=2, the same bits", "[pretrained]") {
  const auto [run, hf] = saved_model("llama");
  const Pretrained p = find_pretrained(hf);
  CHECK(p.kind == Pretrained::Kind::HuggingFace);
  CHECK(p.model.arch == models::Arch::Llama);
  CHECK(find_pretrained(run).kind == Pretrained::Kind::Checkpoint);  // a run folder: its newest checkpoint
  CHECK(find_pretrained(run + "/checkpoints").path == find_pretrained(run).path);

  const auto one = fine_tune(hf, scratch("ft_hf_1"), "");
  // config.json says what was trained: the folder's family and preset, not
  // the defaults the flags were left at.
  const auto written = nlohmann::json::parse(read_file(scratch("ft_hf_1") + "/config.json", "test"));
  CHECK(written["model"] == "llama");
  CHECK(written["model_config"] == "hf");
  CHECK(written["init_from"] == hf);
  const auto dp_tp = fine_tune(hf, scratch("ft_hf_dptp"), "dp=2,tp=2");
  const auto from_ckpt = fine_tune(run, scratch("ft_ckpt_tp"), "tp=2");
  REQUIRE(one.size() == 3);
  REQUIRE(dp_tp.size() == 3);
  REQUIRE(from_ckpt.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(*one[i].loss == *dp_tp[i].loss);
    CHECK(one[i].param_hash == dp_tp[i].param_hash);
    CHECK(*one[i].loss == *from_ckpt[i].loss);
    CHECK(one[i].param_hash == from_ckpt[i].param_hash);
  }
  // Started from the trained weights: the first loss is the trained model's,
  // well below a fresh model's ln(256) = 5.55.
  TrainConfig fresh = tiny("llama", scratch("fresh"));
  fresh.bitwise = true;
  run_training(fresh, {nullptr, true});
  const auto fresh_m = read_metrics(fs::path(fresh.out_dir) / "metrics.jsonl");
  const auto trained = read_metrics(fs::path(run) / "metrics.jsonl");
  CHECK(*one[0].loss < *fresh_m[0].loss - 0.05);
  CHECK(*one[0].loss < *trained.front().loss);
}

TEST_CASE("--init-from: bad folders and flags are errors naming them", "[pretrained]") {
  const auto [run, hf] = saved_model("llama");
  TrainConfig c = tiny("llama", scratch("bad"));
  c.init_from = scratch("nowhere");
  CHECK_THROWS_WITH(run_training(c, {nullptr, true}), Catch::Contains("is not a directory"));
  fs::create_directories(scratch("empty"));
  c.init_from = scratch("empty");
  CHECK_THROWS_WITH(run_training(c, {nullptr, true}), Catch::Contains("is neither a Hugging Face model folder"));
  c.init_from = hf;
  c.n_layer = 4;
  CHECK_THROWS_WITH(run_training(c, {nullptr, true}), Catch::Contains("drop --n-layer"));
  c.n_layer = 0;
  // --model or --config naming another model than the folder's (a llama
  // model, preset "hf"): errors, not silently the folder's model.
  TrainConfig named = c;
  named.model = "mixtral";
  CHECK_THROWS_WITH(run_training(named, {nullptr, true}),
                    Catch::Contains("holds a llama model") && Catch::Contains("--model mixtral names another family: "
                                                                              "drop --model"));
  named = c;
  named.model = "nanogpt";  // the default, but given as a flag: `--model nanogpt`
  named.given.insert("model");
  CHECK_THROWS_WITH(run_training(named, {nullptr, true}), Catch::Contains("--model nanogpt names another family"));
  named = c;
  named.model_config = "small";
  named.given.insert("model_config");
  CHECK_THROWS_WITH(run_training(named, {nullptr, true}),
                    Catch::Contains("llama model 'hf'") && Catch::Contains("--config small names another preset: "
                                                                           "drop --config"));

  // An architecture tessel does not have, named with the ones it has.
  const std::string other = scratch("bert");
  fs::create_directories(other);
  fs::copy_file(hf + "/model.safetensors", other + "/model.safetensors", fs::copy_options::overwrite_existing);
  std::ofstream(other + "/config.json") << R"({"model_type": "bert", "architectures": ["BertModel"]})";
  c.init_from = other;
  CHECK_THROWS_WITH(run_training(c, {nullptr, true}), Catch::Contains("bert"));

  // A tensor missing, one too many, one of another shape: each named.
  auto edited = [&](const std::string& name, auto edit) {
    const std::string dir = scratch(name);
    fs::create_directories(dir);
    fs::copy_file(hf + "/config.json", dir + "/config.json", fs::copy_options::overwrite_existing);
    auto tensors = checkpoint::load_safetensors(hf + "/model.safetensors").tensors;
    edit(tensors);
    checkpoint::save_safetensors(dir + "/model.safetensors", tensors);
    return dir;
  };
  c.init_from = edited("missing", [](checkpoint::NamedTensors& t) {
    t.erase(std::remove_if(t.begin(), t.end(), [](const auto& nt) { return nt.first == "model.norm.weight"; }),
            t.end());
  });
  CHECK_THROWS_WITH(run_training(c, {nullptr, true}), Catch::Contains("model.norm.weight"));
  c.init_from = edited("extra", [](checkpoint::NamedTensors& t) { t.emplace_back("model.extra.weight", zeros({2})); });
  CHECK_THROWS_WITH(run_training(c, {nullptr, true}), Catch::Contains("model.extra.weight"));
  c.init_from = edited("reshaped", [](checkpoint::NamedTensors& t) {
    for (auto& nt : t)
      if (nt.first == "model.norm.weight") nt.second = zeros({nt.second.numel() + 1});
  });
  CHECK_THROWS_WITH(run_training(c, {nullptr, true}), Catch::Contains("norm"));
}

TEST_CASE("generate: the same tokens on one device, tp=2, pp=2 and dp=2; bad prompts are errors", "[pretrained]") {
  const auto [run, hf] = saved_model("llama");
  GenerateConfig g;
  g.from = run;
  g.prompts = {"Th", "Wh"};
  g.ids = {"65,108,108"};
  g.max_new_tokens = 10;
  g.temperature = 0.9;
  g.top_k = 50;
  g.seed = 7;
  const GenerateResult one = run_generate(g, /*quiet=*/true);
  REQUIRE(one.outputs.size() == 3);
  CHECK(one.outputs[0].prompt_ids == std::vector<int64_t>{'T', 'h'});  // the run's byte tokenizer
  for (const auto& o : one.outputs) CHECK(o.ids.size() == 10);
  CHECK(one.outputs[0].text.size() == 10);
  for (std::string mesh : {"tp=2", "pp=2", "dp=2"}) {
    INFO(mesh);
    g.mesh = mesh;
    const GenerateResult r = run_generate(g, true);
    for (size_t i = 0; i < 3; ++i) CHECK(r.outputs[i].ids == one.outputs[i].ids);
  }
  // The HF folder holds the same weights: the same tokens for the same ids
  // at the same places in the batch (each prompt samples its own stream). It
  // has no tokenizer, so text prompts are an error.
  g.mesh = "";
  g.from = hf;
  CHECK_THROWS_WITH(run_generate(g, true), Catch::Contains("text prompts need a tokenizer"));
  g.prompts.clear();
  g.ids = {"84,104", "87,104", "65,108,108"};
  const GenerateResult from_hf = run_generate(g, true);
  for (size_t i = 0; i < 3; ++i) CHECK(from_hf.outputs[i].ids == one.outputs[i].ids);
  CHECK(from_hf.outputs[0].text.empty());
  // With a tokenizer.json beside the weights (byte-level BPE whose symbol for
  // byte b has id b, no merges: the byte tokenizer's ids), text prompts work.
  {
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = bytes_to_unicode()[size_t(b)];
      std::string utf8 = cp < 0x80 ? std::string(1, char(cp))
                                   : std::string{char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
      vocab[utf8] = b;
    }
    const nlohmann::json level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                                  {"use_regex", true}};
    const nlohmann::json tok = {{"version", "1.0"},      {"added_tokens", nlohmann::json::array()},
                                {"normalizer", nullptr}, {"pre_tokenizer", level},
                                {"post_processor", nullptr}, {"decoder", level},
                                {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
    std::ofstream(hf + "/tokenizer.json") << tok.dump();
  }
  g.prompts = {"Th", "Wh"};
  g.ids = {"65,108,108"};
  const GenerateResult texts = run_generate(g, true);
  for (size_t i = 0; i < 3; ++i) CHECK(texts.outputs[i].ids == one.outputs[i].ids);
  CHECK(texts.outputs[0].text == one.outputs[0].text);
  std::filesystem::remove(hf + "/tokenizer.json");
  g.prompts.clear();
  g.ids = {"1,2,300"};
  CHECK_THROWS_WITH(run_generate(g, true), Catch::Contains("token id 300 is outside the model's vocabulary of 256"));
  g.ids = {"1,x"};
  CHECK_THROWS_WITH(run_generate(g, true), Catch::Contains("\"x\" is not a token id"));
  g.ids = {"1"};
  for (int i = 0; i < 64; ++i) g.ids[0] += ",1";  // 65 tokens
  CHECK_THROWS_WITH(run_generate(g, true), Catch::Contains("has 65 tokens, more than the model's context of 64"));
  // A run folder's context is the sequence length it trained on (32 here).
  g.from = run;
  g.ids = {"1"};
  for (int i = 0; i < 32; ++i) g.ids[0] += ",1";  // 33 tokens
  CHECK_THROWS_WITH(run_generate(g, true), Catch::Contains("context of 32 (the sequence length it was trained on)"));
  // A prompt that fits, with more new tokens than the context leaves: a sliding window.
  g.ids = {"1,2,3"};
  g.max_new_tokens = 40;
  CHECK(run_generate(g, true).outputs[0].ids.size() == 40);
  g.max_new_tokens = 10;
  g.from = hf;
  g.ids.clear();
  CHECK_THROWS_WITH(run_generate(g, true), Catch::Contains("no prompt"));
  CHECK(parse_ids("3,4,5") == std::vector<int64_t>{3, 4, 5});
}

TEST_CASE("tessel train saves its final model by default, so generate --from the run folder works", "[pretrained]") {
  CHECK(TrainConfig::cli_defaults().final_ckpt);
  CHECK(TrainConfig::cli_defaults().model_config == "demo");
  CHECK(!TrainConfig().final_ckpt);  // the library's default
  TrainConfig c = tiny("nanogpt", scratch("final"));
  c.final_ckpt = true;
  run_training(c, {nullptr, true});
  const auto latest = checkpoint::latest_checkpoint(c.checkpoint_root());
  REQUIRE(latest);
  CHECK(latest->step == c.steps);
  GenerateConfig g;
  g.from = c.out_dir;
  g.prompts = {"Hi"};
  g.max_new_tokens = 5;
  CHECK(run_generate(g, true).outputs[0].ids.size() == 5);
  TrainConfig none = tiny("nanogpt", scratch("no_final"));
  run_training(none, {nullptr, true});
  CHECK(!checkpoint::latest_checkpoint(none.checkpoint_root()));
}

TEST_CASE("fine-tuning data: JSONL prompt/completion, loss on completions only, the same bits on dp=2,tp=2",
          "[pretrained][data]") {
  const std::string data = scratch("ft.jsonl");
  {
    std::ofstream f(data);
    for (int i = 0; i < 400; ++i)
      f << nlohmann::json{{"prompt", "Q: " + std::to_string(i) + " + 1?\nA: "}, {"completion", std::to_string(i + 1) + "\n"}}
               .dump()
        << "\n";
    f << "\n" << nlohmann::json{{"text", "plain text counts whole\n"}}.dump() << "\n";
  }
  const ByteTokenizer bytes;
  const Corpus c = load_corpus(data, bytes, 10);
  CHECK(c.num_examples == 401);
  REQUIRE(c.loss_mask);
  // Example 0: "Q: 0 + 1?\nA: " (12 bytes) is prompt, "1\n" the completion; no EOS (bytes have none).
  const std::string first = "Q: 0 + 1?\nA: 1\n";
  for (size_t i = 0; i < first.size(); ++i) {
    CHECK((*c.tokens)[i] == int32_t(uint8_t(first[i])));
    CHECK((*c.loss_mask)[i] == (i >= 13 ? 1 : 0));
  }
  // The loader's targets: masked positions are kIgnoreTarget.
  const DataLoader loader(c.split.train, 16, 4, 1);
  const Batch b = loader.global_batch(0);
  const auto starts = loader.start_positions(0, 0, 4);
  const auto tg = b.targets.to_vector<int64_t>();
  int64_t ignored = 0;
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t t = 0; t < 16; ++t) {
      const int64_t at = starts[size_t(r)] + t + 1;
      const int64_t want = (*c.loss_mask)[size_t(at)] ? (*c.tokens)[size_t(at)] : kIgnoreTarget;
      CHECK(tg[size_t(r * 16 + t)] == want);
      ignored += want == kIgnoreTarget;
    }
  CHECK(ignored > 0);

  // Training on it: one device and dp=2,tp=2 give the same bits; micro-batches are refused.
  auto train_on = [&](const std::string& out, const std::string& mesh) {
    TrainConfig t = tiny("llama", scratch(out));
    t.data = data;
    t.mesh = mesh;
    t.bitwise = true;
    run_training(t, {nullptr, true});
    return read_metrics(fs::path(t.out_dir) / "metrics.jsonl");
  };
  const auto one = train_on("ft1", ""), dptp = train_on("ftdptp", "dp=2,tp=2");
  REQUIRE(one.size() == dptp.size());
  for (size_t i = 0; i < one.size(); ++i) {
    CHECK(*one[i].loss == *dptp[i].loss);
    CHECK(one[i].param_hash == dptp[i].param_hash);
  }
  TrainConfig micro = tiny("llama", scratch("ftmicro"));
  micro.data = data;
  micro.micro_batches = 2;
  CHECK_THROWS_WITH(run_training(micro, {nullptr, true}), Catch::Contains("micro_batches = 2 would average"));

  // Bad lines are errors naming the file and line.
  auto bad = [&](const std::string& name, const std::string& line) {
    const std::string path = scratch(name + ".jsonl");
    std::ofstream(path) << "{\"text\": \"ok\"}\n" << line << "\n";
    return path;
  };
  CHECK_THROWS_WITH(load_corpus(bad("notjson", "{oops"), bytes), Catch::Contains("notjson.jsonl:2: not valid JSON"));
  CHECK_THROWS_WITH(load_corpus(bad("array", "[1, 2]"), bytes), Catch::Contains(":2: each line must be a JSON object"));
  CHECK_THROWS_WITH(load_corpus(bad("half", R"({"prompt": "x"})"), bytes),
                    Catch::Contains("needs both \"prompt\" and \"completion\""));
  CHECK_THROWS_WITH(load_corpus(bad("number", R"({"prompt": "x", "completion": 3})"), bytes),
                    Catch::Contains("\"completion\" must be a string"));
  CHECK_THROWS_WITH(load_corpus(bad("empty", R"({"prompt": "x", "completion": ""})"), bytes),
                    Catch::Contains(":2: the completion is empty"));
  CHECK_THROWS_WITH(load_corpus(bad("keys", R"({"input": "x"})"), bytes), Catch::Contains("got the keys input"));
}

TEST_CASE("tessel::load_weights: a checkpoint's model tensors only, any seed; another model is refused",
          "[pretrained]") {
  const auto [run_dir, hf] = saved_model("llama");
  const auto [gpt_run, gpt_hf] = saved_model("nanogpt");  // trained before this thread holds a Run
  auto build = [](uint64_t seed) {
    std::shared_ptr<models::LanguageModel> m;
    {
      nn::ConstructionScope meta(kMeta);
      m = models::build_model(models::model_config("llama", "tiny"));
    }
    RunOptions o;
    o.seed = seed;  // not the saved run's: load() would refuse it, load_weights does not
    return parallelize(m, adamw({}), o);
  };
  auto from_ckpt = build(99);
  const std::string step_dir = find_pretrained(run_dir).path;
  CHECK(load_weights(step_dir, from_ckpt) > 0);
  CHECK(from_ckpt.step() == 0);
  auto from_hf = build(98);
  load_pretrained_weights(find_pretrained(hf), from_hf);
  CHECK(from_ckpt.param_hash() == from_hf.param_hash());
  CHECK(from_ckpt.param_hash() != build(99).param_hash());
  // A NanoGPT checkpoint into a LLaMA run: named tensors on both sides.
  CHECK_THROWS_WITH(load_weights(find_pretrained(gpt_run).path, from_ckpt),
                    Catch::Contains("a checkpoint of another model"));
}
