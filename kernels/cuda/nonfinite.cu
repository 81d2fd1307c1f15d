// CUDA count of non-finite elements (kernels/nonfinite.h): one thread per
// element through launch_elementwise; a non-finite element adds 1 to the
// count with an integer atomic (the total does not depend on the order).
// Atomics only fire on non-finite elements, which are rare where it matters:
// a healthy tensor costs one read pass.
#include "kernels/cuda/call.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/geometry_build.h"
#include "kernels/cuda/loops.cuh"
#include "kernels/nonfinite.h"

namespace tessel::kernels::cuda {
namespace {

template <class T>
struct CountNonfinite {
  const T* x;
  unsigned long long* count;
  __device__ void operator()(const int64_t* off) const {
    if (nonfinite_value<acc_t<T>>(acc_t<T>(widen(x[off[0]])))) atomicAdd(count, 1ull);
  }
};

// ---- KernelTable adapter: the caller has checked dtypes and devices.
void count_nonfinite_cuda(const Tensor& x, const Tensor& count) {
  CudaCall call("count_nonfinite", {&x, &count});
  const ElemGeometry<1> geo = make_elem_geometry<1>({&x});
  dispatch_floating(x.dtype(), "count_nonfinite", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_elementwise<1>(geo,
                          CountNonfinite<T>{static_cast<const T*>(x.raw_data()),
                                            static_cast<unsigned long long*>(count.raw_data())},
                          call.stream(), "count_nonfinite");
  });
}

}  // namespace

TESSEL_REGISTER_KERNEL(count_nonfinite, DeviceType::CUDA, count_nonfinite_cuda);

}  // namespace tessel::kernels::cuda
