// The bitwise CUDA GEMM: per C element the canonical K-order of docs/gemm.md
// (V chunks, ascending fma chains from +0, balanced tree over chunks), the
// same bits as gemm_reference_f32 (and the CPU GEMM). Tiling and the reasons
// it is exact are in gemm_plan.h: 64 x 64 C tile per block, 4 x 4 per thread
// (rows ty + 16 i, columns tx + 16 j: conflict-free shared-memory reads),
// 16-deep K steps starting at each chunk's first k with zero padding past the
// chunk end, chunk values folded by a register binary counter.
#include <cstdint>
#include <cuda_runtime.h>
#include <type_traits>

#include "kernels/cuda/call.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/cublaslt.h"
#include "kernels/cuda/gemm_plan.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/lt_plan.h"
#include "kernels/matmul.h"
#include "runtime/dtype.h"
#include "runtime/numerics.h"

// ---- launch interface: the bitwise GEMM (docs/gemm.md's arithmetic, the
// tiling in gemm_plan.h), called by the bmm adapter at the end ----
namespace tessel::kernels::cuda {

struct GemmParams {
  int64_t M = 0, N = 0, K = 0, batch = 1;
  // Element (i, k) of A[b] at A + b * a_bs + i * a_rs + k * a_cs; likewise B;
  // C[b] row-major with row stride c_rs and unit column stride.
  int64_t a_rs = 0, a_cs = 0, a_bs = 0;
  int64_t b_rs = 0, b_cs = 0, b_bs = 0;
  int64_t c_rs = 0, c_bs = 0;
  int chunks = 16;
  bool accumulate = false;
  const void* A = nullptr;
  const void* B = nullptr;
  void* C = nullptr;
};

// `work`: plan.workspace_elems values of the compute type (float, or double
// for float64), or null when the plan needs none. dtype: A, B and C
// (float32/float64, or bfloat16/float16 computed in float, rounded once).
void launch_gemm_bitwise(DType dtype, const GemmParams& p, const BitwiseGemmPlan& plan, void* work,
                         cudaStream_t stream);

}  // namespace tessel::kernels::cuda

namespace tessel::kernels::cuda {
namespace {

using Tiling = GemmTiling;
constexpr int kBM = Tiling::kBM, kBN = Tiling::kBN, kBK = Tiling::kBK, kTM = Tiling::kTM, kTN = Tiling::kTN;
static_assert(kTM * 16 == kBM && kTN * 16 == kBN && Tiling::kThreads == 256, "16 x 16 threads, 4 x 4 each");

template <class T, class Acc, int kLevels>
__global__ void __launch_bounds__(256) gemm_bitwise_kernel(GemmParams p, int group_levels, int groups,
                                                           int64_t batch_offset, Acc* work) {
  __shared__ Acc As[kBK][kBM + 1];
  __shared__ Acc Bs[kBK][kBN + 1];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t tiles_n = (p.N + kBN - 1) / kBN;
  const int64_t tm = int64_t(blockIdx.x) / tiles_n, tn = int64_t(blockIdx.x) % tiles_n;
  const int64_t row0 = tm * kBM, col0 = tn * kBN;
  const int group = blockIdx.y;
  const int64_t b = batch_offset + blockIdx.z;
  const T* A = static_cast<const T*>(p.A) + b * p.a_bs;
  const T* B = static_cast<const T*>(p.B) + b * p.b_bs;
  const bool a_k_contig = p.a_cs == 1;  // consecutive threads on consecutive memory
  const bool b_n_contig = p.b_cs == 1 || p.b_rs != 1;

  Acc slot[kLevels + 1][kTM][kTN];
  Acc acc[kTM][kTN];
#pragma unroll
  for (int l = 0; l <= kLevels; ++l)
#pragma unroll
    for (int i = 0; i < kTM; ++i)
#pragma unroll
      for (int j = 0; j < kTN; ++j) slot[l][i][j] = Acc(0);

  const int G = 1 << group_levels;
  for (int q = 0; q < G; ++q) {
    const int c = group * G + q;
    const int64_t cb = numerics::chunk_begin(p.K, p.chunks, c), ce = numerics::chunk_end(p.K, p.chunks, c);
#pragma unroll
    for (int i = 0; i < kTM; ++i)
#pragma unroll
      for (int j = 0; j < kTN; ++j) acc[i][j] = Acc(0);
    for (int64_t k0 = cb; k0 < ce; k0 += kBK) {
      for (int e = tid; e < kBM * kBK; e += 256) {
        const int m = a_k_contig ? e / kBK : e % kBM;
        const int kk = a_k_contig ? e % kBK : e / kBM;
        const int64_t gr = row0 + m, gk = k0 + kk;
        // Past the chunk's end both A and B are 0: fma(0, 0, acc) == acc.
        As[kk][m] = gr < p.M && gk < ce ? Acc(widen(A[gr * p.a_rs + gk * p.a_cs])) : Acc(0);
      }
      for (int e = tid; e < kBK * kBN; e += 256) {
        const int n = b_n_contig ? e % kBN : e / kBK;
        const int kk = b_n_contig ? e / kBN : e % kBK;
        const int64_t gk = k0 + kk, gc = col0 + n;
        Bs[kk][n] = gc < p.N && gk < ce ? Acc(widen(B[gk * p.b_rs + gc * p.b_cs])) : Acc(0);
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kBK; ++kk) {
        Acc av[kTM], bv[kTN];
#pragma unroll
        for (int i = 0; i < kTM; ++i) av[i] = As[kk][ty + 16 * i];
#pragma unroll
        for (int j = 0; j < kTN; ++j) bv[j] = Bs[kk][tx + 16 * j];
#pragma unroll
        for (int i = 0; i < kTM; ++i)
#pragma unroll
          for (int j = 0; j < kTN; ++j) acc[i][j] = fma(av[i], bv[j], acc[i][j]);
      }
      __syncthreads();
    }
    // Binary counter over the group's chunks (tree_fold.h): carry through the
    // set low bits of q, left operand the older (left) subtree.
    bool carrying = true;
#pragma unroll
    for (int l = 0; l <= kLevels; ++l) {
      if (carrying) {
        if (l < group_levels && ((q >> l) & 1)) {
#pragma unroll
          for (int i = 0; i < kTM; ++i)
#pragma unroll
            for (int j = 0; j < kTN; ++j) acc[i][j] = slot[l][i][j] + acc[i][j];
        } else {
#pragma unroll
          for (int i = 0; i < kTM; ++i)
#pragma unroll
            for (int j = 0; j < kTN; ++j) slot[l][i][j] = acc[i][j];
          carrying = false;
        }
      }
    }
  }
  // The group's root sits at level group_levels.
#pragma unroll
  for (int l = 0; l <= kLevels; ++l) {
    if (l == group_levels) {
#pragma unroll
      for (int i = 0; i < kTM; ++i)
#pragma unroll
        for (int j = 0; j < kTN; ++j) acc[i][j] = slot[l][i][j];
    }
  }
  T* C = static_cast<T*>(p.C) + b * p.c_bs;
#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const int64_t gr = row0 + ty + 16 * i;
    if (gr >= p.M) continue;
#pragma unroll
    for (int j = 0; j < kTN; ++j) {
      const int64_t gc = col0 + tx + 16 * j;
      if (gc >= p.N) continue;
      if (groups == 1) {
        Acc v = acc[i][j];
        if (p.accumulate) v = Acc(widen(C[gr * p.c_rs + gc])) + v;
        C[gr * p.c_rs + gc] = narrow<T>(v);
      } else {
        work[((int64_t(group) * p.batch + b) * p.M + gr) * p.N + gc] = acc[i][j];
      }
    }
  }
}

// The top of the tree: fold the P group roots of every element (tree_combine,
// in place in the workspace column the thread owns), then write C.
template <class T, class Acc>
__global__ void gemm_groups_kernel(GemmParams p, int groups, Acc* work) {
  const int64_t total = p.batch * p.M * p.N;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = e / (p.M * p.N), rc = e - b * p.M * p.N, r = rc / p.N, c = rc - r * p.N;
    Acc* vals = work + e;
    for (int w = 1; w < groups; w *= 2)
      for (int i = 0; i + w < groups; i += 2 * w) vals[int64_t(i) * total] = vals[int64_t(i) * total] + vals[int64_t(i + w) * total];
    T* C = static_cast<T*>(p.C) + b * p.c_bs + r * p.c_rs + c;
    Acc v = vals[0];
    if (p.accumulate) v = Acc(widen(*C)) + v;
    *C = narrow<T>(v);
  }
}

