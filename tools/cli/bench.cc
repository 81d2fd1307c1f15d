// `tessel bench NAME [args...]`: runs the benchmark binary tools/bench:bench_NAME
// (built with this CLI, see tools/BUILD) with the remaining arguments. Every
// benchmark prints a table and ends with one JSON line.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "tools/cli/commands.h"

namespace tessel::cli {
namespace {

struct Bench {
  const char* name;
  const char* help;
};
const Bench kBenches[] = {
    {"gemm", "float32 GEMM (canonical K order) against OpenBLAS"},
    {"collectives",
     "all_reduce / all_gather / reduce_scatter of the MPI backend against raw MPI (launches mpirun, --ranks N)"},
    {"dispatch", "time a distributed op call adds over the same op on a plain tensor, per stage"},
    {"fusion", "compile mode's fused elementwise chains against the same recorded launches unfused"},
    {"ckpt", "checkpoint save/load GB/s against a plain sequential copy of the same bytes; resharded load"},
    {"step_cuda", "a training step on a GPU: tokens/s and MFU (vs PyTorch eager / torch.compile when available)"},
};

std::string exe_dir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string p(buf, size_t(n));
  return p.substr(0, p.find_last_of('/'));
}

// bazel-bin/tools/tessel -> bazel-bin/tools/bench/bench_NAME, or the runfiles copy.
std::string find_bench(const std::string& name) {
  const std::string dir = exe_dir();
  for (const std::string& p : {dir + "/bench/bench_" + name, dir + "/tessel.runfiles/tessel/tools/bench/bench_" + name}) {
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  throw Error(fmt::format(FMT_STRING("bench {}: the binary bench_{} was not found next to {} (run it through ./tessel, which "
                          "builds //tools:tessel with its benchmarks)"),
                          name, name, dir));
}

}  // namespace

int exec_bench(const std::string& name, const std::vector<std::string>& args) {
  std::string path = find_bench(name);
  std::vector<std::string> argv = {path};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargs;
  for (auto& a : argv) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  std::fflush(stdout);
  execv(path.c_str(), cargs.data());
  throw Error(fmt::format(FMT_STRING("bench {}: cannot execute {}"), name, path));
}

void register_bench(CLI::App& app) {
  CLI::App* bench = bench_command(app);
  for (const Bench& b : kBenches) {
    const std::string name = b.name;
    CLI::App* sub = add_command(*bench, name, b.help, [bench, name] {
      return exec_bench(name, bench->get_subcommand(name)->remaining());
    });
    // Every argument after NAME (--help included) belongs to the benchmark.
    sub->prefix_command();
    sub->set_help_flag();
  }
}

}  // namespace tessel::cli
