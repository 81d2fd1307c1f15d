// CUDA copy with dtype conversion and arbitrary strides (convert.h: the CPU
// copy kernel's conversions, bit for bit).
#include "kernels/cuda/convert.h"
#include "kernels/cuda/elementwise_launch.h"
#include "kernels/cuda/loops.cuh"

namespace tessel::kernels::cuda {
namespace {

template <class D, class S>
struct CopyFn {
  D* d;
  const S* s;
  __device__ void operator()(const int64_t* off) const { d[off[0]] = convert<D, S>(s[off[1]]); }
};

}  // namespace

void launch_copy(DType dst_dtype, DType src_dtype, const ElemGeometry<2>& g, void* dst, const void* src,
                 cudaStream_t stream) {
  dispatch_all(dst_dtype, "copy", [&](auto dtag) {
    using D = typename decltype(dtag)::type;
    dispatch_all(src_dtype, "copy", [&](auto stag) {
      using S = typename decltype(stag)::type;
      launch_elementwise<2>(g, CopyFn<D, S>{static_cast<D*>(dst), static_cast<const S*>(src)}, stream, "copy");
    });
  });
}

}  // namespace tessel::kernels::cuda
