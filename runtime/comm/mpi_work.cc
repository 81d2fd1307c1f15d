#include "runtime/comm/mpi_work.h"

#include <sched.h>

#include <algorithm>

#include "runtime/error.h"

namespace tessel::comm::mpi_detail {

std::string mpi_error_string(int code) {
  char s[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, s, &len);
  return std::string(s, size_t(len));
}

void check_mpi(int rc, const std::string& where, const char* call) {
  if (rc != MPI_SUCCESS) throw CommError(fmt::format(FMT_STRING("{}: {} failed: {}"), where, call, mpi_error_string(rc)));
}

std::vector<char> ScratchPool::take(size_t bytes) {
  std::vector<char> b;
  {
    std::lock_guard<std::mutex> lk(mu_);
    // The largest free buffer: the steady state has one per op in flight.
    size_t best = free_.size();
    for (size_t i = 0; i < free_.size(); ++i) {
      if (best == free_.size() || free_[i].size() > free_[best].size()) best = i;
    }
    if (best < free_.size()) {
      b = std::move(free_[best]);
      free_.erase(free_.begin() + long(best));
    }
  }
  if (b.size() < bytes) b.resize(bytes);
  return b;
}

void ScratchPool::give(std::vector<char>&& b) {
  if (b.capacity() == 0) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (free_.size() < 4) free_.push_back(std::move(b));
}

MpiWork::MpiWork(std::shared_ptr<OpQueue> queue, std::shared_ptr<ScratchPool> pool, std::string w)
    : where(std::move(w)), deadline(Clock::now() + default_timeout()), queue_(std::move(queue)),
      pool_(std::move(pool)) {}

MpiWork::~MpiWork() {
  if (pool_) pool_->give(std::move(scratch_));
}

bool MpiWork::step() noexcept {
  if (done_) return true;
  try {
    for (;;) {
      if (!reqs_.empty()) {
        int flag = 0;
        statuses_.resize(reqs_.size());
        int rc = MPI_Testall(int(reqs_.size()), reqs_.data(), &flag, statuses_.data());
        if (rc == MPI_ERR_IN_STATUS) {
          for (const auto& st : statuses_) {
            if (st.MPI_ERROR != MPI_SUCCESS && st.MPI_ERROR != MPI_ERR_PENDING) {
              if (on_request_error) on_request_error(st.MPI_ERROR);
              check_mpi(st.MPI_ERROR, where, "request");
            }
          }
        }
        check_mpi(rc, where, "MPI_Testall");
        if (!flag) return false;
        reqs_.clear();
        req_peers_.clear();
      }
      if (next_ == stages_.size()) {
        done_ = true;
        return true;
      }
      stages_[next_++](*this);
    }
  } catch (...) {
    error_ = std::current_exception();
    done_ = true;
    return true;
  }
}

bool MpiWork::progress() {
  if (queued_) {
    if (auto q = queue_.lock()) q->advance();
    if (queued_) return done_;  // earlier collectives are still posting
  }
  return step();
}

void MpiWork::start() {
  if (auto q = queue_.lock()) q->push(shared_from_this());
  progress();
}

std::string MpiWork::pending_peers() {
  // MPI_Testall that returns false leaves every request as it was, so each
  // one can still be asked (without freeing it) whether it completed.
  std::vector<int> peers;
  bool unknown = false;
  for (size_t i = 0; i < reqs_.size(); ++i) {
    if (reqs_[i] == MPI_REQUEST_NULL) continue;
    int flag = 0;
    if (MPI_Request_get_status(reqs_[i], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || flag) continue;
    const int p = req_peers_[i];
    if (p < 0) {
      unknown = true;
    } else if (std::find(peers.begin(), peers.end(), p) == peers.end()) {
      peers.push_back(p);
    }
  }
  std::sort(peers.begin(), peers.end());
  if (peers.empty()) {
    return unknown ? "waiting for the other ranks (a collective MPI call: it does not say which peer is missing)"
                   : "waiting for the other ranks";
  }
  std::vector<std::string> names;
  for (int p : peers) names.push_back(describe_peer ? describe_peer(p) : fmt::format(FMT_STRING("rank {}"), p));
  return fmt::format(FMT_STRING("waiting for {}"), fmt::join(names, ", "));
}

void MpiWork::timeout() {
  register_stale(shared_from_this());
  std::string msg = fmt::format(
      FMT_STRING("{}: {} {}: the peer stalled, failed, is unreachable or never called it; this communicator should not "
      "be used again, and finalize_mpi() calls MPI_Abort if the operation never completes"),
      where, detail::timeout_message(default_timeout()), pending_peers());
  error_ = std::make_exception_ptr(CommError(msg));
  done_ = true;
  throw CommError(msg);
}

void MpiWork::wait() {
  detail::WaitTimer timer;
  int spins = 0;
  while (!progress()) {
    if (Clock::now() >= deadline) timeout();
    // Ranks may outnumber cores (mpirun --oversubscribe): after a short
    // spin, give the core to the peer we are waiting for.
    if (++spins > 64) sched_yield();
  }
  if (error_) std::rethrow_exception(error_);
}

bool MpiWork::is_completed() {
  if (!progress() && Clock::now() >= deadline) {
    try {
      timeout();
    } catch (const CommError&) {
      // stored; wait() rethrows it
    }
  }
  return done_;  // a failure is "completed"; wait() rethrows it
}

bool MpiWork::requests_done() {
  if (reqs_.empty()) return true;
  int flag = 0;
  if (MPI_Testall(int(reqs_.size()), reqs_.data(), &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS) return true;
  return flag != 0;
}

void MpiWork::abandon(bool mpi_alive) {
  queued_ = false;
  if (done_) return;  // failed or timed out already (a timed-out one is on the stale list)
  std::string msg = fmt::format(
      FMT_STRING("{}: its communicator was destroyed before this operation had posted all its steps; wait for "
                 "asynchronous collectives before dropping their communicator"),
      where);
  error_ = std::make_exception_ptr(CommError(msg));
  done_ = true;
  if (mpi_alive && !requests_done()) register_stale(shared_from_this());
}

void OpQueue::abandon(bool mpi_alive) {
  std::deque<std::shared_ptr<MpiWork>> q;
  q.swap(q_);
  for (auto& w : q) w->abandon(mpi_alive);
}

void OpQueue::push(const std::shared_ptr<MpiWork>& w) {
  w->queued_ = true;
  q_.push_back(w);
}

void OpQueue::advance() {
  while (!q_.empty()) {
    std::shared_ptr<MpiWork> front = q_.front();
    front->step();
    if (!front->all_posted()) return;
    front->queued_ = false;
    q_.pop_front();
  }
}

namespace {
struct StaleList {
  std::mutex mu;
  std::vector<std::shared_ptr<MpiWork>> works;
};
// Never destroyed: finalize_mpi() runs from atexit, possibly after the
// static destructors of objects created after init_mpi().
StaleList& stale() {
  static StaleList* s = new StaleList;
  return *s;
}
}  // namespace

void register_stale(std::shared_ptr<MpiWork> w) {
  std::lock_guard<std::mutex> lk(stale().mu);
  stale().works.push_back(std::move(w));
}

bool drain_stale(std::chrono::milliseconds grace) {
  std::vector<std::shared_ptr<MpiWork>> works;
  {
    std::lock_guard<std::mutex> lk(stale().mu);
    works.swap(stale().works);
  }
  const auto until = Clock::now() + grace;
  bool all = true;
  for (auto& w : works) {
    bool done = w->requests_done();
    while (!done && Clock::now() < until) {
      sched_yield();
      done = w->requests_done();
    }
    all = all && done;
  }
  return all;
}

}  // namespace tessel::comm::mpi_detail
