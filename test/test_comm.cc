// The collectives on the local backend (ranks as threads): every op with
// world sizes 1, 2, 3, 4, 8, every dtype, checked bit for bit against a
// reference reduction tree; sub-communicators; async handles; p2p; and the
// failure behaviour (errors name rank/op/shapes, no hangs).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "kernels/canonical.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/reduce.h"
#include "runtime/comm/tree.h"
#include "runtime/numerics.h"
#include "test/comm/checks.h"

using namespace tessel;
using namespace tessel::comm;
namespace cc = tessel::testing::comm_checks;

namespace {

using Clock = std::chrono::steady_clock;

struct TimeoutGuard {
  std::chrono::milliseconds prev = default_timeout();
  explicit TimeoutGuard(std::chrono::milliseconds t) { set_default_timeout(t); }
  ~TimeoutGuard() { set_default_timeout(prev); }
};

// Runs `check` on every rank of a local world of n ranks; returns all failures.
cc::Failures on_ranks(int n, const std::function<void(Communicator&, cc::Failures&)>& check) {
  std::vector<cc::Failures> per_rank(static_cast<size_t>(n));
  run_local(n, [&](int r) { check(*world(), per_rank[size_t(r)]); });
  cc::Failures all;
  for (auto& f : per_rank) all.insert(all.end(), f.begin(), f.end());
  return all;
}

void require_no_failures(const cc::Failures& f) {
  for (size_t i = 0; i < f.size() && i < 10; ++i) UNSCOPED_INFO(f[i]);
  REQUIRE(f.empty());
}

const int kWorldSizes[] = {1, 2, 3, 4, 8};

// The first error message thrown by run_local, and whether it was a CommError.
struct Thrown {
  std::string what;
  bool comm_error = false;
  bool error = false;
};
Thrown run_and_catch(int n, const std::function<void(int)>& fn) {
  Thrown t;
  try {
    run_local(n, fn);
  } catch (const CommError& e) {
    t.what = e.what();
    t.comm_error = t.error = true;
  } catch (const Error& e) {
    t.what = e.what();
    t.error = true;
  }
  return t;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("comm: tree_fold is the contract's level loop, for every n up to 130", "[comm]") {
  for (int n = 1; n <= 130; ++n) {
    std::vector<std::string> v;
    for (int i = 0; i < n; ++i) v.push_back(std::to_string(i));
    auto combine = [](const std::string& a, const std::string& b) { return "(" + a + "+" + b + ")"; };
    for (int w = 1; w < n; w *= 2)
      for (int i = 0; i + w < n; i += 2 * w) v[size_t(i)] = combine(v[size_t(i)], v[size_t(i + w)]);
    std::string folded = tree_fold<std::string>(n, [](int i) { return std::to_string(i); }, combine);
    INFO("n = " << n);
    REQUIRE(folded == v[0]);
  }
}

TEST_CASE("comm: tree_reduce over buffers equals the reference for 1..20 contributions", "[comm]") {
  for (DType dt : cc::all_dtypes()) {
    for (ReduceOp op : cc::ops_for(dt)) {
      for (int n = 1; n <= 20; ++n) {
        const int64_t count = 1500;  // spans several internal blocks
        std::vector<Tensor> contrib;
        std::vector<const void*> ptrs;
        for (int r = 0; r < n; ++r) {
          contrib.push_back(cc::make_input(dt, count, cc::mix(uint64_t(n), uint64_t(r)), op == ReduceOp::Max));
          ptrs.push_back(contrib.back().raw_data());
        }
        Tensor out = raw::empty({count}, dt);
        tree_reduce(dt, op, ptrs.data(), n, count, out.raw_data());
        INFO(dtype_name(dt) << " " << reduce_op_name(op) << " n=" << n);
        REQUIRE(cc::compare_bits(out, cc::reference_reduce(contrib, op)) == "");
        // In place on one of the sources.
        Tensor expected = cc::reference_reduce(contrib, op);
        tree_reduce(dt, op, ptrs.data(), n, count, const_cast<void*>(ptrs[size_t(n - 1)]));
        REQUIRE(cc::compare_bits(contrib[size_t(n - 1)], expected) == "");
      }
    }
  }
}

TEST_CASE("comm local: world() per rank thread", "[comm]") {
  REQUIRE_FALSE(has_world());
  REQUIRE_THROWS_AS(world(), Error);
  std::vector<std::string> seen(3);
  run_local(3, [&](int r) {
    auto w = world();
    seen[size_t(r)] = fmt::format(FMT_STRING("{} {} {} {} [{}]"), w->rank(), w->size(), w->backend(), w->name(),
                                  fmt::join(w->world_ranks(), ","));
  });
  REQUIRE(seen[0] == "0 3 local world [0,1,2]");
  REQUIRE(seen[2] == "2 3 local world [0,1,2]");
  REQUIRE_FALSE(has_world());
  REQUIRE_THROWS_WITH(run_local(0, [](int) {}), Catch::Contains("at least one rank"));
}

TEST_CASE("comm local: all_reduce, every dtype and op, bitwise", "[comm]") {
  for (int n : kWorldSizes) {
    INFO("world size " << n);
    require_no_failures(on_ranks(n, [](Communicator& c, cc::Failures& f) { cc::all_reduce_cases(c, f, 11); }));
  }
}

TEST_CASE("comm local: reduce_scatter and reduce_scatter_v", "[comm]") {
  for (int n : kWorldSizes) {
    INFO("world size " << n);
    require_no_failures(on_ranks(n, [](Communicator& c, cc::Failures& f) { cc::reduce_scatter_cases(c, f, 12); }));
  }
}

TEST_CASE("comm local: all_gather and all_gather_v", "[comm]") {
  for (int n : kWorldSizes) {
    INFO("world size " << n);
    require_no_failures(on_ranks(n, [](Communicator& c, cc::Failures& f) { cc::all_gather_cases(c, f, 13); }));
  }
}

TEST_CASE("comm local: all_to_all and all_to_all_v", "[comm]") {
  for (int n : kWorldSizes) {
    INFO("world size " << n);
    require_no_failures(on_ranks(n, [](Communicator& c, cc::Failures& f) { cc::all_to_all_cases(c, f, 14); }));
  }
}

TEST_CASE("comm local: broadcast from every root", "[comm]") {
  for (int n : kWorldSizes) {
    INFO("world size " << n);
    require_no_failures(on_ranks(n, [](Communicator& c, cc::Failures& f) { cc::broadcast_cases(c, f, 15); }));
  }
}

TEST_CASE("comm local: send/recv ring, message order", "[comm]") {
  for (int n : kWorldSizes) {
    INFO("world size " << n);
    require_no_failures(on_ranks(n, [](Communicator& c, cc::Failures& f) { cc::p2p_cases(c, f, 16); }));
  }
}

TEST_CASE("comm local: async handles", "[comm]") {
  for (int n : kWorldSizes) {
    INFO("world size " << n);
    require_no_failures(on_ranks(n, [](Communicator& c, cc::Failures& f) { cc::async_cases(c, f, 17); }));
  }
  // A receive posted asynchronously completes when the message arrives.
  std::atomic<bool> before{true}, after{false};
  run_local(2, [&](int r) {
    auto w = world();
    Tensor t = raw::empty({4}, DType::Float32);
    if (r == 0) {
      auto h = w->recv(t, 1, 0, true);
      if (h->is_completed()) before = false;  // nothing was sent yet
      w->barrier();                          // rank 1 sends after this barrier
      auto deadline = Clock::now() + std::chrono::seconds(10);
      while (!h->is_completed() && Clock::now() < deadline) std::this_thread::yield();
      after = h->is_completed();
      h->wait();
    } else {
      std::memset(t.raw_data(), 0, t.nbytes());
      w->barrier();
      w->send(t, 0);
    }
  });
  REQUIRE(before);
  REQUIRE(after);
}

TEST_CASE("comm local: split into 2x2 and 2x4 grids (rows and columns)", "[comm]") {
  require_no_failures(on_ranks(4, [](Communicator& c, cc::Failures& f) { cc::grid_cases(c, 2, 2, f, 18); }));
  require_no_failures(on_ranks(8, [](Communicator& c, cc::Failures& f) { cc::grid_cases(c, 2, 4, f, 19); }));
  require_no_failures(on_ranks(8, [](Communicator& c, cc::Failures& f) { cc::grid_cases(c, 4, 2, f, 20); }));
}

TEST_CASE("comm local: the cross-rank tree finishes a single device's canonical sum", "[comm]") {
  // A length-L sum sharded over W = 4 ranks, L divisible by V = 16: each rank
  // owns V/W whole chunks, sums them canonically with V/W chunks, and the
  // all_reduce over ranks finishes the same tree (docs/numerics.md level 3).
  const int W = 4, V = 16;
  const int64_t L = 16 * 97;
  Tensor x = cc::make_input(DType::Float32, L, 2024);
  const float full = kernels::canonical_sum_ref<float>(x.data<float>(), L, 1, V);
  std::vector<float> got(W);
  run_local(W, [&](int r) {
    const float part = kernels::canonical_sum_ref<float>(x.data<float>() + r * (L / W), L / W, 1, V / W);
    Tensor t = raw::empty({1}, DType::Float32);
    *t.data<float>() = part;
    world()->all_reduce(t, ReduceOp::Sum);
    got[size_t(r)] = *t.data<float>();
  });
  for (int r = 0; r < W; ++r) REQUIRE(std::memcmp(&got[size_t(r)], &full, 4) == 0);
}

// ---- errors ------------------------------------------------------------------

TEST_CASE("comm local: mismatched sizes name the ranks and shapes", "[comm][errors]") {
  Thrown t = run_and_catch(3, [](int r) {
    Tensor x = raw::empty({r == 1 ? int64_t(5) : int64_t(4)}, DType::Float32);
    world()->all_reduce(x, ReduceOp::Sum);
  });
  INFO(t.what);
  REQUIRE(t.error);
  REQUIRE_FALSE(t.comm_error);
  REQUIRE(contains(t.what, "all_reduce(sum) on 'world' (local backend"));
  REQUIRE(contains(t.what, "rank 1 passed Tensor(float32, cpu, shape=[5])"));
  REQUIRE(contains(t.what, "rank 0 passed Tensor(float32, cpu, shape=[4])"));
}

TEST_CASE("comm local: ranks get their caller's numerics settings", "[comm][numerics]") {
  for (bool on : {false, true}) {
    numerics::BitwiseGuard g(on);
    std::atomic<int> agree{0};
    run_local(3, [&](int) {
      if (numerics::bitwise() == on) ++agree;
      Tensor x = raw::empty({4}, DType::Float32);
      world()->all_reduce(x, ReduceOp::Sum)->wait();  // the settings check passes
    });
    CHECK(agree == 3);
  }
}

TEST_CASE("comm local: ranks with different numerics settings fail at their first collective", "[comm][errors]") {
  Thrown t = run_and_catch(3, [](int r) {
    numerics::BitwiseGuard g(r == 2);  // rank 2 alone in bitwise mode
    Tensor x = raw::empty({4}, DType::Float32);
    world()->all_reduce(x, ReduceOp::Sum);
  });
  INFO(t.what);
  REQUIRE(t.error);
  REQUIRE(contains(t.what, "all_reduce(sum) on 'world' (local backend"));
  REQUIRE(contains(t.what, "different numerics settings: rank 2 has bitwise mode on, V = "));
  REQUIRE(contains(t.what, "rank 0 has bitwise mode off"));
}

TEST_CASE("numerics settings: encode/decode round trip, description", "[numerics]") {
  for (bool b : {false, true})
    for (int v : {1, 2, 16, 1024})
      for (auto gm : {numerics::GemmMode::Bitwise, numerics::GemmMode::Fast}) {
        numerics::Settings s{b, v, gm};
        CHECK(numerics::decode_settings(numerics::encode_settings(s)) == s);
      }
  CHECK(numerics::describe_settings({true, 16, numerics::GemmMode::Fast}) == "bitwise mode on, V = 16, GEMM fast");
  numerics::BitwiseGuard g(true);
  CHECK(numerics::current_settings().bitwise);
}

TEST_CASE("comm local: argument errors", "[comm][errors]") {
  auto expect = [](const std::function<void(Communicator&)>& body, const std::string& part) {
    Thrown t = run_and_catch(2, [&](int) { body(*world()); });
    INFO(t.what);
    CHECK(t.error);
    CHECK(contains(t.what, part));
  };
  expect([](Communicator& c) { c.all_reduce(raw::empty({3}, DType::Bool), ReduceOp::Sum); }, "sum of bool");
  expect([](Communicator& c) { c.all_reduce(raw::empty({3}, DType::Int32), ReduceOp::Avg); }, "avg of int32");
  expect([](Communicator& c) { c.all_reduce(raw::transpose(raw::empty({3, 2}, DType::Float32), 0, 1), ReduceOp::Sum); },
         "must be contiguous");
  expect([](Communicator& c) { c.all_gather(raw::empty({3}, DType::Float32), raw::empty({5}, DType::Float32)); },
         "output must hold size() = 2 copies");
  expect([](Communicator& c) { c.broadcast(raw::empty({3}, DType::Float32), 2); }, "root 2 is not a rank");
  expect(
      [](Communicator& c) {
        if (c.rank() == 0) c.barrier();
        else c.all_reduce(raw::empty({3}, DType::Float32), ReduceOp::Sum);
      },
      "rank 1 called all_reduce while rank 0 called barrier");
  expect([](Communicator& c) { c.all_reduce(raw::empty({3}, DType::Float32), c.rank() ? ReduceOp::Max : ReduceOp::Sum); },
         "reduce ops differ between ranks: rank 1 passed max, rank 0 passed sum");
  expect(
      [](Communicator& c) {
        std::vector<int64_t> send = {1, c.rank() == 0 ? int64_t(2) : int64_t(1)}, recv = {1, 1};
        Tensor in = raw::empty({send[0] + send[1]}, DType::Float32), out = raw::empty({2}, DType::Float32);
        c.all_to_all_v(in, send, out, recv);
      },
      "rank 0 sends 2 elements to rank 1, which expects recv_counts[0] = 1");
  expect(
      [](Communicator& c) {
        Tensor t = raw::empty({c.rank() == 0 ? int64_t(4) : int64_t(6)}, DType::Float32);
        if (c.rank() == 0) c.send(t, 1, 7);
        else c.recv(t, 0, 7);
      },
      "rank 0 sent Tensor(float32, cpu, shape=[4]) (tag 7), but this receive expects Tensor(float32, cpu, shape=[6])");
}

TEST_CASE("comm local: a rank that throws makes the others fail promptly", "[comm][errors]") {
  TimeoutGuard guard(std::chrono::seconds(300));
  std::mutex mu;
  std::vector<std::string> others;
  const auto start = Clock::now();
  Thrown t = run_and_catch(4, [&](int r) {
    Tensor x = raw::empty({64}, DType::Float32);
    std::memset(x.raw_data(), 0, x.nbytes());
    world()->all_reduce(x, ReduceOp::Sum);
    if (r == 2) throw Error("boom from rank 2");
    try {
      for (int i = 0; i < 1000; ++i) world()->all_reduce(x, ReduceOp::Sum);
    } catch (const CommError& e) {
      std::lock_guard<std::mutex> lk(mu);
      others.push_back(e.what());
      throw;
    }
  });
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  REQUIRE(seconds < 10.0);  // the timeout is 300 s: nobody waited for it
  REQUIRE(t.what == "boom from rank 2");  // the original error, not a consequence
  REQUIRE_FALSE(t.comm_error);
  for (const auto& m : others) UNSCOPED_INFO(m);
  REQUIRE(others.size() == 3);
  for (const auto& m : others) {
    INFO(m);
    REQUIRE(contains(m, "all_reduce(sum) on 'world' (local backend"));
    REQUIRE(contains(m, "rank 2 failed: boom from rank 2"));
  }
}

TEST_CASE("comm local: a rank that never arrives gives a CommError within the timeout", "[comm][errors]") {
  TimeoutGuard guard(std::chrono::milliseconds(300));
  std::atomic<double> failed_after{-1.0};
  const auto start = Clock::now();
  Thrown t = run_and_catch(3, [&](int r) {
    if (r == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      return;
    }
    Tensor x = raw::empty({8}, DType::Float32);
    try {
      world()->all_reduce(x, ReduceOp::Sum);
    } catch (const CommError&) {
      double s = std::chrono::duration<double>(Clock::now() - start).count();
      double expected = -1.0;
      failed_after.compare_exchange_strong(expected, s);
      throw;
    }
  });
  INFO(t.what);
  REQUIRE(t.comm_error);
  REQUIRE(contains(t.what, "timed out after 0.3 s"));
  REQUIRE(contains(t.what, "waiting for rank(s) 2"));
  REQUIRE(failed_after.load() >= 0.29);
  REQUIRE(failed_after.load() < 1.2);
}

TEST_CASE("comm local: a rank that returns without joining fails the others at once", "[comm][errors]") {
  TimeoutGuard guard(std::chrono::seconds(300));
  const auto start = Clock::now();
  Thrown t = run_and_catch(2, [](int r) {
    if (r == 1) return;
    world()->barrier();
  });
  REQUIRE(std::chrono::duration<double>(Clock::now() - start).count() < 10.0);
  INFO(t.what);
  REQUIRE(t.comm_error);
  REQUIRE(contains(t.what, "barrier on 'world' (local backend, rank 0 of 2): rank 1 (world rank 1) returned"));
  // The same for a receive whose sender is gone.
  t = run_and_catch(2, [](int r) {
    if (r == 1) return;
    Tensor x = raw::empty({2}, DType::Float32);
    world()->recv(x, 1, 5);
  });
  INFO(t.what);
  REQUIRE(contains(t.what, "rank 1 returned without sending the message (tag 5)"));
}

TEST_CASE("comm local: sub-communicator failures name the sub-communicator", "[comm][errors]") {
  TimeoutGuard guard(std::chrono::seconds(300));
  std::mutex mu;
  std::vector<std::string> msgs;
  Thrown t = run_and_catch(4, [&](int r) {
    auto row = world()->split(r / 2, r);
    if (r == 3) throw Error("rank 3 gives up");
    try {
      row->barrier();
    } catch (const CommError& e) {
      std::lock_guard<std::mutex> lk(mu);
      msgs.push_back(e.what());
    }
  });
  REQUIRE(t.what == "rank 3 gives up");
  // Rank 2 (row 1) waits for rank 3 and must fail; row 0 may or may not finish first.
  bool found = false;
  for (auto& m : msgs) found = found || contains(m, "barrier on 'world/split(1)' (local backend, rank 0 of 2)");
  REQUIRE(found);
}
