#include "autograd/ops/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>
#include <numeric>

#include "autograd/function.h"
#include "autograd/ops/all_to_all.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/factory.h"
#include "autograd/ops/indexing.h"
#include "autograd/ops/join.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/random.h"
#include "autograd/ops/softmax.h"
#include "autograd/ops/unary.h"
#include "autograd/trace.h"
#include "dtensor/ops.h"
#include "dtensor/sharding.h"
#include "kernels/attention.h"
#include "kernels/random.h"
#include "runtime/cost.h"
#include "runtime/numerics.h"

namespace tessel {

namespace {
// [B, Hkv, T, D] -> [B, Hkv * g, T, D], each kv head repeated for its g query heads.
Tensor repeat_kv(const Tensor& x, int64_t g) {
  if (g == 1) return x;
  const Dims& s = x.shape();
  return x.unsqueeze(2).expand({s[0], s[1], g, s[2], s[3]}).reshape({s[0], s[1] * g, s[2], s[3]});
}

// An uninitialised tensor shaped like x whose memory follows x's dimension
// order when x is a permutation of a contiguous layout (else contiguous).
// Attention's q/k/v are head-transposed views of [B, T, H, D] projections;
// giving the output and the gradients the same layout makes the transposes
// back to [B, T, H * D] free views instead of copies.
Tensor empty_like_layout(const Tensor& x) {
  const int n = x.dim();
  int order[kMaxDims];
  std::iota(order, order + n, 0);
  std::stable_sort(order, order + n, [&](int a, int b) { return x.strides()[a] > x.strides()[b]; });
  Dims shape, strides, pos = Dims::filled(n, 0);
  for (int i = 0; i < n; ++i) {
    shape.push_back(x.size(order[i]));
    strides.push_back(x.strides()[order[i]]);
    pos[order[i]] = i;
  }
  if (x.is_contiguous() || !raw::is_contiguous(shape, strides)) return raw::empty(x.shape(), x.dtype(), x.device());
  return raw::permute(raw::empty(shape, x.dtype(), x.device()), pos);
}

// Per mesh dim: a batch shard, or a head shard that cuts query and kv heads
// alike (every group of query heads stays with its kv head), passes
// through to the output; anything else (time, head_dim, Partial, a head
// split that would separate a group from its kv head) is gathered. Each
// piece then computes whole heads: the same bits as one device. Both fused
// ops (bitwise and cuDNN) place their q, k, v and output this way.
Placements whole_head_placements(const ShardingContext& ctx) {
  const Dims& qs = ctx.in[0].shape;
  const int64_t Hkv = ctx.in[1].shape[1], g = Hkv > 0 ? qs[1] / Hkv : 1;
  Placements p = Placements::replicated(ctx.mesh_ndim());
  int64_t head_split = 1;
  for (int m = 0; m < ctx.mesh_ndim(); ++m) {
    const int64_t n = ctx.mesh->shape()[m];
    for (int i = 0; i < 3; ++i) {
      const Placement& x = ctx.in[i].placements[m];
      if (x.is_shard(0)) {
        p[m] = Shard(0);
        break;
      }
      if (x.is_shard(1) && (g == 1 || Hkv % (head_split * n) == 0)) {
        p[m] = Shard(1);
        head_split *= n;
        break;
      }
    }
  }
  return p;
}

thread_local ContextParallelAttentionCount cp_count;

// Whether q is cut along time over some mesh dim of size > 1.
bool cut_along_time(const Tensor& q) {
  if (!q.is_distributed()) return false;
  const Placements& p = q.placements();
  for (int m = 0; m < p.size(); ++m)
    if (p[m].is_shard(2) && q.mesh()->shape()[m] > 1) return true;
  return false;
}

// Context parallelism: the mesh dim that cuts the queries along time, where
// the rule above would gather them (-1: none). One such dim at most; in
// bitwise mode only when every piece owns whole runs of the global chunks
// (dtensor::local_chunks), so that the pieces' dk and dv (sums over their own
// queries, kernels/attention.h) finish the one-device tree when the
// collective adds them in rank order; otherwise the time dim is gathered.
int query_time_cut_dim(const ShardingContext& ctx, const Placements& p, int chunks) {
  int found = -1;
  for (int m = 0; m < ctx.mesh_ndim(); ++m) {
    if (ctx.mesh->shape()[m] == 1 || !p[m].is_replicate() || !ctx.in[0].placements[m].is_shard(2)) continue;
    if (found >= 0) return -1;  // time cut over two mesh dims: gathered
    found = m;
  }
  if (found < 0 || !numerics::bitwise()) return found;
  Placements time = Placements::replicated(ctx.mesh_ndim());
  time[found] = Shard(0);
  return dtensor::local_chunks(Dims{ctx.in[0].shape[2]}, time, *ctx.mesh, {0}, chunks) > 0 ? found : -1;
}

// FLOPs of the fused causal kernels for the planner's counts (runtime/cost.h):
// 4 D per (query, visible key) pair forward (q k^T, p v), 8 D backward.
// Query row q_begin + i sees keys 0 .. min(Tk, q_begin + i + 1) - 1.
void count_attention(const Tensor& q, const Tensor& k, int64_t q_begin, int64_t per_pair_per_dim) {
  if (!cost::active()) return;
  const int64_t Tq = q.size(2), Tk = k.size(2);
  const int64_t n1 = std::clamp<int64_t>(Tk - q_begin, 0, Tq);  // rows that see fewer than Tk keys
  const int64_t pairs = n1 * q_begin + n1 * (n1 + 1) / 2 + (Tq - n1) * Tk;
  cost::add_attention(per_pair_per_dim * q.size(0) * q.size(1) * q.size(3) * pairs);
}

// The fused causal attention (kernels/attention.h has the order of operations).
struct FusedAttentionOp {
  static constexpr const char* kName = "scaled_dot_product_attention";
  kernels::AttentionParams params;
  SavedTensor q, k, v, stats;  // stats: (row max, row sum) per query row

