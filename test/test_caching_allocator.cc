// The caching device allocator's bookkeeping (runtime/caching_allocator.h),
// on the host with a mock device: size classes, reuse per stream, deferred
// reuse of blocks recorded on other streams, out-of-memory recovery and the
// statistics. The CUDA backend itself is exercised by test_runtime_cuda.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <set>
#include <vector>

#include "runtime/caching_allocator.h"
#include "runtime/error.h"

using namespace tessel;

namespace {

// A device with `capacity` bytes, streams as opaque handles and events the
// test completes by hand.
struct MockDevice final : DeviceMemoryBackend {
  size_t capacity = size_t(1) << 30;
  size_t used = 0;
  std::map<void*, size_t> blocks;
  int allocs = 0, frees = 0, syncs = 0;
  void* current = reinterpret_cast<void*>(0x10);
  struct Event {
    bool done = false;
  };
  std::vector<Event*> events;

  void* raw_alloc(int, size_t bytes) override {
    if (used + bytes > capacity) return nullptr;
    void* p = std::malloc(bytes);
    blocks[p] = bytes;
    used += bytes;
    ++allocs;
    return p;
  }
  void raw_free(int, void* p) override {
    REQUIRE(blocks.count(p) == 1);
    used -= blocks[p];
    blocks.erase(p);
    std::free(p);
    ++frees;
  }
  void synchronize(int) override {
    ++syncs;
    for (Event* e : events) e->done = true;
  }
  void* current_stream(int) override { return current; }
  void* record_event(int, void*) override {
    events.push_back(new Event());
    return events.back();
  }
  bool event_done(void* e) override { return static_cast<Event*>(e)->done; }
  void destroy_event(void* e) override {
    for (auto& ev : events)
      if (ev == e) ev = nullptr;
    delete static_cast<Event*>(e);
    std::vector<Event*> kept;
    for (Event* ev : events)
      if (ev) kept.push_back(ev);
    events = kept;
  }
  ~MockDevice() override {
    for (auto& [p, n] : blocks) std::free(p);
    for (Event* e : events) delete e;
  }
};

const Device kDev(DeviceType::CUDA, 0);
Stream on(void* s) { return Stream{kDev, s}; }

}  // namespace

TEST_CASE("device size classes: 512-byte multiples, then eight per power of two") {
  CHECK(device_size_class(0) == 0);
  CHECK(device_size_class(1) == 512);
  CHECK(device_size_class(512) == 512);
  CHECK(device_size_class(513) == 1024);
  CHECK(device_size_class(4096) == 4096);
  CHECK(device_size_class(4097) == 4096 + 512);
  CHECK(device_size_class(5000) == 5120);
  CHECK(device_size_class(size_t(1) << 20) == size_t(1) << 20);
  CHECK(device_size_class((size_t(1) << 20) + 1) == (size_t(1) << 20) + (size_t(1) << 17));
  for (size_t n = 1; n < (size_t(1) << 26); n = n * 3 + 7) {
    const size_t c = device_size_class(n);
    INFO(n);
    CHECK(c >= n);
    CHECK(c % 512 == 0);
    CHECK(double(c) <= std::max(double(n) * 1.125, double(n) + 511.0) + 1e-9);
    CHECK(device_size_class(c) == c);  // classes are fixed points
  }
}

TEST_CASE("freed blocks are reused by the same stream and size class, without device calls") {
  MockDevice dev;
  CachingAllocator a(&dev, DeviceType::CUDA);
  void* s1 = reinterpret_cast<void*>(0x1);
  void* p = a.allocate(1000, on(s1));
  CHECK(dev.allocs == 1);
  a.deallocate(p, 1000, on(s1));
  CHECK(a.stats().cached_bytes == 1024);
  void* q = a.allocate(700, on(s1));  // same class (1024)
  CHECK(q == p);
  CHECK(dev.allocs == 1);
  CHECK(a.stats().cached_bytes == 0);
  void* r = a.allocate(2000, on(s1));  // another class: a device allocation
  CHECK(r != p);
  CHECK(dev.allocs == 2);
  a.deallocate(q, 700, on(s1));
  a.deallocate(r, 2000, on(s1));
  const AllocatorStats st = a.stats();
  CHECK(st.requests == 3);
  CHECK(st.system_allocs == 2);
  CHECK(st.current_bytes == 0);
  CHECK(st.peak_bytes == 1024 + 2048);
  CHECK(st.cached_bytes == 1024 + 2048);
}

TEST_CASE("a block freed on one stream is not handed to another stream") {
  MockDevice dev;
  CachingAllocator a(&dev, DeviceType::CUDA);
  void* s1 = reinterpret_cast<void*>(0x1);
  void* s2 = reinterpret_cast<void*>(0x2);
  void* p = a.allocate(4096, on(s1));
  a.deallocate(p, 4096, on(s2));  // the stream argument of deallocate is ignored: p belongs to s1
  void* q = a.allocate(4096, on(s2));
  CHECK(q != p);
  void* r = a.allocate(4096, on(s1));
  CHECK(r == p);
  a.deallocate(q, 4096);
  a.deallocate(r, 4096);
}

TEST_CASE("null stream handle means the thread's current stream") {
  MockDevice dev;
  CachingAllocator a(&dev, DeviceType::CUDA);
  void* p = a.allocate(100, on(nullptr));
  a.deallocate(p, 100);
  void* q = a.allocate(100, on(dev.current));
  CHECK(q == p);
  a.deallocate(q, 100);
}

