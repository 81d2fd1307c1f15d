// Reading a Hugging Face folder piece by piece (checkpoint/hf_reader.h): each
// rank's pieces equal the slices of from_hf's whole tensors bit for bit, for
// GPT-2's transposed and fused layouts, LLaMA, and both Mixtral layouts, from
// float32 and bf16 files; a rank reads exactly its pieces' bytes; counting
// on Meta tensors gives the bytes a real read takes; and a LLaMA-7B folder
// (headers only, sparse data) shows what each rank of several layouts reads.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "autograd/api.h"
#include "checkpoint/file_io.h"
#include "checkpoint/hf.h"
#include "checkpoint/hf_reader.h"
#include "dtensor/ops.h"
#include "models/language_model.h"
#include "nn/parallel/parallelize.h"
#include "nn/parallel/pipeline/partition.h"
#include "nn/parallel/plan.h"
#include "test/util/dist.h"
#include "test/util/runfiles.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::checkpoint;
namespace fs = std::filesystem;

namespace {

// A tiny model's parameters, saved as an HF folder (in `dtype`, sharded in
// small files), and the whole tensors from_hf makes of them.
struct Folder {
  models::ModelConfig config;
  std::string dir;
  std::map<std::string, Tensor> expected;  // tessel name -> from_hf's tensor (float32)
};

Folder save_tiny(const std::string& arch, DType dtype, const std::string& name,
                 const std::function<void(NamedTensors&)>& edit = nullptr) {
  Folder f;
  f.config = models::model_config(arch, "tiny").resolved();
  auto model = models::make_language_model(f.config, 7);
  NamedTensors params;
  for (const auto& nt : model->named_parameters()) params.emplace_back(nt.name, nt.tensor.detach());
  NamedTensors hf = to_hf(f.config, params);
  for (auto& [n, t] : hf) t = t.to(dtype);
  if (edit) edit(hf);
  f.dir = testing::scratch_dir("hfp_" + name);
  save_hf(f.dir, f.config, hf, /*max_shard_bytes=*/30000);
  for (auto& [n, t] : from_hf(f.config, hf)) f.expected.emplace(n, t.to(DType::Float32));
  return f;
}

// transformers 5's fused experts: mlp.gate, mlp.experts.gate_up_proj [E, 2H, D], down_proj [E, D, H].
void fuse_experts(const models::ModelConfig& c, NamedTensors& hf) {
  std::map<std::string, Tensor> m(hf.begin(), hf.end());
  NamedTensors out;
  for (const auto& [n, t] : hf)
    if (n.find("block_sparse_moe") == std::string::npos) out.emplace_back(n, t);
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string h = "model.layers." + std::to_string(i) + ".";
    out.emplace_back(h + "mlp.gate.weight", m.at(h + "block_sparse_moe.gate.weight"));
    std::vector<Tensor> gu, down;
    for (int64_t e = 0; e < c.num_experts; ++e) {
      const std::string x = h + "block_sparse_moe.experts." + std::to_string(e) + ".";
      gu.push_back(cat({m.at(x + "w1.weight"), m.at(x + "w3.weight")}, 0).unsqueeze(0));
      down.push_back(m.at(x + "w2.weight").unsqueeze(0));
    }
    out.emplace_back(h + "mlp.experts.gate_up_proj", cat(gu, 0).contiguous());
    out.emplace_back(h + "mlp.experts.down_proj", cat(down, 0).contiguous());
  }
  hf = out;
}

