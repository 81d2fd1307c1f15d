#pragma once
// The MPI backend's progress engine (internal to //runtime/comm:mpi).
//
// An operation is a chain of stages; a stage posts non-blocking MPI requests
// (or computes, e.g. the reduction tree), and the next stage runs when they
// have completed. Waiting is polling (MPI_Testall) against a deadline, so a
// stalled peer becomes a CommError rather than a hang.
#include <mpi.h>

#include <chrono>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm/backend.h"
#include "runtime/comm/comm.h"

namespace tessel::comm::mpi_detail {

using detail::Clock;

std::string mpi_error_string(int code);
// Throws CommError("<where>: <call> failed: <MPI's message>") unless rc is MPI_SUCCESS.
void check_mpi(int rc, const std::string& where, const char* call);

// Recycled scratch buffers (received slices): no allocation per call in
// steady state.
class ScratchPool {
 public:
  std::vector<char> take(size_t bytes);
  void give(std::vector<char>&& b);

 private:
  std::mutex mu_;
  std::vector<std::vector<char>> free_;
};

class OpQueue;

// One operation's state. Ownership (no cycle): the communicator owns its
// OpQueue, which owns the operations still posting their stages; an operation
// refers back to its communicator only through the raw `this` its stages
// capture, and to the queue weakly. What the caller gets is an MpiWorkHandle,
// which keeps the operation and its communicator alive (an async operation
// outlives the caller's last reference to its communicator). When the
// communicator goes (no caller holds it or one of its operations), its
// queued operations can never run again: OpQueue::abandon() fails them.
class MpiWork final : public std::enable_shared_from_this<MpiWork> {
 public:
  using Stage = std::function<void(MpiWork&)>;
  // queue: the communicator's collective queue (null for point-to-point).
  MpiWork(std::shared_ptr<OpQueue> queue, std::shared_ptr<ScratchPool> pool, std::string where);
  ~MpiWork();

  void then(Stage s) { stages_.push_back(std::move(s)); }
  // peer: the communicator rank the request waits on, or -1 for a request of
  // a collective call (MPI_Ibcast, ...) where MPI does not say which peer is
  // late. A timeout names the peers of the requests still pending.
  MPI_Request* request(int peer = -1) {
    reqs_.push_back(MPI_REQUEST_NULL);
    req_peers_.push_back(peer);
    return &reqs_.back();
  }
  const std::vector<MPI_Status>& statuses() const { return statuses_; }
  std::vector<char>& scratch(size_t bytes) {
    scratch_ = pool_->take(bytes);
    return scratch_;
  }
  char* scratch_data() { return scratch_.data(); }

  // Starts the operation: posts what can be posted now (collectives wait for
  // the earlier collectives of their communicator to post all their stages).
  void start();
  void wait();
  bool is_completed();

  // For an operation that timed out: have its pending requests completed
  // since? Never runs further stages; errors count as completed.
  bool requests_done();

  std::string where;
  Clock::time_point deadline;
  // Buffers that must live while requests are pending.
  detail::Meta my_meta;
  std::vector<detail::Meta> metas;
  // The cross-rank check's messages, one per peer: this rank's Meta and, for
  // all_to_all_v, how many elements it sends to that peer.
  struct MetaMsg {
    detail::Meta meta;
    int64_t count = 0;
  };
  std::vector<MetaMsg> meta_out, meta_in;
  std::vector<int> sc, sd, rc, rd;
  std::vector<int64_t> peer_counts, my_counts;
  std::vector<const void*> srcs;
  // Turns the MPI error of a completed request into a message (p2p truncation).
  std::function<void(int code)> on_request_error;
  // "rank 1 (world rank 3, host h2)": how a timeout names a peer (set by the
  // communicator; without it, "rank 1").
  std::function<std::string(int peer)> describe_peer;

 private:
  friend class OpQueue;
  // Runs stages while their requests complete; never throws (a failure is
  // stored and rethrown by wait()). True when done.
  bool step() noexcept;
  bool progress();  // step, respecting the collective queue
  bool all_posted() const { return done_ || next_ == stages_.size(); }
  [[noreturn]] void timeout();
  // Who the pending requests wait on: "rank 1 (world rank 3, host h2)", or
  // what is known when a collective call hides it.
  std::string pending_peers();
  // Its communicator is gone with this operation still queued: fail it
  // (mpi_alive: MPI is not finalized, so pending requests can be tested).
  void abandon(bool mpi_alive);

  // Weak: the queue holds its queued operations.
  std::weak_ptr<OpQueue> queue_;
  std::shared_ptr<ScratchPool> pool_;
  std::vector<char> scratch_;
  std::vector<Stage> stages_;
  size_t next_ = 0;
  std::vector<MPI_Request> reqs_;
  std::vector<int> req_peers_;  // parallel to reqs_
  std::vector<MPI_Status> statuses_;
  bool queued_ = false;
  bool done_ = false;
  std::exception_ptr error_;
};

// The collectives of one communicator post their MPI calls in the order they
// were created, on every rank, even when async operations are waited for in a
// different order (MPI requires the same collective order on all ranks, and
// the pairwise exchanges match messages in posting order).
class OpQueue {
 public:
  void push(const std::shared_ptr<MpiWork>& w);
  // Steps the front operations until one still has stages left to post.
  void advance();
  // The communicator is being destroyed: nothing can post the queued
  // operations' remaining stages. Each fails with a CommError (for whoever
  // still waits on it); one with MPI requests in flight is kept on the stale
  // list (its buffers must outlive them); the queue is emptied.
  void abandon(bool mpi_alive);

 private:
  std::deque<std::shared_ptr<MpiWork>> q_;
};

// What a caller holds for an operation: keeps the operation and its
// communicator (`owner`) alive while the caller may still wait on it.
class MpiWorkHandle final : public Work {
 public:
  MpiWorkHandle(std::shared_ptr<MpiWork> work, std::shared_ptr<void> owner)
      : work_(std::move(work)), owner_(std::move(owner)) {}
  void wait() override { work_->wait(); }
  bool is_completed() override { return work_->is_completed(); }

 private:
  std::shared_ptr<MpiWork> work_;
  std::shared_ptr<void> owner_;
};

// Operations that timed out or were abandoned with MPI requests in flight;
// finalize_mpi() checks whether they completed.
void register_stale(std::shared_ptr<MpiWork> w);
// True when every stale operation completed within `grace`; clears the list.
bool drain_stale(std::chrono::milliseconds grace);

}  // namespace tessel::comm::mpi_detail
