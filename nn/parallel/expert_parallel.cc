#include "nn/parallel/expert_parallel.h"

#include <algorithm>
#include <array>

#include "autograd/api.h"
#include "autograd/function.h"
#include "dtensor/ops.h"
#include "nn/autocast.h"
#include "runtime/comm/comm.h"
#include "runtime/numerics.h"

namespace tessel::parallel {
namespace {

constexpr const char* kOp = "expert parallel";

Tensor index_tensor(const std::vector<int64_t>& v, Device device) {
  return tensor(v, Dims{int64_t(v.size())}, TensorOptions(DType::Int64).with_device(device));
}

// Identity on x; its backward also gives each anchor a zero gradient. Ties
// the local pieces of experts this rank did not run (but some rank did) into
// the graph, so every rank produces a gradient for them and takes part in
// the same gradient collectives (the parameter's dp all-reduce).
struct TieGradientsOp {
  static constexpr const char* kName = "expert_parallel_tie";
  std::vector<Dims> shapes;
  std::vector<DType> dtypes;

  Tensor forward(const Tensor& x, const std::vector<Tensor>& anchors) {
    for (const Tensor& a : anchors) shapes.push_back(a.shape()), dtypes.push_back(a.dtype());
    return raw::alias(x);
  }
  std::vector<Tensor> backward(const GradContext& ctx, std::vector<Tensor>& grads) {
    std::vector<Tensor> out{ctx.needs(0) ? grads[0] : Tensor()};
    for (size_t i = 0; i < shapes.size(); ++i)
      out.push_back(ctx.needs(i + 1) ? zeros(shapes[i], TensorOptions(dtypes[i]).with_device(grads[0].device()))
                                     : Tensor());
    return out;
  }
};

// The weights of expert e in a fixed order.
std::array<Tensor*, 3> expert_weights(nn::MoE& moe, int64_t e) {
  nn::SwiGLU& x = moe.expert(e);
  return {&x.w1->weight, &x.w2->weight, &x.w3->weight};
}

// Row-major position of this rank among the ranks that hold different tokens
// (the token dims, in mesh order = the order of the global batch), and the
// stride of the ep coordinate in it.
struct TokenOrder {
  std::vector<int> dims;
  int64_t ranks = 1, me = 0, ep_stride = 1;
};

TokenOrder token_order(const Mesh& mesh, const Placements& p, int ep) {
  TokenOrder t;
  for (int m = 0; m < mesh.ndim(); ++m)
    if (p[m].is_shard(0)) t.dims.push_back(m);
  for (int m : t.dims) {
    t.me = t.me * mesh.size(m) + mesh.coordinate(m);
    t.ranks *= mesh.size(m);
  }
  bool after = false;
  for (int m : t.dims) {
    if (after) t.ep_stride *= mesh.size(m);
    if (m == ep) after = true;
  }
  return t;
}

// Every token rank's routed slots per expert, [ranks][E] in token order: an
// all-gather over each token dim, innermost first (so rows come out
// row-major over the token dims).
std::vector<int64_t> gather_counts(const Mesh& mesh, const TokenOrder& order, const std::vector<int64_t>& mine) {
  Tensor buf = tensor(mine, Dims{int64_t(mine.size())}, TensorOptions(DType::Int64).with_device(mesh.device()));
  for (auto it = order.dims.rbegin(); it != order.dims.rend(); ++it) {
    const int m = *it;
    if (mesh.size(m) == 1) continue;
    Tensor out = raw::empty(Dims{mesh.size(m) * buf.numel()}, DType::Int64, buf.device());
    mesh.comm(m)->all_gather(buf, out)->wait();
    buf = out;
  }
  return buf.to_vector<int64_t>();
}

}  // namespace

int64_t expert_owner(int64_t e, int64_t num_experts, int64_t ep, const std::string& where) {
  TESSEL_CHECK(ep > 0 && num_experts % ep == 0, kOp, "{}: ep={} does not divide num_experts={}", where, ep,
               num_experts);
  return e / (num_experts / ep);
}

ExpertParallelDispatch::ExpertParallelDispatch(MeshPtr mesh, int ep_dim) : mesh_(std::move(mesh)), ep_dim_(ep_dim) {
  TESSEL_CHECK(mesh_ && ep_dim_ >= -1 && ep_dim_ < mesh_->ndim(), kOp,
               "needs a mesh and one of its dims (or -1: none), got dim {} of {}", ep_dim_,
               mesh_ ? mesh_->str() : "no mesh");
}

std::string ExpertParallelDispatch::describe() const {
  if (ep_dim_ < 0) return fmt::format(FMT_STRING("experts on every rank, tokens routed where they are, over mesh {}"), mesh_->str());
  return fmt::format(FMT_STRING("expert_parallel={} over mesh {}"), mesh_->name(ep_dim_), mesh_->str());
}

namespace {

// Mesh dims (other than ep) that shard some expert weight: tokens are
// replicated there, expert outputs are pending sums (row-parallel w2).
std::vector<bool> expert_sharded_dims(nn::MoE& moe, const MeshPtr& mesh, int ep) {
  std::vector<bool> sharded(size_t(mesh->ndim()), false);
  for (int64_t e = 0; e < moe.config.num_experts; ++e) {
    for (Tensor* w : expert_weights(moe, e)) {
      TESSEL_CHECK(w->is_distributed() && same_mesh(w->mesh(), mesh), kOp,
                   "'{}': expert weights must be laid out on mesh {} (parallelize), got {}", moe.path(), mesh->str(),
                   w->desc());
      if (ep >= 0) {
        const int64_t owner = expert_owner(e, moe.config.num_experts, mesh->size(ep), moe.path());
        TESSEL_CHECK(w->placements()[ep] == ShardOn(0, int(owner)), kOp,
                     "'{}': expert {}'s weight must be {} over '{}', got placements {}", moe.path(), e,
                     ShardOn(0, int(owner)).str(), mesh->name(ep), w->placements());
      }
      for (int m = 0; m < mesh->ndim(); ++m)
        if (m != ep && w->placements()[m].is_shard() && mesh->size(m) > 1) sharded[size_t(m)] = true;
    }
  }
  return sharded;
}

// Where the tokens [N, C] should be for routing: sharded over ep (each rank
// routes its own), kept sharded over other dims that shard them and not the
// experts (dp, cp), replicated elsewhere. In bitwise mode only the ep cut is
// kept: an expert's weight gradient is a sum over the tokens routed to it,
// and pieces cut at the routing's arbitrary counts are not subtrees of the
// one-device order, so each expert must see all its tokens, in token order
// (the ep sources' rows concatenated). Every rank of a dp (cp) group then
// routes the same tokens: bitwise mode pays for the bits with that repeated
// work.
Placements token_layout(const Placements& have, const std::vector<bool>& sharded, int ep) {
  Placements want = have;
  for (int m = 0; m < have.size(); ++m) {
    if (m == ep) want[m] = Shard(0);
    else if (!want[m].is_shard(0) || want[m].is_owned() || sharded[size_t(m)] || numerics::bitwise())
      want[m] = Replicate();
  }
  return want;
}

// Without an ep dim the dispatch pays off only where tokens stay cut (dp in
// fast mode): elsewhere the MoE's own dispatch runs, unchanged.
bool routes_locally(const Placements& want, int ep) {
  if (ep >= 0) return true;
  for (int m = 0; m < want.size(); ++m)
    if (want[m].is_shard(0)) return true;
  return false;
}

}  // namespace

Tensor ExpertParallelDispatch::layout(nn::MoE& moe, const Tensor& x2d) {
  Tensor x = x2d.is_distributed() ? x2d : distribute_tensor(x2d, mesh_, Placements::replicated(mesh_->ndim()));
  TESSEL_CHECK(same_mesh(x.mesh(), mesh_), kOp, "'{}': tokens {} are on another mesh than the experts ({})", moe.path(),
               x.desc(), mesh_->str());
  const Placements want = token_layout(x.placements(), expert_sharded_dims(moe, mesh_, ep_dim_), ep_dim_);
  if (!routes_locally(want, ep_dim_)) return x2d;
  return redistribute(x, want);
}

Tensor ExpertParallelDispatch::dispatch(nn::MoE& moe, const Tensor& x2d, const Tensor& top_i, const Tensor& weights,
                                        nn::MoEStats& stats) {
  const Mesh& mesh = *mesh_;
  const int ep = ep_dim_;
  const int64_t C = moe.config.dim, E = moe.config.num_experts, K = moe.config.top_k, N = x2d.size(0);
  // No ep dim: one expert group of every expert, on every rank (P = 1).
  const int64_t P = ep >= 0 ? mesh.size(ep) : 1, L = E / P, me_ep = ep >= 0 ? mesh.coordinate(ep) : 0;
  if (ep < 0 && !x2d.is_distributed()) return moe.dispatch_default(x2d, top_i, weights, stats);
  const std::vector<bool> sharded = expert_sharded_dims(moe, mesh_, ep);
  if (!routes_locally(token_layout(x2d.placements(), sharded, ep), ep)) return moe.dispatch_default(x2d, top_i, weights, stats);
  const Placements& xp = x2d.placements();
  TESSEL_CHECK(ep < 0 || (xp[ep].is_shard(0) && !xp[ep].is_owned()), kOp,
               "'{}': tokens {} must be sharded over '{}' (layout())", moe.path(), x2d.desc(),
               ep >= 0 ? mesh.name(ep) : "");
  const TokenOrder order = token_order(mesh, xp, ep);

  // Bitwise mode runs every expert on its whole weights: a tp piece's
  // products would be summed in the local GEMM's order and then across the
  // pieces, not in the one-device canonical order. So the pieces are
  // gathered over the dims that shard the experts (tp) -- every tp rank then
  // computes the same whole output, and the weight gradients go back to the
  // pieces exactly (a slice of identical values) -- at the cost of that
  // gather and of tp computing each expert in full.
  const bool gather_experts = numerics::bitwise();
  // Placements of the token gradients: tokens as they are, pending sums over
  // dims that shard the experts (replicated when they are gathered),
  // replicated elsewhere.
  Placements grad_p = xp;
  std::vector<std::string> expert_cut;  // dims whose pieces' outputs are pending sums
  for (int m = 0; m < mesh.ndim(); ++m) {
    if (xp[m].is_shard(0)) continue;
    const bool pending = sharded[size_t(m)] && !gather_experts;
    grad_p[m] = pending ? Partial() : Replicate();
    if (pending) expert_cut.push_back(mesh.name(m));
  }
  // Without an ep dim the experts' outputs are summed over their pieces (tp)
  // before the combine, as the MoE's own ops do on a mesh: the routing weights
  // then multiply finished outputs, and the layer rounds as it does without
  // the dispatch (a combine of pending sums would round otherwise, and the
  // router of a later step can flip a near-tie on that). With ep the combine
  // stays on pending sums: one reduction of the layer's output instead.
  const bool reduce_before_combine = ep < 0 && !expert_cut.empty();
  Placements out_p = grad_p;
  if (reduce_before_combine)
    for (int m = 0; m < mesh.ndim(); ++m)
      if (out_p[m].is_partial()) out_p[m] = Replicate();

  // The router's rules may have laid its outputs out otherwise (a single
  // token is not worth sharding): this rank's tokens' routing, as x2d.
  Tensor xl = to_local(x2d, grad_p);                          // [n, C]
  Tensor wl = to_local(redistribute(weights, xp), out_p);     // [n, K]
  const int64_t n = xl.size(0);
  wl = wl.reshape({n * K});
  const std::vector<int64_t> choice = nn::routing_choice(to_local(redistribute(top_i, xp)), E);

  // ---- 1. counts: global, in token order; the capacity rule on them -----------------------
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(E));  // my slots per expert, token order
  std::vector<int64_t> mine(static_cast<size_t>(E), 0);
  for (int64_t s = 0; s < n * K; ++s) {
    slots[size_t(choice[size_t(s)])].push_back(s);
    ++mine[size_t(choice[size_t(s)])];
  }
  // [ranks][E]. On Meta (planning) every token rank routes as this one does.
  std::vector<int64_t> all;
  if (xl.device().is_meta()) {
    for (int64_t r = 0; r < order.ranks; ++r) all.insert(all.end(), mine.begin(), mine.end());
  } else {
    all = gather_counts(mesh, order, mine);
  }
  const int64_t cap = nn::expert_capacity(moe.capacity_factor(), N, K, E);
  // kept[r][e]: rank r's kept slots of expert e (its first ones, after those of ranks before it).
  std::vector<int64_t> kept(all.size(), 0);
  stats.counts.assign(size_t(E), 0);
  stats.dropped.assign(size_t(E), 0);
  std::vector<int64_t> kept_total(static_cast<size_t>(E), 0);
  for (int64_t e = 0; e < E; ++e) {
    int64_t before = 0;
    for (int64_t r = 0; r < order.ranks; ++r) {
      const int64_t c = all[size_t(r * E + e)];
      kept[size_t(r * E + e)] = std::clamp(cap - before, int64_t(0), c);
      before += c;
      kept_total[size_t(e)] += kept[size_t(r * E + e)];
    }
    stats.counts[size_t(e)] = before;
    stats.dropped[size_t(e)] = before - kept_total[size_t(e)];
  }
  auto kept_of = [&](int64_t r, int64_t e) { return kept[size_t(r * E + e)]; };

