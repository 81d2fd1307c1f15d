// `tessel bench step`: a training step against PyTorch (tools/bench/step_bench.h).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "autograd/api.h"
#include "models/language_model.h"
#include "run/run.h"
#include "runtime/allocator.h"
#include "runtime/profile.h"
#include "runtime/threadpool.h"
#include "tools/bench/machine.h"
#include "tools/bench/step_bench.h"
#include "runtime/error.h"
#include "tools/cli/commands.h"
#include "train/trainer/trainer.h"

namespace tessel::cli {
namespace {

// The training run both mesh benchmarks time: o's model and batch, warm-up
// plus timed steps, no evaluation or samples.
train::TrainConfig bench_config(const tools::StepBenchOptions& o, const std::string& mesh, int64_t micro_batches,
                                const std::string& out) {
  train::TrainConfig c;
  c.model = o.model;
  c.model_config = o.config;
  c.batch_size = o.batch;
  if (o.seq > 0) c.seq_len = o.seq;
  c.micro_batches = micro_batches;
  c.steps = o.warmup + o.steps;
  c.warmup_steps = 1;
  c.eval_every = 0;
  c.sample_length = 0;
  c.mesh = mesh;
  c.seed = o.seed;
  c.out_dir = out;
  return c;
}

// `bench step --bitwise`: the same training steps on a mesh (ranks as
// threads) in bitwise mode and in fast mode, rounds interleaved so drift hits
// both; medians of the per-step times after warm-up.
int run_bitwise_step_bench(const tools::StepBenchOptions& o, const std::string& mesh, int64_t micro_batches,
                           int rounds, const std::string& dtype) {
  const std::string out = (std::filesystem::temp_directory_path() / "tessel_bench_bitwise").string();
  const std::string compute = dtype.empty() || dtype == "fp32" || dtype == "float32" ? "float32" : "bfloat16";
  tools::BenchMachine machine = tools::begin_bench(std::cout);
  std::vector<double> times[2];  // [fast, bitwise]
  double loss[2] = {0, 0};
  for (int r = 0; r < rounds; ++r) {
    for (int mode = 0; mode < 2; ++mode) {
      train::TrainConfig c = bench_config(o, mesh, micro_batches, out);
      c.bitwise = mode == 1;
      c.dtype = compute;
      train::TrainHooks h;
      h.quiet = true;
      int64_t step = 0;
      h.on_step = [&](const train::StepMetrics& m) {
        if (++step <= o.warmup || !m.tokens_per_s) return;
        times[mode].push_back(1.0 / *m.tokens_per_s);  // seconds per token: the same scale for both
        loss[mode] = *m.loss;
      };
      train::run_training(c, h);
    }
  }
  const double fast = tools::median(times[0]), bit = tools::median(times[1]);
  tools::end_bench(machine);
  std::printf("bench step --bitwise: %s %s (%s), batch %lld, %lld micro-batches, mesh %s, %d rounds x %d timed steps\n",
              o.model.c_str(), o.config.c_str(), compute.c_str(), (long long)o.batch, (long long)micro_batches,
              mesh.c_str(), rounds, o.steps);
  std::printf("  fast mode:    %.3f ms per 1k tokens (last loss %.6f)\n", fast * 1e6, loss[0]);
  std::printf("  bitwise mode: %.3f ms per 1k tokens (last loss %.6f)\n", bit * 1e6, loss[1]);
  std::printf("  bitwise / fast = %.3f (goal <= 1.15)\n", bit / fast);
  std::printf("%s", tools::machine_summary(machine).c_str());
  nlohmann::ordered_json j = {{"bench", "step_bitwise"},
                              {"model", o.model},
                              {"config", o.config},
                              {"dtype", compute},
                              {"mesh", mesh},
                              {"micro_batches", micro_batches},
                              {"ours_s", bit},
                              {"reference", "tessel fast mode (same mesh, same run)"},
                              {"reference_s", fast},
                              {"speedup", fast / bit},
                              {"unit", "seconds per token"}};
  tools::add_machine(j, machine);
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

// `bench step --mesh A --mesh B ...`: fast-mode training steps on each layout
// (ranks as threads of this process) against the one-device run in the same
// run: seconds per step, tokens/s, and for pipelines the share of the step
// rank 0 spent blocked in transfers (comm_wait_s; bubble included).
int run_mesh_step_bench(const tools::StepBenchOptions& o, const std::vector<std::string>& meshes,
                        int64_t micro_batches, const std::string& schedule) {
  const std::string out = (std::filesystem::temp_directory_path() / "tessel_bench_mesh").string();
  struct Row {
    std::string mesh;
    double tokens_per_s = 0, wait_share = -1;
  };
  tools::BenchMachine machine = tools::begin_bench(std::cout);
  std::vector<Row> rows;
  std::vector<std::string> all = {""};
  all.insert(all.end(), meshes.begin(), meshes.end());
  for (const std::string& mesh : all) {
    train::TrainConfig c = bench_config(o, mesh, micro_batches, out);
    c.pipeline_schedule = schedule;
    train::TrainHooks h;
    h.quiet = true;
    int64_t step = 0;
    std::vector<double> secs, waits;
    auto last = std::chrono::steady_clock::now();
    h.on_step = [&](const train::StepMetrics& m) {
      const auto now = std::chrono::steady_clock::now();
      const double step_s = std::chrono::duration<double>(now - last).count();
      last = now;
      if (++step <= o.warmup || !m.tokens_per_s) return;
      secs.push_back(1.0 / *m.tokens_per_s);  // seconds per token
      if (auto w = m.extra("comm_wait_s")) waits.push_back(*w / step_s);  // share of the step
    };
    train::run_training(c, h);
    Row r;
    r.mesh = mesh.empty() ? "one device" : mesh;
    const double per_token = tools::median(secs);
    r.tokens_per_s = per_token > 0 ? 1.0 / per_token : 0;
    if (!waits.empty()) r.wait_share = tools::median(waits);
    rows.push_back(r);
  }
  std::printf("bench step --mesh: %s %s, batch %lld, %lld micro-batches, %d timed steps, ranks as threads\n",
              o.model.c_str(), o.config.c_str(), (long long)o.batch, (long long)micro_batches, o.steps);
  std::printf("  %-22s %12s %14s %10s\n", "layout", "tokens/s", "vs one device", "comm wait");
  for (const Row& r : rows)
    std::printf("  %-22s %12.1f %13.2fx %10s\n", r.mesh.c_str(), r.tokens_per_s, r.tokens_per_s / rows[0].tokens_per_s,
                r.wait_share < 0 ? "-" : fmt::format(FMT_STRING("{:.1f}%"), 100 * r.wait_share).c_str());
  tools::end_bench(machine);
  std::printf("%s", tools::machine_summary(machine).c_str());
  nlohmann::ordered_json layouts = nlohmann::ordered_json::array();
  for (size_t i = 1; i < rows.size(); ++i) {
    nlohmann::ordered_json row = {{"mesh", rows[i].mesh}, {"tokens_per_s", rows[i].tokens_per_s}};
    row["comm_wait_share"] = rows[i].wait_share < 0 ? nlohmann::ordered_json() : nlohmann::ordered_json(rows[i].wait_share);
    layouts.push_back(row);
  }
  const Row& first = rows.size() > 1 ? rows[1] : rows[0];
  nlohmann::ordered_json j = {{"bench", "step_mesh"},
                              {"model", o.model},
                              {"config", o.config},
                              {"mesh", first.mesh},
                              {"ours_s", 1.0 / first.tokens_per_s},
                              {"reference", "tessel on one device (same run)"},
                              {"reference_s", 1.0 / rows[0].tokens_per_s},
                              {"speedup", first.tokens_per_s / rows[0].tokens_per_s},
                              {"unit", "seconds per token"},
                              {"layouts", layouts}};
  tools::add_machine(j, machine);
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

// `bench step --device cuda`: the GPU step benchmark (bench_step_cuda) with
// this command's model, config, shape and step counts; --bitwise selects the
// canonical-order GEMM there.
int run_cuda_step_bench(const tools::StepBenchOptions& o, CLI::App& cmd, bool bitwise, const std::string& dtype,
                        bool no_reference) {
  std::vector<std::string> args = {"--model", o.model};
  // The CPU bench's defaults (config small, batch 8, 5 steps) are not the GPU
  // bench's (gpt2-124m, batch 8 x 1024, 20 steps): forward what was given.
  auto given = [&](const char* flag) { return cmd.get_option(flag)->count() > 0; };
  if (given("--config")) args.insert(args.end(), {"--config", o.config});
  if (given("--batch")) args.insert(args.end(), {"--batch", std::to_string(o.batch)});
  if (given("--seq") && o.seq > 0) args.insert(args.end(), {"--seq", std::to_string(o.seq)});
  if (given("--steps")) args.insert(args.end(), {"--steps", std::to_string(o.steps)});
  if (given("--warmup")) args.insert(args.end(), {"--warmup", std::to_string(o.warmup)});
  if (!dtype.empty()) args.insert(args.end(), {"--dtype", dtype});
  if (bitwise) args.insert(args.end(), {"--gemm", "bitwise"});
  if (no_reference) args.push_back("--no-reference");
  if (!o.python.empty()) args.insert(args.end(), {"--python", o.python});
  return exec_bench("step_cuda", args);
}

}  // namespace

// `bench step --compile`: the same training steps eager and compiled
// (RunOptions::compile) in one process, one step of each in turn (who goes
// first alternates), each after a pause; medians of the timed steps. Memory:
// the step's own bytes -- eager: the allocator's peak during the step above
// what was held before it; compiled: what the recording holds between steps
// plus the same peak-above-start of the replay (its temporaries' arena, when
// given back between steps, is allocated again inside the step).
// With `modules` (--compile-modules) the compiled side is mixed mode
// instead (RunOptions::compile_modules): those modules replayed, the rest
// eager.
// With `fusion_reference` (--fusion-reference) the reference side is compile
// mode too, without fusion (RunOptions::compile_fusion = false): what fusing
// elementwise chains gives, both sides replaying.
int run_compile_step_bench(const tools::StepBenchOptions& o, nn::CompileModules modules, bool fusion_reference) {
  const char* op = "bench step --compile";
  const char* name[2] = {fusion_reference ? "unfused" : "eager", fusion_reference ? "fused" : "compiled"};
  const int threads = o.threads > 0 ? o.threads : num_threads();
  set_num_threads(threads);
  models::ModelConfig mc = models::model_config(o.model, o.config);
  mc.dropout = 0.0;
  mc = mc.resolved();
  const int64_t B = o.batch, T = o.seq > 0 ? o.seq : mc.max_seq_len;
  TESSEL_CHECK(T <= mc.max_seq_len && B > 0 && o.steps > 0, op, "need 0 < seq <= {} and batch, steps > 0", mc.max_seq_len);
  const int warmup = std::max(o.warmup, 3);  // compile mode replays from its fourth step
  nn::AdamWOptions ao;
  ao.lr = 6e-4;
  ao.betas = {0.9, 0.95};
  ao.weight_decay = 0.1;
  // A Run counts the backward passes of the thread that made it: each side
  // lives on a thread of its own, which runs one step when told to.
  struct Side {
    std::optional<Run<models::LanguageModel>> run;
    std::vector<double> times, fb_times, opt_times, step_bytes;  // whole step; forward_backward; step_optimizer
    std::vector<uint64_t> loss_bits;
    std::string hash;
    CompileStats stats;
  } side[2];  // [eager, compiled]
  std::mutex mu;
  std::condition_variable cv;
  int turn = -1;  // the side that steps now (-1: none; 2: stop)
  bool setup_done[2] = {false, false};
  Tensor ids, targets;
  int step_now = 0;
  Allocator* alloc = cpu_allocator();
  std::string failure;
  profile::Profiler replay_profile;  // the compiled side's extra step
  auto worker = [&](int k) {
    Side& d = side[k];
    try {
      RunOptions ro;
      ro.seed = o.seed;
      ro.compile = (k == 1 || fusion_reference) && modules == nn::CompileModules::None;
      ro.compile_fusion = k == 1;
      if (k == 1) ro.compile_modules = modules;
      d.run.emplace(parallelize(models::make_language_model(mc, o.seed), adamw(ao), ro));
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lk(mu);
      failure = e.what();
    }
    {
      std::lock_guard<std::mutex> lk(mu);
      setup_done[k] = true;
    }
    cv.notify_all();
    for (;;) {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return turn == k || turn == 2; });
      if (turn == 2) break;
      lk.unlock();
      if (failure.empty() && d.run && step_now >= warmup + o.steps) {
        // (Mixed mode: nothing to profile here; its steps are mostly eager ops.)
        // One more step, not timed: the replay with each launch timed, for
        // where the compiled step's time goes (the gap to the goal).
        try {
          profile::Scope scope(&replay_profile);
          d.run->forward_backward(ids, targets);
          d.run->step_optimizer();
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> g(mu);
          failure = e.what();
        }
      } else if (failure.empty() && d.run) {
        try {
          const int64_t before = alloc->stats().current_bytes;
          alloc->reset_peak();
          const auto t0 = std::chrono::steady_clock::now();
          const double loss = d.run->forward_backward(ids, targets).loss_sum;
          const auto t1 = std::chrono::steady_clock::now();
          d.run->step_optimizer();
          const auto t2 = std::chrono::steady_clock::now();
          const double secs = std::chrono::duration<double>(t2 - t0).count();
          uint64_t bits;
          std::memcpy(&bits, &loss, 8);
          d.loss_bits.push_back(bits);
          if (step_now == warmup + o.steps - 1) d.hash = d.run->param_hash();  // before the profiled step
          if (step_now >= warmup) {
            d.times.push_back(secs);
            d.fb_times.push_back(std::chrono::duration<double>(t1 - t0).count());
            d.opt_times.push_back(std::chrono::duration<double>(t2 - t1).count());
            // (`before` counts what the programs held going in; their
            // arenas, given back between steps, are in the peak.)
            d.step_bytes.push_back(double(alloc->stats().peak_bytes - before) +
                                   double(d.run->compile_stats().held_bytes) +
                                   double(d.run->compile_stats().modules.held_bytes));
          }
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> g(mu);
          failure = e.what();
        }
      }
      lk.lock();
      turn = -1;
      lk.unlock();
      cv.notify_all();
    }
    if (d.run) {
      d.stats = d.run->compile_stats();
      d.run.reset();
    }
  };
  std::thread threads_of[2] = {std::thread(worker, 0), std::thread(worker, 1)};
  {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return setup_done[0] && setup_done[1]; });
  }
  std::cout << fmt::format(FMT_STRING("bench step --compile: {}; batch {} x {} tokens, {} threads, fp32, AdamW; {} "
                                      "and {}{} in turn, {} warm-up + {} timed steps each\n"),
                           mc.describe(), B, T, threads, fusion_reference ? "compiled without fusion" : "eager",
                           fusion_reference ? "with fusion" : "compiled",
                           modules == nn::CompileModules::None
                               ? std::string()
                               : fmt::format(FMT_STRING(" (mixed mode: the {} only)"), nn::compile_modules_name(modules)),
                           warmup, o.steps);
  tools::BenchMachine machine = tools::begin_bench(std::cout);
  for (int s = 0; s < warmup + o.steps && failure.empty(); ++s) {
    Tensor stream = randint(0, mc.vocab_size, {B, T + 1}, PhiloxKey{o.seed, stream_for("bench.step.batch", {uint64_t(s)})});
    ids = stream.slice(1, 0, T).contiguous();
    targets = stream.slice(1, 1, T + 1).contiguous();
    step_now = s;
    for (int i = 0; i < 2; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the other side's threads go idle
      std::unique_lock<std::mutex> lk(mu);
      turn = s % 2 == 0 ? i : 1 - i;
      cv.notify_all();
      cv.wait(lk, [&] { return turn == -1; });
    }
    if (s >= warmup && failure.empty())
      std::cout << fmt::format(FMT_STRING("  step {}/{}: {} {:.4f} s, {} {:.4f} s\n"), s + 1, warmup + o.steps, name[0],
                               side[0].times.back(), name[1], side[1].times.back());
  }
  // (Mixed mode -- asked for, or compile on a model with MoE layers -- is
  // mostly eager ops: no kernel profile of it.)
  const int kProfiledSteps = modules == nn::CompileModules::None && mc.arch != models::Arch::Mixtral ? 3 : 0;
  for (int i = 0; i < kProfiledSteps && failure.empty(); ++i) {
    step_now = warmup + o.steps + i;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::unique_lock<std::mutex> lk(mu);
    turn = 1;
    cv.notify_all();
    cv.wait(lk, [&] { return turn == -1; });
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    turn = 2;
  }
  cv.notify_all();
  for (std::thread& t : threads_of) t.join();
  TESSEL_CHECK(failure.empty(), op, "{}", failure);
  tools::end_bench(machine);
  CompileStats cs = side[1].stats;
  if (cs.modules.modules > 0) {  // mixed mode (asked for, or compile on a model with MoE layers): the modules' figures
    cs.launches = cs.modules.launches;
    cs.buffer_bytes = cs.modules.buffer_bytes;
    cs.refused = cs.modules.refused;
  }
  const bool same_bits = side[0].loss_bits == side[1].loss_bits && side[0].hash == side[1].hash;
  const double eager = tools::median(side[0].times), compiled = tools::median(side[1].times);
  const double eager_mb = tools::median(side[0].step_bytes) / (1 << 20), compiled_mb = tools::median(side[1].step_bytes) / (1 << 20);
  std::cout << fmt::format(FMT_STRING("  median step: {} {:.4f} s, {} {:.4f} s ({:.2f}x); step memory {} {:.1f} MiB, {} "
                                      "{:.1f} MiB; {} kernels replayed per step ({} in {} fused chains); the same bits: {}\n"),
                           name[0], eager, name[1], compiled, eager / compiled, name[0], eager_mb, name[1], compiled_mb,
                           cs.launches, cs.fused_launches, cs.fused_chains, same_bits ? "yes" : "NO");
  // Where the step goes: forward_backward (replayed) and step_optimizer.
  const double fb[2] = {tools::median(side[0].fb_times), tools::median(side[1].fb_times)};
  const double opt[2] = {tools::median(side[0].opt_times), tools::median(side[1].opt_times)};
  std::cout << fmt::format(FMT_STRING("  forward_backward: {} {:.4f} s, {} {:.4f} s ({:.2f}x); step_optimizer: {} {:.4f} "
                                      "s, {} {:.4f} s ({:.2f}x)\n"),
                           name[0], fb[0], name[1], fb[1], fb[0] / fb[1], name[0], opt[0], name[1], opt[1], opt[0] / opt[1]);
  if (!cs.refused.empty()) std::cout << "  compile mode stopped: " << cs.refused << "\n";
  // Where a replayed step's time goes: kProfiledSteps more steps with every
  // launch timed (not among the timed steps), per step. What is left once
  // eager's per-op work is gone is the kernels themselves.
  auto is_kernel = [](const profile::Row& r) {
    return r.name != "optimizer.step" && r.name != "clip_grad_norm" && r.name.rfind("compile.", 0) != 0;
  };
  std::vector<profile::Row> rows = replay_profile.rows();
  double kernels_s = 0;
  for (profile::Row& r : rows) {
    r.self_s /= std::max(kProfiledSteps, 1);
    r.calls /= std::max(kProfiledSteps, 1);
    if (is_kernel(r)) kernels_s += r.self_s;
  }
  nlohmann::ordered_json top = nlohmann::ordered_json::array();
  if (!rows.empty()) {
    std::cout << fmt::format(FMT_STRING("  a replayed forward_backward with each launch timed ({} more steps): kernels "
                                        "{:.4f} s per step, of the compiled {:.4f} s; the largest:\n"),
                             kProfiledSteps, kernels_s, fb[1]);
    for (size_t i = 0; i < rows.size() && top.size() < 8; ++i) {
      const profile::Row& r = rows[i];
      if (!is_kernel(r)) continue;
      std::cout << fmt::format(FMT_STRING("    {:<28} {:>4} launches {:.4f} s ({:.0f}%)\n"), r.name, r.calls, r.self_s,
                               100.0 * r.self_s / std::max(kernels_s, 1e-12));
      top.push_back({{"kernel", r.name}, {"launches", r.calls}, {"s", r.self_s}});
    }
  }
  nlohmann::ordered_json j = {{"bench", "step_compile"}, {"model", o.model}, {"config", o.config}, {"ours_s", compiled},
                              {"reference", fusion_reference ? "tessel compiled without fusion (same run)"
                                                             : "tessel eager (same run)"},
                              {"reference_s", eager}, {"speedup", eager / compiled}};
  j["tokens_per_s"] = double(B * T) / compiled;
  j["reference_tokens_per_s"] = double(B * T) / eager;
  j["step_memory_mib"] = {{"ours", compiled_mb}, {"reference", eager_mb}};
  j["parts_s"] = {{"forward_backward", {{"ours", fb[1]}, {"reference", fb[0]}}},
                  {"step_optimizer", {{"ours", opt[1]}, {"reference", opt[0]}}}};
  j["compile_modules"] = cs.modules.modules > 0 && modules == nn::CompileModules::None
                             ? "attention (MoE model)"
                             : nn::compile_modules_name(modules);
  j["kernels_per_step"] = cs.launches;
  j["fused_chains"] = cs.fused_chains;
  j["fused_launches"] = cs.fused_launches;
  j["replay_kernels_s"] = kernels_s;
  j["replay_top_kernels"] = top;
  j["same_bits"] = same_bits;
  j["refused"] = cs.refused;
  j["batch"] = B;
  j["seq"] = T;
  j["threads"] = threads;
  j["steps"] = o.steps;
  tools::add_machine(j, machine);
  std::cout << tools::machine_summary(machine);
  std::cout << j.dump() << std::endl;
  return same_bits && cs.refused.empty() ? 0 : 1;
}

