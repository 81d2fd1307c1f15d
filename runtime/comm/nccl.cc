// The NCCL backend: GPU ranks, one GPU per MPI rank, bootstrapped over MPI
// (rank 0's ncclUniqueId is broadcast). Built only when CUDA is detected.
//
// Reductions keep the deterministic order of the other backends: the slices
// are exchanged with grouped ncclSend/ncclRecv (an all-to-all), a CUDA kernel
// combines them with the same tree over ranks (nccl_tree.cu), and the reduced
// slices are all-gathered (ncclAllGather, or grouped send/recv when the slices
// are uneven). NCCL's own reduction (ring/tree order depending on size and
// topology) is never used for Sum/Avg/Max/Min.
//
// Each call first exchanges a small description over MPI (the same check as
// the MPI backend), then enqueues the NCCL work on the communicator's stream.
// A stream created with default flags orders itself after the legacy default
// stream, on which tessel's CUDA kernels run. Waiting polls cudaEventQuery and
// ncclCommGetAsyncError against the deadline; on a timeout the NCCL
// communicator is aborted (ncclCommAbort) and a CommError names the op.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <sched.h>

#include <climits>
#include <cstring>

#include "runtime/comm/backend.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/mpi_work.h"
#include "runtime/comm/nccl_tree.h"
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

void check_cuda(cudaError_t e, const std::string& where, const char* call) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw CommError(fmt::format(FMT_STRING("{}: {} failed: {}"), where, call, cudaGetErrorString(e)));
  }
}

void check_nccl(ncclResult_t r, const std::string& where, const char* call) {
  if (r != ncclSuccess) throw CommError(fmt::format(FMT_STRING("{}: {} failed: {}"), where, call, ncclGetErrorString(r)));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::Bool: return ncclUint8;
    case DType::Int32: return ncclInt32;
    case DType::Int64: return ncclInt64;
    case DType::Float16:
    case DType::BFloat16: return ncclFloat16;  // moved as 16-bit words; arithmetic is ours
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
  }
  return ncclUint8;
}

// An operation enqueued on the communicator's stream: done when its event is.
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<void> owner, ncclComm_t comm, cudaEvent_t ev, std::string where)
      : owner_(std::move(owner)), comm_(comm), ev_(ev), where_(std::move(where)),
        deadline_(Clock::now() + default_timeout()) {}
  ~NcclWork() override { cudaEventDestroy(ev_); }
  void wait() override {
    detail::WaitTimer timer;
    int spins = 0;
    while (!is_completed()) {
      if (Clock::now() >= deadline_) {
        ncclCommAbort(comm_);  // unblocks the stream; the communicator is unusable from here
        throw CommError(fmt::format(FMT_STRING("{}: {} waiting for the GPU work (a peer stalled, failed or never called it); "
                                    "the NCCL communicator was aborted"),
                                    where_, detail::timeout_message(default_timeout())));
      }
      if (++spins > 64) sched_yield();
    }
    if (!error_.empty()) throw CommError(error_);
  }
  bool is_completed() override {
    if (done_) return true;
    cudaError_t e = cudaEventQuery(ev_);
    if (e == cudaSuccess) {
      done_ = true;
    } else if (e != cudaErrorNotReady) {
      cudaGetLastError();
      error_ = fmt::format(FMT_STRING("{}: the stream failed: {}"), where_, cudaGetErrorString(e));
      done_ = true;
    } else {
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        error_ = fmt::format(FMT_STRING("{}: NCCL failed: {}"), where_, ncclGetErrorString(async));
        done_ = true;
      }
    }
    return done_;
  }

 private:
  std::shared_ptr<void> owner_;  // the communicator (its buffers are in use until done)
  ncclComm_t comm_;
  cudaEvent_t ev_;
  std::string where_;
  Clock::time_point deadline_;
  bool done_ = false;
  std::string error_;
};

