#include "runtime/storage.h"

namespace tessel {

StorageImpl::StorageImpl(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  if (device.is_meta() || nbytes == 0) return;
  allocator_ = allocator_for(device);
  data_ = allocator_->allocate(nbytes, Stream{device, nullptr});  // the device's current stream
}

StorageImpl::StorageImpl(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}

StorageImpl::~StorageImpl() {
  if (allocator_) {
    allocator_->deallocate(data_, nbytes_, Stream{device_, nullptr});
  } else if (deleter_) {
    deleter_(data_);
  }
}

}  // namespace tessel
