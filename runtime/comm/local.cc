// The local backend: N ranks as threads of one process (run_local).
//
// Ranks exchange data through shared memory: every collective posts a
// description of the caller's buffers, meets the other ranks at a barrier,
// then each rank reads what it needs straight from the others' tensors and
// writes only its own. A final barrier keeps every buffer alive and unchanged
// until all ranks are done reading it. All waiting happens on one condition
// variable per job, so a failure anywhere wakes every waiter at once.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include <spdlog/spdlog.h>

#include "runtime/comm/backend.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/reduce.h"
#include "runtime/comm/tree.h"
#include "runtime/error.h"
#include "runtime/numerics.h"

namespace tessel::comm {
namespace {

using detail::Clock;
using detail::Meta;
using detail::OpKind;

// State of one run_local world, shared by all its communicators.
struct Job {
  std::mutex mu;
  std::condition_variable cv;
  bool failed = false;
  int failed_rank = -1;        // world rank that failed first
  std::string failure;         // "rank r failed: ..."
  std::vector<char> exited;    // by world rank: fn returned or threw
  explicit Job(int n) : exited(size_t(n), 0) {}

  // Marks the job failed (first caller wins) and wakes every waiter. Caller holds mu.
  void fail_locked(int world_rank, const std::string& what) {
    if (failed) return;
    failed = true;
    failed_rank = world_rank;
    failure = fmt::format(FMT_STRING("rank {} failed: {}"), world_rank, what);
    cv.notify_all();
  }
};

// What a rank posts for its current collective; read by the other members
// between the first and the last barrier of that collective.
struct Posted {
  Meta meta;
  const Tensor* in = nullptr;
  const Tensor* out = nullptr;
  const std::vector<int64_t>* counts = nullptr;       // _v variants; all_to_all_v: send counts
  const std::vector<int64_t>* recv_counts = nullptr;  // all_to_all_v
  int color = 0, key = 0;                             // split
};

// A receive posted before its message arrived: the sender copies straight
// into `dst` (the receiver keeps the tensor alive until wait()).
struct PendingRecv {
  const Tensor* t = nullptr;  // valid until the Work completes
  void* dst = nullptr;
  int64_t numel = 0;
  DType dtype = DType::Float32;
  bool claimed = false;  // a sender took it and is copying (outside the lock)
  bool done = false;
  std::string error;  // set by the sender on a size/dtype mismatch
};

// A message sent before its receive was posted (the sender never blocks).
struct Message {
  std::vector<char> bytes;
  DType dtype = DType::Float32;
  int64_t numel = 0;
  std::string desc;  // the sender's tensor, for errors
};

struct Channel {
  std::deque<Message> messages;
  std::deque<std::shared_ptr<PendingRecv>> receives;
};

// One communicator's shared state (all members point at the same Group).
struct Group {
  std::shared_ptr<Job> job;
  std::string name;
  std::vector<int> world_ranks;
  std::vector<uint64_t> arrivals;  // barriers passed by each member (counter barrier)
  std::vector<Posted*> posted;
  std::map<int, std::shared_ptr<Group>> split_children;   // by color, during one split
  std::map<std::tuple<int, int, int>, Channel> channels;  // (src, dst, tag)
  std::vector<std::vector<char>> spare_buffers;           // recycled message storage

  Group(std::shared_ptr<Job> j, std::string n, std::vector<int> ranks)
      : job(std::move(j)), name(std::move(n)), world_ranks(std::move(ranks)),
        arrivals(world_ranks.size(), 0), posted(world_ranks.size(), nullptr) {}
  int size() const { return int(world_ranks.size()); }
};

class LocalComm final : public Communicator, public std::enable_shared_from_this<LocalComm> {
 public:
  LocalComm(std::shared_ptr<Group> g, int rank) : g_(std::move(g)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return g_->size(); }
  const char* backend() const override { return "local"; }
  std::string name() const override { return g_->name; }
  const std::vector<int>& world_ranks() const override { return g_->world_ranks; }

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

  // Waits for a posted receive (used by RecvWork).
  void wait_recv(const std::shared_ptr<PendingRecv>& r, int src, int tag, const std::string& where);
  // Withdraws a receive that will not be waited for (the Work was dropped or
  // failed), so no sender writes into a tensor that may be gone.
  void cancel_recv(const std::shared_ptr<PendingRecv>& r, int src, int tag);
  void cancel_recv_locked(const std::shared_ptr<PendingRecv>& r, int src, int tag);
  bool recv_done(const std::shared_ptr<PendingRecv>& r);

