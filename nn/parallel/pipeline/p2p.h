#pragma once
// Moving activations and gradients between pipeline ranks.
//
// What crosses a stage boundary is the local piece of a distributed tensor
// on the stage mesh (both sides have the same dp/tp/... dims and coordinates,
// so the piece is the receiver's piece too). An activation travels as a small
// int64 header (dtype, global shape, placements; one extra message, a few
// microseconds) and then the piece; the receiver re-wraps it over its own
// stage mesh. A gradient needs no header: it has the shape and layout of the
// output it belongs to, which the receiving side still holds, so its
// receive is posted as soon as the activation has been sent.
//
// Sends are asynchronous: the tensors are kept until their transfer is done
// (wait_sends at the end of a step), so two neighbours may send to each other
// at the same time without a deadlock on any backend. Receives block. The
// time spent blocked (receives, send calls, the final wait) is accumulated in
// wait_seconds(): the communication share of a pipeline step.
#include <vector>

#include "dtensor/mesh.h"
#include "runtime/comm/comm.h"
#include "runtime/tensor.h"

namespace tessel::parallel::pipeline {

class P2P {
 public:
  // `stage_mesh` may be null (pp is the only mesh dim: plain tensors).
  P2P(comm::CommPtr pp_comm, MeshPtr stage_mesh) : comm_(std::move(pp_comm)), mesh_(std::move(stage_mesh)) {}

  void send_act(const Tensor& t, int dst, int tag);
  // A tensor laid out as the sender's was (no autograd history).
  Tensor recv_act(int src, int tag);
  void send_grad(const Tensor& local_grad, int dst, int tag);
  // Posts the receive of the gradient of `output` (same global shape,
  // placements and dtype) without waiting: the executor posts it when it
  // sends the activation, so the transfer lands while other work runs.
  struct PendingRecv {
    Tensor grad;
    comm::WorkPtr work;
  };
  PendingRecv post_recv_grad(const Tensor& output, int src, int tag);
  Tensor wait(PendingRecv& r);
  // The tensor `t` of pp rank `root` on every pp rank (collective over pp).
  Tensor broadcast(const Tensor& t, int root);

  void wait_sends();
  double wait_seconds() const { return wait_s_; }
  void reset_wait() { wait_s_ = 0; }

 private:
  struct Pending {
    Tensor keep;
    comm::WorkPtr work;
  };
  void send(const Tensor& contiguous, int dst, int tag);
  void recv(const Tensor& t, int src, int tag);
  Tensor header_of(const Tensor& t) const;
  Tensor from_header(const Tensor& header, const char* what, Tensor* local_out) const;
  void drop_completed();

  comm::CommPtr comm_;
  MeshPtr mesh_;
  std::vector<Pending> pending_;
  double wait_s_ = 0;
};

}  // namespace tessel::parallel::pipeline
