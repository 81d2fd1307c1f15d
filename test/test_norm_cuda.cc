// CUDA LayerNorm / RMSNorm, cross-entropy / nll_loss and rotary embeddings
// against the CPU, forward and backward, bit for bit for float32 and 16-bit
// inputs. Skips without a GPU.
#include <catch2/catch.hpp>

#include "autograd/api.h"
#include "runtime/numerics.h"
#include "test/util/cuda.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

TEST_CASE("CUDA layer_norm and rms_norm equal the CPU, forward and backward") {
  TESSEL_REQUIRE_GPU();
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    for (int v : {1, 16, 64}) {
      numerics::ChunksGuard guard(v);
      INFO(dtype_name(dt) << " V " << v);
      Tensor x = uniform({3, 37, 768}, 31, -3, 3, dt).requires_grad_();
      Tensor w = uniform({768}, 32, 0.5, 1.5, dt).requires_grad_();
      Tensor b = uniform({768}, 33, -0.5, 0.5, dt).requires_grad_();
      CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return layer_norm(in[0], {768}, in[1], in[2]); },
                         {x, w, b});
      CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return layer_norm(in[0], {768}); }, {x});
      CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return rms_norm(in[0], {768}, in[1]); }, {x, w});
      CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return rms_norm(in[0], {768}); }, {x});
    }
  }
  // Many short rows (the weight gradient sums 4099 rows).
  Tensor x = uniform({4099, 24}, 34).requires_grad_();
  Tensor w = uniform({24}, 35).requires_grad_();
  Tensor b = uniform({24}, 36).requires_grad_();
  CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return layer_norm(in[0], {24}, in[1], in[2]); }, {x, w, b});
}

TEST_CASE("CUDA cross_entropy and nll_loss equal the CPU (ignore_index, label smoothing, reductions)") {
  TESSEL_REQUIRE_GPU();
  Tensor t = randint({4, 33}, 37, 0, 1000);
  t.select(1, 5).fill_(-100);  // ignored positions
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    Tensor logits = uniform({4, 33, 1000}, 38, -6, 6, dt).requires_grad_();
    for (std::string red : {"mean", "sum", "none"}) {
      for (double eps : {0.0, 0.1}) {
        INFO(dtype_name(dt) << " " << red << " eps " << eps);
        CHECK_CUDA_MATCHES(
            [&](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1], -100, red, eps); },
            {logits, t});
      }
      CHECK_CUDA_MATCHES(
          [&](const std::vector<Tensor>& in) { return nll_loss(log_softmax(in[0], -1), in[1], -100, red); },
          {logits, t});
    }
  }
  // Every target ignored: the mean is NaN on both.
  Tensor all_ignored = full({3}, int64_t(-100), TensorOptions(DType::Int64));
  Tensor l = uniform({3, 5}, 39).requires_grad_();
  CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1]); }, {l, all_ignored},
                     CompareOptions{true, 0, 0, false});
  // An out-of-range target raises the CPU's error on CUDA too.
  Tensor bad = tensor(std::vector<int64_t>{1, 7, 2}, Dims{3});
  CHECK_THROWS_WITH(cross_entropy(to_cuda(l.detach()), to_cuda(bad)),
                    Catch::Contains("target 7 at position 1 is out of range"));
}

TEST_CASE("CUDA rotary embeddings equal the CPU (both pairings, positions, partial rotary)") {
  TESSEL_REQUIRE_GPU();
  for (DType dt : {DType::Float32, DType::BFloat16}) {
    for (bool interleaved : {false, true}) {
      auto [c, s] = rope_cache(64, 16);
      Tensor x = uniform({2, 10, 3, 16}, 40, -2, 2, dt).requires_grad_();
      CHECK_CUDA_MATCHES(
          [&](const std::vector<Tensor>& in) {
            return apply_rotary(in[0], in[1], in[2], 5, interleaved);
          },
          {x, c, s});
      Tensor pos = randint({2, 10}, 41, 0, 64);
      CHECK_CUDA_MATCHES(
          [&](const std::vector<Tensor>& in) { return apply_rotary(in[0], in[1], in[2], in[3], interleaved); },
          {x, c, s, pos});
    }
  }
  auto [c, s] = rope_cache(8, 16);
  Tensor x = to_cuda(uniform({1, 10, 1, 16}, 42));
  CHECK_THROWS_WITH(apply_rotary(x, to_cuda(c), to_cuda(s), 0), Catch::Contains("outside the cos/sin tables"));
}
