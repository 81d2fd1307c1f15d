// GEMM micro-kernels for AVX2 + FMA (x86-64-v3): float 6 x 16, double 6 x 8.
// 12 accumulators + 2 B vectors + 1 broadcast of the 16 ymm registers.
#include "kernels/cpu/gemm_internal.h"
#include "kernels/cpu/gemm_kernel.h"

namespace tessel::kernels::cpu::gemm_detail {

const IsaImpl<float>& avx2_f32() {
  static const IsaImpl<float> impl{
      "avx2", 6, 16, &micro_kernel<F32x8, 6, 2>, &pack_a_f32<6>, &pack_b_f32<16>,
      /*kc_max=*/256, /*mc_max=*/144, /*nc_min=*/512, /*nc_max=*/1024};
  return impl;
}

const IsaImpl<double>& avx2_f64() {
  static const IsaImpl<double> impl{
      "avx2", 6, 8, &micro_kernel<F64x4, 6, 2>, &pack_a_f64<6>, &pack_b_f64<8>,
      /*kc_max=*/256, /*mc_max=*/96, /*nc_min=*/256, /*nc_max=*/512};
  return impl;
}

}  // namespace tessel::kernels::cpu::gemm_detail
