// CPU rotary embeddings (order of operations: kernels/rope.h). Parallel over
// (b, t, h) rows; every element is computed independently.
#include "kernels/cpu/row_ops.h"
#include "kernels/rope.h"

namespace tessel::kernels::cpu {
namespace {

template <class T>
void rope_typed(const Tensor& x, const Tensor& cos_t, const Tensor& sin_t, const Tensor& positions, int64_t offset,
                bool interleaved, bool inverse, const Tensor& out) {
  using C = compute_t<T>;
  const int64_t B = x.shape()[0], T_ = x.shape()[1], H = x.shape()[2], D = x.shape()[3];
  const int64_t half = cos_t.shape()[1], R = 2 * half;
  const int64_t sb = x.strides()[0], st = x.strides()[1], sh = x.strides()[2], sd = x.strides()[3];
  const T* xb = static_cast<const T*>(x.raw_data());
  T* ob = static_cast<T*>(out.raw_data());
  const C* cb = static_cast<const C*>(cos_t.raw_data());
  const C* snb = static_cast<const C*>(sin_t.raw_data());
  const int64_t* pb = positions.defined() ? static_cast<const int64_t*>(positions.raw_data()) : nullptr;
  const int64_t psb = pb ? positions.strides()[0] : 0, pst = pb ? positions.strides()[1] : 0;
  const int64_t P = cos_t.shape()[0];
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T_; ++t) {
      const int64_t pos = pb ? pb[b * psb + t * pst] : offset + t;
      // Positions are data (the op can check the offset form, not a
      // positions tensor's values): checked here, before any table read.
      TESSEL_CHECK(pos >= 0 && pos < P, "apply_rotary",
                   "position {} of token (batch {}, time {}) is outside the cos/sin tables, which cover positions "
                   "[0, {})",
                   pos, b, t, P);
    }
  // Element offsets of the pair members within a row.
  const int64_t i1_step = interleaved ? 2 : 1, i2_base = interleaved ? 1 : half;
  parallel_for(B * T_ * H, row_grain(D), [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      const int64_t h = r % H, bt = r / H, t = bt % T_, b = bt / T_;
      const int64_t pos = pb ? pb[b * psb + t * pst] : offset + t;
      const C* c = cb + pos * half;
      const C* s = snb + pos * half;
      const T* xr = xb + b * sb + t * st + h * sh;
      T* orow = ob + r * D;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t j1 = i * i1_step, j2 = i2_base + i * i1_step;
        const C x1 = C(load(xr[j1 * sd])), x2 = C(load(xr[j2 * sd]));
        if (!inverse) {
          orow[j1] = store<T>(x1 * c[i] - x2 * s[i]);
          orow[j2] = store<T>(x2 * c[i] + x1 * s[i]);
        } else {
          orow[j1] = store<T>(x1 * c[i] + x2 * s[i]);
          orow[j2] = store<T>(x2 * c[i] - x1 * s[i]);
        }
      }
      for (int64_t j = R; j < D; ++j) orow[j] = xr[j * sd];
    }
  });
}

void rope_apply_cpu(const Tensor& x, const Tensor& cos_t, const Tensor& sin_t, const Tensor& positions,
                    int64_t offset, bool interleaved, bool inverse, const Tensor& out) {
  if (x.numel() == 0) return;
  dispatch_floating(x.dtype(), "apply_rotary", [&](auto tag) {
    rope_typed<typename decltype(tag)::type>(x, cos_t, sin_t, positions, offset, interleaved, inverse, out);
  });
}

}  // namespace

TESSEL_REGISTER_KERNEL(rope_apply, DeviceType::CPU, rope_apply_cpu);

}  // namespace tessel::kernels::cpu
