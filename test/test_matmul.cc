// Matrix products: values, the canonical K order, broadcasting, gradients, errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "autograd/api.h"
#include "kernels/canonical.h"
#include "runtime/numerics.h"
#include "runtime/threadpool.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

// The definition of one output element (docs/numerics.md).
static float canonical_dot(const std::vector<float>& a, const std::vector<float>& b, int v) {
  const int64_t K = int64_t(a.size());
  float vals[kernels::kMaxChunks];
  for (int c = 0; c < v; ++c) {
    float acc = 0.0f;
    for (int64_t k = numerics::chunk_begin(K, v, c); k < numerics::chunk_end(K, v, c); ++k)
      acc = std::fma(a[size_t(k)], b[size_t(k)], acc);
    vals[c] = acc;
  }
  return kernels::tree_combine(vals, v, kernels::SumCombine<float>());
}

TEST_CASE("matmul values and shapes") {
  Tensor a = tensor({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3});
  Tensor b = tensor({1.f, 0.f, 0.f, 1.f, 1.f, 1.f}, {3, 2});
  CHECK(matmul(a, b).to_vector<float>() == std::vector<float>{4, 5, 10, 11});
  CHECK(matmul(tensor({1.f, 2.f}), tensor({3.f, 4.f})).item<float>() == 11.f);
  CHECK(matmul(tensor({1.f, 1.f}), b.t()).shape() == Dims{3});
  CHECK(matmul(a, tensor({1.f, 1.f, 1.f})).to_vector<float>() == std::vector<float>{6, 15});
  Tensor x = uniform({4, 5, 2, 3}, 1), w = uniform({3, 7}, 2);
  CHECK(matmul(x, w).shape() == Dims{4, 5, 2, 7});
  Tensor y = uniform({5, 3, 6}, 3);
  CHECK(matmul(x, y).shape() == Dims{4, 5, 2, 6});  // batch broadcast
  Tensor lin = linear(uniform({2, 4, 3}, 4), uniform({5, 3}, 5), uniform({5}, 6));
  CHECK(lin.shape() == Dims{2, 4, 5});
}

TEST_CASE("every output element follows the canonical K order, whatever the layout") {
  for (int v : {1, 2, 16, 64}) {
    numerics::ChunksGuard g(v);
    for (int64_t K : {1, 5, 16, 100, 257}) {
      Tensor a = uniform({7, K}, uint64_t(K)), b = uniform({K, 9}, uint64_t(K + 1));
      Tensor c = matmul(a, b);
      Tensor c2 = matmul(a.t().contiguous().t(), b.t().contiguous().t());
      REQUIRE(bitwise_equal(c, c2));
      auto av = a.to_vector<float>(), bv = b.to_vector<float>(), cv = c.to_vector<float>();
      for (int i = 0; i < 7; ++i)
        for (int j = 0; j < 9; ++j) {
          std::vector<float> row(av.begin() + i * K, av.begin() + (i + 1) * K), col;
          for (int64_t k = 0; k < K; ++k) col.push_back(bv[size_t(k * 9 + j)]);
          float r = canonical_dot(row, col, v);
          REQUIRE(std::memcmp(&r, &cv[size_t(i * 9 + j)], 4) == 0);
        }
    }
  }
}

TEST_CASE("matmul is position independent and thread-count independent") {
  Tensor a = uniform({67, 45}, 7), b = uniform({45, 53}, 8);
  Tensor c = matmul(a, b);
  Tensor sub = matmul(a.narrow(0, 13, 20), b.narrow(1, 7, 30));
  CHECK(bitwise_equal(sub, c.narrow(0, 13, 20).narrow(1, 7, 30)));
  set_num_threads(1);
  Tensor c1 = matmul(a, b);
  set_num_threads(3);
  Tensor c3 = matmul(a, b);
  set_num_threads(2);
  CHECK(bitwise_equal(c1, c));
  CHECK(bitwise_equal(c3, c));
}

TEST_CASE("gradients of matmul, bmm and linear") {
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return matmul(v[0], v[1]); },
                  {grad_input_noncontig({3, 4}, 1), grad_input({4, 5}, 2)});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return matmul(v[0], v[1]); },
                  {grad_input({2, 3, 4}, 3), grad_input({4, 2}, 4)});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return matmul(v[0], v[1]); },
                  {grad_input({2, 1, 3, 4}, 5), grad_input({3, 4, 2}, 6)});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return matmul(v[0], v[1]); },
                  {grad_input({4}, 7), grad_input({4}, 8)});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return matmul(v[0], v[1]); },
                  {grad_input({4}, 9), grad_input({2, 4, 3}, 10)});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return bmm(v[0], v[1]); },
                  {grad_input({2, 3, 4}, 11), grad_input_noncontig({2, 4, 5}, 12)});
  CHECK_GRADCHECK([](const std::vector<Tensor>& v) { return linear(v[0], v[1], v[2]); },
                  {grad_input({2, 3, 4}, 13), grad_input({5, 4}, 14), grad_input({5}, 15)});
}

