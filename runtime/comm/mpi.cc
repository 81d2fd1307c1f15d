// The MPI backend: CPU ranks as processes (OpenMPI), launched by mpirun/srun.
//
// Every operation is a chain of stages of non-blocking MPI calls, polled
// against a deadline (mpi_work.h), so a stalled peer becomes a CommError
// naming the rank and the op instead of a hang. Reductions never use MPI's
// reduction ops: each rank receives its slice of every rank's buffer
// (pairwise MPI_Isend/MPI_Irecv, an all-to-all), combines the slices with the
// deterministic tree (reduce.h), and the reduced slices are all-gathered the
// same way — the bytes of a ring all-reduce, in two latency rounds.
//
// Before the data moves, the ranks exchange a small description of the call
// (detail::Meta, one MPI_Iallgather) so a mismatch (different op, dtype or
// size) is the same tessel::Error on every rank rather than memory corruption
// or a hang. TESSEL_COMM_CHECK=0 skips that exchange (one latency per op).
#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "runtime/comm/backend.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/mpi_work.h"
#include "runtime/comm/reduce.h"
#include "runtime/comm/tree.h"
#include "runtime/error.h"

namespace tessel::comm {
namespace {

using detail::Clock;
using detail::Meta;
using detail::OpKind;
using mpi_detail::check_mpi;
using mpi_detail::MpiWork;

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::Bool: return MPI_UINT8_T;
    case DType::Int32: return MPI_INT32_T;
    case DType::Int64: return MPI_INT64_T;
    case DType::Float16:
    case DType::BFloat16: return MPI_UINT16_T;  // moved as bits; arithmetic is ours
    case DType::Float32: return MPI_FLOAT;
    case DType::Float64: return MPI_DOUBLE;
  }
  return MPI_BYTE;
}

// MPI counts and displacements are int.
int as_int(int64_t v, const std::string& where) {
  if (v > INT_MAX) {
    throw Error(fmt::format(FMT_STRING("{}: {} elements exceed one MPI call's limit ({}); split the tensor"), where, v, INT_MAX));
  }
  return int(v);
}

bool meta_check_enabled() {
  static const bool on = [] {
    const char* s = std::getenv("TESSEL_COMM_CHECK");
    return !(s && std::string(s) == "0");
  }();
  return on;
}

struct MpiState {
  std::mutex mu;
  bool initialized = false;     // by init_mpi
  bool we_initialized = false;  // MPI_Init was ours to finalize
  std::vector<std::string> hosts;  // world rank -> host name (exchanged by init_mpi)
  bool init_timed_out = false;     // the identity exchange never completed: abort at exit
};
MpiState& state() {
  static MpiState* s = new MpiState;  // never destroyed: used from atexit
  return *s;
}

std::string world_host(int world_rank) {
  const auto& h = state().hosts;
  return world_rank >= 0 && size_t(world_rank) < h.size() ? h[size_t(world_rank)] : std::string("?");
}

// Message tags of the pairwise exchanges on a communicator's internal copy.
constexpr int kTagScatter = 1, kTagGather = 2, kTagAllToAll = 3, kTagMeta = 4;

