#include "tools/bench/step_cuda_bench.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "autograd/api.h"
#include "models/language_model.h"
#include "nn/autocast.h"
#include "nn/clip.h"
#include "nn/module.h"
#include "nn/optim.h"
#include "run/run.h"
#include "runtime/allocator.h"
#include "runtime/numerics.h"
#include "runtime/profile.h"
#include "tools/bench/machine.h"

namespace tessel::tools {
namespace {

using Clock = std::chrono::steady_clock;

// Runs the PyTorch reference script; returns its JSON line (null when absent).
nlohmann::json torch_reference(const StepCudaBenchOptions& o, std::ostream& out) {
  // Default: the repository's copy (TESSEL_ROOT, set by ./tessel; else the working directory).
  const char* root = std::getenv("TESSEL_ROOT");
  std::string script = !o.torch_script.empty() ? o.torch_script
                       : root && *root          ? std::string(root) + "/tools/bench/step_cuda_torch.py"
                                                : "tools/bench/step_cuda_torch.py";
  std::string probe = o.python + " -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null";
  if (std::system(probe.c_str()) != 0) {
    out << "reference: PyTorch with CUDA is not importable by '" << o.python << "': skipped\n";
    return nullptr;
  }
  std::string cmd = fmt::format(FMT_STRING("{} {} --config {} --batch {} --seq {} --steps {} --warmup {} --dtype {}"), o.python,
                                script, o.config, o.batch, o.seq, o.steps, o.warmup, o.dtype);
  out << "reference: " << cmd << "\n";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) return nullptr;
  std::string text, last;
  char buf[4096];
  while (fgets(buf, sizeof buf, pipe.get())) {
    text = buf;
    out << "  " << text;
    if (!text.empty() && text[0] == '{') last = text;
  }
  if (last.empty()) return nullptr;
  try {
    return nlohmann::json::parse(last);
  } catch (...) {
    return nullptr;
  }
}

struct Timing {
  double step_ms = 0;
  float last_loss = 0;
  int64_t params = 0;
  int64_t peak_bytes = 0;
};

// Builds the model of `cfg` and times warm-up + timed steps with the GEMM mode `gemm`.
Timing time_steps(const StepCudaBenchOptions& o, models::ModelConfig cfg, const std::string& gemm,
                  std::ostream& out) {
  const Device dev(DeviceType::CUDA, 0);
  numerics::GemmModeGuard mode(numerics::parse_gemm_mode(gemm.c_str(), "--gemm"));
  cfg.max_seq_len = std::max(cfg.max_seq_len, o.seq);
  auto m = models::make_language_model(cfg, 1, dev);
  Timing t;
  for (const Tensor& p : m->parameters()) t.params += p.numel();
  nn::AdamWOptions ao;
  ao.lr = 6e-4;
  ao.betas = {0.9, 0.95};
  nn::AdamW opt(nn::default_param_groups(*m, 0.1), ao);
  Tensor ids = randint(0, cfg.vocab_size, {o.batch, o.seq + 1}, PhiloxKey{1, stream_for("bench.ids")},
                       TensorOptions(DType::Int64).with_device(dev));
  Tensor x = ids.narrow(1, 0, o.seq), y = ids.narrow(1, 1, o.seq);
  allocator_for(dev)->reset_peak();
  std::vector<double> times;
  // --profile: the timed steps' per-op host times. Kernels are asynchronous,
  // so run with CUDA_LAUNCH_BLOCKING=1 to make them the GPU's times per op.
  profile::Profiler profiler;
  std::optional<profile::Scope> profiling;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    synchronize(dev);
    if (o.profile && s == o.warmup) profiling.emplace(&profiler);
    const auto t0 = Clock::now();
    opt.zero_grad();
    Tensor loss;
    {
      std::optional<nn::AutocastScope> ac;
      if (o.dtype == "bf16") ac.emplace(DType::BFloat16);
      loss = m->loss(m->forward(x), y);
    }
    loss.backward();
    nn::clip_grad_norm_(m->parameters(), 1.0);
    opt.step();
    synchronize(dev);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (s >= o.warmup) times.push_back(ms);
    if (s == o.warmup + o.steps - 1) t.last_loss = loss.item<float>();
    out << fmt::format(FMT_STRING("[gemm {}] step {:3d}  {:8.2f} ms{}\n"), gemm, s, ms, s < o.warmup ? "  (warmup)" : "");
  }
  if (o.profile) {
    double total_ms = 0;
    for (double ms : times) total_ms += ms;
    out << "[gemm " << gemm << "] profile of the " << o.steps << " timed steps:\n"
        << profiler.table(total_ms / 1000.0, 40);
  }
  t.step_ms = median(times);
  t.peak_bytes = allocator_for(dev)->stats().peak_bytes;
  return t;
}

