#include "tools/bench/machine.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include <fmt/format.h>

namespace tessel::tools {

double load_1min() {
  std::ifstream in("/proc/loadavg");
  double l = -1;
  in >> l;
  return in ? l : -1;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "unknown" : line.substr(start);
  }
  return "unknown";
}

std::string cpu_isa() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return "avx512";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "avx2";
#endif
  return "baseline";
}

BenchMachine begin_bench(std::ostream& log, double threshold) {
  BenchMachine m;
  m.cpu = cpu_model();
  m.isa = cpu_isa();
  double max_wait = 60;
  if (const char* e = std::getenv("TESSEL_BENCH_WAIT_S"); e && *e) max_wait = std::atof(e);
  m.load_start = load_1min();
  const auto t0 = std::chrono::steady_clock::now();
  if (m.load_start > threshold && max_wait > 0) {
    log << fmt::format(FMT_STRING("bench: 1-minute load {:.2f} > {:.1f} (something else is running); waiting up to "
                                  "{:.0f} s for a quiet machine (TESSEL_BENCH_WAIT_S)\n"),
                       m.load_start, threshold, max_wait)
        << std::flush;
    while (m.load_start > threshold &&
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < max_wait) {
      std::this_thread::sleep_for(std::chrono::seconds(5));
      m.load_start = load_1min();
    }
  }
  m.waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.loaded = m.load_start > threshold;
  return m;
}

void end_bench(BenchMachine& m) { m.load_end = load_1min(); }

std::string machine_summary(const BenchMachine& m) {
  std::string s = fmt::format(FMT_STRING("machine: {}, isa {}; 1-minute load {:.2f} at start{}, {:.2f} at end\n"), m.cpu,
                              m.isa, m.load_start,
                              m.waited_s >= 1 ? fmt::format(FMT_STRING(" (after waiting {:.0f} s)"), m.waited_s) : "",
                              m.load_end);
  if (m.loaded)
    s += fmt::format(FMT_STRING("LOADED: the machine was busy at start (load {:.2f} > {:.1f}); this measures the "
                                "machine, not tessel -- do not quote it\n"),
                     m.load_start, kQuietLoad);
  return s;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace tessel::tools