 private:
  int world_rank() const { return g_->world_ranks[size_t(rank_)]; }
  // Posts p, passes the first barrier and checks that every rank called the
  // same collective with matching arguments.
  // `extra` checks more (it sees every rank's Posted); all checks give every
  // rank the same verdict.
  void enter(const std::string& where, Posted& p, const std::function<void()>& extra = nullptr);
  // Counter barrier over the group's members, bounded by the timeout.
  void arrive_and_wait(const std::string& where);
  void copy_bytes(void* dst, const void* src, int64_t numel, DType dt) {
    if (numel > 0) std::memcpy(dst, src, size_t(numel) * itemsize(dt));
  }
  static char* bytes(const Tensor& t) { return static_cast<char*>(t.raw_data()); }

  std::shared_ptr<Group> g_;
  int rank_;
  std::vector<const void*> srcs_;  // reused per reduction: the contributions' addresses
};

class RecvWork final : public Work {
 public:
  RecvWork(std::shared_ptr<LocalComm> c, std::shared_ptr<PendingRecv> r, int src, int tag, std::string where)
      : c_(std::move(c)), r_(std::move(r)), src_(src), tag_(tag), where_(std::move(where)) {}
  ~RecvWork() override {
    if (!waited_) c_->cancel_recv(r_, src_, tag_);
  }
  void wait() override {
    if (waited_) return;
    c_->wait_recv(r_, src_, tag_, where_);
    waited_ = true;
  }
  bool is_completed() override;

