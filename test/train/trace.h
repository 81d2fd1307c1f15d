#pragma once
// Per-step bits of a training run (loss bits and param_hash), for tests that
// compare runs bit for bit (bitwise mode, bitwise resume).
#include <cstdint>
#include <string>
#include <vector>

#include "train/trainer/trainer.h"

namespace tessel::testing {

struct StepTrace {
  std::vector<int64_t> steps;
  std::vector<uint64_t> loss_bits;
  std::vector<std::string> hashes;
  CompileStats compile;  // TrainConfig::compile: what compile mode did
};

// The small run the training tests start from: `model`'s tiny config, 20
// steps of 8 sequences x 16 tokens in 2 micro-batches, lr 3e-3 decaying to
// 3e-4 after 5 warm-up steps, no evaluation or samples, output in `out`.
train::TrainConfig tiny_run(const std::string& model, const std::string& out);

// Runs `c` quietly and records every step's loss bits and param_hash.
StepTrace run_traced(const train::TrainConfig& c);

// "" when `got` has `ref`'s bits at every step from index `from` of `ref` on
// (a resumed run records only the steps after its checkpoint), else the
// first difference.
std::string first_difference(const StepTrace& ref, const StepTrace& got, int64_t from = 0);

}  // namespace tessel::testing
