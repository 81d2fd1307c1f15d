#include "nn/parallel/plan.h"

#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/error.h"

namespace tessel::parallel {

std::regex compile_regex(const std::string& pattern) {
  static std::mutex mu;
  // Compiled once per pattern: every rank of every layout the planner
  // simulates lays out the same plan (a copy shares the compiled automaton).
  static std::map<std::string, std::regex> compiled;
  std::lock_guard<std::mutex> lock(mu);
  auto it = compiled.find(pattern);
  if (it == compiled.end()) it = compiled.emplace(pattern, std::regex(pattern)).first;
  return it->second;
}

Placements DimLayout::on(const Mesh& mesh, const Placements& base) const {
  Placements p = base;
  for (const auto& [name, pl] : dims) {
    for (int m = 0; m < mesh.ndim(); ++m)
      if (mesh.name(m) == name) p[m] = pl;
  }
  return p;
}

std::string DimLayout::str() const {
  std::string s = "{";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + dims[i].first + ": " + dims[i].second.str();
  return s + "}";
}

Placement parse_placement(const std::string& s, const std::string& where) {
  if (s == "R") return Replicate();
  if (s == "P") return Partial();
  if (s.size() >= 4 && s[0] == 'S' && s[1] == '(' && s.back() == ')') {
    const std::string num = s.substr(2, s.size() - 3);
    if (!num.empty() && num.find_first_not_of("0123456789") == std::string::npos) return Shard(std::stoi(num));
  }
  TESSEL_FAIL("plan", "{}: placement '{}' is not one of \"R\", \"P\", \"S(d)\"", where, s);
}

namespace {

DimLayout layout_from(const nlohmann::json& j, const std::string& where, bool skip_match) {
  TESSEL_CHECK(j.is_object(), "plan", "{}: expected an object of mesh dim -> placement", where);
  DimLayout l;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (skip_match && (it.key() == "match" || it.key() == "input" || it.key() == "output")) continue;
    TESSEL_CHECK(it.value().is_string(), "plan", "{}: placement of mesh dim '{}' must be a string", where, it.key());
    l.dims.emplace_back(it.key(), parse_placement(it.value().get<std::string>(), where + "." + it.key()));
  }
  return l;
}

nlohmann::ordered_json layout_json(const DimLayout& l) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [name, p] : l.dims) j[name] = p.is_partial() ? "P" : p.str();
  return j;
}

void check_regex(const std::string& re, const std::string& where) {
  try {
    compile_regex(re);
  } catch (const std::regex_error& e) {
    TESSEL_FAIL("plan", "{}: '{}' is not a valid regex ({})", where, re, e.what());
  }
}

}  // namespace

ParallelPlan ParallelPlan::from_json(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    TESSEL_FAIL("plan", "{}: not valid JSON ({})", source, e.what());
  }
  TESSEL_CHECK(j.is_object(), "plan", "{}: expected a JSON object", source);
  ParallelPlan p;
  p.name = j.value("name", source);
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    TESSEL_CHECK(k == "name" || k == "params" || k == "modules" || k == "experts" || k == "data", "plan",
                 "{}: unknown key '{}' (expected name, params, modules, experts, data)", source, k);
  }
  if (j.contains("params")) {
    TESSEL_CHECK(j["params"].is_array(), "plan", "{}: 'params' must be an array", source);
    for (size_t i = 0; i < j["params"].size(); ++i) {
      const auto& r = j["params"][i];
      const std::string where = fmt::format(FMT_STRING("{}: params[{}]"), source, i);
      TESSEL_CHECK(r.is_object() && r.contains("match") && r["match"].is_string(), "plan",
                   "{} needs a string 'match'", where);
      ParamRule rule{r["match"].get<std::string>(), layout_from(r, where, true)};
      check_regex(rule.match, where);
      for (const auto& [d, pl] : rule.layout.dims)
        TESSEL_CHECK(!pl.is_partial(), "plan", "{}: a parameter cannot be Partial (mesh dim '{}')", where, d);
      p.params.push_back(std::move(rule));
    }
  }
  if (j.contains("modules")) {
    TESSEL_CHECK(j["modules"].is_array(), "plan", "{}: 'modules' must be an array", source);
    for (size_t i = 0; i < j["modules"].size(); ++i) {
      const auto& r = j["modules"][i];
      const std::string where = fmt::format(FMT_STRING("{}: modules[{}]"), source, i);
      TESSEL_CHECK(r.is_object() && r.contains("match") && r["match"].is_string(), "plan",
                   "{} needs a string 'match'", where);
      ModuleRule rule;
      rule.match = r["match"].get<std::string>();
      check_regex(rule.match, where);
      if (r.contains("input")) rule.input = layout_from(r["input"], where + ".input", false);
      if (r.contains("output")) rule.output = layout_from(r["output"], where + ".output", false);
      TESSEL_CHECK(!rule.input.empty() || !rule.output.empty(), "plan", "{} sets neither input nor output", where);
      p.modules.push_back(std::move(rule));
    }
  }
  if (j.contains("experts")) {
    TESSEL_CHECK(j["experts"].is_array(), "plan", "{}: 'experts' must be an array", source);
    for (size_t i = 0; i < j["experts"].size(); ++i) {
      const auto& r = j["experts"][i];
      const std::string where = fmt::format(FMT_STRING("{}: experts[{}]"), source, i);
      TESSEL_CHECK(r.is_object() && r.contains("match") && r["match"].is_string() && r.contains("dim") &&
                       r["dim"].is_string(),
                   "plan", "{} needs a string 'match' (MoE module paths) and a string 'dim' (mesh dim)", where);
      ExpertRule rule{r["match"].get<std::string>(), r["dim"].get<std::string>()};
      check_regex(rule.match, where);
      p.experts.push_back(std::move(rule));
    }
  }
  if (j.contains("data")) p.data = layout_from(j["data"], source + ": data", false);
  return p;
}