  Tensor forward(const Tensor& q_, const Tensor& k_, const Tensor& v_) {
    Tensor out = empty_like_layout(q_);
    Tensor st = raw::empty({q_.size(0), q_.size(1), q_.size(2), 2}, accumulate_dtype(q_.dtype()), q_.device());
    count_attention(q_, k_, params.q_begin, 4);
    kernels::attention_forward(q_.device(), q_, k_, v_, params, out, st);
    q = q_, k = k_, v = v_, stats = st;
    return out;
  }

  std::vector<Tensor> backward(const GradContext& ctx, std::vector<Tensor>& grads) {
    const Tensor &q_ = q.get(), &k_ = k.get(), &v_ = v.get();
    Tensor g = detail::cast_raw(grads[0], q_.dtype());
    Tensor dq = empty_like_layout(q_), dk = empty_like_layout(k_), dv = empty_like_layout(v_);
    count_attention(q_, k_, params.q_begin, 8);
    kernels::attention_backward(q_.device(), q_, k_, v_, g, stats.get(), params, dq, dk, dv);
    return {ctx.needs(0) ? dq : Tensor(), ctx.needs(1) ? dk : Tensor(), ctx.needs(2) ? dv : Tensor()};
  }

  // Whole heads per piece (whole_head_placements); with context parallelism
  // the queries and the output keep their cut along time while k and v are
  // gathered (their gradients come back as pending sums over that dim).
  ShardingPlan sharding(const ShardingContext& ctx) {
    const Placements p = whole_head_placements(ctx);
    Placements pq = p;
    if (const int m = query_time_cut_dim(ctx, p, params.chunks); m >= 0) {
      pq[m] = Shard(2);
      ++cp_count.local;
    } else {
      for (int d = 0; d < ctx.mesh_ndim(); ++d)
        if (ctx.in[0].placements[d].is_shard(2) && ctx.mesh->shape()[d] > 1) {
          ++cp_count.gathered;
          break;
        }
    }
    const Dims& qs = ctx.in[0].shape;
    const LocalGeometry lg = ctx.local(qs, pq);
    params.q_begin += lg.offset[2];
    if (params.dropout) {  // the probabilities' block moves with the piece's batch, head and query offsets
      if (params.block.is_whole()) {
        params.block = GlobalBlock{{qs[0], qs[1], qs[2], qs[2]}, {lg.offset[0], lg.offset[1], lg.offset[2], 0}};
      } else {
        params.block.offset[0] += lg.offset[0];
        params.block.offset[1] += lg.offset[1];
        params.block.offset[2] += lg.offset[2];
      }
    }
    return {{pq, p, p}, {pq}};
  }
};

// Fast-mode fused attention on a GPU (cuDNN's flash attention,
// kernels/attention.h attention_fast_*): no dropout, same function as the
// composite, not the bitwise order. Saves the output and the row log-sum-exp
// for the backward.
struct FastAttentionOp {
  static constexpr const char* kName = "scaled_dot_product_attention";
  double scale = 1.0;
  SavedTensor q, k, v, out, lse;

  // The library wants the last dim contiguous.
  static Tensor dense_rows(const Tensor& t) { return t.strides()[3] == 1 ? t : t.contiguous(); }

