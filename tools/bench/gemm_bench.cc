#include "tools/bench/gemm_bench.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/gemm.h"
#include "runtime/error.h"
#include "runtime/threadpool.h"
#include "tools/bench/machine.h"
#include "tools/bench/reference_process.h"
#include "tools/bench/torch_reference.h"

namespace tessel::tools {
namespace {

using kernels::cpu::GemmArgs;
using kernels::cpu::GemmIsa;

struct BenchShape {
  int64_t m, n, k;
  const char* trans;  // "nn": A*B, "nt": A*B^T, "tn": A^T*B (all row-major storage)
  bool large() const { return double(m) * double(n) * double(k) >= 1024.0 * 1024.0 * 1024.0; }
  std::string label() const {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s %lldx%lldx%lld", trans, (long long)m, (long long)n, (long long)k);
    return buf;
  }
};

std::vector<BenchShape> shapes(bool quick) {
  std::vector<BenchShape> v;
  const char* kTrans[] = {"nn", "nt", "tn"};
  if (quick) {
    for (int64_t s : {64, 128, 256})
      for (const char* t : kTrans) v.push_back({s, s, s, t});
    v.push_back({512, 384, 96, "nt"});
    v.push_back({96, 384, 512, "tn"});
    return v;
  }
  for (int64_t s : {256, 512, 1024, 2048, 4096})
    for (const char* t : kTrans) v.push_back({s, s, s, t});
  // Transformer layers (tokens x d_model x d_ff): forward x W^T, input
  // gradient dY W, weight gradient dY^T X (K = tokens).
  v.push_back({8192, 3072, 768, "nt"});
  v.push_back({8192, 768, 3072, "nt"});
  v.push_back({8192, 3072, 768, "nn"});
  v.push_back({8192, 768, 3072, "nn"});
  v.push_back({3072, 768, 8192, "tn"});
  v.push_back({768, 3072, 8192, "tn"});
  v.push_back({4096, 11008, 4096, "nt"});
  v.push_back({4096, 4096, 11008, "nn"});
  v.push_back({11008, 4096, 4096, "tn"});
  return v;
}

template <class F>
double time_s(F&& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// OpenBLAS's worker threads spin for a while after each call; on a machine
// with as many cores as threads they would steal time from the next timed
// run. A short pause before every timed call lets them go to sleep, and
// starts both libraries from idle threads alike.
void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(150)); }

}  // namespace

void use_best_openblas_core(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;  // the caller chose
  const std::string isa = cpu_isa();
  const char* want = isa == "avx512" ? "SkylakeX" : isa == "avx2" ? "Haswell" : nullptr;
  if (want == nullptr) return;
  std::string have = openblas_get_corename(), lower_want = want;
  for (char& c : have) c = char(std::tolower(static_cast<unsigned char>(c)));
  for (char& c : lower_want) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (have == lower_want) return;
  std::fprintf(stderr, "bench gemm: OpenBLAS chose its %s kernels on this %s CPU; restarting with OPENBLAS_CORETYPE=%s\n",
               openblas_get_corename(), isa.c_str(), want);
  setenv("OPENBLAS_CORETYPE", want, 1);
  execv("/proc/self/exe", argv);
  std::fprintf(stderr, "bench gemm: could not restart (%s); OpenBLAS keeps its %s kernels\n", std::strerror(errno),
               openblas_get_corename());
}

