// CUDA fused causal attention, forward and backward, in the order of
// operations of kernels/attention.h (the CPU kernel's bits for float32:
// docs/design.md §4 level 4). This is the bitwise-mode kernel: exact two-pass
// softmax, every sum over keys or queries the canonical one over the global
// length, no atomics. Mapping:
//
// A piece of the queries (context parallelism, kernels/attention.h): q holds
// the Tq global rows q0 .. q0 + Tq - 1 against all T keys; rows, stats, dq
// and the dS/P' scratch rows are the piece's, and dk/dv sum over the piece's
// queries with the others' chunks as +0 leaves of the global tree.
//
//   forward:   one block per query row (b, h, i): the row's scores in a
//              global scratch row, the max and the canonical sum by the whole
//              block (canonical.cuh), then one thread per d for the chunked
//              FMA sum over keys.
//   backward:  (1) one block per query row: p, p', dp, Dl, dS; dS and p' rows
//              go to [B, Hq, T, T] scratch squares; dq by one thread per d.
//              (2) one block per key column (b, h, j): dk and dv by one
//              thread per d, chunked FMA sums over queries i >= j.
//              (3) with GQA, the canonical sum over each kv head's g query heads.
#include <cstdint>
#include <cuda_runtime.h>

#include "kernels/attention.h"
#include "kernels/canonical.h"
#include "kernels/cuda/call.h"
#include "kernels/cuda/canonical.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/tree_fold.h"
#include "runtime/dtype.h"
#include "runtime/philox.h"
#include "runtime/tmath.h"

// ---- launch interface: what the adapters at the end call ----
// The order of operations is kernels/attention.h's,
// so float32 results equal the CPU kernel's bit for bit (docs/design.md §4 level 4).
namespace tessel::kernels::cuda {

// Element (b, h, t, d) of a [B, H, T, D] operand sits at
// b * s[0] + h * s[1] + t * s[2] + d * s[3] (elements).
struct AttnOperand {
  const void* data = nullptr;
  int64_t s[4] = {0, 0, 0, 0};
};

struct Strides4 {
  int64_t s[4] = {0, 0, 0, 0};
};

struct AttentionArgs {
  int64_t B = 0, Hq = 0, Hkv = 0, T = 0, D = 0;  // T: the keys (the global length)
  int64_t Tq = 0, q0 = 0;                        // the query rows: global rows q0 .. q0 + Tq - 1
  double scale = 1.0;
  int chunks = 16;
  bool dropout = false;
  PhiloxKey key{};
  uint32_t keep_threshold = 0;
  double dropout_scale = 1.0;
  AttentionDropoutIndex index;
  AttnOperand q, k, v;
};

// out: [B, Hq, Tq, D] with strides out_s; stats: contiguous [B, Hq, Tq, 2] of the
// compute type; rowbuf: device scratch of `blocks` * T compute-type values
// (one row of scores per block; attention_forward_blocks() gives `blocks`).
int64_t attention_forward_blocks(const AttentionArgs& a);
void launch_attention_forward(DType dtype, const AttentionArgs& a, void* out, const int64_t out_s[4], void* stats,
                              void* rowbuf, cudaStream_t stream);

// Backward. dout: [B, Hq, Tq, D]; scratch (compute type, device):
//   ds, pd: B * Hq * Tq * T values each (the dS and P' rows, causal part used),
//   rowbuf: attention_backward_blocks() * 2 * T values,
//   dkh, dvh: B * Hq * T * D values each when Hq != Hkv (per query head), else null.
// dq: [B, Hq, Tq, D]; dk, dv: [B, Hq|Hkv, T, D]; with the given strides.
int64_t attention_backward_blocks(const AttentionArgs& a);
struct AttentionBackwardOut {
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;
  int64_t dq_s[4], dk_s[4], dv_s[4];
};
void launch_attention_backward(DType dtype, const AttentionArgs& a, const AttnOperand& dout, const void* stats,
                               void* ds, void* pd, void* rowbuf, void* dkh, void* dvh, const AttentionBackwardOut& o,
                               cudaStream_t stream);

}  // namespace tessel::kernels::cuda