  Tensor forward(const Tensor& q_, const Tensor& k_, const Tensor& v_) {
    const Tensor qd = dense_rows(q_), kd = dense_rows(k_), vd = dense_rows(v_);
    Tensor o = empty_like_layout(qd);
    Tensor l = raw::empty({q_.size(0), q_.size(1), q_.size(2), 1}, DType::Float32, q_.device());
    count_attention(qd, kd, 0, 4);
    kernels::attention_fast_forward(q_.device(), qd, kd, vd, scale, o, l);
    q = qd, k = kd, v = vd, out = o, lse = l;
    return o;
  }

  std::vector<Tensor> backward(const GradContext& ctx, std::vector<Tensor>& grads) {
    const Tensor &q_ = q.get(), &k_ = k.get(), &v_ = v.get();
    Tensor g = dense_rows(detail::cast_raw(grads[0], q_.dtype()));
    Tensor dq = empty_like_layout(q_), dk = empty_like_layout(k_), dv = empty_like_layout(v_);
    count_attention(q_, k_, 0, 8);
    kernels::attention_fast_backward(q_.device(), q_, k_, v_, out.get(), g, lse.get(), scale, dq, dk, dv);
    return {ctx.needs(0) ? dq : Tensor(), ctx.needs(1) ? dk : Tensor(), ctx.needs(2) ? dv : Tensor()};
  }

