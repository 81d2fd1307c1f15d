#pragma once
// What every benchmark records about the machine it ran on, so that a figure
// taken while something else ran is never quoted as a quiet one (docs/
// bench_step.md "Honest figures"): the CPU model, the ISA tessel's kernels
// use, and the 1-minute load average at start and end.
//
//   BenchMachine m = begin_bench(std::cout);  // waits (a while) for a quiet machine
//   ... time both sides ...
//   end_bench(m);
//   add_machine(json, m);                      // "machine": {cpu, isa, load_start, load_end, waited_s}, "loaded"
//   std::cout << machine_summary(m);           // one line; says LOADED when it was
//
// On this 2-core machine a load above 1.3 at start means something else is
// running: begin_bench polls for up to TESSEL_BENCH_WAIT_S seconds (default
// 60; 0: no wait) for it to fall, then marks the result loaded.
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessel::tools {

struct BenchMachine {
  std::string cpu;      // /proc/cpuinfo "model name"
  std::string isa;      // the widest vector ISA the CPU offers tessel's kernels: avx512 | avx2 | baseline
  double load_start = -1;
  double load_end = -1;
  double waited_s = 0;  // spent waiting for the load to fall
  bool loaded = false;  // load_start above the threshold even after waiting
};

constexpr double kQuietLoad = 1.3;  // the 1-minute load under which this 2-core machine counts as quiet

// The 1-minute load average (/proc/loadavg); -1 where unreadable.
double load_1min();
// The CPU model name; "unknown" where unreadable.
std::string cpu_model();
// avx512 | avx2 | baseline (what the CPU supports, not what a kernel chose).
std::string cpu_isa();

// Reads the machine and waits for a quiet one (prints what it waits for to `log`).
BenchMachine begin_bench(std::ostream& log, double threshold = kQuietLoad);
// Records the load at the end.
void end_bench(BenchMachine& m);
// Adds "machine" {cpu, isa, load_start, load_end, waited_s} and "loaded" to a
// bench's JSON line (nlohmann::json or ordered_json).
template <class Json>
void add_machine(Json& j, const BenchMachine& m) {
  j["machine"] = {{"cpu", m.cpu},
                  {"isa", m.isa},
                  {"load_start", m.load_start},
                  {"load_end", m.load_end},
                  {"waited_s", m.waited_s}};
  j["loaded"] = m.loaded;
}
// The median every bench reports: the middle value, the mean of the two
// middle ones for an even count, 0 for none.
double median(std::vector<double> v);
// "machine: <cpu>, isa avx512; 1-minute load 0.42 at start, 1.61 at end" (+ a LOADED warning), newline-terminated.
std::string machine_summary(const BenchMachine& m);

}  // namespace tessel::tools
