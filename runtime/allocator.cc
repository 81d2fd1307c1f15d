#include "runtime/allocator.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "runtime/error.h"

namespace tessel {

size_t cpu_size_class(size_t n) {
  if (n <= 4096) return (n + 63) & ~size_t(63);
  // Eight classes per power of two: at most 12.5% waste.
  size_t p = size_t(1) << (63 - __builtin_clzll(n - 1));  // largest power of two < n
  size_t step = p / 8;
  return (n + step - 1) / step * step;
}

size_t cpu_size_class_at_most(size_t n) {
  TESSEL_CHECK(n >= 64, "cpu_size_class_at_most", "no size class is at most {} bytes (the smallest is 64)", n);
  if (n <= 4096) return n & ~size_t(63);
  // The classes in [P, 2P), for P the largest power of two <= n: P + k P/8.
  const size_t p = size_t(1) << (63 - __builtin_clzll(n));
  const size_t step = p / 8;
  return p + (n - p) / step * step;
}

int64_t parse_bytes(const std::string& text, const char* what) {
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string suffix = text.substr(used);
  double scale = 1;
  if (suffix.size() == 1 || (suffix.size() == 2 && (suffix[1] == 'B' || suffix[1] == 'b'))) {
    switch (suffix[0]) {
      case 'K': case 'k': scale = double(int64_t(1) << 10); suffix.clear(); break;
      case 'M': case 'm': scale = double(int64_t(1) << 20); suffix.clear(); break;
      case 'G': case 'g': scale = double(int64_t(1) << 30); suffix.clear(); break;
      case 'T': case 't': scale = double(int64_t(1) << 40); suffix.clear(); break;
      default: break;
    }
  }
  TESSEL_CHECK(used > 0 && suffix.empty() && v >= 0 && v * scale < 9.2e18, what,
               "expected a byte count such as 1073741824, 512M or 2G, got '{}'", text);
  return int64_t(v * scale);
}

namespace {

// nullptr when the system has no memory left (the caller throws OutOfMemoryError
// with its stats). posix_memalign, not aligned_alloc: the system allocator asks
// for exact sizes, and aligned_alloc requires a multiple of the alignment (ASan
// reports any other size as an error).
void* system_alloc(size_t bytes) {
  void* p = nullptr;
  return posix_memalign(&p, 64, bytes) == 0 ? p : nullptr;
}

int64_t initial_cpu_limit() {
  const char* env = std::getenv("TESSEL_CPU_MEMORY_LIMIT");
  return env && *env ? parse_bytes(env, "TESSEL_CPU_MEMORY_LIMIT") : 0;
}

[[noreturn]] void cpu_oom(const AllocatorStats& st, int64_t requested, int64_t limit, bool over_limit) {
  OutOfMemoryError::Info info;
  info.device = "cpu";
  info.requested = requested;
  info.in_use = st.current_bytes;
  info.peak = st.peak_bytes;
  info.cached = st.cached_bytes;
  info.limit = limit;
  info.detail = over_limit ? "the CPU allocator's limit: TESSEL_CPU_MEMORY_LIMIT or Allocator::set_limit"
                           : "the system refused the allocation";
  throw OutOfMemoryError(std::move(info));
}

// What both CPU allocators share: their counters and limit under one mutex.
class CpuAllocatorBase : public Allocator {
 public:
  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_bytes = stats_.current_bytes;
  }
  Device device() const override { return kCPU; }
  void set_limit(int64_t bytes) override {
    TESSEL_CHECK(bytes >= 0, "Allocator::set_limit", "the limit must be >= 0 bytes (0: none), got {}", bytes);
    std::lock_guard<std::mutex> lock(mu_);
    limit_ = bytes;
  }
  int64_t limit() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return limit_;
  }

 protected:
  mutable std::mutex mu_;
  AllocatorStats stats_;
  int64_t limit_ = initial_cpu_limit();
};