 private:
  std::shared_ptr<LocalComm> c_;
  std::shared_ptr<PendingRecv> r_;
  int src_, tag_;
  std::string where_;
  bool waited_ = false;
};

void LocalComm::arrive_and_wait(const std::string& where) {
  detail::WaitTimer timer;
  Job& job = *g_->job;
  std::unique_lock<std::mutex> lk(job.mu);
  const uint64_t mine = ++g_->arrivals[size_t(rank_)];
  job.cv.notify_all();
  const auto timeout = default_timeout();
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    // Completion first: a barrier every member passed is complete even if a
    // rank failed right after passing it.
    bool all = true;
    for (int i = 0; i < size(); ++i) {
      if (g_->arrivals[size_t(i)] < mine) all = false;
    }
    if (all) return;
    if (job.failed) throw CommError(where + ": " + job.failure);
    for (int i = 0; i < size(); ++i) {
      if (g_->arrivals[size_t(i)] >= mine) continue;
      if (job.exited[size_t(g_->world_ranks[size_t(i)])]) {
        std::string msg = fmt::format(FMT_STRING("{}: rank {} (world rank {}) returned without calling it"), where, i,
                                      g_->world_ranks[size_t(i)]);
        job.fail_locked(world_rank(), msg);
        throw CommError(msg);
      }
    }
    if (job.cv.wait_until(lk, deadline) == std::cv_status::timeout && Clock::now() >= deadline) {
      std::vector<int> missing;
      for (int i = 0; i < size(); ++i) {
        if (g_->arrivals[size_t(i)] < mine) missing.push_back(i);
      }
      if (missing.empty()) return;
      std::string msg =
          fmt::format(FMT_STRING("{}: {} waiting for rank(s) {}"), where, detail::timeout_message(timeout), fmt::join(missing, ", "));
      job.fail_locked(world_rank(), msg);
      throw CommError(msg);
    }
  }
}

void LocalComm::enter(const std::string& where, Posted& p, const std::function<void()>& extra) {
  {
    std::lock_guard<std::mutex> lk(g_->job->mu);
    g_->posted[size_t(rank_)] = &p;
  }
  arrive_and_wait(where);
  std::string error;
  try {
    Meta metas[64];
    std::vector<Meta> many;
    Meta* m = metas;
    if (size() > 64) {
      many.resize(size_t(size()));
      m = many.data();
    }
    for (int i = 0; i < size(); ++i) m[i] = g_->posted[size_t(i)]->meta;
    detail::check_metas(where, m, size(), [&](int r) {
      const Posted* q = g_->posted[size_t(r)];
      if (q->counts) return fmt::format(FMT_STRING("counts [{}] with {}"), fmt::join(*q->counts, ", "), q->in ? q->in->desc() : "");
      return q->in ? q->in->desc() : std::string("no tensor");
    });
    if (extra) extra();
  } catch (const Error& e) {
    error = e.what();
  }
  if (!error.empty()) {
    // Every rank reached the same verdict; wait until all have finished
    // reading the others' Posted (they live on the callers' stacks), then throw.
    arrive_and_wait(where);
    throw Error(error);
  }
}

// ---- reductions --------------------------------------------------------------

WorkPtr LocalComm::do_all_reduce(const Tensor& t, ReduceOp op, bool async) {
  detail::TraceComm trace("all_reduce", *this, int64_t(t.nbytes()), -1, async);
  (void)async;  // completes eagerly
  const std::string w = detail::where(*this, "all_reduce", op);
  detail::check_tensor(w, t, "tensor", DeviceType::CPU);
  check_reduce_dtype(w, t.dtype(), op);
  Posted p;
  p.meta = detail::make_meta(OpKind::AllReduce, &t, nullptr, int(op));
  p.in = &t;
  enter(w, p);
  const int n = size();
  const int64_t numel = t.numel();
  const size_t isz = t.itemsize();
  // Reduce-scatter: this rank reduces its slice of every rank's tensor into its own.
  const int64_t lo = slice_begin(numel, n, rank_), len = slice_len(numel, n, rank_);
  srcs_.resize(size_t(n));
  for (int s = 0; s < n; ++s) srcs_[size_t(s)] = bytes(*g_->posted[size_t(s)]->in) + size_t(lo) * isz;
  tree_reduce(t.dtype(), op, srcs_.data(), n, len, bytes(t) + size_t(lo) * isz);
  arrive_and_wait(w);
  // All-gather: copy the other ranks' reduced slices.
  for (int s = 0; s < n; ++s) {
    if (s == rank_) continue;
    const int64_t b = slice_begin(numel, n, s);
    copy_bytes(bytes(t) + size_t(b) * isz, bytes(*g_->posted[size_t(s)]->in) + size_t(b) * isz, slice_len(numel, n, s),
               t.dtype());
  }
  arrive_and_wait(w);
  return detail::done_work();
}

WorkPtr LocalComm::do_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op, bool async) {
  detail::TraceComm trace("reduce_scatter", *this, int64_t(in.nbytes()), -1, async);
  const std::string w = detail::where(*this, "reduce_scatter", op);
  detail::check_tensor(w, in, "input", DeviceType::CPU);
  detail::check_tensor(w, out, "output", DeviceType::CPU);
  if (in.numel() != out.numel() * size() || in.dtype() != out.dtype()) {
    TESSEL_FAIL(w, "input must hold size() = {} blocks of the output: input {}, output {}", size(), in.desc(),
                out.desc());
  }
  std::vector<int64_t> counts(size_t(size()), out.numel());
  return reduce_scatter_v(in, out, counts, op, async);
}

WorkPtr LocalComm::do_reduce_scatter_v(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts,
                                    ReduceOp op, bool async) {
  detail::TraceComm trace("reduce_scatter_v", *this, int64_t(in.nbytes()), -1, async);
  (void)async;
  const std::string w = detail::where(*this, "reduce_scatter_v", op);
  detail::check_tensor(w, in, "input", DeviceType::CPU);
  detail::check_tensor(w, out, "output", DeviceType::CPU);
  detail::check_counts(w, counts, size(), "counts");
  check_reduce_dtype(w, in.dtype(), op);
  if (in.dtype() != out.dtype() || in.numel() != detail::sum_counts(counts) || out.numel() != counts[size_t(rank_)]) {
    TESSEL_FAIL(w, "input must hold sum(counts) = {} and output counts[{}] = {} elements of one dtype: input {}, "
                "output {}",
                detail::sum_counts(counts), rank_, counts[size_t(rank_)], in.desc(), out.desc());
  }
  Posted p;
  p.meta = detail::make_meta(OpKind::ReduceScatterV, &in, &out, int(op), -1, &counts);
  p.in = &in;
  p.out = &out;
  p.counts = &counts;
  enter(w, p);
  const int n = size();
  int64_t offset = 0;
  for (int s = 0; s < rank_; ++s) offset += counts[size_t(s)];
  srcs_.resize(size_t(n));
  for (int s = 0; s < n; ++s) srcs_[size_t(s)] = bytes(*g_->posted[size_t(s)]->in) + size_t(offset) * in.itemsize();
  tree_reduce(in.dtype(), op, srcs_.data(), n, counts[size_t(rank_)], out.raw_data());
  arrive_and_wait(w);  // the others may still be reading this rank's input
  return detail::done_work();
}