// Every parameter of `f`'s model, laid out on `dims` by the model's plan,
// filled by load_hf on each rank: each local piece must be the slice of the
// expected tensor, and the bytes read exactly the pieces' bytes.
std::string check_pieces(const Folder& f, const std::vector<Mesh::DimSpec>& dims, DType file_dtype) {
  const int n = testing::mesh_size(dims);
  const auto reports = testing::on_ranks(n, [&](int) -> std::string {
    testing::RankReport report;
    MeshPtr mesh = Mesh::world(dims);
    std::shared_ptr<models::LanguageModel> model;
    {
      nn::ConstructionScope meta(kMeta);
      model = models::build_model(f.config);
    }
    parallel::parallelize(*model, mesh, parallel::load_plan(models::arch_name(f.config.arch)));
    model->materialize(kCPU);
    NamedTensors targets, counted;
    uint64_t piece_bytes = 0;
    for (const auto& nt : model->named_parameters()) {
      targets.emplace_back(nt.name, nt.tensor);
      Tensor(raw::local_of(nt.tensor)).fill_(-1.0);
      piece_bytes += uint64_t(raw::local_of(nt.tensor).numel()) * itemsize(file_dtype);
    }
    HfFolderReader counter(f.dir);
    const HfLoadResult c = load_hf(counter, f.config, targets, {/*count_only=*/true});
    HfFolderReader reader(f.dir);
    const HfLoadResult r = load_hf(reader, f.config, targets);
    report.expect(r.tensors == targets.size(), "filled " + std::to_string(r.tensors) + " tensors");
    report.expect(r.bytes_read == piece_bytes, "read " + std::to_string(r.bytes_read) + " bytes of data, the pieces hold " +
                                                    std::to_string(piece_bytes));
    report.expect(c.bytes_read == r.bytes_read, "count_only counted " + std::to_string(c.bytes_read) + " bytes, the read took " +
                                                     std::to_string(r.bytes_read));
    for (const auto& [name, t] : targets) {
      const Tensor want = t.is_distributed() ? distribute_tensor(f.expected.at(name), mesh, t.placements()).dist().local
                                             : f.expected.at(name);
      report.expect(testing::bitwise_equal(raw::local_of(t), want), "'" + name + "' differs from its slice");
    }
    return report.str();
  });
  return testing::first_failure(reports);
}

}  // namespace

TEST_CASE("hf pieces: whole tensors equal from_hf; every rank's pieces are slices, read with exactly their bytes",
          "[checkpoint]") {
  struct Case {
    std::string arch, name;
    DType dtype;
    bool fused = false;
  };
  for (const Case& k : {Case{"nanogpt", "gpt2", DType::Float32}, Case{"llama", "llama", DType::BFloat16},
                        Case{"mixtral", "mixtral", DType::Float32}, Case{"mixtral", "mixtral_fused", DType::Float32, true}}) {
    SECTION(k.name) {
      const Folder f = save_tiny(k.arch, k.dtype, k.name, [&](NamedTensors& hf) {
        if (k.fused) fuse_experts(models::model_config(k.arch, "tiny").resolved(), hf);
      });
      // Whole tensors into plain targets.
      NamedTensors plain;
      for (const auto& [n, t] : f.expected) plain.emplace_back(n, zeros(t.shape()));
      HfFolderReader reader(f.dir);
      const HfLoadResult r = load_hf(reader, f.config, plain);
      CHECK(r.tensors == f.expected.size());
      for (const auto& [n, t] : plain) CHECK(testing::bitwise_equal(t, f.expected.at(n)));
      CHECK(reader.bytes_read() > reader.tensor_bytes());  // + the headers
      // GPT-2's wte is read once for itself; LLaMA's tied-free head too: data = the folder's tensors.
      CHECK(r.bytes_read == reader.tensor_bytes());
      for (const auto& dims : std::vector<std::vector<Mesh::DimSpec>>{{{"tp", 2}}, {{"dp", 2}, {"tp", 2}}}) {
        INFO(k.name << " on " << dims.size() << "-d mesh");
        CHECK(check_pieces(f, dims, k.dtype) == "");
      }
    }
  }
}

