#include "nn/mlp.h"

#include "autograd/api.h"

namespace tessel::nn {

MLP::MLP(int64_t d, int64_t h, bool bias, double p) : UnaryModule("MLP"), dim(d), hidden(h == 0 ? 4 * d : h) {
  TESSEL_CHECK(d > 0 && hidden > 0, "MLP", "dim and hidden must be positive (hidden 0 means 4 * dim), got dim={}, "
               "hidden={}", d, h);
  fc = child("fc", std::make_shared<Linear>(dim, hidden, bias));
  proj = child("proj", std::make_shared<Linear>(hidden, dim, bias));
  drop = child("drop", std::make_shared<Dropout>(p));
}

Tensor MLP::forward(const Tensor& x) { return (*drop)((*proj)(gelu((*fc)(x), "tanh"))); }

std::string MLP::extra_repr() const { return fmt::format(FMT_STRING("dim={}, hidden={}"), dim, hidden); }

SwiGLU::SwiGLU(int64_t d, int64_t h) : UnaryModule("SwiGLU"), dim(d), hidden(h) {
  TESSEL_CHECK(d > 0 && h > 0, "SwiGLU", "dim and hidden must be positive, got dim={}, hidden={}", d, h);
  w1 = child("w1", std::make_shared<Linear>(d, h, /*bias=*/false));
  w2 = child("w2", std::make_shared<Linear>(h, d, /*bias=*/false));
  w3 = child("w3", std::make_shared<Linear>(d, h, /*bias=*/false));
}

Tensor SwiGLU::forward(const Tensor& x) { return (*w2)(swiglu((*w1)(x), (*w3)(x))); }

std::string SwiGLU::extra_repr() const { return fmt::format(FMT_STRING("dim={}, hidden={}"), dim, hidden); }

}  // namespace tessel::nn
