#include "tools/bench/dispatch_bench.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <ostream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "autograd/api.h"
#include "dtensor/dist_call.h"
#include "dtensor/ops.h"
#include "runtime/threadpool.h"
#include "tools/bench/machine.h"

namespace tessel::tools {
namespace {

using Clock = std::chrono::steady_clock;

// Median seconds per call of fn over `reps` batches of `iters` calls.
double time_per_call(const std::function<void()>& fn, int iters, int reps) {
  for (int i = 0; i < iters / 4 + 1; ++i) fn();  // warm-up (allocator pools, caches)
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / iters);
  }
  return median(t);
}

struct OpBench {
  const char* name;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  std::vector<Dims> shapes;
  Placements placements;  // on the one-device mesh
};

}  // namespace

int run_dispatch_bench(const DispatchBenchOptions& opts, std::ostream& out) {
  BenchMachine machine = begin_bench(out);
  set_num_threads(opts.threads);
  NoGradGuard ng;  // forward dispatch only (recording is timed separately below)
  MeshPtr mesh = Mesh::single();
  std::vector<OpBench> ops = {
      {"add [64, 64] + [64]", [](auto& x) { return x[0] + x[1]; }, {{64, 64}, {64}}, {Shard(0)}},
      {"matmul [32, 64] x [64, 32]", [](auto& x) { return matmul(x[0], x[1]); }, {{32, 64}, {64, 32}}, {Shard(0)}},
      {"sum [64, 64] dim 1", [](auto& x) { return sum(x[0], {1}); }, {{64, 64}}, {Shard(0)}},
      {"layer_norm [16, 64]", [](auto& x) { return layer_norm(x[0], {64}); }, {{16, 64}}, {Shard(0)}},
      {"softmax [16, 64]", [](auto& x) { return softmax(x[0], -1); }, {{16, 64}}, {Shard(0)}},
      {"gelu [64, 64]", [](auto& x) { return gelu(x[0]); }, {{64, 64}}, {Replicate()}},
  };
  out << fmt::format(FMT_STRING("{:<30} {:>12} {:>12} {:>12}\n"), "op", "plain (us)", "sharded (us)", "added (us)");
  nlohmann::json rows = nlohmann::json::array();
  double plain_total = 0, dist_total = 0;
  detail::DispatchStats stages_total;
  for (const OpBench& op : ops) {
    std::vector<Tensor> plain, dist;
    uint64_t seed = 1;
    for (const Dims& s : op.shapes) {
      Tensor t = randn(s, PhiloxKey{seed++, 1});
      plain.push_back(t);
      // The first input takes the op's layout, the others stay replicated.
      Placements p = dist.empty() ? op.placements : Placements{Replicate()};
      dist.push_back(distribute_tensor(t, mesh, p));
    }
    const double tp = time_per_call([&] { op.fn(plain); }, opts.iters, opts.reps);
    const double td = time_per_call([&] { op.fn(dist); }, opts.iters, opts.reps);
    // Stage breakdown over one more batch with the dispatcher's timers on.
    detail::dispatch_stats() = {};
    detail::dispatch_profiling() = true;
    for (int i = 0; i < opts.iters; ++i) op.fn(dist);
    detail::dispatch_profiling() = false;
    detail::DispatchStats s = detail::dispatch_stats();
    const double n = double(std::max<int64_t>(s.calls, 1));
    stages_total.propagate_s += s.propagate_s / n;
    stages_total.redistribute_s += s.redistribute_s / n;
    stages_total.kernel_s += s.kernel_s / n;
    stages_total.wrap_s += s.wrap_s / n;
    out << fmt::format(FMT_STRING("{:<30} {:>12.2f} {:>12.2f} {:>12.2f}   (propagate {:.2f}, redistribute {:.2f}, kernel {:.2f}, "
                       "wrap {:.2f} us; {} dispatches per call)\n"),
                       op.name, tp * 1e6, td * 1e6, (td - tp) * 1e6, s.propagate_s / n * 1e6,
                       s.redistribute_s / n * 1e6, s.kernel_s / n * 1e6, s.wrap_s / n * 1e6,
                       double(s.calls) / opts.iters);
    plain_total += tp;
    dist_total += td;
    rows.push_back({{"op", op.name},
                    {"plain_s", tp},
                    {"sharded_s", td},
                    {"added_us", (td - tp) * 1e6},
                    {"dispatches_per_call", double(s.calls) / opts.iters}});
  }
  const double k = double(ops.size());
  const double overhead_us = (dist_total - plain_total) / k * 1e6;
  out << fmt::format(FMT_STRING("mean added per op: {:.2f} us (goal: under 2 us)\n"), overhead_us);
  nlohmann::json j = {
      {"bench", "dispatch"},
      {"ours_s", dist_total},
      {"reference", "the same ops on plain tensors"},
      {"reference_s", plain_total},
      {"speedup", plain_total / dist_total},
      {"overhead_us_per_op", overhead_us},
      {"stages_us",
       {{"propagate", stages_total.propagate_s / k * 1e6},
        {"redistribute", stages_total.redistribute_s / k * 1e6},
        {"kernel", stages_total.kernel_s / k * 1e6},
        {"wrap", stages_total.wrap_s / k * 1e6}}},
      {"mesh", "one device (no communication)"},
      {"threads", opts.threads},
      {"ops", rows},
  };
  end_bench(machine);
  add_machine(j, machine);
  out << machine_summary(machine);
  out << j.dump() << "\n";
  return 0;
}

}  // namespace tessel::tools
