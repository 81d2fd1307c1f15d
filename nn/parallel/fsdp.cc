#include "nn/parallel/fsdp.h"

#include <algorithm>
#include <unordered_map>

#include "autograd/api.h"
#include "dtensor/dist_call.h"
#include "dtensor/ops.h"
#include "nn/parallel/buckets.h"
#include "nn/parallel/staging.h"
#include "runtime/logging.h"

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
  bool any_grad = false;  // some member requires grad: grad-mode copies get a gather node

  // The gathered copies of the members (distributed tensors over `full`)
  // that ops use: the installed ones, or copies made without grad mode for a
  // use (never installed). Dropped by uninstall and release (they alias the
  // buffer); non-empty only while Gathered.
  std::vector<Tensor> copies;
  bool linked = false;     // the copies hang off a gather node (made in grad mode)
  bool installed = false;  // the module slots hold the copies
  // Gathered by a use (no pre-hook ran): no post-hook will release it, so it
  // stays installed until its post-backward (or after_step).
  bool on_use = false;
  bool warned = false;  // the gathered-on-use warning was logged
  // The gather node of the last linked copies, until it runs: a second one
  // for the same unit before then would reduce-scatter the unit twice
  // (check_not_awaiting). Weak: a graph dropped without backward frees it.
  std::weak_ptr<Node> awaiting;
};

struct FsdpState : std::enable_shared_from_this<FsdpState> {
  std::vector<DpParam*> params;
  std::vector<FsdpUnit> units;  // [0]: root; then the blocks in forward order
  std::vector<std::pair<size_t, size_t>> where;  // per param: (unit, member position)
  std::vector<int> leaf_hooks;                    // per param: its shard's gradient hook (refuse_shard_grad)
  StagingRing ag_ring, rs_ring;
  bool log_rank = false;  // this rank logs the warnings (mesh rank 0)