TEST_CASE("record_stream delays reuse until the other stream's event completes") {
  MockDevice dev;
  CachingAllocator a(&dev, DeviceType::CUDA);
  void* s1 = reinterpret_cast<void*>(0x1);
  void* s2 = reinterpret_cast<void*>(0x2);
  void* p = a.allocate(8192, on(s1));
  a.record_stream(p, s2);
  a.record_stream(p, s2);  // once is enough
  a.record_stream(p, s1);  // its own stream: ignored
  a.deallocate(p, 8192);
  CHECK(a.pending_frees() == 1);
  REQUIRE(dev.events.size() == 1);
  void* q = a.allocate(8192, on(s1));
  CHECK(q != p);  // s2 may still use p
  dev.events[0]->done = true;
  void* r = a.allocate(8192, on(s1));
  CHECK(r == p);
  CHECK(a.pending_frees() == 0);
  CHECK(dev.events.empty());  // destroyed once processed
  a.deallocate(q, 8192);
  a.deallocate(r, 8192);
  CHECK_THROWS_AS(a.record_stream(reinterpret_cast<void*>(0x1234), s2), Error);
}

TEST_CASE("out of memory: the cache is released and the allocation retried; then a clear error") {
  MockDevice dev;
  dev.capacity = 3 * 4096;
  CachingAllocator a(&dev, DeviceType::CUDA);
  void* s1 = reinterpret_cast<void*>(0x1);
  void* p = a.allocate(4096, on(s1));
  void* q = a.allocate(4096, on(s1));
  a.deallocate(p, 4096);
  a.deallocate(q, 4096);
  // 8 KiB cached, 4 KiB free on the device: a 12 KiB request needs the cache back.
  void* big = a.allocate(3 * 4096, on(s1));
  CHECK(big != nullptr);
  CHECK(dev.syncs >= 1);
  CHECK(dev.frees == 2);
  CHECK(a.stats().cached_bytes == 0);
  CHECK(a.stats().system_frees == 2);
  try {
    a.allocate(4096, on(s1));
    FAIL("expected an out-of-memory error");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("out of memory") != std::string::npos);
    CHECK(msg.find("cuda:0") != std::string::npos);
    CHECK(msg.find("4096") != std::string::npos);
  }
  a.deallocate(big, 3 * 4096);
}

TEST_CASE("empty_cache frees every cached block; peak resets; device stats are per device") {
  MockDevice dev;
  CachingAllocator a(&dev, DeviceType::CUDA);
  void* p0 = a.allocate(1 << 20, Stream{Device(DeviceType::CUDA, 0), nullptr});
  void* p1 = a.allocate(1 << 21, Stream{Device(DeviceType::CUDA, 1), nullptr});
  CHECK(a.device_stats(0).current_bytes == 1 << 20);
  CHECK(a.device_stats(1).current_bytes == 1 << 21);
  CHECK(a.device_stats(7).current_bytes == 0);
  a.deallocate(p0, 1 << 20);
  a.deallocate(p1, 1 << 21);
  a.reset_peak();
  CHECK(a.stats().peak_bytes == 0);
  a.empty_cache();
  CHECK(dev.blocks.empty());
  CHECK(a.stats().cached_bytes == 0);
  CHECK_THROWS_AS(a.deallocate(p0, 1 << 20), Error);  // freed twice
  CHECK(a.allocate(0) == nullptr);
}

// A graph's private pool (CUDA graphs, runtime/capture.h): what is freed
// under it is reused only under it, survives empty_cache, and joins the
// home stream's lists when the pool is destroyed.
TEST_CASE("a private pool keeps its blocks to itself until it is destroyed") {
  MockDevice dev;
  CachingAllocator a(&dev, DeviceType::CUDA);
  void* home = dev.current;
  void* pool = a.create_pool(0, home);
  void* w = nullptr;
  {
    CachingAllocator::PoolScope scope(pool);
    w = a.allocate(3000, on(nullptr));  // a workspace inside a captured launch
    a.deallocate(w, 3000);
    void* again = a.allocate(3000, on(nullptr));  // reused inside the pool (one stream order)
    CHECK(again == w);
    a.deallocate(again, 3000);
  }
  CHECK(a.pool_bytes(pool) == 3072);
  // Outside the pool the block is not handed out, on any stream ...
  void* other = a.allocate(3000, on(nullptr));
  CHECK(other != w);
  a.deallocate(other, 3000);
  // ... and not given back to the device: a graph may write it at its next launch.
  a.empty_cache();
  CHECK(dev.blocks.count(w) == 1);
  CHECK(dev.blocks.count(other) == 0);
  {
    CachingAllocator::PoolScope scope(pool);
    void* back = a.allocate(2900, on(nullptr));
    CHECK(back == w);
    a.deallocate(back, 2900);
  }
  // Destroyed: an ordinary cached block of the home stream.
  a.destroy_pool(pool);
  CHECK(a.pool_bytes(pool) == 0);
  void* reused = a.allocate(3000, on(home));
  CHECK(reused == w);
  a.deallocate(reused, 3000);
  a.empty_cache();
  CHECK(dev.blocks.empty());
  CHECK_THROWS_WITH(a.destroy_pool(pool), Catch::Contains("does not exist"));
}

TEST_CASE("a pool block still in use when its pool is destroyed returns to the home stream when freed") {
  MockDevice dev;
  CachingAllocator a(&dev, DeviceType::CUDA);
  void* home = reinterpret_cast<void*>(0x7);
  void* pool = a.create_pool(0, home);
  void* kept = nullptr;
  {
    CachingAllocator::PoolScope scope(pool);
    kept = a.allocate(1 << 20, on(nullptr));  // e.g. a cache a launch made and keeps
  }
  a.destroy_pool(pool);
  a.deallocate(kept, 1 << 20);
  void* again = a.allocate(1 << 20, on(home));
  CHECK(again == kept);
  a.deallocate(again, 1 << 20);
  CHECK(a.stats().current_bytes == 0);
}