class NcclComm final : public Communicator, public std::enable_shared_from_this<NcclComm> {
 public:
  // Takes ownership of `mpi` (same members, same order) and `nccl`.
  NcclComm(MPI_Comm mpi, ncclComm_t nccl, int device, std::string name, std::vector<int> world_ranks)
      : mpi_(mpi), nccl_(nccl), device_(device), name_(std::move(name)), world_ranks_(std::move(world_ranks)) {
    MPI_Comm_set_errhandler(mpi_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(mpi_, &rank_);
    MPI_Comm_size(mpi_, &size_);
    check_cuda(cudaSetDevice(device_), name_, "cudaSetDevice");
    check_cuda(cudaStreamCreate(&stream_), name_, "cudaStreamCreate");
  }
  ~NcclComm() override {
    cudaSetDevice(device_);
    if (scratch_) cudaFree(scratch_);
    if (stream_) cudaStreamDestroy(stream_);
    if (nccl_) ncclCommDestroy(nccl_);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && mpi_ != MPI_COMM_NULL) MPI_Comm_free(&mpi_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }
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
  void check_gpu_tensor(const std::string& where, const Tensor& t, const char* role) {
    detail::check_tensor(where, t, role, DeviceType::CUDA);
    if (t.device().index != device_) {
      TESSEL_FAIL(where, "{} is on {}, but this rank's GPU is cuda:{}", role, t.device().str(), device_);
    }
  }
  // The same description exchange as the MPI backend (blocking, bounded).
  void check_meta(const std::string& where, const Meta& m, const Tensor* mine);
  void* scratch(size_t bytes) {
    if (bytes > scratch_bytes_) {
      // Grows only; freeing waits for the stream's earlier users of the old buffer.
      if (scratch_) {
        check_cuda(cudaStreamSynchronize(stream_), name_, "cudaStreamSynchronize");
        cudaFree(scratch_);
      }
      check_cuda(cudaMalloc(&scratch_, bytes), name_, "cudaMalloc");
      scratch_bytes_ = bytes;
    }
    return scratch_;
  }
  // Enqueues a grouped exchange: for every peer s, recv rc[s] elements to
  // rbuf + rd[s], send sc[s] elements from sbuf + sd[s].
  void exchange(const std::string& where, DType dt, const void* sbuf, const std::vector<int64_t>& sc,
                const std::vector<int64_t>& sd, void* rbuf, const std::vector<int64_t>& rc,
                const std::vector<int64_t>& rd);
  WorkPtr finish(const std::string& where, bool async) {
    cudaEvent_t ev;
    check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), where, "cudaEventCreate");
    check_cuda(cudaEventRecord(ev, stream_), where, "cudaEventRecord");
    auto w = std::make_shared<NcclWork>(shared_from_this(), nccl_, ev, where);
    if (!async) w->wait();
    return w;
  }
  char* at(const Tensor& t, int64_t elem) const { return static_cast<char*>(t.raw_data()) + size_t(elem) * t.itemsize(); }

  MPI_Comm mpi_ = MPI_COMM_NULL;
  ncclComm_t nccl_ = nullptr;
  int device_ = 0;
  int rank_ = 0, size_ = 1;
  std::string name_;
  std::vector<int> world_ranks_;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  std::shared_ptr<mpi_detail::OpQueue> queue_ = std::make_shared<mpi_detail::OpQueue>();
  std::shared_ptr<mpi_detail::ScratchPool> pool_ = std::make_shared<mpi_detail::ScratchPool>();
};

void NcclComm::check_meta(const std::string& where, const Meta& m, const Tensor* mine) {
  auto w = std::make_shared<MpiWork>(queue_, pool_, where);
  w->my_meta = m;
  w->metas.resize(static_cast<size_t>(size_));
  w->then([this](MpiWork& w) {
    check_mpi(MPI_Iallgather(&w.my_meta, int(sizeof(Meta)), MPI_BYTE, w.metas.data(), int(sizeof(Meta)), MPI_BYTE,
                             mpi_, w.request()),
              w.where, "MPI_Iallgather");
  });
  w->start();
  w->wait();
  detail::check_metas(where, w->metas.data(), size_, [&](int r) {
    return r == rank_ && mine ? mine->desc() : detail::describe_meta(w->metas[size_t(r)]);
  });
}