// ---- data movement -------------------------------------------------------------

WorkPtr LocalComm::do_all_gather(const Tensor& in, const Tensor& out, bool async) {
  detail::TraceComm trace("all_gather", *this, int64_t(in.nbytes()), -1, async);
  const std::string w = detail::where(*this, "all_gather");
  detail::check_tensor(w, in, "input", DeviceType::CPU);
  detail::check_tensor(w, out, "output", DeviceType::CPU);
  if (out.numel() != in.numel() * size() || in.dtype() != out.dtype()) {
    TESSEL_FAIL(w, "output must hold size() = {} copies of the input: input {}, output {}", size(), in.desc(),
                out.desc());
  }
  std::vector<int64_t> counts(size_t(size()), in.numel());
  return all_gather_v(in, out, counts, async);
}

WorkPtr LocalComm::do_all_gather_v(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts, bool async) {
  detail::TraceComm trace("all_gather_v", *this, int64_t(in.nbytes()), -1, async);
  (void)async;
  const std::string w = detail::where(*this, "all_gather_v");
  detail::check_tensor(w, in, "input", DeviceType::CPU);
  detail::check_tensor(w, out, "output", DeviceType::CPU);
  detail::check_counts(w, counts, size(), "counts");
  if (in.dtype() != out.dtype() || in.numel() != counts[size_t(rank_)] || out.numel() != detail::sum_counts(counts)) {
    TESSEL_FAIL(w, "input must hold counts[{}] = {} and output sum(counts) = {} elements of one dtype: input {}, "
                "output {}",
                rank_, counts[size_t(rank_)], detail::sum_counts(counts), in.desc(), out.desc());
  }
  Posted p;
  p.meta = detail::make_meta(OpKind::AllGatherV, &in, &out, -1, -1, &counts);
  p.in = &in;
  p.counts = &counts;
  enter(w, p);
  int64_t offset = 0;
  const size_t isz = in.itemsize();
  for (int s = 0; s < size(); ++s) {
    copy_bytes(bytes(out) + size_t(offset) * isz, g_->posted[size_t(s)]->in->raw_data(), counts[size_t(s)], in.dtype());
    offset += counts[size_t(s)];
  }
  arrive_and_wait(w);
  return detail::done_work();
}

WorkPtr LocalComm::do_all_to_all(const Tensor& in, const Tensor& out, bool async) {
  detail::TraceComm trace("all_to_all", *this, int64_t(in.nbytes()), -1, async);
  const std::string w = detail::where(*this, "all_to_all");
  detail::check_tensor(w, in, "input", DeviceType::CPU);
  detail::check_tensor(w, out, "output", DeviceType::CPU);
  if (in.numel() % size() != 0 || out.numel() != in.numel() || in.dtype() != out.dtype()) {
    TESSEL_FAIL(w, "input and output must be size() = {} equal blocks of one dtype: input {}, output {}", size(),
                in.desc(), out.desc());
  }
  std::vector<int64_t> counts(size_t(size()), in.numel() / size());
  return all_to_all_v(in, counts, out, counts, async);
}

