// Indexing ops: values, the segmented canonical sum (bitwise against the dense
// reference), thread-count invariance, gradients, and every error path.
#include <catch2/catch.hpp>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "autograd/api.h"
#include "kernels/canonical.h"
#include "kernels/cpu/segment_sum.h"
#include "runtime/numerics.h"
#include "runtime/threadpool.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

namespace {

Tensor ids64(const std::vector<int64_t>& v, const Dims& shape = {}) {
  return tensor(v, shape.empty() ? Dims{int64_t(v.size())} : shape);
}

// Values that stress the exactness argument of segment_sum.h: signed zeros,
// exact cancellations, huge and tiny magnitudes, mixed with random ones.
std::vector<float> nasty_values(int64_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const float special[] = {0.f, -0.f, 1.5f, -1.5f, 1e30f, -1e30f, 1e-30f, -1e-30f, 3.f};
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = gen() % 3 == 0 ? special[gen() % 9] : u(gen);
  return v;
}

// The canonical sum over t of (dest[t] == r ? value(t) : +0), straight from
// kernels/canonical.h.
template <class Acc, class F>
Acc dense_segment_ref(const std::vector<int64_t>& dest, int64_t r, int v, F value) {
  return kernels::canonical_reduce_ref<Acc>(
      int64_t(dest.size()), v, Acc(0), [&](int64_t t) { return dest[size_t(t)] == r ? Acc(value(t)) : Acc(0); },
      kernels::SumCombine<Acc>());
}

template <class T>
void check_segment_rows_against_reference(uint64_t seed) {
  std::mt19937_64 gen(seed);
  for (int64_t Tn : {1, 5, 8, 9, 40, 333}) {
    for (int64_t R : {1, 3, 17}) {
      for (int64_t D : {1, 7, 33}) {
        for (int V : {1, 2, 16, 64}) {
          const int64_t O = 1 + int64_t(gen() % 2);
          std::vector<int64_t> dest(static_cast<size_t>(Tn));
          // Skewed destinations: many duplicates, some destinations untouched.
          for (auto& d : dest) d = int64_t(gen() % 2 ? gen() % R : 0) % R;
          auto f = nasty_values(O * Tn * D, gen());
          std::vector<T> src(f.size());
          for (size_t i = 0; i < f.size(); ++i) src[i] = T(f[i]);
          auto base = nasty_values(O * R * D, gen());
          for (bool accumulate : {false, true}) {
            std::vector<T> a(size_t(O * R * D)), b(a.size());
            for (size_t i = 0; i < a.size(); ++i) a[i] = b[i] = T(base[i]);
            kernels::cpu::segment_sum_rows<T, int64_t>(dest.data(), 1, Tn, R, O, D, src.data(), a.data(), V,
                                                       accumulate);
            kernels::cpu::segment_sum_rows_ref<T, int64_t>(dest.data(), 1, Tn, R, O, D, src.data(), b.data(), V,
                                                           accumulate);
            INFO("T=" << Tn << " R=" << R << " D=" << D << " V=" << V << " O=" << O << " acc=" << accumulate);
            REQUIRE(std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
          }
        }
      }
    }
  }
}

}  // namespace

// ---- the segmented canonical sum ---------------------------------------------------------------

TEST_CASE("segmented canonical sum equals the dense canonical reference bit for bit") {
  check_segment_rows_against_reference<float>(1);
  check_segment_rows_against_reference<double>(2);
  check_segment_rows_against_reference<bf16>(3);
  check_segment_rows_against_reference<f16>(4);
}

TEST_CASE("sparse_tree combines like the dense balanced tree") {
  // 16 leaves, a few present: the sparse tree must equal tree_combine with +0 elsewhere.
  std::mt19937_64 gen(7);
  for (int trial = 0; trial < 200; ++trial) {
    float dense[16] = {};
    float rows[16];
    int keys[16];
    float* ptrs[16];
    int m = 0;
    for (int k = 0; k < 16; ++k) {
      if (gen() % 3 == 0) {
        float v = float(int64_t(gen() % 2001) - 1000) * 1.37e-3f;
        dense[k] = 0.f + v;
        rows[m] = dense[k];
        keys[m] = k;
        ptrs[m] = &rows[m];
        ++m;
      }
    }
    if (m == 0) continue;
    float want = kernels::tree_combine(dense, 16, kernels::SumCombine<float>());
    float got = *kernels::cpu::sparse_tree(keys, ptrs, m, 16, 1);
    REQUIRE(std::memcmp(&want, &got, 4) == 0);
  }
}

TEST_CASE("embedding backward is the segmented canonical sum over the flattened ids") {
  numerics::ChunksGuard chunks(8);
  const int64_t V = 11, D = 5;
  Tensor ids = randint({6, 13}, 21, 0, V);  // 78 tokens, many duplicates
  Tensor w = uniform({V, D}, 22);
  w.requires_grad_(true);
  Tensor g = uniform({6, 13, D}, 23);
  embedding(w, ids).backward(g);
  auto idv = ids.to_vector<int64_t>();
  auto gv = g.to_vector<float>();
  auto dw = w.grad().to_vector<float>();
  for (int64_t r = 0; r < V; ++r)
    for (int64_t j = 0; j < D; ++j) {
      float ref = dense_segment_ref<float>(idv, r, 8, [&](int64_t t) { return gv[size_t(t * D + j)]; });
      REQUIRE(std::memcmp(&ref, &dw[size_t(r * D + j)], 4) == 0);
    }
}

TEST_CASE("scatter_add and gather backward follow the canonical order along dim") {
  numerics::ChunksGuard chunks(4);
  for (int dim : {0, 1}) {
    // index [37, 6] into x [5, 6] along 0, or [5, 37] into [5, 6] along 1.
    Dims xs = dim == 0 ? Dims{5, 6} : Dims{6, 5};
    Dims is = dim == 0 ? Dims{37, 6} : Dims{6, 37};
    Tensor x = uniform(xs, 31);
    Tensor idx = randint(is, 32, 0, 5);
    Tensor src = uniform(is, 33);
    Tensor out = scatter_add(x, dim, idx, src);
    auto xv = x.to_vector<float>(), sv = src.to_vector<float>(), ov = out.to_vector<float>();
    auto iv = idx.to_vector<int64_t>();
    for (int64_t col = 0; col < 6; ++col) {
      std::vector<int64_t> dest(37);
      for (int64_t t = 0; t < 37; ++t) dest[size_t(t)] = iv[size_t(dim == 0 ? t * 6 + col : col * 37 + t)];
      for (int64_t r = 0; r < 5; ++r) {
        size_t o = size_t(dim == 0 ? r * 6 + col : col * 5 + r);
        bool hit = std::find(dest.begin(), dest.end(), r) != dest.end();
        float s = dense_segment_ref<float>(dest, r, 4, [&](int64_t t) {
          return sv[size_t(dim == 0 ? t * 6 + col : col * 37 + t)];
        });
        float ref = hit ? xv[o] + s : xv[o];
        REQUIRE(std::memcmp(&ref, &ov[o], 4) == 0);
      }
    }
    // gather's backward is the same sum into zeros.
    Tensor xg = x.detach();
    xg.requires_grad_(true);
    gather(xg, dim, idx).backward(src);
    Tensor expect = scatter_add(zeros(xs), dim, idx, src);
    CHECK(bitwise_equal(xg.grad(), expect));
  }
}

TEST_CASE("index_add sums duplicates in the canonical order; index_select backward too") {
  numerics::ChunksGuard chunks(16);
  Tensor x = uniform({4, 7, 3}, 41);
  Tensor idx = randint({50}, 42, 0, 7);
  Tensor src = uniform({4, 50, 3}, 43);
  Tensor out = index_add(x, 1, idx, src);
  auto xv = x.to_vector<float>(), sv = src.to_vector<float>(), ov = out.to_vector<float>();
  auto dest = idx.to_vector<int64_t>();
  for (int64_t o = 0; o < 4; ++o)
    for (int64_t r = 0; r < 7; ++r)
      for (int64_t i = 0; i < 3; ++i) {
        size_t at = size_t((o * 7 + r) * 3 + i);
        bool hit = std::find(dest.begin(), dest.end(), r) != dest.end();
        float s = dense_segment_ref<float>(dest, r, 16, [&](int64_t t) { return sv[size_t((o * 50 + t) * 3 + i)]; });
        float ref = hit ? xv[at] + s : xv[at];
        REQUIRE(std::memcmp(&ref, &ov[at], 4) == 0);
      }
  Tensor xg = x.detach();
  xg.requires_grad_(true);
  index_select(xg, 1, idx).backward(src);
  CHECK(bitwise_equal(xg.grad(), index_add(zeros({4, 7, 3}), 1, idx, src)));
}

TEST_CASE("indexing results do not depend on the thread count") {
  Tensor w = uniform({300, 64}, 51);
  Tensor ids = randint({8, 512}, 52, 0, 300);
  Tensor g = uniform({8, 512, 64}, 53);
  Tensor idx2 = randint({2000, 64}, 54, 0, 300);
  Tensor src2 = uniform({2000, 64}, 55);
  auto run = [&] {
    Tensor wl = w.detach();
    wl.requires_grad_(true);
    embedding(wl, ids).backward(g);
    return std::vector<Tensor>{wl.grad(), scatter_add(w, 0, idx2, src2), index_add(w, 0, ids.flatten(), g.reshape({-1, 64})),
                               gather(w, 0, idx2)};
  };
  set_num_threads(1);
  auto a = run();
  set_num_threads(3);
  auto b = run();
  set_num_threads(2);
  auto c = run();
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(bitwise_equal(a[i], b[i]));
    CHECK(bitwise_equal(a[i], c[i]));
  }
}