void NcclComm::exchange(const std::string& where, DType dt, const void* sbuf, const std::vector<int64_t>& sc,
                        const std::vector<int64_t>& sd, void* rbuf, const std::vector<int64_t>& rc,
                        const std::vector<int64_t>& rd) {
  const size_t isz = itemsize(dt);
  check_nccl(ncclGroupStart(), where, "ncclGroupStart");
  for (int s = 0; s < size_; ++s) {
    if (s == rank_) continue;
    if (rc[size_t(s)] > 0) {
      check_nccl(ncclRecv(static_cast<char*>(rbuf) + size_t(rd[size_t(s)]) * isz, size_t(rc[size_t(s)]),
                          nccl_type(dt), s, nccl_, stream_),
                 where, "ncclRecv");
    }
    if (sc[size_t(s)] > 0) {
      check_nccl(ncclSend(static_cast<const char*>(sbuf) + size_t(sd[size_t(s)]) * isz, size_t(sc[size_t(s)]),
                          nccl_type(dt), s, nccl_, stream_),
                 where, "ncclSend");
    }
  }
  check_nccl(ncclGroupEnd(), where, "ncclGroupEnd");
}

WorkPtr NcclComm::do_all_reduce(const Tensor& t, ReduceOp op, bool async) {
  detail::TraceComm trace("all_reduce", *this, int64_t(t.nbytes()), -1, async);
  const std::string w = detail::where(*this, "all_reduce", op);
  check_gpu_tensor(w, t, "tensor");
  check_reduce_dtype(w, t.dtype(), op);
  if (size_ == 1) return detail::done_work();
  check_meta(w, detail::make_meta(OpKind::AllReduce, &t, nullptr, int(op)), &t);
  const int64_t numel = t.numel(), lo = slice_begin(numel, size_, rank_), len = slice_len(numel, size_, rank_);
  const size_t isz = t.itemsize();
  char* recv = static_cast<char*>(scratch(size_t(size_) * size_t(len) * isz + 1));
  const size_t n = static_cast<size_t>(size_);
  std::vector<int64_t> sc(n), sd(n), rc(n), rd(n);
  for (int s = 0; s < size_; ++s) {
    sc[size_t(s)] = slice_len(numel, size_, s);
    sd[size_t(s)] = slice_begin(numel, size_, s);
    rc[size_t(s)] = len;
    rd[size_t(s)] = int64_t(s) * len;
  }
  exchange(w, t.dtype(), t.raw_data(), sc, sd, recv, rc, rd);
  if (const char* err = nccl_detail::launch_rank_tree(t.dtype(), int(op), recv, at(t, lo), rank_, size_, len, at(t, lo),
                                                      stream_)) {
    throw CommError(fmt::format(FMT_STRING("{}: reduction kernel: {}"), w, err));
  }
  if (numel % size_ == 0) {
    check_nccl(ncclAllGather(at(t, lo), t.raw_data(), size_t(len), nccl_type(t.dtype()), nccl_, stream_),
               w, "ncclAllGather");
  } else {
    for (int s = 0; s < size_; ++s) {
      sc[size_t(s)] = len;
      sd[size_t(s)] = lo;
      rc[size_t(s)] = slice_len(numel, size_, s);
      rd[size_t(s)] = slice_begin(numel, size_, s);
    }
    exchange(w, t.dtype(), t.raw_data(), sc, sd, t.raw_data(), rc, rd);
  }
  return finish(w, async);
}

WorkPtr NcclComm::do_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op, bool async) {
  detail::TraceComm trace("reduce_scatter", *this, int64_t(in.nbytes()), -1, async);
  const std::string w = detail::where(*this, "reduce_scatter", op);
  if (in.numel() != out.numel() * size_ || in.dtype() != out.dtype()) {
    TESSEL_FAIL(w, "input must hold size() = {} blocks of the output: input {}, output {}", size_, in.desc(),
                out.desc());
  }
  return reduce_scatter_v(in, out, std::vector<int64_t>(static_cast<size_t>(size_), out.numel()), op, async);
}