class MpiComm final : public Communicator, public std::enable_shared_from_this<MpiComm> {
 public:
  // Takes ownership of `comm` (user point-to-point traffic) and makes an
  // internal copy for the collectives' own messages, so user tags never
  // match them.
  MpiComm(MPI_Comm comm, std::string name, std::vector<int> world_ranks)
      : comm_(comm), name_(std::move(name)), world_ranks_(std::move(world_ranks)) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    check_mpi(MPI_Comm_dup(comm_, &coll_), name_, "MPI_Comm_dup");
    MPI_Comm_set_errhandler(coll_, MPI_ERRORS_RETURN);
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // Queued operations point at this communicator (their stages use it) and
    // nothing can advance them any more.
    queue_->abandon(!finalized);
    if (finalized) return;
    // Requests still in flight (abandoned or timed-out operations) keep their
    // communicator until they complete: MPI_Comm_free only marks it.
    if (coll_ != MPI_COMM_NULL) MPI_Comm_free(&coll_);
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }
  std::string name() const override { return name_; }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }

  WorkPtr do_all_reduce(const Tensor& t, ReduceOp op, bool async) override;
  WorkPtr do_all_gather(const Tensor& in, const Tensor& out, bool async) override;
  WorkPtr do_all_gather_v(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts, bool async) override;
  WorkPtr do_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op, bool async) override;
  WorkPtr do_reduce_scatter_v(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts, ReduceOp op,
                           bool async) override;
  WorkPtr do_all_to_all(const Tensor& in, const Tensor& out, bool async) override;
  WorkPtr do_all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                       const std::vector<int64_t>& recv_counts, bool async) override;
  WorkPtr do_broadcast(const Tensor& t, int root, bool async) override;
  WorkPtr do_send(const Tensor& t, int dst, int tag, bool async) override;
  WorkPtr do_recv(const Tensor& t, int src, int tag, bool async) override;
  void do_barrier() override;
  std::shared_ptr<Communicator> split(int color, int key) override;

 private:
  std::shared_ptr<MpiWork> collective(const std::string& where) {
    auto w = std::make_shared<MpiWork>(queue_, pool_, where);
    w->describe_peer = peer_describer();
    return w;
  }
  std::shared_ptr<MpiWork> p2p(const std::string& where) {
    auto w = std::make_shared<MpiWork>(nullptr, pool_, where);
    w->describe_peer = peer_describer();
    return w;
  }
  // Weak: an operation must not keep its communicator alive (the caller's
  // MpiWorkHandle does; a queued operation owning it was a leak).
  std::function<std::string(int)> peer_describer() {
    std::weak_ptr<MpiComm> self = weak_from_this();
    return [self](int peer) {
      if (auto c = self.lock()) return c->describe_peer(peer);
      return fmt::format(FMT_STRING("rank {}"), peer);
    };
  }
  // "rank 1 (world rank 3, host node7)": a peer as the person reading a
  // timeout needs it -- which process, on which machine.
  std::string describe_peer(int peer) const {
    const int wr = world_ranks_[size_t(peer)];
    const std::string host = world_host(wr);
    if (name_ == "world") return fmt::format(FMT_STRING("rank {} (host {})"), peer, host);
    return fmt::format(FMT_STRING("rank {} (world rank {}, host {})"), peer, wr, host);
  }
  WorkPtr finish(const std::shared_ptr<MpiWork>& w, bool async) {
    // Post what can be posted now (an async send must be on the wire before
    // the caller blocks elsewhere); later stages advance in is_completed() and
    // wait().
    w->start();
    if (!async) {
      w->wait();
      return detail::done_work();
    }
    // The caller's handle keeps this communicator alive for the operation's
    // stages (mpi_work.h: who owns what).
    return std::make_shared<mpi_detail::MpiWorkHandle>(w, shared_from_this());
  }
  // Stage 0: every rank's Meta (and, for all_to_all_v, its send counts).
  void add_meta_stage(MpiWork& w, const Meta& m, const Tensor* mine, const std::vector<int64_t>* send_counts = nullptr);
  // Posts, for every peer s: a receive of w.rc[s] elements at rbuf + w.rd[s]
  // and a send of w.sc[s] elements from sbuf + w.sd[s]. Receives first, and
  // sends to rank+1, rank+2, ... so the ranks do not all start on one peer.
  void post_exchange(MpiWork& w, const void* sbuf, void* rbuf, DType dt, int tag);
  // Combines the received blocks (scratch, block s at s * len) with this
  // rank's own block by the tree; `out` may be `own`.
  void reduce_into(MpiWork& w, DType dt, ReduceOp op, const void* own, int64_t len, void* out) {
    const size_t isz = itemsize(dt);
    w.srcs.resize(size_t(size_));
    for (int s = 0; s < size_; ++s) {
      w.srcs[size_t(s)] = s == rank_ ? own : w.scratch_data() + size_t(s) * size_t(len) * isz;
    }
    tree_reduce(dt, op, w.srcs.data(), size_, len, out);
  }
  void zero_counts(MpiWork& w) {
    w.sc.assign(size_t(size_), 0);
    w.sd.assign(size_t(size_), 0);
    w.rc.assign(size_t(size_), 0);
    w.rd.assign(size_t(size_), 0);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;  // user send/recv
  MPI_Comm coll_ = MPI_COMM_NULL;  // collectives (meta exchange, pairwise data, bcast)
  int rank_ = 0, size_ = 1;
  std::string name_;
  std::vector<int> world_ranks_;
  std::shared_ptr<mpi_detail::OpQueue> queue_ = std::make_shared<mpi_detail::OpQueue>();
  std::shared_ptr<mpi_detail::ScratchPool> pool_ = std::make_shared<mpi_detail::ScratchPool>();
};

