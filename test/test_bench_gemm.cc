// bench gemm without its waits: the small shapes, both libraries, the
// promised JSON line; the torch.mm reference left out (--no-torch) or
// refused by name when its Python does not start.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/error.h"
#include "tools/bench/gemm_bench.h"

using namespace tessel;

namespace {
nlohmann::json last_json_line(const std::string& text) {
  std::string last;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty()) last = line;
  return nlohmann::json::parse(last);
}
}  // namespace

TEST_CASE("bench gemm --quick --no-torch ends with one JSON line naming both references' state", "[bench]") {
  setenv("TESSEL_BENCH_WAIT_S", "0", 1);
  tools::GemmBenchOptions o;
  o.threads = 1;
  o.reps = 1;
  o.quick = true;
  o.torch = false;
  std::ostringstream out;
  REQUIRE(tools::run_gemm_bench(o, out) == 0);  // 0: every product agrees with OpenBLAS
  const std::string text = out.str();
  CHECK(text.find("second reference: none -- --no-torch") != std::string::npos);
  auto j = last_json_line(text);
  CHECK(j["bench"] == "gemm");
  CHECK(j["reference"] == "openblas");
  CHECK(j["ours_s"].get<double>() > 0);
  CHECK(j["reference_s"].get<double>() > 0);
  CHECK(j["speedup"].get<double>() > 0);
  CHECK(j["reference_kernel"].get<std::string>().rfind("openblas ", 0) == 0);
  CHECK(j["torch_reference"]["error"] == "--no-torch");
  REQUIRE(j["shapes"].size() > 0);
  for (const auto& s : j["shapes"]) {
    CHECK(s["ours_s"].get<double>() > 0);
    CHECK(s.count("torch_s") == 0);
  }
  CHECK(j["machine"]["cpu"].is_string());
}

TEST_CASE("bench gemm: a torch reference that does not start is an error naming it", "[bench]") {
  setenv("TESSEL_BENCH_WAIT_S", "0", 1);
  tools::GemmBenchOptions o;
  o.threads = 1;
  o.reps = 1;
  o.quick = true;
  o.python = "/no/such/python";
  std::ostringstream out;
  CHECK_THROWS_WITH(tools::run_gemm_bench(o, out), Catch::Contains("bench gemm") && Catch::Contains("/no/such/python"));
  o.torch = false;
  o.reps = 0;
  CHECK_THROWS_WITH(tools::run_gemm_bench(o, out), Catch::Contains("--reps must be >= 1"));
}
