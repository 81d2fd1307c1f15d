// CUDA graphs of a compiled step's launches: the GraphBackend of
// runtime/capture.h ("device graphs"; docs/compile.md, "On a GPU").
//
// A run of recorded launches is captured once on a private stream (the
// legacy default stream, every thread's current stream unless set, cannot
// be captured) and launched as one graph on the caller's current stream
// from then on. Capturing runs nothing on the device. The capture is in
// thread-local mode, so a launch that synchronises or reads a device value
// on the host fails it -- an error that names the launch, never a graph
// that baked in a stale value -- and that launch runs from the host
// instead (Program::run_segment). What a launch allocates while it is
// captured comes from a pool private to the graph (CachingAllocator's
// PoolScope): the graph writes those blocks at every launch, so nothing
// else may get them until the graph is destroyed.
#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/stream.h"
#include "runtime/capture.h"
#include "runtime/error.h"

namespace tessel::cuda {
namespace {

// This thread's capture stream on `device` (created once, never destroyed:
// a stream destroyed at thread exit may outlive the CUDA context).
cudaStream_t capture_stream(int device) {
  thread_local std::vector<cudaStream_t> streams;
  if (size_t(device) >= streams.size()) streams.resize(size_t(device) + 1, nullptr);
  cudaStream_t& s = streams[size_t(device)];
  if (!s) {
    DeviceGuard g(device);
    TESSEL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "compile: a CUDA graph's capture stream");
  }
  return s;
}

class CudaGraph final : public capture::Graph {
 public:
  CudaGraph(int device, cudaGraphExec_t exec, void* pool) : device_(device), exec_(exec), pool_(pool) {}
  ~CudaGraph() override {
    // The device may still be running its last launch, which writes the
    // pool's blocks: wait for it before they become ordinary blocks.
    DeviceGuard g(device_);
    if (cudaDeviceSynchronize() != cudaSuccess) cudaGetLastError();
    cudaGraphExecDestroy(exec_);
    allocator().destroy_pool(pool_);
  }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  void launch() override {
    DeviceGuard g(device_);
    TESSEL_CUDA_CHECK(cudaGraphLaunch(exec_, current_stream(device_)), "compile: a CUDA graph's launch");
  }

 private:
  int device_;
  cudaGraphExec_t exec_;
  void* pool_;
};

class CudaGraphBackend final : public capture::GraphBackend {
 public:
  std::unique_ptr<capture::Graph> capture(Device device, const std::vector<capture::Launch*>& launches) override {
    const int d = device.index;
    DeviceGuard g(d);
    const cudaStream_t home = current_stream(d);
    const cudaStream_t cap = capture_stream(d);
    void* pool = allocator().create_pool(d, home);
    int64_t at = -1;
    try {
      cudaGraph_t graph = nullptr;
      {
        StreamGuard on(d, cap);  // (the launches take the thread's current stream)
        CachingAllocator::PoolScope in_pool(pool);
        TESSEL_CUDA_CHECK(cudaStreamBeginCapture(cap, cudaStreamCaptureModeThreadLocal), "compile: a CUDA graph's capture");
        try {
          for (at = 0; at < int64_t(launches.size()); ++at) launches[size_t(at)]->run();
        } catch (const std::exception& e) {
          cudaGraph_t broken = nullptr;
          if (cudaStreamEndCapture(cap, &broken) != cudaSuccess) cudaGetLastError();
          if (broken) cudaGraphDestroy(broken);
          throw capture::GraphRefused(
              TESSEL_FORMAT("launch {} ('{}') of {} could not be captured into a CUDA graph: {}", at,
                            launches[size_t(at)]->name, launches.size(), e.what()),
              at);
        }
        at = -1;
        const cudaError_t e = cudaStreamEndCapture(cap, &graph);
        if (e != cudaSuccess) {
          cudaGetLastError();
          if (graph) cudaGraphDestroy(graph);
          throw capture::GraphRefused(TESSEL_FORMAT("the capture of {} launches into a CUDA graph failed: {}",
                                                    launches.size(), cudaGetErrorString(e)),
                                      -1);
        }
      }
      cudaGraphExec_t exec = nullptr;
      const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
      cudaGraphDestroy(graph);
      if (e != cudaSuccess) {
        cudaGetLastError();
        throw capture::GraphRefused(
            TESSEL_FORMAT("a CUDA graph of {} launches could not be instantiated: {}", launches.size(),
                          cudaGetErrorString(e)),
            -1);
      }
      return std::make_unique<CudaGraph>(d, exec, pool);
    } catch (const capture::GraphRefused&) {
      allocator().destroy_pool(pool);  // (nothing ran: no graph holds its blocks)
      throw;
    } catch (const std::exception& e) {
      allocator().destroy_pool(pool);
      throw capture::GraphRefused(TESSEL_FORMAT("a CUDA graph's capture failed: {}", e.what()), at);
    }
  }
};

const bool g_registered = [] {
  static CudaGraphBackend backend;
  capture::set_graph_backend(DeviceType::CUDA, &backend);
  return true;
}();

}  // namespace
}  // namespace tessel::cuda