void MpiComm::add_meta_stage(MpiWork& w, const Meta& m, const Tensor* mine,
                             const std::vector<int64_t>* send_counts) {
  if (!meta_check_enabled()) return;
  w.my_meta = m;
  w.metas.resize(size_t(size_));
  const bool pairwise = send_counts != nullptr;
  if (pairwise) w.my_counts = *send_counts;  // the caller's vector may be gone when the stage runs
  // Pairwise messages rather than one MPI_Iallgather: the same latency at the
  // sizes tessel runs, and a peer that never arrives is known by name (a
  // timeout says which receive is still pending -- the stalled rank, the
  // host behind a dead link).
  w.then([this, pairwise](MpiWork& w) {
    w.meta_out.assign(size_t(size_), MpiWork::MetaMsg{});
    w.meta_in.assign(size_t(size_), MpiWork::MetaMsg{});
    constexpr int bytes = int(sizeof(MpiWork::MetaMsg));
    for (int i = 1; i < size_; ++i) {
      const int s = (rank_ + size_ - i) % size_;
      check_mpi(MPI_Irecv(&w.meta_in[size_t(s)], bytes, MPI_BYTE, s, kTagMeta, coll_, w.request(s)), w.where,
                "MPI_Irecv");
    }
    for (int i = 1; i < size_; ++i) {
      const int s = (rank_ + i) % size_;
      w.meta_out[size_t(s)].meta = w.my_meta;
      w.meta_out[size_t(s)].count = pairwise ? w.my_counts[size_t(s)] : 0;
      check_mpi(MPI_Isend(&w.meta_out[size_t(s)], bytes, MPI_BYTE, s, kTagMeta, coll_, w.request(s)), w.where,
                "MPI_Isend");
    }
  });
  // A copy of this rank's tensor description: `mine` may be gone when the stage runs.
  std::string my_desc = mine ? mine->desc() : std::string();
  w.then([this, my_desc, pairwise](MpiWork& w) {
    for (int s = 0; s < size_; ++s) w.metas[size_t(s)] = s == rank_ ? w.my_meta : w.meta_in[size_t(s)].meta;
    if (pairwise) {
      // peer_counts[s] = what rank s sends to this rank.
      w.peer_counts.resize(size_t(size_));
      for (int s = 0; s < size_; ++s) {
        w.peer_counts[size_t(s)] = s == rank_ ? w.my_counts[size_t(s)] : w.meta_in[size_t(s)].count;
      }
    }
    detail::check_metas(w.where, w.metas.data(), size_, [&](int r) {
      const Meta& m = w.metas[size_t(r)];
      if (OpKind(m.kind) == OpKind::AllGatherV || OpKind(m.kind) == OpKind::ReduceScatterV) {
        return r == rank_ ? fmt::format(FMT_STRING("counts [{}]"), fmt::join(w.my_counts, ", "))
                          : fmt::format(FMT_STRING("other counts (hash {:x})"), m.counts_hash);
      }
      return r == rank_ && !my_desc.empty() ? my_desc : detail::describe_meta(m);
    });
  });
}

void MpiComm::post_exchange(MpiWork& w, const void* sbuf, void* rbuf, DType dt, int tag) {
  const MPI_Datatype ty = mpi_type(dt);
  const size_t isz = itemsize(dt);
  for (int i = 1; i < size_; ++i) {
    const int s = (rank_ + size_ - i) % size_;
    if (w.rc[size_t(s)] == 0) continue;
    check_mpi(MPI_Irecv(static_cast<char*>(rbuf) + size_t(w.rd[size_t(s)]) * isz, w.rc[size_t(s)], ty, s, tag, coll_,
                        w.request(s)),
              w.where, "MPI_Irecv");
  }
  for (int i = 1; i < size_; ++i) {
    const int s = (rank_ + i) % size_;
    if (w.sc[size_t(s)] == 0) continue;
    check_mpi(MPI_Isend(static_cast<const char*>(sbuf) + size_t(w.sd[size_t(s)]) * isz, w.sc[size_t(s)], ty, s, tag,
                        coll_, w.request(s)),
              w.where, "MPI_Isend");
  }
}

