#include "runtime/storage.h"

#include "runtime/capture.h"
#include "runtime/cost.h"
#include "runtime/error.h"

namespace tessel {

StorageImpl::StorageImpl(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  if (device.is_meta() && nbytes > 0 && cost::active_meta_memory()) {  // a step simulated on Meta (runtime/cost.h)
    meta_memory_ = cost::active_meta_memory();
    meta_bytes_ = int64_t(cpu_size_class(nbytes));
    meta_memory_->add(meta_bytes_);
  }
  if (device.is_meta()) return;
  // Empty tensors too: one made in a recorded step is the step's own, not a
  // tensor from before it (a dp rank with no rows makes them every step).
  if (TESSEL_UNLIKELY(capture::active() != nullptr)) capture::active()->storage_created(this);
  if (nbytes == 0) return;
  allocator_ = allocator_for(device);
  data_ = allocator_->allocate(nbytes, Stream{device, nullptr});  // the device's current stream
}

StorageImpl::StorageImpl(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}

StorageImpl::~StorageImpl() {
  if (meta_memory_ && !released_) meta_memory_->sub(meta_bytes_);
  // (Its address may name a new storage next: the recorder forgets it.)
  if (TESSEL_UNLIKELY(capture::active() != nullptr)) capture::active()->storage_destroyed(this);
  if (allocator_) {
    allocator_->deallocate(data_, nbytes_, Stream{device_, nullptr});
  } else if (deleter_) {
    deleter_(data_);
  }
}

void StorageImpl::release() {
  if (released_) return;
  // Host work on a buffer the step's kernels use: a replay must do it again.
  if (TESSEL_UNLIKELY(capture::active() != nullptr)) capture::active()->storage_released(*this);
  TESSEL_CHECK(allocator_ != nullptr || nbytes_ == 0 || device_.is_meta(), "StorageImpl::release",
               "storage of {} bytes on {} wraps external memory; only allocator-owned storage can be released",
               nbytes_, device_.str());
  if (allocator_) allocator_->deallocate(data_, nbytes_, Stream{device_, nullptr});
  if (meta_memory_) meta_memory_->sub(meta_bytes_);
  data_ = nullptr;
  released_ = true;
}

void StorageImpl::reallocate() {
  if (!released_) return;
  if (TESSEL_UNLIKELY(capture::active() != nullptr)) capture::active()->storage_reallocated(*this);
  if (allocator_) data_ = allocator_->allocate(nbytes_, Stream{device_, nullptr});  // the device's current stream
  if (meta_memory_) meta_memory_->add(meta_bytes_);
  released_ = false;
}

void StorageImpl::rebind(void* data) {
  TESSEL_CHECK(allocator_ == nullptr && !deleter_, "StorageImpl::rebind",
               "storage of {} bytes on {} owns its memory; only a view of memory owned elsewhere can be pointed "
               "at other memory",
               nbytes_, device_.str());
  data_ = data;
}

}  // namespace tessel
