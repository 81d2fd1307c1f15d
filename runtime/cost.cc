#include "runtime/cost.h"

namespace tessel::cost {
namespace {

thread_local CountScope* t_scope = nullptr;
thread_local std::shared_ptr<MetaMemory> t_meta;

}  // namespace

int64_t Counts::total_comm_bytes() const {
  int64_t s = 0;
  for (const auto& [k, v] : comm_bytes) s += v;
  return s;
}

Counts difference(const Counts& a, const Counts& b) {
  Counts d = a;
  d.gemm_flops -= b.gemm_flops;
  d.attention_flops -= b.attention_flops;
  d.ops -= b.ops;
  d.op_bytes -= b.op_bytes;
  for (const auto& [k, v] : b.comm_bytes) d.comm_bytes[k] -= v;
  for (const auto& [k, v] : b.comm_calls) d.comm_calls[k] -= v;
  for (const auto& [k, v] : b.replicated_fallbacks) d.replicated_fallbacks[k] -= v;
  for (auto it = d.comm_bytes.begin(); it != d.comm_bytes.end();) it = it->second == 0 ? d.comm_bytes.erase(it) : ++it;
  for (auto it = d.comm_calls.begin(); it != d.comm_calls.end();) it = it->second == 0 ? d.comm_calls.erase(it) : ++it;
  for (auto it = d.replicated_fallbacks.begin(); it != d.replicated_fallbacks.end();)
    it = it->second == 0 ? d.replicated_fallbacks.erase(it) : ++it;
  return d;
}

void MetaMemory::add(int64_t bytes) {
  const int64_t now = live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t p = peak.load(std::memory_order_relaxed);
  while (now > p && !peak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
  }
}

CountScope::CountScope() : meta_(std::make_shared<MetaMemory>()), prev_(t_scope), prev_meta_(t_meta) {
  t_scope = this;
  t_meta = meta_;
}

CountScope::~CountScope() {
  t_scope = prev_;
  t_meta = prev_meta_;
}

Pause::Pause() : scope_(t_scope), meta_(std::move(t_meta)) {
  t_scope = nullptr;
  t_meta = nullptr;
}

Pause::~Pause() {
  t_scope = scope_;
  t_meta = std::move(meta_);
}

Counts* active() { return t_scope ? const_cast<Counts*>(&t_scope->counts()) : nullptr; }

const std::shared_ptr<MetaMemory>& active_meta_memory() { return t_meta; }

void add_gemm(int64_t batch, int64_t m, int64_t n, int64_t k) {
  if (Counts* c = active()) c->gemm_flops += 2 * batch * m * n * k;
}

void add_attention(int64_t flops) {
  if (Counts* c = active()) c->attention_flops += flops;
}

void add_op(int64_t output_bytes) {
  if (Counts* c = active()) {
    c->ops += 1;
    c->op_bytes += output_bytes;
  }
}

void add_comm(const char* collective, int64_t bytes) {
  if (Counts* c = active()) {
    c->comm_bytes[collective] += bytes;
    c->comm_calls[collective] += 1;
  }
}

void add_replicated_fallback(const char* op) {
  if (Counts* c = active()) c->replicated_fallbacks[op] += 1;
}

}  // namespace tessel::cost
