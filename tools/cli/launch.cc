// `tessel launch -n N [-- ] COMMAND [ARGS...]`: runs `tessel COMMAND ARGS...`
// as N MPI ranks (mpirun), e.g. `tessel launch -n 4 -- train --mesh dp=2,tp=2`.
// The environment suits one machine and containers: root allowed, ranks may
// outnumber cores, shared memory between processes (OpenMPI's vader), no
// binding. Across machines, call mpirun/srun yourself with your cluster's
// settings: tessel detects the launcher either way.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "tools/cli/commands.h"

namespace tessel::cli {
namespace {

std::string self_exe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  TESSEL_CHECK(n > 0, "launch", "cannot find the tessel binary (/proc/self/exe)");
  return std::string(buf, size_t(n));
}

}  // namespace

void register_launch(CLI::App& app) {
  static int ranks = 2;
  static std::vector<std::string> command;
  CLI::App* cmd = add_command(app, "launch", "Run a tessel command as N MPI ranks (wraps mpirun)", []() -> int {
    TESSEL_CHECK(ranks > 0, "launch", "-n must be positive, got {}", ranks);
    TESSEL_CHECK(!command.empty(), "launch", "nothing to run: tessel launch -n N -- train ...");
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    setenv("OMPI_MCA_btl", "self,vader", 0);
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);
    setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
    setenv("OMPI_MCA_hwloc_base_binding_policy", "none", 0);
    std::vector<std::string> argv = {"mpirun", "-np", std::to_string(ranks), self_exe()};
    argv.insert(argv.end(), command.begin(), command.end());
    std::vector<char*> c;
    for (auto& a : argv) c.push_back(a.data());
    c.push_back(nullptr);
    std::fflush(stdout);
    execvp("mpirun", c.data());
    std::fprintf(stderr, "tessel: error: launch: cannot run mpirun (is openmpi-bin installed? ./tessel installs it)\n");
    return 1;
  });
  cmd->add_option("-n,--ranks", ranks, "number of ranks")->capture_default_str();
  cmd->add_option("command", command, "the tessel command and its arguments (after --)")->required();
  cmd->prefix_command();
}

}  // namespace tessel::cli
