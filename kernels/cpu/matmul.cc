// CPU batched matmul. float32 runs on the project's GEMM; float64 on a plain
// implementation of the same canonical order; 16-bit floats via float32.
#include <cmath>
#include <vector>

#include "kernels/canonical.h"
#include "kernels/cpu/loops.h"
#include "kernels/elementwise.h"
#include "kernels/matmul.h"
#include "runtime/numerics.h"

namespace tessel::kernels::cpu {
namespace {

// The definition, for any floating type T (scalar; used for float64).
template <class T>
void bmm_canonical(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate, int v) {
  const int64_t B = a.shape()[0], M = a.shape()[1], K = a.shape()[2], N = b.shape()[2];
  const T* A = static_cast<const T*>(a.raw_data());
  const T* Bm = static_cast<const T*>(b.raw_data());
  T* C = static_cast<T*>(out.raw_data());
  const auto& as = a.strides();
  const auto& bs = b.strides();
  const auto& cs = out.strides();
  parallel_for(B * M, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, N * K)), [&](int64_t rb, int64_t re) {
    T vals[kMaxChunks];
    for (int64_t r = rb; r < re; ++r) {
      const int64_t bi = r / M, i = r % M;
      for (int64_t j = 0; j < N; ++j) {
        for (int c = 0; c < v; ++c) {
          T acc = T(0);
          for (int64_t k = numerics::chunk_begin(K, v, c); k < numerics::chunk_end(K, v, c); ++k)
            acc = std::fma(A[bi * as[0] + i * as[1] + k * as[2]], Bm[bi * bs[0] + k * bs[1] + j * bs[2]], acc);
          vals[c] = acc;
        }
        T res = tree_combine(vals, v, SumCombine<T>());
        T& dst = C[bi * cs[0] + i * cs[1] + j * cs[2]];
        dst = accumulate ? dst + res : res;
      }
    }
  });
}

void bmm_cpu(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate, int v) {
  switch (out.dtype()) {
    case DType::Float32: return bmm_canonical<float>(a, b, out, accumulate, v);
    case DType::Float64: return bmm_canonical<double>(a, b, out, accumulate, v);
    case DType::Float16:
    case DType::BFloat16: {
      auto widen = [](const Tensor& t) {
        Tensor w = raw::empty(t.shape(), DType::Float32, t.device());
        copy(t.device(), t, w);
        return w;
      };
      Tensor o = accumulate ? widen(out) : raw::empty(out.shape(), DType::Float32, out.device());
      bmm_canonical<float>(widen(a), widen(b), o, accumulate, v);
      copy(out.device(), o, out);
      return;
    }
    default: throw_unsupported_dtype("bmm", out.dtype(), "floating point");
  }
}

}  // namespace

TESSEL_REGISTER_KERNEL(bmm, DeviceType::CPU, bmm_cpu);

}  // namespace tessel::kernels::cpu
