#pragma once
// Learning-rate schedules: pure functions of the step, plain data (so a
// training config can hold one and a resume recomputes the same rate).
//
// Step indexing: `step` counts the optimizer updates already taken, so
// lr(0) is the rate of the first update:
//
//   for (int64_t step = 0; step < total; ++step) {
//     ...backward...
//     opt.set_lr(schedule.lr(step));
//     opt.step();
//   }
//
// With W = warmup_steps and T = total_steps (0 <= W <= T), in double:
//   step < W (linear warmup):  max_lr * ((step + 1) / W)
//                              (lr(0) = max_lr / W, lr(W - 1) = max_lr exactly)
//   W <= step < T:             p = (step - W) / (T - W)            (0 <= p < 1)
//     constant:                max_lr
//     cosine:                  max_lr - (max_lr - min_lr) * (0.5 * (1 - cos(pi * p)))
//     linear:                  max_lr - (max_lr - min_lr) * p
//                              (lr(W) = max_lr exactly)
//   step >= T:                 min_lr exactly (constant: max_lr)
// cos is the host's libm cos in double: the rate is computed once per step on
// the host and handed to every device, so it needs no cross-device contract.
#include <cstdint>

namespace tessel::nn {

struct LrSchedule {
  enum class Kind { Constant, Cosine, Linear };
  Kind kind = Kind::Constant;
  double max_lr = 0.0;
  double min_lr = 0.0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;  // unused by Constant

  double lr(int64_t step) const;
  double operator()(int64_t step) const { return lr(step); }

  // Each checks its arguments (tessel::Error naming the schedule and value).
  static LrSchedule constant(double lr, int64_t warmup_steps = 0);
  static LrSchedule cosine(double max_lr, double min_lr, int64_t warmup_steps, int64_t total_steps);
  static LrSchedule linear(double max_lr, double min_lr, int64_t warmup_steps, int64_t total_steps);
  // Throws if the fields are inconsistent (what the factories check).
  void validate() const;
};

const char* schedule_name(LrSchedule::Kind kind);  // "constant", "cosine", "linear"

}  // namespace tessel::nn
