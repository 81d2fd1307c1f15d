// Hugging Face interop without Python (the transformers check is
// ./tessel conformance --hf): name maps and layout transforms round-trip bit
// for bit, GPT-2's fused/transposed layouts are the documented ones, sharded
// folders with an index load back, config.json round-trips, transformers 5's
// fused Mixtral experts are read, and `tessel ckpt convert/inspect` work on a
// trained run's checkpoint.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "autograd/api.h"
#include "checkpoint/hf.h"
#include "checkpoint/load.h"
#include "checkpoint/manager.h"
#include "models/language_model.h"
#include "test/util/runfiles.h"
#include "test/util/util.h"
#include "train/trainer/trainer.h"

using namespace tessel;
using namespace tessel::checkpoint;
namespace fs = std::filesystem;

namespace {

NamedTensors params_of(const std::string& arch, uint64_t seed, models::ModelConfig* cfg) {
  *cfg = models::model_config(arch, "tiny");
  auto model = models::make_language_model(*cfg, seed);
  NamedTensors out;
  for (const auto& nt : model->named_parameters()) out.emplace_back(nt.name, nt.tensor.detach());
  return out;
}

const Tensor& find(const NamedTensors& v, const std::string& name) {
  for (const auto& [n, t] : v)
    if (n == name) return t;
  throw Error("no " + name);
}

std::string tessel_binary() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  if (srcdir && ws) return std::string(srcdir) + "/" + ws + "/tools/tessel";
  return "bazel-bin/tools/tessel";
}

}  // namespace

TEST_CASE("HF name maps round-trip bit for bit; GPT-2 fuses q|k|v and transposes Conv1D weights", "[checkpoint]") {
  for (const std::string arch : {"nanogpt", "llama", "mixtral"}) {
    INFO(arch);
    models::ModelConfig c;
    const NamedTensors params = params_of(arch, 5, &c);
    const NamedTensors hf = to_hf(c, params);
    const NamedTensors back = from_hf(c, hf);
    REQUIRE(back.size() == params.size());
    for (const auto& [name, t] : params) CHECK(testing::bitwise_equal(find(back, name), t));
    const int64_t C = c.dim;
    if (arch == "nanogpt") {
      const Tensor w = find(hf, "transformer.h.1.attn.c_attn.weight");
      CHECK(w.shape() == Dims{C, 3 * C});
      CHECK(testing::bitwise_equal(w.slice(1, C, 2 * C), find(params, "layers.1.attn.wk.weight").t().contiguous()));
      CHECK(testing::bitwise_equal(find(hf, "transformer.h.0.mlp.c_fc.weight"),
                                   find(params, "layers.0.mlp.fc.weight").t().contiguous()));
      // The hub's original files have no "transformer." prefix, and may store lm_head and the mask buffer.
      NamedTensors bare;
      for (const auto& [n, t] : hf) bare.emplace_back(n.substr(12), t);
      bare.emplace_back("h.0.attn.bias", zeros({1, 1, 4, 4}));
      bare.emplace_back("lm_head.weight", find(params, "wte.weight"));
      const NamedTensors b2 = from_hf(c, bare);
      for (const auto& [name, t] : params) CHECK(testing::bitwise_equal(find(b2, name), t));
    } else {
      // No RoPE permutation: tessel's rotate_half pairing is HF's.
      CHECK(testing::bitwise_equal(find(hf, "model.layers.0.self_attn.q_proj.weight"),
                                   find(params, "layers.0.attn.wq.weight")));
      CHECK(testing::bitwise_equal(find(hf, "lm_head.weight"), find(params, "output.weight")));
    }
    if (arch == "mixtral") {
      CHECK(testing::bitwise_equal(find(hf, "model.layers.1.block_sparse_moe.experts.2.w3.weight"),
                                   find(params, "layers.1.ffn.experts.2.w3.weight")));
      // transformers 5 keeps experts fused in memory: gate_up_proj [E, 2H, D] = w1|w3, down_proj [E, D, H].
      NamedTensors fused;
      for (const auto& [n, t] : hf)
        if (n.find("block_sparse_moe") == std::string::npos) fused.emplace_back(n, t);
      for (int64_t i = 0; i < c.n_layer; ++i) {
        const std::string h = "model.layers." + std::to_string(i) + ".", b = h + "block_sparse_moe.";
        std::vector<Tensor> gu, down;
        for (int64_t e = 0; e < c.num_experts; ++e) {
          const std::string x = b + "experts." + std::to_string(e) + ".";
          gu.push_back(cat({find(hf, x + "w1.weight"), find(hf, x + "w3.weight")}, 0));
          down.push_back(find(hf, x + "w2.weight"));
        }
        fused.emplace_back(h + "mlp.experts.gate_up_proj", stack(gu, 0));
        fused.emplace_back(h + "mlp.experts.down_proj", stack(down, 0));
        fused.emplace_back(h + "mlp.gate.weight", find(hf, b + "gate.weight"));
      }
      const NamedTensors b3 = from_hf(c, fused);
      for (const auto& [name, t] : params) CHECK(testing::bitwise_equal(find(b3, name), t));
    }
    // config.json round trip.
    const models::ModelConfig rc = model_config_from_hf(hf_config_json(c));
    CHECK(rc.arch == c.arch);
    CHECK(rc.dim == c.dim);
    CHECK(rc.n_kv_head == c.n_kv_head);
    CHECK(rc.hidden == c.hidden);
    CHECK(rc.rope_theta == c.rope_theta);
    CHECK(rc.num_experts == c.num_experts);
    CHECK(rc.tie_embeddings == c.tie_embeddings);
    // Errors name the tensor.
    NamedTensors missing(hf.begin() + 1, hf.end());
    CHECK_THROWS_WITH(from_hf(c, missing), Catch::Contains(hf.front().first));
    NamedTensors extra = hf;
    extra.emplace_back("model.something_else", zeros({1}));
    CHECK_THROWS_WITH(from_hf(c, extra), Catch::Contains("unexpected"));
  }
}

