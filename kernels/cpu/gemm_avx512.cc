// GEMM micro-kernel for AVX-512F: float 8 x 48 (24 zmm accumulators, 3 B
// vectors, 1 broadcast). Same per-element operation order as the AVX2 path.
#include "kernels/cpu/gemm_internal.h"
#include "kernels/cpu/gemm_kernel.h"

namespace tessel::kernels::cpu::gemm_detail {

const IsaImpl<float>& avx512_f32() {
  static const IsaImpl<float> impl = [] {
    IsaImpl<float> i{"avx512", 8, 48, &micro_kernel<F32x16, 8, 3>, &pack_a_f32<8>, &pack_b_f32<48>,
                     /*kc_max=*/256, /*mc_max=*/256, /*nc_min=*/480, /*nc_max=*/960};
    i.small_m = &small_m_f32_avx512;
    return i;
  }();
  return impl;
}

}  // namespace tessel::kernels::cpu::gemm_detail
