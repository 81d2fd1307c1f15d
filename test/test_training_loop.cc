// A whole training step (forward, backward, optimizer) in steady state:
// no system allocations, and bit-identical reruns.
#include <catch2/catch.hpp>

#include "autograd/api.h"
#include "runtime/allocator.h"
#include "test/util/util.h"
#include "test/skip.h"

using namespace tessel;
using namespace tessel::testing;

namespace {

struct TinyLM {
  Tensor emb = normal_(empty({64, 16}), PhiloxKey{1, 1}, 0.0, 0.5).requires_grad_();
  Tensor w1 = normal_(empty({32, 64}), PhiloxKey{1, 2}, 0.0, 0.1).requires_grad_();
  Tensor b1 = zeros({32}).requires_grad_();
  Tensor ln_w = ones({32}).requires_grad_();
  Tensor ln_b = zeros({32}).requires_grad_();
  Tensor w2 = normal_(empty({64, 32}), PhiloxKey{1, 3}, 0.0, 0.1).requires_grad_();
  std::vector<Tensor> params() { return {emb, w1, b1, ln_w, ln_b, w2}; }

  Tensor step(int i) {
    Tensor ctx = randint(0, 64, {8, 4}, PhiloxKey{2, uint64_t(i % 3)});
    Tensor tgt = randint(0, 64, {8}, PhiloxKey{3, uint64_t(i % 3)});
    Tensor h = gelu(linear(embedding(emb, ctx).flatten(1), w1, b1));
    h = layer_norm(h, {32}, ln_w, ln_b);
    h = dropout(h, 0.1, PhiloxKey{4, uint64_t(i % 3)});
    Tensor loss = cross_entropy(linear(h, w2), tgt);
    for (auto& p : params()) p.zero_grad();
    loss.backward();
    NoGradGuard g;
    for (auto& p : params()) p.sub_(p.grad(), 0.05);
    return loss;
  }
};

}  // namespace

TEST_CASE("a training loop's steady state makes no system allocations") {
  if (!cpu_allocator_pools()) TESSEL_SKIP("TESSEL_CPU_ALLOCATOR=system: no pool to serve the loop from");
  TinyLM m;
  for (int i = 0; i < 6; ++i) m.step(i);  // warm the pool
  Allocator* a = cpu_allocator();
  AllocatorStats before = a->stats();
  for (int i = 6; i < 30; ++i) m.step(i);
  AllocatorStats after = a->stats();
  CHECK(after.requests - before.requests > 500);  // the loop really allocates tensors (960 in 24 steps)...
  CHECK(after.system_allocs == before.system_allocs);  // ...all served from the pool
}

TEST_CASE("training is bit-reproducible run to run") {
  auto run = [] {
    TinyLM m;
    std::vector<float> losses;
    for (int i = 0; i < 10; ++i) losses.push_back(m.step(i).item<float>());
    return std::make_pair(losses, m.w1.clone());
  };
  auto [l1, w1] = run();
  auto [l2, w2] = run();
  CHECK(l1 == l2);
  CHECK(bitwise_equal(w1, w2));
  CHECK(l1.back() < l1.front());
}
