// The CUDA runtime pieces tessel's core needs: the device count and
// synchronisation hooks (overriding the weak defaults in runtime/device.cc),
// devices/streams/events (stream.h), the caching allocator's CUDA backend, and
// the hook that lets item()/to_vector() read CUDA tensors.
#include <cuda_runtime.h>

#include <mutex>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/stream.h"
#include "kernels/elementwise.h"
#include "runtime/allocator.h"
#include "runtime/caching_allocator.h"
#include "runtime/device.h"
#include "runtime/error.h"

namespace tessel {

// Strong definitions of the hooks declared weak in runtime/device.cc.
int tessel_cuda_device_count_hook() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // no driver / no device: not an error, just no GPU
      return 0;
    }
    return n;
  }();
  return count;
}

void tessel_cuda_synchronize_hook(int device) { cuda::synchronize_device(device); }

namespace cuda {

int device_count() { return tessel_cuda_device_count_hook(); }

int current_device() {
  int d = 0;
  TESSEL_CUDA_CHECK(cudaGetDevice(&d), "current_device");
  return d;
}

DeviceGuard::DeviceGuard(int device) {
  TESSEL_CUDA_CHECK(cudaGetDevice(&prev_), "DeviceGuard");
  if (prev_ != device) {
    TESSEL_CUDA_CHECK(cudaSetDevice(device), "DeviceGuard");
    changed_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (changed_) cudaSetDevice(prev_);  // destructors do not throw
}

namespace {
constexpr int kMaxDevices = 64;
thread_local cudaStream_t t_current[kMaxDevices] = {};

void check_device_index(const char* op, int device) {
  TESSEL_CHECK(device >= 0 && device < kMaxDevices, op, "CUDA device index {} is out of range", device);
}
}  // namespace

cudaStream_t current_stream(int device) {
  check_device_index("current_stream", device);
  return t_current[device];
}

void set_current_stream(int device, cudaStream_t stream) {
  check_device_index("set_current_stream", device);
  t_current[device] = stream;
}

StreamGuard::StreamGuard(int device, cudaStream_t stream) : device_(device), prev_(current_stream(device)) {
  set_current_stream(device, stream);
}
StreamGuard::~StreamGuard() { t_current[device_] = prev_; }

Stream::Stream(int device, int priority) : device_(device) {
  DeviceGuard g(device);
  TESSEL_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamDefault, priority), "Stream");
}
Stream::~Stream() {
  if (stream_) cudaStreamDestroy(stream_);
}
void Stream::synchronize() const { TESSEL_CUDA_CHECK(cudaStreamSynchronize(stream_), "Stream::synchronize"); }

Event::Event(bool timing) {
  TESSEL_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming), "Event");
}
Event::~Event() {
  if (event_) cudaEventDestroy(event_);
}
void Event::record(cudaStream_t stream) { TESSEL_CUDA_CHECK(cudaEventRecord(event_, stream), "Event::record"); }
void Event::wait(cudaStream_t stream) const {
  TESSEL_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0), "Event::wait");
}
void Event::synchronize() const { TESSEL_CUDA_CHECK(cudaEventSynchronize(event_), "Event::synchronize"); }
bool Event::query() const {
  cudaError_t e = cudaEventQuery(event_);
  if (e == cudaErrorNotReady) return false;
  TESSEL_CUDA_CHECK(e, "Event::query");
  return true;
}
float Event::elapsed_ms(const Event& start, const Event& end) {
  float ms = 0;
  TESSEL_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, end.event_), "Event::elapsed_ms");
  return ms;
}

void synchronize_device(int device) {
  DeviceGuard g(device);
  TESSEL_CUDA_CHECK(cudaDeviceSynchronize(), "synchronize");
}

int sm_count(int device) {
  static std::mutex mu;
  static std::vector<int> counts;
  std::lock_guard<std::mutex> lock(mu);
  if (size_t(device) >= counts.size()) counts.resize(size_t(device) + 1, 0);
  if (counts[size_t(device)] == 0) {
    int n = 0;
    TESSEL_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device), "sm_count");
    counts[size_t(device)] = n;
  }
  return counts[size_t(device)];
}

namespace {

// The caching allocator's view of CUDA: cudaMalloc/cudaFree, streams, events.
class CudaBackend final : public DeviceMemoryBackend {
 public:
  void* raw_alloc(int device, size_t bytes) override {
    DeviceGuard g(device);
    void* p = nullptr;
    // Inside a CUDA graph's capture (a private pool's new block,
    // kernels/cuda/graph.cc) cudaMalloc is refused in the capture's
    // thread-local mode, though the graph only needs the address: relaxed
    // for this call, as every other unsafe call stays refused.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    TESSEL_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode), "allocate");
    cudaError_t e = cudaMalloc(&p, bytes);
    TESSEL_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode), "allocate");
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return nullptr;
    }
    TESSEL_CUDA_CHECK(e, "allocate");
    return p;
  }
  void raw_free(int device, void* p) override {
    DeviceGuard g(device);
    TESSEL_CUDA_CHECK(cudaFree(p), "empty_cache");
  }
  void synchronize(int device) override { synchronize_device(device); }
  void* current_stream(int device) override { return cuda::current_stream(device); }
  void* record_event(int device, void* stream) override {
    DeviceGuard g(device);
    cudaEvent_t ev = nullptr;
    TESSEL_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "deallocate");
    TESSEL_CUDA_CHECK(cudaEventRecord(ev, static_cast<cudaStream_t>(stream)), "deallocate");
    return ev;
  }
  bool event_done(void* event) override {
    cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (e == cudaErrorNotReady) return false;
    TESSEL_CUDA_CHECK(e, "allocate");
    return true;
  }
  void destroy_event(void* event) override { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }
  void mem_info(int device, size_t* free_bytes, size_t* total_bytes) override {
    DeviceGuard g(device);
    if (cudaMemGetInfo(free_bytes, total_bytes) != cudaSuccess) {
      cudaGetLastError();
      *free_bytes = *total_bytes = 0;
    }
  }
};

// Never destroyed: tensors held by other static objects may be freed during
// exit, after any static allocator would have been destroyed.
CachingAllocator* g_allocator = new CachingAllocator(new CudaBackend(), DeviceType::CUDA);

Tensor host_copy(const Tensor& t) {
  Tensor h = raw::empty(t.shape(), t.dtype(), kCPU);
  kernels::copy(t.device(), t, h);
  return h;
}

void device_copy_on_stream(const Tensor& src, const Tensor& dst) { kernels::copy(dst.device(), src, dst); }

const bool g_registered = [] {
  register_allocator(DeviceType::CUDA, g_allocator);
  set_host_copy_hook(&host_copy);
  set_device_copy_hook(&device_copy_on_stream);
  return true;
}();

}  // namespace

CachingAllocator& allocator() { return *g_allocator; }

void record_stream(const Tensor& t, cudaStream_t stream) {
  TESSEL_CHECK(t.device().is_cuda(), "record_stream", "expects a CUDA tensor, got {}", t.desc());
  if (t.storage() && t.storage()->data()) g_allocator->record_stream(t.storage()->data(), stream);
}

}  // namespace cuda
}  // namespace tessel
