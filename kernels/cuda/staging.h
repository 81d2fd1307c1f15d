#pragma once
// Host <-> device copies of pageable host memory through pinned staging
// buffers (CUDA builds only).
//
// Why: cudaMemcpy from pageable memory stages through a driver buffer and
// blocks; with our own pinned buffers the host->device direction returns as
// soon as the bytes are in a staging buffer (the caller may then reuse its
// memory) while the DMA runs on the stream, and large copies pipeline the
// host memcpy of one chunk with the DMA of the next. Two 8 MiB buffers per
// device, reused; each carries an event so it is never overwritten while a
// copy out of it is still queued.
#include <cstddef>

#include <cuda_runtime.h>

namespace tessel::cuda {

// Queues the copy of `bytes` from host memory to device memory on `stream`
// (of `device`); returns once `src` may be modified or freed. Ordered after
// the stream's earlier work; later work on the stream sees the bytes.
void copy_host_to_device(void* dst, const void* src, size_t bytes, int device, cudaStream_t stream);

// Copies `bytes` from device memory to host memory after the stream's
// earlier work; returns when `dst` holds them.
void copy_device_to_host(void* dst, const void* src, size_t bytes, int device, cudaStream_t stream);

inline constexpr size_t kStagingChunkBytes = size_t(8) << 20;

}  // namespace tessel::cuda