  // Whole heads per piece, as the bitwise op (no dropout block to move).
  ShardingPlan sharding(const ShardingContext& ctx) {
    const Placements p = whole_head_placements(ctx);
    return {{p, p, p}, {p}};
  }
};

// The fused kernels' parameters for `o` (the caller's dropout block as given;
// the sharding rule or the balanced path moves it to the local piece).
kernels::AttentionParams fused_params(const AttentionOptions& o, double scale) {
  kernels::AttentionParams a;
  a.scale = scale;
  a.chunks = numerics::reduction_chunks();
  if (o.dropout_p > 0.0) {
    a.dropout = true;
    a.key = o.dropout_key;
    a.keep_threshold = kernels::bernoulli_threshold(1.0 - o.dropout_p);
    a.dropout_scale = o.dropout_p == 1.0 ? 0.0 : 1.0 / (1.0 - o.dropout_p);
    a.block = o.dropout_block;
  }
  return a;
}

// ---- Context parallelism with causal load balancing -----------------------------------------
// With the sequence cut into W contiguous pieces, rank r's queries see r + 1
// pieces of keys: the last rank does 2W - 1 times the first one's work. So
// attention cuts the sequence into 2W segments of S = T / 2W positions and
// rank r computes segments r and 2W - 1 - r (the same work on every rank):
// its own piece holds segments 2r and 2r + 1, and an exchange of query rows
// (all_to_all_v over the cp group) brings the two it computes; the output
// rows go back the same way. k and v stay in their pieces: the op
// (ContextParallelAttentionOp) gathers them whole one group of heads at a
// time, for the kernels of both segments, and reduce-scatters each segment's
// dk, dv back.

// The rank that computes segment s of 2W.
int64_t segment_worker(int64_t s, int64_t w) { return s < w ? s : 2 * w - 1 - s; }

// Rows [seg a ; seg b] (each S rows, dim 0) of this rank, sent to the ranks
// that want them and received from the ranks that have them, in the exchange
// order of all_to_all_v (by rank, then by segment). `have` are the segments
// this rank holds in row order, `holder` / `want` say who holds / who wants
// segment s; returns the segments `get`, in that order.
Tensor exchange_segments(const Tensor& rows, const comm::CommPtr& group, int64_t w, int64_t S,
                         const std::vector<int64_t>& have, const std::function<int64_t(int64_t)>& holder,
                         const std::function<int64_t(int64_t)>& want, const std::vector<int64_t>& get) {
  // Send order: by destination rank, then segment.
  std::vector<std::pair<int64_t, int64_t>> out;  // (dest, index in `have`)
  for (size_t i = 0; i < have.size(); ++i) out.push_back({want(have[i]), int64_t(i)});
  std::stable_sort(out.begin(), out.end(), [&](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : have[size_t(a.second)] < have[size_t(b.second)];
  });
  std::vector<Tensor> parts;
  std::vector<int64_t> send(size_t(w), 0), recv(size_t(w), 0);
  for (const auto& [dest, i] : out) {
    parts.push_back(rows.narrow(0, i * S, S));
    send[size_t(dest)] += S;
  }
  for (int64_t s : get) recv[size_t(holder(s))] += S;
  const Tensor got = all_to_all_v(cat(parts, 0), group, send, recv);
  // Received by source rank, then segment; put them in `get`'s order.
  std::vector<int64_t> arrival = get;
  std::stable_sort(arrival.begin(), arrival.end(), [&](int64_t a, int64_t b) {
    return holder(a) != holder(b) ? holder(a) < holder(b) : a < b;
  });
  if (arrival == get) return got;
  std::vector<Tensor> ordered;
  for (int64_t s : get) {
    const int64_t at = int64_t(std::find(arrival.begin(), arrival.end(), s) - arrival.begin());
    ordered.push_back(got.narrow(0, at * S, S));
  }
  return cat(ordered, 0);
}

std::atomic<int64_t> group_bytes{int64_t(16) << 20};  // set_context_parallel_group_bytes

// k and v of one group of kv heads, gathered whole along time over the cp
// group in one all-gather: [B, nh, T, D] views of a time-major [T, B, nh, 2,
// D] buffer (k and v side by side). Started asynchronously (the next group's
// transfer goes on while this group's kernels run, where the backend moves
// data by itself); wait() before use.
struct GatheredKv {
  Tensor k, v;      // [B, nh, T, D]
  Tensor send;      // this rank's time-major piece, alive until the wait
  comm::WorkPtr work;
  void wait() {
    if (work) work->wait();
    work.reset();
    send = Tensor();
  }
  // Lets a backend that advances only when asked (MPI's stages) move the
  // transfer along between two kernels.
  void poll() const {
    if (work) (void)work->is_completed();
  }
  GatheredKv() = default;
  GatheredKv(GatheredKv&&) = default;
  GatheredKv& operator=(GatheredKv&&) = default;
  // Unwinding past a transfer in flight (an error elsewhere): its buffers
  // must outlive it.
  ~GatheredKv() {
    try {
      wait();
    } catch (...) {
    }
  }
};

// A time-major view [T, B, H, D] of slot `i` of a [T, B, H, P, D] buffer, as [B, H, T, D].
Tensor slot(const Tensor& buf, int64_t i) { return raw::permute(raw::select(buf, 3, i), {1, 2, 0, 3}); }

GatheredKv gather_kv(const Tensor& kl, const Tensor& vl, int64_t h0, int64_t nh, const comm::CommPtr& group,
                     int64_t w) {
  GatheredKv g;
  const int64_t L = kl.size(2), B = kl.size(0), D = kl.size(3);
  const Tensor whole = raw::empty({L * w, B, nh, 2, D}, kl.dtype(), kl.device());
  cost::add_comm("all_gather", int64_t(whole.nbytes()));  // the planner's counts (runtime/cost.h)
  if (!kl.device().is_meta()) {  // a step simulated on Meta moves nothing
    g.send = raw::empty({L, B, nh, 2, D}, kl.dtype(), kl.device());
    kernels::copy(kl.device(), raw::narrow(kl, 1, h0, nh), slot(g.send, 0));
    kernels::copy(vl.device(), raw::narrow(vl, 1, h0, nh), slot(g.send, 1));
    g.work = group->all_gather(g.send, whole, /*async=*/true);
  }
  g.k = slot(whole, 0), g.v = slot(whole, 1);
  return g;
}

// Fused attention over a rank's two segments: rows [0, S) of q are global rows
// a*S .., rows [S, 2S) global rows b*S ..; k and v are this rank's own time
// piece (segments 2r and 2r + 1, [B, Hkv, 2S, D]). The kernels' order of
// operations is kernels/attention.h's; what this op adds is where k and v
// live. They are gathered whole along time one group of kv heads at a time
// (the next group's transfer started before this one's kernels), in the
// forward and again in the backward, and never saved: what a layer keeps for
// its backward is its own piece of k and v, so the saved activations fall
// with cp. The backward's dk and dv of each group are reduce-scattered back
// to the pieces in one collective.
//
// Bitwise mode: each segment's dk/dv is a pending sum of its own over the
// ranks -- the first segments (0 .. W-1, in rank order) and the second ones
// (2W-1 .. W, in reverse rank order, whose balanced tree is the mirror of the
// in-order one: the same bits, since a + b == b + a) each finish a half of
// the one-device tree, and adding the two halves is its root (when every
// segment is a whole run of the canonical chunks). With grouped-query
// attention the kernels' backward sees k and v repeated per query head
// (g = 1), and the group sum of the finished per-head gradients comes last,
// as one device's repeat does. Fast mode adds the two segments' gradients
// first and reduce-scatters once, with the kernels' own group sum.
struct ContextParallelAttentionOp {
  static constexpr const char* kName = "scaled_dot_product_attention";
  kernels::AttentionParams pa, pb;  // segment a's and b's (whole heads; a group moves the dropout block's head)
  int64_t S = 0, w = 1;
  bool bitwise = false;
  comm::CommPtr group;
  SavedTensor q, k, v;
  std::vector<SavedTensor> sta, stb;  // per head group: [B, nh * g, S, 2]