namespace tessel::kernels::cuda {
namespace {

constexpr int kAttnThreads = 128;
// Row scratch is per block: this many blocks at most (grid-stride over rows).
constexpr int64_t kAttnMaxBlocks = 4096;

__device__ __forceinline__ float fma_c(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double fma_c(double a, double b, double c) { return fma(a, b, c); }

// Chunked FMA sum over positions [0, n) with V chunks where only t in [lo, hi)
// contribute (kernels/cpu/attention_ref.h chunked_fma); the chunk values are
// folded as they come (tree_fold.h, the balanced tree of tree_combine).
template <class C, class A, class B>
__device__ C chunked_fma(int64_t n, int V, int64_t lo, int64_t hi, A a, B b) {
  TreeFold<C> tree(log2_exact(V));
  for (int c = 0; c < V; ++c) {
    C acc = C(0);
    const int64_t cb = numerics::chunk_begin(n, V, c), ce = numerics::chunk_end(n, V, c);
    for (int64_t t = cb < lo ? lo : cb; t < ce && t < hi; ++t) acc = fma_c(a(t), b(t), acc);
    tree.feed(c, acc);
  }
  return tree.finish();
}

template <class T>
__device__ __forceinline__ const T* at(const AttnOperand& x, int64_t b, int64_t h, int64_t t) {
  return static_cast<const T*>(x.data) + b * x.s[0] + h * x.s[1] + t * x.s[2];
}

__device__ __forceinline__ bool keep(const AttentionArgs& a, int64_t b, int64_t h, int64_t i, int64_t j) {
  return (philox::bits_at(a.key, a.index(b, h, i, j)) >> 8) < a.keep_threshold;
}

// One FMA per d ascending from +0 over a row held in shared memory and a row in global memory.
template <class C, class T>
__device__ __forceinline__ C dot_chain(const C* x, const T* y, int64_t ys, int64_t D) {
  C acc = C(0);
  for (int64_t d = 0; d < D; ++d) acc = fma_c(x[d], C(widen(y[d * ys])), acc);
  return acc;
}

template <class T>
__global__ void attn_forward_kernel(AttentionArgs a, T* out, Strides4 os, acc_t<T>* stats, acc_t<T>* rowbuf) {
  using C = acc_t<T>;
  C* smem = shared_array<C>();  // [V] reduction scratch, then q_i [D]
  C* qrow = smem + a.chunks;
  C* s = rowbuf + int64_t(blockIdx.x) * a.T;
  const int64_t rows = a.B * a.Hq * a.Tq, g = a.Hq / a.Hkv, D = a.D;
  const C scale = C(a.scale), dscale = C(a.dropout_scale);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    // il: the piece's row, i: its global row (the keys it sees: 0 .. i).
    const int64_t il = r % a.Tq, i = a.q0 + il, bh = r / a.Tq, h = bh % a.Hq, b = bh / a.Hq, hk = h / g, n = i + 1;
    const T* qi = at<T>(a.q, b, h, il);
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) qrow[d] = C(widen(qi[d * a.q.s[3]]));
    __syncthreads();
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s[j] = dot_chain(qrow, at<T>(a.k, b, hk, j), a.k.s[3], D) * scale;
    __syncthreads();
    const C m = block_row_max<C>(n, a.chunks, [&](int64_t t) { return s[t]; }, smem);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s[j] = tmath::exp(s[j] - m);
    __syncthreads();
    const C l = block_canonical_reduce<C>(
        a.T, a.chunks, C(0), [&](int64_t t) { return t < n ? s[t] : C(0); }, SumCombine<C>(), smem);
    const C rcp = C(1) / l;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const C p = s[j] * rcp;
      s[j] = !a.dropout ? p : (keep(a, b, h, il, j) ? p * dscale : C(0));
    }
    __syncthreads();
    const T* vb = at<T>(a.v, b, hk, 0);
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      const C o = chunked_fma<C>(
          a.T, a.chunks, 0, n, [&](int64_t t) { return s[t]; },
          [&](int64_t t) { return C(widen(vb[t * a.v.s[2] + d * a.v.s[3]])); });
      out[b * os.s[0] + h * os.s[1] + il * os.s[2] + d * os.s[3]] = narrow<T>(o);
    }
    if (threadIdx.x == 0) {
      stats[2 * r] = m;
      stats[2 * r + 1] = l;
    }
    __syncthreads();  // s and qrow belong to the next row
  }
}

