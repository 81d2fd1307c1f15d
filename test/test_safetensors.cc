// checkpoint/safetensors: round trips of every dtype and layout, the file
// layout the format prescribes, and one test per way a file can be broken
// (each must give a tessel::Error naming the file and the tensor).
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "autograd/api.h"
#include "checkpoint/safetensors.h"
#include "runtime/error.h"
#include "test/util/runfiles.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::checkpoint;
using tessel::testing::bitwise_equal;

namespace {

// A file made of a header text (unpadded) and data bytes.
std::string make_file(const std::string& json, const std::string& data = "") {
  std::string out(8, '\0');
  uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  return out + json + data;
}

std::string bytes_of(std::initializer_list<int32_t> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.begin(), s.size());
  return s;
}

uint64_t header_len(const std::string& file) {
  uint64_t n;
  std::memcpy(&n, file.data(), 8);
  return n;
}

#define CHECK_PARSE_FAILS(json, data, ...) \
  CHECK_THROWS_WITH(parse_safetensors(make_file(json, data), "bad.safetensors"), __VA_ARGS__)

}  // namespace

TEST_CASE("safetensors round-trips every dtype bit for bit", "[safetensors]") {
  NamedTensors in = {
      {"f64", testing::uniform({3, 4}, 1, -2, 2, DType::Float64)},
      {"f32", testing::uniform({5}, 2, -2, 2, DType::Float32)},
      {"f16", testing::uniform({2, 3}, 3, -2, 2, DType::Float16)},
      {"bf16", testing::uniform({7}, 4, -2, 2, DType::BFloat16)},
      {"i64", testing::randint({2, 2}, 5, -1000000, 1000000, DType::Int64)},
      {"i32", testing::randint({3}, 6, -1000, 1000, DType::Int32)},
      {"bool", testing::randint({5}, 7, 0, 2, DType::Int32).to(DType::Bool)},
      {"scalar", scalar_tensor(3.5)},
      {"empty", zeros({0, 3})},
  };
  const std::map<std::string, std::string> meta{{"format", "pt"}, {"step", "10"}};
  const std::string dir = testing::scratch_dir("safetensors_roundtrip");
  const std::string path = dir + "/all.safetensors";
  save_safetensors(path, in, meta);
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));

  SafetensorsFile f = load_safetensors(path);
  CHECK(f.metadata == meta);
  REQUIRE(f.tensors.size() == in.size());
  for (const auto& [name, t] : in) {
    INFO(name);
    REQUIRE(f.contains(name));
    CHECK(bitwise_equal(f.at(name), t.contiguous()));
  }
  CHECK(f.at("scalar").dim() == 0);
  CHECK(f.at("empty").shape() == Dims{0, 3});
  CHECK_THROWS_WITH(f.at("nope"), Catch::Contains("no tensor 'nope'") && Catch::Contains(path));

  // The same bytes from memory, and a second save replaces the file.
  const std::string bytes = serialize_safetensors(in, meta);
  std::ifstream file(path, std::ios::binary);
  CHECK(std::string(std::istreambuf_iterator<char>(file), {}) == bytes);
  save_safetensors(path, {{"only", ones({2})}});
  CHECK(load_safetensors(path).tensors.size() == 1);
}

TEST_CASE("safetensors layout: 8-aligned header, aligned data, larger items first", "[safetensors]") {
  NamedTensors in = {{"b", ones({3}, DType::Bool)}, {"h", ones({3}, DType::Float16)}, {"d", ones({1}, DType::Float64)},
                     {"f", ones({2}, DType::Float32)}};
  const std::string bytes = serialize_safetensors(in);
  const uint64_t n = header_len(bytes);
  CHECK(n % 8 == 0);
  CHECK(bytes.size() == 8 + n + 3 + 6 + 8 + 8);
  const std::string header = bytes.substr(8, n);
  // Data order: F64, F32, F16, BOOL.
  CHECK(header.find("\"d\"") < header.find("\"f\""));
  CHECK(header.find("\"f\"") < header.find("\"h\""));
  CHECK(header.find("\"h\"") < header.find("\"b\""));
  CHECK(header.find("\"data_offsets\":[0,8]") != std::string::npos);
  CHECK(header.find("\"dtype\":\"BF16\"") == std::string::npos);
  SafetensorsFile f = parse_safetensors(bytes);
  CHECK(f.tensors[0].first == "d");
  CHECK(f.tensors[3].first == "b");
}

