// The tape engine: accumulation, hooks, retain_graph, no_grad, version checks.
#include <catch2/catch.hpp>

#include <thread>

#include "autograd/api.h"
#include "autograd/autograd_meta.h"
#include "autograd/engine.h"
#include "autograd/function.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

TEST_CASE("gradients of a small expression") {
  Tensor x = tensor({1.f, 2.f, 3.f}).requires_grad_();
  Tensor w = tensor({0.5f, -1.f, 2.f}).requires_grad_();
  Tensor y = sum(mul(x, w) + x * x);  // d/dx = w + 2x, d/dw = x
  y.backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>{2.5f, 3.f, 8.f});
  CHECK(w.grad().to_vector<float>() == std::vector<float>{1.f, 2.f, 3.f});
  CHECK(x.is_leaf());
  CHECK_FALSE(y.is_leaf());
  CHECK(y.grad_fn() != nullptr);
}

TEST_CASE("leaf gradients accumulate across backward calls") {
  Tensor x = tensor({1.f, 2.f}).requires_grad_();
  sum(x * 3.0).backward();
  sum(x * 3.0).backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>{6.f, 6.f});
  x.zero_grad();
  CHECK_FALSE(x.grad().defined());
}

TEST_CASE("a tensor used twice receives the sum of both gradients") {
  Tensor x = tensor({2.f}).requires_grad_();
  Tensor a = x * 3.0;
  Tensor y = sum(a * a + a);  // dy/da = 2a + 1 = 13, dy/dx = 39
  y.backward();
  CHECK(x.grad().item<float>() == 39.f);
}

TEST_CASE("retain_graph allows a second backward; without it saved tensors are freed") {
  Tensor x = tensor({1.f, 2.f}).requires_grad_();
  Tensor y = sum(x * x);
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>{4.f, 8.f});
  CHECK_THROWS_WITH(y.backward(), Catch::Contains("retain_graph"));
}

TEST_CASE("no_grad records nothing") {
  Tensor x = tensor({1.f}).requires_grad_();
  Tensor y;
  {
    NoGradGuard g;
    y = x * 2.0;
  }
  CHECK_FALSE(y.requires_grad());
  CHECK_THROWS_WITH(y.backward(), Catch::Contains("does not require grad"));
}

TEST_CASE("modifying a saved tensor in place is caught at backward") {
  Tensor w = tensor({1.f, 2.f}).requires_grad_();
  Tensor x = tensor({3.f, 4.f});
  Tensor y = sum(w * x);  // saves x
  x.add_(1.0);
  CHECK_THROWS_WITH(y.backward(), Catch::Contains("modified by an in-place operation") && Catch::Contains("backward of mul"));
  Tensor x2 = tensor({3.f, 4.f});
  Tensor y2 = sum(w * x2);
  x2.slice(0, 0, 1).fill_(0.0);  // through a view
  CHECK_THROWS_WITH(y2.backward(), Catch::Contains("version"));
}

TEST_CASE("in-place ops on tensors that require grad are refused under grad mode") {
  Tensor w = tensor({1.f}).requires_grad_();
  CHECK_THROWS_WITH(w.add_(1.0), Catch::Contains("add_") && Catch::Contains("requires grad"));
  NoGradGuard g;
  w.add_(1.0);  // optimizer-style update
  CHECK(w.item<float>() == 2.f);
}

TEST_CASE("hooks see and may replace gradients") {
  Tensor x = tensor({1.f, 2.f}).requires_grad_();
  Tensor seen;
  x.register_hook([&](const Tensor& g) {
    seen = g.clone();
    return mul(g, 10.0);
  });
  Tensor h = x * 2.0;
  int handle = h.register_hook([](const Tensor& g) { return add(g, 1.0); });
  sum(h).backward();
  CHECK(seen.to_vector<float>() == std::vector<float>{4.f, 4.f});  // (1 + 1) * 2
  CHECK(x.grad().to_vector<float>() == std::vector<float>{40.f, 40.f});
  h.remove_hook(handle);
}

TEST_CASE("post-accumulate hooks run after .grad is updated") {
  Tensor x = tensor({1.f, 2.f}).requires_grad_();
  std::vector<float> seen;
  x.register_post_accumulate_grad_hook([&](const Tensor& t) { seen = t.grad().to_vector<float>(); });
  sum(x * 5.0).backward();
  CHECK(seen == std::vector<float>{5.f, 5.f});
}

