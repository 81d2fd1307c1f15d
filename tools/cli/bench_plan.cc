// `tessel bench plan`: the planner's predictions against real runs on this
// machine (docs/plan.md). For each model and each rank count (2: one core
// each; 4: MPI ranks sharing the 2 cores, planner::with_devices) it plans,
// runs the planner's pick and other layouts that fit -- the fastest
// predicted and a spread over the rest -- through `tessel launch -n R --
// train` with TESSEL_THREADS=1, and reports predicted vs measured step time,
// the rank correlation (spearman) and the measured time of the fastest
// layout over the pick's (pick_vs_best). Ends with one JSON line.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "planner/planner.h"
#include "runtime/error.h"
#include "tools/bench/machine.h"
#include "tools/cli/commands.h"

namespace tessel::cli {
namespace {

struct BenchPlanArgs {
  std::vector<std::string> models = {"nanogpt:small", "llama:small"};
  std::vector<int64_t> ranks = {2, 4};
  int64_t batch = 8, seq_len = 256, steps = 5;
  int per_model = 7;  // layouts run per model (the pick included)
  int rounds = 2;     // runs of each layout, interleaved (medians reported)
};

std::string self_exe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  TESSEL_CHECK(n > 0, "bench plan", "cannot find this executable");
  return std::string(buf, size_t(n));
}

// Average seconds per step of `tessel launch -n RANKS -- train ...` (its "N tokens/s").
double run_layout(const std::string& model, const std::string& config, int64_t ranks, const planner::Candidate& c,
                  const BenchPlanArgs& a) {
  std::string cmd = fmt::format(FMT_STRING("TESSEL_THREADS=1 '{}' launch -n {} -- train --model {} --config {} --steps {} "
                                           "--batch-size {} --seq-len {} --sample-length 0 --eval-every 0 "
                                           "--out /tmp/tessel-bench-plan"),
                                self_exe(), ranks, model, config, a.steps, a.batch, a.seq_len);
  if (!c.mesh().empty()) cmd += " --mesh " + c.mesh();
  if (c.zero) cmd += fmt::format(FMT_STRING(" --zero {}"), c.zero);
  if (c.micro_batches > 1) cmd += fmt::format(FMT_STRING(" --micro-batches {}"), c.micro_batches);
  if (c.pp > 1) cmd += " --pipeline-schedule " + c.schedule;
  if (c.pp > 1 && c.virtual_stages > 1) cmd += fmt::format(FMT_STRING(" --virtual-stages {}"), c.virtual_stages);
  if (c.sp) cmd += " --sequence-parallel";
  if (c.recompute != nn::Recompute::None) cmd += std::string(" --recompute ") + nn::recompute_name(c.recompute);
  cmd += " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  TESSEL_CHECK(p != nullptr, "bench plan", "cannot run: {}", cmd);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int rc = pclose(p);
  std::smatch m;
  static const std::regex tps(R"(([0-9.]+) tokens/s; final)");
  TESSEL_CHECK(rc == 0 && std::regex_search(out, m, tps), "bench plan", "{} failed:\n{}", cmd,
               out.substr(out.size() > 2000 ? out.size() - 2000 : 0));
  return double(a.batch * a.seq_len) / std::stod(m[1]);
}

// Spearman's rank correlation (no ties expected; ties take their order).
double spearman(const std::vector<double>& x, const std::vector<double>& y) {
  const size_t n = x.size();
  if (n < 2) return 1.0;
  auto ranks = [&](const std::vector<double>& v) {
    std::vector<size_t> idx(n);
    for (size_t i = 0; i < n; ++i) idx[i] = i;
    std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
    std::vector<double> r(n);
    for (size_t i = 0; i < n; ++i) r[idx[i]] = double(i);
    return r;
  };
  const auto rx = ranks(x), ry = ranks(y);
  double d2 = 0;
  for (size_t i = 0; i < n; ++i) d2 += (rx[i] - ry[i]) * (rx[i] - ry[i]);
  return 1.0 - 6.0 * d2 / (double(n) * (double(n) * double(n) - 1.0));
}

int run_bench_plan(const BenchPlanArgs& a) {
  tools::BenchMachine machine = tools::begin_bench(std::cout);
  nlohmann::json per_model = nlohmann::json::array();
  std::vector<double> all_pred, all_meas, pick_ratio;
  std::vector<std::pair<std::string, int64_t>> groups;  // (MODEL:CONFIG, ranks)
  for (const std::string& spec : a.models)
    for (const int64_t ranks : a.ranks) groups.push_back({spec, ranks});
  for (const auto& [spec, ranks] : groups) {
    const size_t colon = spec.find(':');
    TESSEL_CHECK(colon != std::string::npos, "bench plan", "--models: expected MODEL:CONFIG, got '{}'", spec);
    const std::string model = spec.substr(0, colon), config = spec.substr(colon + 1);
    planner::PlanRequest r;
    r.model = models::model_config(model, config);
    r.cluster = planner::with_devices(planner::cluster_preset("cpu"), ranks);
    r.global_batch = a.batch;
    r.seq_len = a.seq_len;
    r.runners_up = 100000;  // every runnable layout, fastest predicted first
    const planner::PlanResult p = planner::plan(r);
    std::vector<planner::Candidate> fitting = {p.best};
    for (const auto& c : p.runners_up)
      if (c.fits) fitting.push_back(c);
    // The pick, the next fastest predictions, then a spread over the rest.
    std::vector<planner::Candidate> chosen;
    const size_t head = std::min<size_t>(fitting.size(), size_t(a.per_model / 2 + 1));
    for (size_t i = 0; i < head; ++i) chosen.push_back(fitting[i]);
    const size_t rest = size_t(a.per_model) > head ? size_t(a.per_model) - head : 0;
    for (size_t k = 1; k <= rest && fitting.size() > head; ++k) {
      const size_t i = head + (fitting.size() - head - 1) * k / rest;
      if (chosen.back().str() != fitting[i].str()) chosen.push_back(fitting[i]);
    }
    std::cout << fmt::format(FMT_STRING("bench plan: {} {} on {} ranks ({}), {} x {} tokens, {} steps, "
                                        "medians of {} interleaved rounds\n"),
                             model, config, ranks, r.cluster.str(), a.batch, a.seq_len, a.steps, a.rounds);
    // Rounds interleaved: a layout's runs are spread over the bench, so a
    // slow spell of the machine does not land on one layout only.
    std::vector<std::vector<double>> times(chosen.size());
    for (int round = 0; round < a.rounds; ++round)
      for (size_t i = 0; i < chosen.size(); ++i) times[i].push_back(run_layout(model, config, ranks, chosen[i], a));
    std::vector<double> pred, meas;
    nlohmann::json rows = nlohmann::json::array();
    for (size_t i = 0; i < chosen.size(); ++i) {
      const planner::Candidate& c = chosen[i];
      const double t = tools::median(times[i]);
      pred.push_back(c.step_s);
      meas.push_back(t);
      std::cout << fmt::format(FMT_STRING("  {:<44} predicted {:7.3f} s  measured {:7.3f} s\n"), c.str(), c.step_s, t);
      rows.push_back({{"layout", c.str()}, {"predicted_s", c.step_s}, {"measured_s", t}});
    }
    const double best = *std::min_element(meas.begin(), meas.end());
    const double rho = spearman(pred, meas), ratio = best / meas[0];
    std::cout << fmt::format(FMT_STRING("  spearman {:.3f}; the pick ({}) at {:.3f} of the fastest measured\n"), rho,
                             chosen[0].str(), ratio);
    per_model.push_back({{"model", spec}, {"ranks", ranks}, {"layouts", rows}, {"spearman", rho}, {"pick_vs_best", ratio}});
    all_pred.insert(all_pred.end(), pred.begin(), pred.end());
    all_meas.insert(all_meas.end(), meas.begin(), meas.end());
    pick_ratio.push_back(ratio);
  }
  tools::end_bench(machine);
  double min_pick = *std::min_element(pick_ratio.begin(), pick_ratio.end());
  double mean_rho = 0;
  for (const auto& m : per_model) mean_rho += m["spearman"].get<double>() / double(per_model.size());
  std::cout << tools::machine_summary(machine);
  nlohmann::json j = {{"bench", "plan"},
                      {"ours_s", per_model[0]["layouts"][0]["measured_s"]},
                      {"reference", "the fastest measured layout"},
                      {"reference_s", per_model[0]["layouts"][0]["measured_s"].get<double>() * pick_ratio[0]},
                      {"speedup", pick_ratio[0]},
                      {"pick_vs_best", min_pick},
                      {"spearman", mean_rho},
                      {"models", per_model}};
  tools::add_machine(j, machine);
  std::cout << j.dump() << std::endl;
  return 0;
}

}  // namespace

void register_bench_plan(CLI::App& app) {
  static BenchPlanArgs a;
  CLI::App* cmd = add_command(*bench_command(app), "plan",
                              "the planner's predicted step times against real runs of several layouts on 2 and 4 "
                              "ranks (spearman, pick_vs_best); ends with one JSON line",
                              [] { return run_bench_plan(a); });
  cmd->add_option("--models", a.models, "MODEL:CONFIG, repeatable")->capture_default_str();
  cmd->add_option("--ranks", a.ranks, "MPI ranks, repeatable (more ranks than cores share them)")
      ->capture_default_str();
  cmd->add_option("--batch", a.batch, "global batch (sequences)")->capture_default_str();
  cmd->add_option("--seq-len", a.seq_len, "tokens per sequence")->capture_default_str();
  cmd->add_option("--steps", a.steps, "training steps per layout")->capture_default_str();
  cmd->add_option("--per-model", a.per_model, "layouts run per model")->capture_default_str();
  cmd->add_option("--rounds", a.rounds, "runs of each layout, interleaved (medians)")->capture_default_str();
}

}  // namespace tessel::cli
