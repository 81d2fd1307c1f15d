// Metrics: the JSONL record format and writer, param_hash (its documented
// definition re-implemented here, equality on equal bits, a different hash
// for every single flipped bit), and the progress bar on a TTY and in a log.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "autograd/api.h"
#include "runtime/error.h"
#include "runtime/philox.h"
#include "test/util/runfiles.h"
#include "train/metrics.h"

using namespace tessel;
using namespace tessel::train;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// param_hash as documented in train/metrics.h, written out independently:
// build the byte stream, pad it, append its length, absorb 64-bit words.
uint64_t reference_hash(std::vector<std::pair<std::string, Tensor>> named) {
  std::sort(named.begin(), named.end(), [](auto& a, auto& b) { return a.first < b.first; });
  std::vector<uint8_t> s;
  auto u64 = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) s.push_back(uint8_t(v >> (8 * i)));
  };
  auto str = [&](const std::string& x) {
    u64(x.size());
    s.insert(s.end(), x.begin(), x.end());
  };
  for (auto& [name, t] : named) {
    Tensor c = t.contiguous();
    str(name);
    str(dtype_name(c.dtype()));
    u64(c.dim());
    for (int64_t d : c.shape()) u64(uint64_t(d));
    u64(c.nbytes());
    const auto* p = static_cast<const uint8_t*>(c.raw_data());
    s.insert(s.end(), p, p + c.nbytes());
  }
  const uint64_t len = s.size();
  while (s.size() % 8) s.push_back(0);
  u64(len);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < s.size(); i += 8) {
    uint64_t w = 0;
    for (int k = 0; k < 8; ++k) w |= uint64_t(s[i + k]) << (8 * k);
    h = mix64(h ^ w);
  }
  return h;
}

Tensor floats(std::vector<float> v, Dims shape) { return tensor(v, shape); }

ProgressBar::Options bar_options(int width, int64_t plain_every) {
  ProgressBar::Options o;
  o.width = width;
  o.plain_every = plain_every;
  o.min_interval_s = 0.0;
  return o;
}

void flip_bit(Tensor& t, int64_t bit) {
  auto* p = static_cast<uint8_t*>(t.raw_data());
  p[bit / 8] ^= uint8_t(1u << (bit % 8));
}

}  // namespace

TEST_CASE("StepMetrics: one JSON object per line, fields in a fixed order", "[metrics]") {
  StepMetrics m;
  m.step = 3;
  m.loss = 2.5;
  m.lr = 0.001;
  m.grad_norm = 1.25;
  m.tokens_per_s = 1000;
  m.param_hash = "00000000000000ff";
  m.extras = {{"eval_loss", 2.75}, {"moe_dropped_tokens", 4}};
  CHECK(m.to_json_line() ==
        R"({"step":3,"loss":2.5,"lr":0.001,"grad_norm":1.25,"tokens_per_s":1000.0,"param_hash":"00000000000000ff",)"
        R"("eval_loss":2.75,"moe_dropped_tokens":4.0})");
  StepMetrics sparse;
  sparse.step = 4;
  sparse.loss = NAN;
  CHECK(sparse.to_json_line() == R"({"step":4,"loss":null})");
  StepMetrics back = StepMetrics::from_json_line(m.to_json_line());
  CHECK(back.step == 3);
  CHECK(*back.loss == 2.5);
  CHECK(*back.tokens_per_s == 1000);
  CHECK(back.param_hash == m.param_hash);
  CHECK(back.extra("eval_loss") == 2.75);
  CHECK(back.extra("moe_dropped_tokens") == 4.0);
  CHECK_FALSE(back.extra("nothing").has_value());
}

