#include "runtime/caching_allocator.h"

#include <algorithm>

#include "runtime/error.h"

namespace tessel {

size_t device_size_class(size_t n) {
  if (n == 0) return 0;
  if (n <= 4096) return (n + 511) & ~size_t(511);
  // Eight classes per power of two (steps of at least 512 bytes above 4 KiB).
  size_t p = size_t(1) << (63 - __builtin_clzll(n - 1));  // largest power of two < n
  size_t step = p / 8;
  return (n + step - 1) / step * step;
}

CachingAllocator::CachingAllocator(DeviceMemoryBackend* backend, DeviceType type) : backend_(backend), type_(type) {}

namespace {
thread_local void* t_pool = nullptr;  // PoolScope
}

CachingAllocator::PoolScope::PoolScope(void* pool) : prev_(t_pool) { t_pool = pool; }
CachingAllocator::PoolScope::~PoolScope() { t_pool = prev_; }

AllocatorStats& CachingAllocator::dev(int device) {
  if (size_t(device) >= per_device_.size()) per_device_.resize(size_t(device) + 1);
  return per_device_[size_t(device)];
}

void* CachingAllocator::allocate(size_t nbytes, Stream stream) {
  if (nbytes == 0) return nullptr;
  const int device = stream.device.type == type_ ? stream.device.index : 0;
  const size_t cls = device_size_class(nbytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* s = nullptr;
  Pool* pool = nullptr;
  if (t_pool) {  // (a graph's capture: the pool's handle stands for the stream)
    auto pit = pools_.find(t_pool);
    TESSEL_CHECK(pit != pools_.end(), "allocate", "the {} pool {} in scope was destroyed", device_type_name(type_),
                 t_pool);
    pool = &pit->second;
    TESSEL_CHECK(pool->device == device, "allocate",
                 "a {} allocation on device {} inside a scope of a private pool of device {}", device_type_name(type_),
                 device, pool->device);
    s = t_pool;
  } else {
    s = stream.handle ? stream.handle : backend_->current_stream(device);
  }
  AllocatorStats& st = dev(device);
  ++st.requests;
  if (!pending_.empty()) process_pending_locked();
  auto it = free_.find(Key{device, s, cls});
  void* p = nullptr;
  if (it != free_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    st.cached_bytes -= int64_t(cls);
  } else {
    const bool over_limit = limit_ > 0 && st.current_bytes + st.cached_bytes + int64_t(cls) > limit_;
    if (over_limit) release_cached_locked(device);  // a full cache must not be what refuses a request (pools kept)
    if (!(limit_ > 0 && st.current_bytes + int64_t(cls) > limit_)) {
      p = backend_->raw_alloc(device, cls);
      if (!p) {
        // Give the cache back to the device and try once more.
        release_cached_locked(device);
        p = backend_->raw_alloc(device, cls);
      }
    }
    if (!p) {
      size_t free_b = 0, total_b = 0;
      backend_->mem_info(device, &free_b, &total_b);
      OutOfMemoryError::Info info;
      info.device = TESSEL_FORMAT("{}:{}", device_type_name(type_), device);
      info.requested = int64_t(nbytes);
      info.in_use = st.current_bytes;
      info.peak = st.peak_bytes;
      info.cached = st.cached_bytes;
      info.limit = limit_;
      info.detail = limit_ > 0 && st.current_bytes + int64_t(cls) > limit_
                        ? std::string("the allocator's limit, Allocator::set_limit")
                        : TESSEL_FORMAT("the device reports {} bytes free of {}; size class {}", free_b, total_b, cls);
      throw OutOfMemoryError(std::move(info));
    }
    ++st.system_allocs;
    if (pool) pool->bytes += cls;
  }
  st.current_bytes += int64_t(cls);
  st.peak_bytes = std::max(st.peak_bytes, st.current_bytes);
  live_[p] = Block{device, s, cls, {}};
  return p;
}

void CachingAllocator::deallocate(void* p, size_t, Stream) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  TESSEL_CHECK(it != live_.end(), "deallocate", "{} pointer {} was not allocated by this allocator (or freed twice)",
               device_type_name(type_), p);
  Block b = std::move(it->second);
  live_.erase(it);
  AllocatorStats& st = dev(b.device);
  st.current_bytes -= int64_t(b.size);
  st.cached_bytes += int64_t(b.size);
  if (b.other_streams.empty()) {
    free_[Key{b.device, b.stream, b.size}].push_back(p);
    return;
  }
  Pending pend{p, std::move(b), {}};
  for (void* s : pend.block.other_streams) pend.events.push_back(backend_->record_event(pend.block.device, s));
  pending_.push_back(std::move(pend));
}

void CachingAllocator::process_pending_locked() {
  size_t kept = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    Pending& pd = pending_[i];
    bool done = true;
    for (void* e : pd.events) done = done && backend_->event_done(e);
    if (done) {
      for (void* e : pd.events) backend_->destroy_event(e);
      free_[Key{pd.block.device, pd.block.stream, pd.block.size}].push_back(pd.ptr);
    } else {
      if (kept != i) pending_[kept] = std::move(pd);
      ++kept;
    }
  }
  pending_.resize(kept);
}

