#include "nn/kv_cache.h"

#include "autograd/api.h"
#include "nn/module.h"
#include "runtime/error.h"

namespace tessel::nn {

namespace {
thread_local KVCache* tls_cache = nullptr;
constexpr const char* kOp = "KVCache";
}  // namespace

KVCache::KVCache(int64_t capacity) : capacity_(capacity) {
  TESSEL_CHECK(capacity > 0, kOp, "capacity must be positive (prompt + new tokens), got {}", capacity);
}

void KVCache::advance(int64_t n) {
  TESSEL_CHECK(n > 0, kOp, "advance({}): n must be positive", n);
  TESSEL_CHECK(position_ + n <= capacity_, kOp, "advance({}) at position {} exceeds the capacity {}", n, position_,
               capacity_);
  for (const auto& [layer, e] : entries_) {
    TESSEL_CHECK(e.length == position_ + n, kOp,
                 "advance({}) at position {}: layer '{}' holds {} positions, not {} (it did not run in the last "
                 "forward, or ran more than once)",
                 n, position_, layer, e.length, position_ + n);
  }
  position_ += n;
}

void KVCache::reset() {
  position_ = 0;
  entries_.clear();
}

KVCache::Entry& KVCache::entry(const std::string& layer) { return entries_[layer]; }

std::pair<Tensor, Tensor> KVCache::append(const std::string& layer, const Tensor& k, const Tensor& v) {
  TESSEL_CHECK(k.dim() == 4 && v.dim() == 4 && k.shape() == v.shape(), kOp,
               "layer '{}': keys and values must be [B, Hkv, T, D] of one shape, got k {} and v {}", layer, k.desc(),
               v.desc());
  Entry& e = entries_[layer];
  const int64_t T = k.size(2);
  TESSEL_CHECK(e.length == position_, kOp,
               "layer '{}' appended twice at position {} (it holds {} positions): call advance() after each forward",
               layer, position_, e.length);
  TESSEL_CHECK(position_ + T <= capacity_, kOp, "layer '{}': positions {}..{} exceed the capacity {}", layer,
               position_, position_ + T - 1, capacity_);
  NoGradGuard no_grad;
  if (e.k.defined()) {
    TESSEL_CHECK(e.k.size(0) == k.size(0) && e.k.size(1) == k.size(1) && e.k.size(3) == k.size(3) &&
                     e.k.dtype() == k.dtype() && e.k.device() == k.device(),
                 kOp,
                 "layer '{}': new keys {} do not match the cached ones {} (batch, heads, head_dim, dtype and device "
                 "are fixed by the first forward; reset() for another batch)",
                 layer, k.desc(), e.k.desc());
  }
  if (!k.is_distributed()) {
    if (!e.k.defined()) {
      const Dims shape{k.size(0), k.size(1), capacity_, k.size(3)};
      e.k = empty(shape, TensorOptions(k.dtype()).with_device(k.device()));
      e.v = empty(shape, TensorOptions(v.dtype()).with_device(v.device()));
    }
    e.k.narrow(2, position_, T).copy_(k);
    e.v.narrow(2, position_, T).copy_(v);
    e.length = position_ + T;
    return {e.k.narrow(2, 0, e.length), e.v.narrow(2, 0, e.length)};
  }
  // Distributed (heads sharded over tp): grow by concatenation, which keeps
  // the placements.
  if (e.k.defined()) {
    e.k = cat({e.k, k}, 2);
    e.v = cat({e.v, v}, 2);
  } else {
    e.k = k.contiguous();
    e.v = v.contiguous();
  }
  e.length = position_ + T;
  return {e.k, e.v};
}

KVCacheScope::KVCacheScope(KVCache& cache) : prev_(tls_cache) { tls_cache = &cache; }
KVCacheScope::~KVCacheScope() { tls_cache = prev_; }

KVCache* current_kv_cache() { return tls_cache; }

Tensor head_positions(const Module& module, const Tensor& h) {
  const KVCache* cache = module.is_training() ? nullptr : tls_cache;
  if (!cache || !cache->head_last_position || h.dim() != 3 || h.size(1) <= 1) return h;
  return h.narrow(1, h.size(1) - 1, 1);
}

}  // namespace tessel::nn