TEST_CASE("MetricsWriter flushes every line; read_metrics reads them back", "[metrics]") {
  const std::string path = tessel::testing::scratch_dir("metrics") + "/metrics.jsonl";
  {
    MetricsWriter w(path);
    for (int s = 1; s <= 3; ++s) {
      StepMetrics m;
      m.step = s;
      m.loss = 4.0 / s;
      w.write(m);
      // Visible on disk before the writer is closed: whole lines only.
      const std::string now = slurp(path);
      CHECK(std::count(now.begin(), now.end(), '\n') == s);
      CHECK(now.back() == '\n');
    }
  }
  {
    MetricsWriter resume(path, /*append=*/true);
    StepMetrics m;
    m.step = 4;
    m.loss = NAN;
    m.extras = {{"eval_loss", 0.5}};
    resume.write(m);
  }
  auto recs = read_metrics(path);
  REQUIRE(recs.size() == 4);
  CHECK(recs[1].step == 2);
  CHECK(*recs[1].loss == 2.0);
  CHECK(std::isnan(*recs[3].loss));
  CHECK(recs[3].extra("eval_loss") == 0.5);

  std::ofstream(path, std::ios::app) << "{\"step\": 5, \"loss\": 1}\nnot json\n";
  CHECK_THROWS_WITH(read_metrics(path), Catch::Contains("metrics.jsonl:6"));
  CHECK_THROWS_WITH(MetricsWriter("/no/such/dir/m.jsonl"), Catch::Contains("/no/such/dir/m.jsonl"));
}

TEST_CASE("param_hash follows its documented definition", "[metrics][hash]") {
  std::vector<std::pair<std::string, Tensor>> named = {
      {"layers.0.weight", randn({5, 3}, PhiloxKey{1, 2})},
      {"layers.0.bias", floats({1, 2, 3}, {3})},
      {"emb", randn({7}, PhiloxKey{1, 3}).to(DType::BFloat16)},
      {"step", tensor(std::vector<int64_t>{42}, {})},
      {"empty", zeros({0, 4})},
  };
  const uint64_t h = param_hash_u64(named);
  CHECK(h == reference_hash(named));
  CHECK(param_hash(named) == fmt::format(FMT_STRING("{:016x}"), h));
  CHECK(param_hash(named).size() == 16);
  CHECK(hash_hex(0xff) == "00000000000000ff");
  // A fixed input has a fixed hash (a change here changes every recorded hash).
  CHECK(param_hash({{"w", floats({1.0f, -2.0f}, {2})}}) ==
        hash_hex(reference_hash({{"w", floats({1.0f, -2.0f}, {2})}})));
  // Path order: the order of the list does not matter.
  auto shuffled = named;
  std::reverse(shuffled.begin(), shuffled.end());
  CHECK(param_hash_u64(shuffled) == h);
  CHECK_THROWS_WITH(param_hash({{"a", zeros({1})}, {"a", zeros({1})}}), Catch::Contains("duplicate tensor name 'a'"));
  CHECK_THROWS_WITH(param_hash({{"m", empty({2}, TensorOptions(kMeta))}}), Catch::Contains("Meta"));
}

