// tessel verify A B: compare two runs' metrics files (or two --dump traces)
// step by step; exit 0 when they agree, 1 naming the first difference.
#include <cstdio>

#include "tools/cli/commands.h"
#include "train/dump.h"

namespace tessel::cli {

void register_verify(CLI::App& app) {
  static std::string a, b;
  CLI::App* cmd = add_command(app, "verify",
                              "Compare two metrics.jsonl files (loss, grad_norm, param_hash, ...; timings ignored) or "
                              "two --dump traces, and name the first step / op / tensor that differs",
                              []() -> int {
                                const auto d = train::first_divergence(a, b);
                                if (!d) {
                                  std::printf("identical: %s and %s agree on every compared field\n", a.c_str(),
                                              b.c_str());
                                  return 0;
                                }
                                std::printf("DIFFER: %s\n", d->c_str());
                                return 1;
                              });
  cmd->add_option("a", a, "first metrics file or dump")->required();
  cmd->add_option("b", b, "second metrics file or dump")->required();
}

}  // namespace tessel::cli
