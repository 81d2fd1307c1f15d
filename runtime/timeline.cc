#include "runtime/timeline.h"

#include <fmt/format.h>

#include "runtime/allocator.h"

namespace tessel::timeline {
namespace {
thread_local Recorder* g_recorder = nullptr;
}

Recorder* current() { return g_recorder; }

Scope::Scope(Recorder* r) : prev_(g_recorder) { g_recorder = r; }
Scope::~Scope() { g_recorder = prev_; }

Recorder::Recorder(int rank, int64_t max_events) : rank_(rank), max_events_(max_events), origin_(Clock::now()) {}

void Recorder::set_origin_now() { origin_ = Clock::now(); }

int64_t Recorder::now_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - origin_).count();
}

void Recorder::begin(std::string_view name, std::string_view suffix, const char* cat, std::string args) {
  Open o;
  o.name.reserve(name.size() + suffix.size());
  o.name.append(name).append(suffix);
  o.cat = cat;
  o.args = std::move(args);
  o.t0_ns = now_ns();
  stack_.push_back(std::move(o));
}

void Recorder::end(std::string_view more_args) {
  if (stack_.empty()) return;
  const int64_t t1 = now_ns();
  Open o = std::move(stack_.back());
  stack_.pop_back();
  if (!more_args.empty()) {
    if (!o.args.empty()) o.args += ',';
    o.args.append(more_args);
  }
  Event e;
  e.name = std::move(o.name);
  e.cat = o.cat;
  e.ts_ns = o.t0_ns;
  e.dur_ns = t1 - o.t0_ns;
  e.args = std::move(o.args);
  push(std::move(e));
  if (stack_.empty()) sample_memory(t1);
}

void Recorder::span(std::string name, const char* cat, int64_t t0_ns, int64_t t1_ns, std::string args) {
  Event e;
  e.name = std::move(name);
  e.cat = cat;
  e.ts_ns = t0_ns;
  e.dur_ns = t1_ns - t0_ns;
  e.args = std::move(args);
  push(std::move(e));
}

void Recorder::counter(const char* name, int64_t ts_ns, std::string args) {
  Event e;
  e.name = name;
  e.cat = "memory";
  e.phase = 'C';
  e.ts_ns = ts_ns;
  e.args = std::move(args);
  push(std::move(e));
}

void Recorder::push(Event e) {
  if (int64_t(events_.size()) >= max_events_) {
    ++dropped_;
    return;
  }
  events_.push_back(std::move(e));
}

// Only when the figures moved: a step of small ops would otherwise add a
// sample per op with nothing new in it.
void Recorder::sample_memory(int64_t ts_ns) {
  Allocator* a = allocator_for(memory_device_);
  if (!a) return;
  const AllocatorStats s = a->stats();
  if (s.current_bytes == last_allocated_ && s.peak_bytes == last_peak_) return;
  last_allocated_ = s.current_bytes;
  last_peak_ = s.peak_bytes;
  counter("memory", ts_ns,
          fmt::format(FMT_STRING("\"allocated MiB\":{:.3f},\"high-water MiB\":{:.3f}"), double(s.current_bytes) / (1 << 20),
                      double(s.peak_bytes) / (1 << 20)));
}

void Recorder::clear() {
  events_.clear();
  stack_.clear();
  dropped_ = 0;
  last_allocated_ = last_peak_ = -1;
}

std::string json_string(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) out += fmt::format(FMT_STRING("\\u{:04x}"), int(c));
        else out += c;
    }
  }
  out += '"';
  return out;
}

std::string Recorder::chrome_events() const {
  // Microseconds with nanosecond digits: Chrome's unit, Perfetto keeps the precision.
  auto us = [](int64_t ns) { return fmt::format(FMT_STRING("{}.{:03d}"), ns / 1000, int(ns % 1000)); };
  std::string s = fmt::format(
      FMT_STRING("{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{0},\"tid\":0,\"args\":{{\"name\":\"rank {0}\"}}}},"
                 "{{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":{0},\"tid\":0,\"args\":{{\"sort_index\":{0}}}}}"),
      rank_);
  if (dropped_ > 0)
    s += fmt::format(FMT_STRING(",{{\"ph\":\"i\",\"s\":\"p\",\"name\":\"trace full: {} events left out\",\"pid\":{},"
                                "\"tid\":0,\"ts\":{}}}"),
                     dropped_, rank_, events_.empty() ? std::string("0") : us(events_.back().ts_ns));
  for (const Event& e : events_) {
    s += fmt::format(FMT_STRING(",{{\"ph\":\"{}\",\"name\":{},\"cat\":\"{}\",\"pid\":{},\"tid\":0,\"ts\":{}"), e.phase,
                     json_string(e.name), e.cat, rank_, us(e.ts_ns));
    if (e.phase == 'X') s += fmt::format(FMT_STRING(",\"dur\":{}"), us(e.dur_ns));
    if (!e.args.empty()) s += ",\"args\":{" + e.args + "}";
    s += '}';
  }
  return s;
}

std::string chrome_trace(const std::vector<std::string>& rank_events, const std::string& other) {
  std::string s = "{\"displayTimeUnit\":\"ms\",";
  if (!other.empty()) s += other + ",";
  s += "\"traceEvents\":[";
  bool first = true;
  for (const std::string& r : rank_events) {
    if (r.empty()) continue;
    if (!first) s += ",\n";
    s += r;
    first = false;
  }
  return s + "]}\n";
}

}  // namespace tessel::timeline
