#pragma once
// A timeline of one thread (one rank): what ran when, for a Chrome/Perfetto
// trace (`tessel train --trace FILE`, RunOptions::trace; docs/trace.md).
//
// Spans nest by time on the rank's track: ops (every op call, category
// "op"), backward nodes ("backward", named "<op>.bwd"), layout changes
// ("comm": redistribute), collectives and point-to-point transfers ("comm",
// with bytes, group and peers), blocking waits ("wait"), the steps of the
// optimizer phase ("step": gradient reduction, clipping, optimizer.step) and
// pipeline instructions ("pipeline", with micro-batch and stage). Counter
// samples of the allocator ("memory": MiB allocated and the high-water mark)
// follow every top-level span. Off (the default) a hook costs one
// thread-local load.
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/device.h"

namespace tessel::timeline {

struct Event {
  std::string name;
  const char* cat = "";
  char phase = 'X';     // 'X': a span [ts, ts + dur); 'C': a counter sample
  int64_t ts_ns = 0;    // from the recorder's origin
  int64_t dur_ns = 0;
  std::string args;     // the members of a JSON object ("\"bytes\":4096"), or empty
};

class Recorder {
 public:
  // `rank` names the track (the process id in the trace).
  explicit Recorder(int rank, int64_t max_events = 4'000'000);
  int rank() const { return rank_; }
  // Whose allocator the memory counter samples (default: the CPU's).
  void set_memory_device(Device d) { memory_device_ = d; }

  // Timestamps count from here (a barrier before it aligns the ranks).
  void set_origin_now();
  int64_t now_ns() const;

  void begin(std::string_view name, std::string_view suffix, const char* cat, std::string args = {});
  // Ends the innermost span; `more_args` are appended to its args.
  void end(std::string_view more_args = {});
  // A finished span.
  void span(std::string name, const char* cat, int64_t t0_ns, int64_t t1_ns, std::string args = {});
  void counter(const char* name, int64_t ts_ns, std::string args);

  const std::vector<Event>& events() const { return events_; }
  // Events left out once max_events were recorded (the trace says so).
  int64_t dropped() const { return dropped_; }
  int depth() const { return int(stack_.size()); }
  void clear();

  // This rank's events as Chrome trace events (comma-separated JSON objects,
  // pid = rank, tid = 0), preceded by the track's name.
  std::string chrome_events() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Open {
    std::string name;
    const char* cat;
    int64_t t0_ns;
    std::string args;
  };
  void push(Event e);
  void sample_memory(int64_t ts_ns);

  int rank_;
  int64_t max_events_;
  Device memory_device_ = kCPU;
  int64_t dropped_ = 0;
  Clock::time_point origin_;
  std::vector<Open> stack_;
  std::vector<Event> events_;
  int64_t last_allocated_ = -1, last_peak_ = -1;
};

// This thread's recorder (nullptr: off, the default).
Recorder* current();

// Installs `r` on this thread for a scope.
class Scope {
 public:
  explicit Scope(Recorder* r);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Recorder* prev_;
};

// A span over its scope when a recorder is installed. `args` is built only
// then: pass a callable returning the JSON members.
class Span {
 public:
  Span(const char* name, const char* cat) : r_(current()) {
    if (r_) r_->begin(name, {}, cat);
  }
  template <class ArgsFn>
  Span(const char* name, const char* cat, ArgsFn&& args) : r_(current()) {
    if (r_) r_->begin(name, {}, cat, args());
  }
  ~Span() {
    if (r_) r_->end();
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  Recorder* r_;
};

// The whole Chrome trace document ({"traceEvents": [...]}) from the ranks'
// chrome_events(), in rank order; `other` adds top-level members
// ("\"tessel\":{...}").
std::string chrome_trace(const std::vector<std::string>& rank_events, const std::string& other = {});

// JSON string literal of s (quotes and escapes).
std::string json_string(std::string_view s);

}  // namespace tessel::timeline
