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

namespace {

void* system_alloc(size_t bytes) {
  // posix_memalign, not aligned_alloc: the system allocator asks for exact
  // sizes, and aligned_alloc requires a multiple of the alignment (ASan
  // reports any other size as an error).
  void* p = nullptr;
  if (posix_memalign(&p, 64, bytes) != 0 || !p) TESSEL_FAIL("cpu allocator", "out of memory allocating {} bytes", bytes);
  return p;
}

class PoolingCpuAllocator final : public Allocator {
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
    ++stats_.system_allocs;
    return system_alloc(cls);
  }

  void deallocate(void* p, size_t nbytes, Stream) override {
    if (!p) return;
    size_t cls = cpu_size_class(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.current_bytes -= cls;
    stats_.cached_bytes += cls;
    free_[cls].push_back(p);
  }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_bytes = stats_.current_bytes;
  }
  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [cls, list] : free_) {
      for (void* p : list) {
        std::free(p);
        ++stats_.system_frees;
      }
      stats_.cached_bytes -= int64_t(cls * list.size());
      list.clear();
    }
  }
  Device device() const override { return kCPU; }

 private:
  mutable std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  AllocatorStats stats_;
};

// TESSEL_CPU_ALLOCATOR=system: no pooling (for sanitizers and leak checks).
// Every block is exactly the size asked for, not its size class: ASan then
// sees a kernel that reads or writes past a tensor's end.
class SystemCpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes, Stream) override {
    if (nbytes == 0) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.requests;
    ++stats_.system_allocs;
    stats_.current_bytes += int64_t(nbytes);
    if (stats_.current_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.current_bytes;
    return system_alloc(nbytes);
  }
  void deallocate(void* p, size_t nbytes, Stream) override {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.system_frees;
    stats_.current_bytes -= int64_t(nbytes);
    std::free(p);
  }
  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_bytes = stats_.current_bytes;
  }
  void empty_cache() override {}
  Device device() const override { return kCPU; }

 private:
  mutable std::mutex mu_;
  AllocatorStats stats_;
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
