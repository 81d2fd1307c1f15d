#include "train/dump.h"

#include <fstream>
#include <map>
#include <set>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "runtime/logging.h"

namespace tessel::train {

DumpRecorder::DumpRecorder(const std::string& path, bool write) {
  if (!write) return;
  f_ = std::fopen(path.c_str(), "w");
  TESSEL_CHECK(f_ != nullptr, "train --dump", "cannot open '{}' for writing", path);
}

DumpRecorder::~DumpRecorder() {
  if (f_) std::fclose(f_);
}

void DumpRecorder::record(const char* phase, const char* op, int index, const Tensor& full, uint64_t hash) {
  if (!f_) return;
  nlohmann::json j;
  j["step"] = step_;
  j["i"] = seq_++;
  j["phase"] = phase;
  j["op"] = op;
  j["k"] = index;
  j["shape"] = std::vector<int64_t>(full.shape().begin(), full.shape().end());
  j["dtype"] = dtype_name(full.dtype());
  j["hash"] = trace::hex(hash);
  std::fprintf(f_, "%s\n", j.dump().c_str());
}

void DumpRecorder::anomaly(const std::string& message) {
  if (!f_) return;
  nlohmann::json j;
  j["step"] = step_;
  j["i"] = seq_++;
  j["phase"] = "anomaly";
  j["message"] = message;
  std::fprintf(f_, "%s\n", j.dump().c_str());
  std::fflush(f_);  // the run is about to stop
}

namespace {

bool timing(const std::string& key) {
  return key == "tokens_per_s" || (key.size() > 2 && key.compare(key.size() - 2, 2, "_s") == 0);
}

std::string where(const nlohmann::json& j) {
  if (j.contains("phase"))
    return "step " + j.value("step", nlohmann::json()).dump() + ", " + j["phase"].get<std::string>() + " #" +
           j["i"].dump() + " " + j["op"].get<std::string>() + " (" +
           (j["phase"] == "fwd" ? "output " : "gradient of input ") + j["k"].dump() + ", shape " +
           j["shape"].dump() + ")";
  return "step " + j.value("step", nlohmann::json()).dump();
}

}  // namespace

// Two dumps: a layout may compute a value through other ops (a sharded
// linear is a matmul and an add, a masked embedding subtracts and selects
// first), so entries are matched by value, not position: the first entry of
// `a` (in execution order) whose bits `b` never produced in the same step is
// where the runs part.
std::optional<std::string> first_dump_divergence(const std::string& a, const std::string& b) {
  std::map<int64_t, std::set<std::string>> seen;  // step -> hashes of b (a backward may run forward ops)
  std::optional<std::string> b_anomaly;
  std::ifstream fb(b);
  std::string l;
  while (std::getline(fb, l)) {
    const nlohmann::json j = nlohmann::json::parse(l);
    if (j.value("phase", "") == "anomaly") {
      b_anomaly = j.at("message").get<std::string>();
      continue;
    }
    seen[j.at("step").get<int64_t>()].insert(
        j.at("hash").get<std::string>());
  }
  std::ifstream fa(a);
  int64_t n = 0;
  while (std::getline(fa, l)) {
    const nlohmann::json j = nlohmann::json::parse(l);
    ++n;
    if (j.at("phase") == "anomaly")  // --detect-anomaly stopped run a here
      return a + " stopped at step " + j.at("step").dump() + " on an anomaly: " + j.at("message").get<std::string>();
    const std::string dt = j.at("dtype").get<std::string>();
    if (dt != "float32" && dt != "bfloat16" && dt != "float16" && dt != "float64") continue;  // index plumbing
    // Views and copies compute nothing (a view of a parameter has no
    // counterpart where the parameter is sharded); their producers are checked.
    static const std::set<std::string> kMoves = {"view", "reshape", "transpose", "permute", "expand", "contiguous",
                                                 "unsqueeze", "squeeze", "narrow", "select", "slice", "clone", "to",
                                                 "cat", "split", "chunk", "stack"};
    if (j.at("phase") == "fwd" && kMoves.count(j.at("op").get<std::string>())) continue;
    const auto it = seen.find(j.at("step").get<int64_t>());
    if (it == seen.end()) return where(j) + ": " + b + " has no entries for this step";
    if (!it->second.count(j.at("hash").get<std::string>()))
      return "first difference at " + where(j) + ": " + b + " never produced these bits (hash " +
             j["hash"].get<std::string>() + ") in that step";
  }
  TESSEL_CHECK(n > 0, "verify", "'{}' is empty", a);
  if (b_anomaly) return b + " stopped on an anomaly: " + *b_anomaly;
  return std::nullopt;
}

std::optional<std::string> first_divergence(const std::string& a, const std::string& b) {
  std::ifstream fa(a), fb(b);
  TESSEL_CHECK(fa.good(), "verify", "cannot open '{}'", a);
  TESSEL_CHECK(fb.good(), "verify", "cannot open '{}'", b);
  {
    std::string first;
    std::getline(fa, first);
    if (first.find("\"phase\"") != std::string::npos) return first_dump_divergence(a, b);
    fa.seekg(0);
  }
  // Rows by step: a resumed run (steps 7-10) lines up with the whole run's
  // steps 7-10, not with its first lines.
  auto read_rows = [](const std::string& path) {
    std::ifstream f(path);
    std::map<int64_t, nlohmann::json> rows;
    std::string l;
    for (int64_t line = 1; std::getline(f, l); ++line) {
      if (l.empty()) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(l);
      } catch (const std::exception& e) {
        TESSEL_FAIL("verify", "'{}' line {} is not JSON: {}", path, line, e.what());
      }
      TESSEL_CHECK(j.contains("step") && j["step"].is_number_integer(), "verify", "'{}' line {} has no step: {}", path,
                   line, l.substr(0, 200));
      TESSEL_CHECK(rows.emplace(j["step"].get<int64_t>(), j).second, "verify", "'{}' holds step {} twice", path,
                   j["step"].get<int64_t>());
    }
    TESSEL_CHECK(!rows.empty(), "verify", "'{}' has no metrics rows", path);
    return rows;
  };
  const auto ra = read_rows(a), rb = read_rows(b);
  std::vector<int64_t> common, only_a, only_b;
  for (const auto& [step, row] : ra) (rb.count(step) ? common : only_a).push_back(step);
  for (const auto& [step, row] : rb)
    if (!ra.count(step)) only_b.push_back(step);
  auto steps_str = [](const std::vector<int64_t>& v) {
    if (v.empty()) return std::string("none");
    const bool run = v.back() - v.front() + 1 == int64_t(v.size());
    return run && v.size() > 1 ? std::to_string(v.front()) + "-" + std::to_string(v.back())
                               : fmt::format(FMT_STRING("{}"), fmt::join(v, ", "));
  };
  if (common.empty())
    return "no step in common: " + a + " has steps " + steps_str(only_a) + ", " + b + " has steps " + steps_str(only_b);
  for (int64_t step : common) {
    const nlohmann::json &ja = ra.at(step), &jb = rb.at(step);
    for (auto it = ja.begin(); it != ja.end(); ++it) {
      if (timing(it.key()) || it.key() == "i") continue;
      if (!jb.contains(it.key())) return where(ja) + ": '" + it.key() + "' is in " + a + " only";
      if (jb[it.key()] != it.value())
        return "first difference at " + where(ja) + ": " + it.key() + " " + it.value().dump() + " vs " +
               jb[it.key()].dump();
    }
    for (auto it = jb.begin(); it != jb.end(); ++it)
      if (!timing(it.key()) && it.key() != "i" && !ja.contains(it.key()))
        return where(jb) + ": '" + it.key() + "' is in " + b + " only";
  }
  if (!only_a.empty() || !only_b.empty())
    return "every step both have (" + steps_str(common) + ") agrees, but " +
           (only_a.empty() ? b + " alone has steps " + steps_str(only_b)
                           : a + " alone has steps " + steps_str(only_a) +
                                 (only_b.empty() ? "" : " and " + b + " alone has steps " + steps_str(only_b)));
  return std::nullopt;
}

}  // namespace tessel::train
