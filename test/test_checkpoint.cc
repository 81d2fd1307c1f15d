// Distributed checkpoints (checkpoint/): checksums, the metadata reader, the
// save plan, save on every layout / load on every other (bitwise), replica
// deduplication, async saves, and one test per way a checkpoint can break.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "autograd/api.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/load.h"
#include "checkpoint/manager.h"
#include "checkpoint/metadata.h"
#include "checkpoint/plan.h"
#include "checkpoint/save.h"
#include "dtensor/ops.h"
#include "test/checkpoint/layouts.h"
#include "test/util/runfiles.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::checkpoint;
namespace fs = std::filesystem;

namespace {

// Compares the full values of `got` with `want` bit for bit; "" if equal.
std::string compare_full(const NamedTensors& got, const NamedTensors& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    Tensor g = got[i].second.is_distributed() ? full_tensor(got[i].second) : got[i].second;
    if (!testing::bitwise_equal(g, want[i].second)) return "tensor '" + want[i].first + "' differs";
  }
  return "";
}

void save_layout(const std::string& dir, const std::string& layout, const nlohmann::json& state = {}) {
  const auto& l = testing::ckpt_layout(layout);
  const NamedTensors globals = testing::ckpt_tensors();
  const std::string fail = testing::on_layout(l, [&] {
    save(dir, testing::lay_out(l, globals, false), state.is_null() ? nlohmann::json::object() : state);
    return std::string();
  });
  REQUIRE(fail.empty());
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

}  // namespace

