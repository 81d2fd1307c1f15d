#include "autograd/anomaly.h"

#include <cmath>
#include <sstream>

#include <fmt/format.h>

#include "autograd/grad_mode.h"
#include "kernels/nonfinite.h"
#include "runtime/comm/comm.h"

namespace tessel::anomaly {
namespace {

thread_local bool g_enabled = false;
thread_local int64_t g_step = -1;
thread_local std::vector<std::string> g_modules;

// The checks run ops of their own (a copy to the host, a fill): those must
// not be checked in turn.
struct Pause {
  bool prev = g_enabled;
  Pause() { g_enabled = false; }
  ~Pause() { g_enabled = prev; }
};

// "NaN" / "inf" / "-inf" and where: the first non-finite element of t's
// local piece in row-major order (the slow path, run once before throwing).
std::string first_bad(const Tensor& t) {
  const Tensor& local = raw::local_of(t);
  std::vector<double> v = local.to(kCPU).to(DType::Float64).contiguous().to_vector<double>();
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::isfinite(v[i])) continue;
    // Row-major coordinates of element i.
    std::vector<int64_t> at(local.shape().size());
    int64_t rest = int64_t(i);
    for (int d = int(at.size()) - 1; d >= 0; --d) {
      const int64_t n = local.shape()[size_t(d)];
      at[size_t(d)] = n ? rest % n : 0;
      rest = n ? rest / n : 0;
    }
    return fmt::format(FMT_STRING("first {} at [{}]{}"), std::isnan(v[i]) ? "NaN" : (v[i] > 0 ? "inf" : "-inf"),
                       fmt::join(at, ", "), t.is_distributed() ? " of this rank's piece" : "");
  }
  return "no non-finite element on a second look";
}

std::string where() {
  std::string s = g_step >= 0 ? fmt::format(FMT_STRING("step {}"), g_step) : std::string("outside a training step");
  if (comm::has_world()) s += fmt::format(FMT_STRING(", rank {} of {}"), comm::world()->rank(), comm::world()->size());
  return s;
}

std::string in_module(const std::string& m) { return m.empty() ? "" : " in module '" + m + "'"; }

std::string describe(const Tensor& t, int64_t bad) {
  if (!t.defined()) return "undefined";
  std::string s = t.desc();
  if (bad > 0) s += fmt::format(FMT_STRING(" (already non-finite: {} of {} elements, {})"), bad, raw::local_of(t).numel(), first_bad(t));
  return s;
}

[[noreturn]] void fail(const std::string& message) { throw AnomalyError(message); }

}  // namespace

bool enabled() { return g_enabled; }

Guard::Guard(bool on) : prev_(g_enabled) { g_enabled = on; }
Guard::~Guard() { g_enabled = prev_; }

void set_step(int64_t step) { g_step = step; }
int64_t step() { return g_step; }

ModuleScope::ModuleScope(const std::string& path) { g_modules.push_back(path.empty() ? "<root>" : path); }
ModuleScope::~ModuleScope() { g_modules.pop_back(); }
std::string module_path() { return g_modules.empty() ? "" : g_modules.back(); }

int64_t count_nonfinite(const Tensor& t) {
  if (!t.defined() || !is_floating(t.dtype())) return 0;
  const Tensor& local = raw::local_of(t);
  if (local.numel() == 0 || local.device().is_meta()) return 0;
  Pause pause;
  NoGradGuard no_grad;
  if (local.device().type == DeviceType::CPU) {
    Tensor count = raw::empty({1}, DType::Int64, kCPU);
    *static_cast<int64_t*>(count.raw_data()) = 0;
    kernels::count_nonfinite(kCPU, local, count);
    return *static_cast<const int64_t*>(count.raw_data());
  }
  Tensor count = raw::empty({1}, DType::Int64, local.device());
  count.zero_();
  kernels::count_nonfinite(local.device(), local, count);
  return count.to(kCPU).item<int64_t>();
}

void check_forward(const char* op, const std::vector<const Tensor*>& inputs, const std::vector<const Tensor*>& outputs) {
  for (size_t k = 0; k < outputs.size(); ++k) {
    const int64_t bad = count_nonfinite(*outputs[k]);
    if (bad == 0) continue;
    Pause pause;
    std::vector<int64_t> bad_in(inputs.size());
    bool any_in = false;
    for (size_t i = 0; i < inputs.size(); ++i) any_in |= (bad_in[i] = count_nonfinite(*inputs[i])) > 0;
    std::ostringstream m;
    m << "anomaly detected at " << where() << in_module(module_path()) << ": op '" << op << "' returned a non-finite value in output " << k << ", "
      << outputs[k]->desc() << ": " << bad << " of " << raw::local_of(*outputs[k]).numel() << " elements, "
      << first_bad(*outputs[k]) << ".\n  inputs:";
    for (size_t i = 0; i < inputs.size(); ++i) m << "\n    #" << i << " " << describe(*inputs[i], bad_in[i]);
    if (inputs.empty()) m << " none";
    m << "\n  "
      << (any_in ? "a non-finite value came in through the inputs marked above; no op checked under anomaly detection "
                   "produced it: it comes from a parameter, a buffer, an optimizer update or the caller's data"
                 : "every input was finite: this op produced it");
    fail(m.str());
  }
}

void check_backward(const char* node, const std::string& module, const std::vector<Tensor>& grad_outputs,
                    const std::vector<Tensor>& grad_inputs) {
  for (size_t k = 0; k < grad_inputs.size(); ++k) {
    const int64_t bad = count_nonfinite(grad_inputs[k]);
    if (bad == 0) continue;
    Pause pause;
    std::vector<int64_t> bad_in(grad_outputs.size());
    bool any_in = false;
    for (size_t i = 0; i < grad_outputs.size(); ++i) any_in |= (bad_in[i] = count_nonfinite(grad_outputs[i])) > 0;
    std::ostringstream m;
    m << "anomaly detected at " << where() << ": the backward of op '" << node << "'" << in_module(module)
      << " returned a non-finite gradient for input " << k << ", " << grad_inputs[k].desc() << ": " << bad << " of "
      << raw::local_of(grad_inputs[k]).numel() << " elements, " << first_bad(grad_inputs[k])
      << ".\n  gradients of its outputs:";
    for (size_t i = 0; i < grad_outputs.size(); ++i) m << "\n    #" << i << " " << describe(grad_outputs[i], bad_in[i]);
    m << "\n  "
      << (any_in ? "a non-finite gradient came in (marked above): the caller's gradient to backward() or a hook"
                 : "every incoming gradient was finite: this backward produced it");
    fail(m.str());
  }
}

void check_update(const std::string& optimizer, const std::string& path, const Tensor& param,
                  const std::vector<std::pair<std::string, int64_t>>& nonfinite_before) {
  const int64_t bad = count_nonfinite(param);
  if (bad == 0) return;
  Pause pause;
  std::ostringstream m;
  m << "anomaly detected at " << where() << ": " << optimizer << ".step made parameter '" << path << "' ("
    << param.desc() << ") non-finite: " << bad << " of " << raw::local_of(param).numel() << " elements, "
    << first_bad(param) << ".\n  before the update:";
  bool any = false;
  for (const auto& [name, n] : nonfinite_before) {
    m << "\n    " << name << ": " << (n ? fmt::format(FMT_STRING("{} non-finite elements"), n) : std::string("finite"));
    any |= n > 0;
  }
  m << "\n  " << (any ? "the non-finite value came from the state or gradient marked above"
                      : "everything was finite: the update itself overflowed (learning rate, epsilon, weight decay?)");
  fail(m.str());
}

}  // namespace tessel::anomaly
