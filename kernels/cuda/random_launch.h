#pragma once
// Launchers for the CUDA random kernels (kernels/cuda/random.cu). Plain
// declarations with no tensor or fmt dependency, so that nvcc compiles only
// device-safe headers; kernels/cuda/random.cc adapts them to the KernelTables.
#include <cstdint>

#include "kernels/random_math.h"
#include "runtime/dtype.h"

namespace tessel::kernels::cuda {

// Each returns nullptr on success, else a description of the failure
// (an unsupported dtype, or the CUDA error of the launch). `stream` is a
// cudaStream_t (null: the default stream). Launches are asynchronous.
const char* launch_random_fill(DType dtype, const RandomParams& params, const RandomGeometry& g, void* out,
                               void* stream);
const char* launch_dropout(DType dtype, PhiloxKey key, uint32_t keep_threshold, double scale, const RandomGeometry& g,
                           const void* in, void* out, void* stream);

}  // namespace tessel::kernels::cuda
