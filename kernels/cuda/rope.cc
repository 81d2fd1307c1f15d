// Registers the CUDA rotary embedding kernel (rope.cu).
#include <limits>

#include "kernels/cuda/call.h"
#include "kernels/cuda/rope_launch.h"
#include "kernels/elementwise.h"
#include "kernels/rope.h"

namespace tessel::kernels::cuda {
namespace {

void rope_apply_cuda(const Tensor& x, const Tensor& cos_t, const Tensor& sin_t, const Tensor& positions,
                     int64_t offset, bool interleaved, bool inverse, const Tensor& out) {
  CudaCall call("apply_rotary", {&x, &cos_t, &sin_t, &positions, &out});
  TESSEL_CHECK(x.dim() == 4 && out.shape() == x.shape() && out.is_contiguous() && cos_t.is_contiguous() &&
                   sin_t.is_contiguous() && cos_t.shape() == sin_t.shape() && cos_t.dim() == 2 &&
                   2 * cos_t.shape()[1] <= x.shape()[3] && cos_t.dtype() == accumulate_dtype(x.dtype()),
               "rope_apply", "bad arguments x {}, cos {}, sin {}, out {}", x.desc(), cos_t.desc(), sin_t.desc(),
               out.desc());
  if (x.numel() == 0) return;
  RopeArgs a;
  a.B = x.shape()[0];
  a.T = x.shape()[1];
  a.H = x.shape()[2];
  a.D = x.shape()[3];
  a.sb = x.strides()[0];
  a.st = x.strides()[1];
  a.sh = x.strides()[2];
  a.sd = x.strides()[3];
  a.half = cos_t.shape()[1];
  a.P = cos_t.shape()[0];
  a.offset = offset;
  a.interleaved = interleaved;
  a.inverse = inverse;
  a.x = x.raw_data();
  a.cos = cos_t.raw_data();
  a.sin = sin_t.raw_data();
  a.out = out.raw_data();
  int64_t bad_bt = -1;
  if (positions.defined()) {
    TESSEL_CHECK(positions.dtype() == DType::Int64 && positions.dim() == 2, "apply_rotary",
                 "positions must be int64 [B, T], got {}", positions.desc());
    a.positions = static_cast<const int64_t*>(positions.raw_data());
    a.psb = positions.strides()[0];
    a.pst = positions.strides()[1];
    const int64_t none = std::numeric_limits<int64_t>::max();
    Tensor bad = upload(call, &none, Dims{}, DType::Int64);
    launch_rope_check(a, static_cast<int64_t*>(bad.raw_data()), call.stream());
    int64_t v = none;
    read_back(call, bad, &v, sizeof(v));
    if (v != none) bad_bt = v;
  } else if (a.T > 0 && (offset < 0 || offset + a.T > a.P)) {
    bad_bt = offset < 0 || offset >= a.P ? 0 : a.P - offset;  // batch 0, the first time step outside the table
  }
  if (bad_bt >= 0) {
    const int64_t b = bad_bt / a.T, t = bad_bt % a.T;
    int64_t pos = offset + t;
    if (positions.defined()) {
      Tensor one = scratch(call, Dims{1}, DType::Int64);
      copy(call.dev(), raw::narrow(raw::select(positions, 0, b), 0, t, 1), one);
      read_back(call, one, &pos, sizeof(pos));
    }
    TESSEL_FAIL("apply_rotary",
                "position {} of token (batch {}, time {}) is outside the cos/sin tables, which cover positions [0, {})",
                pos, b, t, a.P);
  }
  launch_rope(x.dtype(), a, call.stream());
}

}  // namespace

TESSEL_REGISTER_KERNEL(rope_apply, DeviceType::CUDA, rope_apply_cuda);

}  // namespace tessel::kernels::cuda