WorkPtr MpiComm::do_all_reduce(const Tensor& t, ReduceOp op, bool async) {
  detail::TraceComm trace("all_reduce", *this, int64_t(t.nbytes()), -1, async);
  auto w = collective(detail::where(*this, "all_reduce", op));
  detail::check_tensor(w->where, t, "tensor", DeviceType::CPU);
  check_reduce_dtype(w->where, t.dtype(), op);
  as_int(t.numel(), w->where);
  if (size_ == 1) return detail::done_work();  // one contribution: the tree is the value (x / 1 == x)
  add_meta_stage(*w, detail::make_meta(OpKind::AllReduce, &t, nullptr, int(op)), &t);
  // Reduce-scatter: slice s of every rank goes to rank s (ceil-division
  // slices); this rank's own slice is read in place.
  w->then([this, t](MpiWork& w) {
    const int64_t numel = t.numel();
    const int64_t len = slice_len(numel, size_, rank_);
    w.scratch(size_t(size_) * size_t(len) * t.itemsize());
    zero_counts(w);
    for (int s = 0; s < size_; ++s) {
      if (s == rank_) continue;
      w.sc[size_t(s)] = int(slice_len(numel, size_, s));
      w.sd[size_t(s)] = int(slice_begin(numel, size_, s));
      w.rc[size_t(s)] = int(len);
      w.rd[size_t(s)] = int(s * len);
    }
    post_exchange(w, t.raw_data(), w.scratch_data(), t.dtype(), kTagScatter);
  });
  // The tree over ranks on this rank's slice, then all-gather of the slices.
  w->then([this, t, op](MpiWork& w) {
    const int64_t numel = t.numel();
    const int64_t lo = slice_begin(numel, size_, rank_), len = slice_len(numel, size_, rank_);
    char* base = static_cast<char*>(t.raw_data());
    reduce_into(w, t.dtype(), op, base + size_t(lo) * t.itemsize(), len, base + size_t(lo) * t.itemsize());
    for (int s = 0; s < size_; ++s) {
      if (s == rank_) continue;
      w.sc[size_t(s)] = int(len);
      w.sd[size_t(s)] = int(lo);
      w.rc[size_t(s)] = int(slice_len(numel, size_, s));
      w.rd[size_t(s)] = int(slice_begin(numel, size_, s));
    }
    post_exchange(w, t.raw_data(), t.raw_data(), t.dtype(), kTagGather);
  });
  return finish(w, async);
}

WorkPtr MpiComm::do_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op, bool async) {
  detail::TraceComm trace("reduce_scatter", *this, int64_t(in.nbytes()), -1, async);
  const std::string wh = detail::where(*this, "reduce_scatter", op);
  detail::check_tensor(wh, in, "input", DeviceType::CPU);
  detail::check_tensor(wh, out, "output", DeviceType::CPU);
  if (in.numel() != out.numel() * size_ || in.dtype() != out.dtype()) {
    TESSEL_FAIL(wh, "input must hold size() = {} blocks of the output: input {}, output {}", size_, in.desc(),
                out.desc());
  }
  return reduce_scatter_v(in, out, std::vector<int64_t>(size_t(size_), out.numel()), op, async);
}

WorkPtr MpiComm::do_reduce_scatter_v(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts,
                                  ReduceOp op, bool async) {
  detail::TraceComm trace("reduce_scatter_v", *this, int64_t(in.nbytes()), -1, async);
  auto w = collective(detail::where(*this, "reduce_scatter_v", op));
  detail::check_tensor(w->where, in, "input", DeviceType::CPU);
  detail::check_tensor(w->where, out, "output", DeviceType::CPU);
  detail::check_counts(w->where, counts, size_, "counts");
  check_reduce_dtype(w->where, in.dtype(), op);
  if (in.dtype() != out.dtype() || in.numel() != detail::sum_counts(counts) || out.numel() != counts[size_t(rank_)]) {
    TESSEL_FAIL(w->where, "input must hold sum(counts) = {} and output counts[{}] = {} elements of one dtype: input {}, "
                "output {}",
                detail::sum_counts(counts), rank_, counts[size_t(rank_)], in.desc(), out.desc());
  }
  as_int(in.numel(), w->where);
  w->my_counts = counts;
  add_meta_stage(*w, detail::make_meta(OpKind::ReduceScatterV, &in, &out, int(op), -1, &counts), &in);
  w->then([this, in](MpiWork& w) {
    const int64_t len = w.my_counts[size_t(rank_)];
    w.scratch(size_t(size_) * size_t(len) * in.itemsize());
    zero_counts(w);
    int64_t off = 0;
    for (int s = 0; s < size_; ++s) {
      if (s != rank_) {
        w.sc[size_t(s)] = int(w.my_counts[size_t(s)]);
        w.sd[size_t(s)] = int(off);
        w.rc[size_t(s)] = int(len);
        w.rd[size_t(s)] = int(s * len);
      }
      off += w.my_counts[size_t(s)];
    }
    post_exchange(w, in.raw_data(), w.scratch_data(), in.dtype(), kTagScatter);
  });
  w->then([this, in, out, op](MpiWork& w) {
    int64_t off = 0;
    for (int s = 0; s < rank_; ++s) off += w.my_counts[size_t(s)];
    reduce_into(w, in.dtype(), op, static_cast<const char*>(in.raw_data()) + size_t(off) * in.itemsize(),
                w.my_counts[size_t(rank_)], out.raw_data());
  });
  return finish(w, async);
}