TEST_CASE("safetensors saves non-contiguous tensors in row-major order", "[safetensors]") {
  Tensor base = testing::uniform({4, 6}, 11);
  NamedTensors in = {
      {"transposed", base.t()},
      {"strided", base.slice(1, 1, 6, 2)},
      {"broadcast", testing::uniform({1, 3}, 12).expand({4, 3})},
      {"permuted", testing::uniform({2, 3, 4}, 13, -1, 1, DType::Float64).permute({2, 0, 1})},
      {"column", base.select(1, 2)},
  };
  SafetensorsFile f = parse_safetensors(serialize_safetensors(in));
  for (const auto& [name, t] : in) {
    INFO(name);
    REQUIRE_FALSE(t.is_contiguous());
    CHECK(bitwise_equal(f.at(name), t.contiguous()));
  }
}

TEST_CASE("safetensors reads a file written by the reference implementation", "[safetensors]") {
  // safetensors.numpy.save({"test": np.array([[1, 2], [3, 4]], dtype=np.int32)}, metadata={"foo": "bar"})
  const std::string json = R"({"__metadata__":{"foo":"bar"},"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})";
  std::string padded = json + std::string((8 - json.size() % 8) % 8, ' ');
  SafetensorsFile f = parse_safetensors(make_file(padded, bytes_of({1, 2, 3, 4})));
  CHECK(f.metadata.at("foo") == "bar");
  CHECK(f.at("test").to_vector<int32_t>() == std::vector<int32_t>{1, 2, 3, 4});
  // No tensors at all is a valid file.
  CHECK(parse_safetensors(make_file("{}")).tensors.empty());
}

TEST_CASE("safetensors writer refuses bad names and tensors", "[safetensors]") {
  CHECK_THROWS_WITH(serialize_safetensors({{"a", ones({1})}, {"a", ones({2})}}), Catch::Contains("two tensors are named 'a'"));
  CHECK_THROWS_WITH(serialize_safetensors({{"", ones({1})}}), Catch::Contains("non-empty"));
  CHECK_THROWS_WITH(serialize_safetensors({{"__metadata__", ones({1})}}), Catch::Contains("reserved"));
  CHECK_THROWS_WITH(serialize_safetensors({{"u", Tensor()}}), Catch::Contains("'u' is undefined"));
  const std::string missing = testing::scratch_dir("safetensors_missing") + "/no/such/dir/x.safetensors";
  CHECK_THROWS_WITH(save_safetensors(missing, {{"a", ones({1})}}), Catch::Contains(missing));
  CHECK_THROWS_WITH(load_safetensors(missing), Catch::Contains(missing));
}

TEST_CASE("safetensors: a broken header length is refused", "[safetensors]") {
  CHECK_THROWS_WITH(parse_safetensors(std::string(5, '\0'), "short.safetensors"),
                    Catch::Contains("'short.safetensors'") && Catch::Contains("too short"));
  std::string f = make_file("{}");
  uint64_t big = 1000;
  std::memcpy(f.data(), &big, 8);
  CHECK_THROWS_WITH(parse_safetensors(f, "x.st"), Catch::Contains("'x.st'") && Catch::Contains("header length 1000"));
  big = uint64_t(1) << 40;
  std::memcpy(f.data(), &big, 8);
  CHECK_THROWS_WITH(parse_safetensors(f, "x.st"), Catch::Contains("exceeds the limit"));
  big = ~uint64_t(0);
  std::memcpy(f.data(), &big, 8);
  CHECK_THROWS_WITH(parse_safetensors(f, "x.st"), Catch::Contains("exceeds the limit"));
}

TEST_CASE("safetensors: malformed JSON is refused", "[safetensors]") {
  CHECK_PARSE_FAILS("{\"a\": ", "", Catch::Contains("'bad.safetensors'") && Catch::Contains("not valid JSON"));
  CHECK_PARSE_FAILS("[1, 2]", "", Catch::Contains("JSON object"));
  CHECK_PARSE_FAILS("", "", Catch::Contains("JSON object"));
  CHECK_PARSE_FAILS("{} {}", "", Catch::Contains("not valid JSON"));
  CHECK_PARSE_FAILS("{\"a\": \"\xff\xfe\"}", "", Catch::Contains("not valid JSON"));
  CHECK_PARSE_FAILS(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                    std::string(8, '\0'), Catch::Contains("key 'a' twice"));
  CHECK_PARSE_FAILS(R"({"a":{"dtype":"F32","dtype":"F64","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'),
                    Catch::Contains("key 'dtype' twice"));
}