// ---- values ------------------------------------------------------------------------------------

TEST_CASE("embedding values, int32 and int64 ids, strided weight and ids") {
  Tensor w = arange(12).to(DType::Float32).reshape({4, 3});  // row v = [3v, 3v+1, 3v+2]
  for (DType dt : {DType::Int32, DType::Int64}) {
    Tensor ids = ids64({3, 0, 3, 1}, {2, 2}).to(dt);
    Tensor e = embedding(w, ids);
    CHECK(e.shape() == Dims{2, 2, 3});
    CHECK(e.to_vector<float>() == std::vector<float>{9, 10, 11, 0, 1, 2, 9, 10, 11, 3, 4, 5});
  }
  // Weight stored transposed; ids a strided view.
  Tensor wt = w.t().contiguous().t();
  Tensor ids = ids64({2, 9, 1, 9, 0, 9}).slice(0, 0, 6, 2);  // [2, 1, 0]
  CHECK(embedding(wt, ids).to_vector<float>() == std::vector<float>{6, 7, 8, 3, 4, 5, 0, 1, 2});
  // 0-dim ids give one row; bf16 weights keep their bits.
  CHECK(embedding(w, scalar_tensor(2, DType::Int64)).to_vector<float>() == std::vector<float>{6, 7, 8});
  Tensor wb = uniform({5, 4}, 3, -1, 1, DType::BFloat16);
  CHECK(bitwise_equal(embedding(wb, ids64({4})), wb.narrow(0, 4, 1)));
}

