#pragma once
// Per-op time profile of one thread (one rank): `tessel train --profile`,
// TESSEL_PROFILE=1, or a profile::Scope in C++.
//
// Every op call (forward, by op name), every backward node ("<op>.bwd"),
// every redistribute ("redistribute", the communication of a layout change)
// and the optimizer step adds its wall time; in a compile-mode replay, every
// recorded launch under its kernel's name (runtime/capture.cc). Times are *self* times: an op
// that calls other ops (a composite, a distributed op's local kernel call)
// is charged only for what its callees did not take, so the column sums to
// the time spent inside profiled code. Off (the default) it costs one
// thread-local load per op.
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/timeline.h"

namespace tessel::profile {

struct Row {
  std::string name;
  int64_t calls = 0;
  double self_s = 0;   // excluding profiled callees
  double total_s = 0;  // including them (an op nested in itself counts once per level)
};

class Profiler {
 public:
  void enter(std::string_view name, std::string_view suffix = {});
  void leave();
  // Rows by self time, largest first.
  std::vector<Row> rows() const;
  double self_total_s() const;
  void clear();
  // A table of the `top` largest rows with shares of `wall_s` (0: of the
  // profiled total), then a line for the rest.
  std::string table(double wall_s = 0, int top = 30) const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Frame {
    std::string name;
    Clock::time_point t0;
    double child_s = 0;
  };
  std::vector<Frame> stack_;
  std::unordered_map<std::string, Row> rows_;
};

// This thread's profiler (nullptr: off).
Profiler* current();

// Installs `p` on this thread for a scope.
class Scope {
 public:
  explicit Scope(Profiler* p);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Profiler* prev_;
};

// Times its scope under `name` + `suffix` when a profiler is installed, and
// records it as a span of category `cat` when a timeline is (runtime/
// timeline.h; default category: "backward" with a suffix, else "op").
class Timer {
 public:
  explicit Timer(const char* name, const char* suffix = nullptr, const char* cat = nullptr)
      : p_(current()), t_(timeline::current()) {
    if (p_) p_->enter(name, suffix ? std::string_view(suffix) : std::string_view());
    if (t_) t_->begin(name, suffix ? std::string_view(suffix) : std::string_view(), cat ? cat : suffix ? "backward" : "op");
  }
  ~Timer() {
    if (t_) t_->end();
    if (p_) p_->leave();
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

 private:
  Profiler* p_;
  timeline::Recorder* t_;
};

// TESSEL_PROFILE=1 in the environment.
bool env_enabled();

}  // namespace tessel::profile
