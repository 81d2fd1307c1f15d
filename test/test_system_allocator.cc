// TESSEL_CPU_ALLOCATOR=system (test/BUILD sets it for this binary; ./tessel
// test --asan for every binary): each block is exactly the size asked for,
// so AddressSanitizer sees a kernel that reads or writes past a tensor's end.
// With the size class (up to 63 bytes more, or 12.5% above 4 KiB) such an
// overrun landed in memory the tensor owned and went unseen.
#include <catch2/catch.hpp>

#include <cstdint>

#include "autograd/api.h"
#include "runtime/allocator.h"
#include "test/skip.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define TESSEL_TEST_ASAN 1
#endif

using namespace tessel;

TEST_CASE("system CPU allocator: exact sizes, no pooling") {
  if (cpu_allocator_pools()) TESSEL_SKIP("the pooling allocator is on (set TESSEL_CPU_ALLOCATOR=system)");
  Allocator* a = cpu_allocator();
  // 100 bytes: its size class is 128.
  REQUIRE(cpu_size_class(100) == 128);
  const AllocatorStats before = a->stats();
  auto* p = static_cast<char*>(a->allocate(100));
  REQUIRE(p != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0);
  CHECK(a->stats().current_bytes - before.current_bytes == 100);
  CHECK(a->stats().system_allocs - before.system_allocs == 1);
#ifdef TESSEL_TEST_ASAN
  CHECK_FALSE(__asan_address_is_poisoned(p + 99));
  CHECK(__asan_address_is_poisoned(p + 100));  // one byte past the end
#endif
  a->deallocate(p, 100);
  CHECK(a->stats().current_bytes == before.current_bytes);
  CHECK(a->stats().system_frees - before.system_frees == 1);
  CHECK(a->stats().cached_bytes == 0);
}

TEST_CASE("system CPU allocator: a tensor's storage ends where its data ends") {
  if (cpu_allocator_pools()) TESSEL_SKIP("the pooling allocator is on (set TESSEL_CPU_ALLOCATOR=system)");
  Tensor t = zeros({5, 5});  // 100 bytes of float32
  REQUIRE(t.nbytes() == 100);
  const auto* p = static_cast<const char*>(t.raw_data());
  CHECK(p[99] == 0);
#ifdef TESSEL_TEST_ASAN
  CHECK(__asan_address_is_poisoned(p + t.nbytes()));
#endif
  (void)p;
}
