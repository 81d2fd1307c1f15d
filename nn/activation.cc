#include "nn/activation.h"

#include "autograd/api.h"

namespace tessel::nn {

GELU::GELU(std::string approx) : UnaryModule("GELU"), approximate(std::move(approx)) {
  TESSEL_CHECK(approximate == "tanh" || approximate == "none", "GELU",
               "approximate must be \"tanh\" or \"none\", got \"{}\"", approximate);
}

Tensor GELU::forward(const Tensor& x) { return gelu(x, approximate); }

std::string GELU::extra_repr() const { return fmt::format(FMT_STRING("approximate={}"), approximate); }

Tensor SiLU::forward(const Tensor& x) { return silu(x); }

}  // namespace tessel::nn
