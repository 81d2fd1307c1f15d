#include "autograd/trace.h"

#include <cstring>
#include <fmt/format.h>

#include "autograd/grad_mode.h"
#include "dtensor/ops.h"

namespace tessel::trace {
namespace {

thread_local Recorder* g_recorder = nullptr;
thread_local bool g_busy = false;  // the full-tensor gathers run ops too: not traced

bool plumbing(const char* op) {
  for (const char* p : {"redistribute", "to_local", "from_local", "distribute_tensor", "AccumulateGrad"})
    if (std::strcmp(op, p) == 0) return true;
  return false;
}

uint64_t fnv(uint64_t h, const void* data, size_t n) {
  const auto* b = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
  return h;
}

void emit(const char* phase, const char* op, int index, const Tensor& t) {
  if (!t.defined() || plumbing(op)) return;
  g_busy = true;
  try {
    NoGradGuard ng;
    const Tensor full = t.is_distributed() ? full_tensor(t) : t;
    g_recorder->record(phase, op, index, full, tensor_hash(full));
  } catch (...) {
    g_busy = false;
    throw;
  }
  g_busy = false;
}

}  // namespace

Recorder* current() { return g_busy ? nullptr : g_recorder; }

Scope::Scope(Recorder* r) : prev_(g_recorder) { g_recorder = r; }
Scope::~Scope() { g_recorder = prev_; }

void forward_output(const char* op, int index, const Tensor& t) {
  if (current()) emit("fwd", op, index, t);
}

void backward_grads(const char* node, const std::vector<Tensor>& grads) {
  if (!current()) return;
  for (size_t i = 0; i < grads.size(); ++i) emit("bwd", node, int(i), grads[i]);
}

uint64_t tensor_hash(const Tensor& t) {
  NoGradGuard ng;
  const Tensor full = t.is_distributed() ? full_tensor(t) : t;
  const Tensor c = full.device() == kCPU ? full.contiguous() : full.to(kCPU).contiguous();
  uint64_t h = 1469598103934665603ull;
  const int dt = int(c.dtype());
  h = fnv(h, &dt, sizeof dt);
  return fnv(h, c.raw_data(), c.nbytes());  // not the shape: a reshaped value keeps its hash
}

std::string hex(uint64_t h) { return fmt::format(FMT_STRING("{:016x}"), h); }

}  // namespace tessel::trace
