// The host-side logic of the CUDA backend, tested on the CPU (no GPU
// needed): kernel geometries, launch choices, element conversions, the
// streaming chunk tree, the canonical-reduction thread mapping, the bitwise
// GEMM's tiling schedule, the segmented sums the scatter-adds run, and the
// cuBLASLt descriptor choices.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "autograd/api.h"
#include "kernels/canonical.h"
#include "kernels/cpu/segment_sum.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/gemm_plan.h"
#include "kernels/cuda/geometry_build.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/lt_plan.h"
#include "kernels/cuda/segment.h"
#include "kernels/cuda/tree_fold.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::kernels::cuda;

namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Offsets of every element of a strided layout, row-major (the reference).
std::vector<int64_t> naive_offsets(const Dims& shape, const Dims& strides) {
  std::vector<int64_t> out;
  for_each_element(shape, strides, 0, [&](int64_t, int64_t off) { out.push_back(off); });
  return out;
}

std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

}  // namespace

TEST_CASE("elementwise geometry: dims merged, offsets equal the naive walk") {
  struct Case {
    Dims shape, s0, s1;
  };
  const std::vector<Case> cases = {
      {{2, 3, 4}, {12, 4, 1}, {12, 4, 1}},  // contiguous: one dim
      {{2, 3, 4}, {12, 4, 1}, {1, 2, 6}},   // transposed operand
      {{5, 1, 7}, {7, 7, 1}, {0, 0, 1}},    // broadcast
      {{4, 6}, {1, 4}, {6, 1}},
      {{3, 2, 5, 2}, {20, 10, 2, 1}, {0, 5, 1, 0}},
      {{}, {}, {}},
      {{0, 3}, {3, 1}, {3, 1}},
  };
  for (const Case& c : cases) {
    INFO(c.shape.str() << " " << c.s0.str() << " " << c.s1.str());
    const ElemGeometry<2> g = make_elem_geometry<2>(c.shape, {&c.s0, &c.s1});
    CHECK(g.numel == numel_of(c.shape));
    const auto o0 = naive_offsets(c.shape, c.s0), o1 = naive_offsets(c.shape, c.s1);
    for (int64_t i = 0; i < g.numel; ++i) {
      int64_t off[2];
      elem_offsets(g, i, off);
      REQUIRE(off[0] == o0[size_t(i)]);
      REQUIRE(off[1] == o1[size_t(i)]);
    }
  }
  const Dims s{2, 3, 4}, st{12, 4, 1};
  const ElemGeometry<2> g = make_elem_geometry<2>(s, {&st, &st});
  CHECK(g.contiguous);
  CHECK(g.ndim == 1);
  const Dims tt{1, 2, 6};
  CHECK(!make_elem_geometry<2>(s, {&st, &tt}).contiguous);
}

TEST_CASE("row geometry: row offsets and inner strides equal the naive walk") {
  const Dims shape{3, 4, 5}, a{20, 5, 1}, b{1, 3, 12};
  for (int dim = 0; dim < 3; ++dim) {
    const RowGeometry<2> g = make_row_geometry<2>(shape, dim, {&a, &b});
    CHECK(g.n == shape[dim]);
    CHECK(g.rows == 60 / shape[dim]);
    // Rows are the other dims in row-major order.
    Dims other, oa, ob;
    for (int d = 0; d < 3; ++d)
      if (d != dim) {
        other.push_back(shape[d]);
        oa.push_back(a[d]);
        ob.push_back(b[d]);
      }
    const auto ra = naive_offsets(other, oa), rb = naive_offsets(other, ob);
    for (int64_t r = 0; r < g.rows; ++r) {
      CHECK(row_offset(g, r, 0) == ra[size_t(r)]);
      CHECK(row_offset(g, r, 1) == rb[size_t(r)]);
    }
    CHECK(g.inner_stride[0] == a[dim]);
    CHECK(g.inner_stride[1] == b[dim]);
  }
}

