#include "kernels/cuda/staging.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/stream.h"

namespace tessel::cuda {
namespace {

struct Buffer {
  void* host = nullptr;  // pinned
  cudaEvent_t done = nullptr;
  bool in_flight = false;  // a queued copy may still read or write it
};

struct Staging {
  std::mutex mu;
  Buffer buf[2];
  int next = 0;

  void init(int device) {
    if (buf[0].host) return;
    DeviceGuard g(device);
    for (Buffer& b : buf) {
      TESSEL_CUDA_CHECK(cudaHostAlloc(&b.host, kStagingChunkBytes, cudaHostAllocDefault), "copy");
      TESSEL_CUDA_CHECK(cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming), "copy");
    }
  }
  // Waits until nothing queued still uses b.
  static void drain(Buffer& b) {
    if (b.in_flight) {
      TESSEL_CUDA_CHECK(cudaEventSynchronize(b.done), "copy");
      b.in_flight = false;
    }
  }
};

Staging& staging(int device) {
  static std::mutex mu;
  static std::vector<Staging*>* all = new std::vector<Staging*>();  // never freed (used until exit)
  std::lock_guard<std::mutex> lock(mu);
  if (size_t(device) >= all->size()) all->resize(size_t(device) + 1, nullptr);
  Staging*& s = (*all)[size_t(device)];
  if (!s) s = new Staging();
  return *s;
}

// A host copy cannot be part of a CUDA graph: the graph would read or
// write the staging buffer at every launch, long after the bytes were
// there (and the staging events would be ones recorded in a capture, which
// nothing may wait for). Refused before anything is queued, so the capture
// fails naming the copy (runtime/capture.h: the launch runs from the host).
void refuse_in_capture(cudaStream_t stream, const char* what) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  TESSEL_CUDA_CHECK(cudaStreamIsCapturing(stream, &status), what);
  if (status != cudaStreamCaptureStatusNone)
    TESSEL_FAIL(what, "a copy between host and device memory inside a CUDA graph's capture (the launch reads or writes "
                "host memory: it runs from the host instead)");
}

}  // namespace

void copy_host_to_device(void* dst, const void* src, size_t bytes, int device, cudaStream_t stream) {
  if (bytes == 0) return;
  refuse_in_capture(stream, "copy (host to device)");
  Staging& st = staging(device);
  std::lock_guard<std::mutex> lock(st.mu);
  st.init(device);
  DeviceGuard g(device);
  for (size_t off = 0; off < bytes; off += kStagingChunkBytes) {
    const size_t n = std::min(kStagingChunkBytes, bytes - off);
    Buffer& b = st.buf[st.next];
    st.next ^= 1;
    Staging::drain(b);
    std::memcpy(b.host, static_cast<const char*>(src) + off, n);
    TESSEL_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + off, b.host, n, cudaMemcpyHostToDevice, stream),
                      "copy (host to device)");
    TESSEL_CUDA_CHECK(cudaEventRecord(b.done, stream), "copy (host to device)");
    b.in_flight = true;
  }
}

void copy_device_to_host(void* dst, const void* src, size_t bytes, int device, cudaStream_t stream) {
  if (bytes == 0) return;
  refuse_in_capture(stream, "copy (device to host)");
  Staging& st = staging(device);
  std::lock_guard<std::mutex> lock(st.mu);
  st.init(device);
  DeviceGuard g(device);
  for (Buffer& b : st.buf) Staging::drain(b);
  const size_t chunks = (bytes + kStagingChunkBytes - 1) / kStagingChunkBytes;
  auto issue = [&](size_t i) {
    Buffer& b = st.buf[i % 2];
    const size_t off = i * kStagingChunkBytes, n = std::min(kStagingChunkBytes, bytes - off);
    TESSEL_CUDA_CHECK(cudaMemcpyAsync(b.host, static_cast<const char*>(src) + off, n, cudaMemcpyDeviceToHost, stream),
                      "copy (device to host)");
    TESSEL_CUDA_CHECK(cudaEventRecord(b.done, stream), "copy (device to host)");
    b.in_flight = true;
  };
  // Chunk i+1's DMA overlaps chunk i's host memcpy.
  issue(0);
  for (size_t i = 0; i < chunks; ++i) {
    if (i + 1 < chunks) issue(i + 1);
    Buffer& b = st.buf[i % 2];
    Staging::drain(b);
    const size_t off = i * kStagingChunkBytes, n = std::min(kStagingChunkBytes, bytes - off);
    std::memcpy(static_cast<char*>(dst) + off, b.host, n);
  }
}

}  // namespace tessel::cuda
