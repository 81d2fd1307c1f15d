#pragma once
// A caching, stream-aware allocator for device memory (docs/cuda.md).
//
// Why: cudaMalloc/cudaFree synchronise the device and cost tens of
// microseconds; a training step allocates and frees hundreds of activations.
// Freed blocks are kept in free lists and handed out again, so the steady
// state of a training loop makes no device allocation at all.
//
// Rules:
//   * Size classes: requests are rounded up to a class (device_size_class:
//     multiples of 512 bytes up to 4 KiB, then eight classes per power of
//     two, at most 12.5% waste). A block is only reused for its own class.
//   * Stream-aware reuse: a block belongs to the stream it was allocated on
//     (the calling thread's current stream unless one is given). A freed
//     block goes back to that stream's free list and is reused only by
//     allocations on the same stream: work queued on one stream runs in
//     order, so the next user of the block runs after the last one, without
//     any synchronisation.
//   * A block used on other streams as well (record_stream) is not reusable
//     when freed: an event is recorded on each of those streams and the block
//     returns to its free list once every event has completed.
//   * Out of memory: the cached blocks of the device are returned to the
//     device (after a device synchronisation) and the allocation is retried
//     once; if it still fails the error names the request, the device and the
//     allocator's statistics.
//   * Statistics: requests, device allocations and frees, current (class
//     rounded) bytes in use, peak, and cached bytes, per device and in total.
//
// The device is reached through DeviceMemoryBackend, so the bookkeeping is
// plain C++ that tests run on the host with a mock (test_caching_allocator);
// kernels/cuda/device.cc provides the CUDA backend.
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "runtime/allocator.h"

namespace tessel {

class DeviceMemoryBackend {
 public:
  virtual ~DeviceMemoryBackend() = default;
  // `bytes` of device memory, or nullptr when the device is out of memory
  // (other failures may throw).
  virtual void* raw_alloc(int device, size_t bytes) = 0;
  virtual void raw_free(int device, void* p) = 0;
  // Waits until all work queued on the device has finished.
  virtual void synchronize(int device) = 0;
  // The calling thread's current stream on `device` (an opaque handle).
  virtual void* current_stream(int device) = 0;
  // An event recorded on `stream` now: done once the work queued on the
  // stream before it has finished.
  virtual void* record_event(int device, void* stream) = 0;
  virtual bool event_done(void* event) = 0;
  virtual void destroy_event(void* event) = 0;
  // Free and total bytes of the device, for error messages (0 if unknown).
  virtual void mem_info(int device, size_t* free_bytes, size_t* total_bytes) {
    *free_bytes = 0;
    *total_bytes = 0;
  }
};

// The size class a device request of n bytes is served from (0 for 0).
size_t device_size_class(size_t n);

class CachingAllocator final : public Allocator {
 public:
  // `type` is the device type the allocator serves (a Stream whose device
  // has this type selects the device index; any other means device 0).
  CachingAllocator(DeviceMemoryBackend* backend, DeviceType type);

  // Stream{device, handle}: handle null means the thread's current stream.
  void* allocate(size_t nbytes, Stream stream = {}) override;
  // `p` must come from allocate(); the stream argument is ignored (a block
  // returns to the stream it was allocated on).
  void deallocate(void* p, size_t nbytes, Stream stream = {}) override;
  AllocatorStats stats() const override;  // summed over devices (peak: the sum of per-device peaks)
  void reset_peak() override;
  // Synchronises the devices that hold cached blocks and frees those blocks.
  void empty_cache() override;
  Device device() const override { return Device(type_, 0); }
  // Per device: the bytes held on each device (tensors' and cached) stay within it.
  void set_limit(int64_t bytes) override;
  int64_t limit() const override;

  // Marks the block holding `p` (a pointer allocate() returned) as used on
  // `stream` too: when freed, it waits for that stream's queued work.
  void record_stream(void* p, void* stream);
  AllocatorStats device_stats(int device) const;
  // Blocks freed while still awaiting events on other streams.
  size_t pending_frees() const;

  // ---- private pools (CUDA graphs: runtime/capture.h, "graphs") ----
  // A graph captured from a stream bakes in the address of every block its
  // kernels use, workspaces allocated and freed inside a launch included,
  // and writes them whenever it is launched. So while a PoolScope is active
  // on a thread, that thread's allocations come from a private pool: its
  // freed blocks go back to the pool alone, are reused only by allocations
  // under the same pool (the pool's graphs run in one stream order), and are
  // never given back to the device by empty_cache or an out-of-memory retry.
  // destroy_pool -- once the graphs are destroyed and the device has
  // finished them -- turns the pool's blocks into ordinary blocks of
  // `home_stream`, the stream the graphs were launched on.
  // Returns the pool's handle.
  void* create_pool(int device, void* home_stream);
  void destroy_pool(void* pool);
  // Allocations of this thread come from `pool` for the scope's lifetime.
  class PoolScope {
   public:
    explicit PoolScope(void* pool);
    ~PoolScope();
    PoolScope(const PoolScope&) = delete;
    PoolScope& operator=(const PoolScope&) = delete;

   private:
    void* prev_;
  };
  // Bytes in the pool's blocks (in use and free).
  size_t pool_bytes(void* pool) const;

 private:
  struct Block {
    int device = 0;
    void* stream = nullptr;
    size_t size = 0;                  // the size class
    std::vector<void*> other_streams;  // record_stream
  };
  struct Key {
    int device;
    void* stream;
    size_t size;
    bool operator==(const Key& o) const { return device == o.device && stream == o.stream && size == o.size; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      size_t h = std::hash<void*>()(k.stream);
      h ^= std::hash<size_t>()(k.size) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
      return h ^ (size_t(k.device) * 0x100000001b3ull);
    }
  };
  struct Pending {
    void* ptr;
    Block block;
    std::vector<void*> events;
  };
  // A private pool: its blocks carry the pool's handle as their stream, so
  // the free lists keep them apart.
  struct Pool {
    int device = 0;
    void* home_stream = nullptr;
    size_t bytes = 0;
  };

  AllocatorStats& dev(int device);
  void process_pending_locked();
  void release_cached_locked(int device);  // device < 0: all devices

  DeviceMemoryBackend* backend_;
  DeviceType type_;
  mutable std::mutex mu_;
  std::unordered_map<void*, Block> live_;
  std::unordered_map<Key, std::vector<void*>, KeyHash> free_;
  std::vector<Pending> pending_;
  std::unordered_map<void*, Pool> pools_;  // by handle
  std::vector<AllocatorStats> per_device_;
  int64_t limit_ = 0;  // set_limit (0: none)
};

}  // namespace tessel