WorkPtr LocalComm::do_all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                                const std::vector<int64_t>& recv_counts, bool async) {
  detail::TraceComm trace("all_to_all_v", *this, int64_t(in.nbytes()), -1, async);
  (void)async;
  const std::string w = detail::where(*this, "all_to_all_v");
  detail::check_tensor(w, in, "input", DeviceType::CPU);
  detail::check_tensor(w, out, "output", DeviceType::CPU);
  detail::check_counts(w, send_counts, size(), "send_counts");
  detail::check_counts(w, recv_counts, size(), "recv_counts");
  if (in.dtype() != out.dtype() || in.numel() != detail::sum_counts(send_counts) ||
      out.numel() != detail::sum_counts(recv_counts)) {
    TESSEL_FAIL(w, "input must hold sum(send_counts) = {} and output sum(recv_counts) = {} elements of one dtype: "
                "input {}, output {}",
                detail::sum_counts(send_counts), detail::sum_counts(recv_counts), in.desc(), out.desc());
  }
  Posted p;
  p.meta = detail::make_meta(OpKind::AllToAllV, &in, &out);
  p.in = &in;
  p.counts = &send_counts;
  p.recv_counts = &recv_counts;
  enter(w, p, [&] {
    // Pairwise count check, done by every rank over all pairs so all throw alike.
    for (int s = 0; s < size(); ++s) {
      for (int r = 0; r < size(); ++r) {
        const int64_t sent = (*g_->posted[size_t(s)]->counts)[size_t(r)];
        const int64_t expected = (*g_->posted[size_t(r)]->recv_counts)[size_t(s)];
        if (sent != expected) {
          TESSEL_FAIL(w, "rank {} sends {} elements to rank {}, which expects recv_counts[{}] = {}", s, sent, r, s,
                      expected);
        }
      }
    }
  });
  const size_t isz = in.itemsize();
  int64_t roff = 0;
  for (int s = 0; s < size(); ++s) {
    const Posted* q = g_->posted[size_t(s)];
    int64_t soff = 0;
    for (int r = 0; r < rank_; ++r) soff += (*q->counts)[size_t(r)];
    copy_bytes(bytes(out) + size_t(roff) * isz, bytes(*q->in) + size_t(soff) * isz, recv_counts[size_t(s)], in.dtype());
    roff += recv_counts[size_t(s)];
  }
  arrive_and_wait(w);
  return detail::done_work();
}

WorkPtr LocalComm::do_broadcast(const Tensor& t, int root, bool async) {
  detail::TraceComm trace("broadcast", *this, int64_t(t.nbytes()), -1, async);
  (void)async;
  const std::string w = detail::where(*this, "broadcast");
  detail::check_tensor(w, t, "tensor", DeviceType::CPU);
  if (root < 0 || root >= size()) TESSEL_FAIL(w, "root {} is not a rank of this communicator", root);
  Posted p;
  p.meta = detail::make_meta(OpKind::Broadcast, &t, nullptr, -1, root);
  p.in = &t;
  enter(w, p);
  if (rank_ != root) copy_bytes(t.raw_data(), g_->posted[size_t(root)]->in->raw_data(), t.numel(), t.dtype());
  arrive_and_wait(w);
  return detail::done_work();
}

void LocalComm::do_barrier() {
  detail::TraceComm trace("barrier", *this, 0);
  const std::string w = detail::where(*this, "barrier");
  Posted p;
  p.meta = detail::make_meta(OpKind::Barrier, nullptr, nullptr);
  enter(w, p);
  // A second barrier: `p` must stay alive until every rank has checked it.
  arrive_and_wait(w);
}

std::shared_ptr<Communicator> LocalComm::split(int color, int key) {
  const std::string w = detail::where(*this, "split");
  Posted p;
  p.meta = detail::make_meta(OpKind::Split, nullptr, nullptr);
  p.color = color;
  p.key = key;
  enter(w, p);
  std::shared_ptr<Group> child;
  int new_rank = -1;
  if (color >= 0) {
    // Members ordered by (key, old rank), as MPI_Comm_split.
    std::vector<std::pair<int, int>> members;
    for (int i = 0; i < size(); ++i) {
      if (g_->posted[size_t(i)]->color == color) members.emplace_back(g_->posted[size_t(i)]->key, i);
    }
    std::sort(members.begin(), members.end());
    std::vector<int> ranks;
    for (size_t j = 0; j < members.size(); ++j) {
      ranks.push_back(g_->world_ranks[size_t(members[j].second)]);
      if (members[j].second == rank_) new_rank = int(j);
    }
    std::lock_guard<std::mutex> lk(g_->job->mu);
    auto& slot = g_->split_children[color];
    if (!slot) slot = std::make_shared<Group>(g_->job, fmt::format(FMT_STRING("{}/split({})"), g_->name, color), ranks);
    child = slot;
  }
  arrive_and_wait(w);  // everyone has its child group
  if (rank_ == 0) {
    std::lock_guard<std::mutex> lk(g_->job->mu);
    g_->split_children.clear();  // the next split's lookups start after this rank arrives
  }
  if (!child) return nullptr;
  return std::make_shared<LocalComm>(child, new_rank);
}

// ---- point to point ------------------------------------------------------------

