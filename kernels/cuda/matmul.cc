// The CUDA bmm: the bitwise GEMM (gemm.cu) in GemmMode::Bitwise, cuBLASLt
// (cublaslt.cc) in GemmMode::Fast for float32/bfloat16/float16 when the
// layout allows (else the bitwise kernel, which is deterministic too).
#include "kernels/cuda/call.h"
#include "kernels/cuda/cublaslt.h"
#include "kernels/cuda/gemm_launch.h"
#include "kernels/cuda/gemm_plan.h"
#include "kernels/cuda/lt_plan.h"
#include "kernels/matmul.h"
#include "runtime/numerics.h"

namespace tessel::kernels::cuda {
namespace {

// The most workspace (compute-type elements) the bitwise GEMM may take to
// split a deep chunk tree or to raise parallelism: 32 Mi elements.
constexpr int64_t kGemmWorkspaceCap = int64_t(32) << 20;

void bmm_cuda(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate, int v) {
  CudaCall call("matmul", {&a, &b, &out});
  TESSEL_CHECK(a.dim() == 3 && b.dim() == 3 && out.dim() == 3 && a.shape()[0] == b.shape()[0] &&
                   a.shape()[2] == b.shape()[1] && out.shape()[0] == a.shape()[0] && out.shape()[1] == a.shape()[1] &&
                   out.shape()[2] == b.shape()[2],
               "bmm", "expects [B, M, K] x [B, K, N] -> [B, M, N], got {}, {} -> {}", a.desc(), b.desc(), out.desc());
  TESSEL_CHECK(a.dtype() == out.dtype() && b.dtype() == out.dtype(), "bmm", "operands {} and {} and output {} differ "
               "in dtype", a.desc(), b.desc(), out.desc());
  if (out.numel() == 0) return;
  TESSEL_CHECK(out.stride(2) == 1 || out.shape()[2] == 1, "bmm", "output {} needs a unit column stride", out.desc());
  GemmParams p;
  p.batch = a.shape()[0];
  p.M = a.shape()[1];
  p.K = a.shape()[2];
  p.N = b.shape()[2];
  p.a_rs = a.strides()[1];
  p.a_cs = a.strides()[2];
  p.a_bs = p.batch > 1 ? a.strides()[0] : 0;
  p.b_rs = b.strides()[1];
  p.b_cs = b.strides()[2];
  p.b_bs = p.batch > 1 ? b.strides()[0] : 0;
  p.c_rs = out.strides()[1];
  p.c_bs = out.strides()[0];
  p.chunks = v;
  p.accumulate = accumulate;
  p.A = a.raw_data();
  p.B = b.raw_data();
  p.C = out.raw_data();
  if (numerics::gemm_mode() == numerics::GemmMode::Fast && out.dtype() != DType::Float64) {
    const LtPlan plan = plan_lt_matmul(p.M, p.N, p.K, p.batch, p.a_rs, p.a_cs, p.a_bs, p.b_rs, p.b_cs, p.b_bs, p.c_rs,
                                       p.batch > 1 ? p.c_bs : 0, out.dtype(), LtEpilogue::None);
    if (plan.ok && lt_matmul(call, plan, p.A, p.B, p.C, accumulate)) return;
  }
  const BitwiseGemmPlan plan =
      plan_bitwise_gemm(p.M, p.N, p.K, p.batch, v, tessel::cuda::sm_count(call.device()), kGemmWorkspaceCap);
  Tensor work;
  if (plan.workspace_elems > 0)
    work = scratch(call, Dims{plan.workspace_elems}, out.dtype() == DType::Float64 ? DType::Float64 : DType::Float32);
  launch_gemm_bitwise(out.dtype(), p, plan, plan.workspace_elems > 0 ? work.raw_data() : nullptr, call.stream());
}

}  // namespace

TESSEL_REGISTER_KERNEL(bmm, DeviceType::CUDA, bmm_cuda);

}  // namespace tessel::kernels::cuda
