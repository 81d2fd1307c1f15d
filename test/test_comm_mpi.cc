// The collectives on the MPI backend: the checks of test_comm (every op and
// dtype, bitwise against the reference tree), sub-communicator grids, async,
// p2p, and the failure behaviour. Runs under mpirun (test/mpi_test.sh, -np 4);
// every rank runs every test case.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <thread>

#include "runtime/comm/comm.h"
#include "runtime/numerics.h"
#include "test/comm/checks.h"
#include "test/skip.h"

using namespace tessel;
using namespace tessel::comm;
namespace cc = tessel::testing::comm_checks;

namespace {

using Clock = std::chrono::steady_clock;

Communicator& mpi_world() {
  init_mpi();  // idempotent
  return *world();
}

void require_no_failures(const cc::Failures& f) {
  for (size_t i = 0; i < f.size() && i < 10; ++i) UNSCOPED_INFO(f[i]);
  REQUIRE(f.empty());
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("comm mpi: world", "[comm][mpi]") {
  Communicator& w = mpi_world();
  REQUIRE(is_mpi_launch());
  REQUIRE(std::string(w.backend()) == "mpi");
  REQUIRE(w.name() == "world");
  const char* env = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (env) REQUIRE(w.size() == std::atoi(env));
  REQUIRE(int(w.world_ranks().size()) == w.size());
  REQUIRE(w.world_ranks()[size_t(w.rank())] == w.rank());
}

TEST_CASE("comm mpi: all_reduce, every dtype and op, bitwise", "[comm][mpi]") {
  cc::Failures f;
  cc::all_reduce_cases(mpi_world(), f, 11);
  require_no_failures(f);
}

TEST_CASE("comm mpi: reduce_scatter and reduce_scatter_v", "[comm][mpi]") {
  cc::Failures f;
  cc::reduce_scatter_cases(mpi_world(), f, 12);
  require_no_failures(f);
}

TEST_CASE("comm mpi: all_gather and all_gather_v", "[comm][mpi]") {
  cc::Failures f;
  cc::all_gather_cases(mpi_world(), f, 13);
  require_no_failures(f);
}

TEST_CASE("comm mpi: all_to_all and all_to_all_v", "[comm][mpi]") {
  cc::Failures f;
  cc::all_to_all_cases(mpi_world(), f, 14);
  require_no_failures(f);
}

TEST_CASE("comm mpi: broadcast from every root", "[comm][mpi]") {
  cc::Failures f;
  cc::broadcast_cases(mpi_world(), f, 15);
  require_no_failures(f);
}

TEST_CASE("comm mpi: send/recv ring, message order", "[comm][mpi]") {
  cc::Failures f;
  cc::p2p_cases(mpi_world(), f, 16);
  require_no_failures(f);
}

TEST_CASE("comm mpi: async handles", "[comm][mpi]") {
  cc::Failures f;
  cc::async_cases(mpi_world(), f, 17);
  require_no_failures(f);
}

TEST_CASE("comm mpi: split grids (rows and columns)", "[comm][mpi]") {
  Communicator& w = mpi_world();
  if (w.size() % 2 != 0) TESSEL_SKIP("needs an even number of ranks, got " << w.size());
  cc::Failures f;
  cc::grid_cases(w, 2, w.size() / 2, f, 18);
  cc::grid_cases(w, w.size() / 2, 2, f, 19);
  require_no_failures(f);
}

TEST_CASE("comm mpi: mismatched sizes name the ranks and shapes on every rank", "[comm][mpi][errors]") {
  Communicator& w = mpi_world();
  if (w.size() < 2) TESSEL_SKIP("needs 2 ranks");
  Tensor x = raw::empty({w.rank() == 1 ? int64_t(5) : int64_t(4)}, DType::Float32);
  std::string e = error_of([&] { w.all_reduce(x, ReduceOp::Sum); });
  INFO(e);
  REQUIRE(contains(e, "all_reduce(sum) on 'world' (mpi backend"));
  REQUIRE(contains(e, "sizes differ between ranks: rank 1 passed Tensor(float32"));
  REQUIRE(contains(e, "shape=[5]"));
  REQUIRE(contains(e, "rank 0 passed Tensor(float32"));
  // Different collectives.
  e = error_of([&] {
    if (w.rank() == 0) w.barrier();
    else w.all_gather(x, raw::empty({x.numel() * w.size()}, DType::Float32));
  });
  INFO(e);
  REQUIRE(contains(e, "rank 1 called all_gather_v while rank 0 called barrier"));
  // The mismatch was found before any data moved: the communicator still works.
  w.barrier();
}

TEST_CASE("comm mpi: processes with different numerics settings fail at their first collective",
          "[comm][mpi][errors]") {
  Communicator& w = mpi_world();
  if (w.size() < 2) TESSEL_SKIP("needs 2 ranks");
  std::string e;
  {
    numerics::BitwiseGuard g(w.rank() == 1);
    Tensor x = raw::empty({4}, DType::Float32);
    e = error_of([&] { w.all_reduce(x, ReduceOp::Sum); });
  }
  INFO(e);
  REQUIRE(contains(e, "all_reduce(sum) on 'world' (mpi backend"));
  REQUIRE(contains(e, "different numerics settings: rank 1 has bitwise mode on"));
  w.barrier();  // found before any data moved: the communicator still works
}

TEST_CASE("comm mpi: receive size mismatches", "[comm][mpi][errors]") {
  Communicator& w = mpi_world();
  if (w.size() < 2) TESSEL_SKIP("needs 2 ranks");
  if (w.rank() == 0) {
    w.send(raw::empty({4}, DType::Float32), 1, 7);
    w.send(raw::empty({9}, DType::Float32), 1, 8);
  } else if (w.rank() == 1) {
    Tensor six = raw::empty({6}, DType::Float32);
    std::string e = error_of([&] { w.recv(six, 0, 7); });
    INFO(e);
    REQUIRE(contains(e, "recv on 'world' (mpi backend, rank 1 of"));
    REQUIRE(contains(e, "rank 0 sent 4 elements, but this receive expects Tensor(float32, cpu, shape=[6])"));
    e = error_of([&] { w.recv(six, 0, 8); });
    INFO(e);
    REQUIRE(contains(e, "rank 0 sent more elements than this receive expects"));
  }
  w.barrier();
}

TEST_CASE("comm mpi: a stalled rank gives a CommError within the timeout", "[comm][mpi][errors]") {
  Communicator& w = mpi_world();
  if (w.size() < 2) TESSEL_SKIP("needs 2 ranks");
  // On a copy of the world, so the world stays usable whatever happens.
  auto sub = w.split(0, w.rank());
  const auto prev = default_timeout();
  const bool late = w.rank() == w.size() - 1;
  if (late) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2000));
    sub->barrier();  // matches the others' timed-out barrier, which then completes
  } else {
    set_default_timeout(std::chrono::milliseconds(500));
    const auto start = Clock::now();
    std::string e;
    bool comm_error = false;
    try {
      sub->barrier();
    } catch (const CommError& err) {
      e = err.what();
      comm_error = true;
    }
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    set_default_timeout(prev);
    INFO(e);
    REQUIRE(comm_error);
    REQUIRE(contains(e, fmt::format(FMT_STRING("barrier on 'world/split(0)' (mpi backend, rank {} of {}): timed out after 0.5 s"),
                                    w.rank(), w.size())));
    // It names the peer that never came, and where it runs (init_mpi's host table).
    char host[64] = {};
    gethostname(host, sizeof host - 1);
    REQUIRE(contains(e, fmt::format(FMT_STRING("waiting for rank {} (world rank {}, host {})"), w.size() - 1,
                                    w.size() - 1, host)));
    REQUIRE(s >= 0.45);
    REQUIRE(s < 1.9);  // before the late rank arrived
  }
  // The timed-out barrier does not keep its communicator (and its MPI
  // communicators) alive once the caller drops it.
  std::weak_ptr<Communicator> weak = sub;
  sub.reset();
  REQUIRE(weak.expired());
  w.barrier();
}