WorkPtr NcclComm::do_reduce_scatter_v(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts,
                                   ReduceOp op, bool async) {
  detail::TraceComm trace("reduce_scatter_v", *this, int64_t(in.nbytes()), -1, async);
  const std::string w = detail::where(*this, "reduce_scatter_v", op);
  check_gpu_tensor(w, in, "input");
  check_gpu_tensor(w, out, "output");
  detail::check_counts(w, counts, size_, "counts");
  check_reduce_dtype(w, in.dtype(), op);
  if (in.dtype() != out.dtype() || in.numel() != detail::sum_counts(counts) || out.numel() != counts[size_t(rank_)]) {
    TESSEL_FAIL(w, "input must hold sum(counts) = {} and output counts[{}] = {} elements of one dtype: input {}, "
                "output {}",
                detail::sum_counts(counts), rank_, counts[size_t(rank_)], in.desc(), out.desc());
  }
  check_meta(w, detail::make_meta(OpKind::ReduceScatterV, &in, &out, int(op), -1, &counts), &in);
  const int64_t len = counts[size_t(rank_)];
  char* recv = static_cast<char*>(scratch(size_t(size_) * size_t(len) * in.itemsize() + 1));
  const size_t n = static_cast<size_t>(size_);
  std::vector<int64_t> sc(counts), sd(n), rc(n, len), rd(n);
  int64_t off = 0, mine = 0;
  for (int s = 0; s < size_; ++s) {
    if (s == rank_) mine = off;
    sd[size_t(s)] = off;
    rd[size_t(s)] = int64_t(s) * len;
    off += counts[size_t(s)];
  }
  exchange(w, in.dtype(), in.raw_data(), sc, sd, recv, rc, rd);
  if (const char* err = nccl_detail::launch_rank_tree(in.dtype(), int(op), recv, at(in, mine), rank_, size_, len,
                                                      out.raw_data(), stream_)) {
    throw CommError(fmt::format(FMT_STRING("{}: reduction kernel: {}"), w, err));
  }
  return finish(w, async);
}

WorkPtr NcclComm::do_all_gather(const Tensor& in, const Tensor& out, bool async) {
  detail::TraceComm trace("all_gather", *this, int64_t(in.nbytes()), -1, async);
  const std::string w = detail::where(*this, "all_gather");
  if (out.numel() != in.numel() * size_ || in.dtype() != out.dtype()) {
    TESSEL_FAIL(w, "output must hold size() = {} copies of the input: input {}, output {}", size_, in.desc(),
                out.desc());
  }
  return all_gather_v(in, out, std::vector<int64_t>(static_cast<size_t>(size_), in.numel()), async);
}

WorkPtr NcclComm::do_all_gather_v(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts, bool async) {
  detail::TraceComm trace("all_gather_v", *this, int64_t(in.nbytes()), -1, async);
  const std::string w = detail::where(*this, "all_gather_v");
  check_gpu_tensor(w, in, "input");
  check_gpu_tensor(w, out, "output");
  detail::check_counts(w, counts, size_, "counts");
  if (in.dtype() != out.dtype() || in.numel() != counts[size_t(rank_)] || out.numel() != detail::sum_counts(counts)) {
    TESSEL_FAIL(w, "input must hold counts[{}] = {} and output sum(counts) = {} elements of one dtype: input {}, "
                "output {}",
                rank_, counts[size_t(rank_)], detail::sum_counts(counts), in.desc(), out.desc());
  }
  check_meta(w, detail::make_meta(OpKind::AllGatherV, &in, &out, -1, -1, &counts), &in);
  bool even = true;
  for (int64_t c : counts) even = even && c == counts[0];
  if (even) {
    check_nccl(ncclAllGather(in.raw_data(), out.raw_data(), size_t(in.numel()), nccl_type(in.dtype()),
                             nccl_, stream_),
               w, "ncclAllGather");
    return finish(w, async);
  }
  const size_t n = static_cast<size_t>(size_);
  std::vector<int64_t> sc(n, in.numel()), sd(n, 0), rc(counts), rd(n);
  int64_t off = 0;
  for (int s = 0; s < size_; ++s) {
    rd[size_t(s)] = off;
    if (s == rank_ && in.numel() > 0) {
      check_cuda(cudaMemcpyAsync(at(out, off), in.raw_data(), in.nbytes(), cudaMemcpyDeviceToDevice, stream_), w,
                 "cudaMemcpyAsync");
    }
    off += counts[size_t(s)];
  }
  exchange(w, in.dtype(), in.raw_data(), sc, sd, out.raw_data(), rc, rd);
  return finish(w, async);
}

WorkPtr NcclComm::do_all_to_all(const Tensor& in, const Tensor& out, bool async) {
  detail::TraceComm trace("all_to_all", *this, int64_t(in.nbytes()), -1, async);
  const std::string w = detail::where(*this, "all_to_all");
  if (in.numel() % size_ != 0 || out.numel() != in.numel() || in.dtype() != out.dtype()) {
    TESSEL_FAIL(w, "input and output must be size() = {} equal blocks of one dtype: input {}, output {}", size_,
                in.desc(), out.desc());
  }
  std::vector<int64_t> counts(static_cast<size_t>(size_), in.numel() / size_);
  return all_to_all_v(in, counts, out, counts, async);
}