  // ---- 2. what goes where -------------------------------------------------------------------
  // Sends: kept slots expert-major (so owner-major), token order within an expert.
  std::vector<int64_t> send_tok, send_slot, send_rows(size_t(P), 0);
  send_tok.reserve(size_t(n * K));
  send_slot.reserve(size_t(n * K));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t k = kept_of(order.me, e);
    for (int64_t i = 0; i < k; ++i) {
      const int64_t s = slots[size_t(e)][size_t(i)];
      send_tok.push_back(s / K);
      send_slot.push_back(s);
    }
    send_rows[size_t(e / L)] += k;
  }
  // Receives: from each source q of my ep group, its kept rows of my experts
  // (expert-major). `perm` lists them expert-major over all sources.
  std::vector<int64_t> recv_rows(size_t(P), 0), perm, expert_rows(size_t(L), 0);
  std::vector<int64_t> src_off(size_t(P) + 1, 0);
  for (int64_t q = 0; q < P; ++q) {
    const int64_t r = order.me + (q - me_ep) * order.ep_stride;
    for (int64_t l = 0; l < L; ++l) recv_rows[size_t(q)] += kept_of(r, me_ep * L + l);
    src_off[size_t(q) + 1] = src_off[size_t(q)] + recv_rows[size_t(q)];
  }
  perm.reserve(size_t(src_off.back()));
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t q = 0; q < P; ++q) {
      const int64_t r = order.me + (q - me_ep) * order.ep_stride;
      int64_t off = src_off[size_t(q)];
      for (int64_t l2 = 0; l2 < l; ++l2) off += kept_of(r, me_ep * L + l2);
      const int64_t k = kept_of(r, me_ep * L + l);
      for (int64_t i = 0; i < k; ++i) perm.push_back(off + i);
      expert_rows[size_t(l)] += k;
    }
  }
  const Device dev = xl.device();
  const comm::CommPtr group = ep >= 0 ? mesh.comm(ep) : nullptr;  // null when P == 1
  const bool identity_perm = P == 1;

  // ---- 3. dispatch, run the local experts, send the outputs back ------------------------------
  Tensor sbuf = index_select(xl, 0, index_tensor(send_tok, dev));              // [sent, C]
  Tensor rbuf = all_to_all_v(sbuf, group, send_rows, recv_rows);             // [received, C], source-major
  Tensor xs = identity_perm ? rbuf : index_select(rbuf, 0, index_tensor(perm, dev));  // expert-major

  // Every rank takes the local pieces of every expert's weights, in the same
  // order, so the gradient accumulators (and their collectives) line up.
  std::vector<std::array<Tensor, 3>> pieces(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    std::array<Tensor*, 3> ws = expert_weights(moe, e);
    for (size_t j = 0; j < 3; ++j) {
      Tensor w = *ws[j];
      if (gather_experts) {
        Placements whole = w.placements();
        for (int m = 0; m < mesh.ndim(); ++m)
          if (sharded[size_t(m)]) whole[m] = Replicate();
        w = redistribute(w, whole);  // its backward gives the pieces their slices
      }
      Placements gp = w.placements();
      for (int m : order.dims)
        if (m != ep) gp[m] = Partial();  // summed over the other token ranks (the dp all-reduce)
      pieces[size_t(e)][j] = to_local(w, gp);
    }
  }
  std::vector<Tensor> ys, anchors;
  int64_t off = 0;
  for (int64_t l = 0; l < L; ++l) {
    const int64_t e = me_ep * L + l, rows = expert_rows[size_t(l)];
    const auto& w = pieces[size_t(e)];
    if (rows > 0) ys.push_back(nn::expert_swiglu(xs.narrow(0, off, rows), w[0], w[1], w[2]));
    off += rows;
  }
  for (int64_t e = 0; e < E; ++e) {
    const bool ran_here = e / L == me_ep && expert_rows[size_t(e % L)] > 0;
    if (kept_total[size_t(e)] > 0 && !ran_here)
      for (const Tensor& w : pieces[size_t(e)]) anchors.push_back(w);
  }
  // With no local rows the (empty) input stands in, cast as an expert output
  // would be, so every rank sends the same dtype.
  Tensor ycat = ys.empty() ? nn::cast_to_compute(xs) : (ys.size() == 1 ? ys[0] : cat(ys, 0));
  if (reduce_before_combine) {
    // Every rank of the expert_cut dims holds the same rows (tokens are
    // replicated there), so their pieces' sums are one reduction.
    MeshPtr cut = mesh.sub(expert_cut);
    Placements pending = Placements::replicated(cut->ndim());
    for (int m = 0; m < cut->ndim(); ++m) pending[m] = Partial();
    ycat = to_local(redistribute(from_local(ycat, cut, pending, ycat.shape()), Placements::replicated(cut->ndim())));
  }
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[size_t(perm[i])] = int64_t(i);
  Tensor yback = identity_perm ? ycat : index_select(ycat, 0, index_tensor(inv, dev));  // source-major
  if (!anchors.empty() && GradMode::is_enabled()) yback = call(TieGradientsOp{}, yback, anchors);
  Tensor back = all_to_all_v(yback, group, recv_rows, send_rows);  // [sent, C], in send order

  // ---- 4. combine: weighted, summed per token in expert order ---------------------------------
  Tensor w = index_select(wl, 0, index_tensor(send_slot, dev)).unsqueeze(1);
  Tensor contrib = mul(back, w);  // promotes to the routing dtype (float32 under autocast)
  Tensor out = index_add(zeros({n, C}, TensorOptions(contrib.dtype()).with_device(dev)), 0,
                         index_tensor(send_tok, dev), contrib);
  return from_local(out, mesh_, out_p, Dims{N, C});
}

}  // namespace tessel::parallel