TEST_CASE("gather and scatter_add values") {
  Tensor x = tensor({1.f, 2.f, 3.f, 4.f}, {2, 2});
  Tensor idx = ids64({0, 0, 1, 0}, {2, 2});
  CHECK(gather(x, 1, idx).to_vector<float>() == std::vector<float>{1, 1, 4, 3});
  CHECK(gather(x, -2, idx).to_vector<float>() == std::vector<float>{1, 2, 3, 2});
  // Index smaller than the input in the other dimension.
  Tensor x3 = arange(12).to(DType::Float32).reshape({3, 4});
  CHECK(gather(x3, 0, ids64({2, 0}, {1, 2})).to_vector<float>() == std::vector<float>{8, 1});
  // Strided input and int32 index.
  CHECK(gather(x3.t(), 1, ids64({2, 1, 0, 0}, {2, 2}).to(DType::Int32)).to_vector<float>() ==
        std::vector<float>{8, 4, 1, 1});

  // Two rows of ones scattered into three rows.
  Tensor src = ones({2, 5});
  Tensor index = ids64({0, 1, 2, 0, 0, 2, 0, 0, 1, 2}, {2, 5});
  Tensor s = scatter_add(zeros({3, 5}), 0, index, src);
  CHECK(s.to_vector<float>() == std::vector<float>{1, 1, 1, 1, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1});
  // Along dim 1 with duplicates, onto a non-zero input; src bigger than index.
  Tensor base = full({2, 3}, 10.0);
  Tensor src2 = arange(8).to(DType::Float32).reshape({2, 4});
  Tensor s2 = scatter_add(base, 1, ids64({2, 2, 0, 1, 1, 1}, {2, 3}), src2);
  CHECK(s2.to_vector<float>() == std::vector<float>{12, 10, 11, 10, 25, 10});
  // Untouched elements keep their bits (-0 stays -0).
  Tensor negz = full({3}, -0.0);
  Tensor s3 = scatter_add(negz, 0, ids64({1}), tensor({2.f}));
  CHECK(std::signbit(s3.to_vector<float>()[0]));
  CHECK(s3.to_vector<float>()[1] == 2.f);
  // Integer dtypes sum exactly.
  Tensor si = scatter_add(zeros({2}, DType::Int32), 0, ids64({1, 1, 0}), tensor(std::vector<int32_t>{5, 6, 7}));
  CHECK(si.to_vector<int32_t>() == std::vector<int32_t>{7, 11});
}