class PoolingCpuAllocator final : public CpuAllocatorBase {
 public:
  void* allocate(size_t nbytes, Stream) override {
    if (nbytes == 0) return nullptr;
    size_t cls = cpu_size_class(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.requests;
    stats_.current_bytes += cls;
    if (stats_.current_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.current_bytes;
    auto it = free_.find(cls);
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      stats_.cached_bytes -= cls;
      return p;
    }
    if (limit_ > 0 && stats_.current_bytes + stats_.cached_bytes > limit_) {
      release_cache_locked();  // a full cache must not be what refuses a request
      if (stats_.current_bytes > limit_) {
        stats_.current_bytes -= cls;
        cpu_oom(stats_, int64_t(nbytes), limit_, true);
      }
    }
    void* p = system_alloc(cls);
    if (!p) {
      release_cache_locked();
      p = system_alloc(cls);
    }
    if (!p) {
      stats_.current_bytes -= cls;
      cpu_oom(stats_, int64_t(nbytes), limit_, false);
    }
    ++stats_.system_allocs;
    return p;
  }

  void deallocate(void* p, size_t nbytes, Stream) override {
    if (!p) return;
    size_t cls = cpu_size_class(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.current_bytes -= cls;
    stats_.cached_bytes += cls;
    free_[cls].push_back(p);
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    release_cache_locked();
  }

 private:
  void release_cache_locked() {
    for (auto& [cls, list] : free_) {
      for (void* p : list) {
        std::free(p);
        ++stats_.system_frees;
      }
      stats_.cached_bytes -= int64_t(cls * list.size());
      list.clear();
    }
  }

  std::unordered_map<size_t, std::vector<void*>> free_;
};

// TESSEL_CPU_ALLOCATOR=system: no pooling (for sanitizers and leak checks).
// Every block is exactly the size asked for, not its size class: ASan then
// sees a kernel that reads or writes past a tensor's end.
class SystemCpuAllocator final : public CpuAllocatorBase {
 public:
  void* allocate(size_t nbytes, Stream) override {
    if (nbytes == 0) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.requests;
    if (limit_ > 0 && stats_.current_bytes + int64_t(nbytes) > limit_) cpu_oom(stats_, int64_t(nbytes), limit_, true);
    void* p = system_alloc(nbytes);  // exact: ASan sees an overrun
    if (!p) cpu_oom(stats_, int64_t(nbytes), limit_, false);
    ++stats_.system_allocs;
    stats_.current_bytes += int64_t(nbytes);
    if (stats_.current_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.current_bytes;
    return p;
  }
  void deallocate(void* p, size_t nbytes, Stream) override {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.system_frees;
    stats_.current_bytes -= int64_t(nbytes);
    std::free(p);
  }
  void empty_cache() override {}
};

Allocator* g_allocators[kNumDeviceTypes] = {};

}  // namespace

bool cpu_allocator_pools() {
  static const bool pools = [] {
    const char* env = std::getenv("TESSEL_CPU_ALLOCATOR");
    return !(env && std::strcmp(env, "system") == 0);
  }();
  return pools;
}

Allocator* cpu_allocator() {
  static Allocator* a = cpu_allocator_pools() ? static_cast<Allocator*>(new PoolingCpuAllocator())
                                              : static_cast<Allocator*>(new SystemCpuAllocator());
  return a;
}

void register_allocator(DeviceType type, Allocator* a) { g_allocators[static_cast<int>(type)] = a; }

Allocator* allocator_for(Device d) {
  if (d.type == DeviceType::CPU) return cpu_allocator();
  Allocator* a = g_allocators[static_cast<int>(d.type)];
  if (!a) {
    TESSEL_FAIL("allocate", "no allocator for device {} (this build {} CUDA support)", d.str(),
#ifdef TESSEL_WITH_CUDA
                "has"
#else
                "has no"
#endif
    );
  }
  return a;
}

}  // namespace tessel
