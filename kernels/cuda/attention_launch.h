#pragma once
// Launchers of the CUDA fused causal attention kernels (attention.cu);
// adapter in attention.cc. The order of operations is kernels/attention.h's,
// so float32 results equal the CPU kernel's bit for bit (docs/design.md §4 level 4).
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/attention.h"
#include "runtime/dtype.h"

namespace tessel::kernels::cuda {

// Element (b, h, t, d) of a [B, H, T, D] operand sits at
// b * s[0] + h * s[1] + t * s[2] + d * s[3] (elements).
struct AttnOperand {
  const void* data = nullptr;
  int64_t s[4] = {0, 0, 0, 0};
};

struct Strides4 {
  int64_t s[4] = {0, 0, 0, 0};
};

struct AttentionArgs {
  int64_t B = 0, Hq = 0, Hkv = 0, T = 0, D = 0;
  double scale = 1.0;
  int chunks = 16;
  bool dropout = false;
  PhiloxKey key{};
  uint32_t keep_threshold = 0;
  double dropout_scale = 1.0;
  AttentionDropoutIndex index;
  AttnOperand q, k, v;
};

// out: [B, Hq, T, D] with strides out_s; stats: contiguous [B, Hq, T, 2] of the
// compute type; rowbuf: device scratch of `blocks` * T compute-type values
// (one row of scores per block; attention_forward_blocks() gives `blocks`).
int64_t attention_forward_blocks(const AttentionArgs& a);
void launch_attention_forward(DType dtype, const AttentionArgs& a, void* out, const int64_t out_s[4], void* stats,
                              void* rowbuf, cudaStream_t stream);

// Backward. dout: [B, Hq, T, D]; scratch (compute type, device):
//   ds, pd: B * Hq * T * T values each (the dS and P' squares, lower triangle used),
//   rowbuf: attention_backward_blocks() * 2 * T values,
//   dkh, dvh: B * Hq * T * D values each when Hq != Hkv (per query head), else null.
// dq, dk, dv: [B, Hq|Hkv, T, D] with the given strides.
int64_t attention_backward_blocks(const AttentionArgs& a);
struct AttentionBackwardOut {
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;
  int64_t dq_s[4], dk_s[4], dv_s[4];
};
void launch_attention_backward(DType dtype, const AttentionArgs& a, const AttnOperand& dout, const void* stats,
                               void* ds, void* pd, void* rowbuf, void* dkh, void* dvh, const AttentionBackwardOut& o,
                               cudaStream_t stream);

}  // namespace tessel::kernels::cuda
