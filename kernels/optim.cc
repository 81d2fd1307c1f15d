#include "kernels/optim.h"

#include <cmath>

namespace tessel::kernels {

double ipow(double x, int64_t n) {
  double result = 1.0;
  while (n > 0) {
    if (n & 1) result *= x;
    x *= x;
    n >>= 1;
  }
  return result;
}

AdamWScalars adamw_scalars(double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step) {
  TESSEL_CHECK(step >= 1, "adamw_scalars", "step must be >= 1, got {}", step);
  AdamWScalars s;
  s.beta1 = float(beta1);
  s.one_minus_beta1 = float(1.0 - beta1);
  s.beta2 = float(beta2);
  s.one_minus_beta2 = float(1.0 - beta2);
  s.decay = float(1.0 - lr * weight_decay);
  s.step_size = float(lr / (1.0 - ipow(beta1, step)));
  s.bias_correction2_sqrt = float(std::sqrt(1.0 - ipow(beta2, step)));
  s.eps = float(eps);
  return s;
}

SGDScalars sgd_scalars(double lr, double momentum, double dampening, double weight_decay, bool nesterov,
                       bool first_step) {
  SGDScalars s;
  s.lr = float(lr);
  s.weight_decay = float(weight_decay);
  s.momentum = float(momentum);
  s.one_minus_dampening = float(1.0 - dampening);
  s.use_weight_decay = weight_decay != 0.0;
  s.use_momentum = momentum != 0.0;
  s.nesterov = nesterov;
  s.first_step = first_step;
  return s;
}

}  // namespace tessel::kernels
