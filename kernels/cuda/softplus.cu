// CUDA softplus (kernels/softplus.h): the same scalar reference as the CPU
// (tessel::tmath, --fmad=false), so float32 and the 16-bit dtypes give the
// CPU's bits; float64 goes through CUDA's libm (tmath's double overloads) and
// agrees with the CPU to an ulp. One
// thread per element through launch_elementwise (loops.cuh).
#include "kernels/cuda/call.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/geometry_build.h"
#include "kernels/cuda/loops.cuh"
#include "kernels/softplus.h"

namespace tessel::kernels::cuda {
namespace {

template <class T>
struct SoftplusForward {
  T* out;
  const T* x;
  acc_t<T> beta, threshold;
  __device__ void operator()(const int64_t* off) const {
    out[off[0]] = narrow<T>(softplus_value<acc_t<T>>(acc_t<T>(widen(x[off[1]])), beta, threshold));
  }
};

template <class T>
struct SoftplusBackward {
  T* dx;
  const T* g;
  const T* x;
  acc_t<T> beta, threshold;
  __device__ void operator()(const int64_t* off) const {
    using C = acc_t<T>;
    dx[off[0]] = narrow<T>(softplus_grad<C>(C(widen(g[off[1]])), C(widen(x[off[2]])), beta, threshold));
  }
};

// ---- KernelTable adapters: Tensors -> geometry and raw pointers, on the
// call's stream. The op (autograd/ops/softplus.cc) has checked shapes and
// dtypes.
void softplus_forward_cuda(const Tensor& x, double beta, double threshold, const Tensor& out) {
  CudaCall call("softplus", {&x, &out});
  const ElemGeometry<2> geo = make_elem_geometry<2>({&out, &x});
  dispatch_floating(x.dtype(), "softplus", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = acc_t<T>;
    launch_elementwise<2>(
        geo, SoftplusForward<T>{static_cast<T*>(out.raw_data()), static_cast<const T*>(x.raw_data()), C(beta),
                                C(threshold)},
        call.stream(), "softplus");
  });
}

void softplus_backward_cuda(const Tensor& g, const Tensor& x, double beta, double threshold, const Tensor& dx) {
  CudaCall call("softplus_backward", {&g, &x, &dx});
  const ElemGeometry<3> geo = make_elem_geometry<3>({&dx, &g, &x});
  dispatch_floating(x.dtype(), "softplus_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = acc_t<T>;
    launch_elementwise<3>(geo,
                          SoftplusBackward<T>{static_cast<T*>(dx.raw_data()), static_cast<const T*>(g.raw_data()),
                                              static_cast<const T*>(x.raw_data()), C(beta), C(threshold)},
                          call.stream(), "softplus_backward");
  });
}

}  // namespace

TESSEL_REGISTER_KERNEL(softplus_forward, DeviceType::CUDA, softplus_forward_cuda);
TESSEL_REGISTER_KERNEL(softplus_backward, DeviceType::CUDA, softplus_backward_cuda);

}  // namespace tessel::kernels::cuda