// Backward (1): per query row, dS and P' rows and dq.
template <class T>
__global__ void attn_backward_rows_kernel(AttentionArgs a, AttnOperand dout, const acc_t<T>* stats, acc_t<T>* DS,
                                          acc_t<T>* PD, acc_t<T>* rowbuf, T* dq, Strides4 qs) {
  using C = acc_t<T>;
  C* smem = shared_array<C>();  // [V], q_i [D], dO_i [D]
  C* qrow = smem + a.chunks;
  C* dorow = qrow + a.D;
  C* P = rowbuf + int64_t(blockIdx.x) * 2 * a.T;
  C* DP = P + a.T;
  const int64_t rows = a.B * a.Hq * a.Tq, g = a.Hq / a.Hkv, D = a.D, Tn = a.T;
  const C scale = C(a.scale), dscale = C(a.dropout_scale);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t il = r % a.Tq, i = a.q0 + il, bh = r / a.Tq, h = bh % a.Hq, b = bh / a.Hq, hk = h / g, n = i + 1;
    const T* qi = at<T>(a.q, b, h, il);
    const T* doi = at<T>(dout, b, h, il);
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      qrow[d] = C(widen(qi[d * a.q.s[3]]));
      dorow[d] = C(widen(doi[d * dout.s[3]]));
    }
    __syncthreads();
    const C m = stats[2 * r], l = stats[2 * r + 1];
    const C rcp = C(1) / l;
    C* dsr = DS + r * Tn;
    C* pdr = PD + r * Tn;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const C sj = dot_chain(qrow, at<T>(a.k, b, hk, j), a.k.s[3], D) * scale;
      const C p = tmath::exp(sj - m) * rcp;
      const C gj = dot_chain(dorow, at<T>(a.v, b, hk, j), a.v.s[3], D);
      const bool kp = a.dropout && keep(a, b, h, il, j);
      const C pd = !a.dropout ? p : (kp ? p * dscale : C(0));
      const C dp = !a.dropout ? gj : (kp ? gj * dscale : C(0));
      P[j] = p;
      DP[j] = dp;
      dsr[j] = dp * p;
      pdr[j] = pd;
    }
    __syncthreads();
    const C Dl = block_canonical_reduce<C>(
        Tn, a.chunks, C(0), [&](int64_t t) { return t < n ? dsr[t] : C(0); }, SumCombine<C>(), smem);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) dsr[j] = (P[j] * (DP[j] - Dl)) * scale;
    __syncthreads();
    const T* kb = at<T>(a.k, b, hk, 0);
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      const C v = chunked_fma<C>(
          Tn, a.chunks, 0, n, [&](int64_t t) { return dsr[t]; },
          [&](int64_t t) { return C(widen(kb[t * a.k.s[2] + d * a.k.s[3]])); });
      dq[b * qs.s[0] + h * qs.s[1] + il * qs.s[2] + d * qs.s[3]] = narrow<T>(v);
    }
    __syncthreads();
  }
}

