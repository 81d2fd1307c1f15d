#include <catch2/catch.hpp>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/half.h"
#include "runtime/shape.h"
#include "runtime/threadpool.h"
#include "test/skip.h"

using namespace tessel;

TEST_CASE("dtype promotion follows the lattice") {
  CHECK(promote_types(DType::Int32, DType::Float32) == DType::Float32);
  CHECK(promote_types(DType::Float16, DType::BFloat16) == DType::Float32);
  CHECK(promote_types(DType::Bool, DType::Int64) == DType::Int64);
}

TEST_CASE("coordinates_of: row-major coordinates of a linear index") {
  CHECK(coordinates_of(Dims{2, 16}, 19) == Dims{1, 3});
  CHECK(coordinates_of(Dims{2, 3, 4}, 23) == Dims{1, 2, 3});
  CHECK(coordinates_of(Dims{5}, 4) == Dims{4});
  CHECK(coordinates_of(Dims{}, 0) == Dims{});
}

// Each index of [0, n) handed out exactly once, in parts of at least `grain` (but the last).
static void check_cover(int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(size_t(std::max<int64_t>(n, 1)));
  std::atomic<int> short_parts{0};
  parallel_for(n, grain, [&](int64_t b, int64_t e) {
    if (e - b < grain && e != n) short_parts.fetch_add(1);
    for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1);
  });
  int wrong = 0;
  for (int64_t i = 0; i < n; ++i) wrong += hits[size_t(i)].load() != 1;
  CHECK(wrong == 0);
  CHECK(short_parts.load() == 0);
}

TEST_CASE("parallel_for covers [0, n) once, back to back and from several threads at once") {
  const int threads = num_threads();
  set_num_threads(2);
  for (int64_t n : {0, 1, 2, 3, 17, 1000, 65536}) check_cover(n, 1);
  check_cover(1000, 300);
  // Thousands of small jobs back to back (a worker may still be waking for
  // the last one when the next is published), then with pauses between them.
  for (int k = 0; k < 3000; ++k) check_cover(64, 1);
  for (int k = 0; k < 5; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    check_cover(64, 1);
  }
  // Callers on several threads (ranks as threads) share the pool, a job at a time.
  std::vector<std::thread> callers;
  std::atomic<int64_t> sum{0};
  for (int t = 0; t < 4; ++t)
    callers.emplace_back([&] {
      for (int k = 0; k < 500; ++k) parallel_for(100, 1, [&](int64_t b, int64_t e) { sum.fetch_add(e - b); });
    });
  for (std::thread& c : callers) c.join();
  CHECK(sum.load() == 4 * 500 * 100);
  // Nested calls run inline; an exception reaches the caller.
  std::atomic<int> inline_calls{0}, outside{0};  // (no CHECK on a worker: Catch2's are not thread-safe)
  parallel_for(4, 1, [&](int64_t, int64_t) {
    if (!in_parallel_region()) outside.fetch_add(1);
    parallel_for(10, 1, [&](int64_t b, int64_t e) {
      if (b == 0 && e == 10) inline_calls.fetch_add(1);  // one range: inline
    });
  });
  CHECK(inline_calls.load() == 2);  // (two parts: as many as threads)
  CHECK(outside.load() == 0);
  CHECK(!in_parallel_region());
  CHECK_THROWS_WITH(parallel_for(8, 1, [](int64_t b, int64_t) {
                      if (b == 0) throw std::runtime_error("part 0 failed");
                    }),
                    "part 0 failed");
  check_cover(100, 1);  // the pool works after an exception
  set_num_threads(threads);
}
