#include "test/train/trace.h"

#include <cstring>

namespace tessel::testing {

train::TrainConfig tiny_run(const std::string& model, const std::string& out) {
  train::TrainConfig c;
  c.model = model;
  c.model_config = "tiny";
  c.steps = 20;
  c.batch_size = 8;
  c.seq_len = 16;
  c.micro_batches = 2;
  c.eval_every = 0;
  c.sample_length = 0;
  c.lr = 3e-3;
  c.min_lr = 3e-4;
  c.warmup_steps = 5;
  c.out_dir = out;
  return c;
}

StepTrace run_traced(const train::TrainConfig& c) {
  StepTrace t;
  train::TrainHooks h;
  h.quiet = true;
  h.on_step = [&](const train::StepMetrics& m) {
    uint64_t bits;
    const double l = *m.loss;
    std::memcpy(&bits, &l, sizeof bits);
    t.steps.push_back(m.step);
    t.loss_bits.push_back(bits);
    t.hashes.push_back(m.param_hash);
  };
  t.compile = train::run_training(c, h).compile;
  return t;
}

std::string first_difference(const StepTrace& ref, const StepTrace& got, int64_t from) {
  const size_t n = ref.steps.size() - size_t(from);
  if (got.steps.size() != n) return "ran " + std::to_string(got.steps.size()) + " steps, expected " + std::to_string(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t j = size_t(from) + i;
    const std::string at = std::to_string(ref.steps[j]);
    if (got.steps[i] != ref.steps[j]) return "step " + std::to_string(got.steps[i]) + " where " + at + " was expected";
    if (got.hashes[i] != ref.hashes[j]) return "param_hash differs at step " + at;
    if (got.loss_bits[i] != ref.loss_bits[j]) return "loss bits differ at step " + at;
  }
  return "";
}

}  // namespace tessel::testing
