#include "nn/parallel/pipeline/p2p.h"

#include <algorithm>
#include <chrono>

#include "autograd/grad_mode.h"
#include "dtensor/placement.h"
#include "runtime/capture.h"
#include "runtime/error.h"

namespace tessel::parallel::pipeline {
namespace {

constexpr const char* kOp = "pipeline p2p";
constexpr int kMaxTensorDims = 8;
constexpr int64_t kHeaderLen = 4 + kMaxTensorDims + kMaxMeshDims;
constexpr int64_t kMagic = 0x7e55e1;

// Adds the scope's duration to `acc`.
class WaitTimer {
 public:
  explicit WaitTimer(double& acc) : acc_(acc), t0_(std::chrono::steady_clock::now()) {}
  ~WaitTimer() { acc_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

 private:
  double& acc_;
  std::chrono::steady_clock::time_point t0_;
};

Tensor contiguous_local(const Tensor& t) {
  NoGradGuard ng;
  const Tensor& l = raw::local_of(t);
  return l.is_contiguous() ? l : l.contiguous();
}

}  // namespace

Tensor P2P::header_of(const Tensor& t) const {
  TESSEL_CHECK(t.dim() <= kMaxTensorDims, kOp, "activations of at most {} dims cross stages, got {}", kMaxTensorDims,
               t.desc());
  Tensor h = raw::empty({kHeaderLen}, DType::Int64);
  int64_t* p = h.data<int64_t>();
  std::fill(p, p + kHeaderLen, 0);
  const Placements pl = t.is_distributed() ? t.placements() : Placements();
  p[0] = kMagic;
  p[1] = int64_t(t.dtype());
  p[2] = t.dim();
  p[3] = pl.size();
  for (int d = 0; d < t.dim(); ++d) p[4 + d] = t.size(d);
  for (int m = 0; m < pl.size(); ++m)
    p[4 + kMaxTensorDims + m] = int64_t(pl[m].kind) * 256 + (pl[m].is_shard() ? pl[m].dim : int(pl[m].op));
  return h;
}

// Allocates the local piece described by `header` (in *local_out) and
// returns the distributed (or plain) tensor over it.
Tensor P2P::from_header(const Tensor& header, const char* what, Tensor* local_out) const {
  // Compile mode: the received shape chooses the buffer the data goes to; a
  // replay checks that the header is the recorded one (capture::ReplayDiverged
  // if not) instead of reading it.
  if (capture::Recorder* r = capture::active()) r->checked_read(header);
  const int64_t* p = header.data<int64_t>();
  TESSEL_CHECK(p[0] == kMagic && p[1] >= 0 && p[1] < kNumDTypes && p[2] >= 0 && p[2] <= kMaxTensorDims, kOp,
               "{} on '{}': the message is not an activation header (do all pp ranks run the same schedule?)", what,
               comm_->name());
  const DType dtype = DType(p[1]);
  Dims shape;
  for (int d = 0; d < p[2]; ++d) shape.push_back(p[4 + d]);
  const int n_pl = int(p[3]);
  const int mesh_dims = mesh_ ? mesh_->ndim() : 0;
  TESSEL_CHECK(n_pl == mesh_dims, kOp, "{} on '{}': the sender's activation has {} placements, this stage mesh {} has {} dims",
               what, comm_->name(), n_pl, mesh_ ? mesh_->str() : "(none)", mesh_dims);
  if (!mesh_) {
    *local_out = raw::empty(shape, dtype);
    return *local_out;
  }
  Placements pl;
  for (int m = 0; m < n_pl; ++m) {
    const int64_t code = p[4 + kMaxTensorDims + m];
    Placement x;
    x.kind = Placement::Kind(code / 256);
    if (x.is_shard()) x.dim = int8_t(code % 256);
    if (x.is_partial()) x.op = comm::ReduceOp(code % 256);
    pl.push_back(x);
  }
  const LocalGeometry g = local_geometry(shape, mesh_->shape(), pl, mesh_->coords());
  *local_out = raw::empty(g.shape, dtype);
  return raw::make_distributed(*local_out, mesh_, pl, shape);
}

void P2P::drop_completed() {
  // Compile mode: a send dropped here without a wait() would have no wait
  // in the recording, and which sends have completed depends on timing.
  // Under a recorder every send is waited for at wait_sends (the end of the
  // step), the same in both recordings and at every replay.
  if (capture::active() != nullptr) return;
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](Pending& s) { return s.work->is_completed(); }),
                 pending_.end());
}

void P2P::send(const Tensor& t, int dst, int tag) {
  WaitTimer timer(wait_s_);
  drop_completed();
  pending_.push_back({t, comm_->send(t, dst, tag, /*async=*/true)});
}

void P2P::recv(const Tensor& t, int src, int tag) {
  WaitTimer timer(wait_s_);
  comm_->recv(t, src, tag);
}

void P2P::send_act(const Tensor& t, int dst, int tag) {
  send(header_of(t), dst, tag);
  send(contiguous_local(t), dst, tag);  // same tag: messages of one channel arrive in order
}

Tensor P2P::recv_act(int src, int tag) {
  Tensor header = raw::empty({kHeaderLen}, DType::Int64);
  recv(header, src, tag);
  Tensor local;
  Tensor t = from_header(header, "recv_act", &local);
  recv(local, src, tag);
  return t;
}

void P2P::send_grad(const Tensor& g, int dst, int tag) { send(contiguous_local(g), dst, tag); }

P2P::PendingRecv P2P::post_recv_grad(const Tensor& output, int src, int tag) {
  WaitTimer timer(wait_s_);
  const Tensor& lo = raw::local_of(output);
  Tensor local = raw::empty(lo.shape(), output.dtype());
  PendingRecv r;
  r.work = comm_->recv(local, src, tag, /*async=*/true);
  r.grad = output.is_distributed() ? raw::make_distributed(local, output.mesh(), output.placements(), output.shape())
                                   : local;
  return r;
}

Tensor P2P::wait(PendingRecv& r) {
  WaitTimer timer(wait_s_);
  r.work->wait();
  r.work.reset();
  return std::move(r.grad);
}

Tensor P2P::broadcast(const Tensor& t, int root) {
  if (!comm_) return t;
  WaitTimer timer(wait_s_);
  const bool is_root = comm_->rank() == root;
  Tensor header = is_root ? header_of(t) : raw::empty({kHeaderLen}, DType::Int64);
  comm_->broadcast(header, root);
  if (is_root) {
    comm_->broadcast(contiguous_local(t), root);
    return t;
  }
  Tensor local;
  Tensor out = from_header(header, "broadcast", &local);
  comm_->broadcast(local, root);
  return out;
}

void P2P::wait_sends() {
  WaitTimer timer(wait_s_);
  for (Pending& s : pending_) s.work->wait();
  pending_.clear();
}

}  // namespace tessel::parallel::pipeline
