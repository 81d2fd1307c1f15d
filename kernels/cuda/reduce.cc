// Registers the CUDA reductions (reduce.cu).
#include "kernels/cuda/call.h"
#include "kernels/cuda/geometry_build.h"
#include "kernels/cuda/reduce_launch.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

namespace tessel::kernels::cuda {
namespace {

void reduce_cuda(ReduceOp op, const Tensor& x, const Tensor& out, int v) {
  CudaCall call("reduce", {&x, &out});
  TESSEL_CHECK(x.dim() == out.dim(), "reduce", "input {} and output {} must have the same rank (keepdim form)",
               x.desc(), out.desc());
  const DType want = is_floating(x.dtype()) || op != ReduceOp::Sum ? x.dtype() : DType::Int64;
  TESSEL_CHECK(out.dtype() == want, "reduce", "output {} must be {} for input {}", out.desc(), dtype_name(want),
               x.desc());
  if (out.numel() == 0) return;
  if (x.numel() == 0) {  // empty reduction: the identity (sum only; max/min are rejected by the op layer)
    fill(out.device(), out, Scalar(0));
    return;
  }
  const ReduceGeometry g = make_reduce_geometry(x.shape(), x.strides(), out.shape(), out.strides());
  const ReducePath path = choose_reduce_path(g);
  const size_t ws = reduce_workspace_bytes(path, x.dtype(), g, v);
  Tensor work = ws ? scratch(call, Dims{int64_t(ws)}, DType::Bool) : Tensor();
  launch_reduce(op, x.dtype(), path, g, x.raw_data(), out.raw_data(), v, ws ? work.raw_data() : nullptr,
                call.stream());
}

void arg_reduce_cuda(const Tensor& x, int64_t dim, bool is_max, const Tensor& out) {
  const char* name = is_max ? "argmax" : "argmin";
  CudaCall call(name, {&x, &out});
  const int d = wrap_dim(dim, x.dim(), name);
  TESSEL_CHECK(out.dtype() == DType::Int64 && out.dim() == x.dim(), name, "output {} must be int64 in keepdim form",
               out.desc());
  launch_arg_reduce(x.dtype(), make_row_geometry<2>(x.shape(), d, {&x.strides(), &out.strides()}), x.raw_data(),
                    static_cast<int64_t*>(out.raw_data()), is_max, call.stream());
}

}  // namespace

TESSEL_REGISTER_KERNEL(reduce, DeviceType::CUDA, reduce_cuda);
TESSEL_REGISTER_KERNEL(arg_reduce, DeviceType::CUDA, arg_reduce_cuda);

}  // namespace tessel::kernels::cuda
