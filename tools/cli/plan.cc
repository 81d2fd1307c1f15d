// `tessel plan`: the fastest layout of a model that fits a cluster (planner/planner.h, docs/plan.md).
#include <cstdio>
#include <sstream>

#include "models/config.h"
#include "planner/planner.h"
#include "runtime/error.h"
#include "tools/cli/commands.h"

namespace tessel::cli {
namespace {

struct PlanArgs {
  std::string model = "llama", config = "small";
  std::string cluster = "cpu";
  int64_t nodes = 1, devices = 0;
  int64_t batch = 8, seq_len = 256;
  std::string dtype = "float32";
  bool bitwise = false, json = false, calibrate = false;
  double headroom = 0.10;
  std::string fix, recompute;
  int runners_up = 5;
};

// "tp=2,pp=1,zero=0" -> {tp: 2, ...}.
std::map<std::string, int64_t> parse_fixed(const std::string& text) {
  std::map<std::string, int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    TESSEL_CHECK(eq != std::string::npos && eq > 0, "plan", "--fix: expected NAME=VALUE items, got '{}'", item);
    try {
      out[item.substr(0, eq)] = std::stoll(item.substr(eq + 1));
    } catch (const std::exception&) {
      TESSEL_FAIL("plan", "--fix: '{}' is not NAME=INTEGER", item);
    }
  }
  return out;
}

int run_plan(const PlanArgs& a) {
  planner::PlanRequest r;
  r.model = models::model_config(a.model, a.config);
  if (a.calibrate) {
    TESSEL_CHECK(a.cluster == "cpu", "plan", "--calibrate measures this machine: it needs --cluster cpu, got '{}'",
                 a.cluster);
    planner::calibrate_cpu(/*force=*/true);
  }
  r.cluster = planner::cluster_preset(a.cluster, a.nodes);
  if (a.devices > 0) r.cluster = planner::with_devices(r.cluster, a.devices);
  r.global_batch = a.batch;
  r.seq_len = a.seq_len;
  r.compute = a.dtype == "float32" ? DType::Float32 : a.dtype == "bfloat16" ? DType::BFloat16 : DType::Float16;
  TESSEL_CHECK(a.dtype == "float32" || a.dtype == "bfloat16" || a.dtype == "float16", "plan",
               "--dtype must be float32, bfloat16 or float16, got '{}'", a.dtype);
  r.bitwise = a.bitwise;
  r.headroom = a.headroom;
  r.fixed = parse_fixed(a.fix);
  if (!a.recompute.empty()) r.recompute = nn::parse_recompute(a.recompute);
  r.runners_up = a.runners_up;
  const planner::PlanResult p = planner::plan(r);
  if (!a.json) std::fputs(planner::format_plan(r, p).c_str(), stdout);
  std::printf("%s\n", planner::plan_json(r, p).dump().c_str());
  return 0;
}

}  // namespace

void register_plan(CLI::App& app) {
  static PlanArgs a;
  CLI::App* cmd = add_command(app, "plan", "Find the fastest layout of a model that fits a cluster (docs/plan.md)",
                              [] { return run_plan(a); });
  cmd->add_option("--model", a.model, "nanogpt | llama | mixtral")->capture_default_str();
  cmd->add_option("--config", a.config, "named model config (e.g. small, gpt2-124m, llama-7b, llama3-8b)")
      ->capture_default_str();
  cmd->add_option("--cluster", a.cluster, "cpu (this machine, calibrated) | h100 | h200 (8 per node)")
      ->capture_default_str();
  cmd->add_option("--nodes", a.nodes, "nodes of the cluster")->capture_default_str();
  cmd->add_option("--devices", a.devices, "devices to plan for (default: all of the cluster's)");
  cmd->add_option("--batch", a.batch, "global batch: sequences per step")->capture_default_str();
  cmd->add_option("--seq-len", a.seq_len, "tokens per sequence")->capture_default_str();
  cmd->add_option("--dtype", a.dtype, "compute dtype: float32 | bfloat16 | float16")->capture_default_str();
  cmd->add_flag("--bitwise", a.bitwise, "plan for bitwise mode");
  cmd->add_option("--headroom", a.headroom, "share of each device's memory kept free")->capture_default_str();
  cmd->add_option("--fix", a.fix, "constraints, e.g. tp=2,pp=1,zero=1,sp=1,micro_batches=4,virtual_stages=1");
  cmd->add_option("--recompute", a.recompute, "fix the recomputation policy: none | selective | full");
  cmd->add_option("--runners-up", a.runners_up, "layouts to list after the best")->capture_default_str();
  cmd->add_flag("--json", a.json, "print only the JSON document");
  cmd->add_flag("--calibrate", a.calibrate, "measure this machine again (cluster cpu)");
}

}  // namespace tessel::cli
