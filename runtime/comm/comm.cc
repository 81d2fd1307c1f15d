// Backend-independent parts of runtime/comm: names, timeouts, world
// registration, argument and cross-rank consistency checks.
#include "runtime/comm/comm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/comm/backend.h"
#include "runtime/error.h"
#include "runtime/numerics.h"

namespace tessel::comm {

namespace {

std::chrono::milliseconds timeout_from_env() {
  const char* s = std::getenv("TESSEL_COMM_TIMEOUT");
  if (s && *s) {
    char* end = nullptr;
    double sec = std::strtod(s, &end);
    if (end != s && sec > 0) return std::chrono::milliseconds(int64_t(sec * 1000.0));
  }
  return std::chrono::seconds(300);
}

std::atomic<int64_t>& timeout_ms() {
  static std::atomic<int64_t> t{timeout_from_env().count()};
  return t;
}

thread_local CommPtr t_world;
thread_local double t_wait_seconds = 0;

std::mutex& process_world_mutex() {
  static std::mutex m;
  return m;
}
CommPtr& process_world() {
  static CommPtr w;
  return w;
}

}  // namespace

std::chrono::milliseconds default_timeout() { return std::chrono::milliseconds(timeout_ms().load()); }
void set_default_timeout(std::chrono::milliseconds t) { timeout_ms().store(t.count() > 0 ? t.count() : 1); }

CommPtr world() {
  if (t_world) return t_world;
  std::lock_guard<std::mutex> lk(process_world_mutex());
  if (process_world()) return process_world();
  throw Error(
      "comm::world: no collectives backend was started for this thread "
      "(call run_local(n, fn), init_mpi() or init_nccl() first)");
}

bool has_world() {
  if (t_world) return true;
  std::lock_guard<std::mutex> lk(process_world_mutex());
  return process_world() != nullptr;
}

bool is_mpi_launch() {
  // OpenMPI's mpirun, PMIx launchers (srun --mpi=pmix), MPICH's hydra / PMI-1.
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"}) {
    if (std::getenv(v)) return true;
  }
  return false;
}

void init_mpi() {
  if (!detail::hooks().init_mpi) {
    throw Error("init_mpi: the MPI backend is not linked into this binary (depend on //runtime/comm:mpi)");
  }
  detail::hooks().init_mpi();
}

void finalize_mpi() {
  if (detail::hooks().finalize_mpi) detail::hooks().finalize_mpi();
}

void init_nccl() {
  if (!detail::hooks().init_nccl) {
#ifdef TESSEL_WITH_CUDA
    throw Error("init_nccl: the NCCL backend is not linked into this binary (depend on //runtime/comm:nccl)");
#else
    throw Error("init_nccl: this is a CPU-only build of tessel (no CUDA toolkit was detected), so there is no NCCL "
                "backend; use init_mpi() for CPU ranks");
#endif
  }
  detail::hooks().init_nccl();
}

double thread_wait_seconds() { return t_wait_seconds; }

namespace detail {
void add_wait_seconds(double s) { t_wait_seconds += s; }
WaitTimer::WaitTimer()
    : t0_ns_(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
                 .count()),
      trace_(timeline::current()) {
  if (trace_) trace_->begin("wait", {}, "wait");
}
WaitTimer::~WaitTimer() {
  const int64_t now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  t_wait_seconds += double(now - t0_ns_) * 1e-9;
  if (trace_) trace_->end();
}

void TraceComm::begin(const char* what, const Communicator& c, int64_t bytes, int peer, bool async) {
  std::string args = fmt::format(FMT_STRING("\"bytes\":{},\"group\":{}"), bytes,
                                 timeline::json_string(c.label().empty() ? c.name() : c.label()));
  if (!c.label().empty()) args += ",\"communicator\":" + timeline::json_string(c.name());
  if (peer >= 0) {
    const std::vector<int>& ranks = c.world_ranks();  // (a bad peer is the backend's error to raise)
    args += fmt::format(FMT_STRING(",\"peer\":{}"), peer < int(ranks.size()) ? ranks[size_t(peer)] : peer);
  } else {
    args += fmt::format(FMT_STRING(",\"ranks\":[{}]"), fmt::join(c.world_ranks(), ","));
  }
  if (async) args += ",\"async\":true";
  r_->begin(what, {}, "comm", std::move(args));
}
}  // namespace detail

