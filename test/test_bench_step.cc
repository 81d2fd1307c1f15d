// bench step without PyTorch: the tessel side runs and the last line is the
// promised JSON (the PyTorch side is exercised by ./tessel bench step).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/error.h"
#include "tools/bench/generate_bench.h"
#include "tools/bench/step_bench.h"

using namespace tessel;

namespace {
// The last non-empty line of a bench's output, parsed: its promised JSON.
nlohmann::json last_json_line(const std::string& text) {
  std::string last;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty()) last = line;
  return nlohmann::json::parse(last);
}
}  // namespace

TEST_CASE("bench step --no-reference ends with one JSON line", "[bench]") {
  // A test asserts the output, not the timing: it must not wait for a quiet
  // machine (a loaded CI would make it wait 60 s and time out).
  setenv("TESSEL_BENCH_WAIT_S", "0", 1);
  tools::StepBenchOptions o;
  o.model = "llama";
  o.config = "tiny";
  o.batch = 2;
  o.seq = 16;
  o.warmup = 1;
  o.steps = 2;
  o.reference = false;
  std::ostringstream out;
  REQUIRE(tools::run_step_bench(o, out) == 0);
  const std::string text = out.str();
  auto j = last_json_line(text);
  CHECK(j["bench"] == "step");
  CHECK(j["model"] == "llama");
  CHECK(j["config"] == "tiny");
  CHECK(j["ours_s"].get<double>() > 0);
  CHECK(j["reference"].is_null());
  for (const char* part : {"forward", "backward", "optimizer"}) CHECK(j[part]["ours_s"].get<double>() > 0);
  CHECK(j["tokens_per_s"].get<double>() > 0);
  CHECK(j["batch"] == 2);
  CHECK(j["seq"] == 16);
  CHECK(j["machine"]["cpu"].is_string());  // tools/bench/machine.h
  CHECK(j["loaded"].is_boolean());
  CHECK(text.find("first-step loss") == std::string::npos);  // no loss comparison without a reference
  // Peak memory of the timed steps: the allocator's and the resident set's.
  CHECK(j["memory"]["ours_allocator_peak_mib"].get<double>() > 0);
  CHECK(j["memory"]["ours_rss_peak_mib"].get<double>() >= j["memory"]["ours_allocator_peak_mib"].get<double>());
  CHECK(j["memory"].count("reference_rss_peak_mib") == 0);
  CHECK(j.count("compiled_reference") == 0);
}

TEST_CASE("bench step --profile sorts tessel's ops into the comparison's categories", "[bench]") {
  setenv("TESSEL_BENCH_WAIT_S", "0", 1);
  tools::StepBenchOptions o;
  o.model = "nanogpt";
  o.config = "tiny";
  o.batch = 2;
  o.seq = 16;
  o.warmup = 0;
  o.steps = 1;
  o.profile_steps = 2;
  o.reference = false;
  std::ostringstream out;
  REQUIRE(tools::run_step_bench(o, out) == 0);
  const std::string text = out.str();
  CHECK(text.find("op by op") != std::string::npos);
  auto j = last_json_line(text);
  REQUIRE(j.contains("profile"));
  CHECK(j["profile"]["steps"] == 2);
  auto seconds = [&](const char* part, const std::string& category) {
    for (const auto& row : j["profile"][part])
      if (row["category"] == category) return row["ours_s"].get<double>();
    return -1.0;  // absent
  };
  // NanoGPT's every kind of op, forward and backward, lands in its category
  // (not in "other"): linears, the fused attention, LayerNorm, GELU, the loss
  // and the embeddings.
  for (const char* part : {"forward", "backward"})
    for (const char* category : {"linear (GEMM, bias)", "attention", "norm", "activation", "loss", "embedding"}) {
      INFO(part << " " << category);
      CHECK(seconds(part, category) > 0);
    }
  CHECK(seconds("optimizer", "optimizer") > 0);
  CHECK(seconds("forward", "optimizer") == -1.0);
  CHECK(seconds("forward", "(outside ops)") >= 0);
  CHECK(j["profile"]["forward"][0].count("reference_s") == 0);  // no reference side
}

TEST_CASE("bench step refuses bad options by name", "[bench]") {
  tools::StepBenchOptions o;
  o.config = "tiny";
  o.seq = 1000;
  o.reference = false;
  std::ostringstream out;
  CHECK_THROWS_WITH(tools::run_step_bench(o, out), Catch::Contains("seq 1000 exceeds the context 64"));
  o.seq = 8;
  o.steps = 0;
  CHECK_THROWS_WITH(tools::run_step_bench(o, out), Catch::Contains("steps > 0"));
  o.steps = 1;
  o.profile_steps = -1;
  CHECK_THROWS_WITH(tools::run_step_bench(o, out), Catch::Contains("profile steps >= 0"));
  o.profile_steps = 0;
  o.torch_compile = true;  // needs the PyTorch side
  CHECK_THROWS_WITH(tools::run_step_bench(o, out), Catch::Contains("torch.compile reference needs the PyTorch side"));
  o.torch_compile = false;
  o.reference = true;
  o.python = "/no/such/python";
  CHECK_THROWS_AS(tools::run_step_bench(o, out), Error);
}

TEST_CASE("bench generate --no-reference ends with one JSON line; bad sizes are errors", "[bench]") {
  setenv("TESSEL_BENCH_WAIT_S", "0", 1);
  tools::GenerateBenchOptions o;
  o.model = "nanogpt";
  o.config = "tiny";
  o.batch = 2;
  o.prompt_len = 5;
  o.new_tokens = 4;
  o.rounds = 2;
  o.reference = false;
  std::ostringstream out;
  REQUIRE(tools::run_generate_bench(o, out) == 0);
  auto j = last_json_line(out.str());
  CHECK(j["bench"] == "generate");
  CHECK(j["model"] == "nanogpt");
  CHECK(j["ours_s"].get<double>() > 0);
  CHECK(j["tokens_per_s"].get<double>() > 0);
  CHECK(j["reference"].is_null());
  CHECK(j["new_tokens"] == 4);
  CHECK(j.contains("machine"));
  o.prompt_len = 60;  // + 4 new > the context 64
  o.new_tokens = 5;
  CHECK_THROWS_WITH(tools::run_generate_bench(o, out), Catch::Contains("exceed the context 64"));
}