WorkPtr MpiComm::do_all_gather(const Tensor& in, const Tensor& out, bool async) {
  detail::TraceComm trace("all_gather", *this, int64_t(in.nbytes()), -1, async);
  const std::string wh = detail::where(*this, "all_gather");
  detail::check_tensor(wh, in, "input", DeviceType::CPU);
  detail::check_tensor(wh, out, "output", DeviceType::CPU);
  if (out.numel() != in.numel() * size_ || in.dtype() != out.dtype()) {
    TESSEL_FAIL(wh, "output must hold size() = {} copies of the input: input {}, output {}", size_, in.desc(),
                out.desc());
  }
  return all_gather_v(in, out, std::vector<int64_t>(size_t(size_), in.numel()), async);
}

WorkPtr MpiComm::do_all_gather_v(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts, bool async) {
  detail::TraceComm trace("all_gather_v", *this, int64_t(in.nbytes()), -1, async);
  auto w = collective(detail::where(*this, "all_gather_v"));
  detail::check_tensor(w->where, in, "input", DeviceType::CPU);
  detail::check_tensor(w->where, out, "output", DeviceType::CPU);
  detail::check_counts(w->where, counts, size_, "counts");
  if (in.dtype() != out.dtype() || in.numel() != counts[size_t(rank_)] || out.numel() != detail::sum_counts(counts)) {
    TESSEL_FAIL(w->where, "input must hold counts[{}] = {} and output sum(counts) = {} elements of one dtype: input {}, "
                "output {}",
                rank_, counts[size_t(rank_)], detail::sum_counts(counts), in.desc(), out.desc());
  }
  as_int(out.numel(), w->where);
  w->my_counts = counts;
  add_meta_stage(*w, detail::make_meta(OpKind::AllGatherV, &in, &out, -1, -1, &counts), &in);
  w->then([this, in, out](MpiWork& w) {
    zero_counts(w);
    int64_t off = 0, mine = 0;
    for (int s = 0; s < size_; ++s) {
      if (s == rank_) mine = off;
      w.rc[size_t(s)] = int(w.my_counts[size_t(s)]);
      w.rd[size_t(s)] = int(off);
      off += w.my_counts[size_t(s)];
    }
    for (int s = 0; s < size_; ++s) {
      w.sc[size_t(s)] = int(in.numel());
      w.sd[size_t(s)] = 0;
    }
    // Sends read `in`; this rank's own block is copied locally.
    char* own = static_cast<char*>(out.raw_data()) + size_t(mine) * in.itemsize();
    if (own != in.raw_data() && in.numel() > 0) std::memmove(own, in.raw_data(), in.nbytes());
    post_exchange(w, in.raw_data(), out.raw_data(), in.dtype(), kTagGather);
  });
  return finish(w, async);
}

WorkPtr MpiComm::do_all_to_all(const Tensor& in, const Tensor& out, bool async) {
  detail::TraceComm trace("all_to_all", *this, int64_t(in.nbytes()), -1, async);
  const std::string wh = detail::where(*this, "all_to_all");
  detail::check_tensor(wh, in, "input", DeviceType::CPU);
  detail::check_tensor(wh, out, "output", DeviceType::CPU);
  if (in.numel() % size_ != 0 || out.numel() != in.numel() || in.dtype() != out.dtype()) {
    TESSEL_FAIL(wh, "input and output must be size() = {} equal blocks of one dtype: input {}, output {}", size_,
                in.desc(), out.desc());
  }
  std::vector<int64_t> counts(size_t(size_), in.numel() / size_);
  return all_to_all_v(in, counts, out, counts, async);
}

