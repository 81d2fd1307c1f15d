#include "tools/bench/step_bench.h"


#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <ostream>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "autograd/api.h"
#include "models/language_model.h"
#include "nn/optim.h"
#include "runtime/threadpool.h"
#include "tools/bench/machine.h"
#include "tools/bench/reference_process.h"
#include "tools/bench/torch_reference.h"

namespace tessel::tools {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct PartTimes {
  std::vector<double> forward, backward, optimizer, total;
  std::vector<double> cpu;  // process CPU seconds of the step (all threads)
};

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// Other threads (ours or OpenMP's, which spin a while after each region)
// go idle before a timed step starts.
void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }

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
  struct RemoveDir {
    std::string dir;
    ~RemoveDir() {
      std::error_code ec;
      if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    }
  } cleanup;
  std::string dir, python;
  if (o.reference) {
    python = o.python.empty() ? reference_python() : o.python;
    TESSEL_CHECK(!python.empty(), op,
                 "no Python with torch: run `./tessel bench step` (it creates ~/.cache/tessel/venv) or set "
                 "TESSEL_PYTHON; --no-reference times tessel alone");
    char tmpl[] = "/tmp/tessel-bench-step.XXXXXX";
    TESSEL_CHECK(mkdtemp(tmpl) != nullptr, op, "cannot create a temporary folder");
    dir = tmpl;
    cleanup.dir = dir;
    nlohmann::json meta = {{"model", o.model}, {"adamw", adamw_json(ao)},
                           {"param_groups", param_groups_json(groups, ao.weight_decay)}};
    write_reference_inputs(dir, *model, ids, targets, meta);
  }

  out << fmt::format(FMT_STRING("bench step: {}; batch {} x {} tokens, {} threads, fp32, AdamW; {} warm-up + {} timed steps\n"),
                     mc.describe(), B, T, threads, o.warmup, o.steps);
  out.flush();
  BenchMachine machine = begin_bench(out);
  std::unique_ptr<ReferenceProcess> ref;
  std::string ref_name;
  int rc = 0;
  if (o.reference) {
    const std::string script = (std::filesystem::path(repository_root()) / "tools/bench/step_bench.py").string();
    ref = std::make_unique<ReferenceProcess>("bench step", std::vector<std::string>{python, script, dir, "--threads", std::to_string(threads)});
    nlohmann::json hello = ref->ask("");
    TESSEL_CHECK(hello.is_object() && hello.value("ready", false), op,
                 "the PyTorch side ({} {}) did not start; its errors are above", python, script);
    ref_name = fmt::format(FMT_STRING("pytorch {} (CPU, {} threads, {})"), hello["torch"].get<std::string>(),
                           hello["threads"].get<int>(), hello.value("cpu_capability", std::string("ISA unknown")));
  }

  // Steps alternate between the two sides (who goes first alternates too),
  // so a machine that gets busier or quieter during the run affects both alike.
  nn::AdamW opt(groups, ao);
  PartTimes ours, theirs;
  double first_loss = 0, ref_loss = 0;
  auto our_step = [&](int s) {
    settle();
    const double c0 = process_cpu_seconds();
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
    const double cpu = process_cpu_seconds() - c0;
    if (s == 0) first_loss = loss.item<double>();
    if (s < o.warmup) return;
    ours.forward.push_back(f);
    ours.backward.push_back(b);
    ours.optimizer.push_back(u);
    ours.total.push_back(f + b + u);
    ours.cpu.push_back(cpu);
  };
  auto their_step = [&](int s) {
    settle();
    nlohmann::json r = ref->ask("step");
    TESSEL_CHECK(r.is_object() && r.contains("forward"), op, "the PyTorch side failed at step {}: {}", s + 1,
                 r.is_discarded() ? "no answer (its errors are above)" : r.dump());
    if (s == 0) ref_loss = r["loss"].get<double>();
    if (s < o.warmup) return;
    const double f = r["forward"], b = r["backward"], u = r["optimizer"];
    theirs.forward.push_back(f);
    theirs.backward.push_back(b);
    theirs.optimizer.push_back(u);
    theirs.total.push_back(f + b + u);
    theirs.cpu.push_back(r["cpu"].get<double>());
  };
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    if (s % 2 == 0 || !ref) our_step(s);
    if (ref) their_step(s);
    if (s % 2 == 1 && ref) our_step(s);
    if (s < o.warmup) {
      out << fmt::format(FMT_STRING("  step {}/{}: warm-up\n"), s + 1, o.warmup + o.steps);
    } else {
      out << fmt::format(FMT_STRING("  step {}/{}: tessel {:.3f} s"), s + 1, o.warmup + o.steps, ours.total.back());
      if (ref) out << fmt::format(FMT_STRING(", pytorch {:.3f} s"), theirs.total.back());
      out << "\n";
    }
    out.flush();
  }
  ref.reset();
  const bool have_ref = o.reference;
  const double of = median(ours.forward), ob = median(ours.backward), oo = median(ours.optimizer),
               ot = median(ours.total);
  const double rf = median(theirs.forward), rb = median(theirs.backward), ro = median(theirs.optimizer),
               rt = median(theirs.total);

  const double tokens = double(B * T);
  out << fmt::format(FMT_STRING("  {:10s} {:>12s} {:>12s} {:>9s}\n"), "part", "tessel (s)", "pytorch (s)", "speedup");
  auto row = [&](const char* name, double a, double r) {
    if (have_ref) out << fmt::format(FMT_STRING("  {:10s} {:12.4f} {:12.4f} {:9.2f}\n"), name, a, r, a > 0 ? r / a : 0.0);
    else out << fmt::format(FMT_STRING("  {:10s} {:12.4f} {:>12s} {:>9s}\n"), name, a, "-", "-");
  };
  row("forward", of, rf);
  row("backward", ob, rb);
  row("optimizer", oo, ro);
  row("step", ot, rt);
  const double oc = median(ours.cpu), rc_cpu = median(theirs.cpu);
  if (have_ref) out << fmt::format(FMT_STRING("  {:10s} {:12.4f} {:12.4f} {:9.2f}\n"), "step CPU", oc, rc_cpu, rc_cpu / oc);
  else out << fmt::format(FMT_STRING("  {:10s} {:12.4f} {:>12s} {:>9s}\n"), "step CPU", oc, "-", "-");
  out << fmt::format(FMT_STRING("  tessel {:.0f} tokens/s"), tokens / ot);
  if (have_ref) out << fmt::format(FMT_STRING(", pytorch {:.0f} tokens/s"), tokens / rt);
  out << "\n";
  if (have_ref) {
    const double rel = std::fabs(first_loss - ref_loss) / std::max(std::fabs(ref_loss), 1e-30);
    out << fmt::format(FMT_STRING("  first-step loss: tessel {:.6f}, pytorch {:.6f} (rel. diff {:.1e})\n"), first_loss, ref_loss,
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
  j["cpu"] = part(oc, rc_cpu, have_ref);
  j["tokens_per_s"] = tokens / ot;
  if (have_ref) j["reference_tokens_per_s"] = tokens / rt;
  j["batch"] = B;
  j["seq"] = T;
  j["threads"] = threads;
  j["steps"] = o.steps;
  j["first_loss"] = have_ref ? nlohmann::ordered_json{{"ours", first_loss}, {"reference", ref_loss}}
                             : nlohmann::ordered_json{{"ours", first_loss}};
  end_bench(machine);
  add_machine(j, machine);
  out << machine_summary(machine);
  out << j.dump() << std::endl;
  return rc;
}

}  // namespace tessel::tools