void CachingAllocator::release_cached_locked(int device) {
  // Blocks in the free lists may still be read or written by work queued on
  // their stream: wait for the device before handing them back.
  std::vector<int> devices;
  for (const auto& [key, list] : free_)
    if (!list.empty() && (device < 0 || key.device == device)) devices.push_back(key.device);
  for (const Pending& pd : pending_)
    if (device < 0 || pd.block.device == device) devices.push_back(pd.block.device);
  std::sort(devices.begin(), devices.end());
  devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
  for (int d : devices) backend_->synchronize(d);
  process_pending_locked();
  for (auto& [key, list] : free_) {
    if (device >= 0 && key.device != device) continue;
    if (pools_.count(key.stream)) continue;  // a graph may write them at its next launch
    AllocatorStats& st = dev(key.device);
    for (void* p : list) {
      backend_->raw_free(key.device, p);
      ++st.system_frees;
      st.cached_bytes -= int64_t(key.size);
    }
    list.clear();
  }
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached_locked(-1);
}

void CachingAllocator::record_stream(void* p, void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  TESSEL_CHECK(it != live_.end(), "record_stream", "{} pointer {} is not the start of a live block",
               device_type_name(type_), p);
  Block& b = it->second;
  if (stream == b.stream) return;
  if (std::find(b.other_streams.begin(), b.other_streams.end(), stream) == b.other_streams.end())
    b.other_streams.push_back(stream);
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  AllocatorStats total;
  for (const AllocatorStats& s : per_device_) {
    total.requests += s.requests;
    total.system_allocs += s.system_allocs;
    total.system_frees += s.system_frees;
    total.current_bytes += s.current_bytes;
    total.peak_bytes += s.peak_bytes;
    total.cached_bytes += s.cached_bytes;
  }
  return total;
}

AllocatorStats CachingAllocator::device_stats(int device) const {
  std::lock_guard<std::mutex> lock(mu_);
  return size_t(device) < per_device_.size() ? per_device_[size_t(device)] : AllocatorStats{};
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  for (AllocatorStats& s : per_device_) s.peak_bytes = s.current_bytes;
}

void* CachingAllocator::create_pool(int device, void* home_stream) {
  std::lock_guard<std::mutex> lock(mu_);
  // The handle: an address no stream or other pool has (a heap cell, kept
  // until the pool is destroyed).
  void* handle = new char;
  pools_[handle] = Pool{device, home_stream, 0};
  return handle;
}

void CachingAllocator::destroy_pool(void* pool) {
  std::lock_guard<std::mutex> lock(mu_);
  auto pit = pools_.find(pool);
  TESSEL_CHECK(pit != pools_.end(), "destroy_pool", "{} pool {} does not exist (destroyed twice?)",
               device_type_name(type_), pool);
  TESSEL_CHECK(t_pool != pool, "destroy_pool", "{} pool {} is destroyed inside its own PoolScope",
               device_type_name(type_), pool);
  const Pool p = pit->second;
  // Its free blocks join the home stream's lists; blocks still in use
  // return there when freed.
  std::vector<std::pair<Key, std::vector<void*>>> moved;  // (not inserted while free_ is walked)
  for (auto it = free_.begin(); it != free_.end();) {
    if (it->first.stream != pool) {
      ++it;
      continue;
    }
    moved.emplace_back(Key{it->first.device, p.home_stream, it->first.size}, std::move(it->second));
    it = free_.erase(it);
  }
  for (auto& [key, list] : moved) {
    std::vector<void*>& home = free_[key];
    home.insert(home.end(), list.begin(), list.end());
  }
  for (auto& [ptr, b] : live_)
    if (b.stream == pool) b.stream = p.home_stream;
  for (Pending& pd : pending_)
    if (pd.block.stream == pool) pd.block.stream = p.home_stream;
  pools_.erase(pit);
  delete static_cast<char*>(pool);
}

size_t CachingAllocator::pool_bytes(void* pool) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto pit = pools_.find(pool);
  return pit == pools_.end() ? 0 : pit->second.bytes;
}

size_t CachingAllocator::pending_frees() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.size();
}

void CachingAllocator::set_limit(int64_t bytes) {
  TESSEL_CHECK(bytes >= 0, "Allocator::set_limit", "the limit must be >= 0 bytes (0: none), got {}", bytes);
  std::lock_guard<std::mutex> lock(mu_);
  limit_ = bytes;
}

int64_t CachingAllocator::limit() const {
  std::lock_guard<std::mutex> lock(mu_);
  return limit_;
}

}  // namespace tessel