TEST_CASE("reduce geometry: outputs and reduced elements in logical row-major order") {
  struct Case {
    Dims xs, xst, os;
  };
  const std::vector<Case> cases = {
      {{4, 5, 6}, {30, 6, 1}, {4, 1, 6}},
      {{4, 5, 6}, {30, 6, 1}, {1, 5, 1}},
      {{4, 5, 6}, {1, 4, 20}, {4, 1, 1}},   // transposed input
      {{2, 3, 4, 5}, {60, 20, 5, 1}, {1, 1, 4, 5}},  // leading dims merge
      {{7}, {1}, {1}},
      {{3, 1, 2}, {2, 2, 1}, {1, 1, 2}},
  };
  for (const Case& c : cases) {
    INFO(c.xs.str() << " -> " << c.os.str());
    const Dims ost = contiguous_strides(c.os);
    const ReduceGeometry g = make_reduce_geometry(c.xs, c.xst, c.os, ost);
    Dims kept, kx, ko, red, rx;
    for (int d = 0; d < c.xs.size(); ++d) {
      if (c.os[d] == 1 && c.xs[d] != 1) {
        red.push_back(c.xs[d]);
        rx.push_back(c.xst[d]);
      } else {
        kept.push_back(c.xs[d]);
        kx.push_back(c.xst[d]);
        ko.push_back(ost[d]);
      }
    }
    const auto kxo = naive_offsets(kept, kx), koo = naive_offsets(kept, ko), rxo = naive_offsets(red, rx);
    REQUIRE(g.outputs == int64_t(kxo.size()));
    REQUIRE(g.n == int64_t(rxo.size()));
    for (int64_t o = 0; o < g.outputs; ++o) {
      int64_t xo, oo;
      reduce_output_offsets(g, o, &xo, &oo);
      CHECK(xo == kxo[size_t(o)]);
      CHECK(oo == koo[size_t(o)]);
    }
    for (int64_t t = 0; t < g.n; ++t) CHECK(reduce_element_offset(g, t) == rxo[size_t(t)]);
  }
}

TEST_CASE("reduce path choice: rows for contiguous or few reductions, columns for adjacent outputs") {
  const Dims os1{4, 1}, os2{1, 6}, os3{1, 1};
  CHECK(choose_reduce_path(make_reduce_geometry({4, 6}, {6, 1}, os1, contiguous_strides(os1))) == ReducePath::Row);
  CHECK(choose_reduce_path(make_reduce_geometry({4, 6}, {6, 1}, os2, contiguous_strides(os2))) == ReducePath::Row);
  const Dims wide{1, 64};
  CHECK(choose_reduce_path(make_reduce_geometry({100, 64}, {64, 1}, wide, contiguous_strides(wide))) ==
        ReducePath::Column);
  CHECK(choose_reduce_path(make_reduce_geometry({4, 6}, {6, 1}, os3, contiguous_strides(os3))) == ReducePath::Row);
  CHECK(row_block_threads(1) == 32);
  CHECK(row_block_threads(16) == 128);
  CHECK(row_block_threads(1024) == 256);
  CHECK(grid_blocks(0) == 1);
  CHECK(grid_blocks(257) == 2);
  CHECK(grid_blocks(int64_t(1) << 40) == unsigned(kMaxBlocks));
}

TEST_CASE("element conversions equal the CPU copy kernel for every dtype pair") {
  const std::vector<double> values = {0.0, -0.0, 1.0, -1.5, 2.5, 3.7, -7.25, 65504.0, 1e-3, 123456.789, 1e30, -3e-6};
  const std::vector<DType> all = {DType::Bool, DType::Int32, DType::Int64, DType::Float16,
                                  DType::BFloat16, DType::Float32, DType::Float64};
  Tensor src64 = tensor(values, Dims{int64_t(values.size())}, TensorOptions(DType::Float64));
  for (DType sd : all) {
    Tensor src = raw::empty(src64.shape(), sd);
    kernels::copy(kCPU, src64, src);
    for (DType dd : all) {
      INFO(dtype_name(sd) << " -> " << dtype_name(dd));
      Tensor cpu = raw::empty(src.shape(), dd);
      kernels::copy(kCPU, src, cpu);
      Tensor ours = raw::empty(src.shape(), dd);
      dispatch_all(dd, "test", [&](auto dtag) {
        using D = typename decltype(dtag)::type;
        dispatch_all(sd, "test", [&](auto stag) {
          using S = typename decltype(stag)::type;
          const S* s = src.data<S>();
          D* d = ours.data<D>();
          for (int64_t i = 0; i < src.numel(); ++i) {
            // float -> integer is undefined outside the integer's range: skip those.
            if constexpr (std::is_integral_v<D> && !std::is_same_v<D, bool> &&
                          (std::is_floating_point_v<S> || is_half_v<S>)) {
              const double v = double(float(widen(s[i])));
              if (std::fabs(v) >= 2147483647.0) {
                d[i] = cpu.data<D>()[i];
                continue;
              }
            }
            d[i] = convert<D, S>(s[i]);
          }
        });
      });
      CHECK(testing::bitwise_equal(cpu, ours));
    }
  }
}