namespace detail {

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::AllReduce: return "all_reduce";
    case OpKind::AllGather: return "all_gather";
    case OpKind::AllGatherV: return "all_gather_v";
    case OpKind::ReduceScatter: return "reduce_scatter";
    case OpKind::ReduceScatterV: return "reduce_scatter_v";
    case OpKind::AllToAll: return "all_to_all";
    case OpKind::AllToAllV: return "all_to_all_v";
    case OpKind::Broadcast: return "broadcast";
    case OpKind::Barrier: return "barrier";
    case OpKind::Split: return "split";
  }
  return "?";
}

uint64_t hash_counts(const std::vector<int64_t>& counts) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the values
  for (int64_t c : counts) {
    for (int b = 0; b < 8; ++b) {
      h ^= (uint64_t(c) >> (8 * b)) & 0xffu;
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

Meta make_meta(OpKind kind, const Tensor* in, const Tensor* out, int reduce_op, int root,
               const std::vector<int64_t>* counts) {
  Meta m;
  m.kind = int32_t(kind);
  m.numerics = numerics::encode_settings(numerics::current_settings());
  m.dtype = in ? int32_t(in->dtype()) : -1;
  m.reduce_op = reduce_op;
  m.root = root;
  m.numel_in = in ? in->numel() : 0;
  m.numel_out = out ? out->numel() : 0;
  m.counts_hash = counts ? hash_counts(*counts) : 0;
  if (in) {
    m.ndim = int32_t(in->dim());
    for (int d = 0; d < in->dim() && d < Meta::kMaxDims; ++d) m.dims[d] = in->shape()[d];
  }
  return m;
}

std::string describe_meta(const Meta& m) {
  if (m.dtype < 0) return "no tensor";
  std::vector<int64_t> dims(m.dims, m.dims + std::min<int>(m.ndim, Meta::kMaxDims));
  return fmt::format(FMT_STRING("Tensor({}, shape=[{}{}])"), dtype_name(DType(m.dtype)), fmt::join(dims, ", "),
                     m.ndim > Meta::kMaxDims ? ", ..." : "");
}

void check_metas(const std::string& where, const Meta* metas, int n, const std::function<std::string(int)>& describe) {
  const Meta& m0 = metas[0];
  for (int r = 1; r < n; ++r) {
    const Meta& m = metas[r];
    if (m.kind != m0.kind) {
      throw Error(fmt::format(FMT_STRING("{}: rank {} called {} while rank 0 called {} (every rank must call the same "
                              "collectives in the same order)"),
                              where, r, op_kind_name(OpKind(m.kind)), op_kind_name(OpKind(m0.kind))));
    }
    if (m.numerics != m0.numerics) {
      throw Error(fmt::format(
          FMT_STRING("{}: the ranks compute with different numerics settings: rank {} has {}, rank 0 has {} (set them "
                     "before the ranks start: comm::run_local gives every rank its caller's settings; under mpirun set "
                     "TESSEL_BITWISE / TESSEL_REDUCE_CHUNKS / TESSEL_GEMM alike for every process)"),
          where, r, numerics::describe_settings(numerics::decode_settings(m.numerics)),
          numerics::describe_settings(numerics::decode_settings(m0.numerics))));
    }
    auto mismatch = [&](const char* what) {
      throw Error(fmt::format(FMT_STRING("{}: {} differ between ranks: rank {} passed {}, rank 0 passed {}"), where, what, r,
                              describe(r), describe(0)));
    };
    if (m.dtype != m0.dtype) mismatch("dtypes");
    if (m.reduce_op != m0.reduce_op) {
      throw Error(fmt::format(FMT_STRING("{}: reduce ops differ between ranks: rank {} passed {}, rank 0 passed {}"), where, r,
                              reduce_op_name(ReduceOp(m.reduce_op)), reduce_op_name(ReduceOp(m0.reduce_op))));
    }
    if (m.root != m0.root) {
      throw Error(fmt::format(FMT_STRING("{}: roots differ between ranks: rank {} passed root {}, rank 0 passed root {}"), where,
                              r, m.root, m0.root));
    }
    switch (OpKind(m.kind)) {
      case OpKind::AllReduce:
      case OpKind::AllGather:
      case OpKind::ReduceScatter:
      case OpKind::AllToAll:
      case OpKind::Broadcast:
        if (m.numel_in != m0.numel_in) mismatch("sizes");
        break;
      case OpKind::AllGatherV:
      case OpKind::ReduceScatterV:
        if (m.counts_hash != m0.counts_hash) mismatch("counts");
        break;
      default: break;  // all_to_all_v: counts are checked pairwise by the backend
    }
  }
}

std::string where(const Communicator& c, const char* op, ReduceOp rop) {
  return fmt::format(FMT_STRING("{}({}) on '{}' ({} backend, rank {} of {})"), op, reduce_op_name(rop), c.name(), c.backend(),
                     c.rank(), c.size());
}
std::string where(const Communicator& c, const char* op) {
  return fmt::format(FMT_STRING("{} on '{}' ({} backend, rank {} of {})"), op, c.name(), c.backend(), c.rank(), c.size());
}

void check_tensor(const std::string& where, const Tensor& t, const char* role, DeviceType device) {
  if (!t.defined()) throw Error(fmt::format(FMT_STRING("{}: {} tensor is undefined"), where, role));
  if (t.device().type != device) {
    throw Error(fmt::format(FMT_STRING("{}: {} must be a {} tensor, got {}"), where, role, device_type_name(device), t.desc()));
  }
  if (!t.is_contiguous()) {
    throw Error(fmt::format(FMT_STRING("{}: {} must be contiguous, got {} with strides {}"), where, role, t.desc(),
                            fmt::join(t.strides(), ", ")));
  }
}

void check_counts(const std::string& where, const std::vector<int64_t>& counts, int size, const char* role) {
  if (int(counts.size()) != size) {
    throw Error(fmt::format(FMT_STRING("{}: {} has {} entries, expected one per rank ({})"), where, role, counts.size(), size));
  }
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] < 0) throw Error(fmt::format(FMT_STRING("{}: {}[{}] = {} is negative"), where, role, i, counts[i]));
  }
}

