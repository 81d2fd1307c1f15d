#pragma once
// Subcommand registration. Each command file adds its subcommand and a
// callback that stores the exit code for run_selected().
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace tessel::cli {

// Registers `name`; `run` executes after parsing if the subcommand was chosen.
CLI::App* add_command(CLI::App& app, const std::string& name, const std::string& help, std::function<int()> run);
int run_selected(CLI::App& app);
// The `bench` command that benchmarks attach to as nested subcommands
// (created on first use, so each benchmark registers itself independently).
CLI::App* bench_command(CLI::App& app);
// Replaces this process with the benchmark binary bench_NAME (next to the
// CLI) run with `args`; throws when it cannot be found or executed.
int exec_bench(const std::string& name, const std::vector<std::string>& args);

void register_info(CLI::App& app);
void register_train(CLI::App& app);
void register_bench(CLI::App& app);  // gemm, collectives, dispatch (tools/bench binaries)
void register_bench_step(CLI::App& app);
void register_bench_generate(CLI::App& app);
void register_launch(CLI::App& app);
void register_ckpt(CLI::App& app);  // inspect, verify, convert
void register_verify(CLI::App& app);  // compare two runs
void register_generate(CLI::App& app);  // text from a model
void register_plan(CLI::App& app);  // the auto-planner
void register_bench_plan(CLI::App& app);  // its predictions against real runs

}  // namespace tessel::cli