TEST_CASE("TreeFold equals tree_combine over the dense leaves, with skipped leaves as +0") {
  std::mt19937_64 gen(7);
  for (int V : {1, 2, 4, 8, 16, 64, 1024}) {
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> dense(size_t(V), 0.0f);
      std::uniform_real_distribution<float> val(-1000.f, 1000.f);
      std::bernoulli_distribution present(trial % 4 == 0 ? 1.0 : 0.3);
      TreeFold<float> fold(log2_exact(V));
      for (int c = 0; c < V; ++c) {
        if (!present(gen)) continue;
        dense[size_t(c)] = val(gen) * std::pow(10.f, float(int(gen() % 7)) - 3);
        fold.feed(c, dense[size_t(c)]);
      }
      const float root = fold.finish();
      const float ref = kernels::tree_combine(dense.data(), V, kernels::SumCombine<float>());
      INFO("V " << V << " trial " << trial);
      REQUIRE(bits(root) == bits(ref));
    }
  }
  TreeFold<float> none(4);
  CHECK(bits(none.finish()) == bits(0.0f));
}

TEST_CASE("block canonical reduce mapping (lanes on threads, butterfly, chunk tree) equals the reference") {
  // Host replay of canonical.cuh's block_canonical_reduce: thread 8s + l is
  // lane l of chunk slot s; the butterfly always keeps the lower index left.
  auto replay = [](const std::vector<float>& x, int V, int threads) {
    const int64_t n = int64_t(x.size());
    const int slots = threads / 8;
    std::vector<float> chunk(static_cast<size_t>(V));
    for (int c0 = 0; c0 < V; c0 += slots) {
      std::vector<float> vals(size_t(threads), 0.0f);
      for (int tid = 0; tid < threads; ++tid) {
        const int lane = tid & 7, c = c0 + (tid >> 3);
        float acc = 0.0f;
        if (c < V)
          for (int64_t t = numerics::chunk_begin(n, V, c) + lane; t < numerics::chunk_end(n, V, c); t += 8)
            acc = acc + x[size_t(t)];
        vals[size_t(tid)] = acc;
      }
      for (int w = 1; w < 8; w *= 2) {
        std::vector<float> next(vals.size());
        for (int tid = 0; tid < threads; ++tid) {
          const float o = vals[size_t(tid ^ w)], v = vals[size_t(tid)];
          next[size_t(tid)] = (tid & w) ? o + v : v + o;
        }
        vals = next;
      }
      for (int tid = 0; tid < threads; tid += 8)
        if (c0 + tid / 8 < V) chunk[size_t(c0 + tid / 8)] = vals[size_t(tid)];
    }
    for (int w = 1; w < V; w *= 2)
      for (int a = 0; a + w < V; a += 2 * w) chunk[size_t(a)] = chunk[size_t(a)] + chunk[size_t(a + w)];
    return chunk[0];
  };
  for (int V : {1, 2, 8, 16, 64, 256}) {
    for (int64_t n : {0, 1, 7, 8, 9, 100, 1000, 4097}) {
      const auto x = random_floats(size_t(n), uint64_t(n * 31 + V), -100.f, 100.f);
      const float ref = kernels::canonical_sum_ref<float>(x.data(), n, 1, V);
      INFO("V " << V << " n " << n);
      CHECK(bits(replay(x, V, row_block_threads(V))) == bits(ref));
    }
  }
}

TEST_CASE("segmented sums (the scatter-add kernels' code) equal the dense reference") {
  std::mt19937_64 gen(11);
  for (int V : {1, 4, 16, 128}) {
    for (int64_t T : {1, 5, 37, 300}) {
      const int64_t R = 7, D = 3;
      std::vector<int64_t> dest(static_cast<size_t>(T));
      for (auto& d : dest) d = int64_t(gen() % uint64_t(R));
      const auto src = random_floats(size_t(T * D), uint64_t(T + V), -10.f, 10.f);
      std::vector<float> ref(size_t(R * D), 0.0f);
      kernels::cpu::segment_sum_rows_ref<float, int64_t>(dest.data(), 1, T, R, 1, D, src.data(), ref.data(), V, false);
      for (int64_t r = 0; r < R; ++r) {
        std::vector<int64_t> pos;
        for (int64_t t = 0; t < T; ++t)
          if (dest[size_t(t)] == r) pos.push_back(t);
        for (int64_t j = 0; j < D; ++j) {
          const float s = pos.empty() ? 0.0f
                                      : segment_sum<float>(pos.data(), int64_t(pos.size()), T, V,
                                                           [&](int64_t t) { return src[size_t(t * D + j)]; });
          INFO("V " << V << " T " << T << " r " << r);
          CHECK(bits(s) == bits(ref[size_t(r * D + j)]));
        }
      }
    }
  }
}

