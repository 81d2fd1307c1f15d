#pragma once
// Launchers of the CUDA loss kernels (loss.cu); adapters in loss.cc. Layout
// as kernels/loss.h: scores [M, K] contiguous, targets int64 [M], per-token
// values [M] in the compute type C, count an int64 scalar -- all on the device.
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/loss.h"
#include "runtime/dtype.h"

namespace tessel::kernels::cuda {

struct LossArgs {
  int64_t m = 0, k = 0;
  int64_t ignore_index = -100;
  double label_smoothing = 0;
  int chunks = 16;
  LossReduction reduction = LossReduction::Mean;
  const void* scores = nullptr;
  const int64_t* targets = nullptr;
  const void* g = nullptr;      // backward: [M] (None) or a scalar, in C
  void* losses = nullptr;       // [M] C
  void* row_max = nullptr;      // [M] C
  void* sum_exp = nullptr;      // [M] C
  int64_t* count = nullptr;     // scalar
  void* dscores = nullptr;      // backward
};

// *bad_pos (a device int64, preset to INT64_MAX by the launcher) = the first
// position whose target is neither ignore_index nor in [0, k).
void launch_find_bad_target(const int64_t* targets, int64_t m, int64_t k, int64_t ignore_index, int64_t* bad_pos,
                            cudaStream_t stream);
void launch_count_valid(const int64_t* targets, int64_t m, int64_t ignore_index, int64_t* count,
                        cudaStream_t stream);
void launch_cross_entropy_forward(DType dtype, const LossArgs& a, cudaStream_t stream);
void launch_cross_entropy_backward(DType dtype, const LossArgs& a, cudaStream_t stream);
void launch_nll_forward(DType dtype, const LossArgs& a, cudaStream_t stream);
void launch_nll_backward(DType dtype, const LossArgs& a, cudaStream_t stream);
// out (a scalar of out_dtype) = canonical sum of losses [m] (C = loss_dtype), / count when mean.
void launch_loss_reduce(DType loss_dtype, DType out_dtype, const void* losses, int64_t m, const int64_t* count,
                        bool mean, void* out, int chunks, cudaStream_t stream);

}  // namespace tessel::kernels::cuda