WorkPtr LocalComm::do_send(const Tensor& t, int dst, int tag, bool async) {
  detail::TraceComm trace("send", *this, int64_t(t.nbytes()), dst, async);
  (void)async;  // buffered: the sender never waits for the receiver
  const std::string w = detail::where(*this, "send");
  detail::check_tensor(w, t, "tensor", DeviceType::CPU);
  if (dst < 0 || dst >= size()) TESSEL_FAIL(w, "destination {} is not a rank of this communicator", dst);
  Job& job = *g_->job;
  const auto key = std::make_tuple(rank_, dst, tag);
  auto deliver = [&](PendingRecv& r, const void* src) {
    if (r.dtype != t.dtype() || r.numel != t.numel()) {
      r.error = fmt::format(FMT_STRING("rank {} sent {} (tag {}), but this receive expects {}"), rank_, t.desc(), tag, r.t->desc());
    } else {
      copy_bytes(r.dst, src, t.numel(), t.dtype());
    }
  };
  std::shared_ptr<PendingRecv> r;
  std::vector<char> buf;
  {
    std::lock_guard<std::mutex> lk(job.mu);
    if (job.failed) throw CommError(w + ": " + job.failure);
    Channel& ch = g_->channels[key];
    if (!ch.receives.empty()) {
      r = ch.receives.front();
      ch.receives.pop_front();
      r->claimed = true;
    } else if (!g_->spare_buffers.empty()) {
      buf = std::move(g_->spare_buffers.back());
      g_->spare_buffers.pop_back();
    }
  }
  if (r) {  // the receive was posted first: copy straight into its tensor
    deliver(*r, t.raw_data());
    std::lock_guard<std::mutex> lk(job.mu);
    r->done = true;
    job.cv.notify_all();
    return detail::done_work();
  }
  buf.resize(t.nbytes());
  if (t.nbytes() > 0) std::memcpy(buf.data(), t.raw_data(), t.nbytes());
  std::lock_guard<std::mutex> lk(job.mu);
  Channel& ch = g_->channels[key];
  if (!ch.receives.empty()) {  // posted while we copied (only this thread adds messages, so none are queued)
    r = ch.receives.front();
    ch.receives.pop_front();
    deliver(*r, buf.data());
    r->done = true;
    g_->spare_buffers.push_back(std::move(buf));
  } else {
    Message m;
    m.bytes = std::move(buf);
    m.dtype = t.dtype();
    m.numel = t.numel();
    m.desc = t.desc();
    ch.messages.push_back(std::move(m));
  }
  job.cv.notify_all();
  return detail::done_work();
}

WorkPtr LocalComm::do_recv(const Tensor& t, int src, int tag, bool async) {
  detail::TraceComm trace("recv", *this, int64_t(t.nbytes()), src, async);
  const std::string w = detail::where(*this, "recv");
  detail::check_tensor(w, t, "tensor", DeviceType::CPU);
  if (src < 0 || src >= size()) TESSEL_FAIL(w, "source {} is not a rank of this communicator", src);
  Job& job = *g_->job;
  Message m;
  auto r = std::make_shared<PendingRecv>();
  {
    std::lock_guard<std::mutex> lk(job.mu);
    if (job.failed) throw CommError(w + ": " + job.failure);
    Channel& ch = g_->channels[std::make_tuple(src, rank_, tag)];
    if (ch.messages.empty()) {
      r->t = &t;
      r->dst = t.raw_data();
      r->numel = t.numel();
      r->dtype = t.dtype();
      ch.receives.push_back(r);
    } else {
      m = std::move(ch.messages.front());
      ch.messages.pop_front();
      r.reset();
    }
  }
  if (!r) {  // the message was already there
    std::string error;
    if (m.dtype != t.dtype() || m.numel != t.numel()) {
      error = fmt::format(FMT_STRING("{}: rank {} sent {} (tag {}), but this receive expects {}"), w, src, m.desc, tag, t.desc());
    } else {
      copy_bytes(t.raw_data(), m.bytes.data(), t.numel(), t.dtype());
    }
    {
      std::lock_guard<std::mutex> lk(job.mu);
      g_->spare_buffers.push_back(std::move(m.bytes));
    }
    if (!error.empty()) throw Error(error);
    return detail::done_work();
  }
  auto work = std::make_shared<RecvWork>(shared_from_this(), r, src, tag, w);
  if (!async) work->wait();
  return work;
}

