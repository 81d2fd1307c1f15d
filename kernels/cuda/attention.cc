// Registers the CUDA fused causal attention kernels (attention.cu): the
// bitwise-mode attention of the GPU (kernels/attention.h's order, the CPU's
// bits). Fast mode on the GPU uses the composite (cuBLASLt GEMMs + softmax);
// autograd/ops/attention.cc chooses.
#include "kernels/attention.h"
#include "kernels/canonical.h"
#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/call.h"

namespace tessel::kernels::cuda {
namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

AttnOperand operand(const Tensor& x) {
  AttnOperand o;
  o.data = x.raw_data();
  for (int i = 0; i < 4; ++i) o.s[i] = x.strides()[i];
  return o;
}

void strides_of(const Tensor& x, int64_t* s) {
  for (int i = 0; i < 4; ++i) s[i] = x.strides()[i];
}

AttentionArgs args_of(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p) {
  TESSEL_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.dtype() == k.dtype() && q.dtype() == v.dtype() &&
                   k.shape() == v.shape() && k.size(0) == q.size(0) && k.size(2) == q.size(2) &&
                   k.size(3) == q.size(3) && k.size(1) > 0 && q.size(1) % k.size(1) == 0,
               kOp, "bad arguments q {}, k {}, v {}", q.desc(), k.desc(), v.desc());
  TESSEL_CHECK(p.chunks >= 1 && p.chunks <= kMaxChunks && (p.chunks & (p.chunks - 1)) == 0, kOp,
               "V = {} must be a power of two in [1, {}]", p.chunks, kMaxChunks);
  AttentionArgs a;
  a.B = q.size(0), a.Hq = q.size(1), a.Hkv = k.size(1), a.T = q.size(2), a.D = q.size(3);
  a.scale = p.scale;
  a.chunks = p.chunks;
  a.dropout = p.dropout;
  a.key = p.key;
  a.keep_threshold = p.keep_threshold;
  a.dropout_scale = p.dropout_scale;
  a.index = attention_dropout_index(p.block, a.B, a.Hq, a.T);
  a.q = operand(q), a.k = operand(k), a.v = operand(v);
  return a;
}

void attention_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p,
                            const Tensor& out, const Tensor& stats) {
  CudaCall call(kOp, {&q, &k, &v, &out, &stats});
  const AttentionArgs a = args_of(q, k, v, p);
  const DType acc = accumulate_dtype(q.dtype());
  TESSEL_CHECK(out.shape() == q.shape() && out.dtype() == q.dtype() && stats.is_contiguous() &&
                   stats.dtype() == acc && stats.shape() == Dims({a.B, a.Hq, a.T, 2}),
               kOp, "bad outputs out {}, stats {} for q {}", out.desc(), stats.desc(), q.desc());
  if (q.numel() == 0) return;
  Tensor rowbuf = scratch(call, {attention_forward_blocks(a), a.T}, acc);
  int64_t os[4];
  strides_of(out, os);
  launch_attention_forward(q.dtype(), a, out.raw_data(), os, stats.raw_data(), rowbuf.raw_data(), call.stream());
}

void attention_backward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                             const Tensor& stats, const AttentionParams& p, const Tensor& dq, const Tensor& dk,
                             const Tensor& dv) {
  CudaCall call("scaled_dot_product_attention backward", {&q, &k, &v, &dout, &stats, &dq, &dk, &dv});
  const AttentionArgs a = args_of(q, k, v, p);
  const DType acc = accumulate_dtype(q.dtype());
  TESSEL_CHECK(dout.shape() == q.shape() && dout.dtype() == q.dtype() && dq.shape() == q.shape() &&
                   dk.shape() == k.shape() && dv.shape() == v.shape() && dq.dtype() == q.dtype() &&
                   dk.dtype() == q.dtype() && dv.dtype() == q.dtype() && stats.is_contiguous() &&
                   stats.dtype() == acc && stats.shape() == Dims({a.B, a.Hq, a.T, 2}),
               kOp, "backward: bad arguments dout {}, stats {}, dq {}, dk {}, dv {} for q {}, k {}", dout.desc(),
               stats.desc(), dq.desc(), dk.desc(), dv.desc(), q.desc(), k.desc());
  if (q.numel() == 0) return;
  // The dS and P' squares (lower triangles used): B * Hq * T * T values each.
  Tensor ds = scratch(call, {a.B, a.Hq, a.T, a.T}, acc);
  Tensor pd = scratch(call, {a.B, a.Hq, a.T, a.T}, acc);
  Tensor rowbuf = scratch(call, {attention_backward_blocks(a), 2 * a.T}, acc);
  Tensor dkh, dvh;
  if (a.Hq != a.Hkv) {
    dkh = scratch(call, {a.B, a.Hq, a.T, a.D}, acc);
    dvh = scratch(call, {a.B, a.Hq, a.T, a.D}, acc);
  }
  AttentionBackwardOut o;
  o.dq = dq.raw_data(), o.dk = dk.raw_data(), o.dv = dv.raw_data();
  strides_of(dq, o.dq_s);
  strides_of(dk, o.dk_s);
  strides_of(dv, o.dv_s);
  launch_attention_backward(q.dtype(), a, operand(dout), stats.raw_data(), ds.raw_data(), pd.raw_data(),
                            rowbuf.raw_data(), dkh.defined() ? dkh.raw_data() : nullptr,
                            dvh.defined() ? dvh.raw_data() : nullptr, o, call.stream());
}

}  // namespace

TESSEL_REGISTER_KERNEL(attention_forward, DeviceType::CUDA, attention_forward_cuda);
TESSEL_REGISTER_KERNEL(attention_backward, DeviceType::CUDA, attention_backward_cuda);

}  // namespace tessel::kernels::cuda