TEST_CASE("param_hash: identical bits, identical hash; any single bit flip, a different hash", "[metrics][hash]") {
  auto make = [] {
    return std::vector<std::pair<std::string, Tensor>>{
        {"a.weight", randn({4, 6}, PhiloxKey{7, 1})},
        {"a.bias", randn({6}, PhiloxKey{7, 2})},
        {"b.scale", randn({3}, PhiloxKey{7, 3}).to(DType::BFloat16)},
    };
  };
  const auto base = make();
  const uint64_t h0 = param_hash_u64(base);
  CHECK(param_hash_u64(make()) == h0);  // separately computed, same bits
  std::set<uint64_t> seen{h0};
  int flips = 0;
  for (size_t p = 0; p < base.size(); ++p) {
    const int64_t bits = int64_t(base[p].second.nbytes()) * 8;
    for (int64_t bit = 0; bit < bits; ++bit) {
      auto v = make();
      v[p].second = v[p].second.clone();
      flip_bit(v[p].second, bit);
      const uint64_t h = param_hash_u64(v);
      CHECK(h != h0);
      seen.insert(h);
      ++flips;
    }
  }
  CHECK(flips == (24 + 6) * 32 + 3 * 16);
  CHECK(int(seen.size()) == flips + 1);  // every flip even gives its own hash
  // -0.0 and +0.0 are equal numbers but different bits.
  CHECK(param_hash({{"z", floats({0.0f}, {1})}}) != param_hash({{"z", floats({-0.0f}, {1})}}));
  // Names, shapes and dtypes are part of the hash, not only the bytes.
  Tensor x = floats({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(param_hash({{"x", x}}) != param_hash({{"y", x}}));
  CHECK(param_hash({{"x", x}}) != param_hash({{"x", x.reshape({3, 2})}}));
  CHECK(param_hash({{"x", floats({1.0f}, {1})}}) != param_hash({{"x", tensor(std::vector<int32_t>{0x3f800000})}}));
  // Moving bytes from one tensor to the next changes the hash (length prefixes).
  CHECK(param_hash({{"a", floats({1, 2}, {2})}, {"b", floats({3}, {1})}}) !=
        param_hash({{"a", floats({1}, {1})}, {"b", floats({2, 3}, {2})}}));
  // A view hashes its logical values.
  Tensor t = floats({1, 2, 3, 4, 5, 6}, {2, 3}).t();
  CHECK(param_hash({{"t", t}}) == param_hash({{"t", t.contiguous()}}));
}

TEST_CASE("param_hash accepts {name, tensor} records (nn::NamedTensor)", "[metrics][hash]") {
  struct Named {
    std::string name;
    Tensor tensor;
  };
  std::vector<Named> v = {{"w", floats({1, 2}, {2})}, {"b", floats({3}, {1})}};
  CHECK(param_hash(v) == param_hash({{"w", v[0].tensor}, {"b", v[1].tensor}}));
}

TEST_CASE("format_duration", "[metrics]") {
  CHECK(format_duration(3723) == "1h02m03s");
  CHECK(format_duration(245) == "4m05s");
  CHECK(format_duration(12.4) == "12s");
  CHECK(format_duration(NAN) == "?");
}

TEST_CASE("ProgressBar rewrites one line on a TTY and prints plain lines otherwise", "[metrics]") {
  double now = 0;
  auto clock = [&now] { return now; };
  SECTION("TTY") {
    char* buf = nullptr;
    size_t len = 0;
    std::FILE* f = open_memstream(&buf, &len);
    {
      ProgressBar bar(100, f, 1, bar_options(10, 0), clock);
      CHECK(bar.is_tty());
      for (int s = 1; s <= 10; ++s) {
        now = s;
        bar.update(s, 2.5, 1000);
      }
      std::fflush(f);
      const std::string out(buf, len);
      CHECK(std::count(out.begin(), out.end(), '\r') == 10);
      CHECK(out.find('\n') == std::string::npos);
      CHECK(out.substr(out.rfind('\r')) == "\r[#.........] step  10/100 ( 10%)  loss 2.5000  1000 tok/s  ETA 1m30s\x1b[K");
      bar.finish();
    }
    std::fclose(f);
    std::string out(buf, len);
    std::free(buf);
    CHECK(out.back() == '\n');
    CHECK(std::count(out.begin(), out.end(), '\n') == 1);  // finish() is idempotent
  }
  SECTION("plain") {
    char* buf = nullptr;
    size_t len = 0;
    std::FILE* f = open_memstream(&buf, &len);
    {
      ProgressBar bar(100, f, 0, bar_options(10, 25), clock);
      for (int s = 1; s <= 100; ++s) {
        now = 2.0 * s;
        bar.update(s, 3.0 - s * 0.01, 12345);
      }
    }
    std::fclose(f);
    std::string out(buf, len);
    std::free(buf);
    CHECK(out.find('\r') == std::string::npos);
    // Steps 1, 25, 50, 75 and 100.
    CHECK(std::count(out.begin(), out.end(), '\n') == 5);
    CHECK_THAT(out, Catch::StartsWith("step   1/100 (  1%)  loss 2.9900  12.3k tok/s  ETA 3m18s\n"));
    CHECK_THAT(out, Catch::EndsWith("step 100/100 (100%)  loss 2.0000  12.3k tok/s  ETA 0s\n"));
  }
}
