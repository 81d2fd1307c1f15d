#pragma once
// A block of device memory shared by a tensor and all its views. The version
// counter lives here because views share it: an in-place write through any
// view invalidates tensors autograd saved from any other view.
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>

#include "runtime/allocator.h"
#include "runtime/device.h"

namespace tessel {

namespace cost {
struct MetaMemory;
}

// Owned by shared_ptr (make_shared) everywhere: compile mode's recorder
// holds a storage that FSDP releases and refills in place (weak_from_this).
class StorageImpl : public std::enable_shared_from_this<StorageImpl> {
 public:
  // Owns nbytes from the device's allocator (Meta: no memory).
  StorageImpl(size_t nbytes, Device device);
  // Wraps memory owned elsewhere; `deleter` (may be empty) runs on destruction.
  StorageImpl(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter);
  ~StorageImpl();
  StorageImpl(const StorageImpl&) = delete;
  StorageImpl& operator=(const StorageImpl&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  uint32_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }

  // Gives the memory back to the allocator but keeps this object, its size
  // and its version counter, so tensors aliasing it (views, tensors autograd
  // saved) stay valid handles. FSDP frees gathered parameters this way after
  // a module's forward and fills them again, in place, before its backward
  // (nn/parallel/fsdp.h). Until reallocate(), data() is null and autograd
  // refuses to unpack saved tensors living here. Allocator-owned storage only.
  void release();
  // New memory of the same size (uninitialised; the caller refills it). The
  // version is not bumped: refilling restores the values tensors were saved with.
  void reallocate();
  bool released() const { return released_; }
  // Wrapped external memory only: points this storage at `data` (nbytes()
  // of it) instead. Compile mode's arena buffers are such views of their
  // arena, and follow it when it is released and allocated again between
  // replays (runtime/capture.h).
  void rebind(void* data);

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;  // null for external memory
  std::function<void(void*)> deleter_;
  std::atomic<uint32_t> version_{0};
  bool released_ = false;
  // Meta storage created under a cost::CountScope: its share of the scope's
  // simulated memory (runtime/cost.h).
  std::shared_ptr<cost::MetaMemory> meta_memory_;
  int64_t meta_bytes_ = 0;
};

}  // namespace tessel
