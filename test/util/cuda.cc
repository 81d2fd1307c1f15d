#include "test/util/cuda.h"

#include <cmath>
#include <cstring>

#include "autograd/api.h"
#include "kernels/elementwise.h"
#include "test/util/util.h"

namespace tessel::testing {

Tensor to_cuda(const Tensor& t) {
  Tensor d = raw::empty(t.shape(), t.dtype(), kCuda);
  kernels::copy(kCuda, t, d);
  return d;
}

Tensor to_cpu(const Tensor& t) {
  if (t.device().is_cpu()) return t.is_contiguous() ? t : t.contiguous();
  Tensor h = raw::empty(t.shape(), t.dtype(), kCPU);
  kernels::copy(t.device(), t, h);
  return h;
}

std::string bits_mismatch(const Tensor& a_any, const Tensor& b_any) {
  if (a_any.shape() != b_any.shape() || a_any.dtype() != b_any.dtype())
    return "shape/dtype differ: " + a_any.desc() + " vs " + b_any.desc();
  Tensor a = to_cpu(a_any), b = to_cpu(b_any);
  const size_t item = a.itemsize();
  const char* pa = static_cast<const char*>(a.raw_data());
  const char* pb = static_cast<const char*>(b.raw_data());
  if (a.numel() == 0) return "";
  const auto va = is_floating(a.dtype()) ? a.to_vector<double>() : std::vector<double>();
  const auto vb = is_floating(a.dtype()) ? b.to_vector<double>() : std::vector<double>();
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::memcmp(pa + i * int64_t(item), pb + i * int64_t(item), item) == 0) continue;
    if (!va.empty() && std::isnan(va[size_t(i)]) && std::isnan(vb[size_t(i)])) continue;
    return fmt::format(FMT_STRING("element {} of {}: {} vs {} (first mismatch)"), i, a.desc(),
                       va.empty() ? double(a.to_vector<int64_t>()[size_t(i)]) : va[size_t(i)],
                       vb.empty() ? double(b.to_vector<int64_t>()[size_t(i)]) : vb[size_t(i)]);
  }
  return "";
}

bool same_bits(const Tensor& a, const Tensor& b) { return bits_mismatch(a, b).empty(); }

namespace {
std::string compare_one(const char* what, const Tensor& gpu, const Tensor& cpu, const CompareOptions& o) {
  if (gpu.defined() != cpu.defined()) return fmt::format(FMT_STRING("{}: defined on one device only"), what);
  if (!cpu.defined()) return "";
  if (o.bitwise) {
    const std::string m = bits_mismatch(gpu, cpu);
    return m.empty() ? "" : fmt::format(FMT_STRING("{}: {}"), what, m);
  }
  Tensor g = to_cpu(gpu);
  if (!allclose(g, cpu, o.rtol, o.atol))
    return fmt::format(FMT_STRING("{}: not within rtol {} atol {} (max |diff| {})"), what, o.rtol, o.atol, max_abs_diff(g, cpu));
  return "";
}
}  // namespace

std::string compare_with_cpu(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                             const std::vector<Tensor>& inputs, CompareOptions o) {
  std::vector<Tensor> cpu_in, gpu_in;
  for (const Tensor& t : inputs) {
    if (!t.defined()) {
      cpu_in.emplace_back();
      gpu_in.emplace_back();
      continue;
    }
    const bool rg = t.requires_grad();
    Tensor c = t.detach().clone();
    Tensor g = to_cuda(t.detach());
    if (rg && o.backward) {
      c.requires_grad_();
      g.requires_grad_();
    }
    cpu_in.push_back(c);
    gpu_in.push_back(g);
  }
  Tensor out_c = fn(cpu_in), out_g = fn(gpu_in);
  if (!out_g.device().is_cuda()) return "the function's result is not on the GPU: " + out_g.desc();
  std::string m = compare_one("output", out_g, out_c, o);
  if (!m.empty() || !o.backward || !out_c.requires_grad()) return m;
  Tensor grad = uniform(out_c.shape(), o.seed, -1.0, 1.0, out_c.dtype());
  out_c.backward(grad);
  out_g.backward(to_cuda(grad));
  for (size_t i = 0; i < cpu_in.size(); ++i) {
    if (!cpu_in[i].defined() || !cpu_in[i].requires_grad()) continue;
    m = compare_one(fmt::format(FMT_STRING("gradient of input {}"), i).c_str(), gpu_in[i].grad(), cpu_in[i].grad(), o);
    if (!m.empty()) return m;
  }
  return "";
}

}  // namespace tessel::testing
