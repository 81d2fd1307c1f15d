#include "train/dump.h"

#include <fstream>
#include <map>
#include <set>
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
  std::ifstream fb(b);
  std::string l;
  while (std::getline(fb, l)) {
    const nlohmann::json j = nlohmann::json::parse(l);
    seen[j.at("step").get<int64_t>()].insert(
        j.at("hash").get<std::string>());
  }
  std::ifstream fa(a);
  int64_t n = 0;
  while (std::getline(fa, l)) {
    const nlohmann::json j = nlohmann::json::parse(l);
    ++n;
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
  std::string la, lb;
  int64_t line = 0;
  while (true) {
    const bool ha = bool(std::getline(fa, la)), hb = bool(std::getline(fb, lb));
    ++line;
    if (!ha && !hb) return std::nullopt;
    if (ha != hb)
      return "'" + (ha ? b : a) + "' ends at line " + std::to_string(line) + " (" + (ha ? a : b) +
             " goes on); everything before agrees";
    nlohmann::json ja, jb;
    try {
      ja = nlohmann::json::parse(la);
      jb = nlohmann::json::parse(lb);
    } catch (const std::exception& e) {
      TESSEL_FAIL("verify", "line {} is not JSON: {}", line, e.what());
    }
    for (auto it = ja.begin(); it != ja.end(); ++it) {
      if (timing(it.key()) || it.key() == "i") continue;
      if (!jb.contains(it.key()))
        return where(ja) + ": '" + it.key() + "' is in " + a + " only";
      if (jb[it.key()] != it.value())
        return "first difference at " + where(ja) + ": " + it.key() + " " + it.value().dump() + " vs " +
               jb[it.key()].dump() + (ja.contains("phase") ? "" : " (line " + std::to_string(line) + ")");
    }
    for (auto it = jb.begin(); it != jb.end(); ++it)
      if (!timing(it.key()) && it.key() != "i" && !ja.contains(it.key()))
        return where(jb) + ": '" + it.key() + "' is in " + b + " only";
  }
}

}  // namespace tessel::train
