// The CUDA runtime: caching allocator (reuse, statistics, streams), streams
// and events, host <-> device copies, reading CUDA tensors, moving tensors
// with autograd, device errors. Skips without a GPU; the allocator's
// bookkeeping itself is tested on the CPU in test_caching_allocator.
#include <catch2/catch.hpp>

#include "autograd/api.h"
#include "runtime/allocator.h"
#include "test/util/cuda.h"
#include "test/util/util.h"

#ifdef TESSEL_WITH_CUDA
#include "kernels/cuda/stream.h"
#endif

using namespace tessel;
using namespace tessel::testing;

TEST_CASE("without a GPU, creating or moving CUDA tensors fails clearly") {
  if (cuda_available()) TESSEL_SKIP("a GPU is present");
  CHECK_THROWS_AS(zeros({4}, TensorOptions().with_device(kCuda)), Error);
  CHECK_THROWS_WITH(ones({2}).to(kCuda), Catch::Contains("to") && Catch::Contains("cuda:0"));
}

TEST_CASE("tensors move between CPU and GPU, reads work, gradients flow back") {
  TESSEL_REQUIRE_GPU();
  Tensor x = uniform({7, 9}, 121).requires_grad_();
  Tensor d = x.to(kCuda);
  CHECK(d.device() == kCuda);
  CHECK(d.requires_grad());
  CHECK(d.to_vector<float>() == x.to_vector<float>());
  CHECK(sum(d).item<float>() == sum(x).item<float>());
  CHECK(d.to_string().find("cuda:0") != std::string::npos);
  sum(square(d)).backward();
  REQUIRE(x.grad().defined());
  CHECK(x.grad().device() == kCPU);
  Tensor ref = uniform({7, 9}, 121).requires_grad_();
  sum(square(ref)).backward();
  CHECK(bitwise_equal(x.grad(), ref.grad()));
  CHECK_THROWS_WITH(add(d, x), Catch::Contains("different devices"));
}

TEST_CASE("the caching allocator reuses freed blocks and counts bytes") {
  TESSEL_REQUIRE_GPU();
  Allocator* a = allocator_for(kCuda);
  {
    Tensor warm = zeros({1 << 20}, TensorOptions().with_device(kCuda));
  }
  const AllocatorStats before = a->stats();
  for (int i = 0; i < 10; ++i) {
    Tensor t = zeros({1 << 20}, TensorOptions().with_device(kCuda));
    CHECK(a->stats().current_bytes >= before.current_bytes + (4 << 20));
  }
  const AllocatorStats after = a->stats();
  CHECK(after.system_allocs == before.system_allocs);  // every iteration reused the block
  CHECK(after.requests >= before.requests + 10);
  CHECK(after.current_bytes == before.current_bytes);
  CHECK(after.peak_bytes >= before.current_bytes + (4 << 20));
  a->empty_cache();
  CHECK(a->stats().cached_bytes == 0);
}

#ifdef TESSEL_WITH_CUDA
TEST_CASE("streams, events and record_stream") {
  TESSEL_REQUIRE_GPU();
  cuda::Stream side(0);
  Tensor x = uniform({1 << 18}, 122).to(kCuda);
  Tensor y;
  cuda::Event ready(true), done(true);
  ready.record(cuda::current_stream(0));
  {
    cuda::StreamGuard g(0, side.get());
    ready.wait(side.get());
    y = mul(x, 2.0);  // runs and allocates on the side stream
    cuda::record_stream(x, side.get());
    done.record(side.get());
  }
  done.synchronize();
  CHECK(done.query());
  CHECK(cuda::Event::elapsed_ms(ready, done) >= 0.0f);
  CHECK(y.to_vector<float>() == mul(x.to(kCPU), 2.0).to_vector<float>());
  x = Tensor();  // freed while recorded on the side stream: reused only after it
  synchronize(kCuda);
  CHECK(cuda::allocator().pending_frees() <= 1);
}
#endif
