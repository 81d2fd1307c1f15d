#include "nn/dropout.h"

#include "autograd/api.h"
#include "nn/context.h"

namespace tessel::nn {

Dropout::Dropout(double prob) : UnaryModule("Dropout"), p(prob) {
  TESSEL_CHECK(prob >= 0.0 && prob <= 1.0, "Dropout", "p must be in [0, 1], got {}", prob);  // false for NaN
}

Tensor Dropout::forward(const Tensor& x) {
  if (!is_training() || p == 0.0) return x;
  const std::string& site = path();
  return dropout(x, p, random_key(site), /*training=*/true, batch_block(x.shape(), "Dropout '" + site + "'"));
}

std::string Dropout::extra_repr() const { return fmt::format(FMT_STRING("p={}"), p); }

}  // namespace tessel::nn
