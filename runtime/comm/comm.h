#pragma once
// Collectives: one interface, three backends (docs/design.md §3).
//
//   local : N ranks as threads of one process (tests; an N-rank job on one
//           machine without a launcher). Started by run_local().
//   mpi   : CPU ranks as processes (OpenMPI), launched by mpirun/srun.
//   nccl  : GPU ranks, bootstrapped through MPI.
//
// Every call is SPMD: all members of a communicator call the same collectives
// in the same order with matching sizes and dtypes. Tensors are local,
// contiguous buffers (CPU for local/mpi, CUDA for nccl); a mismatch in size,
// dtype or contiguity is a tessel::Error naming the op, the rank and the
// shapes. A collective that cannot complete (a peer failed, a peer never
// arrived within the timeout) throws tessel::CommError naming the rank, the
// op and the communicator: no hangs.
//
// Determinism (docs/design.md §4 levels 2-3): Sum/Avg/Max/Min are never left to
// the transport's own reduction order. For every element, the ranks'
// contributions v[0..n) (in communicator rank order) are combined with the
// balanced tree of kernels/canonical.h's tree_combine:
//   for (w = 1; w < n; w *= 2) for (i = 0; i + w < n; i += 2w) v[i] = v[i] (op) v[i + w];
// Sum of 16-bit floats is computed in float32 and rounded once; Avg is the
// tree sum divided by n (then rounded). With n a power of two that divides the
// canonical chunk count V, the result finishes the same tree a single device
// would have built (docs/numerics.md). The transport moves the same bytes as
// a ring all-reduce: reduce-scatter (all-to-all of slices + local tree) then
// all-gather. Slices follow ceil-division (trailing slices short or empty).
// Sum/Max/Min accept every dtype but Sum of bool (use Max for "any", Min for
// "all"); Avg needs a floating dtype. Integer sums wrap.
//
// Before the data moves, the ranks compare what each passed (op, dtype, sizes,
// counts, root): a mismatch is the same tessel::Error on every rank, and the
// communicator stays usable. TESSEL_COMM_CHECK=0 skips this exchange on the
// mpi/nccl backends (one small all-gather per call). See docs/comm.md.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/capture.h"
#include "runtime/reduce_op.h"
#include "runtime/tensor.h"
#include "runtime/timeline.h"

namespace tessel::comm {

// Timeout for any single collective: TESSEL_COMM_TIMEOUT (seconds, default 300).
// On the mpi/nccl backends a timed-out communicator must not be used again:
// its peers' state is unknown (finalize_mpi() calls MPI_Abort if the stalled
// operation never completes; NCCL communicators are aborted).
std::chrono::milliseconds default_timeout();
void set_default_timeout(std::chrono::milliseconds t);

// Handle on an asynchronous collective. wait() rethrows its failure;
// is_completed() never throws (a failed operation counts as completed).
// Asynchronous operations of one communicator are issued to the transport in
// the order they were started, whatever order they are waited for in. The
// local backend completes collectives eagerly (async only defers receives);
// tensors passed to an async operation must stay alive and untouched until it
// has completed.
// Seconds this thread has spent blocked in collectives and point-to-point
// waits so far (rendezvous, receives, MPI/NCCL completion waits): the
// trainer reports its per-step delta as comm_wait_s.
double thread_wait_seconds();
namespace detail {
void add_wait_seconds(double s);
// Adds the scope's duration to thread_wait_seconds().
// Also a "wait" span on the thread's timeline (runtime/timeline.h).
class WaitTimer {
 public:
  WaitTimer();
  ~WaitTimer();
  WaitTimer(const WaitTimer&) = delete;
  WaitTimer& operator=(const WaitTimer&) = delete;

 private:
  int64_t t0_ns_;
  timeline::Recorder* trace_;
};
}  // namespace detail

class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool is_completed() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;  // in this communicator
  virtual int size() const = 0;
  virtual const char* backend() const = 0;   // "local" | "mpi" | "nccl"
  virtual std::string name() const = 0;      // for errors: "world", "world/split(1)", ...
  // What the communicator serves, when its creator says: a mesh labels each
  // dim's communicator with the dim's name ("tp"). Timelines show it.
  const std::string& label() const { return label_; }
  void set_label(std::string label) { label_ = std::move(label); }
  // World ranks of the members, in this communicator's rank order.
  virtual const std::vector<int>& world_ranks() const = 0;

