#include "runtime/storage.h"

#include "runtime/error.h"

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

void StorageImpl::release() {
  if (released_) return;
  TESSEL_CHECK(allocator_ != nullptr || nbytes_ == 0 || device_.is_meta(), "StorageImpl::release",
               "storage of {} bytes on {} wraps external memory; only allocator-owned storage can be released",
               nbytes_, device_.str());
  if (allocator_) allocator_->deallocate(data_, nbytes_, Stream{device_, nullptr});
  data_ = nullptr;
  released_ = true;
}

void StorageImpl::reallocate() {
  if (!released_) return;
  if (allocator_) data_ = allocator_->allocate(nbytes_, Stream{device_, nullptr});  // the device's current stream
  released_ = false;
}

}  // namespace tessel