  // A group's whole k and v stay under group_bytes where the heads allow (one
  // group for small layers: each group costs a collective each way).
  int64_t groups(const Tensor& kl) const {
    const int64_t whole = 2 * kl.numel() * w * int64_t(itemsize(kl.dtype())), most = group_bytes.load();
    return std::clamp<int64_t>((whole + most - 1) / std::max<int64_t>(most, 1), 1, kl.size(1));
  }
  static std::pair<int64_t, int64_t> group_heads(int64_t i, int64_t n, int64_t Hkv) {  // [h0, h0 + nh)
    const int64_t h0 = i * Hkv / n;
    return {h0, (i + 1) * Hkv / n - h0};
  }
  static kernels::AttentionParams at_heads(kernels::AttentionParams p, int64_t qh0) {
    if (p.dropout) p.block.offset[1] += qh0;
    return p;
  }

  // Runs fn(i, h0, nh, cur, next) for the groups of kv heads [h0, h0 + nh)
  // in order: cur holds group i's k and v gathered, next the transfer of the
  // following group's (started before fn, so it runs while fn's kernels do).
  template <class F>
  void stream_groups(const Tensor& kl, const Tensor& vl, F&& fn) const {
    const int64_t Hkv = kl.size(1), n = groups(kl);
    GatheredKv cur = gather_kv(kl, vl, 0, group_heads(0, n, Hkv).second, group, w);
    for (int64_t i = 0; i < n; ++i) {
      const auto [h0, nh] = group_heads(i, n, Hkv);
      GatheredKv next;
      if (i + 1 < n) {
        const auto [h1, nh1] = group_heads(i + 1, n, Hkv);
        next = gather_kv(kl, vl, h1, nh1, group, w);
      }
      cur.wait();
      fn(i, h0, nh, cur, next);
      cur = std::move(next);
    }
  }

  Tensor forward(const Tensor& q_, const Tensor& k_, const Tensor& v_) {
    const int64_t g = q_.size(1) / k_.size(1);
    Tensor out = empty_like_layout(q_);
    const DType acc = accumulate_dtype(q_.dtype());
    stream_groups(k_, v_, [&](int64_t, int64_t h0, int64_t nh, const GatheredKv& cur, const GatheredKv& next) {
      const Tensor qg = raw::narrow(q_, 1, h0 * g, nh * g), og = raw::narrow(out, 1, h0 * g, nh * g);
      Tensor a = raw::empty({q_.size(0), nh * g, S, 2}, acc, q_.device());
      Tensor b = raw::empty({q_.size(0), nh * g, S, 2}, acc, q_.device());
      count_attention(raw::narrow(qg, 2, 0, S), cur.k, pa.q_begin, 4);
      count_attention(raw::narrow(qg, 2, S, S), cur.k, pb.q_begin, 4);
      kernels::attention_forward(q_.device(), raw::narrow(qg, 2, 0, S), cur.k, cur.v, at_heads(pa, h0 * g),
                                 raw::narrow(og, 2, 0, S), a);
      next.poll();
      kernels::attention_forward(q_.device(), raw::narrow(qg, 2, S, S), cur.k, cur.v, at_heads(pb, h0 * g),
                                 raw::narrow(og, 2, S, S), b);
      sta.emplace_back(a), stb.emplace_back(b);
    });
    q = q_, k = k_, v = v_;
    return out;
  }

  // One group's dk and dv on their way back to the pieces: one reduce-scatter
  // of a time-major [T, B, H, P, D] buffer -- fast mode (dk, dv), bitwise
  // (dk of segment a, of b, dv of a, of b) -- into `piece`.
  struct Returning {
    Tensor piece, sent;  // sent: kept alive until the wait
    comm::WorkPtr work;
    int64_t h0 = 0, nh = 0;
    Returning() = default;
    Returning(Returning&&) = default;
    Returning& operator=(Returning&&) = default;
    ~Returning() {  // as ~GatheredKv: the buffers outlive a transfer in flight
      try {
        if (work) work->wait();
      } catch (...) {
      }
    }
  };