TEST_CASE("bitwise GEMM plan: tiles, groups, workspace") {
  const int sm = 132;
  BitwiseGemmPlan p = plan_bitwise_gemm(4096, 4096, 4096, 1, 16, sm, int64_t(32) << 20);
  CHECK(p.tiles_m == 64);
  CHECK(p.tiles_n == 64);
  CHECK(p.groups == 1);
  CHECK(p.group_levels == 4);
  CHECK(p.max_levels == GemmTiling::kRegLevels);
  CHECK(p.workspace_elems == 0);
  // A weight gradient: few tiles, long K -> the K range is split into groups.
  p = plan_bitwise_gemm(768, 768, 65536, 1, 16, sm, int64_t(32) << 20);
  CHECK(p.groups > 1);
  CHECK((1 << p.group_levels) * p.groups == 16);
  CHECK(p.workspace_elems == int64_t(p.groups) * 768 * 768);
  // A deep tree splits into register-sized groups when the workspace allows...
  p = plan_bitwise_gemm(64, 64, 1 << 20, 1, 1024, sm, int64_t(32) << 20);
  CHECK(p.group_levels <= GemmTiling::kRegLevels);
  CHECK(p.max_levels == GemmTiling::kRegLevels);
  // ... and keeps the deep kernel when it does not.
  p = plan_bitwise_gemm(8192, 8192, 64, 1, 1024, sm, int64_t(32) << 20);
  CHECK(p.groups == 1);
  CHECK(p.max_levels == GemmTiling::kMaxLevels);
  p = plan_bitwise_gemm(10, 10, 0, 3, 16, sm, 1000);
  CHECK((1 << p.group_levels) * p.groups == 16);
}

TEST_CASE("bitwise GEMM schedule replayed on the host equals gemm_reference_f32") {
  // matmul.cu's per-element schedule: groups of 2^group_levels chunks, K steps
  // of kBK from each chunk's start with zero padding past its end, chunk
  // values folded by the binary counter, group roots by the tree, then C.
  auto replay = [](const kernels::cpu::GemmArgs& g, const BitwiseGemmPlan& plan) {
    const int V = g.chunks, G = 1 << plan.group_levels;
    for (int64_t i = 0; i < g.M; ++i)
      for (int64_t j = 0; j < g.N; ++j) {
        std::vector<float> roots(static_cast<size_t>(plan.groups));
        for (int grp = 0; grp < plan.groups; ++grp) {
          TreeFold<float> fold(plan.group_levels);
          for (int q = 0; q < G; ++q) {
            const int c = grp * G + q;
            const int64_t cb = numerics::chunk_begin(g.K, V, c), ce = numerics::chunk_end(g.K, V, c);
            float acc = 0.0f;
            for (int64_t k0 = cb; k0 < ce; k0 += GemmTiling::kBK)
              for (int kk = 0; kk < GemmTiling::kBK; ++kk) {
                const int64_t k = k0 + kk;
                const float a = k < ce ? g.A[i * g.a_row_stride + k * g.a_col_stride] : 0.0f;
                const float b = k < ce ? g.B[k * g.b_row_stride + j * g.b_col_stride] : 0.0f;
                acc = std::fma(a, b, acc);
              }
            fold.feed(q, acc);
          }
          roots[size_t(grp)] = fold.finish();
        }
        const float root = kernels::tree_combine(roots.data(), plan.groups, kernels::SumCombine<float>());
        float& c = g.C[i * g.c_row_stride + j];
        c = g.accumulate ? c + root : root;
      }
  };
  struct Shape {
    int64_t m, n, k;
    int v;
    bool acc;
  };
  for (const Shape& s : std::vector<Shape>{{3, 5, 7, 16, false},
                                           {17, 9, 100, 16, true},
                                           {5, 4, 3, 16, false},
                                           {8, 8, 0, 4, true},
                                           {6, 7, 513, 64, false},
                                           {4, 3, 1000, 1024, false},
                                           {9, 2, 77, 1, true}}) {
    const auto a = random_floats(size_t(s.m * s.k), 1), b = random_floats(size_t(s.k * s.n), 2);
    const auto c0 = random_floats(size_t(s.m * s.n), 3);
    kernels::cpu::GemmArgs g;
    g.M = s.m;
    g.N = s.n;
    g.K = s.k;
    g.A = a.data();
    g.a_row_stride = s.k;  // row-major A
    g.B = b.data();
    g.b_row_stride = 1;  // B read transposed: (k, j) at k + j * K
    g.b_col_stride = s.k;
    g.c_row_stride = s.n;
    g.accumulate = s.acc;
    g.chunks = s.v;
    std::vector<float> ref = c0, ours = c0;
    g.C = ref.data();
    kernels::cpu::gemm_reference_f32(g);
    for (int sm : {1, 132}) {
      for (int64_t cap : {int64_t(0), int64_t(1) << 20}) {
        ours = c0;
        g.C = ours.data();
        const BitwiseGemmPlan plan = plan_bitwise_gemm(s.m, s.n, s.k, 1, s.v, sm, cap);
        replay(g, plan);
        INFO("m " << s.m << " n " << s.n << " k " << s.k << " V " << s.v << " groups " << plan.groups);
        CHECK(std::memcmp(ours.data(), ref.data(), ref.size() * 4) == 0);
      }
    }
  }
}

