#include "tools/bench/step_bench.h"


#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "autograd/api.h"
#include "models/language_model.h"
#include "nn/optim.h"
#include "runtime/allocator.h"
#include "runtime/profile.h"
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

// This process's peak resident set (VmHWM), and restarting it (Linux: writing
// "5" to /proc/self/clear_refs); 0 / a no-op where /proc has neither.
int64_t rss_peak_bytes() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return 0;
}
void reset_rss_peak() {
  std::ofstream f("/proc/self/clear_refs");
  if (f) f << "5";
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

// --- `--profile`: the two sides op by op --------------------------------------

constexpr std::array<const char*, 3> kParts = {"forward", "backward", "optimizer"};

// The category of one of tessel's op names in a part (0 forward, 1 backward,
// 2 optimizer); step_bench.py's CATEGORIES sorts PyTorch's op names into the
// same set. Bias gradients are column sums ("sum") on both sides.
std::string tessel_category(size_t part, std::string_view op) {
  if (part == 2) return "optimizer";
  constexpr std::string_view bwd = ".bwd";
  if (op.size() > bwd.size() && op.substr(op.size() - bwd.size()) == bwd) op.remove_suffix(bwd.size());
  if (op == "linear" || op == "matmul" || op == "sum") return "linear (GEMM, bias)";
  if (op == "scaled_dot_product_attention") return "attention";
  if (op == "layer_norm" || op == "rms_norm") return "norm";
  if (op == "gelu" || op == "silu" || op == "swiglu") return "activation";
  if (op == "cross_entropy") return "loss";
  if (op == "embedding") return "embedding";
  return "other";
}

struct OpTime {
  int64_t calls = 0;
  double self_s = 0;
  std::string category;
};

// One side's profiled steps: every op's self time per part, and each part's wall time.
struct SideProfile {
  std::array<std::map<std::string, OpTime>, 3> ops;
  std::array<double, 3> wall{};

  std::map<std::string, double> by_category(size_t part) const {
    std::map<std::string, double> c;
    for (const auto& [name, t] : ops[part]) c[t.category] += t.self_s;
    return c;
  }
  double self_total(size_t part) const {
    double s = 0;
    for (const auto& kv : ops[part]) s += kv.second.self_s;
    return s;
  }
};

// Prints the categories side by side per step (largest difference first),
// the time outside any op, and each side's largest ops; returns the JSON.
nlohmann::ordered_json report_profiles(const SideProfile& ours, const SideProfile& theirs, int steps, bool have_ref,
                                       std::ostream& out) {
  const double per = 1.0 / steps;
  out << fmt::format(FMT_STRING("  op by op: self time per step (ms) over {} profiled steps of each side; ratio = "
                                "pytorch / tessel\n"),
                     steps);
  out << fmt::format(FMT_STRING("  {:10s} {:22s} {:>9s} {:>9s} {:>7s} {:>9s}\n"), "part", "category", "tessel", "pytorch",
                     "ratio", "t - p");
  nlohmann::ordered_json j = {{"steps", steps}};
  for (size_t p = 0; p < kParts.size(); ++p) {
    std::map<std::string, double> a = ours.by_category(p), b = theirs.by_category(p);
    std::vector<std::string> cats;
    for (const auto& kv : a) cats.push_back(kv.first);
    for (const auto& kv : b)
      if (!a.count(kv.first)) cats.push_back(kv.first);
    auto at = [](const std::map<std::string, double>& m, const std::string& k) {
      auto it = m.find(k);
      return it == m.end() ? 0.0 : it->second;
    };
    std::sort(cats.begin(), cats.end(), [&](const std::string& x, const std::string& y) {
      return at(a, x) - at(b, x) > at(a, y) - at(b, y);
    });
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    auto row = [&](const std::string& name, double t, double r) {
      t *= per;
      r *= per;
      if (have_ref)
        out << fmt::format(FMT_STRING("  {:10s} {:22s} {:9.1f} {:9.1f} {:7.2f} {:+9.1f}\n"), kParts[p], name, 1e3 * t,
                           1e3 * r, t > 0 ? r / t : 0.0, 1e3 * (t - r));
      else
        out << fmt::format(FMT_STRING("  {:10s} {:22s} {:9.1f}\n"), kParts[p], name, 1e3 * t);
      nlohmann::ordered_json jr = {{"category", name}, {"ours_s", t}};
      if (have_ref) jr["reference_s"] = r;
      rows.push_back(jr);
    };
    for (const std::string& c : cats) row(c, at(a, c), at(b, c));
    row("(outside ops)", std::max(0.0, ours.wall[p] - ours.self_total(p)),
        std::max(0.0, theirs.wall[p] - theirs.self_total(p)));
    j[kParts[p]] = rows;
  }
  // The largest ops of each side, so a category's contents can be checked.
  auto top = [&](const char* side, const SideProfile& s) {
    for (size_t p = 0; p < kParts.size(); ++p) {
      std::vector<std::pair<std::string, OpTime>> v(s.ops[p].begin(), s.ops[p].end());
      std::sort(v.begin(), v.end(), [](const auto& x, const auto& y) { return x.second.self_s > y.second.self_s; });
      for (size_t i = 0; i < v.size() && i < 6; ++i)
        out << fmt::format(FMT_STRING("  {:7s} {:9s} {:9.1f} ms {:7g} calls  {} [{}]\n"), side, kParts[p],
                           1e3 * per * v[i].second.self_s, double(v[i].second.calls) * per, v[i].first,
                           v[i].second.category);
    }
  };
  out << "  the largest ops of each side (self time and calls per step):\n";
  top("tessel", ours);
  if (have_ref) top("pytorch", theirs);
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
  TESSEL_CHECK(B > 0 && o.steps > 0 && o.warmup >= 0 && o.profile_steps >= 0, op,
               "need batch > 0, steps > 0, warmup >= 0, profile steps >= 0 (got {}, {}, {}, {})", B, o.steps, o.warmup,
               o.profile_steps);

  TESSEL_CHECK(!o.torch_compile || (o.reference && o.warmup >= 1), op,
               "the torch.compile reference needs the PyTorch side (not --no-reference) and a warm-up step (its "
               "first step compiles); got reference {}, warmup {}",
               o.reference, o.warmup);
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
  std::unique_ptr<ReferenceProcess> ref, compiled_ref;  // PyTorch eager; torch.compile (--torch-compile)
  std::string ref_name, compiled_name, compiled_error;
  int rc = 0;
  if (o.reference) {
    const std::string script = (std::filesystem::path(repository_root()) / "tools/bench/step_bench.py").string();
    auto start = [&](bool compiled, std::string& name) {
      std::vector<std::string> argv = {python, script, dir, "--threads", std::to_string(threads)};
      if (compiled) argv.push_back("--compile");
      auto p = std::make_unique<ReferenceProcess>("bench step", argv);
      nlohmann::json hello = p->ask("");
      TESSEL_CHECK(hello.is_object() && hello.value("ready", false), op,
                   "the PyTorch side ({} {}) did not start; its errors are above", python, script);
      name = fmt::format(FMT_STRING("pytorch {} ({}CPU, {} threads, {})"), hello["torch"].get<std::string>(),
                         compiled ? "torch.compile inductor, " : "", hello["threads"].get<int>(),
                         hello.value("cpu_capability", std::string("ISA unknown")));
      return p;
    };
    ref = start(false, ref_name);
    if (o.torch_compile) compiled_ref = start(true, compiled_name);
  }

  // Steps alternate between the sides (who goes first rotates too), so a
  // machine that gets busier or quieter during the run affects all alike.
  nn::AdamW opt(groups, ao);
  PartTimes ours, theirs, compiled;
  double first_loss = 0, ref_loss = 0, compiled_loss = 0, compiled_first_step_s = 0;
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
  // One step of a PyTorch side. torch.compile may fail on a machine (no
  // compiler, an inductor error): that side is dropped with its reason.
  auto reference_step = [&](std::unique_ptr<ReferenceProcess>& side, PartTimes& times, double& loss0, int s) {
    if (!side) return;
    settle();
    nlohmann::json r = side->ask("step");
    if (&side == &compiled_ref && r.is_object() && r.contains("error")) {
      compiled_error = r["error"].get<std::string>();
      out << "  torch.compile reference dropped: " << compiled_error << "\n";
      side.reset();
      return;
    }
    TESSEL_CHECK(r.is_object() && r.contains("forward"), op, "the PyTorch side failed at step {}: {}", s + 1,
                 r.is_discarded() ? "no answer (its errors are above)" : r.dump());
    const double f = r["forward"], b = r["backward"], u = r["optimizer"];
    if (s == 0) {
      loss0 = r["loss"].get<double>();
      if (&side == &compiled_ref) compiled_first_step_s = f + b + u;  // includes compiling
    }
    if (s < o.warmup) return;
    times.forward.push_back(f);
    times.backward.push_back(b);
    times.optimizer.push_back(u);
    times.total.push_back(f + b + u);
    times.cpu.push_back(r["cpu"].get<double>());
  };
  // Peak memory of the timed steps: the allocator's peak and the peak
  // resident set (VmHWM, restarted through /proc/self/clear_refs) of each process.
  auto reset_peaks = [&] {
    cpu_allocator()->reset_peak();
    reset_rss_peak();
    for (auto* side : {&ref, &compiled_ref})
      if (*side) (*side)->ask("reset_peak");
  };
  std::vector<std::function<void(int)>> sides = {our_step};
  if (ref) sides.push_back([&](int s) { reference_step(ref, theirs, ref_loss, s); });
  if (compiled_ref) sides.push_back([&](int s) { reference_step(compiled_ref, compiled, compiled_loss, s); });
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    if (s == o.warmup) reset_peaks();
    for (size_t k = 0; k < sides.size(); ++k) sides[(size_t(s) + k) % sides.size()](s);
    if (s < o.warmup) {
      out << fmt::format(FMT_STRING("  step {}/{}: warm-up\n"), s + 1, o.warmup + o.steps);
    } else {
      out << fmt::format(FMT_STRING("  step {}/{}: tessel {:.3f} s"), s + 1, o.warmup + o.steps, ours.total.back());
      if (ref) out << fmt::format(FMT_STRING(", pytorch {:.3f} s"), theirs.total.back());
      if (compiled_ref) out << fmt::format(FMT_STRING(", torch.compile {:.3f} s"), compiled.total.back());
      out << "\n";
    }
    out.flush();
  }
  const int64_t our_alloc_peak = cpu_allocator()->stats().peak_bytes, our_rss_peak = rss_peak_bytes();
  int64_t ref_rss_peak = 0, compiled_rss_peak = 0;
  if (ref) ref_rss_peak = ref->ask("memory").value("rss_peak_bytes", int64_t(0));
  if (compiled_ref) compiled_rss_peak = compiled_ref->ask("memory").value("rss_peak_bytes", int64_t(0));
  compiled_ref.reset();
  // --profile: more steps, alternating, each part under each side's profiler.
  SideProfile our_prof, their_prof;
  auto our_profiled_step = [&] {
    settle();
    std::array<profile::Profiler, 3> prof;
    Tensor loss;
    auto t0 = Clock::now();
    {
      profile::Scope scope(&prof[0]);
      loss = model->loss(model->forward(ids), targets);
    }
    our_prof.wall[0] += seconds_since(t0);
    t0 = Clock::now();
    {
      profile::Scope scope(&prof[1]);
      loss.backward();
    }
    our_prof.wall[1] += seconds_since(t0);
    t0 = Clock::now();
    {
      profile::Scope scope(&prof[2]);
      profile::Timer timer("optimizer.step");
      opt.step();
      opt.zero_grad();
    }
    our_prof.wall[2] += seconds_since(t0);
    for (size_t p = 0; p < prof.size(); ++p)
      for (const profile::Row& r : prof[p].rows()) {
        OpTime& t = our_prof.ops[p][r.name];
        t.calls += r.calls;
        t.self_s += r.self_s;
        t.category = tessel_category(p, r.name);
      }
  };
  auto their_profiled_step = [&] {
    settle();
    nlohmann::json r = ref->ask("profile");
    TESSEL_CHECK(r.is_object() && r.contains("parts"), op, "the PyTorch side failed a profiled step: {}",
                 r.is_discarded() ? "no answer (its errors are above)" : r.dump());
    for (size_t p = 0; p < kParts.size(); ++p) {
      their_prof.wall[p] += r["wall"][kParts[p]].get<double>();
      for (const auto& [name, v] : r["parts"][kParts[p]].items()) {
        OpTime& t = their_prof.ops[p][name];
        t.calls += v[0].get<int64_t>();
        t.self_s += v[1].get<double>();
        t.category = p == 2 ? "optimizer" : r["categories"][name].get<std::string>();
      }
    }
  };
  for (int s = 0; s < o.profile_steps; ++s) {
    if (s % 2 == 0 || !ref) our_profiled_step();
    if (ref) their_profiled_step();
    if (s % 2 == 1 && ref) our_profiled_step();
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
  const bool have_compiled = !compiled.total.empty();
  const double ct = have_compiled ? median(compiled.total) : 0.0;
  if (have_compiled)
    out << fmt::format(FMT_STRING("  torch.compile step {:.4f} s (speedup {:.2f}; forward {:.4f}, backward {:.4f}, "
                                  "optimizer {:.4f}); its first step, compiling: {:.1f} s\n"),
                       ct, ct / ot, median(compiled.forward), median(compiled.backward), median(compiled.optimizer),
                       compiled_first_step_s);
  auto mib = [](int64_t bytes) { return double(bytes) / double(1 << 20); };
  out << fmt::format(FMT_STRING("  peak memory of the timed steps: tessel allocator {:.1f} MiB, resident {:.1f} MiB"),
                     mib(our_alloc_peak), mib(our_rss_peak));
  if (have_ref) out << fmt::format(FMT_STRING("; pytorch resident {:.1f} MiB"), mib(ref_rss_peak));
  if (have_compiled) out << fmt::format(FMT_STRING("; torch.compile resident {:.1f} MiB"), mib(compiled_rss_peak));
  out << "\n";
  if (have_compiled) {
    const double rel = std::fabs(first_loss - compiled_loss) / std::max(std::fabs(compiled_loss), 1e-30);
    if (rel > 1e-4) {
      out << fmt::format(FMT_STRING("bench step: torch.compile's first-step loss {:.6f} is not tessel's {:.6f}; the "
                                    "comparison is not meaningful\n"),
                         compiled_loss, first_loss);
      rc = 1;
    }
  }
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
  nlohmann::ordered_json memory = {{"ours_allocator_peak_mib", mib(our_alloc_peak)},
                                   {"ours_rss_peak_mib", mib(our_rss_peak)}};
  if (have_ref) memory["reference_rss_peak_mib"] = mib(ref_rss_peak);
  if (have_compiled) memory["compiled_rss_peak_mib"] = mib(compiled_rss_peak);
  j["memory"] = memory;
  if (o.torch_compile && have_ref) {
    if (have_compiled)
      j["compiled_reference"] = {{"name", compiled_name},
                                 {"reference_s", ct},
                                 {"speedup", ct / ot},
                                 {"forward", part(of, median(compiled.forward), true)},
                                 {"backward", part(ob, median(compiled.backward), true)},
                                 {"optimizer", part(oo, median(compiled.optimizer), true)},
                                 {"first_step_s", compiled_first_step_s},
                                 {"first_loss", compiled_loss}};
    else
      j["compiled_reference"] = {{"name", compiled_name}, {"error", compiled_error}};
  }
  if (o.profile_steps > 0) j["profile"] = report_profiles(our_prof, their_prof, o.profile_steps, have_ref, out);
  end_bench(machine);
  add_machine(j, machine);
  out << machine_summary(machine);
  out << j.dump() << std::endl;
  return rc;
}

}  // namespace tessel::tools