TEST_CASE("safetensors: bad entries name the file and the tensor", "[safetensors]") {
  const std::string d4(4, '\0');
// Catch's combined matchers hold references: build them in place, not in a helper function.
#define both(what) Catch::Contains("'bad.safetensors'") && Catch::Contains("tensor 'w'") && Catch::Contains(what)
  CHECK_PARSE_FAILS(R"({"w": 3})", d4, both("must be an object"));
  CHECK_PARSE_FAILS(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", d4, both("dtype 'U8' is not supported"));
  CHECK_PARSE_FAILS(R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", d4, both("dtype must be a string"));
  CHECK_PARSE_FAILS(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", d4, both("missing field 'dtype'"));
  CHECK_PARSE_FAILS(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", d4, both("missing field 'shape'"));
  CHECK_PARSE_FAILS(R"({"w":{"dtype":"F32","shape":[1]}})", d4, both("missing field 'data_offsets'"));
  CHECK_PARSE_FAILS(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", d4, both("unexpected field 'x'"));
  CHECK_PARSE_FAILS(R"({"w":{"dtype":"F32","shape":1,"data_offsets":[0,4]}})", d4, both("shape must be an array"));
  CHECK_PARSE_FAILS(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", d4, both("non-negative integers"));
  CHECK_PARSE_FAILS(R"({"w":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", d4, both("non-negative integers"));
  CHECK_PARSE_FAILS(R"({"w":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}})", d4, both("more than 8 dims"));
  CHECK_PARSE_FAILS(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,4]}})", d4,
                    both("too many elements"));
  CHECK_PARSE_FAILS(R"({"w":{"dtype":"F64","shape":[1152921504606846976],"data_offsets":[0,4]}})", d4,
                    both("too many elements"));
  CHECK_PARSE_FAILS(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", d4, both("[begin, end]"));
  CHECK_PARSE_FAILS(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", d4, both("end before they begin"));
  CHECK_PARSE_FAILS(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", d4, both("needs 8 bytes"));
  CHECK_PARSE_FAILS(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d4, both("outside the data buffer"));
  CHECK_PARSE_FAILS(R"({"w":{"dtype":"BOOL","shape":[4],"data_offsets":[0,4]}})", std::string("\1\0\2\1", 4),
                    both("BOOL element 2 is 2"));
#undef both
}

TEST_CASE("safetensors: tensors must tile the data buffer", "[safetensors]") {
  const std::string d8(8, '\0');
  // Overlap: b starts inside a.
  CHECK_PARSE_FAILS(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                    d8, Catch::Contains("tensor 'b'") && Catch::Contains("overlaps tensor 'a'"));
  // Hole before the first tensor and between tensors.
  CHECK_PARSE_FAILS(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8,
                    Catch::Contains("tensor 'a' starts at 4") && Catch::Contains("hole of 4 bytes"));
  CHECK_PARSE_FAILS(R"({"a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"I32","shape":[0],"data_offsets":[8,8]}})",
                    d8, Catch::Contains("tensor 'b' starts at 8") && Catch::Contains("after tensor 'a'"));
  // Trailing bytes nobody owns.
  CHECK_PARSE_FAILS(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", d8,
                    Catch::Contains("has 8 bytes but the tensors cover only 4"));
  // Zero-size tensors at the current position are fine.
  auto f = parse_safetensors(make_file(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})",
                                       bytes_of({7, 9})));
  CHECK(f.at("b").to_vector<int32_t>() == std::vector<int32_t>{7, 9});
}

TEST_CASE("safetensors: bad metadata is refused", "[safetensors]") {
  CHECK_PARSE_FAILS(R"({"__metadata__":{"k":1}})", "", Catch::Contains("value of 'k' must be a string"));
  CHECK_PARSE_FAILS(R"({"__metadata__":[]})", "", Catch::Contains("__metadata__ must be an object"));
}

TEST_CASE("safetensors: every truncation and single-byte change of a valid file fails cleanly or parses", "[safetensors]") {
  // A poor man's fuzz: no crash, no exception other than tessel::Error.
  NamedTensors in = {{"x", testing::uniform({2, 3}, 1)}, {"n", testing::randint({3}, 2, 0, 9, DType::Int64)},
                     {"m", testing::randint({3}, 3, 0, 2, DType::Int32).to(DType::Bool)}};
  const std::string good = serialize_safetensors(in, {{"k", "v"}});
  int errors = 0, ok = 0;
  auto attempt = [&](const std::string& bytes) {
    try {
      parse_safetensors(bytes, "fuzz");
      ++ok;
    } catch (const Error&) {
      ++errors;
    }
  };
  for (size_t len = 0; len < good.size(); ++len) attempt(good.substr(0, len));
  for (size_t i = 0; i < 8 + header_len(good); ++i)
    for (int v : {0, int('"'), int('1'), int('9'), int(']'), int('{'), 0x80, 0xff}) {
      std::string b = good;
      b[i] = char(v);
      attempt(b);
    }
  CHECK(errors > 0);
  CHECK(ok > 0);
}