  Returning reduce_scatter_time(const Tensor& full, int64_t h0, int64_t nh) const {
    Returning r;
    r.h0 = h0, r.nh = nh;
    Dims ps = full.shape();
    ps[0] /= w;
    r.piece = raw::empty(ps, full.dtype(), full.device());
    cost::add_comm("reduce_scatter", int64_t(full.nbytes()));
    if (!full.device().is_meta()) {
      r.work = group->reduce_scatter(full, r.piece, comm::ReduceOp::Sum, /*async=*/true);
      r.sent = full;
    }
    return r;
  }

  // Waits for a group's reduce-scatter and writes its dk, dv pieces.
  void finish(Returning& r, const Tensor& dk, const Tensor& dv) const {
    if (r.work) r.work->wait();
    r.work.reset(), r.sent = Tensor();
    const Device dev = dk.device();
    Tensor pk = slot(r.piece, 0), pv = slot(r.piece, 1);
    if (bitwise) {  // (a + b) per query head, then the group sum (one device's repeat backward)
      pk = raw::empty(pk.shape(), dk.dtype(), dev), pv = raw::empty(pv.shape(), dv.dtype(), dev);
      kernels::binary(dev, kernels::BinaryOp::Add, slot(r.piece, 0), slot(r.piece, 1), pk);
      kernels::binary(dev, kernels::BinaryOp::Add, slot(r.piece, 2), slot(r.piece, 3), pv);
      const int64_t gq = pk.size(1) / r.nh;
      if (gq > 1) {
        const Dims s = pk.shape();  // a copy: pk is reassigned below
        const Dims grouped{s[0], r.nh, gq, s[2], s[3]}, summed{s[0], r.nh, 1, s[2], s[3]};
        pk = sum_to(pk.reshape(grouped), summed).reshape({s[0], r.nh, s[2], s[3]});
        pv = sum_to(pv.reshape(grouped), summed).reshape({s[0], r.nh, s[2], s[3]});
      }
    }
    kernels::copy(dev, pk, raw::narrow(dk, 1, r.h0, r.nh));
    kernels::copy(dev, pv, raw::narrow(dv, 1, r.h0, r.nh));
  }