WorkPtr NcclComm::do_all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                               const std::vector<int64_t>& recv_counts, bool async) {
  detail::TraceComm trace("all_to_all_v", *this, int64_t(in.nbytes()), -1, async);
  const std::string w = detail::where(*this, "all_to_all_v");
  check_gpu_tensor(w, in, "input");
  check_gpu_tensor(w, out, "output");
  detail::check_counts(w, send_counts, size_, "send_counts");
  detail::check_counts(w, recv_counts, size_, "recv_counts");
  if (in.dtype() != out.dtype() || in.numel() != detail::sum_counts(send_counts) ||
      out.numel() != detail::sum_counts(recv_counts)) {
    TESSEL_FAIL(w, "input must hold sum(send_counts) = {} and output sum(recv_counts) = {} elements of one dtype: "
                "input {}, output {}",
                detail::sum_counts(send_counts), detail::sum_counts(recv_counts), in.desc(), out.desc());
  }
  check_meta(w, detail::make_meta(OpKind::AllToAllV, &in, &out), &in);
  // Pairwise counts: every rank learns what the others send it.
  std::vector<int64_t> peer(static_cast<size_t>(size_));
  check_mpi(MPI_Alltoall(send_counts.data(), 1, MPI_INT64_T, peer.data(), 1, MPI_INT64_T, mpi_), w, "MPI_Alltoall");
  for (int s = 0; s < size_; ++s) {
    if (peer[size_t(s)] != recv_counts[size_t(s)]) {
      TESSEL_FAIL(w, "rank {} sends {} elements to rank {}, which expects recv_counts[{}] = {}", s, peer[size_t(s)],
                  rank_, s, recv_counts[size_t(s)]);
    }
  }
  std::vector<int64_t> sd(static_cast<size_t>(size_)), rd(static_cast<size_t>(size_));
  int64_t so = 0, ro = 0;
  for (int s = 0; s < size_; ++s) {
    sd[size_t(s)] = so;
    rd[size_t(s)] = ro;
    if (s == rank_ && send_counts[size_t(s)] > 0) {
      check_cuda(cudaMemcpyAsync(at(out, ro), at(in, so), size_t(send_counts[size_t(s)]) * in.itemsize(),
                                 cudaMemcpyDeviceToDevice, stream_),
                 w, "cudaMemcpyAsync");
    }
    so += send_counts[size_t(s)];
    ro += recv_counts[size_t(s)];
  }
  exchange(w, in.dtype(), in.raw_data(), send_counts, sd, out.raw_data(), recv_counts, rd);
  return finish(w, async);
}

WorkPtr NcclComm::do_broadcast(const Tensor& t, int root, bool async) {
  detail::TraceComm trace("broadcast", *this, int64_t(t.nbytes()), -1, async);
  const std::string w = detail::where(*this, "broadcast");
  check_gpu_tensor(w, t, "tensor");
  if (root < 0 || root >= size_) TESSEL_FAIL(w, "root {} is not a rank of this communicator", root);
  check_meta(w, detail::make_meta(OpKind::Broadcast, &t, nullptr, -1, root), &t);
  check_nccl(ncclBroadcast(t.raw_data(), t.raw_data(), size_t(t.numel()), nccl_type(t.dtype()), root,
                           nccl_, stream_),
             w, "ncclBroadcast");
  return finish(w, async);
}

// Point to point: a small MPI header (element count) travels first, so a size
// mismatch is an error on the receiver instead of a hang or a corruption.
WorkPtr NcclComm::do_send(const Tensor& t, int dst, int tag, bool async) {
  detail::TraceComm trace("send", *this, int64_t(t.nbytes()), dst, async);
  const std::string w = detail::where(*this, "send") + fmt::format(FMT_STRING(" to rank {} (tag {})"), dst, tag);
  check_gpu_tensor(w, t, "tensor");
  if (dst < 0 || dst >= size_) TESSEL_FAIL(w, "destination {} is not a rank of this communicator", dst);
  int64_t header[2] = {t.numel(), int64_t(t.dtype())};
  check_mpi(MPI_Send(header, 2, MPI_INT64_T, dst, tag, mpi_), w, "MPI_Send");
  check_nccl(ncclSend(t.raw_data(), size_t(t.numel()), nccl_type(t.dtype()), dst, nccl_, stream_), w,
             "ncclSend");
  return finish(w, async);
}

