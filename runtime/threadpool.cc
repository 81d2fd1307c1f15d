#include "runtime/threadpool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace tessel {
namespace {

thread_local bool t_in_parallel = false;

// Protocol: the caller publishes a job (fn, n, parts) under mu_ and bumps the
// generation; workers copy the job under mu_ (counting themselves active), claim
// parts with an atomic counter, and the caller returns only when every part is
// done and no worker is active, after clearing the job. So no worker ever
// touches a finished job's state.
class ThreadPool {
 public:
  explicit ThreadPool(int n) { resize(n); }
  ~ThreadPool() { stop(); }

  int size() const { return int(workers_.size()) + 1; }  // the caller works too

  void resize(int n) {
    stop();
    stopping_ = false;
    for (int i = 1; i < n; ++i) workers_.emplace_back([this] { worker_loop(); });
  }

  void run(int64_t n, int64_t parts, FunctionRef<void(int64_t, int64_t)> fn) {
    std::lock_guard<std::mutex> job_lock(job_mu_);  // one job at a time
    Job job{&fn, n, parts};
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = job;
      next_part_.store(0);
      remaining_.store(parts);
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    work(job);
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return remaining_.load() == 0 && active_ == 0; });
    job_ = Job{};
    if (error_) {
      auto e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }

 private:
  struct Job {
    FunctionRef<void(int64_t, int64_t)>* fn = nullptr;
    int64_t n = 0, parts = 0;
  };

  void work(const Job& job) {
    bool was = t_in_parallel;
    t_in_parallel = true;
    for (;;) {
      int64_t p = next_part_.fetch_add(1);
      if (p >= job.parts) break;
      int64_t begin = job.n * p / job.parts, end = job.n * (p + 1) / job.parts;
      try {
        (*job.fn)(begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
      remaining_.fetch_sub(1);
    }
    t_in_parallel = was;
  }

  void worker_loop() {
    uint64_t seen = 0;
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
        job = job_;
        ++active_;
      }
      if (job.fn) work(job);
      {
        std::lock_guard<std::mutex> lock(mu_);
        --active_;
      }
      done_cv_.notify_all();
    }
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  std::vector<std::thread> workers_;
  std::mutex job_mu_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  uint64_t generation_ = 0;
  bool stopping_ = false;
  int active_ = 0;
  Job job_;
  std::atomic<int64_t> next_part_{0}, remaining_{0};
  std::exception_ptr error_;
};

int default_threads() {
  if (const char* env = std::getenv("TESSEL_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  unsigned hc = std::thread::hardware_concurrency();
  return hc ? int(hc) : 1;
}

std::atomic<int> g_threads{0};

ThreadPool& pool() {
  static ThreadPool p(num_threads());
  return p;
}

}  // namespace

int num_threads() {
  int n = g_threads.load();
  if (n == 0) {
    n = default_threads();
    g_threads.store(n);
  }
  return n;
}

void set_num_threads(int n) {
  if (n < 1) n = 1;
  g_threads.store(n);
  if (pool().size() != n) pool().resize(n);
}

bool in_parallel_region() { return t_in_parallel; }

void parallel_for(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int64_t parts = std::min<int64_t>(num_threads(), (n + grain - 1) / grain);
  if (parts <= 1 || t_in_parallel) {
    fn(0, n);
    return;
  }
  pool().run(n, parts, fn);
}

}  // namespace tessel