WorkPtr MpiComm::do_all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                              const std::vector<int64_t>& recv_counts, bool async) {
  detail::TraceComm trace("all_to_all_v", *this, int64_t(in.nbytes()), -1, async);
  auto w = collective(detail::where(*this, "all_to_all_v"));
  detail::check_tensor(w->where, in, "input", DeviceType::CPU);
  detail::check_tensor(w->where, out, "output", DeviceType::CPU);
  detail::check_counts(w->where, send_counts, size_, "send_counts");
  detail::check_counts(w->where, recv_counts, size_, "recv_counts");
  if (in.dtype() != out.dtype() || in.numel() != detail::sum_counts(send_counts) ||
      out.numel() != detail::sum_counts(recv_counts)) {
    TESSEL_FAIL(w->where, "input must hold sum(send_counts) = {} and output sum(recv_counts) = {} elements of one "
                "dtype: input {}, output {}",
                detail::sum_counts(send_counts), detail::sum_counts(recv_counts), in.desc(), out.desc());
  }
  as_int(in.numel(), w->where);
  as_int(out.numel(), w->where);
  if (in.shares_storage(out)) TESSEL_FAIL(w->where, "input and output must not share storage");
  add_meta_stage(*w, detail::make_meta(OpKind::AllToAllV, &in, &out), &in, &send_counts);
  w->then([this, in, out, send = send_counts, recv = recv_counts](MpiWork& w) {
    if (!w.peer_counts.empty()) {
      // This rank sees what every rank sends to it; a mismatch fails on the
      // receiving rank (and, through the communicator's timeout, nowhere hangs).
      for (int s = 0; s < size_; ++s) {
        if (w.peer_counts[size_t(s)] != recv[size_t(s)]) {
          TESSEL_FAIL(w.where, "rank {} sends {} elements to rank {}, which expects recv_counts[{}] = {}", s,
                      w.peer_counts[size_t(s)], rank_, s, recv[size_t(s)]);
        }
      }
    }
    zero_counts(w);
    int64_t so = 0, ro = 0;
    for (int s = 0; s < size_; ++s) {
      w.sc[size_t(s)] = int(send[size_t(s)]);
      w.sd[size_t(s)] = int(so);
      w.rc[size_t(s)] = int(recv[size_t(s)]);
      w.rd[size_t(s)] = int(ro);
      if (s == rank_ && send[size_t(s)] > 0) {  // this rank's own block: a local copy
        std::memcpy(static_cast<char*>(out.raw_data()) + size_t(ro) * in.itemsize(),
                    static_cast<const char*>(in.raw_data()) + size_t(so) * in.itemsize(),
                    size_t(send[size_t(s)]) * in.itemsize());
      }
      so += send[size_t(s)];
      ro += recv[size_t(s)];
    }
    post_exchange(w, in.raw_data(), out.raw_data(), in.dtype(), kTagAllToAll);
  });
  return finish(w, async);
}

WorkPtr MpiComm::do_broadcast(const Tensor& t, int root, bool async) {
  detail::TraceComm trace("broadcast", *this, int64_t(t.nbytes()), -1, async);
  auto w = collective(detail::where(*this, "broadcast"));
  detail::check_tensor(w->where, t, "tensor", DeviceType::CPU);
  if (root < 0 || root >= size_) TESSEL_FAIL(w->where, "root {} is not a rank of this communicator", root);
  as_int(t.numel(), w->where);
  add_meta_stage(*w, detail::make_meta(OpKind::Broadcast, &t, nullptr, -1, root), &t);
  w->then([this, t, root](MpiWork& w) {
    check_mpi(MPI_Ibcast(t.raw_data(), int(t.numel()), mpi_type(t.dtype()), root, coll_, w.request()), w.where,
              "MPI_Ibcast");
  });
  return finish(w, async);
}

WorkPtr MpiComm::do_send(const Tensor& t, int dst, int tag, bool async) {
  detail::TraceComm trace("send", *this, int64_t(t.nbytes()), dst, async);
  auto w = p2p(detail::where(*this, "send"));
  detail::check_tensor(w->where, t, "tensor", DeviceType::CPU);
  if (dst < 0 || dst >= size_) TESSEL_FAIL(w->where, "destination {} is not a rank of this communicator", dst);
  if (tag < 0) TESSEL_FAIL(w->where, "tag {} is negative", tag);
  w->where += fmt::format(FMT_STRING(" to rank {} (tag {})"), dst, tag);
  as_int(t.numel(), w->where);
  w->then([this, t, dst, tag](MpiWork& w) {
    check_mpi(MPI_Isend(t.raw_data(), int(t.numel()), mpi_type(t.dtype()), dst, tag, comm_, w.request(dst)), w.where,
              "MPI_Isend");
  });
  return finish(w, async);
}