template <class T, class Acc>
void run(const GemmParams& p, const BitwiseGemmPlan& plan, Acc* work, cudaStream_t s) {
  const int64_t tiles = plan.tiles_m * plan.tiles_n;
  for (int64_t b0 = 0; b0 < p.batch; b0 += 65535) {
    const int64_t nb = p.batch - b0 < 65535 ? p.batch - b0 : 65535;
    const dim3 grid(unsigned(tiles), unsigned(plan.groups), unsigned(nb));
    if (plan.max_levels == Tiling::kRegLevels)
      gemm_bitwise_kernel<T, Acc, Tiling::kRegLevels><<<grid, 256, 0, s>>>(p, plan.group_levels, plan.groups, b0, work);
    else
      gemm_bitwise_kernel<T, Acc, Tiling::kMaxLevels><<<grid, 256, 0, s>>>(p, plan.group_levels, plan.groups, b0, work);
    TESSEL_CUDA_CHECK_LAUNCH("matmul");
  }
  if (plan.groups > 1) {
    gemm_groups_kernel<T, Acc><<<grid_blocks(p.batch * p.M * p.N), kThreads, 0, s>>>(p, plan.groups, work);
    TESSEL_CUDA_CHECK_LAUNCH("matmul");
  }
}

}  // namespace

void launch_gemm_bitwise(DType dtype, const GemmParams& p, const BitwiseGemmPlan& plan, void* work, cudaStream_t s) {
  if (p.M == 0 || p.N == 0 || p.batch == 0) return;
  switch (dtype) {
    case DType::Float32: return run<float, float>(p, plan, static_cast<float*>(work), s);
    case DType::Float64: return run<double, double>(p, plan, static_cast<double*>(work), s);
    case DType::BFloat16: return run<bf16, float>(p, plan, static_cast<float*>(work), s);
    case DType::Float16: return run<f16, float>(p, plan, static_cast<float*>(work), s);
    default: throw_unsupported_dtype("matmul", dtype, "floating point");
  }
}

}  // namespace tessel::kernels::cuda

// The CUDA bmm: the bitwise GEMM in GemmMode::Bitwise, cuBLASLt
// (cublaslt.cc) in GemmMode::Fast for float32/bfloat16/float16 when the
// layout allows (else the bitwise kernel, which is deterministic too).
namespace tessel::kernels::cuda {
namespace {

// The most workspace (compute-type elements) the bitwise GEMM may take to
// split a deep chunk tree or to raise parallelism: 32 Mi elements.
constexpr int64_t kGemmWorkspaceCap = int64_t(32) << 20;

void bmm_cuda(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate, int v) {
  CudaCall call("matmul", {&a, &b, &out});
  if (out.numel() == 0) return;
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