int64_t sum_counts(const std::vector<int64_t>& counts) {
  int64_t s = 0;
  for (int64_t c : counts) s += c;
  return s;
}

std::string timeout_message(std::chrono::milliseconds t) {
  return fmt::format(FMT_STRING("timed out after {:.3g} s (TESSEL_COMM_TIMEOUT)"), double(t.count()) / 1000.0);
}

WorkPtr done_work() {
  static WorkPtr w = std::make_shared<DoneWork>();
  return w;
}

void set_thread_world(CommPtr c) { t_world = std::move(c); }
void set_process_world(CommPtr c) {
  std::lock_guard<std::mutex> lk(process_world_mutex());
  process_world() = std::move(c);
}

BackendHooks& hooks() {
  static BackendHooks h;
  return h;
}

}  // namespace detail

// ---- the public calls, and compile mode's record of them -----------------------------------------------------
//
// Outside a recording (nearly always) each call is the backend's do_*. Under
// a capture::Recorder at depth 0 the call becomes a launch of the program
// (CollectiveLaunch) and then runs as usual, one level deeper: what the
// backend does inside (kernels, nested calls such as reduce_scatter ->
// reduce_scatter_v) runs again inside it at replay. An asynchronous call's
// wait() becomes a launch of its own (WaitLaunch), so a replay waits where
// the eager step waited; its tensors stay whole in the arena until then.

struct Communicator::Call {
  enum class Kind { AllReduce, AllGather, AllGatherV, ReduceScatter, ReduceScatterV, AllToAll, AllToAllV, Broadcast,
                    Send, Recv, Barrier };
  Kind kind = Kind::Barrier;
  const char* name = "";
  Tensor a, b;  // in (or the in-place tensor), out
  ReduceOp op = ReduceOp::Sum;
  std::vector<int64_t> counts, counts2;  // *_v counts (all_to_all_v: send, then receive)
  int peer = -1, tag = 0;                // broadcast root; send/recv peer and tag
  bool async = false;
};

WorkPtr Communicator::issue(const Call& c) {
  using K = Call::Kind;
  switch (c.kind) {
    case K::AllReduce: return do_all_reduce(c.a, c.op, c.async);
    case K::AllGather: return do_all_gather(c.a, c.b, c.async);
    case K::AllGatherV: return do_all_gather_v(c.a, c.b, c.counts, c.async);
    case K::ReduceScatter: return do_reduce_scatter(c.a, c.b, c.op, c.async);
    case K::ReduceScatterV: return do_reduce_scatter_v(c.a, c.b, c.counts, c.op, c.async);
    case K::AllToAll: return do_all_to_all(c.a, c.b, c.async);
    case K::AllToAllV: return do_all_to_all_v(c.a, c.counts, c.b, c.counts2, c.async);
    case K::Broadcast: return do_broadcast(c.a, c.peer, c.async);
    case K::Send: return do_send(c.a, c.peer, c.tag, c.async);
    case K::Recv: return do_recv(c.a, c.peer, c.tag, c.async);
    case K::Barrier: do_barrier(); return detail::done_work();
  }
  return detail::done_work();
}

