#include "nn/parallel/fsdp.h"

#include <algorithm>
#include <unordered_map>

#include "autograd/api.h"
#include "autograd/dist_call.h"
#include "autograd/ops/dist.h"
#include "nn/parallel/buckets.h"
#include "nn/parallel/staging.h"

namespace tessel::parallel {
namespace {
constexpr const char* kOp = "fsdp";
// One slot per direction: at most one all-gather (the prefetch) and one
// reduce-scatter (the unit backward just left) are in flight at a time.
constexpr int kStagingSlots = 1;
}  // namespace

struct FsdpUnit {
  std::string name;  // "root" or the block's path
  std::vector<size_t> members;  // indices into FsdpState::params
  std::unique_ptr<AllGatherBucket> ag;  // null when no member is sharded
  std::unique_ptr<ReduceScatterBucket> rs;
  Tensor buffer;                // the gathered full pieces of the sharded members (flat)
  std::vector<Tensor> full;     // per member: its full local piece (in `buffer`, or its own piece when whole)
  enum class State { Released, Pending, Gathered } state = State::Released;
  StagingRing::Slot* pending = nullptr;
  nn::Module* module = nullptr;
  int pre_hook = 0, post_hook = 0;
};

struct FsdpState : std::enable_shared_from_this<FsdpState> {
  std::vector<DpParam*> params;
  std::vector<FsdpUnit> units;  // [0]: root; then the blocks in forward order
  StagingRing ag_ring, rs_ring;