int run_gemm_bench(const GemmBenchOptions& opts, std::ostream& out) {
  TESSEL_CHECK(opts.threads >= 1, "bench gemm", "--threads must be >= 1");
  TESSEL_CHECK(opts.reps >= 1, "bench gemm", "--reps must be >= 1");
  set_num_threads(opts.threads);
  openblas_set_num_threads(opts.threads);
  if (opts.isa == "avx2") {
    kernels::cpu::gemm_force_isa(GemmIsa::Avx2);
  } else if (opts.isa == "avx512") {
    kernels::cpu::gemm_force_isa(GemmIsa::Avx512);
  } else {
    TESSEL_CHECK(opts.isa == "auto", "bench gemm", "--isa must be auto, avx2 or avx512, got '{}'", opts.isa);
  }
  const char* isa = kernels::cpu::gemm_isa_name(kernels::cpu::gemm_active_isa());
  // The second reference: torch.mm in a child process (its own BLAS, MKL in
  // PyTorch's wheels), where a Python with torch exists.
  std::unique_ptr<ReferenceProcess> torch_side;
  std::string torch_name, torch_error;
  if (opts.torch) {
    const std::string python = opts.python.empty() ? reference_python() : opts.python;
    if (python.empty()) {
      torch_error = "no Python with torch (`./tessel bench gemm` creates ~/.cache/tessel/venv; or set TESSEL_PYTHON)";
    } else {
      const std::string script = (std::filesystem::path(repository_root()) / "tools/bench/gemm_torch.py").string();
      torch_side = std::make_unique<ReferenceProcess>(
          "bench gemm", std::vector<std::string>{python, script, "--threads", std::to_string(opts.threads)});
      nlohmann::json hello = torch_side->ask("");
      TESSEL_CHECK(hello.is_object() && hello.value("ready", false), "bench gemm",
                   "the PyTorch side ({} {}) did not start; its errors are above", python, script);
      torch_name = "pytorch " + hello["torch"].get<std::string>() + " torch.mm (" + hello["blas"].get<std::string>() +
                   ", " + std::to_string(hello["threads"].get<int>()) + " threads, " +
                   hello.value("cpu_capability", std::string("ISA unknown")) + ")";
    }
  }
  BenchMachine machine = begin_bench(out);

  char line[256];
  std::snprintf(line, sizeof line, "bench gemm: float32, threads=%d, V=%d, reps=%d (median), isa=%s, openblas %s\n",
                opts.threads, opts.chunks, opts.reps, isa, openblas_get_corename());
  out << line;
  out << "  second reference: " << (torch_side ? torch_name : "none -- " + (torch_error.empty() ? std::string("--no-torch") : torch_error)) << "\n";
  std::snprintf(line, sizeof line, "%-26s %12s %12s %8s %12s %8s %s\n", "shape (trans MxNxK)", "ours GF/s", "openblas",
                "ratio", "torch.mm", "ratio", "");
  out << line << std::flush;

  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  nlohmann::json rows = nlohmann::json::array();
  double ours_sum = 0, ref_sum = 0, all_ours = 0, all_ref = 0, torch_sum = 0, all_torch = 0;
  int status = 0;

  for (const BenchShape& s : shapes(opts.quick)) {
    if (!opts.filter.empty() && s.label().find(opts.filter) == std::string::npos) continue;
    const bool ta = s.trans[0] == 't', tb = s.trans[1] == 't';
    std::vector<float> A(size_t(s.m * s.k)), B(size_t(s.k * s.n)), C(size_t(s.m * s.n)), R(size_t(s.m * s.n));
    for (auto& x : A) x = u(rng);
    for (auto& x : B) x = u(rng);
    // Storage: A is M x K (or K x M when transposed), B is K x N (or N x K).
    const int64_t lda = ta ? s.m : s.k, ldb = tb ? s.k : s.n;
    GemmArgs g;
    g.M = s.m, g.N = s.n, g.K = s.k;
    g.A = A.data(), g.a_row_stride = ta ? 1 : lda, g.a_col_stride = ta ? lda : 1;
    g.B = B.data(), g.b_row_stride = tb ? 1 : ldb, g.b_col_stride = tb ? ldb : 1;
    g.C = C.data(), g.c_row_stride = s.n;
    g.chunks = opts.chunks;
    auto ours = [&] { kernels::cpu::gemm_f32(g); };
    auto ref = [&] {
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(s.m), int(s.n),
                  int(s.k), 1.0f, A.data(), int(lda), B.data(), int(ldb), 0.0f, R.data(), int(s.n));
    };
    // torch.mm times itself in its process (the pipe is outside the timing).
    auto torch_time = [&](bool prime) {
      nlohmann::json r = torch_side->ask(prime ? "time 1" : "time 0");
      TESSEL_CHECK(r.is_object() && r.contains("s"), "bench gemm", "the PyTorch side failed on {}: {}", s.label(),
                   r.is_discarded() ? "no answer (its errors are above)" : r.dump());
      return r["s"].get<double>();
    };
    if (torch_side) {
      const std::string cmd = "shape " + std::to_string(s.m) + " " + std::to_string(s.n) + " " + std::to_string(s.k) +
                              " " + s.trans;
      nlohmann::json r = torch_side->ask(cmd.c_str());
      TESSEL_CHECK(r.is_object() && r.value("ok", false), "bench gemm", "the PyTorch side refused {}: {}", s.label(),
                   r.dump());
      torch_time(true);  // warm-up
    }

    // Warm-up (also the correctness check), then interleaved timed runs,
    // alternating which library goes first.
    const double warm_ours = time_s(ours);
    ref();
    double max_err = 0, max_ref = 0;
    for (size_t i = 0; i < C.size(); ++i) {
      max_err = std::max(max_err, double(std::fabs(C[i] - R[i])));
      max_ref = std::max(max_ref, double(std::fabs(R[i])));
    }
    if (!(max_err <= 1e-4 * std::max(1.0, max_ref) * std::sqrt(double(s.k)))) {
      out << "  MISMATCH vs openblas on " << s.label() << ": max |diff| " << max_err << "\n";
      status = 1;
    }
    // Every timed call is made in the state of back-to-back use, as in
    // training: after a pause (see settle()), short problems get one untimed
    // call of the same library first, so its threads are awake (waking a
    // sleeping thread on a busy machine can take milliseconds).
    const bool prime = warm_ours < 0.25;
    std::vector<double> t_ours, t_ref, t_torch;
    const int sides = torch_side ? 3 : 2;
    for (int r = 0; r < opts.reps; ++r) {
      for (int which = 0; which < sides; ++which) {
        settle();
        const int side = (r + which) % sides;  // who goes first rotates
        if (side == 0) {
          if (prime) ours();
          t_ours.push_back(time_s(ours));
        } else if (side == 1) {
          if (prime) ref();
          t_ref.push_back(time_s(ref));
        } else {
          t_torch.push_back(torch_time(prime));
        }
      }
    }
    const double mo = median(t_ours), mr = median(t_ref), mt = torch_side ? median(t_torch) : 0.0;
    const double flop = 2.0 * double(s.m) * double(s.n) * double(s.k);
    if (torch_side)
      std::snprintf(line, sizeof line, "%-26s %12.1f %12.1f %8.3f %12.1f %8.3f %s\n", s.label().c_str(),
                    flop / mo * 1e-9, flop / mr * 1e-9, mr / mo, flop / mt * 1e-9, mt / mo, s.large() ? "" : "(small)");
    else
      std::snprintf(line, sizeof line, "%-26s %12.1f %12.1f %8.3f %12s %8s %s\n", s.label().c_str(), flop / mo * 1e-9,
                    flop / mr * 1e-9, mr / mo, "-", "-", s.large() ? "" : "(small)");
    out << line << std::flush;
    if (s.large()) {
      ours_sum += mo;
      ref_sum += mr;
      torch_sum += mt;
    }
    all_ours += mo;
    all_ref += mr;
    all_torch += mt;
    nlohmann::json row = {{"m", s.m},           {"n", s.n},          {"k", s.k},
                          {"trans", s.trans},   {"ours_s", mo},      {"reference_s", mr},
                          {"speedup", mr / mo}, {"large", s.large()}};
    if (torch_side) {
      row["torch_s"] = mt;
      row["torch_speedup"] = mt / mo;
    }
    rows.push_back(row);
  }

  const char* summed = "large shapes";
  if (ours_sum == 0) {  // no large shape ran (--quick, --filter): sum them all
    ours_sum = all_ours;
    ref_sum = all_ref;
    torch_sum = all_torch;
    summed = "all shapes (none large)";
  }
  nlohmann::json j;
  j["bench"] = "gemm";
  j["ours_s"] = ours_sum;
  j["reference"] = "openblas";
  j["reference_s"] = ref_sum;
  j["speedup"] = ours_sum > 0 ? ref_sum / ours_sum : 0.0;
  j["threads"] = opts.threads;
  j["chunks"] = opts.chunks;
  j["isa"] = isa;
  j["reference_kernel"] = std::string("openblas ") + openblas_get_corename();
  if (torch_side)
    j["torch_reference"] = {{"name", torch_name},
                            {"reference_s", torch_sum},
                            {"speedup", ours_sum > 0 ? torch_sum / ours_sum : 0.0}};
  else
    j["torch_reference"] = {{"error", torch_error.empty() ? std::string("--no-torch") : torch_error}};
  j["shapes"] = rows;
  end_bench(machine);
  add_machine(j, machine);
  std::snprintf(line, sizeof line, "total over %s: ours %.3f s, openblas %.3f s, speedup %.3f\n", summed, ours_sum,
                ref_sum, ours_sum > 0 ? ref_sum / ours_sum : 0.0);
  out << line;
  if (torch_side) {
    std::snprintf(line, sizeof line, "  torch.mm %.3f s, speedup %.3f\n", torch_sum,
                  ours_sum > 0 ? torch_sum / ours_sum : 0.0);
    out << line;
  }
  out << machine_summary(machine);
  out << j.dump() << std::endl;
  return status;
}

}  // namespace tessel::tools