WorkPtr MpiComm::do_recv(const Tensor& t, int src, int tag, bool async) {
  detail::TraceComm trace("recv", *this, int64_t(t.nbytes()), src, async);
  auto w = p2p(detail::where(*this, "recv"));
  detail::check_tensor(w->where, t, "tensor", DeviceType::CPU);
  if (src < 0 || src >= size_) TESSEL_FAIL(w->where, "source {} is not a rank of this communicator", src);
  if (tag < 0) TESSEL_FAIL(w->where, "tag {} is negative", tag);
  w->where += fmt::format(FMT_STRING(" from rank {} (tag {})"), src, tag);
  as_int(t.numel(), w->where);
  const std::string expects = t.desc();
  w->on_request_error = [w_ = w.get(), src, expects](int code) {
    int cls = code;
    MPI_Error_class(code, &cls);
    if (cls == MPI_ERR_TRUNCATE) {
      throw Error(fmt::format(FMT_STRING("{}: rank {} sent more elements than this receive expects ({})"), w_->where, src, expects));
    }
  };
  w->then([this, t, src, tag](MpiWork& w) {
    check_mpi(MPI_Irecv(t.raw_data(), int(t.numel()), mpi_type(t.dtype()), src, tag, comm_, w.request(src)), w.where,
              "MPI_Irecv");
  });
  w->then([t, src, expects](MpiWork& w) {
    int count = 0;
    MPI_Get_count(&w.statuses()[0], mpi_type(t.dtype()), &count);
    if (count != t.numel()) {
      throw Error(fmt::format(FMT_STRING("{}: rank {} sent {} elements, but this receive expects {}"), w.where, src, count, expects));
    }
  });
  return finish(w, async);
}

void MpiComm::do_barrier() {
  detail::TraceComm trace("barrier", *this, 0);
  auto w = collective(detail::where(*this, "barrier"));
  if (meta_check_enabled()) {
    // The meta all-gather completes only when every rank has joined: a barrier.
    add_meta_stage(*w, detail::make_meta(OpKind::Barrier, nullptr, nullptr), nullptr);
  } else {
    w->then([this](MpiWork& w) { check_mpi(MPI_Ibarrier(coll_, w.request()), w.where, "MPI_Ibarrier"); });
  }
  finish(w, false);
}

std::shared_ptr<Communicator> MpiComm::split(int color, int key) {
  auto w = collective(detail::where(*this, "split"));
  // Every member must be present before the blocking MPI_Comm_split, so a
  // missing rank is a timeout here rather than a hang there.
  if (meta_check_enabled()) {
    add_meta_stage(*w, detail::make_meta(OpKind::Split, nullptr, nullptr), nullptr);
  } else {
    w->then([this](MpiWork& w) { check_mpi(MPI_Ibarrier(coll_, w.request()), w.where, "MPI_Ibarrier"); });
  }
  finish(w, false);
  MPI_Comm sub = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub), w->where, "MPI_Comm_split");
  if (sub == MPI_COMM_NULL) return nullptr;
  int n = 0;
  MPI_Comm_size(sub, &n);
  int mine = world_ranks_[size_t(rank_)];
  std::vector<int> ranks(static_cast<size_t>(n));
  check_mpi(MPI_Allgather(&mine, 1, MPI_INT, ranks.data(), 1, MPI_INT, sub), w->where, "MPI_Allgather");
  return std::make_shared<MpiComm>(sub, fmt::format(FMT_STRING("{}/split({})"), name_, color), std::move(ranks));
}

// ---- init / finalize -----------------------------------------------------------