TEST_CASE("hf pieces: bad folders and targets are errors naming the tensor, shard and folder", "[checkpoint]") {
  const Folder f = save_tiny("llama", DType::Float32, "bad");
  REQUIRE(fs::exists(f.dir + "/model.safetensors.index.json"));
  NamedTensors plain;
  for (const auto& [n, t] : f.expected) plain.emplace_back(n, zeros(t.shape()));
  {
    // A shard the index names is gone.
    const std::string dir = testing::scratch_dir("hfp_missing");
    fs::copy(f.dir, dir, fs::copy_options::recursive);
    std::string victim;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().rfind("model-00002", 0) == 0) victim = e.path().string();
    REQUIRE(!victim.empty());
    fs::remove(victim);
    CHECK_THROWS_WITH(HfFolderReader(dir), Catch::Contains("model-00002") && Catch::Contains("is missing"));
  }
  {
    // A shard-named file the index does not list (a leftover of another save).
    const std::string dir = testing::scratch_dir("hfp_extra");
    fs::copy(f.dir, dir, fs::copy_options::recursive);
    std::string first;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().rfind("model-00001", 0) == 0) first = e.path().string();
    REQUIRE(!first.empty());
    fs::copy_file(first, dir + "/model-00009-of-00009.safetensors");
    CHECK_THROWS_WITH(HfFolderReader(dir), Catch::Contains("'model-00009-of-00009.safetensors' is not in"));
  }
  {
    // The index puts a tensor in a shard that does not hold it.
    const std::string dir = testing::scratch_dir("hfp_index");
    fs::copy(f.dir, dir, fs::copy_options::recursive);
    std::ifstream in(dir + "/model.safetensors.index.json");
    auto index = nlohmann::json::parse(in);
    in.close();
    // Move a tensor that shares its shard (so every shard stays listed) to another shard.
    std::map<std::string, int> per_file;
    for (const auto& [n, file] : index["weight_map"].items()) per_file[file.get<std::string>()]++;
    std::string moved, to;
    for (const auto& [n, file] : index["weight_map"].items()) {
      if (moved.empty() && per_file[file.get<std::string>()] > 1) moved = n;
      if (!moved.empty() && to.empty() && file != index["weight_map"][moved]) to = file.get<std::string>();
    }
    REQUIRE(!moved.empty());
    REQUIRE(!to.empty());
    index["weight_map"][moved] = to;
    std::ofstream(dir + "/model.safetensors.index.json") << index.dump();
    CHECK_THROWS_WITH(HfFolderReader(dir), Catch::Contains("'" + moved + "' in '" + to + "'") &&
                                               Catch::Contains("does not hold it"));
  }
  HfFolderReader reader(f.dir);
  // A target of another shape names the tensor; nothing is written.
  NamedTensors wrong = plain;
  for (auto& [n, t] : wrong)
    if (n == "norm.weight") t = zeros({t.size(0) + 1});
  CHECK_THROWS_WITH(load_hf(reader, f.config, wrong), Catch::Contains("'norm.weight'") && Catch::Contains("model.norm.weight"));
  for (const auto& [n, t] : wrong) CHECK(testing::bitwise_equal(t, zeros(t.shape())));
  // A target the folder has no tensor for.
  NamedTensors extra = plain;
  extra.emplace_back("layers.0.attn.nothing", zeros({2}));
  CHECK_THROWS_WITH(load_hf(reader, f.config, extra), Catch::Contains("no weight for 'layers.0.attn.nothing'"));
  // A Meta target without count_only.
  NamedTensors meta = {{"norm.weight", raw::empty(f.expected.at("norm.weight").shape(), DType::Float32, kMeta)}};
  CHECK_THROWS_WITH(load_hf(reader, f.config, meta), Catch::Contains("Meta tensor"));
  // The folder read as another model: the map names what it misses.
  models::ModelConfig other = f.config;
  other.n_layer += 1;
  CHECK_THROWS_WITH(load_hf(reader, other.resolved(), plain), Catch::Contains("layers." + std::to_string(f.config.n_layer)));
}

