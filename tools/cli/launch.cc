// `tessel launch -n N [--hostfile FILE ...] [--] COMMAND [ARGS...]`: runs
// `tessel COMMAND ARGS...` as N MPI ranks (mpirun), e.g. `tessel launch -n 4
// -- train --mesh dp=2,tp=2`.
//
// One machine (no hostfile): the environment suits containers -- root
// allowed, ranks may outnumber cores, shared memory between processes
// (OpenMPI's vader), no binding.
//
// Across machines (--hostfile, docs/multihost.md): mpirun starts a daemon on
// every host through ssh (or --agent), the ranks talk over TCP (plus shared
// memory between ranks of one host), and nothing is oversubscribed: the
// hostfile's slots are checked against -n here, before anything starts. ssh
// does not carry the caller's environment, so every TESSEL_* variable (and
// OMP_NUM_THREADS) set here is forwarded with -x: all ranks must compute
// with the same settings.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "tools/cli/commands.h"

extern char** environ;

namespace tessel::cli {
namespace {

std::string self_exe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  TESSEL_CHECK(n > 0, "launch", "cannot find the tessel binary (/proc/self/exe)");
  return std::string(buf, size_t(n));
}

struct HostSlots {
  std::string host;
  int slots;
};

// OpenMPI's hostfile format: `host [slots=N] [max_slots=M]`, # comments; a
// host without slots= counts one slot per line (mpirun counts it by cores,
// which this check cannot see from here, so it is lenient: one).
std::vector<HostSlots> read_hostfile(const std::string& path) {
  std::ifstream in(path);
  TESSEL_CHECK(in.good(), "launch", "cannot read the hostfile '{}'", path);
  std::vector<HostSlots> hosts;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string host, w;
    if (!(words >> host)) continue;
    int slots = 1;
    while (words >> w) {
      if (w.rfind("slots=", 0) == 0) {
        char* end = nullptr;
        const long v = std::strtol(w.c_str() + 6, &end, 10);
        TESSEL_CHECK(end && *end == 0 && v > 0, "launch", "hostfile '{}' line {}: '{}' is not slots=<positive number>",
                     path, lineno, w);
        slots = int(v);
      }
    }
    bool merged = false;
    for (auto& h : hosts) {
      if (h.host == host) {
        h.slots += slots;
        merged = true;
      }
    }
    if (!merged) hosts.push_back({host, slots});
  }
  TESSEL_CHECK(!hosts.empty(), "launch", "the hostfile '{}' names no host", path);
  return hosts;
}

}  // namespace

void register_launch(CLI::App& app) {
  static int ranks = 2;
  static std::string hostfile, agent, tcp_if;
  static std::vector<std::string> mpi_args, command;
  CLI::App* cmd = add_command(app, "launch", "Run a tessel command as N MPI ranks (wraps mpirun)", []() -> int {
    TESSEL_CHECK(ranks > 0, "launch", "-n must be positive, got {}", ranks);
    TESSEL_CHECK(!command.empty(), "launch", "nothing to run: tessel launch -n N -- train ...");
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    setenv("OMPI_MCA_hwloc_base_binding_policy", "none", 0);
    std::vector<std::string> argv = {"mpirun", "-np", std::to_string(ranks)};
    if (hostfile.empty()) {
      setenv("OMPI_MCA_btl", "self,vader", 0);
      setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);
      setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
    } else {
      const auto hosts = read_hostfile(hostfile);
      int slots = 0;
      std::vector<std::string> listed;
      for (const auto& h : hosts) {
        slots += h.slots;
        listed.push_back(fmt::format(FMT_STRING("{}: {}"), h.host, h.slots));
      }
      TESSEL_CHECK(ranks <= slots, "launch",
                   "-n {} ranks, but the hostfile '{}' has {} slots ({}): a mesh needs one slot per rank; add hosts or "
                   "slots= (oversubscribing hosts across a network is refused)",
                   ranks, hostfile, slots, fmt::join(listed, ", "));
      argv.insert(argv.end(), {"--hostfile", hostfile});
      // TCP between hosts, shared memory within one; no UCX or verbs (a
      // cluster with InfiniBand passes its own --mpi-arg settings).
      setenv("OMPI_MCA_pml", "ob1", 0);
      setenv("OMPI_MCA_btl", "tcp,self,vader", 0);
      setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);
      if (!tcp_if.empty()) {
        setenv("OMPI_MCA_btl_tcp_if_include", tcp_if.c_str(), 1);
        setenv("OMPI_MCA_oob_tcp_if_include", tcp_if.c_str(), 1);
      }
      if (!agent.empty()) setenv("OMPI_MCA_plm_rsh_agent", agent.c_str(), 1);
      for (char** e = environ; *e; ++e) {
        const std::string kv = *e;
        const std::string name = kv.substr(0, kv.find('='));
        if (name.rfind("TESSEL_", 0) == 0 || name == "OMP_NUM_THREADS") argv.insert(argv.end(), {"-x", name});
      }
    }
    argv.insert(argv.end(), mpi_args.begin(), mpi_args.end());
    argv.push_back(self_exe());
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
  cmd->add_option("--hostfile", hostfile,
                  "run across machines: OpenMPI hostfile, one `host slots=N` per line (docs/multihost.md)");
  cmd->add_option("--agent", agent, "with --hostfile: how to start a command on a host (default ssh): AGENT HOST CMD...");
  cmd->add_option("--tcp-if", tcp_if,
                  "with --hostfile: the network(s) ranks and daemons use, e.g. 10.0.0.0/24 or eth1 (default: all)");
  // One value per occurrence: a vector option would otherwise take the `--`
  // that starts the command as its own end marker, and the command's flags
  // would then be parsed as launch's.
  cmd->add_option("--mpi-arg", mpi_args, "one more mpirun argument (repeat: --mpi-arg=--map-by --mpi-arg=node)")
      ->allow_extra_args(false);
  cmd->add_option("command", command, "the tessel command and its arguments (after --)")->required();
  cmd->prefix_command();
}

}  // namespace tessel::cli
