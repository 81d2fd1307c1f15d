#pragma once
// Parameter initialisation, in place (torch.nn.init's functions).
//
// Each runs under no-grad (so it may write into a leaf that requires grad),
// bumps the tensor's version and returns the tensor. The random ones take an
// explicit PhiloxKey and an optional GlobalBlock: a shard of a parameter gets
// exactly its slice of the full parameter's values, and fans are computed from
// the *global* shape, so a sharded model initialises bit for bit like the
// unsharded one. Random inits need a floating-point tensor.
#include <cstdint>

#include "autograd/ops/random.h"
#include "runtime/tensor.h"

namespace tessel {

enum class FanMode : uint8_t { FanIn, FanOut };
enum class Nonlinearity : uint8_t { Linear, Sigmoid, Tanh, Relu, LeakyRelu, Selu };

// The recommended gain (torch.nn.init.calculate_gain): linear/sigmoid 1,
// tanh 5/3, relu sqrt(2), leaky_relu sqrt(2 / (1 + slope^2)), selu 3/4.
double calculate_gain(Nonlinearity nl, double negative_slope = 0.01);

// fan_in = shape[1] * receptive field, fan_out = shape[0] * receptive field
// (receptive field = product of shape[2:]); needs at least 2 dimensions.
struct Fans {
  int64_t fan_in = 0, fan_out = 0;
};
Fans compute_fans(const Dims& shape, const char* op = "compute_fans");

// U[lo, hi).
Tensor uniform_(const Tensor& t, PhiloxKey key, double lo = 0.0, double hi = 1.0, const GlobalBlock& block = {});
// N(mean, std^2), std >= 0.
Tensor normal_(const Tensor& t, PhiloxKey key, double mean = 0.0, double std = 1.0, const GlobalBlock& block = {});
// N(mean, std^2) truncated to [a, b] (absolute bounds, as in PyTorch), by the
// inverse CDF: no rejection loop. Needs std > 0 and a < b.
Tensor trunc_normal_(const Tensor& t, PhiloxKey key, double mean = 0.0, double std = 1.0, double a = -2.0,
                     double b = 2.0, const GlobalBlock& block = {});
// He init: std = gain / sqrt(fan), gain = calculate_gain(nl, a); uniform uses
// bound sqrt(3) * std.
Tensor kaiming_uniform_(const Tensor& t, PhiloxKey key, double a = 0.0, FanMode mode = FanMode::FanIn,
                        Nonlinearity nl = Nonlinearity::LeakyRelu, const GlobalBlock& block = {});
Tensor kaiming_normal_(const Tensor& t, PhiloxKey key, double a = 0.0, FanMode mode = FanMode::FanIn,
                       Nonlinearity nl = Nonlinearity::LeakyRelu, const GlobalBlock& block = {});
// Glorot init: std = gain * sqrt(2 / (fan_in + fan_out)); uniform uses bound sqrt(3) * std.
Tensor xavier_uniform_(const Tensor& t, PhiloxKey key, double gain = 1.0, const GlobalBlock& block = {});
Tensor xavier_normal_(const Tensor& t, PhiloxKey key, double gain = 1.0, const GlobalBlock& block = {});
// Constants (any dtype; no key needed: a block of a constant is a constant).
Tensor zeros_(const Tensor& t);
Tensor ones_(const Tensor& t);
Tensor constant_(const Tensor& t, Scalar value);

}  // namespace tessel