// A thread that runs the work it is given, one piece at a time, for the
// caller (who waits). A tessel::Run counts the backward passes of the thread
// that made it, so each side of the eager / compiled comparison lives on a
// thread of its own.
class SideThread {
 public:
  SideThread() : thread_([this] { loop(); }) {}
  ~SideThread() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // Runs `work` on the thread and waits; rethrows what it threw.
  void run(std::function<void()> work) {
    std::unique_lock<std::mutex> lk(mu_);
    work_ = std::move(work);
    cv_.notify_all();
    cv_.wait(lk, [&] { return !work_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || work_; });
      if (stop_) return;
      lk.unlock();
      try {
        work_();
      } catch (...) {
        error_ = std::current_exception();
      }
      lk.lock();
      work_ = nullptr;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> work_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;  // (last: starts once the rest exists)
};

// tessel::Run eager against compile mode (RunOptions::compile) on the same
// steps -- compile mode twice: with CUDA graphs (the default) and with every
// kernel launched from the host (compile_graphs = false) -- one step of
// each in turn (who goes first rotates), each timed between device
// synchronisations; the losses' bits and the parameters' hash compared at
// the end.
nlohmann::json compare_compiled(const StepCudaBenchOptions& o, models::ModelConfig cfg, Device dev, std::ostream& out) {
  numerics::GemmModeGuard mode(numerics::parse_gemm_mode(o.gemm.c_str(), "--gemm"));
  cfg.max_seq_len = std::max(cfg.max_seq_len, o.seq);
  cfg.dropout = 0.0;
  nn::AdamWOptions ao;
  ao.lr = 6e-4;
  ao.betas = {0.9, 0.95};
  ao.weight_decay = 0.1;
  struct Side {
    SideThread thread;
    std::optional<Run<models::LanguageModel>> run;
    std::vector<double> ms, step_bytes;
    std::vector<double> fb_ms, opt_ms;  // the step's parts: forward_backward, step_optimizer
    std::vector<uint64_t> loss_bits;
    std::string hash;
    CompileStats stats;
    ~Side() {  // the Run goes on its own thread (it counts that thread's backward passes), errors or not
      try {
        thread.run([this] { run.reset(); });
      } catch (...) {
      }
    }
  };
  constexpr int kSides = 3;
  Side side[kSides];  // [eager, compiled with CUDA graphs, compiled without]
  Allocator* alloc = allocator_for(dev);
  for (int k = 0; k < kSides; ++k) {
    side[k].thread.run([&, k] {
      auto m = models::make_language_model(cfg, 1, dev);
      RunOptions ro;
      ro.compile = k >= 1;
      ro.compile_graphs = k == 1;
      ro.clip = 1.0;
      ro.compute = o.dtype == "bf16" ? DType::BFloat16 : DType::Float32;
      side[k].run.emplace(parallelize(m, adamw(ao), ro));
    });
  }
  Tensor ids = randint(0, cfg.vocab_size, {o.batch, o.seq + 1}, PhiloxKey{1, stream_for("bench.ids")},
                       TensorOptions(DType::Int64).with_device(dev));
  const Tensor x = ids.narrow(1, 0, o.seq).contiguous(), y = ids.narrow(1, 1, o.seq).contiguous();
  const int warmup = std::max(o.warmup, 3);  // compile mode replays from its fourth step
  // On an error, each Run still goes on its own thread (it counts that
  // thread's backward passes).
  // After the timed steps, kParts more of each side split at the end of
  // forward_backward (a synchronisation there, so not among the timed
  // steps: it keeps the host from queueing the optimizer's launches while
  // the device still runs the backward).
  constexpr int kParts = 3;
  for (int s = 0; s < warmup + o.steps + kParts; ++s) {
    const bool split = s >= warmup + o.steps;
    for (int i = 0; i < kSides; ++i) {
      const int k = (s + i) % kSides;
      Side& d = side[k];
      d.thread.run([&] {
        synchronize(dev);
        const int64_t before = alloc->stats().current_bytes;
        alloc->reset_peak();
        const auto t0 = Clock::now();
        const double loss = d.run->forward_backward(x, y).loss_sum;
        if (split) synchronize(dev);
        const auto t1 = Clock::now();
        d.run->step_optimizer();
        synchronize(dev);
        const auto t2 = Clock::now();
        const double ms = std::chrono::duration<double, std::milli>(t2 - t0).count();
        uint64_t bits;
        std::memcpy(&bits, &loss, sizeof bits);
        d.loss_bits.push_back(bits);
        if (split) {
          d.fb_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
          d.opt_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
        } else if (s >= warmup) {
          d.ms.push_back(ms);
          d.step_bytes.push_back(double(alloc->stats().peak_bytes - before) +
                                 double(d.run->compile_stats().held_bytes) +
                                 double(d.run->compile_stats().modules.held_bytes));
        }
      });
    }
    if (s >= warmup && !split)
      out << fmt::format(FMT_STRING("[compile] step {:3d}  eager {:8.2f} ms, compiled {:8.2f} ms (CUDA graphs), "
                                    "{:8.2f} ms (host launches)\n"),
                         s, side[0].ms.back(), side[1].ms.back(), side[2].ms.back());
  }
  for (Side& d : side) {
    d.thread.run([&] {
      d.hash = d.run->param_hash();
      d.stats = d.run->compile_stats();
    });
  }
  const double eager_ms = median(side[0].ms), compiled_ms = median(side[1].ms), host_ms = median(side[2].ms);
  std::string differs;  // which side left eager's bits, and where ("": none)
  const char* side_name[kSides] = {"eager", "compiled (CUDA graphs)", "compiled (host launches)"};
  for (int k = 1; k < kSides; ++k) {
    if (side[0].loss_bits == side[k].loss_bits && side[0].hash == side[k].hash) continue;
    size_t step = 0;
    while (step < side[0].loss_bits.size() && side[0].loss_bits[step] == side[k].loss_bits[step]) ++step;
    differs += fmt::format(FMT_STRING("; {}: {}"), side_name[k],
                           step < side[0].loss_bits.size()
                               ? fmt::format(FMT_STRING("the loss differs from step {}"), step)
                               : std::string("every loss equal, the parameters' hash differs"));
  }
  const bool same_bits = differs.empty();
  const CompileStats& cs = side[1].stats;
  const double mib = 1 << 20;
  // A model with MoE layers compiles in mixed mode (its attention modules
  // replayed, the rest eager): the module calls replayed say what it did.
  const nn::ModuleCompileStats& mm = cs.modules;
  const std::string what =
      mm.modules > 0
          ? fmt::format(FMT_STRING("mixed mode: {} of {} module calls replayed, {} launches per call{}{}"),
                        mm.replayed, mm.calls, mm.launches, mm.refused.empty() ? "" : "; refused: ", mm.refused)
          : fmt::format(FMT_STRING("{} kernels replayed per step ({} in {} fused chains), {} replays"), cs.launches,
                        cs.fused_launches, cs.fused_chains, cs.replays);
  out << fmt::format(FMT_STRING("tessel::Run gemm={}: eager {:.2f} ms/step, compiled {:.2f} ms/step ({:.2f}x); {}; "
                                "step memory {:.0f} / {:.0f} MiB; the same bits: {}{}\n"),
                     o.gemm, eager_ms, compiled_ms, eager_ms / compiled_ms, what,
                     median(side[0].step_bytes) / mib, median(side[1].step_bytes) / mib,
                     same_bits ? "yes" : "NO" + differs, cs.refused.empty() ? std::string() : "; compile mode stopped: " + cs.refused);
  out << fmt::format(FMT_STRING("  CUDA graphs: {} graph(s) holding {} of the {} launches each step, {} capture(s), {} "
                                "launch(es) refused by a capture{}{}; without graphs {:.2f} ms/step ({:.2f}x the "
                                "graphs')\n"),
                     cs.graphs, cs.graph_launches, cs.launches, cs.graph_captures, cs.graph_refused,
                     cs.graph_refusal.empty() ? "" : "; the last: ", cs.graph_refusal, host_ms, host_ms / compiled_ms);
  auto parts = [&](const Side& d) {
    return nlohmann::json{{"forward_backward", median(d.fb_ms)}, {"step_optimizer", median(d.opt_ms)}};
  };
  out << fmt::format(FMT_STRING("  parts (forward_backward + step_optimizer, ms): eager {:.2f} + {:.2f}, compiled "
                                "{:.2f} + {:.2f}, without graphs {:.2f} + {:.2f}\n"),
                     median(side[0].fb_ms), median(side[0].opt_ms), median(side[1].fb_ms), median(side[1].opt_ms),
                     median(side[2].fb_ms), median(side[2].opt_ms));
  return {{"eager_ms", eager_ms},
          {"compiled_ms", compiled_ms},
          {"speedup", eager_ms / compiled_ms},
          {"compiled_without_graphs_ms", host_ms},
          {"graphs",
           {{"graphs", cs.graphs},
            {"graph_launches", cs.graph_launches},
            {"captures", cs.graph_captures},
            {"refused", cs.graph_refused},
            {"last_refusal", cs.graph_refusal},
            {"speedup_over_host_launches", host_ms / compiled_ms}}},
          {"parts_ms",
           {{"eager", parts(side[0])}, {"compiled", parts(side[1])}, {"compiled_without_graphs", parts(side[2])}}},
          {"same_bits", same_bits},
          {"differs", differs.empty() ? differs : differs.substr(2)},
          {"replays", cs.replays},
          {"module_calls_replayed", mm.replayed},  // mixed mode (MoE models)
          {"kernels_per_step", cs.launches},
          {"fused_chains", cs.fused_chains},      // each one CUDA kernel (docs/compile.md, "Fusion")
          {"fused_launches", cs.fused_launches},
          {"step_memory_mib",
           {{"eager", median(side[0].step_bytes) / mib}, {"compiled", median(side[1].step_bytes) / mib}}},
          {"refused", cs.refused}};
}

}  // namespace