TEST_CASE("comm mpi: a communicator dropped with collectives queued is freed and fails them",
          "[comm][mpi][errors]") {
  Communicator& w = mpi_world();
  if (w.size() < 2) TESSEL_SKIP("needs 2 ranks");
  // The late rank's barrier completes the others' all_reduce only through the
  // description exchange both start with.
  const char* check = std::getenv("TESSEL_COMM_CHECK");
  if (check && std::string(check) == "0") TESSEL_SKIP("TESSEL_COMM_CHECK=0");
  auto sub = w.split(0, w.rank());
  std::weak_ptr<Communicator> weak = sub;
  const bool late = w.rank() == w.size() - 1;
  Tensor x = raw::empty({4}, DType::Float32);
  if (!late) {
    // The last rank has not called it: the all_reduce stalls in its first
    // step, and the all_gather waits behind it in the communicator's queue.
    WorkPtr first = sub->all_reduce(x, ReduceOp::Sum, /*async=*/true);
    WorkPtr second = sub->all_gather(x, raw::empty({4 * w.size()}, DType::Float32), /*async=*/true);
    REQUIRE_FALSE(first->is_completed());
    REQUIRE_FALSE(second->is_completed());
    sub.reset();
    REQUIRE_FALSE(weak.expired());  // the caller's handles keep the communicator
    first.reset();
    second.reset();
    REQUIRE(weak.expired());  // nothing else does, not even its queued operations
  }
  w.barrier();  // the others have dropped theirs
  if (late) {
    // Its barrier meets the others' abandoned all_reduce (whose first step is
    // in flight, kept until finalize_mpi checks it completed): a mismatch,
    // reported here.
    std::string e = error_of([&] { sub->barrier(); });
    INFO(e);
    REQUIRE(contains(e, "all_reduce"));
    sub.reset();
    REQUIRE(weak.expired());
  }
  w.barrier();
}

TEST_CASE("comm mpi: init_nccl in this build", "[comm][mpi]") {
  // This binary does not link the NCCL backend: a clear error, never a crash.
  std::string e = error_of([] { init_nccl(); });
  REQUIRE(contains(e, "init_nccl"));
}