// Backward (2): per key column (b, h, j) of a query head, dk and dv over the
// piece's queries i >= j (global rows; the chunks are the global length's).
// With g == 1 they are the results; else per-head values.
template <class T>
__global__ void attn_backward_cols_kernel(AttentionArgs a, AttnOperand dout, const acc_t<T>* DS, const acc_t<T>* PD,
                                          T* dk, Strides4 ks, T* dv, Strides4 vs, acc_t<T>* dkh, acc_t<T>* dvh) {
  using C = acc_t<T>;
  const int64_t cols = a.B * a.Hq * a.T, g = a.Hq / a.Hkv, D = a.D, Tn = a.T;
  for (int64_t r = blockIdx.x; r < cols; r += gridDim.x) {
    const int64_t j = r % Tn, bh = r / Tn, h = bh % a.Hq, b = bh / a.Hq;
    // dS[global row t][j] at dsc[(t - q0) * T]; the piece's rows only.
    const C* dsc = DS + bh * a.Tq * Tn + j - a.q0 * Tn;
    const C* pdc = PD + bh * a.Tq * Tn + j - a.q0 * Tn;
    const T* qb = at<T>(a.q, b, h, 0) - a.q0 * a.q.s[2];  // global row t at qb[t * s2]
    const T* dob = at<T>(dout, b, h, 0) - a.q0 * dout.s[2];
    const int64_t lo = j > a.q0 ? j : a.q0, hi = a.q0 + a.Tq;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      const C k_ = chunked_fma<C>(
          Tn, a.chunks, lo, hi, [&](int64_t t) { return dsc[t * Tn]; },
          [&](int64_t t) { return C(widen(qb[t * a.q.s[2] + d * a.q.s[3]])); });
      const C v_ = chunked_fma<C>(
          Tn, a.chunks, lo, hi, [&](int64_t t) { return pdc[t * Tn]; },
          [&](int64_t t) { return C(widen(dob[t * dout.s[2] + d * dout.s[3]])); });
      if (g == 1) {
        dk[b * ks.s[0] + h * ks.s[1] + j * ks.s[2] + d * ks.s[3]] = narrow<T>(k_);
        dv[b * vs.s[0] + h * vs.s[1] + j * vs.s[2] + d * vs.s[3]] = narrow<T>(v_);
      } else {
        dkh[r * D + d] = k_;
        dvh[r * D + d] = v_;
      }
    }
  }
}

// Backward (3), GQA: dk/dv of kv head hk = the canonical sum (V chunks over
// the g values) of its query heads' values, in head order.
template <class T>
__global__ void attn_backward_gqa_kernel(AttentionArgs a, const acc_t<T>* dkh, const acc_t<T>* dvh, T* dk, Strides4 ks,
                                         T* dv, Strides4 vs) {
  using C = acc_t<T>;
  const int64_t g = a.Hq / a.Hkv, T_ = a.T, D = a.D, total = a.B * a.Hkv * T_ * D;
  const int64_t stride = T_ * D;  // between the g query heads of one kv head
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = e % D, j = (e / D) % T_, hk = (e / (D * T_)) % a.Hkv, b = e / (D * T_ * a.Hkv);
    const int64_t base = ((b * a.Hq + hk * g) * T_ + j) * D + d;
    for (int w = 0; w < 2; ++w) {
      const C* x = (w == 0 ? dkh : dvh) + base;
      TreeFold<C> tree(log2_exact(a.chunks));
      for (int c = 0; c < a.chunks; ++c)
        tree.feed(c, chunk_reduce_ref<C>(
                         numerics::chunk_begin(g, a.chunks, c), numerics::chunk_end(g, a.chunks, c), C(0),
                         [&](int64_t t) { return x[t * stride]; }, SumCombine<C>()));
      const C sum = tree.finish();
      if (w == 0) dk[b * ks.s[0] + hk * ks.s[1] + j * ks.s[2] + d * ks.s[3]] = narrow<T>(sum);
      else dv[b * vs.s[0] + hk * vs.s[1] + j * vs.s[2] + d * vs.s[3]] = narrow<T>(sum);
    }
  }
}

Strides4 strides4(const int64_t s[4]) {
  Strides4 r;
  for (int i = 0; i < 4; ++i) r.s[i] = s[i];
  return r;
}

}  // namespace

