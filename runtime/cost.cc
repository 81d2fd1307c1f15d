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

void add_comm(const char* collective, int64_t bytes) {
  if (Counts* c = active()) {
    c->comm_bytes[collective] += bytes;
    c->comm_calls[collective] += 1;
  }
}

}  // namespace tessel::cost