  std::vector<Tensor> backward(const GradContext& ctx, std::vector<Tensor>& grads) {
    const Tensor &q_ = q.get(), &k_ = k.get(), &v_ = v.get();
    const int64_t g = q_.size(1) / k_.size(1);
    const Device dev = q_.device();
    Tensor go = detail::cast_raw(grads[0], q_.dtype());
    Tensor dq = empty_like_layout(q_), dk = empty_like_layout(k_), dv = empty_like_layout(v_);
    Returning pending;
    stream_groups(k_, v_, [&](int64_t i, int64_t h0, int64_t nh, const GatheredKv& cur, const GatheredKv& next) {
      const int64_t r = bitwise ? g : 1;  // the kernels' k, v heads per kv head
      const Tensor kk = repeat_kv(cur.k, r), vv = repeat_kv(cur.v, r);
      const Tensor qg = raw::narrow(q_, 1, h0 * g, nh * g), gg = raw::narrow(go, 1, h0 * g, nh * g),
                   dqg = raw::narrow(dq, 1, h0 * g, nh * g);
      // Time-major gradient slots: bitwise (dk a, dk b, dv a, dv b), reduced
      // apart; fast mode (dk, dv) with segment b's added in first.
      const Dims whole{kk.size(2), kk.size(0), kk.size(1), bitwise ? 4 : 2, kk.size(3)};
      const Tensor sums = raw::empty(whole, k_.dtype(), dev);
      const Tensor second = bitwise ? Tensor() : raw::empty(whole, k_.dtype(), dev);
      count_attention(raw::narrow(qg, 2, 0, S), kk, pa.q_begin, 8);
      count_attention(raw::narrow(qg, 2, S, S), kk, pb.q_begin, 8);
      kernels::attention_backward(dev, raw::narrow(qg, 2, 0, S), kk, vv, raw::narrow(gg, 2, 0, S),
                                  sta[size_t(i)].get(), at_heads(pa, h0 * g), raw::narrow(dqg, 2, 0, S),
                                  slot(sums, 0), bitwise ? slot(sums, 2) : slot(sums, 1));
      next.poll();
      kernels::attention_backward(dev, raw::narrow(qg, 2, S, S), kk, vv, raw::narrow(gg, 2, S, S),
                                  stb[size_t(i)].get(), at_heads(pb, h0 * g), raw::narrow(dqg, 2, S, S),
                                  bitwise ? slot(sums, 1) : slot(second, 0), bitwise ? slot(sums, 3) : slot(second, 1));
      if (!bitwise) kernels::binary(dev, kernels::BinaryOp::Add, sums, second, sums);
      Returning ret = reduce_scatter_time(sums, h0, nh);
      if (pending.piece.defined()) finish(pending, dk, dv);  // the previous group's, while this one's goes
      pending = std::move(ret);
    });
    if (pending.piece.defined()) finish(pending, dk, dv);
    return {ctx.needs(0) ? dq : Tensor(), ctx.needs(1) ? dk : Tensor(), ctx.needs(2) ? dv : Tensor()};
  }
};

// The mesh dim to balance over (-1: none): q, k, v distributed alike, cut
// along time over exactly one mesh dim of size W > 1 into even pieces, every
// other dim whole, a batch shard or a head shard (whole_head_placements'
// cases); the sequence splits into 2W segments -- in bitwise mode, whole runs
// of the canonical chunks.
int balanced_dim(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o, int chunks) {
  // TESSEL_CP_BALANCE=0: contiguous pieces (A/B timing of the balancing).
  static const bool enabled = [] {
    const char* e = std::getenv("TESSEL_CP_BALANCE");
    return !(e && std::string(e) == "0");
  }();
  // An op trace (tessel train --dump) lines its entries up with the one-device
  // run's op by op; the exchange's internal ops have no counterpart there, so
  // a traced run takes the contiguous pieces (the same bits).
  if (trace::current() != nullptr) return -1;
  if (!enabled || !q.is_distributed() || !k.is_distributed() || !v.is_distributed()) return -1;
  if (q.placements() != k.placements() || q.placements() != v.placements()) return -1;
  const Placements& p = q.placements();
  const Mesh& mesh = *q.mesh();
  int m = -1;
  int64_t head_split = 1;
  for (int d = 0; d < p.size(); ++d) {
    if (mesh.size(d) == 1 || p[d].is_replicate() || p[d].is_shard(0)) continue;
    if (p[d].is_shard(1) && !p[d].is_owned()) {
      head_split *= mesh.size(d);
      continue;
    }
    if (!p[d].is_shard(2) || p[d].is_owned() || m >= 0) return -1;
    m = d;
  }
  if (m < 0 || k.size(1) % head_split != 0) return -1;
  return balanced_segments_fit(q.size(2), mesh.size(m), numerics::bitwise(), chunks) ? m : -1;
}

// Bitwise mode repeats k and v per query head inside the op's backward
// (ContextParallelAttentionOp), so the gather moves only the kv heads.
Tensor balanced_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o, double scale,
                          int m) {
  const MeshPtr& mesh = q.mesh();
  const Placements p = q.placements();
  const int64_t w = mesh->size(m), me = mesh->coordinate(m), T = q.size(2), S = T / (2 * w);
  const comm::CommPtr group = mesh->comm(m);
  // This rank's query rows [segment 2me ; 2me + 1] -> [segment me ; 2w - 1 - me], time first.
  const Tensor ql = to_local(q);
  const Tensor rows = ql.permute({2, 0, 1, 3});  // [2S, B, H, D]
  auto holder = [](int64_t s) { return s / 2; };
  auto worker = [w](int64_t s) { return segment_worker(s, w); };
  const Tensor mine =
      exchange_segments(rows, group, w, S, {2 * me, 2 * me + 1}, holder, worker, {me, 2 * w - 1 - me})
          .permute({1, 2, 0, 3});  // [B, H, 2S, D]
  ContextParallelAttentionOp f;
  f.S = S, f.w = w, f.group = group, f.bitwise = numerics::bitwise();
  const kernels::AttentionParams base = fused_params(o, scale);
  const LocalGeometry lg = local_geometry(q.shape(), mesh->shape(), p, mesh->coords());
  f.pa = f.pb = base;
  f.pa.q_begin = me * S;
  f.pb.q_begin = (2 * w - 1 - me) * S;
  if (base.dropout) {  // the probabilities' block: the caller's (a micro-batch's rows), moved to the piece
    const Dims& qs = q.shape();
    GlobalBlock block = base.block.is_whole() ? GlobalBlock{{qs[0], qs[1], T, T}, {0, 0, 0, 0}} : base.block;
    block.offset[0] += lg.offset[0];
    block.offset[1] += lg.offset[1];
    f.pa.block = f.pb.block = block;
    f.pa.block.offset[2] += f.pa.q_begin;
    f.pb.block.offset[2] += f.pb.q_begin;
  }
  // [B, H, 2S, D]: segments me, 2w - 1 - me; k and v stay this rank's pieces.
  const Tensor out = call(std::move(f), mine, to_local(k), to_local(v));
  // The output rows back to their holders: [segment 2me ; 2me + 1].
  const Tensor back = exchange_segments(out.permute({2, 0, 1, 3}), group, w, S, {me, 2 * w - 1 - me}, worker,
                                        holder, {2 * me, 2 * me + 1})
                          .permute({1, 2, 0, 3});
  return from_local(back, mesh, p, q.shape());
}

// TESSEL_ATTENTION=composite turns the fused op off everywhere (A/B timing, debugging).
bool fused_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("TESSEL_ATTENTION");
    return !(e && std::string(e) == "composite");
  }();
  return on;
}

