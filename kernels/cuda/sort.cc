// Registers the CUDA sort / topk kernels (sort.cu).
#include "kernels/cuda/call.h"
#include "kernels/cuda/geometry_build.h"
#include "kernels/cuda/sort_launch.h"
#include "kernels/sort.h"

namespace tessel::kernels::cuda {
namespace {

void run(const CudaCall& call, const Tensor& x, int d, const Tensor& values, const Tensor& indices, bool descending,
         int64_t count, bool by_index_after) {
  const RowGeometry<3> g = make_row_geometry<3>(x.shape(), d, {&x.strides(), &values.strides(), &indices.strides()});
  Tensor work = scratch(call, Dims{int64_t(sort_workspace_bytes(x.dtype(), g.rows, g.n, count))}, DType::Bool);
  launch_sort(x.dtype(), g, x.raw_data(), values.raw_data(), static_cast<int64_t*>(indices.raw_data()), descending,
              count, by_index_after, work.raw_data(), call.stream());
}

void sort_cuda(const Tensor& x, int64_t dim, bool descending, const Tensor& values, const Tensor& indices) {
  CudaCall call("sort", {&x, &values, &indices});
  const int d = wrap_dim(dim, x.dim(), "sort");
  TESSEL_CHECK(values.shape() == x.shape() && indices.shape() == x.shape() && indices.dtype() == DType::Int64 &&
                   values.dtype() == x.dtype(),
               "sort", "outputs {} and {} do not match input {}", values.desc(), indices.desc(), x.desc());
  if (x.numel() == 0) return;
  run(call, x, d, values, indices, descending, x.shape()[d], false);
}

void topk_cuda(const Tensor& x, int64_t k, int64_t dim, bool largest, bool sorted, const Tensor& values,
               const Tensor& indices) {
  CudaCall call("topk", {&x, &values, &indices});
  const int d = wrap_dim(dim, x.dim(), "topk");
  const int64_t n = x.shape()[d];
  TESSEL_CHECK(k >= 0 && k <= n, "topk", "k = {} is out of range for dimension {} of size {}", k, d, n);
  Dims want = x.shape();
  want[d] = k;
  TESSEL_CHECK(values.shape() == want && indices.shape() == want && indices.dtype() == DType::Int64 &&
                   values.dtype() == x.dtype(),
               "topk", "outputs {} and {} do not match input {} with k = {}", values.desc(), indices.desc(), x.desc(),
               k);
  if (values.numel() == 0) return;
  run(call, x, d, values, indices, largest, k, !sorted);
}

}  // namespace

TESSEL_REGISTER_KERNEL(sort, DeviceType::CUDA, sort_cuda);
TESSEL_REGISTER_KERNEL(topk, DeviceType::CUDA, topk_cuda);

}  // namespace tessel::kernels::cuda
