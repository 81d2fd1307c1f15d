#include "tools/bench/step_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sys/wait.h>
#include <filesystem>
#include <ostream>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "autograd/api.h"
#include "models/language_model.h"
#include "nn/optim.h"
#include "runtime/threadpool.h"
#include "tools/bench/torch_reference.h"

namespace tessel::tools {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct PartTimes {
  std::vector<double> forward, backward, optimizer, total;
};

// Quotes for /bin/sh.
std::string sh_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs `cmd`, returns its stdout (stderr passes through) and exit status.
std::pair<std::string, int> run_capture(const std::string& cmd) {
  std::FILE* p = popen(cmd.c_str(), "r");
  TESSEL_CHECK(p != nullptr, "bench step", "cannot run '{}'", cmd);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : 128};
}

nlohmann::ordered_json part(double ours, double ref, bool have_ref) {
  nlohmann::ordered_json j = {{"ours_s", ours}};
  if (have_ref) {
    j["reference_s"] = ref;
    j["speedup"] = ours > 0 ? ref / ours : 0.0;
  }
  return j;
}

}  // namespace

int run_step_bench(const StepBenchOptions& o, std::ostream& out) {
  const char* op = "bench step";
  const int threads = o.threads > 0 ? o.threads : num_threads();
  set_num_threads(threads);
  models::ModelConfig mc = models::model_config(o.model, o.config);
  mc.dropout = 0.0;  // both sides: no randomness inside the step
  mc = mc.resolved();
  const int64_t B = o.batch, T = o.seq > 0 ? o.seq : mc.max_seq_len;
  TESSEL_CHECK(T <= mc.max_seq_len, op, "seq {} exceeds the context {} of {} config '{}'", T, mc.max_seq_len, o.model,
               o.config);
  TESSEL_CHECK(B > 0 && o.steps > 0 && o.warmup >= 0, op, "need batch > 0, steps > 0, warmup >= 0 (got {}, {}, {})", B,
               o.steps, o.warmup);

  auto model = models::make_language_model(mc, o.seed);
  model->train();
  Tensor stream = randint(0, mc.vocab_size, {B, T + 1}, PhiloxKey{o.seed, stream_for("bench.step.batch")});
  Tensor ids = stream.slice(1, 0, T).contiguous();
  Tensor targets = stream.slice(1, 1, T + 1).contiguous();
  nn::AdamWOptions ao;  // nanoGPT's: lr 6e-4, betas (0.9, 0.95), weight decay 0.1 on matrices
  ao.lr = 6e-4;
  ao.betas = {0.9, 0.95};
  ao.weight_decay = 0.1;
  std::vector<nn::ParamGroup> groups = nn::default_param_groups(*model, ao.weight_decay);

  // Hand the initial weights to PyTorch before our steps change them.
  std::string dir, python;
  if (o.reference) {
    python = o.python.empty() ? reference_python() : o.python;
    TESSEL_CHECK(!python.empty(), op,
                 "no Python with torch: run `./tessel bench step` (it creates ~/.cache/tessel/venv) or set "
                 "TESSEL_PYTHON; --no-reference times tessel alone");
    char tmpl[] = "/tmp/tessel-bench-step.XXXXXX";
    TESSEL_CHECK(mkdtemp(tmpl) != nullptr, op, "cannot create a temporary folder");
    dir = tmpl;
    nlohmann::json meta = {{"model", o.model}, {"adamw", adamw_json(ao)},
                           {"param_groups", param_groups_json(groups, ao.weight_decay)}};
    write_reference_inputs(dir, *model, ids, targets, meta);
  }

  out << fmt::format("bench step: {}; batch {} x {} tokens, {} threads, fp32, AdamW; {} warm-up + {} timed steps\n",
                     mc.describe(), B, T, threads, o.warmup, o.steps);
  out.flush();
  nn::AdamW opt(groups, ao);
  PartTimes ours;
  double first_loss = 0;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    auto t0 = Clock::now();
    Tensor loss = model->loss(model->forward(ids), targets);
    const double f = seconds_since(t0);
    auto t1 = Clock::now();
    loss.backward();
    const double b = seconds_since(t1);
    auto t2 = Clock::now();
    opt.step();
    opt.zero_grad();
    const double u = seconds_since(t2);
    if (s == 0) first_loss = loss.item<double>();
    if (s < o.warmup) continue;
    ours.forward.push_back(f);
    ours.backward.push_back(b);
    ours.optimizer.push_back(u);
    ours.total.push_back(f + b + u);
  }
  const double of = median(ours.forward), ob = median(ours.backward), oo = median(ours.optimizer),
               ot = median(ours.total);

  // PyTorch's side.
  bool have_ref = false;
  double rf = 0, rb = 0, ro = 0, rt = 0, ref_loss = 0;
  std::string ref_name;
  int rc = 0;
  if (o.reference) {
    const std::string script = (std::filesystem::path(repository_root()) / "tools/bench/step_bench.py").string();
    const std::string cmd = fmt::format("{} {} {} --threads {} --warmup {} --steps {}", sh_quote(python),
                                        sh_quote(script), sh_quote(dir), threads, o.warmup, o.steps);
    auto [stdout_text, status] = run_capture(cmd);
    std::filesystem::remove_all(dir);
    // The last line of its stdout is the result.
    std::string last;
    std::istringstream lines(stdout_text);
    for (std::string line; std::getline(lines, line);)
      if (!line.empty()) last = line;
    nlohmann::json r = nlohmann::json::parse(last, nullptr, /*allow_exceptions=*/false);
    if (status != 0 || !r.is_object() || !r.contains("total")) {
      out << fmt::format("bench step: the PyTorch side failed (exit {}): {}\n", status, stdout_text);
      rc = 1;
    } else {
      have_ref = true;
      rf = r["forward"].get<double>();
      rb = r["backward"].get<double>();
      ro = r["optimizer"].get<double>();
      rt = r["total"].get<double>();
      ref_loss = r["first_loss"].get<double>();
      ref_name = fmt::format("pytorch {} (CPU, {} threads)", r["torch"].get<std::string>(), r["threads"].get<int>());
    }
  }

  const double tokens = double(B * T);
  out << fmt::format("  {:10s} {:>12s} {:>12s} {:>9s}\n", "part", "tessel (s)", "pytorch (s)", "speedup");
  auto row = [&](const char* name, double a, double r) {
    if (have_ref) out << fmt::format("  {:10s} {:12.4f} {:12.4f} {:9.2f}\n", name, a, r, a > 0 ? r / a : 0.0);
    else out << fmt::format("  {:10s} {:12.4f} {:>12s} {:>9s}\n", name, a, "-", "-");
  };
  row("forward", of, rf);
  row("backward", ob, rb);
  row("optimizer", oo, ro);
  row("step", ot, rt);
  out << fmt::format("  tessel {:.0f} tokens/s", tokens / ot);
  if (have_ref) out << fmt::format(", pytorch {:.0f} tokens/s", tokens / rt);
  out << "\n";
  if (have_ref) {
    const double rel = std::fabs(first_loss - ref_loss) / std::max(std::fabs(ref_loss), 1e-30);
    out << fmt::format("  first-step loss: tessel {:.6f}, pytorch {:.6f} (rel. diff {:.1e})\n", first_loss, ref_loss,
                       rel);
    if (rel > 1e-4) {
      out << "bench step: the two sides computed different losses; the comparison is not meaningful\n";
      rc = 1;
    }
  }

  nlohmann::ordered_json j = {{"bench", "step"}, {"model", o.model}, {"config", o.config}, {"ours_s", ot}};
  if (have_ref) {
    j["reference"] = ref_name;
    j["reference_s"] = rt;
    j["speedup"] = rt / ot;
  } else {
    j["reference"] = nullptr;
    j["reference_s"] = nullptr;
    j["speedup"] = nullptr;
  }
  j["forward"] = part(of, rf, have_ref);
  j["backward"] = part(ob, rb, have_ref);
  j["optimizer"] = part(oo, ro, have_ref);
  j["tokens_per_s"] = tokens / ot;
  if (have_ref) j["reference_tokens_per_s"] = tokens / rt;
  j["batch"] = B;
  j["seq"] = T;
  j["threads"] = threads;
  j["steps"] = o.steps;
  j["first_loss"] = have_ref ? nlohmann::ordered_json{{"ours", first_loss}, {"reference", ref_loss}}
                             : nlohmann::ordered_json{{"ours", first_loss}};
  out << j.dump() << std::endl;
  return rc;
}

}  // namespace tessel::tools