TEST_CASE("index_select and index_add values") {
  Tensor x = arange(12).to(DType::Float32).reshape({3, 4});
  CHECK(index_select(x, 0, ids64({2, 0, 2})).to_vector<float>() ==
        std::vector<float>{8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11});
  CHECK(index_select(x, 1, ids64({3, 1}).to(DType::Int32)).to_vector<float>() ==
        std::vector<float>{3, 1, 7, 5, 11, 9});
  CHECK(index_select(x.t(), 0, ids64({1})).to_vector<float>() == std::vector<float>{1, 5, 9});
  CHECK(index_select(x, 0, scalar_tensor(1, DType::Int64)).shape() == Dims{1, 4});
  CHECK(index_select(x, 0, ids64({})).shape() == Dims{0, 4});

  Tensor src = ones({3, 2});
  Tensor a = index_add(zeros({3, 2}), 0, ids64({0, 2, 0}), src, 2);
  CHECK(a.to_vector<float>() == std::vector<float>{4, 4, 0, 0, 2, 2});
  Tensor b = index_add(x, 1, ids64({3, 3}), tensor({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {3, 2}));
  CHECK(b.to_vector<float>() == std::vector<float>{0, 1, 2, 6, 4, 5, 6, 14, 8, 9, 10, 22});
  CHECK(x.to_vector<float>()[3] == 3.f);  // out of place
  Tensor c = index_add(zeros({2}, DType::Int64), 0, ids64({1, 1}), ids64({3, 4}), 3);
  CHECK(c.to_vector<int64_t>() == std::vector<int64_t>{0, 21});
}

TEST_CASE("tril and triu values") {
  Tensor x = arange(1, 13, 1, TensorOptions(DType::Float32)).reshape({3, 4});
  CHECK(tril(x).to_vector<float>() == std::vector<float>{1, 0, 0, 0, 5, 6, 0, 0, 9, 10, 11, 0});
  CHECK(triu(x).to_vector<float>() == std::vector<float>{1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12});
  CHECK(tril(x, 1).to_vector<float>() == std::vector<float>{1, 2, 0, 0, 5, 6, 7, 0, 9, 10, 11, 12});
  CHECK(triu(x, -1).to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 0, 10, 11, 12});
  CHECK(triu(x, 5).to_vector<float>() == std::vector<float>(12, 0.f));
  CHECK(tril(x, -3).to_vector<float>() == std::vector<float>(12, 0.f));
  // Batched, strided, bool (a causal mask).
  Tensor b = stack({x, x * 2}).transpose(1, 2);  // [2, 4, 3]
  Tensor tb = tril(b);
  CHECK(bitwise_equal(tb.select(0, 1), tril(x.t() * 2)));
  Tensor mask = tril(ones({3, 3}, DType::Bool));
  CHECK(mask.to_vector<bool>() == std::vector<bool>{true, false, false, true, true, false, true, true, true});
  CHECK(triu(ones({2, 2}, DType::Int32), 1).to_vector<int32_t>() == std::vector<int32_t>{0, 1, 0, 0});
}