int64_t attention_forward_blocks(const AttentionArgs& a) {
  const int64_t rows = a.B * a.Hq * a.Tq;
  return rows < kAttnMaxBlocks ? (rows < 1 ? 1 : rows) : kAttnMaxBlocks;
}
int64_t attention_backward_blocks(const AttentionArgs& a) { return attention_forward_blocks(a); }

void launch_attention_forward(DType dtype, const AttentionArgs& a, void* out, const int64_t out_s[4], void* stats,
                              void* rowbuf, cudaStream_t s) {
  if (a.B * a.Hq * a.Tq == 0) return;
  const char* op = "scaled_dot_product_attention";
  dispatch_floating(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = acc_t<T>;
    const size_t smem = size_t(a.chunks + a.D) * sizeof(C);
    attn_forward_kernel<T><<<unsigned(attention_forward_blocks(a)), kAttnThreads, smem, s>>>(
        a, static_cast<T*>(out), strides4(out_s), static_cast<C*>(stats), static_cast<C*>(rowbuf));
    TESSEL_CUDA_CHECK_LAUNCH(op);
  });
}

void launch_attention_backward(DType dtype, const AttentionArgs& a, const AttnOperand& dout, const void* stats,
                               void* ds, void* pd, void* rowbuf, void* dkh, void* dvh, const AttentionBackwardOut& o,
                               cudaStream_t s) {
  if (a.B * a.Hq * a.T == 0) return;  // no keys (a piece of no rows still writes dk, dv: +0)
  const char* op = "scaled_dot_product_attention backward";
  dispatch_floating(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = acc_t<T>;
    const unsigned blocks = unsigned(attention_backward_blocks(a));
    attn_backward_rows_kernel<T><<<blocks, kAttnThreads, size_t(a.chunks + 2 * a.D) * sizeof(C), s>>>(
        a, dout, static_cast<const C*>(stats), static_cast<C*>(ds), static_cast<C*>(pd), static_cast<C*>(rowbuf),
        static_cast<T*>(o.dq), strides4(o.dq_s));
    TESSEL_CUDA_CHECK_LAUNCH(op);
    const int64_t cols = a.B * a.Hq * a.T;
    attn_backward_cols_kernel<T><<<unsigned(cols < kMaxBlocks ? cols : kMaxBlocks), kAttnThreads, 0, s>>>(
        a, dout, static_cast<const C*>(ds), static_cast<const C*>(pd), static_cast<T*>(o.dk), strides4(o.dk_s),
        static_cast<T*>(o.dv), strides4(o.dv_s), static_cast<C*>(dkh), static_cast<C*>(dvh));
    TESSEL_CUDA_CHECK_LAUNCH(op);
    if (a.Hq != a.Hkv) {
      attn_backward_gqa_kernel<T><<<grid_blocks(a.B * a.Hkv * a.T * a.D), kThreads, 0, s>>>(
          a, static_cast<const C*>(dkh), static_cast<const C*>(dvh), static_cast<T*>(o.dk), strides4(o.dk_s),
          static_cast<T*>(o.dv), strides4(o.dv_s));
      TESSEL_CUDA_CHECK_LAUNCH(op);
    }
  });
}

}  // namespace tessel::kernels::cuda

// ---- KernelTable adapters: register the CUDA fused causal attention kernels: the
// bitwise-mode attention of the GPU (kernels/attention.h's order, the CPU's
// bits). Fast mode on the GPU uses the composite (cuBLASLt GEMMs + softmax);
// autograd/ops/attention.cc chooses.
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
  check_attention_piece(kOp, q, k, p);
  AttentionArgs a;
  a.B = q.size(0), a.Hq = q.size(1), a.Hkv = k.size(1), a.T = k.size(2), a.D = q.size(3);
  a.Tq = q.size(2), a.q0 = p.q_begin;
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
  if (q.numel() == 0 && k.numel() == 0) return;
  // The dS and P' rows (causal parts used): B * Hq * Tq * T values each.
  Tensor ds = scratch(call, {a.B, a.Hq, a.Tq, a.T}, acc);
  Tensor pd = scratch(call, {a.B, a.Hq, a.Tq, a.T}, acc);
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
