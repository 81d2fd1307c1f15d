#include "autograd/ops/attention.h"

#include <cmath>

#include "autograd/ops/elementwise.h"
#include "autograd/ops/factory.h"
#include "autograd/ops/indexing.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/random.h"
#include "autograd/ops/softmax.h"
#include "autograd/ops/unary.h"

namespace tessel {

namespace {
// [B, Hkv, T, D] -> [B, Hkv * g, T, D], each kv head repeated for its g query heads.
Tensor repeat_kv(const Tensor& x, int64_t g) {
  if (g == 1) return x;
  const Dims& s = x.shape();
  return x.unsqueeze(2).expand({s[0], s[1], g, s[2], s[3]}).reshape({s[0], s[1] * g, s[2], s[3]});
}
}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts) {
  const char* op = "scaled_dot_product_attention";
  TESSEL_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op,
               "expects q, k, v of shape [B, H, T, D], got {}, {}, {}", q.shape(), k.shape(), v.shape());
  const int64_t B = q.size(0), Hq = q.size(1), Tq = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), Tk = k.size(2);
  TESSEL_CHECK(k.size(0) == B && v.size(0) == B && v.size(1) == Hkv && v.size(2) == Tk && k.size(3) == D &&
                   v.size(3) == D,
               op, "inconsistent shapes q {}, k {}, v {}", q.shape(), k.shape(), v.shape());
  TESSEL_CHECK(Hkv > 0 && Hq % Hkv == 0, op, "query heads ({}) must be a multiple of key/value heads ({})", Hq, Hkv);
  TESSEL_CHECK(!opts.causal || Tq == Tk, op, "causal attention needs as many queries as keys, got {} and {}", Tq, Tk);
  TESSEL_CHECK(opts.dropout_p >= 0.0 && opts.dropout_p <= 1.0, op, "dropout_p must be in [0, 1], got {}",
               opts.dropout_p);
  const double scale = opts.scale ? *opts.scale : 1.0 / std::sqrt(double(D));
  const int64_t g = Hq / Hkv;

  Tensor kk = repeat_kv(k, g), vv = repeat_kv(v, g);
  Tensor scores = mul(matmul(q, kk.transpose(-2, -1)), scale);  // [B, Hq, Tq, Tk]
  if (opts.causal) {
    Tensor keep = tril(ones({Tq, Tk}, TensorOptions(DType::Bool).with_device(q.device())));
    scores = masked_fill(scores, logical_not(keep), -INFINITY);
  }
  if (opts.mask.defined()) {
    TESSEL_CHECK(opts.mask.dtype() == DType::Bool, op, "mask must be bool (true = attend), got {}", opts.mask.desc());
    scores = masked_fill(scores, logical_not(opts.mask), -INFINITY);
  }
  Tensor p = softmax(scores, -1);
  if (opts.dropout_p > 0.0) p = dropout(p, opts.dropout_p, opts.dropout_key, /*training=*/true, opts.dropout_block);
  return matmul(p, vv);
}

}  // namespace tessel
