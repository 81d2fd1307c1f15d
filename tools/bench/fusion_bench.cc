#include "tools/bench/fusion_bench.h"

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "autograd/api.h"
#include "runtime/capture.h"
#include "runtime/threadpool.h"
#include "tools/bench/machine.h"

namespace tessel::tools {
namespace {

using Clock = std::chrono::steady_clock;

struct Case {
  const char* name;
  int inputs;  // [rows, cols] tensors (a bias, when asked, is [cols])
  bool bias;
  std::function<Tensor(const std::vector<Tensor>&)> chain;
};

// One recording of `c` on `inputs`: its program, and where its output lies.
struct Recorded {
  std::unique_ptr<capture::Program> program;
  capture::OutputLayout output;  // where the output lies (Program::output: the last replay's values)
};
Recorded record(const Case& c, const std::vector<Tensor>& inputs, bool fuse) {
  Recorded r;
  capture::Recorder rec(c.name);
  rec.fuse_elementwise = fuse;
  Tensor y = c.chain(inputs);
  r.output = capture::layout_of(rec.output(y), y);
  r.program = rec.finish();
  return r;
}

double time_replays(capture::Program& p, int iters) {
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) p.replay();
  return std::chrono::duration<double>(Clock::now() - t0).count() / iters;
}

}  // namespace

int run_fusion_bench(const FusionBenchOptions& o, std::ostream& out) {
  if (o.threads > 0) set_num_threads(o.threads);
  NoGradGuard no_grad;
  const std::vector<Case> cases = {
      {"swiglu forward: silu(a) * b", 2, false, [](const std::vector<Tensor>& x) { return silu(x[0]) * x[1]; }},
      {"swiglu backward: g * b * silu'(a), g * silu(a)", 3, false,
       [](const std::vector<Tensor>& x) {
         const Tensor s = sigmoid(x[0]);
         return x[1] * (s * (1.0 + x[0] * (1.0 - s))) + x[2] * (x[0] * s);
       }},
      {"bias + gelu + residual", 2, true,
       [](const std::vector<Tensor>& x) { return gelu(x[0] + x.back()) + x[1]; }},
      {"four binary ops: ((a * b) + c) * d", 4, false,
       [](const std::vector<Tensor>& x) { return ((x[0] * x[1]) + x[2]) * x[3]; }},
  };
  BenchMachine machine = begin_bench(out);
  out << fmt::format(FMT_STRING("bench fusion: [{}, {}] float32, {} threads, {} x {} replays per side, interleaved\n"),
                     o.rows, o.cols, num_threads(), o.reps, o.iters);
  out << fmt::format(FMT_STRING("  {:<48} {:>8} {:>12} {:>12} {:>8} {:>6}\n"), "chain", "launches", "unfused ms",
                     "fused ms", "speedup", "bits");
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  double fused_total = 0, unfused_total = 0;
  bool all_same = true;
  uint64_t seed = 1;
  for (const Case& c : cases) {
    std::vector<Tensor> inputs;
    for (int i = 0; i < c.inputs; ++i) inputs.push_back(randn({o.rows, o.cols}, PhiloxKey{seed++, 0}));
    if (c.bias) inputs.push_back(randn({o.cols}, PhiloxKey{seed++, 0}));
    Recorded side[2] = {record(c, inputs, false), record(c, inputs, true)};  // [unfused, fused]
    std::vector<double> t[2];
    for (int k = 0; k < 2; ++k) time_replays(*side[k].program, 2);  // warm-up (the arena, the caches)
    for (int r = 0; r < o.reps; ++r)
      for (int i = 0; i < 2; ++i) {
        const int k = r % 2 == 0 ? i : 1 - i;  // who goes first alternates
        t[k].push_back(time_replays(*side[k].program, o.iters));
      }
    const Tensor a = side[0].program->output(side[0].output);
    const Tensor b = side[1].program->output(side[1].output);
    const bool same = std::memcmp(a.raw_data(), b.raw_data(), size_t(a.nbytes())) == 0;
    all_same = all_same && same;
    const double unfused = median(t[0]), fused = median(t[1]);
    unfused_total += unfused;
    fused_total += fused;
    out << fmt::format(FMT_STRING("  {:<48} {:>8} {:>12.3f} {:>12.3f} {:>7.2f}x {:>6}\n"), c.name,
                       side[1].program->launches(), unfused * 1e3, fused * 1e3, unfused / fused, same ? "same" : "DIFFER");
    rows.push_back({{"chain", c.name},
                    {"launches", side[1].program->launches()},
                    {"fused_launches", side[1].program->fused_launches()},
                    {"unfused_s", unfused},
                    {"fused_s", fused},
                    {"speedup", unfused / fused},
                    {"buffer_bytes", {{"unfused", side[0].program->bytes()}, {"fused", side[1].program->bytes()}}},
                    {"same_bits", same}});
  }
  end_bench(machine);
  out << machine_summary(machine);
  nlohmann::ordered_json j = {{"bench", "fusion"},
                              {"ours_s", fused_total},
                              {"reference", "the same recorded launches, unfused (tessel compile mode)"},
                              {"reference_s", unfused_total},
                              {"speedup", unfused_total / fused_total},
                              {"same_bits", all_same},
                              {"rows", o.rows},
                              {"cols", o.cols},
                              {"threads", num_threads()},
                              {"cases", rows}};
  add_machine(j, machine);
  out << j.dump() << std::endl;
  return all_same ? 0 : 1;
}

}  // namespace tessel::tools