TEST_CASE("retain_grad keeps a non-leaf gradient") {
  Tensor x = tensor({1.f, 2.f}).requires_grad_();
  Tensor h = x * 3.0;
  h.retain_grad();
  sum(h * h).backward();
  CHECK(h.grad().to_vector<float>() == std::vector<float>{6.f, 12.f});
}

TEST_CASE("autograd::grad returns gradients without touching .grad") {
  Tensor x = tensor({1.f, 2.f}).requires_grad_();
  Tensor y = sum(x * x);
  auto g = autograd::grad({y}, {x});
  CHECK(g[0].to_vector<float>() == std::vector<float>{2.f, 4.f});
  CHECK_FALSE(x.grad().defined());
}

namespace {
// Identity whose backward counts its calls (a node with a side effect, as
// FSDP's gather node is: it reduce-scatters).
struct CountedIdentityOp {
  static constexpr const char* kName = "counted_identity";
  int* calls;
  Tensor forward(const Tensor& x) { return x.clone(); }
  std::vector<Tensor> backward(const GradContext&, std::vector<Tensor>& grads) {
    ++*calls;
    return {grads[0]};
  }
};
}  // namespace

TEST_CASE("autograd::grad runs only the nodes that lead to its inputs: a non-leaf input's own history does not run") {
  int calls = 0;
  Tensor x = tensor({1.f, 2.f}).requires_grad_();
  Tensor a = call(CountedIdentityOp{&calls}, x);
  Tensor b = a * 3.0;  // a non-leaf input
  Tensor other = tensor({5.f}).requires_grad_();
  int other_hook = 0;
  Tensor o = other * 2.0;
  o.register_hook([&](const Tensor& g) {
    ++other_hook;
    return g;
  });
  Tensor y = sum(b * b) + sum(o);  // d/db = 2b = {6, 12}
  auto g = autograd::grad({y}, {b}, {}, /*retain_graph=*/true);
  CHECK(g[0].to_vector<float>() == std::vector<float>{6.f, 12.f});
  CHECK(calls == 0);       // past the input: not part of this gradient
  CHECK(other_hook == 0);  // a branch that leads to no input: not run, its hooks not called
  // With x among the inputs the path through `a` runs, once.
  auto both = autograd::grad({y}, {b, x}, {}, true);
  CHECK(both[0].to_vector<float>() == std::vector<float>{6.f, 12.f});
  CHECK(both[1].to_vector<float>() == std::vector<float>{18.f, 36.f});
  CHECK(calls == 1);
  // The graph is intact for a later backward (nodes that did not run kept what they saved).
  y.backward();
  CHECK(x.grad().to_vector<float>() == std::vector<float>{18.f, 36.f});
  CHECK(other.grad().to_vector<float>() == std::vector<float>{2.f});
  CHECK(calls == 2);
  CHECK(other_hook == 1);
}

TEST_CASE("backward observers run before each backward on their thread only; removal; a throw refuses") {
  Tensor x = tensor({1.f, 2.f}).requires_grad_();
  int calls = 0;
  const int h = autograd::add_backward_observer([&] {
    ++calls;
    CHECK_FALSE(x.grad().defined());  // before any node ran
  });
  sum(x * 2.0).backward();
  CHECK(calls == 1);
  x.zero_grad();
  autograd::grad({sum(x * x)}, {x});  // not a backward(): no .grad is touched
  CHECK(calls == 1);
  std::thread([&] { sum(tensor({1.f}).requires_grad_() * 2.0).backward(); }).join();  // another thread
  CHECK(calls == 1);
  autograd::remove_backward_observer(h);
  sum(x * 2.0).backward();
  CHECK(calls == 1);
  x.zero_grad();
  const int refuse = autograd::add_backward_observer([] { throw Error("refused"); });
  CHECK_THROWS_WITH(sum(x * 2.0).backward(), "refused");
  CHECK_FALSE(x.grad().defined());
  autograd::remove_backward_observer(refuse);
}

TEST_CASE("backward of a non-scalar needs an explicit gradient") {
  Tensor x = tensor({1.f, 2.f}).requires_grad_();
  Tensor y = x * 2.0;
  CHECK_THROWS_WITH(y.backward(), Catch::Contains("one-element"));
  y.backward(tensor({1.f, 10.f}));
  CHECK(x.grad().to_vector<float>() == std::vector<float>{2.f, 20.f});
}