class CollectiveLaunch final : public capture::Launch {
 public:
  CollectiveLaunch(Communicator* comm, Communicator::Call call) : comm_(comm), call_(std::move(call)) {}
  void record(capture::Recorder& r) {
    // The communicator by identity (the same object in both recordings and
    // at replay: the mesh that owns it outlives the Run's program).
    capture::fingerprint(fingerprint, comm_->name().data(), comm_->name().size());
    const Communicator* self = comm_;
    capture::fingerprint(fingerprint, &self, sizeof self);
    capture::fingerprint(fingerprint, int(call_.kind));
    capture::fingerprint(fingerprint, int(call_.op));
    capture::fingerprint(fingerprint, call_.peer);
    capture::fingerprint(fingerprint, call_.tag);
    capture::fingerprint(fingerprint, call_.async);
    for (const auto* v : {&call_.counts, &call_.counts2}) {
      capture::fingerprint(fingerprint, int64_t(v->size()));
      for (int64_t x : *v) capture::fingerprint(fingerprint, x);
    }
    a_.record(r, fingerprint, call_.a);
    b_.record(r, fingerprint, call_.b);
    call_.a = Tensor();  // the program refers to buffers, it does not hold the eager tensors
    call_.b = Tensor();
  }
  void run() override {
    Communicator::Call c = call_;
    c.a = a_.get();
    c.b = b_.get();
    WorkPtr w = comm_->issue(c);
    if (c.async) pending = std::move(w);
  }
  void bind(const std::vector<std::shared_ptr<StorageImpl>>& buffers) override {
    a_.bind(buffers);
    b_.bind(buffers);
  }
  void refresh(const capture::PerCall&) override {}
  int buffer_a() const { return a_.arg.buffer; }
  int buffer_b() const { return b_.arg.buffer; }
  WorkPtr pending;  // a replayed asynchronous call, until its WaitLaunch

 private:
  Communicator* comm_;
  Communicator::Call call_;
  capture::Stored<Tensor> a_, b_;
};

namespace {

// One level deeper on `r` (if any) for a scope: what runs inside is not recorded.
struct Deeper {
  explicit Deeper(capture::Recorder* r) : r_(r) {
    if (r_) ++r_->depth;
  }
  ~Deeper() {
    if (r_) --r_->depth;
  }
  Deeper(const Deeper&) = delete;
  Deeper& operator=(const Deeper&) = delete;
  capture::Recorder* r_;
};

class WaitLaunch final : public capture::Launch {
 public:
  explicit WaitLaunch(CollectiveLaunch* of) : of_(of) {}
  void run() override {
    if (WorkPtr w = std::move(of_->pending)) w->wait();
  }
  void bind(const std::vector<std::shared_ptr<StorageImpl>>&) override {}
  void refresh(const capture::PerCall&) override {}

 private:
  CollectiveLaunch* of_;  // owned by the same program, before this launch
};

// The eager handle of a recorded asynchronous call: its first wait() while
// the same recorder is active is recorded.
class RecordedWork final : public Work {
 public:
  RecordedWork(WorkPtr inner, CollectiveLaunch* launch, uint64_t recorder)
      : inner_(std::move(inner)), launch_(launch), recorder_(recorder) {}
  void wait() override {
    capture::Recorder* r = capture::active();
    const bool mine = r != nullptr && r->serial() == recorder_;
    {
      // The backend's own work in the wait (MPI's later stages read and
      // write the tensors on the host) runs again inside the replayed wait.
      Deeper deeper(mine ? r : nullptr);
      inner_->wait();
    }
    if (launch_ == nullptr) return;
    if (mine) {
      r->touch(launch_->buffer_a());
      r->touch(launch_->buffer_b());
      auto w = std::make_unique<WaitLaunch>(launch_);
      w->name = "wait";
      w->fingerprint = std::string("wait") + '\0';
      capture::fingerprint(w->fingerprint, int64_t(r->launches()));
      r->add(std::move(w));
      r->async_waited();
    }
    launch_ = nullptr;  // (a recorder that ended refused the recording already: finish() saw it in flight)
  }
  bool is_completed() override {
    capture::Recorder* r = capture::active();
    Deeper deeper(r != nullptr && r->serial() == recorder_ ? r : nullptr);
    return inner_->is_completed();
  }

 private:
  WorkPtr inner_;
  CollectiveLaunch* launch_;
  uint64_t recorder_;
};

}  // namespace