namespace {

// An HF folder for `config` whose files hold real headers and no data: each
// shard is extended to its size with ftruncate (a sparse file, no disk
// blocks). Readers see every header and size; count_only never reads data.
std::string sparse_hf_folder(const models::ModelConfig& config, DType dtype, uint64_t max_shard_bytes,
                             const std::string& name) {
  std::shared_ptr<models::LanguageModel> model;
  {
    nn::ConstructionScope meta(kMeta);
    model = models::build_model(config);
  }
  NamedTensors params;
  for (const auto& nt : model->named_parameters()) params.emplace_back(nt.name, nt.tensor);
  std::vector<std::vector<TensorSpec>> shards(1);
  uint64_t in_shard = 0;
  for (const auto& [n, t] : to_hf(config, params)) {
    const uint64_t bytes = uint64_t(t.numel()) * itemsize(dtype);
    if (in_shard > 0 && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(TensorSpec{n, dtype, t.shape()});
    in_shard += bytes;
  }
  const std::string dir = testing::scratch_dir(name);
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    char file[64];
    std::snprintf(file, sizeof file, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    const SafetensorsLayout layout = safetensors_layout(shards[s]);
    io::File out(dir + "/" + file, O_WRONLY | O_CREAT | O_TRUNC, "test");
    out.write_all(layout.header.data(), layout.header.size(), "test");
    REQUIRE(::ftruncate(out.fd(), off_t(layout.file_size)) == 0);
    for (const TensorSpec& t : shards[s]) weight_map[t.name] = file;
  }
  std::ofstream(dir + "/model.safetensors.index.json") << nlohmann::json{{"weight_map", weight_map}}.dump();
  std::ofstream(dir + "/config.json") << hf_config_json(config).dump();
  return dir;
}

}  // namespace

TEST_CASE("hf pieces: what each rank reads of a LLaMA-7B folder (Meta model, sparse files)", "[checkpoint]") {
  const models::ModelConfig c = models::model_config("llama", "llama-7b").resolved();
  const std::string dir = sparse_hf_folder(c, DType::BFloat16, uint64_t(5) << 30, "hfp_llama7b");
  uint64_t total = 0;
  {
    HfFolderReader reader(dir);
    total = reader.tensor_bytes();
  }
  CHECK(total == uint64_t(6738415616) * 2);  // LLaMA-7B's 6.74 B parameters in bf16
  struct Layout {
    std::string name;
    int tp = 1, pp = 1;
  };
  // Per layout: the largest and smallest bytes a rank reads.
  std::vector<std::string> rows;
  for (const Layout& l : {Layout{"tp=2", 2, 1}, Layout{"tp=8", 8, 1}, Layout{"pp=4", 1, 4}, Layout{"tp=8,pp=4", 8, 4}}) {
    const int n = l.tp * l.pp;
    std::vector<uint64_t> bytes(size_t(n), 0);
    const auto reports = testing::on_ranks(n, [&](int rank) -> std::string {
      std::vector<Mesh::DimSpec> dims;
      if (l.pp > 1) dims.push_back({"pp", l.pp});
      if (l.tp > 1) dims.push_back({"tp", l.tp});
      MeshPtr mesh = Mesh::world(dims);
      std::shared_ptr<models::LanguageModel> model;
      {
        nn::ConstructionScope meta(kMeta);
        model = models::build_model(c);
      }
      parallel::parallelize(*model, mesh, parallel::load_plan("llama"));
      // The pipeline's cut by layers: stage s holds its blocks, the first the
      // embedding, the last the norm and the head.
      const auto part = parallel::pipeline::partition_by_layers(c.n_layer, l.pp);
      const int stage = l.pp > 1 ? mesh->coordinate(0) : 0;
      NamedTensors held;
      for (const auto& nt : model->named_parameters()) {
        bool mine = true;
        if (nt.name.rfind("layers.", 0) == 0) {
          const int64_t layer = std::stoll(nt.name.substr(7));
          mine = layer >= part.begin(stage) && layer < part.end(stage);
        } else if (nt.name.rfind("tok_embeddings", 0) == 0) {
          mine = stage == 0;
        } else {
          mine = stage == l.pp - 1;
        }
        if (mine) held.emplace_back(nt.name, nt.tensor);
      }
      HfFolderReader reader(dir);
      load_hf(reader, c, held, {/*count_only=*/true});
      bytes[size_t(rank)] = reader.bytes_read();
      return "";
    });
    REQUIRE(testing::first_failure(reports) == "");
    const uint64_t most = *std::max_element(bytes.begin(), bytes.end());
    const uint64_t least = *std::min_element(bytes.begin(), bytes.end());
    // Each rank reads about its share: at most 1/n of the model plus what it
    // holds whole (norms; the first/last stage's embedding or head pieces).
    CHECK(double(most) < double(total) / n * 1.3 + (64 << 10) * 1.0);
    CHECK(double(least) > double(total) / n * 0.6);
    rows.push_back(fmt::format(FMT_STRING("{:>10}  {:>2} ranks  most {:8.1f} MiB  least {:8.1f} MiB  ({:.3f} / {:.3f} of {:.1f} MiB)"),
                               l.name, n, most / 1048576.0, least / 1048576.0, double(most) / total,
                               double(least) / total, total / 1048576.0));
  }
  for (const auto& r : rows) WARN(r);
}
