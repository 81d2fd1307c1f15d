#pragma once
// Device memory allocators. The CPU allocator pools freed blocks by size
// class, so the steady state of a training loop makes no system calls: every
// buffer a step needs was freed by the previous step and is reused.
#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/device.h"

namespace tessel {

struct AllocatorStats {
  int64_t requests = 0;       // allocate() calls
  int64_t system_allocs = 0;  // calls that reached the system allocator
  int64_t system_frees = 0;
  int64_t current_bytes = 0;  // bytes handed out and not yet returned (size-class rounded when pooling)
  int64_t peak_bytes = 0;
  int64_t cached_bytes = 0;   // bytes held in free lists
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns memory for at least `nbytes` bytes, 64-byte aligned. nbytes == 0
  // returns nullptr. Throws tessel::Error when memory is exhausted.
  virtual void* allocate(size_t nbytes, Stream stream = {}) = 0;
  // Returns a block; `nbytes` must be what was passed to allocate().
  virtual void deallocate(void* p, size_t nbytes, Stream stream = {}) = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak() = 0;
  virtual void empty_cache() = 0;  // give cached blocks back to the system
  virtual Device device() const = 0;
  // A cap on the bytes this allocator holds (tensors' and cached; 0: none).
  // A request beyond it first gives the cache back, then throws
  // OutOfMemoryError, as a full device would. The CPU's starts from
  // TESSEL_CPU_MEMORY_LIMIT (bytes, or with a K/M/G suffix: "512M").
  virtual void set_limit(int64_t bytes) = 0;
  virtual int64_t limit() const = 0;
};

// The process-wide CPU allocator (pooling unless TESSEL_CPU_ALLOCATOR=system).
Allocator* cpu_allocator();
// False under TESSEL_CPU_ALLOCATOR=system: every request then reaches the
// system allocator with its exact size (no size classes, nothing cached).
bool cpu_allocator_pools();
// The allocator for a device; CUDA registers its caching allocator at load time.
Allocator* allocator_for(Device d);
void register_allocator(DeviceType type, Allocator* a);

// "512M" -> 536870912 (suffixes K, M, G, T, powers of 1024; none: bytes);
// throws naming `what` on anything else.
int64_t parse_bytes(const std::string& text, const char* what);

// The size class a request of n bytes is served from (exposed for tests).
size_t cpu_size_class(size_t n);
// The largest size class <= n (n >= 64): a block of that many bytes is
// served with nothing rounded on (compile mode cuts its arena into such
// blocks).
size_t cpu_size_class_at_most(size_t n);

}  // namespace tessel