void LocalComm::wait_recv(const std::shared_ptr<PendingRecv>& r, int src, int tag, const std::string& where) {
  detail::WaitTimer timer;
  Job& job = *g_->job;
  std::unique_lock<std::mutex> lk(job.mu);
  const auto timeout = default_timeout();
  const auto deadline = Clock::now() + timeout;
  const int src_world = g_->world_ranks[size_t(src)];
  for (;;) {
    if (r->done) break;
    // A claimed receive is being filled by its sender: wait for it to finish
    // rather than return while the sender still writes into the tensor.
    if (r->claimed) {
      job.cv.wait(lk);
      continue;
    }
    if (job.failed) {
      cancel_recv_locked(r, src, tag);
      throw CommError(where + ": " + job.failure);
    }
    if (job.exited[size_t(src_world)]) {
      std::string msg = fmt::format(FMT_STRING("{}: rank {} returned without sending the message (tag {})"), where, src, tag);
      cancel_recv_locked(r, src, tag);
      job.fail_locked(world_rank(), msg);
      throw CommError(msg);
    }
    if (job.cv.wait_until(lk, deadline) == std::cv_status::timeout && !r->done && Clock::now() >= deadline) {
      std::string msg =
          fmt::format(FMT_STRING("{}: {} waiting for a message from rank {} (tag {})"), where, detail::timeout_message(timeout), src, tag);
      cancel_recv_locked(r, src, tag);
      job.fail_locked(world_rank(), msg);
      throw CommError(msg);
    }
  }
  if (!r->error.empty()) throw Error(where + ": " + r->error);
}

void LocalComm::cancel_recv_locked(const std::shared_ptr<PendingRecv>& r, int src, int tag) {
  auto it = g_->channels.find(std::make_tuple(src, rank_, tag));
  if (it == g_->channels.end()) return;
  auto& q = it->second.receives;
  q.erase(std::remove(q.begin(), q.end(), r), q.end());
}

void LocalComm::cancel_recv(const std::shared_ptr<PendingRecv>& r, int src, int tag) {
  std::unique_lock<std::mutex> lk(g_->job->mu);
  cancel_recv_locked(r, src, tag);
  g_->job->cv.wait(lk, [&] { return !r->claimed || r->done; });
}

bool LocalComm::recv_done(const std::shared_ptr<PendingRecv>& r) {
  std::lock_guard<std::mutex> lk(g_->job->mu);
  return r->done || g_->job->failed;
}

bool RecvWork::is_completed() {
  if (waited_) return true;
  // Done (or failed): wait() returns or throws at once.
  return c_->recv_done(r_);
}

}  // namespace

// ---- run_local -----------------------------------------------------------------

void run_local(int n, const std::function<void(int rank)>& fn) {
  if (n < 1) throw Error(fmt::format(FMT_STRING("run_local: need at least one rank, got {}"), n));
  auto job = std::make_shared<Job>(n);
  std::vector<int> ranks(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ranks[size_t(i)] = i;
  auto group = std::make_shared<Group>(job, "world", ranks);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  threads.reserve(size_t(n));
  // spdlog creates its registry on first use. Ranks often log first all at
  // once (a warning every rank gives); that lazy start is the library's own
  // thread-safe static, but Debian's libspdlog is not instrumented, so
  // ThreadSanitizer sees a race. Starting it here, before the ranks, costs
  // nothing and keeps --tsan clean.
  spdlog::default_logger_raw();
  // Bitwise mode is per thread: the ranks compute as their caller asked (a
  // BitwiseGuard around run_local reaches every rank). V and the GEMM mode
  // are process-wide already.
  const bool bitwise = numerics::bitwise();
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      numerics::set_bitwise(bitwise);
      detail::set_thread_world(std::make_shared<LocalComm>(group, r));
      try {
        fn(r);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
        std::string what = "unknown exception";
        try {
          throw;
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        std::lock_guard<std::mutex> lk(job->mu);
        job->fail_locked(r, what);
      }
      detail::set_thread_world(nullptr);
      std::lock_guard<std::mutex> lk(job->mu);
      job->exited[size_t(r)] = 1;
      job->cv.notify_all();
    });
  }
  for (auto& t : threads) t.join();
  // The first failure is the cause; the others' CommErrors are its consequences.
  if (job->failed_rank >= 0 && errors[size_t(job->failed_rank)]) std::rethrow_exception(errors[size_t(job->failed_rank)]);
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace tessel::comm
