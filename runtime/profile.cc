#include "runtime/profile.h"

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

namespace tessel::profile {
namespace {
thread_local Profiler* g_profiler = nullptr;
}

Profiler* current() { return g_profiler; }

Scope::Scope(Profiler* p) : prev_(g_profiler) { g_profiler = p; }
Scope::~Scope() { g_profiler = prev_; }

bool env_enabled() {
  const char* e = std::getenv("TESSEL_PROFILE");
  return e && *e && std::string_view(e) != "0";
}

void Profiler::enter(std::string_view name, std::string_view suffix) {
  Frame f;
  f.name.reserve(name.size() + suffix.size());
  f.name.append(name).append(suffix);
  f.t0 = Clock::now();
  stack_.push_back(std::move(f));
}

void Profiler::leave() {
  if (stack_.empty()) return;
  const double dt = std::chrono::duration<double>(Clock::now() - stack_.back().t0).count();
  Frame f = std::move(stack_.back());
  stack_.pop_back();
  Row& r = rows_[f.name];
  if (r.name.empty()) r.name = f.name;
  r.calls += 1;
  r.total_s += dt;
  r.self_s += std::max(0.0, dt - f.child_s);
  if (!stack_.empty()) stack_.back().child_s += dt;
}

std::vector<Row> Profiler::rows() const {
  std::vector<Row> out;
  out.reserve(rows_.size());
  for (const auto& [k, r] : rows_) out.push_back(r);
  std::sort(out.begin(), out.end(), [](const Row& a, const Row& b) {
    return a.self_s != b.self_s ? a.self_s > b.self_s : a.name < b.name;
  });
  return out;
}

double Profiler::self_total_s() const {
  double s = 0;
  for (const auto& [k, r] : rows_) s += r.self_s;
  return s;
}

void Profiler::clear() {
  rows_.clear();
  stack_.clear();
}

std::string Profiler::table(double wall_s, int top) const {
  const std::vector<Row> rs = rows();
  const double total = self_total_s();
  const double denom = wall_s > 0 ? wall_s : total;
  std::string s = fmt::format(FMT_STRING("{:<36} {:>9} {:>11} {:>7} {:>11}\n"), "op (self time)", "calls", "self s", "share",
                              "total s");
  double rest = 0;
  int64_t rest_calls = 0;
  for (size_t i = 0; i < rs.size(); ++i) {
    if (int(i) >= top) {
      rest += rs[i].self_s;
      rest_calls += rs[i].calls;
      continue;
    }
    s += fmt::format(FMT_STRING("{:<36} {:>9} {:>11.4f} {:>6.1f}% {:>11.4f}\n"), rs[i].name, rs[i].calls, rs[i].self_s,
                     denom > 0 ? 100 * rs[i].self_s / denom : 0.0, rs[i].total_s);
  }
  if (rest > 0 || rest_calls > 0)
    s += fmt::format(FMT_STRING("{:<36} {:>9} {:>11.4f} {:>6.1f}%\n"), fmt::format(FMT_STRING("({} more)"), rs.size() - size_t(top)),
                     rest_calls, rest, denom > 0 ? 100 * rest / denom : 0.0);
  s += fmt::format(FMT_STRING("{:<36} {:>9} {:>11.4f} {:>6.1f}%{}\n"), "profiled total", "", total,
                   denom > 0 ? 100 * total / denom : 0.0, wall_s > 0 ? " of the timed wall" : "");
  return s;
}

}  // namespace tessel::profile