WorkPtr NcclComm::do_recv(const Tensor& t, int src, int tag, bool async) {
  detail::TraceComm trace("recv", *this, int64_t(t.nbytes()), src, async);
  const std::string w = detail::where(*this, "recv") + fmt::format(FMT_STRING(" from rank {} (tag {})"), src, tag);
  check_gpu_tensor(w, t, "tensor");
  if (src < 0 || src >= size_) TESSEL_FAIL(w, "source {} is not a rank of this communicator", src);
  auto hw = std::make_shared<MpiWork>(nullptr, pool_, w);
  hw->my_counts.resize(2);
  hw->then([this, src, tag](MpiWork& hw) {
    check_mpi(MPI_Irecv(hw.my_counts.data(), 2, MPI_INT64_T, src, tag, mpi_, hw.request()), hw.where, "MPI_Irecv");
  });
  hw->start();
  hw->wait();
  if (hw->my_counts[0] != t.numel() || hw->my_counts[1] != int64_t(t.dtype())) {
    TESSEL_FAIL(w, "rank {} sent {} elements of {}, but this receive expects {}", src, hw->my_counts[0],
                dtype_name(DType(hw->my_counts[1])), t.desc());
  }
  check_nccl(ncclRecv(t.raw_data(), size_t(t.numel()), nccl_type(t.dtype()), src, nccl_, stream_), w,
             "ncclRecv");
  return finish(w, async);
}

void NcclComm::do_barrier() {
  detail::TraceComm trace("barrier", *this, 0);
  const std::string w = detail::where(*this, "barrier");
  check_meta(w, detail::make_meta(OpKind::Barrier, nullptr, nullptr), nullptr);
  finish(w, false);  // this rank's earlier GPU work is done as well
}

std::shared_ptr<Communicator> NcclComm::split(int color, int key) {
  const std::string w = detail::where(*this, "split");
  check_meta(w, detail::make_meta(OpKind::Split, nullptr, nullptr), nullptr);
  MPI_Comm sub = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(mpi_, color < 0 ? MPI_UNDEFINED : color, key, &sub), w, "MPI_Comm_split");
  ncclComm_t nsub = nullptr;
  check_nccl(ncclCommSplit(nccl_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &nsub, nullptr), w, "ncclCommSplit");
  if (sub == MPI_COMM_NULL) return nullptr;
  int n = 0;
  MPI_Comm_size(sub, &n);
  int mine = world_ranks_[size_t(rank_)];
  std::vector<int> ranks(static_cast<size_t>(n));
  check_mpi(MPI_Allgather(&mine, 1, MPI_INT, ranks.data(), 1, MPI_INT, sub), w, "MPI_Allgather");
  return std::make_shared<NcclComm>(sub, nsub, device_, fmt::format(FMT_STRING("{}/split({})"), name_, color), std::move(ranks));
}

void do_init_nccl() {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    cudaGetLastError();
    throw Error("init_nccl: no CUDA device is visible to this process (the NCCL backend needs one GPU per rank)");
  }
  init_mpi();
  MPI_Comm dup = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "init_nccl", "MPI_Comm_dup");
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  int rank = 0, n = 1;
  MPI_Comm_rank(dup, &rank);
  MPI_Comm_size(dup, &n);
  // One GPU per rank: the rank's index among the ranks on its machine.
  MPI_Comm node = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(dup, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node), "init_nccl",
            "MPI_Comm_split_type");
  int local = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  const int device = local % gpus;
  check_cuda(cudaSetDevice(device), "init_nccl", "cudaSetDevice");
  ncclUniqueId id;
  if (rank == 0) check_nccl(ncclGetUniqueId(&id), "init_nccl", "ncclGetUniqueId");
  check_mpi(MPI_Bcast(&id, int(sizeof id), MPI_BYTE, 0, dup), "init_nccl", "MPI_Bcast");
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, n, id, rank), "init_nccl", "ncclCommInitRank");
  std::vector<int> ranks(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ranks[size_t(i)] = i;
  detail::set_process_world(std::make_shared<NcclComm>(dup, comm, device, "world", std::move(ranks)));
}

const bool registered = [] {
  detail::hooks().init_nccl = do_init_nccl;
  return true;
}();

}  // namespace
}  // namespace tessel::comm