int run_step_cuda_bench(const StepCudaBenchOptions& o, std::ostream& out) {
  if (!cuda_available()) {
    out << "bench step_cuda: no GPU available in this process (built "
#ifdef TESSEL_WITH_CUDA
        << "with"
#else
        << "without"
#endif
        << " CUDA)\n";
    out << nlohmann::json{{"bench", "step_cuda"}, {"error", "no GPU"}}.dump() << "\n";
    return 2;
  }
  TESSEL_CHECK(o.dtype == "bf16" || o.dtype == "fp32", "bench step_cuda", "--dtype must be bf16 or fp32, got {}",
               o.dtype);
  TESSEL_CHECK(o.gemm == "fast" || o.gemm == "bitwise", "bench step_cuda", "--gemm must be fast or bitwise, got {}",
               o.gemm);
  const models::ModelConfig cfg = models::model_config(o.model, o.config);
  const Timing t = time_steps(o, cfg, o.gemm, out);
  const double step_ms = t.step_ms;
  const double tokens_per_s = double(o.batch * o.seq) / (step_ms / 1e3);
  const double L = double(cfg.n_layer), H = double(cfg.n_head), Q = double(cfg.dim / cfg.n_head);
  const double flops_per_token = 6.0 * double(t.params) + 12.0 * L * H * Q * double(o.seq);
  const double peak = o.peak_tflops > 0 ? o.peak_tflops : (o.dtype == "bf16" ? 989.4 : 66.9);  // H100 SXM dense
  const double mfu = flops_per_token * tokens_per_s / (peak * 1e12);
  out << fmt::format(FMT_STRING("tessel: {} {} B={} T={} {} gemm={}: {:.2f} ms/step, {:.0f} tokens/s, MFU {:.1f}%, peak memory "
                     "{:.2f} GiB, loss {:.4f}\n"),
                     o.model, o.config, o.batch, o.seq, o.dtype, o.gemm, step_ms, tokens_per_s, 100 * mfu,
                     double(t.peak_bytes) / double(1 << 30), t.last_loss);
  // Bitwise mode's cost: the same steps with the canonical-order GEMM.
  nlohmann::json bitwise = nullptr;
  if (o.bitwise_cost && o.gemm == "fast") {
    const Timing b = time_steps(o, cfg, "bitwise", out);
    out << fmt::format(FMT_STRING("tessel gemm=bitwise: {:.2f} ms/step, bitwise / fast = {:.3f}\n"), b.step_ms,
                       b.step_ms / step_ms);
    bitwise = {{"step_ms", b.step_ms}, {"cost", b.step_ms / step_ms}, {"loss", b.last_loss}};
  }
  // What compile mode's replay saves (tessel::Run eager against compiled).
  nlohmann::json compiled = nullptr;
  if (o.compile) {
    try {
      compiled = compare_compiled(o, cfg, Device(DeviceType::CUDA, 0), out);
    } catch (const std::exception& e) {  // reported, not fatal: the rest of the figures stand
      out << "compile mode comparison failed: " << e.what() << "\n";
      compiled = {{"error", e.what()}};
    }
  }
  nlohmann::json ref = o.reference ? torch_reference(o, out) : nlohmann::json(nullptr);
  // The standard fields: PyTorch eager on the same GPU is the reference.
  nlohmann::json ref_s = nullptr, speedup = nullptr;
  if (ref.is_object() && ref.contains("eager") && ref["eager"].contains("step_ms")) {
    ref_s = ref["eager"]["step_ms"].get<double>() / 1e3;
    speedup = ref_s.get<double>() / (step_ms / 1e3);
  }
  nlohmann::json j = {{"bench", "step_cuda"},
                      {"ours_s", step_ms / 1e3},
                      {"reference", "pytorch eager (same GPU, same run)"},
                      {"reference_s", ref_s},
                      {"speedup", speedup},
                      {"model", o.model},
                      {"config", o.config},
                      {"batch", o.batch},
                      {"seq", o.seq},
                      {"dtype", o.dtype},
                      {"gemm", o.gemm},
                      {"params", t.params},
                      {"step_ms", step_ms},
                      {"tokens_per_s", tokens_per_s},
                      {"mfu", mfu},
                      {"peak_tflops", peak},
                      {"peak_memory_bytes", t.peak_bytes},
                      {"bitwise", bitwise},
                      {"compile", compiled},
                      {"torch", ref}};
  out << j.dump() << "\n";
  return 0;
}

}  // namespace tessel::tools