// Backward functions and their kernels take a gradient shaped like the output
// it belongs to, on its device and in its dtype: the engine sees to it for the
// gradients passed to backward() and for what hooks return.
TEST_CASE("a gradient given to backward takes its output's dtype; another shape or device is refused") {
  Tensor x = uniform({1, 3, 2, 4}, 1).requires_grad_();
  auto [c, s] = rope_cache(3, 4);
  Tensor g = uniform({1, 3, 2, 4}, 2, -1, 1, DType::Float64);
  apply_rotary(x, c, s).backward(g);  // a float64 gradient of a float32 output: converted first
  const Tensor from64 = x.grad();
  x.zero_grad();
  apply_rotary(x, c, s).backward(g.to(DType::Float32));
  CHECK(from64.dtype() == DType::Float32);
  CHECK(bitwise_equal(from64, x.grad()));
  Tensor a = uniform({3, 4}, 3).requires_grad_(), b = uniform({4, 5}, 4);
  matmul(a, b).backward(uniform({3, 5}, 5, -1, 1, DType::Float64));  // the GEMM kernels take one dtype
  CHECK(bitwise_equal(a.grad(), matmul(uniform({3, 5}, 5, -1, 1, DType::Float64).to(DType::Float32), b.t())));
  Tensor y = x * 2.0;
  CHECK_THROWS_WITH(y.backward(zeros({3, 4})), Catch::Contains("backward") && Catch::Contains("[3, 4]"));
  CHECK_THROWS_WITH(y.backward(empty({1, 3, 2, 4}, TensorOptions(kMeta))),
                    Catch::Contains("backward") && Catch::Contains("meta"));
  CHECK_THROWS_WITH(autograd::grad({y}, {x}, {zeros({2})}),
                    Catch::Contains("autograd::grad") && Catch::Contains("[2]"));
}

TEST_CASE("a hook may change a gradient's values, not its shape or device; its dtype is converted") {
  Tensor x = tensor({1.f, 2.f}).requires_grad_();
  Tensor h = x * 2.0;
  h.register_hook([](const Tensor& g) { return zeros({3}); });
  CHECK_THROWS_WITH(sum(h).backward(), Catch::Contains("hook") && Catch::Contains("[3]") && Catch::Contains("[2]"));
  Tensor leaf = tensor({1.f, 2.f}).requires_grad_();
  leaf.register_hook([](const Tensor& g) { return g.reshape({2, 1}); });
  CHECK_THROWS_WITH(sum(leaf * 2.0).backward(), Catch::Contains("hook") && Catch::Contains("[2, 1]"));
  CHECK_FALSE(leaf.grad().defined());
  Tensor z = tensor({1.f, 2.f}).requires_grad_();
  Tensor e = exp(z);
  e.register_hook([](const Tensor& g) { return mul(g.to(DType::Float64), 3.0); });
  sum(e).backward();
  CHECK(z.grad().dtype() == DType::Float32);
  CHECK(z.grad().to_vector<float>() == (exp(z.detach()) * 3.0).to_vector<float>());
}

TEST_CASE("backward runs in a fixed order: same bits every time") {
  auto run = [] {
    Tensor x = uniform({32, 16}, 7).requires_grad_();
    Tensor a = x * 1.5, b = exp(x) * 0.25, c = x.transpose(0, 1).contiguous().transpose(0, 1);
    Tensor y = sum(a * b + c * a + b);
    y.backward();
    return x.grad();
  };
  CHECK(bitwise_equal(run(), run()));
}

TEST_CASE("integer outputs do not require grad; requires_grad on ints is refused") {
  Tensor x = tensor({1.f, 5.f, 3.f}).requires_grad_();
  Tensor i = argmax(x, 0);
  CHECK_FALSE(i.requires_grad());
  CHECK(i.item<int64_t>() == 1);
  CHECK_THROWS_WITH(arange(3).requires_grad_(), Catch::Contains("floating-point"));
}

TEST_CASE("gradients through views") {
  CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return in[0].transpose(0, 1).reshape({-1}) * 2.0; },
                  {grad_input({3, 4}, 1)});
  CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return in[0].slice(1, 1, 4, 2) * in[0].select(0, 1).unsqueeze(0).slice(1, 0, 2); },
                  {grad_input({3, 5}, 2)});
  CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return in[0].unsqueeze(1).expand({2, 3, 4}) * in[1]; },
                  {grad_input({2, 4}, 3), grad_input({2, 3, 4}, 4)});
  CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return in[0].permute({2, 0, 1}).flatten(0, 1).narrow(0, 1, 3); },
                  {grad_input_noncontig({2, 3, 4}, 5)});
  CHECK_GRADCHECK([](const std::vector<Tensor>& in) { return in[0].to(DType::Float32).to(DType::Float64) * 3.0; },
                  {grad_input({4}, 6)}, GradcheckOptions{1e-2, 1e-4, 1e-4});
}
