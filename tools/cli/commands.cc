#include "tools/cli/commands.h"

#include <map>

namespace tessel::cli {
namespace {
std::map<CLI::App*, std::function<int()>>& runners() {
  static std::map<CLI::App*, std::function<int()>> r;
  return r;
}
}  // namespace

CLI::App* add_command(CLI::App& app, const std::string& name, const std::string& help, std::function<int()> run) {
  CLI::App* sub = app.add_subcommand(name, help);
  runners()[sub] = std::move(run);
  return sub;
}

CLI::App* bench_command(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands({}))
    if (sub->get_name() == "bench") return sub;
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks against reference libraries; each ends with one JSON line");
  bench->require_subcommand(1);
  return bench;
}

int run_selected(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands()) {
    // Nested subcommands (bench gemm) take precedence over their parent.
    for (CLI::App* nested : sub->get_subcommands()) {
      auto it = runners().find(nested);
      if (it != runners().end()) return it->second();
    }
    auto it = runners().find(sub);
    if (it != runners().end()) return it->second();
  }
  return 0;
}

}  // namespace tessel::cli