// A hash of this process's executable (/proc/self/exe, 64-bit words mixed by
// multiply and xor-shift): the build id the ranks compare at init. Ranks of
// different builds may compute different bits or disagree on message
// layouts; across hosts that happens when one host has a stale binary. The
// file is a few MB to a few tens of MB: milliseconds, once per process.
uint64_t binary_hash() {
  std::FILE* f = std::fopen("/proc/self/exe", "rb");
  if (!f) return 0;  // no /proc: the check is skipped (every rank reports 0)
  uint64_t h = 0x9e3779b97f4a7c15ull, n = 0;
  std::vector<char> buf(size_t(1) << 20);
  size_t got;
  while ((got = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
    std::memset(buf.data() + got, 0, (8 - got % 8) % 8);  // the tail word padded with zeros
    for (size_t i = 0; i < got; i += 8) {
      uint64_t v;
      std::memcpy(&v, buf.data() + i, 8);
      h = (h ^ v) * 0xff51afd7ed558ccdull;
      h ^= h >> 32;
    }
    n += got;
  }
  std::fclose(f);
  return h ^ n;
}

bool build_check_enabled() {
  const char* s = std::getenv("TESSEL_BUILD_CHECK");
  return !(s && std::string(s) == "0");
}

// What each rank tells the others at init: its build and where it runs.
struct RankIdentity {
  uint64_t build = 0;
  int64_t pid = 0;
  char host[64] = {};
};

// One all-gather of RankIdentity over the world, bounded by the comm timeout
// (a rank that never gets here must not hang the others' init). Fills the
// host table the timeouts name peers with, and refuses mixed builds: the
// same tessel::Error on every rank, before any training starts.
void exchange_identities(MPI_Comm world) {
  int n = 0, me = 0;
  MPI_Comm_size(world, &n);
  MPI_Comm_rank(world, &me);
  RankIdentity mine;
  mine.build = build_check_enabled() ? binary_hash() : 0;
  mine.pid = int64_t(getpid());
  if (gethostname(mine.host, sizeof mine.host - 1) != 0) std::snprintf(mine.host, sizeof mine.host, "?");
  std::vector<RankIdentity> all(static_cast<size_t>(n));
  MPI_Request req = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallgather(&mine, int(sizeof mine), MPI_BYTE, all.data(), int(sizeof mine), MPI_BYTE, world, &req),
            "init_mpi", "MPI_Iallgather");
  const auto deadline = Clock::now() + default_timeout();
  for (int flag = 0;;) {
    check_mpi(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "init_mpi", "MPI_Test");
    if (flag) break;
    if (Clock::now() >= deadline) {
      // The request stays pending, and MPI_Finalize would wait for it:
      // finalize_mpi() calls MPI_Abort instead, which ends the job.
      state().init_timed_out = true;
      throw CommError(fmt::format(FMT_STRING("init_mpi (world of {}, rank {} on host {}): {} waiting for the other ranks "
                                             "to start (a host is unreachable, or a rank failed before init_mpi)"),
                                  n, me, mine.host, detail::timeout_message(default_timeout())));
    }
    sched_yield();
  }
  state().hosts.clear();
  for (const auto& r : all) state().hosts.emplace_back(r.host, strnlen(r.host, sizeof r.host));
  // Group the ranks by build; more than one group is an error.
  std::vector<uint64_t> builds;
  for (const auto& r : all) {
    if (std::find(builds.begin(), builds.end(), r.build) == builds.end()) builds.push_back(r.build);
  }
  if (builds.size() <= 1) return;
  std::vector<std::string> groups;
  for (uint64_t b : builds) {
    std::vector<std::string> who;
    for (int r = 0; r < n; ++r) {
      if (all[size_t(r)].build == b) who.push_back(fmt::format(FMT_STRING("rank {} (host {})"), r, state().hosts[size_t(r)]));
    }
    groups.push_back(fmt::format(FMT_STRING("build {:016x}: {}"), b, fmt::join(who, ", ")));
  }
  throw Error(fmt::format(
      FMT_STRING("init_mpi (world of {}): the ranks run different tessel builds (a hash of each rank's executable): {}. "
                 "Every rank must run the same binary: copy it to every host, or run it from a shared file system "
                 "(TESSEL_BUILD_CHECK=0 skips this check)"),
      n, fmt::join(groups, "; ")));
}

void do_init_mpi() {
  MpiState& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  if (st.initialized) return;
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    // One thread at a time makes MPI calls (SERIALIZED); the local backend
    // is the one that uses threads as ranks.
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
      throw CommError("init_mpi: MPI_Init_thread failed");
    }
    st.we_initialized = true;
  }
  // Our own copy of the world: tessel's traffic never matches the application's.
  MPI_Comm dup = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "init_mpi", "MPI_Comm_dup");
  int n = 0;
  MPI_Comm_size(dup, &n);
  std::vector<int> ranks(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ranks[size_t(i)] = i;
  // finalize_mpi uses the process-world static: construct it before the
  // atexit registration, so that it is destroyed after finalize_mpi runs.
  detail::set_process_world(nullptr);
  // Registered before the identity exchange: an init that fails there still
  // ends in finalize_mpi (MPI_Abort for a pending exchange), not a hang in
  // MPI_Finalize.
  st.initialized = true;
  std::atexit([] { finalize_mpi(); });
  if (n > 1) exchange_identities(dup);
  detail::set_process_world(std::make_shared<MpiComm>(dup, "world", std::move(ranks)));
}

void do_finalize_mpi() {
  MpiState& st = state();
  {
    std::lock_guard<std::mutex> lk(st.mu);
    if (!st.initialized) return;
    st.initialized = false;
  }
  // The world first: dropping it abandons operations still queued on it
  // (stale ones among them are checked next).
  detail::set_process_world(nullptr);
  // Operations that timed out or were abandoned may have completed since (the
  // peer arrived late).
  if (!mpi_detail::drain_stale(std::chrono::seconds(2)) || st.init_timed_out) {
    std::fprintf(stderr, "tessel: an MPI operation that timed out or was abandoned never completed; calling MPI_Abort\n");
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (st.we_initialized && !finalized) MPI_Finalize();
}

const bool registered = [] {
  detail::hooks().init_mpi = do_init_mpi;
  detail::hooks().finalize_mpi = do_finalize_mpi;
  return true;
}();

}  // namespace
}  // namespace tessel::comm