  // The collectives. Each is one non-virtual call in front of the
  // backend's do_* (below): in compile mode (runtime/capture.h) it is
  // recorded too, so a replay issues it again with the same arguments.
  //
  // In place on `t` (every rank passes the same shape/dtype).
  WorkPtr all_reduce(const Tensor& t, ReduceOp op, bool async = false);
  // out (size() * in.numel() elements) = the ranks' `in` concatenated in rank order.
  WorkPtr all_gather(const Tensor& in, const Tensor& out, bool async = false);
  // Uneven: rank r contributes counts[r] elements (in.numel() == counts[rank()]);
  // out holds sum(counts) elements in rank order.
  WorkPtr all_gather_v(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts, bool async = false);
  // in = size() equal blocks; out (in.numel() / size() elements) = reduction of block rank().
  WorkPtr reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op, bool async = false);
  // Uneven: block r of `in` has counts[r] elements; out has counts[rank()].
  WorkPtr reduce_scatter_v(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts, ReduceOp op,
                           bool async = false);
  // in = size() equal blocks; block r goes to rank r; out block s came from rank s.
  WorkPtr all_to_all(const Tensor& in, const Tensor& out, bool async = false);
  // send_counts[r] elements (consecutive in `in`, in rank order) go to rank r;
  // recv_counts[s] elements arrive from rank s (consecutive in `out`).
  WorkPtr all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                       const std::vector<int64_t>& recv_counts, bool async = false);
  WorkPtr broadcast(const Tensor& t, int root, bool async = false);
  WorkPtr send(const Tensor& t, int dst, int tag = 0, bool async = false);
  WorkPtr recv(const Tensor& t, int src, int tag = 0, bool async = false);
  void barrier();
  // MPI_Comm_split semantics: collective over this communicator; ranks with the
  // same color form a new communicator ordered by (key, old rank), named
  // "<parent>/split(<color>)". A negative color joins no group: returns null.
  virtual std::shared_ptr<Communicator> split(int color, int key) = 0;

  // One collective call, as compile mode records it (comm.cc).
  struct Call;

 protected:
  // The backend's collectives (the public calls above forward here).
  virtual WorkPtr do_all_reduce(const Tensor& t, ReduceOp op, bool async) = 0;
  virtual WorkPtr do_all_gather(const Tensor& in, const Tensor& out, bool async) = 0;
  virtual WorkPtr do_all_gather_v(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts,
                                  bool async) = 0;
  virtual WorkPtr do_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op, bool async) = 0;
  virtual WorkPtr do_reduce_scatter_v(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts,
                                      ReduceOp op, bool async) = 0;
  virtual WorkPtr do_all_to_all(const Tensor& in, const Tensor& out, bool async) = 0;
  virtual WorkPtr do_all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                                  const std::vector<int64_t>& recv_counts, bool async) = 0;
  virtual WorkPtr do_broadcast(const Tensor& t, int root, bool async) = 0;
  virtual WorkPtr do_send(const Tensor& t, int dst, int tag, bool async) = 0;
  virtual WorkPtr do_recv(const Tensor& t, int src, int tag, bool async) = 0;
  virtual void do_barrier() = 0;

 private:
  friend class CollectiveLaunch;
  WorkPtr issue(const Call& call);
  WorkPtr record(Call call);
  std::string label_;
};
using CommPtr = std::shared_ptr<Communicator>;

namespace detail {
// A "comm" span on the thread's timeline around one collective or transfer
// of a backend (runtime/timeline.h): its kind, bytes (this rank's input),
// group and the group's world ranks, or the peer of a send/recv.
class TraceComm {
 public:
  TraceComm(const char* what, const Communicator& c, int64_t bytes, int peer = -1, bool async = false)
      : r_(timeline::current()) {
    if (r_) begin(what, c, bytes, peer, async);
  }
  ~TraceComm() {
    if (r_) r_->end();
  }
  TraceComm(const TraceComm&) = delete;
  TraceComm& operator=(const TraceComm&) = delete;

 private:
  void begin(const char* what, const Communicator& c, int64_t bytes, int peer, bool async);
  timeline::Recorder* r_;
};
}  // namespace detail

// The communicator of every rank of the job, for the calling thread (the local
// backend keeps one per rank thread). Throws if no backend was started.
CommPtr world();
bool has_world();

// Runs fn(rank) on n threads, each a rank of a fresh local-backend world,
// with the caller's numerics settings (bitwise mode is per thread: a
// numerics::BitwiseGuard around run_local reaches every rank). Every
// collective checks that its ranks agree on those settings (numerics.h).
// Returns when all ranks are done; if any rank threw, the others' pending and
// later collectives fail promptly with CommError ("rank r failed: ..."), and
// the first failure is rethrown here (tessel::Error keeps its message).
void run_local(int n, const std::function<void(int rank)>& fn);

// MPI (link //runtime/comm:mpi): initialises MPI (idempotent) and makes
// world() the MPI world for this process. is_mpi_launch() tells whether the process was started by
// mpirun/srun (OMPI_COMM_WORLD_SIZE, PMI_SIZE, ...).
bool is_mpi_launch();
void init_mpi();
void finalize_mpi();  // also registered at exit by init_mpi

// NCCL (CUDA builds): initialises MPI, then makes world() a communicator over
// the MPI world's ranks with one GPU per rank (the rank's index on its
// machine, modulo the visible GPUs); tensors are CUDA tensors on that GPU.
// Throws a clear error in CPU-only builds, without a GPU, or when
// //runtime/comm:nccl is not linked.
void init_nccl();

}  // namespace tessel::comm