bool use_fused(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  if (!o.fused || !o.causal || o.mask.defined() || !fused_enabled()) return false;
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype() || !q.is_floating_point()) return false;
  if (q.device() != k.device() || q.device() != v.device()) return false;
  if (q.device().is_meta()) return true;
  if (!kernels::attention_forward.has(q.device().type)) return false;
  // On a GPU the fused kernel is the bitwise-mode attention (the CPU kernel's
  // order and bits); fast mode keeps the composite, whose GEMMs run on
  // cuBLASLt tensor cores (docs/cuda.md).
  return q.device().type != DeviceType::CUDA || numerics::gemm_mode() == numerics::GemmMode::Bitwise;
}

// cuDNN's flash attention: a GPU in fast GEMM mode, causal, no explicit mask
// or dropout, a 16-bit dtype and head_dim the library takes.
bool use_fast_fused(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  if (!o.fused || !o.causal || o.mask.defined() || o.dropout_p > 0.0 || !fused_enabled()) return false;
  if (q.device().type != DeviceType::CUDA || numerics::gemm_mode() != numerics::GemmMode::Fast) return false;
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype() || q.device() != k.device() || q.device() != v.device())
    return false;
  if (!kernels::attention_fast_forward.has(DeviceType::CUDA)) return false;
  bool ok = false;
  kernels::attention_fast_applies(q.device(), kernels::FastAttentionShape{q.dtype(), q.size(0), q.size(1), k.size(1),
                                                                          q.size(2), q.size(3)},
                                  &ok);
  return ok;
}
}  // namespace

bool balanced_segments_fit(int64_t seq_len, int64_t cp, bool bitwise, int chunks) {
  const int64_t segments = 2 * cp;
  if (cp < 1 || seq_len % segments != 0) return false;
  if (!bitwise) return true;
  if (chunks % segments != 0) return false;
  for (int64_t i = 0; i <= segments; ++i)
    if (numerics::chunk_begin(seq_len, chunks, int(i * (chunks / segments))) != i * (seq_len / segments)) return false;
  return true;
}

ContextParallelAttentionCount context_parallel_attention_count() { return cp_count; }

int64_t set_context_parallel_group_bytes(int64_t bytes) {
  TESSEL_CHECK(bytes > 0, "set_context_parallel_group_bytes", "needs a positive byte count, got {}", bytes);
  return group_bytes.exchange(bytes);
}

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
  if (q.is_distributed() && !cut_along_time(q)) ++cp_count.whole;

  if (use_fast_fused(q, k, v, opts)) {
    if (cut_along_time(q)) ++cp_count.gathered;  // whole_head_placements gathers time
    FastAttentionOp f;
    f.scale = scale;
    return call(std::move(f), q, k, v);
  }
  if (use_fused(q, k, v, opts)) {
    // Context parallelism in bitwise mode: the kernel sums a group's query
    // heads before the pieces' dk/dv are added across the mesh, which is not
    // the one-device order; with k and v repeated per query head that sum
    // comes after (the repeat's backward, on the finished gradients). The
    // balanced path repeats after its gather, the contiguous one before.
    if (opts.dropout_p > 0.0) kernels::check_global_block(op, {B, Hq, Tq, Tk}, opts.dropout_block);
    if (const int m = balanced_dim(q, k, v, opts, numerics::reduction_chunks()); m >= 0) {
      ++cp_count.local;
      ++cp_count.balanced;
      return balanced_attention(q, k, v, opts, scale, m);
    }
    if (g > 1 && numerics::bitwise() && q.is_distributed())
      for (const Placement& pl : q.placements())
        if (pl.is_shard(2)) return scaled_dot_product_attention(q, repeat_kv(k, g), repeat_kv(v, g), opts);
    FusedAttentionOp f;
    f.params = fused_params(opts, scale);
    return call(std::move(f), q, k, v);
  }

  if (cut_along_time(q)) ++cp_count.gathered;  // the composite's matmuls gather what they need
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