TEST_CASE("sharded HF folders: model-0000i-of-0000n.safetensors with an index", "[checkpoint]") {
  models::ModelConfig c;
  const NamedTensors hf = to_hf(c, params_of("llama", 2, &c));
  const std::string dir = testing::scratch_dir("hf_shards");
  save_hf(dir, c, hf, /*max_shard_bytes=*/40000);
  REQUIRE(fs::exists(dir + "/model.safetensors.index.json"));
  REQUIRE(fs::exists(dir + "/config.json"));
  int shards = 0;
  for (const auto& e : fs::directory_iterator(dir)) shards += e.path().filename().string().rfind("model-", 0) == 0;
  CHECK(shards > 2);
  std::ifstream in(dir + "/model.safetensors.index.json");
  const auto index = nlohmann::json::parse(in);
  uint64_t total = 0;
  for (const auto& [n, t] : hf) total += t.nbytes();
  CHECK(index["metadata"]["total_size"] == total);
  CHECK(index["weight_map"].size() == hf.size());
  CHECK(index["weight_map"]["lm_head.weight"].get<std::string>().find(fmt::format(FMT_STRING("-of-{:05d}"), shards)) !=
        std::string::npos);
  const NamedTensors back = load_hf_tensors(dir);
  REQUIRE(back.size() == hf.size());
  for (const auto& [n, t] : hf) CHECK(testing::bitwise_equal(find(back, n), t));
  // One shard: a single model.safetensors.
  const std::string one = testing::scratch_dir("hf_one");
  save_hf(one, c, hf);
  CHECK(fs::exists(one + "/model.safetensors"));
  CHECK(!fs::exists(one + "/model.safetensors.index.json"));
}

TEST_CASE("tessel ckpt convert and inspect on a trained run's checkpoint", "[checkpoint]") {
  const std::string root = testing::scratch_dir("hf_cli");
  train::TrainConfig cfg;
  cfg.model = "llama";
  cfg.model_config = "tiny";
  cfg.steps = 2;
  cfg.batch_size = 4;
  cfg.seq_len = 16;
  cfg.eval_every = 0;
  cfg.sample_length = 0;
  cfg.ckpt_every = 2;
  cfg.ckpt_sync = true;
  cfg.mesh = "tp=2";
  cfg.out_dir = root + "/run";
  train::run_training(cfg, {nullptr, true});
  const std::string ck = root + "/run/checkpoints", bin = tessel_binary();
  REQUIRE(std::system((bin + " ckpt inspect " + ck + " --verify > " + root + "/inspect.txt").c_str()) == 0);
  std::ifstream in(root + "/inspect.txt");
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  CHECK(text.find("model.layers.0.attn.wq.weight") != std::string::npos);
  CHECK(text.find("(tp=2) [S(0)]") != std::string::npos);
  CHECK(text.find("optim.layers.0.attn.wq.weight.exp_avg") != std::string::npos);
  CHECK(text.find("verified") != std::string::npos);

  REQUIRE(std::system((bin + " ckpt convert --to hf " + ck + " " + root + "/hf --max-shard-bytes 30000 > /dev/null")
                          .c_str()) == 0);
  REQUIRE(std::system((bin + " ckpt convert --to tessel " + root + "/hf " + root + "/back > /dev/null").c_str()) == 0);
  CheckpointReader a(latest_checkpoint(ck)->path), b(root + "/back");
  int compared = 0;
  for (const auto& t : a.meta().tensors) {
    if (t.name.rfind("model.", 0) != 0) continue;
    CHECK(testing::bitwise_equal(read_tensor(a, t.name), read_tensor(b, t.name)));
    ++compared;
  }
  CHECK(compared == int(b.meta().tensors.size()));
  CHECK(std::system((bin + " ckpt inspect " + root + "/nothing > /dev/null 2>&1").c_str()) != 0);
}
