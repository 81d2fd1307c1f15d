#include "test/util/util.h"

#include <cmath>
#include <cstring>
#include <random>

#include "autograd/api.h"

namespace tessel::testing {

Tensor meta(const Dims& shape, DType dtype) { return empty(shape, TensorOptions(dtype).with_device(kMeta)); }

Tensor uniform(const Dims& shape, uint64_t seed, double lo, double hi, DType dtype) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(size_t(numel_of(shape)));
  for (auto& x : v) x = dist(gen);
  return tensor(v, shape.empty() ? Dims{} : shape, TensorOptions(DType::Float64)).to(dtype).reshape(shape);
}

Tensor randint(const Dims& shape, uint64_t seed, int64_t lo, int64_t hi, DType dtype) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> dist(lo, hi - 1);
  std::vector<int64_t> v(size_t(numel_of(shape)));
  for (auto& x : v) x = dist(gen);
  return tensor(v, Dims{int64_t(v.size())}, TensorOptions(DType::Int64)).to(dtype).reshape(shape);
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  Tensor x = a.contiguous(), y = b.contiguous();
  return x.nbytes() == 0 || std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  auto x = a.to_vector<double>(), y = b.to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    double d = std::fabs(x[i] - y[i]);
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  if (a.shape() != b.shape()) return false;
  auto x = a.to_vector<double>(), y = b.to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) && std::isnan(y[i])) continue;
    if (!(std::fabs(x[i] - y[i]) <= atol + rtol * std::fabs(y[i]))) return false;
  }
  return true;
}

Tensor grad_input(const Dims& shape, uint64_t seed, double lo, double hi) {
  Tensor t = uniform(shape, seed, lo, hi, DType::Float64);
  t.requires_grad_(true);
  return t;
}

Tensor grad_input_noncontig(const Dims& shape, uint64_t seed, double lo, double hi) {
  if (shape.size() < 2) return grad_input(shape, seed, lo, hi);
  Dims swapped = shape;
  std::swap(swapped[0], swapped[swapped.size() - 1]);
  Tensor base = uniform(swapped, seed, lo, hi, DType::Float64);
  Tensor t = raw::transpose(base, 0, shape.size() - 1);
  t.requires_grad_(true);
  return t;
}

std::string gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs,
                      GradcheckOptions opts) {
  std::vector<Tensor> diff;
  for (const auto& t : inputs)
    if (t.defined() && t.requires_grad()) diff.push_back(t);
  if (diff.empty()) return "gradcheck: no input requires grad";
  Tensor out = fn(inputs);
  if (!out.requires_grad()) return "gradcheck: output does not require grad";
  Tensor v = uniform(out.shape(), opts.seed, -1.0, 1.0, out.dtype());
  std::vector<Tensor> analytic = autograd::grad({out}, diff, {v});

  NoGradGuard no_grad;
  auto objective = [&]() {
    Tensor o = fn(inputs);
    return sum(mul(o.to(DType::Float64), v.to(DType::Float64))).item<double>();
  };
  for (size_t i = 0; i < diff.size(); ++i) {
    Tensor& x = diff[i];
    if (x.dtype() != DType::Float64) return "gradcheck: inputs must be float64";
    std::vector<double> numeric(size_t(x.numel()));
    double* base = static_cast<double*>(x.storage()->data());
    for_each_element(x.shape(), x.strides(), x.offset(), [&](int64_t lin, int64_t off) {
      double orig = base[off];
      base[off] = orig + opts.eps;
      double fp = objective();
      base[off] = orig - opts.eps;
      double fm = objective();
      base[off] = orig;
      numeric[size_t(lin)] = (fp - fm) / (2 * opts.eps);
    });
    std::vector<double> an(numeric.size(), 0.0);
    if (analytic[i].defined()) an = analytic[i].to_vector<double>();
    for (size_t j = 0; j < numeric.size(); ++j) {
      double tol = opts.atol + opts.rtol * std::fabs(numeric[j]);
      if (!(std::fabs(an[j] - numeric[j]) <= tol)) {
        return fmt::format(FMT_STRING("gradcheck: input {} ({}) element {}: analytical {} vs numerical {} (|diff| {} > tol {})"),
                           i, x.desc(), j, an[j], numeric[j], std::fabs(an[j] - numeric[j]), tol);
      }
    }
  }
  return "";
}

}  // namespace tessel::testing
