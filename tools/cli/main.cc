// The tessel command line: one binary, one subcommand per job.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include "runtime/error.h"
#include "tools/cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"tessel: a distributed tensor runtime with bitwise-reproducible training"};
  app.require_subcommand(1);
  tessel::cli::register_info(app);
  tessel::cli::register_train(app);
  tessel::cli::register_bench(app);
  tessel::cli::register_bench_step(app);
  tessel::cli::register_bench_generate(app);
  tessel::cli::register_launch(app);
  tessel::cli::register_ckpt(app);
  tessel::cli::register_verify(app);
  tessel::cli::register_generate(app);
  tessel::cli::register_plan(app);
  tessel::cli::register_bench_plan(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return tessel::cli::run_selected(app);
  } catch (const tessel::Error& e) {
    std::fprintf(stderr, "tessel: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessel: unexpected error: %s\n", e.what());
    return 2;
  }
}