TEST_CASE("crc32c: known value, hardware = table, combine", "[checkpoint]") {
  const std::string s = "123456789";
  CHECK(crc32c(s.data(), s.size()) == 0xe3069283u);
  CHECK(detail::crc32c_extend_portable(0, s.data(), s.size()) == 0xe3069283u);
  std::string big(100003, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = char((i * 131) ^ (i >> 7));
  for (size_t off : {size_t(0), size_t(1), size_t(3), size_t(7)}) {
    const uint32_t hw = crc32c(big.data() + off, big.size() - off);
    CHECK(hw == detail::crc32c_extend_portable(0, big.data() + off, big.size() - off));
  }
  for (size_t cut : {size_t(0), size_t(1), size_t(4096), size_t(99999), big.size()}) {
    const uint32_t a = crc32c(big.data(), cut), b = crc32c(big.data() + cut, big.size() - cut);
    CHECK(crc32c_combine(a, b, big.size() - cut) == crc32c(big.data(), big.size()));
    CHECK(crc32c_extend(a, big.data() + cut, big.size() - cut) == crc32c(big.data(), big.size()));
  }
}

TEST_CASE("save plan: replicas written once, spread over their holders, chunks tile", "[checkpoint]") {
  // 4 ranks as (dp=2, tp=2): w [8, 4] is [R, S(0)]; b [4] is replicated everywhere.
  std::vector<std::vector<PieceInfo>> pieces(4);
  for (int r = 0; r < 4; ++r) {
    const int tp = r % 2;
    pieces[size_t(r)].push_back({"w", DType::Float32, {8, 4}, Box{{tp * 4, 0}, {4, 4}}, "x"});
    pieces[size_t(r)].push_back({"b", DType::Float32, {4}, Box{{0}, {4}}, "x"});
    pieces[size_t(r)].push_back({"z", DType::Float32, {0, 3}, Box{{0, 0}, {0, 3}}, "x"});
  }
  const SavePlan plan = make_save_plan(pieces, 4096);
  REQUIRE(plan.meta.tensors.size() == 3);
  const TensorMeta* w = plan.meta.find("w");
  REQUIRE(w != nullptr);
  CHECK(w->chunks.size() == 2);
  CHECK(plan.meta.find("b")->chunks.size() == 1);
  CHECK(plan.meta.find("z")->chunks.empty());
  size_t chunks = 0;
  int writers = 0;
  for (const auto& wr : plan.writes) {
    chunks += wr.size();
    writers += !wr.empty();
  }
  CHECK(chunks == 3);   // each distinct chunk once
  CHECK(writers == 3);  // the two w halves and b on three different ranks
  CHECK(chunk_key("w", w->chunks[1].box, w->shape) == "w@4,0");
  CHECK(chunk_key("b", Box{{0}, {4}}, Dims{4}) == "b");

  // Disagreeing ranks and holes are errors naming the tensor.
  auto bad = pieces;
  bad[3][1].shape = {5};
  CHECK_THROWS_WITH(make_save_plan(bad, 4096), Catch::Contains("tensor 'b'") && Catch::Contains("rank 3"));
  auto hole = pieces;
  for (auto& p : hole) p[0].box.size = {3, 4};
  CHECK_THROWS_WITH(make_save_plan(hole, 4096), Catch::Contains("tensor 'w'") && Catch::Contains("cover"));
}

TEST_CASE("metadata: round trip and strict parsing", "[checkpoint]") {
  CheckpointMeta m;
  m.world_size = 2;
  m.block_bytes = 4096;
  m.state = {{"step", 3}};
  m.files.push_back({"data-00000.safetensors", 0, 100, 40, 1, 2});
  TensorMeta t{"w", DType::Float32, {2, 3}, "plain", {}};
  t.chunks.push_back({Box{{0, 0}, {2, 3}}, 0, "w", 40, {7}});
  m.tensors.push_back(t);
  const std::string text = metadata_to_json(m);
  const CheckpointMeta back = parse_metadata(text, "m.json");
  CHECK(metadata_to_json(back) == text);
  CHECK(back.find("w")->chunks[0].crc == std::vector<uint32_t>{7});

  using J = nlohmann::json;
  auto fails = [&](const std::function<void(J&)>& mutate, const std::string& msg) {
    J j = J::parse(text);
    mutate(j);
    CHECK_THROWS_WITH(parse_metadata(j.dump(), "m.json"), Catch::Contains("m.json") && Catch::Contains(msg));
  };
  J& (*chunk)(J&) = [](J& j) -> J& { return j["tensors"]["w"]["chunks"][0]; };
  fails([&](J& j) { chunk(j)["sizes"][0] = 1; }, "cover");
  fails([&](J& j) { chunk(j)["offsets"][1] = 1; }, "outside the tensor");
  fails([&](J& j) { chunk(j)["begin"] = 90; }, "outside the data");
  fails([&](J& j) { chunk(j)["file"] = 1; }, "file index");
  fails([&](J& j) { chunk(j)["crc32c"] = J::array(); }, "block CRCs");
  fails([&](J& j) { chunk(j)["crc32c"][0] = -1; }, "non-negative integer");
  fails([&](J& j) { j["files"][0]["name"] = "../x"; }, "not a plain file name");
  fails([&](J& j) { j["files"][0]["header_bytes"] = 101; }, "header_bytes");
  fails([&](J& j) { j["tensors"]["w"]["dtype"] = "F8"; }, "not supported");
  fails([&](J& j) { j["tensors"]["w"]["shape"] = {2, -3}; }, "non-negative");
  fails([&](J& j) { j["version"] = 2; }, "version");
  fails([&](J& j) { j["block_bytes"] = 1000; }, "block_bytes");
  fails([&](J& j) { j["tensors"]["w"]["layuot"] = "x"; }, "unexpected field");
  fails([&](J& j) { j.erase("state"); }, "missing field 'state'");
  CHECK_THROWS_WITH(parse_metadata("{\"a\": 1, \"a\": 2}", "m.json"), Catch::Contains("twice"));
  CHECK_THROWS_WITH(parse_metadata(text.substr(0, text.size() / 2), "m.json"), Catch::Contains("not valid JSON"));
}

TEST_CASE("save on every layout, load on every other: bitwise equal", "[checkpoint]") {
  const NamedTensors globals = testing::ckpt_tensors();
  const std::string root = testing::scratch_dir("ckpt_layouts");
  for (const auto& from : testing::ckpt_layouts()) {
    const std::string dir = root + "/" + from.name;
    save_layout(dir, from.name, {{"layout", from.name}});
    for (const auto& to : testing::ckpt_layouts()) {
      INFO("saved on " << from.name << ", loaded on " << to.name);
      const std::string fail = testing::on_layout(to, [&]() -> std::string {
        NamedTensors targets = testing::lay_out(to, globals, /*zeros=*/true);
        LoadResult r = load(dir, targets);
        if (r.state.value("layout", "") != from.name) return "state lost: " + r.state.dump();
        return compare_full(targets, globals);
      });
      CHECK(fail.empty());
      if (!fail.empty()) FAIL_CHECK(fail);
    }
  }
}

TEST_CASE("replicas are deduplicated: file bytes = unique bytes, writers spread", "[checkpoint]") {
  const std::string root = testing::scratch_dir("ckpt_dedup");
  uint64_t unique = 0;
  for (const auto& [n, t] : testing::ckpt_tensors()) unique += t.nbytes();
  for (const char* layout : {"dp2", "dp2xtp2", "partial2", "single"}) {
    INFO(layout);
    const std::string dir = root + "/" + layout;
    save_layout(dir, layout);
    const CheckpointMeta m = read_metadata(dir);
    uint64_t data = 0, on_disk = 0;
    for (const FileMeta& f : m.files) {
      data += f.bytes - f.header_bytes;
      on_disk += fs::file_size(dir + "/" + f.name);
    }
    CHECK(data == unique);
    CHECK(on_disk == m.total_file_bytes());
    if (std::string(layout) == "dp2") CHECK(m.files.size() == 2);  // both replicas write a share
    // Nothing but the data files and metadata.json is left.
    size_t entries = 0;
    for (const auto& e : fs::directory_iterator(dir)) entries += e.is_regular_file();
    CHECK(entries == m.files.size() + 1);
  }
}

TEST_CASE("a one-rank checkpoint's data file is a plain safetensors file", "[checkpoint]") {
  const std::string dir = testing::scratch_dir("ckpt_plain") + "/c";
  save_layout(dir, "single");
  const SafetensorsFile f = load_safetensors(dir + "/data-00000.safetensors");
  for (const auto& [name, t] : testing::ckpt_tensors()) {
    if (t.numel() == 0) continue;  // empty tensors have no chunk
    INFO(name);
    CHECK(testing::bitwise_equal(f.at(name), t));
  }
}

TEST_CASE("loading reads only the byte ranges it needs", "[checkpoint]") {
  const std::string dir = testing::scratch_dir("ckpt_ranges") + "/c";
  const NamedTensors globals = {{"w", testing::uniform({1024, 1024}, 1)}};  // 4 MiB, 4 blocks
  save(dir, globals);
  CheckpointReader reader(dir);
  const TensorMeta& t = *reader.meta().find("w");
  const uint64_t header = reader.meta().files[0].header_bytes;
  // Rows [256, 512): exactly block 1.
  Tensor rows = raw::empty({256, 1024}, DType::Float32);
  reader.read(t, Box{{256, 0}, {256, 1024}}, rows.raw_data());
  CHECK(testing::bitwise_equal(rows, globals[0].second.slice(0, 256, 512)));
  CHECK(reader.bytes_read() == header + (uint64_t(1) << 20));
  // A few elements of row 1000: one block.
  Tensor bit = raw::empty({1, 3}, DType::Float32);
  reader.read(t, Box{{1000, 5}, {1, 3}}, bit.raw_data());
  CHECK(testing::bitwise_equal(bit, globals[0].second.slice(0, 1000, 1001).slice(1, 5, 8).contiguous()));
  CHECK(reader.bytes_read() == header + (uint64_t(2) << 20));
}

TEST_CASE("async save: training may change the tensors while they are written", "[checkpoint]") {
  const std::string root = testing::scratch_dir("ckpt_async");
  const NamedTensors globals = testing::ckpt_tensors();
  const auto& l = testing::ckpt_layout("dp2xtp2");
  const std::string fail = testing::on_layout(l, [&]() -> std::string {
    NamedTensors live = testing::lay_out(l, globals, false);
    Saver saver;
    for (int step = 1; step <= 3; ++step) {
      saver.save(step_dir(root, step), live, {{"step", step}}, /*async=*/true);
      NoGradGuard ng;
      for (auto& [name, t] : live)  // "training": the next step's values
        if (t.is_floating_point() && t.numel() > 0) Tensor(raw::local_of(t)).add_(1.0);
    }
    saver.wait();
    return "";
  });
  REQUIRE(fail.empty());
  const auto all = list_checkpoints(root);
  REQUIRE(all.size() == 3);
  for (const auto& e : all) {
    NamedTensors targets = testing::lay_out(testing::ckpt_layout("single"), globals, true);
    const LoadResult r = load(e.path, targets);
    CHECK(r.state["step"] == e.step);
    NamedTensors want = globals;
    for (auto& [name, t] : want)
      for (int k = 1; k < e.step; ++k)  // the same roundings as the in-place adds
        if (t.is_floating_point() && t.numel() > 0) t = t + 1.0;
    CHECK(compare_full(targets, want).empty());
  }
}

TEST_CASE("checkpoint directories: latest complete, keep the last K, leftovers removed", "[checkpoint]") {
  const std::string root = testing::scratch_dir("ckpt_manager");
  const NamedTensors t = {{"x", testing::uniform({3}, 1)}};
  for (int s : {10, 20, 30}) save(step_dir(root, s), t, {{"step", s}});
  fs::create_directories(root + "/step-00000040.tmp");  // a crashed save
  fs::create_directories(root + "/step-00000050");      // no metadata: not complete
  fs::create_directories(root + "/other");
  CHECK(latest_checkpoint(root)->step == 30);
  CHECK(list_checkpoints(root).size() == 3);
  CHECK(prune_checkpoints(root, 2) == 2);  // step 10 and the .tmp
  CHECK(list_checkpoints(root).size() == 2);
  CHECK(list_checkpoints(root).front().step == 20);
  CHECK(fs::exists(root + "/other"));
  CHECK(!fs::exists(root + "/step-00000040.tmp"));
  // Saving the same step again replaces it atomically.
  save(step_dir(root, 30), {{"x", testing::uniform({3}, 2)}}, {{"step", 30}});
  NamedTensors x = {{"x", zeros({3})}};
  load(step_dir(root, 30), x);
  CHECK(testing::bitwise_equal(x[0].second, testing::uniform({3}, 2)));
  CHECK(!fs::exists(step_dir(root, 30) + ".tmp"));
}

TEST_CASE("corrupted and truncated checkpoints are refused, naming the file and the tensor", "[checkpoint]") {
  const std::string root = testing::scratch_dir("ckpt_corrupt");
  const std::string good = root + "/good";
  save_layout(good, "dp2xtp2");
  const CheckpointMeta meta = read_metadata(good);
  const NamedTensors globals = testing::ckpt_tensors();
  auto fresh = [&](const std::string& name) {
    const std::string dir = root + "/" + name;
    fs::remove_all(dir);
    fs::copy(good, dir);
    return dir;
  };
  auto load_all = [&](const std::string& dir) {
    NamedTensors targets = testing::lay_out(testing::ckpt_layout("single"), globals, true);
    load(dir, targets);
  };
  // The chunk of "big" and the file holding it.
  const TensorMeta& big = *meta.find("big");
  const ChunkMeta& chunk = big.chunks[0];
  const std::string file = meta.files[size_t(chunk.file)].name;

  SECTION("a flipped bit in a tensor's data") {
    const std::string dir = fresh("flip");
    std::string bytes = read_bytes(dir + "/" + file);
    bytes[size_t(chunk.begin + 12345)] ^= 0x10;
    write_bytes(dir + "/" + file, bytes);
    CHECK_THROWS_WITH(load_all(dir), Catch::Contains(file) && Catch::Contains("tensor 'big'") &&
                                         Catch::Contains("corrupted"));
    CheckpointReader r(dir);
    CHECK_THROWS_WITH(r.verify_all(), Catch::Contains(file) && Catch::Contains("tensor 'big'"));
  }
  SECTION("a truncated file") {
    const std::string dir = fresh("truncated");
    fs::resize_file(dir + "/" + file, chunk.begin + 100);
    CHECK_THROWS_WITH(load_all(dir), Catch::Contains(file) && Catch::Contains("truncated") &&
                                         Catch::Contains("tensor 'big'"));
  }
  SECTION("a missing file") {
    const std::string dir = fresh("missing");
    fs::remove(dir + "/" + file);
    CHECK_THROWS_WITH(load_all(dir), Catch::Contains(file) && Catch::Contains("missing") && Catch::Contains("tensor"));
  }
  SECTION("a corrupted header") {
    const std::string dir = fresh("header");
    std::string bytes = read_bytes(dir + "/" + file);
    bytes[20] = bytes[20] == 'a' ? 'b' : 'a';
    write_bytes(dir + "/" + file, bytes);
    CHECK_THROWS_WITH(load_all(dir), Catch::Contains(file) && Catch::Contains("header"));
  }
  SECTION("a data file grown or replaced") {
    const std::string dir = fresh("grown");
    write_bytes(dir + "/" + file, read_bytes(dir + "/" + file) + "x");
    CHECK_THROWS_WITH(load_all(dir), Catch::Contains(file) && Catch::Contains("changed"));
  }
  SECTION("metadata.json truncated or missing") {
    const std::string dir = fresh("meta");
    const std::string text = read_bytes(dir + "/metadata.json");
    write_bytes(dir + "/metadata.json", text.substr(0, text.size() - 10));
    CHECK_THROWS_WITH(load_all(dir), Catch::Contains("metadata.json") && Catch::Contains("not valid JSON"));
    fs::remove(dir + "/metadata.json");
    CHECK_THROWS_WITH(load_all(dir), Catch::Contains("not a complete checkpoint"));
  }
  SECTION("a target of another shape or dtype, or a tensor the checkpoint lacks") {
    NamedTensors t = {{"a.weight", zeros({7, 13})}};
    CHECK_THROWS_WITH(load(good, t), Catch::Contains("'a.weight'") && Catch::Contains("[13, 7]") &&
                                         Catch::Contains("[7, 13]"));
    NamedTensors d = {{"b", zeros({5})}};
    CHECK_THROWS_WITH(load(good, d), Catch::Contains("'b'") && Catch::Contains("float64"));
    NamedTensors m = {{"nope", zeros({1})}};
    CHECK_THROWS_WITH(load(good, m), Catch::Contains("no tensor 'nope'"));
    LoadOptions o;
    o.allow_missing = true;
    CHECK(load(good, m, o).missing == std::vector<std::string>{"nope"});
  }
  SECTION("the intact copy loads and verifies") {
    CHECK_NOTHROW(load_all(fresh("intact")));
    CheckpointReader r(good);
    CHECK_NOTHROW(r.verify_all());
    uint64_t headers = 0;
    for (const FileMeta& f : meta.files) headers += f.header_bytes;
    CHECK(r.bytes_read() == meta.total_file_bytes() + headers);  // every byte once, headers twice
  }
}
