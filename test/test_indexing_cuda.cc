// CUDA indexing kernels (gather / index_select / embedding and their
// deterministic backward, scatter_add, index_add, triu/tril, bounds errors)
// and sort / topk against the CPU, bit for bit. Skips without a GPU.
#include <catch2/catch.hpp>

#include "autograd/api.h"
#include "runtime/numerics.h"
#include "test/util/cuda.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

TEST_CASE("CUDA embedding forward and its segmented-sum backward equal the CPU") {
  TESSEL_REQUIRE_GPU();
  for (int v : {1, 16, 256}) {
    numerics::ChunksGuard guard(v);
    for (DType dt : {DType::Float32, DType::BFloat16}) {
      INFO("V " << v << " " << dtype_name(dt));
      Tensor w = uniform({97, 48}, 51, -1, 1, dt).requires_grad_();
      Tensor ids = randint({4, 333}, 52, 0, 97);  // many repeats per row
      CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return embedding(in[0], in[1]); }, {w, ids});
      Tensor ids32 = ids.to(DType::Int32);
      CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return index_select(in[0], 0, in[1].flatten()); },
                         {w, ids32});
    }
  }
}

TEST_CASE("CUDA gather / scatter_add / index_add equal the CPU") {
  TESSEL_REQUIRE_GPU();
  Tensor x = uniform({13, 40}, 53).requires_grad_();
  Tensor idx = randint({13, 25}, 54, 0, 40);
  CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return gather(in[0], 1, in[1]); }, {x, idx});
  Tensor idx0 = randint({30, 40}, 55, 0, 13);
  CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return gather(in[0], 0, in[1]); }, {x, idx0});
  Tensor src = uniform({30, 40}, 56).requires_grad_();
  CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return scatter_add(in[0], 0, in[1], in[2]); },
                     {x, idx0, src});
  Tensor rows = randint({50}, 57, 0, 13);
  Tensor add = uniform({50, 40}, 58).requires_grad_();
  CHECK_CUDA_MATCHES([](const std::vector<Tensor>& in) { return index_add(in[0], 0, in[1], in[2], 0.5); },
                     {x, rows, add});
  // Integer scatter_add (exact).
  Tensor xi = randint({5, 6}, 59, -10, 10);
  Tensor ii = randint({9, 6}, 60, 0, 5);
  Tensor si = randint({9, 6}, 61, -10, 10);
  CHECK_SAME_BITS(scatter_add(to_cuda(xi), 0, to_cuda(ii), to_cuda(si)), scatter_add(xi, 0, ii, si));
}

TEST_CASE("CUDA index errors are raised before any kernel, as on the CPU") {
  TESSEL_REQUIRE_GPU();
  Tensor w = to_cuda(uniform({10, 4}, 62));
  Tensor bad = to_cuda(tensor(std::vector<int64_t>{3, 10, 2}, Dims{3}));
  CHECK_THROWS_WITH(embedding(w, bad), Catch::Contains("10"));
  CHECK_THROWS_AS(index_select(w, 0, to_cuda(tensor(std::vector<int64_t>{-1}, Dims{1}))), Error);
}

TEST_CASE("CUDA triu / tril equal the CPU") {
  TESSEL_REQUIRE_GPU();
  Tensor x = uniform({3, 17, 23}, 63).requires_grad_();
  for (int64_t k : {-3, 0, 2}) {
    CHECK_CUDA_MATCHES([&](const std::vector<Tensor>& in) { return triu(in[0], k); }, {x});
    CHECK_CUDA_MATCHES([&](const std::vector<Tensor>& in) { return tril(in[0].transpose(1, 2), k); }, {x});
  }
  Tensor b = randint({9, 9}, 64, 0, 2).to(DType::Bool);
  CHECK_SAME_BITS(tril(to_cuda(b)), tril(b));
}

TEST_CASE("CUDA sort and topk give the CPU's permutation (ties by index, NaN placement)") {
  TESSEL_REQUIRE_GPU();
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Int64, DType::Float64}) {
    for (int64_t n : {1, 5, 64, 1000, 5000}) {  // one block in shared memory, and the multi-kernel network
      INFO(dtype_name(dt) << " n " << n);
      Tensor x = is_integral(dt) ? randint({7, n}, 65, -20, 20, dt) : randint({7, n}, 65, -20, 20).to(dt);
      if (is_floating(dt) && n >= 5) {
        x.select(0, 2).select(0, 3).fill_(NAN);
        x.select(0, 2).select(0, 1).fill_(NAN);
        x.select(0, 3).select(0, 0).fill_(-0.0);
      }
      for (bool desc : {false, true}) {
        auto [vc, ic] = sort(x, 1, desc);
        auto [vg, ig] = sort(to_cuda(x), 1, desc);
        CHECK_SAME_BITS(vg, vc);
        CHECK_SAME_BITS(ig, ic);
        auto [vc0, ic0] = sort(x.t().contiguous(), 0, desc);  // along dim 0
        auto [vg0, ig0] = sort(to_cuda(x.t().contiguous()), 0, desc);
        CHECK_SAME_BITS(ig0, ic0);
      }
      const int64_t k = std::min<int64_t>(n, 10);
      for (bool largest : {true, false})
        for (bool sorted : {true, false}) {
          auto [vc, ic] = topk(x, k, 1, largest, sorted);
          auto [vg, ig] = topk(to_cuda(x), k, 1, largest, sorted);
          CHECK_SAME_BITS(vg, vc);
          CHECK_SAME_BITS(ig, ic);
        }
    }
  }
}