static CLI::App*& step_cmd() {
  static CLI::App* cmd = nullptr;
  return cmd;
}

// `bench step --compile --mesh M`: the same training steps on a mesh (ranks
// as threads) eager and compiled (RunOptions::compile), rounds interleaved so
// drift hits both; medians of the per-step times from the first replayed
// step on (step 4), and whether both gave the same parameters.
int run_compile_mesh_step_bench(const tools::StepBenchOptions& o, const std::string& mesh, int64_t micro_batches,
                                int rounds, const std::string& schedule, int zero) {
  const std::string out = (std::filesystem::temp_directory_path() / "tessel_bench_compile_mesh").string();
  const int64_t warmup = std::max<int64_t>(o.warmup, 3);  // steps 1-3 run eagerly in compile mode (2 and 3 recorded)
  tools::StepBenchOptions timed = o;
  timed.warmup = warmup;
  tools::BenchMachine machine = tools::begin_bench(std::cout);
  std::vector<double> times[2];  // [eager, compiled]
  std::string hash[2];
  int64_t peak[2] = {0, 0};
  CompileStats stats;
  for (int r = 0; r < rounds; ++r) {
    for (int k = 0; k < 2; ++k) {
      const int mode = r % 2 == 0 ? k : 1 - k;  // who goes first alternates
      train::TrainConfig c = bench_config(timed, mesh, micro_batches, out);
      c.compile = mode == 1;
      c.pipeline_schedule = schedule;
      c.zero = zero;
      train::TrainHooks h;
      h.quiet = true;
      int64_t step = 0;
      h.on_step = [&](const train::StepMetrics& m) {
        if (++step <= warmup || !m.tokens_per_s) return;
        times[mode].push_back(1.0 / *m.tokens_per_s);  // seconds per token
      };
      const train::TrainResult result = train::run_training(c, h);
      hash[mode] = result.param_hash;
      peak[mode] = std::max(peak[mode], result.allocator_peak_bytes);
      if (mode == 1) stats = result.compile;
    }
  }
  const double eager = tools::median(times[0]), compiled = tools::median(times[1]);
  tools::end_bench(machine);
  const bool pp = mesh.find("pp=") != std::string::npos;
  std::printf("bench step --compile: %s %s, batch %lld, %lld micro-batches, mesh %s (ranks as threads)%s%s, %d rounds x "
              "%d timed steps (from step %lld)\n",
              o.model.c_str(), o.config.c_str(), (long long)o.batch, (long long)micro_batches, mesh.c_str(),
              zero ? fmt::format(FMT_STRING(", zero {}"), zero).c_str() : "",
              pp ? (", schedule " + schedule).c_str() : "", rounds, o.steps, (long long)warmup + 1);
  std::printf("  eager:    %.3f ms per 1k tokens, allocator peak %.1f MiB\n", eager * 1e6, double(peak[0]) / (1 << 20));
  // A model with MoE layers compiles its attention layers (mixed mode):
  // then the module calls replayed say what compile mode did, not steps.
  const nn::ModuleCompileStats& mm = stats.modules;
  const std::string what =
      mm.modules > 0 ? fmt::format(FMT_STRING("mixed mode, {} of {} module calls replayed{}{}"), mm.replayed, mm.calls,
                                   mm.refused.empty() ? "" : "; refused: ", mm.refused)
                     : fmt::format(FMT_STRING("{} replays of {} launches{}{}"), stats.replays, stats.launches,
                                   stats.refused.empty() ? "" : "; stopped: ", stats.refused);
  std::printf("  compiled: %.3f ms per 1k tokens, allocator peak %.1f MiB; rank 0: %s\n", compiled * 1e6,
              double(peak[1]) / (1 << 20), what.c_str());
  std::printf("  speedup %.3fx; the same parameters: %s\n", eager / compiled, hash[0] == hash[1] ? "yes" : "NO");
  std::printf("%s", tools::machine_summary(machine).c_str());
  nlohmann::ordered_json j = {{"bench", "step_compile_mesh"},
                              {"model", o.model},
                              {"config", o.config},
                              {"mesh", mesh},
                              {"micro_batches", micro_batches},
                              {"zero", zero},
                              {"pipeline_schedule", pp ? nlohmann::ordered_json(schedule) : nlohmann::ordered_json()},
                              {"ours_s", compiled},
                              {"reference", "tessel eager (same mesh, same run)"},
                              {"reference_s", eager},
                              {"speedup", eager / compiled},
                              {"unit", "seconds per token"},
                              {"replays", stats.replays},
                              {"module_calls_replayed", stats.modules.replayed},  // mixed mode (MoE models)
                              {"refused", stats.refused.empty() ? stats.modules.refused : stats.refused},
                              {"allocator_peak_mib", {{"ours", double(peak[1]) / (1 << 20)}, {"reference", double(peak[0]) / (1 << 20)}}},
                              {"same_bits", hash[0] == hash[1]}};
  tools::add_machine(j, machine);
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

void register_bench_step(CLI::App& app) {
  static tools::StepBenchOptions o;
  static bool no_reference = false, bitwise = false, compile = false, profile = false, fusion_reference = false;
  static int profile_steps = 3;
  static std::vector<std::string> meshes;
  static std::string schedule = "1f1b";
  static int64_t micro_batches = 2;
  static int rounds = 3;
  static int zero = 0;
  static std::string device = "cpu", dtype, compile_modules = "none";
  CLI::App* cmd = add_command(*bench_command(app), "step",
                              "Time a training step (forward, backward, AdamW) against PyTorch on the CPU; with "
                              "--bitwise, bitwise against fast mode on a mesh",
                              [] {
                                TESSEL_CHECK(compile_modules == "none" || (compile && meshes.empty() && !bitwise && device == "cpu"), "bench step",
                                             "--compile-modules {} times mixed mode on one device: give it with "
                                             "--compile and without --mesh",
                                             compile_modules);
                                if (profile && (device != "cpu" || bitwise || compile || !meshes.empty()))
                                  throw Error("bench step: --profile compares one device against PyTorch; it does not "
                                              "combine with --device cuda, --bitwise, --compile or --mesh (`tessel train --profile` "
                                              "profiles any layout)");
                                if (profile && profile_steps < 1)
                                  throw Error(fmt::format(FMT_STRING("bench step: --profile-steps must be at least 1, got {}"),
                                                          profile_steps));
                                if (device == "cuda" || device == "cuda:0")
                                  return run_cuda_step_bench(o, *step_cmd(), bitwise, dtype, no_reference);
                                if (device != "cpu")
                                  throw Error(fmt::format(FMT_STRING("bench step: --device must be cpu or cuda, got '{}'"), device));
                                if (!dtype.empty() && !bitwise)
                                  throw Error("bench step: --dtype applies to --device cuda and to --bitwise only "
                                              "(the CPU step against PyTorch is float32)");
                                if (!dtype.empty() && dtype != "bf16" && dtype != "fp32" && dtype != "bfloat16" &&
                                    dtype != "float32")
                                  throw Error(fmt::format(
                                      FMT_STRING("bench step: --dtype must be bf16 (bfloat16) or fp32 (float32), got '{}'"),
                                      dtype));
                                if (bitwise)
                                  return run_bitwise_step_bench(o, meshes.empty() ? "dp=2,tp=2" : meshes[0],
                                                                micro_batches, rounds, dtype);
                                if (compile && !meshes.empty())
                                  return run_compile_mesh_step_bench(o, meshes[0], micro_batches, rounds, schedule, zero);
                                if (!meshes.empty()) return run_mesh_step_bench(o, meshes, micro_batches, schedule);
                                TESSEL_CHECK(!fusion_reference || (compile && meshes.empty() && compile_modules == "none"),
                                             "bench step", "--fusion-reference times compile mode with and without "
                                             "fusion on one device: give it with --compile, without --mesh and "
                                             "--compile-modules");
                                if (compile)
                                  return run_compile_step_bench(o, nn::parse_compile_modules(compile_modules), fusion_reference);
                                o.reference = !no_reference;
                                o.profile_steps = profile ? profile_steps : 0;
                                return tools::run_step_bench(o, std::cout);
                              });
  step_cmd() = cmd;
  cmd->add_option("--device", device,
                  "cpu | cuda (cuda runs bench step_cuda: tokens/s and MFU against PyTorch eager and torch.compile)")
      ->capture_default_str();
  cmd->add_option("--dtype", dtype, "with --device cuda: bf16 (autocast, default) | fp32; with --bitwise: bf16 | fp32 "
                                    "(default) for both modes");
  cmd->add_flag("--bitwise", bitwise, "time bitwise mode against fast mode on --mesh (ranks as threads)");
  cmd->add_flag("--compile", compile,
                "time compile mode (RunOptions::compile) against eager in the same run: one device, or --mesh "
                "(ranks as threads, --rounds interleaved runs; docs/compile.md)");
  cmd->add_flag("--fusion-reference", fusion_reference,
                "with --compile, one device: the reference is compile mode without fusion (RunOptions::"
                "compile_fusion = false) instead of eager: what fused elementwise chains give");
  cmd->add_option("--compile-modules", compile_modules,
                  "with --compile, one device: the compiled side is mixed mode, these modules replayed and the rest "
                  "eager: attention | blocks (RunOptions::compile_modules)")
      ->capture_default_str();
  cmd->add_option("--mesh", meshes,
                  "layouts to time against one device (repeatable: --mesh dp=2 --mesh tp=2,pp=2); with --bitwise "
                  "the mesh (default dp=2,tp=2)");
  cmd->add_option("--pipeline-schedule", schedule, "with --mesh ...,pp=N: gpipe | 1f1b | interleaved")
      ->capture_default_str();
  cmd->add_option("--micro-batches", micro_batches, "with --bitwise or --compile --mesh: micro-batches per step")
      ->capture_default_str();
  cmd->add_option("--rounds", rounds, "with --bitwise or --compile --mesh: interleaved runs of each side")
      ->capture_default_str();
  cmd->add_option("--zero", zero, "with --compile --mesh: data parallelism over dp: 0 DDP | 1 ZeRO-1 | 2 ZeRO-2 | 3 FSDP")
      ->capture_default_str();
  cmd->add_option("--model", o.model, "nanogpt | llama | mixtral")->capture_default_str();
  cmd->add_option("--config", o.config, "named model config")->capture_default_str();
  cmd->add_option("--batch", o.batch, "sequences per step")->capture_default_str();
  cmd->add_option("--seq", o.seq, "tokens per sequence (0: the config's context)")->capture_default_str();
  cmd->add_option("--warmup", o.warmup, "untimed steps first")->capture_default_str();
  cmd->add_option("--steps", o.steps, "timed steps (medians reported)")->capture_default_str();
  cmd->add_option("--threads", o.threads, "threads for both (0: TESSEL_THREADS, else all cores)")->capture_default_str();
  cmd->add_option("--python", o.python, "Python with torch (default: $TESSEL_PYTHON, ~/.cache/tessel/venv)");
  cmd->add_flag("--no-reference", no_reference, "time tessel only");
  cmd->add_flag("--profile", profile,
                "after the timed steps, --profile-steps more steps of each side under its profiler: the two sides "
                "op by op (self time per step by category, and each side's largest ops)");
  cmd->add_flag("--torch-compile", o.torch_compile,
                "a second reference: PyTorch under torch.compile (inductor, CPU), its steps alternating with the "
                "others (the first step compiles: give it --warmup >= 1)");
  cmd->add_option("--profile-steps", profile_steps, "with --profile: profiled steps per side")->capture_default_str();
}

}  // namespace tessel::cli