WorkPtr Communicator::record(Call call) {
  capture::Recorder& r = *capture::active();
  auto launch = std::make_unique<CollectiveLaunch>(this, call);
  launch->name = call.name;
  launch->fingerprint = std::string(call.name) + '\0';
  launch->record(r);
  CollectiveLaunch* raw = launch.get();
  r.add(std::move(launch));
  WorkPtr w;
  {
    Deeper deeper(&r);  // the backend's own work inside the call runs again inside it at replay
    w = issue(call);
  }
  if (!call.async) return w;
  r.async_started(call.name);
  return std::make_shared<RecordedWork>(std::move(w), raw, r.serial());
}

namespace {
inline bool recording() {
  capture::Recorder* r = capture::active();
  return TESSEL_UNLIKELY(r != nullptr) && r->depth == 0;
}
}  // namespace

using K = Communicator::Call::Kind;

WorkPtr Communicator::all_reduce(const Tensor& t, ReduceOp op, bool async) {
  if (recording()) {
    Call c;
    c.kind = K::AllReduce, c.name = "all_reduce", c.a = t, c.op = op, c.async = async;
    return record(std::move(c));
  }
  return do_all_reduce(t, op, async);
}
WorkPtr Communicator::all_gather(const Tensor& in, const Tensor& out, bool async) {
  if (recording()) {
    Call c;
    c.kind = K::AllGather, c.name = "all_gather", c.a = in, c.b = out, c.async = async;
    return record(std::move(c));
  }
  return do_all_gather(in, out, async);
}
WorkPtr Communicator::all_gather_v(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts,
                                   bool async) {
  if (recording()) {
    Call c;
    c.kind = K::AllGatherV, c.name = "all_gather_v", c.a = in, c.b = out, c.counts = counts, c.async = async;
    return record(std::move(c));
  }
  return do_all_gather_v(in, out, counts, async);
}
WorkPtr Communicator::reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op, bool async) {
  if (recording()) {
    Call c;
    c.kind = K::ReduceScatter, c.name = "reduce_scatter", c.a = in, c.b = out, c.op = op, c.async = async;
    return record(std::move(c));
  }
  return do_reduce_scatter(in, out, op, async);
}
WorkPtr Communicator::reduce_scatter_v(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts,
                                       ReduceOp op, bool async) {
  if (recording()) {
    Call c;
    c.kind = K::ReduceScatterV, c.name = "reduce_scatter_v", c.a = in, c.b = out, c.counts = counts, c.op = op,
    c.async = async;
    return record(std::move(c));
  }
  return do_reduce_scatter_v(in, out, counts, op, async);
}
WorkPtr Communicator::all_to_all(const Tensor& in, const Tensor& out, bool async) {
  if (recording()) {
    Call c;
    c.kind = K::AllToAll, c.name = "all_to_all", c.a = in, c.b = out, c.async = async;
    return record(std::move(c));
  }
  return do_all_to_all(in, out, async);
}
WorkPtr Communicator::all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                                   const std::vector<int64_t>& recv_counts, bool async) {
  if (recording()) {
    Call c;
    c.kind = K::AllToAllV, c.name = "all_to_all_v", c.a = in, c.b = out, c.counts = send_counts,
    c.counts2 = recv_counts, c.async = async;
    return record(std::move(c));
  }
  return do_all_to_all_v(in, send_counts, out, recv_counts, async);
}
WorkPtr Communicator::broadcast(const Tensor& t, int root, bool async) {
  if (recording()) {
    Call c;
    c.kind = K::Broadcast, c.name = "broadcast", c.a = t, c.peer = root, c.async = async;
    return record(std::move(c));
  }
  return do_broadcast(t, root, async);
}
WorkPtr Communicator::send(const Tensor& t, int dst, int tag, bool async) {
  if (recording()) {
    Call c;
    c.kind = K::Send, c.name = "send", c.a = t, c.peer = dst, c.tag = tag, c.async = async;
    return record(std::move(c));
  }
  return do_send(t, dst, tag, async);
}
WorkPtr Communicator::recv(const Tensor& t, int src, int tag, bool async) {
  if (recording()) {
    Call c;
    c.kind = K::Recv, c.name = "recv", c.a = t, c.peer = src, c.tag = tag, c.async = async;
    return record(std::move(c));
  }
  return do_recv(t, src, tag, async);
}
void Communicator::barrier() {
  if (recording()) {
    Call c;
    c.name = "barrier";
    record(std::move(c));
    return;
  }
  do_barrier();
}

}  // namespace tessel::comm