TEST_CASE("cuBLASLt plan: row-major problem as its column-major transpose") {
  // out [M, N] = a [M, K] . b [K, N], everything row-major.
  LtPlan p = plan_lt_matmul(8, 16, 32, 1, 32, 1, 0, 16, 1, 0, 16, 0, DType::BFloat16, LtEpilogue::None);
  REQUIRE(p.ok);
  CHECK(p.m == 16);
  CHECK(p.n == 8);
  CHECK(p.k == 32);
  CHECK(!p.a.trans);  // lt A = b as stored: column-major N x K, ld = N
  CHECK(p.a.rows == 16);
  CHECK(p.a.cols == 32);
  CHECK(p.a.ld == 16);
  CHECK(!p.b.trans);  // lt B = a as stored: column-major K x M, ld = K
  CHECK(p.b.rows == 32);
  CHECK(p.b.cols == 8);
  CHECK(p.b.ld == 32);
  CHECK(p.d.rows == 16);
  CHECK(p.d.cols == 8);
  CHECK(p.d.ld == 16);
  CHECK(p.data_type == lt_const::kR16BF);
  CHECK(p.compute_type == lt_const::kCompute32F);
  CHECK(p.epilogue == lt_const::kEpDefault);
  // A Linear: b = w^T with w [N, K] row-major -> b (k, n) at n * K + k: lt A transposed.
  p = plan_lt_matmul(8, 16, 32, 1, 32, 1, 0, 1, 32, 0, 16, 0, DType::Float16, LtEpilogue::GeluBias);
  REQUIRE(p.ok);
  CHECK(p.a.trans);
  CHECK(p.a.rows == 32);
  CHECK(p.a.cols == 16);
  CHECK(p.a.ld == 32);
  CHECK(p.epilogue == lt_const::kEpGeluBias);
  // The weight gradient dY^T . X: a transposed.
  p = plan_lt_matmul(16, 32, 8, 1, 1, 16, 0, 32, 1, 0, 32, 0, DType::Float32, LtEpilogue::None);
  REQUIRE(p.ok);
  CHECK(p.b.trans);
  CHECK(p.b.rows == 16);
  CHECK(p.b.ld == 16);
  CHECK(p.data_type == lt_const::kR32F);
  // Batched, with batch strides.
  p = plan_lt_matmul(4, 4, 4, 3, 4, 1, 16, 4, 1, 16, 4, 16, DType::Float32, LtEpilogue::None);
  REQUIRE(p.ok);
  CHECK(p.batch == 3);
  CHECK(p.a.batch_stride == 16);
  CHECK(p.d.batch_stride == 16);
  // Refusals.
  CHECK(!plan_lt_matmul(4, 4, 4, 1, 8, 2, 0, 4, 1, 0, 4, 0, DType::Float32, LtEpilogue::None).ok);  // no unit stride
  CHECK(!plan_lt_matmul(4, 4, 4, 2, 4, 1, 0, 4, 1, 16, 4, 16, DType::Float32, LtEpilogue::None).ok);  // broadcast
  CHECK(!plan_lt_matmul(4, 4, 4, 1, 4, 1, 0, 4, 1, 0, 2, 0, DType::Float32, LtEpilogue::None).ok);  // overlapping rows
  CHECK(!plan_lt_matmul(4, 4, 4, 1, 4, 1, 0, 4, 1, 0, 4, 0, DType::Float64, LtEpilogue::None).ok);
  CHECK(!plan_lt_matmul(0, 4, 4, 1, 4, 1, 0, 4, 1, 0, 4, 0, DType::Float32, LtEpilogue::None).ok);
}
