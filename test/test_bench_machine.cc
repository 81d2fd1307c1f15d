// tools/bench/machine.h: what every benchmark records about the machine (CPU,
// ISA, load at start and end) and the mark on a run taken while busy.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <sstream>

#include "tools/bench/machine.h"

using namespace tessel::tools;

TEST_CASE("bench machine: CPU, ISA and load are read; a busy start is marked loaded", "[bench]") {
  CHECK(load_1min() >= 0.0);  // Linux has /proc/loadavg
  CHECK_FALSE(cpu_model().empty());
  const std::string isa = cpu_isa();
  CHECK((isa == "avx512" || isa == "avx2" || isa == "baseline"));

  // A threshold below any load: busy at start; with no wait allowed it is marked loaded at once.
  setenv("TESSEL_BENCH_WAIT_S", "0", 1);
  std::ostringstream log;
  BenchMachine m = begin_bench(log, -1.0);
  unsetenv("TESSEL_BENCH_WAIT_S");
  CHECK(m.loaded);
  CHECK(m.waited_s < 1.0);
  CHECK(log.str().empty());  // no wait announced when none is allowed
  end_bench(m);
  CHECK(m.load_end >= 0.0);
  nlohmann::json j;
  add_machine(j, m);
  CHECK(j["loaded"] == true);
  CHECK(j["machine"]["cpu"] == m.cpu);
  CHECK(j["machine"]["isa"] == isa);
  CHECK(j["machine"]["load_start"] == m.load_start);
  const std::string summary = machine_summary(m);
  CHECK(summary.find("machine: " + m.cpu + ", isa " + isa) == 0);
  CHECK(summary.find("LOADED") != std::string::npos);

  // A threshold above any load: quiet, not marked.
  BenchMachine quiet = begin_bench(log, 1e9);
  CHECK_FALSE(quiet.loaded);
  CHECK(machine_summary(quiet).find("LOADED") == std::string::npos);
}

TEST_CASE("median: the middle value, the mean of the two middle ones, 0 for none", "[bench]") {
  CHECK(median({}) == 0.0);
  CHECK(median({3.0}) == 3.0);
  CHECK(median({5.0, 1.0, 3.0}) == 3.0);
  CHECK(median({4.0, 1.0, 3.0, 2.0}) == 2.5);
}