TEST_CASE("linear's weight gradient arrives contiguous, with the bits of x^T g") {
  for (int64_t K : {5, 64, 300}) {
    Tensor x = uniform({3, 17, K}, 30), w = uniform({11, K}, 31).requires_grad_(), g = uniform({3, 17, 11}, 32);
    linear(x, w).backward(g);
    // The definition: dW^T = x^T g over all rows, transposed.
    Tensor ref = matmul(x.reshape({-1, K}).t(), g.reshape({-1, 11})).t().contiguous();
    REQUIRE(w.grad().is_contiguous());
    CHECK(bitwise_equal(w.grad(), ref));
  }
}

TEST_CASE("linear with bias (the GEMM starts from the bias) has the bits of matmul + add") {
  for (DType dt : {DType::Float32, DType::Float64}) {
    for (const Dims& xs : {Dims{7}, Dims{9, 33}, Dims{2, 5, 33}}) {
      const int64_t K = xs.back();
      Tensor x = uniform(xs, 40, -1, 1, dt).requires_grad_(), w = uniform({6, K}, 41, -1, 1, dt).requires_grad_();
      Tensor b = uniform({6}, 42, -1, 1, dt).requires_grad_();
      Tensor x2 = x.detach().requires_grad_(), w2 = w.detach().requires_grad_(), b2 = b.detach().requires_grad_();
      Tensor y = linear(x, w, b), y2 = matmul(x2, w2.t()) + b2;
      REQUIRE(bitwise_equal(y, y2));
      Tensor g = uniform(y.shape(), 43, -1, 1, dt);
      y.backward(g);
      y2.backward(g);
      CHECK(bitwise_equal(x.grad(), x2.grad()));
      CHECK(bitwise_equal(w.grad(), w2.grad()));
      CHECK(bitwise_equal(b.grad(), b2.grad()));
    }
  }
  // A non-contiguous input and an empty batch.
  Tensor xt = uniform({33, 4}, 44).t(), w = uniform({6, 33}, 45), b = uniform({6}, 46);
  CHECK(bitwise_equal(linear(xt, w, b), matmul(xt, w.t()) + b));
  CHECK(linear(zeros({0, 33}), w, b).shape() == Dims{0, 6});
}

TEST_CASE("half-precision matmul widens to float32 and rounds once") {
  Tensor a = uniform({8, 16}, 20), b = uniform({16, 4}, 21);
  Tensor ref = matmul(a.to(DType::BFloat16).to(DType::Float32), b.to(DType::BFloat16).to(DType::Float32));
  Tensor h = matmul(a.to(DType::BFloat16), b.to(DType::BFloat16));
  CHECK(h.dtype() == DType::BFloat16);
  CHECK(bitwise_equal(h, ref.to(DType::BFloat16)));
}

TEST_CASE("matmul errors name the op and shapes") {
  CHECK_THROWS_WITH(matmul(zeros({2, 3}), zeros({4, 5})), Catch::Contains("matmul") && Catch::Contains("[2, 3]") &&
                                                              Catch::Contains("[4, 5]"));
  CHECK_THROWS_WITH(bmm(zeros({2, 3, 4}), zeros({3, 4, 5})), Catch::Contains("bmm") && Catch::Contains("batch"));
  CHECK_THROWS_WITH(matmul(arange(4).reshape({2, 2}), arange(4).reshape({2, 2})), Catch::Contains("floating"));
  CHECK_THROWS_WITH(linear(zeros({2, 3}), zeros({4, 5})), Catch::Contains("linear") && Catch::Contains("in_features"));
  CHECK_THROWS_WITH(matmul(zeros({2, 2, 3}), zeros({3, 2, 3})), Catch::Contains("matmul"));
}

// The op checks its inputs once and the kernels do not re-check them: every
// error here comes from the op, so it comes on Meta tensors too (no kernel
// runs there), as in a Meta model or before a distributed op.
TEST_CASE("matmul errors come from the op, on Meta tensors too") {
  CHECK_THROWS_WITH(matmul(meta({2, 3}), meta({4, 5})), Catch::Contains("matmul") && Catch::Contains("[2, 3]"));
  CHECK_THROWS_WITH(bmm(meta({2, 3, 4}), meta({3, 4, 5})), Catch::Contains("bmm") && Catch::Contains("batch"));
  CHECK_THROWS_WITH(bmm(meta({2, 3, 4}), meta({2, 5, 5})), Catch::Contains("bmm") && Catch::Contains("inner"));
  CHECK_THROWS_WITH(matmul(meta({2, 2}, DType::Int64), meta({2, 2}, DType::Int64)), Catch::Contains("floating"));
  CHECK_THROWS_WITH(linear(meta({2, 3}), meta({4, 5})), Catch::Contains("linear") && Catch::Contains("in_features"));
  CHECK_THROWS_WITH(linear(meta({2, 3}), meta({4, 3}), meta({5})),
                    Catch::Contains("linear") && Catch::Contains("bias"));
  CHECK(bmm(meta({2, 3, 4}), meta({2, 4, 5})).shape() == Dims{2, 3, 5});
}
