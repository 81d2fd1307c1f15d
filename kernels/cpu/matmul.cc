// CPU batched matmul on the project's GEMM (kernels/gemm.h): float32 and
// float64 directly, 16-bit floats widened to float32 (result rounded once).
#include <cmath>
#include <vector>

#include "kernels/canonical.h"
#include "kernels/cpu/loops.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/matmul.h"
#include "runtime/numerics.h"

namespace tessel::kernels::cpu {
namespace {

template <class T, class Args>
void bmm_gemm(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate, int v) {
  if (out.numel() == 0) return;  // empty batch (e.g. an empty shard): nothing to write
  Args g;
  g.M = a.shape()[1];
  g.N = b.shape()[2];
  g.K = a.shape()[2];
  g.A = static_cast<const T*>(a.raw_data());
  g.a_row_stride = a.strides()[1];
  g.a_col_stride = a.strides()[2];
  g.B = static_cast<const T*>(b.raw_data());
  g.b_row_stride = b.strides()[1];
  g.b_col_stride = b.strides()[2];
  g.C = static_cast<T*>(out.raw_data());
  g.c_row_stride = out.strides()[1];
  g.accumulate = accumulate;
  g.chunks = v;
  const int64_t batch = a.shape()[0];
  if constexpr (std::is_same_v<T, float>) {
    gemm_batched_f32(g, batch, batch > 1 ? a.strides()[0] : 0, batch > 1 ? b.strides()[0] : 0, out.strides()[0]);
  } else {
    gemm_batched_f64(g, batch, batch > 1 ? a.strides()[0] : 0, batch > 1 ? b.strides()[0] : 0, out.strides()[0]);
  }
}

void bmm_cpu(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate, int v) {
  switch (out.dtype()) {
    case DType::Float32: return bmm_gemm<float, GemmArgs>(a, b, out, accumulate, v);
    case DType::Float64: return bmm_gemm<double, GemmArgsF64>(a, b, out, accumulate, v);
    case DType::Float16:
    case DType::BFloat16: {
      auto widen = [](const Tensor& t) {
        Tensor w = raw::empty(t.shape(), DType::Float32, t.device());
        copy(t.device(), t, w);
        return w;
      };
      Tensor o = accumulate ? widen(out) : raw::empty(out.shape(), DType::Float32, out.device());
      bmm_gemm<float, GemmArgs>(widen(a), widen(b), o, accumulate, v);
      copy(out.device(), o, out);
      return;
    }
    default: throw_unsupported_dtype("bmm", out.dtype(), "floating point");
  }
}

}  // namespace

TESSEL_REGISTER_KERNEL(bmm, DeviceType::CPU, bmm_cpu);

}  // namespace tessel::kernels::cpu