TEST_CASE("one_hot values") {
  Tensor ids = ids64({0, 2, 1, 2}, {2, 2});
  Tensor h = one_hot(ids, 4);
  CHECK(h.dtype() == DType::Int64);
  CHECK(h.shape() == Dims{2, 2, 4});
  CHECK(h.to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 1, 0});
  CHECK(one_hot(ids.to(DType::Int32)).shape() == Dims{2, 2, 3});  // inferred: max + 1
  CHECK(one_hot(ids64({}), 3).shape() == Dims{0, 3});
}

// ---- gradients ---------------------------------------------------------------------------------

TEST_CASE("gradients of embedding, gather and scatter_add with duplicate indices") {
  Tensor ids = ids64({1, 3, 1, 0, 3, 3}, {2, 3});
  CHECK_GRADCHECK([&](const std::vector<Tensor>& v) { return embedding(v[0], ids); },
                  {grad_input_noncontig({4, 5}, 1)});
  CHECK_GRADCHECK([&](const std::vector<Tensor>& v) { return embedding(v[0], ids.t()); },
                  {grad_input({4, 3}, 2)});

  Tensor gi = randint({4, 3, 5}, 3, 0, 3);  // gather along 1 of [4, 3, 6]: dups everywhere
  CHECK_GRADCHECK([&](const std::vector<Tensor>& v) { return gather(v[0], 2, gi); },
                  {grad_input_noncontig({4, 3, 6}, 4)});
  Tensor gi0 = randint({7, 2}, 5, 0, 3);
  CHECK_GRADCHECK([&](const std::vector<Tensor>& v) { return gather(v[0], 0, gi0); },
                  {grad_input_noncontig({3, 4}, 6)});

  Tensor si = randint({6, 3}, 7, 0, 4);  // into [4, 5] along 0; src [7, 3] bigger than index
  CHECK_GRADCHECK([&](const std::vector<Tensor>& v) { return scatter_add(v[0], 0, si, v[1]); },
                  {grad_input_noncontig({4, 5}, 8), grad_input_noncontig({7, 3}, 9)});
  CHECK_GRADCHECK([&](const std::vector<Tensor>& v) { return scatter_add(v[0], 1, si.t(), v[1]); },
                  {grad_input({3, 5}, 10), grad_input({3, 6}, 11)});
}

TEST_CASE("gradients of index_select, index_add and tril/triu") {
  Tensor idx = ids64({2, 0, 2, 2, 1});
  CHECK_GRADCHECK([&](const std::vector<Tensor>& v) { return index_select(v[0], 1, idx); },
                  {grad_input_noncontig({4, 3, 2}, 1)});
  CHECK_GRADCHECK([&](const std::vector<Tensor>& v) { return index_select(v[0], 0, idx.to(DType::Int32)); },
                  {grad_input_noncontig({3, 5}, 2)});
  CHECK_GRADCHECK([&](const std::vector<Tensor>& v) { return index_add(v[0], 0, idx, v[1], 0.5); },
                  {grad_input_noncontig({3, 4}, 3), grad_input_noncontig({5, 4}, 4)});
  CHECK_GRADCHECK([&](const std::vector<Tensor>& v) { return index_add(v[0], 1, idx, v[1]); },
                  {grad_input({2, 3}, 5), grad_input_noncontig({2, 5}, 6)});
  for (int64_t k : {-1, 0, 2}) {
    CHECK_GRADCHECK([k](const std::vector<Tensor>& v) { return tril(v[0], k); }, {grad_input_noncontig({2, 4, 3}, 7)});
    CHECK_GRADCHECK([k](const std::vector<Tensor>& v) { return triu(v[0], k); }, {grad_input_noncontig({4, 3}, 8)});
  }
}

// ---- errors ------------------------------------------------------------------------------------

TEST_CASE("embedding errors name the op, the offending id, its position and the range") {
  Tensor w = zeros({10, 4});
  CHECK_THROWS_WITH(embedding(w, ids64({1, 2, 10, 3}, {2, 2})),
                    Catch::Contains("embedding") && Catch::Contains("10") && Catch::Contains("[1, 0]") &&
                        Catch::Contains("[0, 10)"));
  CHECK_THROWS_WITH(embedding(w, ids64({1, -1}).to(DType::Int32)),
                    Catch::Contains("embedding") && Catch::Contains("-1") && Catch::Contains("negative") &&
                        Catch::Contains("wrap-around") && Catch::Contains("[1]"));
  CHECK_THROWS_WITH(embedding(w, tensor({1.f})), Catch::Contains("embedding") && Catch::Contains("int32 or int64") &&
                                                     Catch::Contains("float32"));
  CHECK_THROWS_WITH(embedding(zeros({10}), ids64({1})),
                    Catch::Contains("embedding") && Catch::Contains("2-D") && Catch::Contains("[10]"));
  CHECK_THROWS_WITH(embedding(empty({10, 4}, TensorOptions(kMeta)), ids64({1})),
                    Catch::Contains("embedding") && Catch::Contains("different devices"));
}

