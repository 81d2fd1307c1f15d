#include "nn/schedule.h"

#include <cmath>

#include "runtime/error.h"

namespace tessel::nn {

const char* schedule_name(LrSchedule::Kind kind) {
  switch (kind) {
    case LrSchedule::Kind::Constant: return "constant";
    case LrSchedule::Kind::Cosine: return "cosine";
    case LrSchedule::Kind::Linear: return "linear";
  }
  return "?";
}

void LrSchedule::validate() const {
  const std::string op = std::string("LrSchedule(") + schedule_name(kind) + ")";
  TESSEL_CHECK(std::isfinite(max_lr) && max_lr >= 0, op, "invalid max_lr = {} (must be a finite number >= 0)",
               max_lr);
  TESSEL_CHECK(warmup_steps >= 0, op, "invalid warmup_steps = {} (must be >= 0)", warmup_steps);
  if (kind == Kind::Constant) return;
  TESSEL_CHECK(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= max_lr, op,
               "invalid min_lr = {} (must be in [0, max_lr = {}])", min_lr, max_lr);
  TESSEL_CHECK(total_steps >= warmup_steps, op, "invalid total_steps = {} (must be >= warmup_steps = {})",
               total_steps, warmup_steps);
}

LrSchedule LrSchedule::constant(double lr, int64_t warmup_steps) {
  LrSchedule s;
  s.kind = Kind::Constant;
  s.max_lr = s.min_lr = lr;
  s.warmup_steps = warmup_steps;
  s.validate();
  return s;
}

LrSchedule LrSchedule::cosine(double max_lr, double min_lr, int64_t warmup_steps, int64_t total_steps) {
  LrSchedule s{Kind::Cosine, max_lr, min_lr, warmup_steps, total_steps};
  s.validate();
  return s;
}

LrSchedule LrSchedule::linear(double max_lr, double min_lr, int64_t warmup_steps, int64_t total_steps) {
  LrSchedule s{Kind::Linear, max_lr, min_lr, warmup_steps, total_steps};
  s.validate();
  return s;
}

double LrSchedule::lr(int64_t step) const {
  TESSEL_CHECK(step >= 0, std::string("LrSchedule(") + schedule_name(kind) + ")", "invalid step = {} (must be >= 0)",
               step);
  if (step < warmup_steps) return max_lr * (double(step + 1) / double(warmup_steps));
  if (kind == Kind::Constant) return max_lr;
  if (step >= total_steps) return min_lr;
  const double p = double(step - warmup_steps) / double(total_steps - warmup_steps);
  if (kind == Kind::Linear) return max_lr - (max_lr - min_lr) * p;
  return max_lr - (max_lr - min_lr) * (0.5 * (1.0 - std::cos(M_PI * p)));
}

}  // namespace tessel::nn