  void launch_gather(size_t u);
  void gather(size_t u);
  void prefetch(size_t u) {
    if (units[u].state == FsdpUnit::State::Released) launch_gather(u);
  }
  void release(size_t u);
  void install(size_t u);
  void uninstall(size_t u);
  void after_forward(size_t u, const Tensor& output, bool keep);
  void pre_backward(size_t u);
  void post_backward(size_t u, std::vector<Tensor>& grads);
};

namespace {

// Links a unit's gathered copies to its shards; running it is the unit's
// post-backward point (see fsdp.h).
struct FsdpGatherNode final : Node {
  std::weak_ptr<FsdpState> state;
  size_t unit = 0;
  const char* name() const override { return "fsdp_gather"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (auto s = state.lock()) s->post_backward(unit, grads);
    return std::vector<Tensor>(next_edges.size());  // the reduce-scatter delivers the shards' gradients
  }
};

}  // namespace

void FsdpState::launch_gather(size_t u) {
  FsdpUnit& U = units[u];
  if (!U.ag) {  // nothing sharded: the pieces are whole already
    U.state = FsdpUnit::State::Gathered;
    return;
  }
  std::vector<Tensor> mine(U.members.size());
  for (size_t k = 0; k < U.members.size(); ++k)
    if (params[U.members[k]]->geo.is_sharded()) mine[k] = raw::local_of(params[U.members[k]]->param);
  U.state = FsdpUnit::State::Pending;
  U.pending = &U.ag->launch(ag_ring, mine, [this, u](const Tensor& gathered) {
    FsdpUnit& V = units[u];
    // Refill in place: tensors saved for backward alias this storage, and
    // the copy (a raw kernel) leaves its version alone — same values as saved.
    V.buffer.storage()->reallocate();
    V.ag->unpack(gathered, V.full);
    V.state = FsdpUnit::State::Gathered;
    V.pending = nullptr;
  });
}

void FsdpState::gather(size_t u) {
  FsdpUnit& U = units[u];
  if (U.state == FsdpUnit::State::Released) launch_gather(u);
  if (U.state == FsdpUnit::State::Pending) ag_ring.complete(*U.pending);
}

void FsdpState::release(size_t u) {
  FsdpUnit& U = units[u];
  if (U.state == FsdpUnit::State::Pending) ag_ring.complete(*U.pending);  // never abandon a collective in flight
  if (U.ag) U.buffer.storage()->release();
  U.state = FsdpUnit::State::Released;
}

void FsdpState::install(size_t u) {
  FsdpUnit& U = units[u];
  std::vector<Tensor> gathered(U.members.size());
  bool any_grad = false;
  for (size_t k = 0; k < U.members.size(); ++k) {
    const DpParam& p = *params[U.members[k]];
    gathered[k] = raw::make_distributed(U.full[k], p.param.mesh(), p.geo.full, p.geo.global);
    any_grad = any_grad || p.param.requires_grad();
  }
  if (GradMode::is_enabled() && any_grad) {
    auto node = std::make_shared<FsdpGatherNode>();
    node->state = weak_from_this();
    node->unit = u;
    std::vector<const Tensor*> inputs;
    for (size_t i : U.members) inputs.push_back(&params[i]->param);
    detail::connect(*node, inputs);
    node->num_outputs = uint32_t(U.members.size());
    for (size_t k = 0; k < gathered.size(); ++k) detail::set_history(gathered[k], node, uint32_t(k));
  }
  for (size_t k = 0; k < U.members.size(); ++k)
    for (Tensor* slot : params[U.members[k]]->slots) *slot = gathered[k];
}

void FsdpState::uninstall(size_t u) {
  for (size_t i : units[u].members)
    for (Tensor* slot : params[i]->slots) *slot = params[i]->param;
}

void FsdpState::after_forward(size_t u, const Tensor& output, bool keep) {
  uninstall(u);
  const bool backward_follows = GradMode::is_enabled() && output.defined() && output.requires_grad();
  if (backward_follows) {
    std::weak_ptr<FsdpState> w = weak_from_this();
    output.register_hook([w, u](const Tensor&) {
      if (auto s = w.lock()) s->pre_backward(u);
      return Tensor();
    });
  }
  if (!(keep && backward_follows)) release(u);
}

void FsdpState::pre_backward(size_t u) {
  gather(u);
  // Backward runs the blocks last to first, then the root (gathered already).
  const size_t next = u == 0 ? units.size() - 1 : u - 1;
  if (next != u) prefetch(next);
}

void FsdpState::post_backward(size_t u, std::vector<Tensor>& grads) {
  FsdpUnit& U = units[u];
  NoGradGuard ng;
  std::vector<Tensor> pieces(U.members.size());
  for (size_t k = 0; k < U.members.size(); ++k) {
    Tensor g = k < grads.size() ? grads[k] : Tensor();
    if (!g.defined()) continue;  // unused in this forward
    const DpParam& p = *params[U.members[k]];
    if (g.dtype() != DType::Float32) g = g.to(DType::Float32);
    // Pending on dp, the parameter's own layout elsewhere (a tp Partial is
    // all-reduced here, as AccumulateGrad would).
    if (!g.is_distributed()) g = distribute_tensor(g, p.param.mesh(), p.geo.pending);
    else if (g.placements() != p.geo.pending) g = redistribute(g, p.geo.pending);
    pieces[k] = raw::local_of(g);
  }
  U.rs->launch(rs_ring, pieces);
  release(u);
}

// ---- Fsdp ----------------------------------------------------------------------------------------
Fsdp::Fsdp(nn::Module& root, const std::vector<nn::Module*>& blocks, std::vector<DpParam*> params)
    : state_(std::make_shared<FsdpState>()) {
  FsdpState& S = *state_;
  S.params = std::move(params);
  TESSEL_CHECK(!S.params.empty(), kOp, "no parameter to shard");
  const MeshPtr mesh = S.params[0]->param.mesh();
  const int dp = S.params[0]->geo.dp;
  const comm::CommPtr comm = mesh->comm(dp);
  TESSEL_CHECK(comm != nullptr, kOp, "the dp dim of mesh {} has size 1: nothing to shard", mesh->str());
  const Device dev = S.params[0]->param.device();

  // Units: a parameter belongs to the one block that holds it; parameters of
  // no block, or of several (tied), belong to the root.
  std::unordered_map<const TensorImpl*, size_t> index;
  for (size_t i = 0; i < S.params.size(); ++i) index[S.params[i]->param.impl()] = i;
  std::vector<int> owner(S.params.size(), 0);
  S.units.resize(blocks.size() + 1);
  S.units[0].name = "root";
  S.units[0].module = &root;
  for (size_t b = 0; b < blocks.size(); ++b) {
    S.units[b + 1].name = blocks[b]->path();
    S.units[b + 1].module = blocks[b];
    for (const Tensor& t : blocks[b]->parameters()) {
      auto it = index.find(t.impl());
      if (it == index.end()) continue;  // not managed (already sharded over dp by the plan)
      int& o = owner[it->second];
      o = o == 0 ? int(b + 1) : -1;
    }
  }
  for (size_t i = 0; i < S.params.size(); ++i) S.units[size_t(std::max(owner[i], 0))].members.push_back(i);

  // Shard: each rank keeps a private copy of its chunk; the full pieces go.
  NoGradGuard ng;
  for (DpParam* p : S.params) {
    if (!p->geo.is_sharded()) continue;
    Tensor piece = p->geo.chunk(raw::local_of(p->param), p->geo.dp_rank).clone();
    Tensor shard = raw::make_distributed(piece, mesh, p->geo.sharded, p->geo.global);
    shard.requires_grad_(true);
    p->param = shard;
    p->shard = shard;
    for (Tensor* slot : p->slots) *slot = shard;
  }

  int64_t ag_numel = 0, rs_numel = 0;
  for (FsdpUnit& U : S.units) {
    if (U.members.empty()) continue;
    std::vector<const DpShard*> geos, sharded;
    int64_t total = 0;
    for (size_t i : U.members) {
      geos.push_back(&S.params[i]->geo);
      if (S.params[i]->geo.is_sharded()) {
        sharded.push_back(&S.params[i]->geo);
        total += numel_of(S.params[i]->geo.full_local);
      }
    }
    U.rs = std::make_unique<ReduceScatterBucket>(geos, comm, dev);
    rs_numel = std::max(rs_numel, U.rs->slot_numel());
    if (!sharded.empty()) {
      U.ag = std::make_unique<AllGatherBucket>(geos, comm, dev);
      ag_numel = std::max(ag_numel, U.ag->slot_numel());
    }
    U.buffer = raw::empty({total}, DType::Float32, dev);
    int64_t at = 0;
    for (size_t i : U.members) {
      const DpShard& g = S.params[i]->geo;
      if (g.is_sharded()) {
        U.full.push_back(raw::as_strided(U.buffer, g.full_local, contiguous_strides(g.full_local), at));
        at += numel_of(g.full_local);
      } else {
        U.full.push_back(raw::local_of(S.params[i]->param));
      }
    }
    if (U.ag) U.buffer.storage()->release();
  }
  S.ag_ring = StagingRing(kStagingSlots, ag_numel, DType::Float32, dev);
  S.rs_ring = StagingRing(kStagingSlots, rs_numel, DType::Float32, dev);

  // Hooks. Units without parameters still take part (their hooks do nothing
  // but keep the prefetch chain simple).
  FsdpState* s = state_.get();
  const size_t n = S.units.size();
  for (size_t u = 0; u < n; ++u) {
    FsdpUnit& U = S.units[u];
    const bool is_root = u == 0;
    U.pre_hook = U.module->register_forward_pre_hook([s, u, n](nn::Module&, const Tensor& x) {
      s->gather(u);
      if (u + 1 < n) s->prefetch(u + 1);  // the next unit's all-gather runs while this one computes
      s->install(u);
      return x;
    });
    U.post_hook = U.module->register_forward_hook([s, u, is_root](nn::Module&, const Tensor&, const Tensor& y) {
      s->after_forward(u, y, /*keep=*/is_root);  // the root is needed first in backward
      return y;
    });
  }
}

Fsdp::~Fsdp() {
  for (FsdpUnit& U : state_->units) {
    U.module->remove_forward_hook(U.pre_hook);
    U.module->remove_forward_hook(U.post_hook);
  }
  // Normally idle (finish() waited). If a rank failed mid-step, the
  // collectives report it; a destructor must not throw.
  try {
    state_->ag_ring.complete_all();
    state_->rs_ring.complete_all();
  } catch (const std::exception&) {
  }
}

void Fsdp::finish() {
  FsdpState& S = *state_;
  NoGradGuard ng;
  S.rs_ring.complete_all();
  for (FsdpUnit& U : S.units) {
    if (!U.rs) continue;
    for (size_t k = 0; k < U.members.size(); ++k) {
      DpParam& p = *S.params[U.members[k]];
      p.param.set_grad(U.rs->used(k) ? raw::make_distributed(U.rs->shard_grad(k), p.param.mesh(), p.geo.sharded,
                                                             p.geo.global)
                                     : Tensor());
    }
    U.rs->reset();
  }
}

void Fsdp::after_step() {
  for (size_t u = 0; u < state_->units.size(); ++u) state_->release(u);
}

int Fsdp::num_units() const { return int(state_->units.size()); }

int64_t Fsdp::grad_bytes() const {
  int64_t n = 0;
  for (const FsdpUnit& U : state_->units)
    if (U.rs) n += U.rs->shard_bytes();
  return n;
}

int64_t Fsdp::comm_bytes() const {
  int64_t n = state_->ag_ring.bytes() + state_->rs_ring.bytes();
  for (const FsdpUnit& U : state_->units)
    if (U.rs) n += U.rs->flag_bytes();
  return n;
}

int64_t Fsdp::gathered_bytes() const {
  int64_t root = 0, block = 0;
  for (size_t u = 0; u < state_->units.size(); ++u) {
    const int64_t b = int64_t(state_->units[u].buffer.defined() ? state_->units[u].buffer.nbytes() : 0);
    if (u == 0) root = b;
    else block = std::max(block, b);
  }
  return root + block;
}

std::vector<std::pair<std::string, std::vector<std::string>>> Fsdp::units() const {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (const FsdpUnit& U : state_->units) {
    out.emplace_back(U.name, std::vector<std::string>{});
    for (size_t i : U.members) out.back().second.push_back(state_->params[i]->path);
  }
  return out;
}

}  // namespace tessel::parallel