TEST_CASE("gather and scatter_add errors") {
  Tensor x = zeros({3, 4});
  CHECK_THROWS_WITH(gather(x, 1, ids64({0, 4}, {1, 2})), Catch::Contains("gather") && Catch::Contains("index 4") &&
                                                             Catch::Contains("[0, 1]") && Catch::Contains("[0, 4)"));
  CHECK_THROWS_WITH(gather(x, 0, ids64({-2}, {1, 1})),
                    Catch::Contains("gather") && Catch::Contains("-2") && Catch::Contains("negative"));
  CHECK_THROWS_WITH(gather(x, 0, ids64({0, 0})), Catch::Contains("gather") && Catch::Contains("rank"));
  CHECK_THROWS_WITH(gather(x, 0, ids64({0, 0, 0, 0, 0}, {1, 5})),
                    Catch::Contains("gather") && Catch::Contains("[1, 5]") && Catch::Contains("dimension 1"));
  CHECK_THROWS_WITH(gather(x, 2, ids64({0}, {1, 1})), Catch::Contains("gather") && Catch::Contains("dimension 2"));
  CHECK_THROWS_WITH(gather(x, 0, tensor({0.f}, {1, 1})), Catch::Contains("gather") && Catch::Contains("int64"));

  Tensor src = ones({3, 4});
  CHECK_THROWS_WITH(scatter_add(x, 0, ids64({3}, {1, 1}), src),
                    Catch::Contains("scatter_add") && Catch::Contains("index 3") && Catch::Contains("[0, 3)"));
  CHECK_THROWS_WITH(scatter_add(x, 1, ids64({0, -1}, {1, 2}), src),
                    Catch::Contains("scatter_add") && Catch::Contains("negative"));
  CHECK_THROWS_WITH(scatter_add(x, 0, ids64({0}, {1, 1}), ones({3, 4}, DType::Float64)),
                    Catch::Contains("scatter_add") && Catch::Contains("float64") && Catch::Contains("float32"));
  CHECK_THROWS_WITH(scatter_add(x, 0, ids64({0, 0, 0, 0, 0}, {1, 5}), ones({3, 5})),
                    Catch::Contains("scatter_add") && Catch::Contains("[1, 5]"));
  CHECK_THROWS_WITH(scatter_add(x, 0, ids64({0, 0}, {2, 1}), ones({1, 4})),
                    Catch::Contains("scatter_add") && Catch::Contains("source"));
  CHECK_THROWS_WITH(scatter_add(zeros({2}, DType::Bool), 0, ids64({0}), ones({1}, DType::Bool)),
                    Catch::Contains("scatter_add") && Catch::Contains("bool"));
}