  void launch_gather(size_t u);
  void gather(size_t u);
  void prefetch(size_t u) {
    if (units[u].state == FsdpUnit::State::Released) launch_gather(u);
  }
  void release(size_t u);
  void make_copies(size_t u);
  void install(size_t u);
  void uninstall(size_t u);
  void before_forward(size_t u);
  void after_forward(size_t u, const Tensor& output, bool keep);
  void pre_backward(size_t u);
  void post_backward(size_t u, std::vector<Tensor>& grads);
  Tensor resolve(size_t i);
  void check_not_awaiting(size_t u, const DpParam* used) const;
  [[noreturn]] void refuse_shard_grad(size_t i) const;
  bool needs_grad(size_t u) const { return GradMode::is_enabled() && units[u].any_grad; }
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

// Every managed parameter's use hook (DistInfo::on_use): an op on the shard
// computes on the unit's gathered copy instead (FsdpState::resolve).
struct FsdpUseHook final : DistUseHook {
  std::weak_ptr<FsdpState> state;
  size_t param = 0;
  Tensor resolve(const Tensor& self) const override {
    auto s = state.lock();
    // ~Fsdp clears the hooks first, so a live hook has a live state.
    TESSEL_CHECK(s != nullptr, kOp, "internal error: the use hook of {} outlived its FSDP", self.desc());
    return s->resolve(param);
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
  // No slot may keep pointing at memory about to be released (a unit
  // gathered on use is still installed at its post-backward).
  uninstall(u);
  U.on_use = false;
  if (U.ag) U.buffer.storage()->release();
  U.state = FsdpUnit::State::Released;
}

// A unit must not get a second gather node while the first one has not run:
// both would reduce-scatter (the sum of two reduce-scatters is not one
// device's sum of the gradients, and the first to run frees the buffer the
// other's saved tensors alias).
void FsdpState::check_not_awaiting(size_t u, const DpParam* used) const {
  const FsdpUnit& U = units[u];
  if (U.awaiting.expired()) return;
  if (used != nullptr) {
    TESSEL_FAIL(kOp,
                "parameter '{}' ({}) of FSDP unit '{}' is used after that unit's forward ended: the unit was "
                "released, and its gathered copy from this forward still awaits its backward (gathering it again "
                "would reduce-scatter the unit twice). Use the parameter inside the forward of '{}', or leave that "
                "module out of DataParallel's blocks so that its parameters belong to the root unit",
                used->path, used->param.desc(), U.name, U.name);
  }
  TESSEL_FAIL(kOp,
              "unit '{}' (parameters {}, ...) is gathered again while its gathered copy from an earlier forward "
              "still awaits its backward: a second forward (or a second call of the module) before the first "
              "one's backward. Call backward before the next forward, run forwards that need no gradient under "
              "NoGradGuard, or leave the module out of DataParallel's blocks if it runs more than once per forward",
              U.name, params[U.members.front()]->path);
}

// Gathered copies of unit u's members over `full` (u must be Gathered); in
// grad mode they hang off one new gather node whose inputs are the shards
// (the caller checked check_not_awaiting before gathering).
void FsdpState::make_copies(size_t u) {
  FsdpUnit& U = units[u];
  const bool grad = needs_grad(u);
  U.copies.resize(U.members.size());
  for (size_t k = 0; k < U.members.size(); ++k) {
    const DpParam& p = *params[U.members[k]];
    U.copies[k] = raw::make_distributed(U.full[k], p.param.mesh(), p.geo.full, p.geo.global);
  }
  U.linked = grad;
  if (!grad) return;
  auto node = std::make_shared<FsdpGatherNode>();
  node->state = weak_from_this();
  node->unit = u;
  std::vector<const Tensor*> inputs;
  for (size_t i : U.members) inputs.push_back(&params[i]->param);
  detail::connect(*node, inputs);
  node->num_outputs = uint32_t(U.members.size());
  for (size_t k = 0; k < U.copies.size(); ++k) detail::set_history(U.copies[k], node, uint32_t(k));
  U.awaiting = node;
}

void FsdpState::install(size_t u) {
  FsdpUnit& U = units[u];
  for (size_t k = 0; k < U.members.size(); ++k)
    for (Tensor* slot : params[U.members[k]]->slots) *slot = U.copies[k];
  U.installed = true;
}

// Also drops the copies: from here on only the graph holds them, so a graph
// dropped without backward frees the gather node (`awaiting` expires).
void FsdpState::uninstall(size_t u) {
  FsdpUnit& U = units[u];
  for (size_t i : U.members)
    for (Tensor* slot : params[i]->slots) *slot = params[i]->param;
  U.installed = false;
  U.copies.clear();
  U.linked = false;
}

// The fast path: the unit's module is called through operator().
void FsdpState::before_forward(size_t u) {
  FsdpUnit& U = units[u];
  // Already installed by a use earlier in this forward: those copies (and
  // their one gather node) serve the module too.
  if (U.installed && (U.linked || !needs_grad(u))) return;
  if (needs_grad(u)) check_not_awaiting(u, nullptr);  // before any collective: every rank stops at the same point
  gather(u);
  if (u + 1 < units.size()) prefetch(u + 1);  // the next unit's all-gather runs while this one computes
  make_copies(u);
  install(u);
  U.on_use = false;
}

void FsdpState::after_forward(size_t u, const Tensor& output, bool keep) {
  if (units[u].on_use) return;  // gathered on use: its post-backward releases it
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
  U.awaiting.reset();
  release(u);
}

// An op used parameter i's shard (DistInfo::on_use): the gathered copy of
// this forward, gathering the unit first if no copy is there.
Tensor FsdpState::resolve(size_t i) {
  const auto [u, k] = where[i];
  FsdpUnit& U = units[u];
  const bool grad = needs_grad(u);
  // The copies of this forward (installed), or -- without grad -- copies
  // made for an earlier use without grad (never installed: a later grad
  // forward reading one from a slot would send no gradient back).
  if (U.installed && (U.linked || !grad)) return U.copies[k];
  if (!grad && !U.copies.empty()) return U.copies[k];
  const DpParam& p = *params[i];
  if (grad) check_not_awaiting(u, &p);  // before any collective: every rank stops at the same point
  gather(u);
  if (u + 1 < units.size()) prefetch(u + 1);
  make_copies(u);
  if (grad) {
    install(u);  // the unit's other parameters are read from their slots: no lookup for them
    U.on_use = true;
  }
  // The root unit stays gathered from its forward to its backward either way
  // (backward needs it first): gathering it on use costs nothing, so only
  // blocks are worth a warning.
  if (!U.warned && log_rank && u != 0) {
    spdlog::warn(
        "fsdp: unit '{}' was gathered on first use (of '{}') because its module's forward hooks did not run (it was "
        "not called as (*module)(x)); it stays gathered until its backward (or the next after_step), so FSDP's "
        "memory saving does not apply to it",
        U.name, p.path);
  }
  U.warned = true;
  return U.copies[k];
}

void FsdpState::refuse_shard_grad(size_t i) const {
  const DpParam& p = *params[i];
  TESSEL_FAIL(kOp,
              "a gradient reached the shard of parameter '{}' ({}, FSDP unit '{}') directly: the shard was used "
              "outside FSDP's gathering (redistribute, full_tensor or to_local read the shard as it is), and the "
              "gradient of that use would be lost when finish() sets the reduce-scattered gradient. Use the "
              "parameter itself in ops (FSDP gathers it), or read it under NoGradGuard",
              p.path, p.param.desc(), units[where[i].first].name);
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
  S.where.resize(S.params.size());
  for (size_t i = 0; i < S.params.size(); ++i) {
    FsdpUnit& U = S.units[size_t(std::max(owner[i], 0))];
    S.where[i] = {size_t(std::max(owner[i], 0)), U.members.size()};
    U.members.push_back(i);
    U.any_grad = U.any_grad || S.params[i]->param.requires_grad();
  }
  S.log_rank = mesh->my_rank() == 0;

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

  // Every managed parameter (sharded or whole): ops on it use the gathered
  // copy (use hook), and a gradient reaching it directly is an error (the
  // gather node passes nothing on to it).
  const std::weak_ptr<FsdpState> weak = state_;
  S.leaf_hooks.resize(S.params.size());
  for (size_t i = 0; i < S.params.size(); ++i) {
    auto hook = std::make_shared<FsdpUseHook>();
    hook->state = weak;
    hook->param = i;
    raw::set_use_hook(S.params[i]->param, std::move(hook));
    S.leaf_hooks[i] = S.params[i]->param.register_hook([weak, i](const Tensor&) -> Tensor {
      if (auto st = weak.lock()) st->refuse_shard_grad(i);
      return Tensor();
    });
  }

  // Module hooks: the fast path. Units without parameters still take part
  // (their hooks do nothing but keep the prefetch chain simple).
  FsdpState* s = state_.get();
  const size_t n = S.units.size();
  for (size_t u = 0; u < n; ++u) {
    FsdpUnit& U = S.units[u];
    const bool is_root = u == 0;
    U.pre_hook = U.module->register_forward_pre_hook([s, u](nn::Module&, const Tensor& x) {
      s->before_forward(u);
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
  // The shards stay in the model (its slots, the optimizer): from now on
  // they are plain distributed tensors (and no slot keeps a gathered copy,
  // e.g. after an error in the middle of a forward).
  for (size_t u = 0; u < state_->units.size(); ++u) state_->uninstall(u);
  for (size_t i = 0; i < state_->params.size(); ++i) {
    raw::set_use_hook(state_->params[i]->param, nullptr);
    state_->params[i]->param.remove_hook(state_->leaf_hooks[i]);
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

int64_t Fsdp::gathered_bytes_now() const {
  int64_t n = 0;
  for (const FsdpUnit& U : state_->units)
    if (U.ag && !U.buffer.storage()->released()) n += int64_t(U.buffer.nbytes());
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
