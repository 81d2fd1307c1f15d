// Registers the CUDA indexing kernels (indexing.cu).
//
// The scatter-adds group positions by destination on the host: the indices
// are copied to the host (one synchronisation per call), sorted by
// (destination, position) -- a unique order, hence deterministic -- and the
// groups uploaded; the sums themselves run on the GPU in the canonical order.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "kernels/cuda/call.h"
#include "kernels/cuda/geometry_build.h"
#include "kernels/cuda/indexing_launch.h"
#include "kernels/elementwise.h"
#include "kernels/indexing.h"

namespace tessel::kernels::cuda {
namespace {

void check_index_dtype(const char* op, const Tensor& index) {
  TESSEL_CHECK(index.dtype() == DType::Int32 || index.dtype() == DType::Int64, op,
               "indices must be int32 or int64, got {}", index.desc());
}

// The indices as host int64 values in row-major order.
std::vector<int64_t> indices_on_host(const CudaCall& call, const Tensor& index) {
  Tensor c = scratch(call, index.shape(), DType::Int64);
  copy(call.dev(), index, c);
  std::vector<int64_t> v(size_t(index.numel()));
  if (!v.empty()) read_back(call, c, v.data(), v.size() * sizeof(int64_t));
  return v;
}

Tensor upload_vec(const CudaCall& call, const std::vector<int64_t>& v) {
  return upload(call, v.data(), Dims{int64_t(v.size())}, DType::Int64);
}

void index_bounds_cuda(const Tensor& index, int64_t limit, int64_t* bad_pos, int64_t* bad_value) {
  CudaCall call("index_bounds", {&index});
  check_index_dtype("index_bounds", index);
  *bad_pos = -1;
  *bad_value = 0;
  if (index.numel() == 0) return;
  Tensor idx = index;
  if (!index.is_contiguous()) {
    idx = scratch(call, index.shape(), index.dtype());
    copy(call.dev(), index, idx);
  }
  const int64_t none = std::numeric_limits<int64_t>::max();
  Tensor bad = upload(call, &none, Dims{}, DType::Int64);
  launch_index_bounds(idx.dtype(), make_elem_geometry<1>({&idx}), idx.raw_data(), limit,
                      static_cast<int64_t*>(bad.raw_data()), call.stream());
  int64_t pos = none;
  read_back(call, bad, &pos, sizeof(pos));
  if (pos == none) return;
  *bad_pos = pos;
  Tensor flat = raw::try_view(idx, Dims{idx.numel()});
  Tensor one = scratch(call, Dims{1}, DType::Int64);
  copy(call.dev(), raw::narrow(flat, 0, pos, 1), one);
  read_back(call, one, bad_value, sizeof(int64_t));
}

void gather_strided_cuda(const Tensor& src, const Tensor& index, int64_t step, int64_t limit, const Tensor& out) {
  CudaCall call("gather", {&src, &index, &out});
  TESSEL_CHECK(src.shape() == out.shape() && index.shape() == out.shape(), "gather",
               "source view {}, index view {} and output {} must have one shape", src.desc(), index.desc(),
               out.desc());
  TESSEL_CHECK(src.dtype() == out.dtype(), "gather", "source {} and output {} differ in dtype", src.desc(), out.desc());
  check_index_dtype("gather", index);
  launch_gather(out.dtype(), index.dtype(), make_elem_geometry<3>({&out, &index, &src}), out.raw_data(),
                index.raw_data(), src.raw_data(), step, limit, call.stream());
}

void index_add_cuda(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, int chunks,
                    bool accumulate) {
  CudaCall call("index_add", {&out, &index, &src});
  const int d = wrap_dim(dim, out.dim(), "index_add");
  TESSEL_CHECK(out.is_contiguous() && src.is_contiguous(), "index_add",
               "kernel needs contiguous output and source, got {} and {}", out.desc(), src.desc());
  TESSEL_CHECK(index.dim() <= 1, "index_add", "index must be 0-D or 1-D, got {}", index.desc());
  TESSEL_CHECK(out.dtype() == src.dtype(), "index_add", "output {} and source {} differ in dtype", out.desc(),
               src.desc());
  check_index_dtype("index_add", index);
  SegmentRowsArgs a;
  a.T = index.numel();
  Dims want = out.shape();
  want[d] = a.T;
  TESSEL_CHECK(src.shape() == want, "index_add", "source {} must have shape {} (output {}, {} indices)", src.desc(),
               want, out.desc(), a.T);
  a.O = 1;
  a.I = 1;
  for (int e = 0; e < d; ++e) a.O *= out.shape()[e];
  for (int e = d + 1; e < out.dim(); ++e) a.I *= out.shape()[e];
  a.R = out.shape()[d];
  if (a.O == 0 || a.R == 0 || a.I == 0) return;
  // Stable counting sort of positions by destination (on the host).
  const std::vector<int64_t> dest = indices_on_host(call, index);
  std::vector<int64_t> offsets(size_t(a.R + 1), 0), perm(size_t(a.T));
  for (int64_t t = 0; t < a.T; ++t) {
    const int64_t r = dest[size_t(t)];
    TESSEL_CHECK(r >= 0 && r < a.R, "index_add", "index {} at position {} is out of range [0, {})", r, t, a.R);
    ++offsets[size_t(r + 1)];
  }
  for (int64_t r = 0; r < a.R; ++r) offsets[size_t(r + 1)] += offsets[size_t(r)];
  std::vector<int64_t> next(offsets.begin(), offsets.end() - 1);
  for (int64_t t = 0; t < a.T; ++t) perm[size_t(next[size_t(dest[size_t(t)])]++)] = t;
  Tensor off_d = upload_vec(call, offsets);
  Tensor perm_d = a.T > 0 ? upload_vec(call, perm) : Tensor();
  a.chunks = chunks;
  a.accumulate = accumulate;
  a.offsets = static_cast<const int64_t*>(off_d.raw_data());
  a.perm = a.T > 0 ? static_cast<const int64_t*>(perm_d.raw_data()) : nullptr;
  a.src = src.raw_data();
  a.out = out.raw_data();
  launch_segment_rows(out.dtype(), a, call.stream());
}

void scatter_add_cuda(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, int chunks,
                      bool accumulate) {
  CudaCall call("scatter_add", {&out, &index, &src});
  const int d = wrap_dim(dim, out.dim(), "scatter_add");
  TESSEL_CHECK(index.dim() == out.dim() && src.dim() == out.dim(), "scatter_add",
               "output {}, index {} and source {} must have the same rank", out.desc(), index.desc(), src.desc());
  for (int e = 0; e < out.dim(); ++e) {
    TESSEL_CHECK(index.shape()[e] <= src.shape()[e] && (e == d || index.shape()[e] <= out.shape()[e]), "scatter_add",
                 "index {} does not fit source {} / output {} at dimension {}", index.desc(), src.desc(), out.desc(),
                 e);
  }
  TESSEL_CHECK(out.dtype() == src.dtype(), "scatter_add", "output {} and source {} differ in dtype", out.desc(),
               src.desc());
  check_index_dtype("scatter_add", index);
  if (!accumulate) fill(out.device(), out, Scalar(0));
  if (index.numel() == 0) return;
  const int nd = index.dim();
  const int64_t Tn = index.shape()[d], R = out.shape()[d];
  const std::vector<int64_t> idx = indices_on_host(call, index);  // row-major over index's shape
  // Lines along d: every coordinate of the other dims, row-major.
  int64_t lines = 1;
  for (int e = 0; e < nd; ++e)
    if (e != d) lines *= index.shape()[e];
  const int64_t istride_d = [&] {  // row-major stride of d in the contiguous host copy
    int64_t s = 1;
    for (int e = nd - 1; e > d; --e) s *= index.shape()[e];
    return s;
  }();
  std::vector<int64_t> begin{0}, pos, src_base, out_off;
  std::vector<std::pair<int64_t, int64_t>> pairs(static_cast<size_t>(Tn));
  for (int64_t line = 0; line < lines; ++line) {
    // Coordinates of this line (dim d = 0) -> offsets in the host copy, src and out.
    int64_t rem = line, host_off = 0, soff = 0, ooff = 0, hs = 1;
    for (int e = nd - 1; e >= 0; --e) {
      if (e == d) {
        hs *= index.shape()[e];
        continue;
      }
      const int64_t c = rem % index.shape()[e];
      rem /= index.shape()[e];
      host_off += c * hs;
      soff += c * src.strides()[e];
      ooff += c * out.strides()[e];
      hs *= index.shape()[e];
    }
    for (int64_t t = 0; t < Tn; ++t) {
      const int64_t v = idx[size_t(host_off + t * istride_d)];
      TESSEL_CHECK(v >= 0 && v < R, "scatter_add", "index {} is out of range [0, {})", v, R);
      pairs[size_t(t)] = {v, t};
    }
    std::sort(pairs.begin(), pairs.end());  // (destination, t) pairs are distinct: one order only
    for (int64_t k = 0; k < Tn;) {
      const int64_t r = pairs[size_t(k)].first;
      int64_t e = k;
      while (e < Tn && pairs[size_t(e)].first == r) pos.push_back(pairs[size_t(e++)].second);
      begin.push_back(int64_t(pos.size()));
      src_base.push_back(soff);
      out_off.push_back(ooff + r * out.strides()[d]);
      k = e;
    }
  }
  Tensor begin_d = upload_vec(call, begin), pos_d = upload_vec(call, pos), sb_d = upload_vec(call, src_base),
         oo_d = upload_vec(call, out_off);
  SegmentTasksArgs a;
  a.tasks = int64_t(src_base.size());
  a.T = Tn;
  a.src_stride = src.strides()[d];
  a.chunks = chunks;
  a.accumulate = accumulate;
  a.begin = static_cast<const int64_t*>(begin_d.raw_data());
  a.pos = static_cast<const int64_t*>(pos_d.raw_data());
  a.src_base = static_cast<const int64_t*>(sb_d.raw_data());
  a.out_off = static_cast<const int64_t*>(oo_d.raw_data());
  a.src = src.raw_data();
  a.out = out.raw_data();
  // In assign mode out was zeroed above; every hit element is assigned its sum
  // (accumulating into the zero would turn a -0 sum into +0, unlike the CPU).
  launch_segment_tasks(out.dtype(), a, call.stream());
}

void triangle_cuda(const Tensor& x, int64_t k, bool upper, const Tensor& out) {
  const char* name = upper ? "triu" : "tril";
  CudaCall call(name, {&x, &out});
  TESSEL_CHECK(x.dim() >= 2, name, "expects at least 2 dimensions, got {}", x.desc());
  TESSEL_CHECK(x.shape() == out.shape() && x.dtype() == out.dtype(), name, "input {} and output {} differ", x.desc(),
               out.desc());
  TriangleArgs a;
  a.ndim = x.dim();
  a.numel = x.numel();
  for (int d = 0; d < x.dim(); ++d) {
    a.size[d] = x.shape()[d];
    a.xstride[d] = x.strides()[d];
    a.ostride[d] = out.strides()[d];
  }
  a.k = k;
  a.upper = upper;
  launch_triangle(x.dtype(), a, x.raw_data(), out.raw_data(), call.stream());
}

}  // namespace

TESSEL_REGISTER_KERNEL(index_bounds, DeviceType::CUDA, index_bounds_cuda);
TESSEL_REGISTER_KERNEL(gather_strided, DeviceType::CUDA, gather_strided_cuda);
TESSEL_REGISTER_KERNEL(index_add, DeviceType::CUDA, index_add_cuda);
TESSEL_REGISTER_KERNEL(scatter_add, DeviceType::CUDA, scatter_add_cuda);
TESSEL_REGISTER_KERNEL(triangle, DeviceType::CUDA, triangle_cuda);

}  // namespace tessel::kernels::cuda