TEST_CASE("index_select, index_add, tril/triu and one_hot errors") {
  Tensor x = zeros({3, 4});
  CHECK_THROWS_WITH(index_select(x, 1, ids64({0, 7})), Catch::Contains("index_select") && Catch::Contains("7") &&
                                                           Catch::Contains("[1]") && Catch::Contains("[0, 4)"));
  CHECK_THROWS_WITH(index_select(x, 0, ids64({-1})),
                    Catch::Contains("index_select") && Catch::Contains("negative"));
  CHECK_THROWS_WITH(index_select(x, 0, ids64({0, 1}, {1, 2})),
                    Catch::Contains("index_select") && Catch::Contains("1-D"));
  CHECK_THROWS_WITH(index_select(x, 0, tensor({0.f})), Catch::Contains("index_select") && Catch::Contains("float32"));

  CHECK_THROWS_WITH(index_add(x, 0, ids64({3}), ones({1, 4})),
                    Catch::Contains("index_add") && Catch::Contains("3") && Catch::Contains("[0, 3)"));
  CHECK_THROWS_WITH(index_add(x, 0, ids64({-3}), ones({1, 4})),
                    Catch::Contains("index_add") && Catch::Contains("negative"));
  CHECK_THROWS_WITH(index_add(x, 0, ids64({0, 1}), ones({1, 4})),
                    Catch::Contains("index_add") && Catch::Contains("[1, 4]") && Catch::Contains("[2, 4]"));
  CHECK_THROWS_WITH(index_add(x, 0, ids64({0}), ones({1, 4}, DType::Float16)),
                    Catch::Contains("index_add") && Catch::Contains("float16"));
  CHECK_THROWS_WITH(index_add(zeros({2}, DType::Int64), 0, ids64({0}), ids64({1}), 0.5),
                    Catch::Contains("index_add") && Catch::Contains("alpha"));

  CHECK_THROWS_WITH(tril(zeros({3})), Catch::Contains("tril") && Catch::Contains("2 dimensions"));
  CHECK_THROWS_WITH(triu(zeros({3})), Catch::Contains("triu") && Catch::Contains("[3]"));

  CHECK_THROWS_WITH(one_hot(ids64({0, 5}), 3),
                    Catch::Contains("one_hot") && Catch::Contains("5") && Catch::Contains("num_classes = 3"));
  CHECK_THROWS_WITH(one_hot(ids64({-1}), 3), Catch::Contains("one_hot") && Catch::Contains("negative"));
  CHECK_THROWS_WITH(one_hot(ids64({-1})), Catch::Contains("one_hot") && Catch::Contains("negative"));
  CHECK_THROWS_WITH(one_hot(ids64({})), Catch::Contains("one_hot") && Catch::Contains("empty"));
  CHECK_THROWS_WITH(one_hot(tensor({1.f}), 3), Catch::Contains("one_hot") && Catch::Contains("float32"));
  CHECK_THROWS_WITH(one_hot(ids64({1}), -2), Catch::Contains("one_hot") && Catch::Contains("-2"));
}

// The op checks its inputs once and the kernels do not re-check them: every
// error here comes from the op, so it comes on Meta tensors too (no kernel
// runs there), as in a Meta model or before a distributed op.
TEST_CASE("indexing errors come from the op, on Meta tensors too") {
  const Tensor x = meta({3, 4});
  const Tensor i1 = meta({1, 1}, DType::Int64);
  CHECK_THROWS_WITH(gather(x, 0, meta({2}, DType::Int64)), Catch::Contains("gather") && Catch::Contains("rank"));
  CHECK_THROWS_WITH(gather(x, 0, meta({1, 5}, DType::Int64)), Catch::Contains("gather") && Catch::Contains("larger"));
  CHECK_THROWS_WITH(gather(x, 0, meta({1, 1})), Catch::Contains("gather") && Catch::Contains("float32"));
  CHECK_THROWS_WITH(scatter_add(x, 0, i1, meta({3, 4}, DType::Float64)),
                    Catch::Contains("scatter_add") && Catch::Contains("float64"));
  CHECK_THROWS_WITH(scatter_add(x, 0, meta({2, 1}, DType::Int64), meta({1, 4})),
                    Catch::Contains("scatter_add") && Catch::Contains("larger than source"));
  CHECK_THROWS_WITH(index_select(x, 0, meta({1, 2}, DType::Int64)),
                    Catch::Contains("index_select") && Catch::Contains("0-D or 1-D"));
  CHECK_THROWS_WITH(index_add(x, 0, meta({2}, DType::Int64), meta({1, 4})),
                    Catch::Contains("index_add") && Catch::Contains("[2, 4]"));
  CHECK_THROWS_WITH(index_add(x, 0, meta({1}, DType::Int64), meta({1, 4}, DType::Float16)),
                    Catch::Contains("index_add") && Catch::Contains("float16"));
  CHECK_THROWS_WITH(embedding(x, meta({2}, DType::Float32)),
                    Catch::Contains("embedding") && Catch::Contains("int32 or int64"));
  CHECK_THROWS_WITH(tril(meta({3})), Catch::Contains("tril") && Catch::Contains("2 dimensions"));
  CHECK(gather(x, 1, meta({3, 2}, DType::Int64)).shape() == Dims{3, 2});
}