ParallelPlan ParallelPlan::from_file(const std::string& path) {
  std::ifstream in(path);
  TESSEL_CHECK(in.good(), "plan", "cannot read plan file '{}'", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json(ss.str(), path);
}

std::string ParallelPlan::to_json() const {
  nlohmann::ordered_json j;
  j["name"] = name;
  j["params"] = nlohmann::ordered_json::array();
  for (const ParamRule& r : params) {
    nlohmann::ordered_json o = layout_json(r.layout);
    o["match"] = r.match;
    j["params"].push_back(o);
  }
  j["modules"] = nlohmann::ordered_json::array();
  for (const ModuleRule& r : modules) {
    nlohmann::ordered_json o;
    o["match"] = r.match;
    if (!r.input.empty()) o["input"] = layout_json(r.input);
    if (!r.output.empty()) o["output"] = layout_json(r.output);
    j["modules"].push_back(o);
  }
  if (!experts.empty()) {
    j["experts"] = nlohmann::ordered_json::array();
    for (const ExpertRule& r : experts) j["experts"].push_back({{"match", r.match}, {"dim", r.dim}});
  }
  j["data"] = layout_json(data);
  return j.dump(2);
}

ParallelPlan& ParallelPlan::column_parallel(const std::string& linear, bool bias, const std::string& dim) {
  params.push_back({linear + "\\.weight", DimLayout{{{dim, Shard(0)}}}});
  if (bias)
    params.push_back({linear + "\\.bias", DimLayout{{{dim, Shard(0)}}},
                      fmt::format(FMT_STRING("made by column_parallel(\"{}\"), which shards the bias too: for Linear "
                                             "layers without a bias, call column_parallel(\"{}\", /*bias=*/false)"),
                                  linear, linear)});
  return *this;
}

ParallelPlan& ParallelPlan::row_parallel(const std::string& linear, const std::string& dim) {
  params.push_back({linear + "\\.weight", DimLayout{{{dim, Shard(1)}}}});
  return *this;
}

ParallelPlan& ParallelPlan::vocabulary_parallel(const std::string& embedding, const std::string& dim) {
  params.push_back({embedding + "\\.weight", DimLayout{{{dim, Shard(0)}}}});
  return *this;
}

ParallelPlan& ParallelPlan::sequence_parallel(const std::string& sublayers, const std::string& embedding,
                                              const std::string& final_norm, const std::string& dim) {
  const DimLayout seq{{{dim, Shard(1)}}}, whole{{{dim, Replicate()}}};
  modules.push_back({embedding, {}, seq});
  modules.push_back({sublayers, whole, seq});
  modules.push_back({final_norm, {}, whole});
  return *this;
}

namespace {

DimLayout tp(Placement p) { return DimLayout{{{"tp", p}}}; }
void column(ParallelPlan& p, const std::string& re, bool bias) { p.column_parallel(re, bias); }
void row(ParallelPlan& p, const std::string& re) { p.row_parallel(re); }

void sequence_parallel(ParallelPlan& p, const std::string& sublayers, const std::string& embedding,
                       const std::string& final_norm) {
  p.sequence_parallel(sublayers, embedding, final_norm);
}

}  // namespace

std::vector<std::string> builtin_plan_names() { return {"nanogpt", "llama", "mixtral", "none"}; }

ParallelPlan builtin_plan(const std::string& name, bool sp) {
  ParallelPlan p;
  p.name = name + (sp ? "-tp-sp" : "-tp");
  if (name == "none") {
    p.name = "none";
    return p;
  }
  const std::string L = "layers\\.\\d+\\.";
  if (name == "nanogpt") {
    p.vocabulary_parallel("wte");  // the tied LM head too
    column(p, L + "attn\\.w[qkv]", true);
    row(p, L + "attn\\.wo");
    column(p, L + "mlp\\.fc", true);
    row(p, L + "mlp\\.proj");
    if (sp) sequence_parallel(p, L + "(attn|mlp)", "wte", "ln_f");
    return p;
  }
  if (name == "llama" || name == "mixtral") {
    p.vocabulary_parallel("tok_embeddings");
    p.params.push_back({"output\\.weight", tp(Shard(0))});  // column-parallel LM head: vocabulary-sharded logits
    column(p, L + "attn\\.w[qkv]", false);
    row(p, L + "attn\\.wo");
    const std::string ffn = name == "llama" ? L + "ffn\\." : L + "ffn\\.experts\\.\\d+\\.";
    column(p, ffn + "w[13]", false);
    row(p, ffn + "w2");
    if (name == "mixtral") p.experts.push_back({L + "ffn", "ep"});
    if (sp) sequence_parallel(p, L + "(attn|ffn)", "tok_embeddings", "norm");
    return p;
  }
  TESSEL_FAIL("plan", "unknown plan '{}'; built-in plans: nanogpt, llama, mixtral, none (or a .json file)", name);
}

ParallelPlan load_plan(const std::string& spec, bool sp) {
  if (spec.size() > 5 && spec.compare(spec.size() - 5, 5, ".json") == 0) return ParallelPlan::from_file(spec);
  return builtin_plan(spec, sp);
}

}  // namespace tessel::parallel
