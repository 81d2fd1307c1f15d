// GEMM with the canonical K-order (kernels/gemm.h): every property is checked
// bit for bit (memcmp), never with a tolerance.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/gemm.h"
#include "runtime/threadpool.h"
#include "test/skip.h"

using namespace tessel;
using namespace tessel::kernels::cpu;

namespace {

// Values with mixed signs and magnitudes, so that any change in the order of
// operations changes bits (checked by "the tests have teeth" below).
template <class T>
void fill(std::vector<T>& v, std::mt19937& rng) {
  std::uniform_real_distribution<T> u(-1, 1);
  std::uniform_int_distribution<int> e(-6, 6);
  for (auto& x : v) x = std::ldexp(u(rng), e(rng));
}

// How an operand is laid out in memory.
enum class Layout { RowMajor, ColMajor, Strided };
const char* name(Layout l) { return l == Layout::RowMajor ? "n" : l == Layout::ColMajor ? "t" : "g"; }

// A rows x cols matrix stored with padding (row-major: lead = cols + 3, ...).
template <class T>
struct Mat {
  int64_t rows = 0, cols = 0, rs = 0, cs = 0;
  std::vector<T> buf;
  Mat(int64_t r, int64_t c, Layout l, std::mt19937& rng) : rows(r), cols(c) {
    switch (l) {
      case Layout::RowMajor: rs = c + 3; cs = 1; break;
      case Layout::ColMajor: rs = 1; cs = r + 5; break;
      case Layout::Strided: rs = 2; cs = 2 * r + 3; break;
    }
    int64_t size = (r > 0 && c > 0) ? (r - 1) * rs + (c - 1) * cs + 1 : 1;
    buf.resize(size + 7);
    fill(buf, rng);
  }
  const T* data() const { return buf.data(); }
};

template <class T>
struct Problem {
  int64_t M, N, K;
  Mat<T> A, B;
  int64_t ldc;
  std::vector<T> C0;  // initial C (for accumulate; padding must survive)
  Problem(int64_t m, int64_t n, int64_t k, Layout la, Layout lb, std::mt19937& rng)
      : M(m), N(n), K(k), A(m, k, la, rng), B(k, n, lb, rng), ldc(n + 2), C0(std::max<int64_t>(m * (n + 2), 1)) {
    fill(C0, rng);
  }
  GemmArgsT<T> args(T* C, bool accumulate, int V) const {
    GemmArgsT<T> g;
    g.M = M, g.N = N, g.K = K;
    g.A = A.data(), g.a_row_stride = A.rs, g.a_col_stride = A.cs;
    g.B = B.data(), g.b_row_stride = B.rs, g.b_col_stride = B.cs;
    g.C = C, g.c_row_stride = ldc;
    g.accumulate = accumulate;
    g.chunks = V;
    return g;
  }
};

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class T>
std::vector<T> run_ref(const Problem<T>& p, bool acc, int V) {
  std::vector<T> C = p.C0;
  if constexpr (std::is_same_v<T, float>) {
    gemm_reference_f32(p.args(C.data(), acc, V));
  } else {
    gemm_reference_f64(p.args(C.data(), acc, V));
  }
  return C;
}

template <class T>
std::vector<T> run_opt(const Problem<T>& p, bool acc, int V) {
  std::vector<T> C = p.C0;
  if constexpr (std::is_same_v<T, float>) {
    gemm_f32(p.args(C.data(), acc, V));
  } else {
    gemm_f64(p.args(C.data(), acc, V));
  }
  return C;
}

// Restores thread count, ISA and blocking after a test.
struct Restore {
  int threads = num_threads();
  GemmIsa isa = gemm_force_isa(GemmIsa::Auto);
  GemmBlocking blocking = gemm_set_blocking(GemmBlocking{});
  ~Restore() {
    set_num_threads(threads);
    gemm_force_isa(isa);
    gemm_set_blocking(blocking);
  }
};

std::vector<GemmIsa> isas() {
  std::vector<GemmIsa> v{GemmIsa::Avx2};
  if (__builtin_cpu_supports("avx512f")) v.push_back(GemmIsa::Avx512);
  return v;
}

const Layout kLayouts[] = {Layout::RowMajor, Layout::ColMajor, Layout::Strided};

struct Shape {
  int64_t m, n, k;
  int v;
};

}  // namespace

TEST_CASE("gemm reference follows the definition on a hand-built case") {
  // K = 6, V = 4: chunks of ceil(6/4) = 2 -> {0,1}, {2,3}, {4,5}, {} and the
  // tree ((c0 + c1) + (c2 + c3)).
  float a[6] = {1e8f, 3.0f, -1e8f, 0.5f, 1.25f, -7.0f};
  float b[6] = {1.0f, 0.3f, 1.0f, 0.1f, 3.0f, 0.7f};
  float c0 = std::fma(a[1], b[1], std::fma(a[0], b[0], 0.0f));
  float c1 = std::fma(a[3], b[3], std::fma(a[2], b[2], 0.0f));
  float c2 = std::fma(a[5], b[5], std::fma(a[4], b[4], 0.0f));
  float c3 = 0.0f;
  float expect = (c0 + c1) + (c2 + c3);
  for (bool acc : {false, true}) {
    float c_ref = 2.5f, c_opt = 2.5f;
    GemmArgs g;
    g.M = 1, g.N = 1, g.K = 6;
    g.A = a, g.a_row_stride = 6, g.a_col_stride = 1;
    g.B = b, g.b_row_stride = 1, g.b_col_stride = 1;
    g.c_row_stride = 1;
    g.accumulate = acc;
    g.chunks = 4;
    g.C = &c_ref;
    gemm_reference_f32(g);
    g.C = &c_opt;
    gemm_f32(g);
    float want = acc ? 2.5f + expect : expect;
    CHECK(std::memcmp(&c_ref, &want, 4) == 0);
    CHECK(std::memcmp(&c_opt, &want, 4) == 0);
  }
}

TEST_CASE("gemm: the tests have teeth (another V or a plain dot product gives other bits)") {
  std::mt19937 rng(7);
  Problem<float> p(17, 23, 300, Layout::RowMajor, Layout::RowMajor, rng);
  auto v16 = run_ref(p, false, 16);
  CHECK_FALSE(same_bits(v16, run_ref(p, false, 8)));
  CHECK_FALSE(same_bits(v16, run_ref(p, false, 1)));
}

TEST_CASE("gemm_f32 equals the reference bit for bit: shapes x layouts x V x accumulate x ISA") {
  Restore restore;
  std::mt19937 rng(1234);
  const std::vector<Shape> shapes = {
      {1, 1, 1, 16},    {1, 1, 0, 16},    {3, 5, 0, 4},      {1, 50, 37, 16},  {50, 1, 37, 16},
      {7, 9, 3, 16},    {13, 17, 15, 16}, {8, 48, 64, 16},   {9, 49, 65, 16},  {6, 16, 31, 2},
      {31, 33, 100, 1}, {47, 95, 257, 1}, {29, 61, 600, 2},  {17, 50, 1000, 4}, {40, 70, 130, 64},
      {5, 130, 77, 8},  {130, 5, 77, 8},  {33, 97, 48, 1024}, {64, 96, 777, 16},
  };
  for (GemmIsa isa : isas()) {
    gemm_force_isa(isa);
    for (const Shape& s : shapes) {
      for (Layout la : kLayouts) {
        for (Layout lb : kLayouts) {
          Problem<float> p(s.m, s.n, s.k, la, lb, rng);
          for (bool acc : {false, true}) {
            INFO("isa=" << gemm_isa_name(isa) << " M=" << s.m << " N=" << s.n << " K=" << s.k << " V=" << s.v
                        << " trans=" << name(la) << name(lb) << " acc=" << acc);
            CHECK(same_bits(run_opt(p, acc, s.v), run_ref(p, acc, s.v)));
          }
        }
      }
    }
  }
}

TEST_CASE("gemm_f32 with few rows (the unpacked small-M path) equals the reference bit for bit") {
  // M <= 8 with B unit-stride along k (x·Wᵀ: Linear, LM head, q·kᵀ) or along
  // j (p·v) takes the AVX-512 path without packing; M = 9 and strided B the
  // packed one. Column counts around the 16-lane groups, K around the 16 x 16
  // transposes and inside / across chunks, V from 1 to 1024.
  Restore restore;
  std::mt19937 rng(808);
  const std::vector<std::pair<int64_t, int64_t>> nk = {{1, 1},   {15, 17}, {16, 16}, {17, 48},
                                                       {33, 5},  {47, 100}, {100, 770}, {3, 1100}};
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (GemmIsa isa : isas()) {
      gemm_force_isa(isa);
      for (int64_t m = 1; m <= 9; ++m) {
        for (const auto& [n, k] : nk) {
          for (Layout la : {Layout::RowMajor, Layout::Strided}) {
            for (Layout lb : kLayouts) {
              Problem<float> p(m, n, k, la, lb, rng);
              for (int v : {1, 16, 1024}) {
                for (bool acc : {false, true}) {
                  INFO("threads=" << threads << " isa=" << gemm_isa_name(isa) << " M=" << m << " N=" << n << " K="
                                  << k << " V=" << v << " trans=" << name(la) << name(lb) << " acc=" << acc);
                  CHECK(same_bits(run_opt(p, acc, v), run_ref(p, acc, v)));
                }
              }
            }
          }
        }
      }
    }
  }
  // Decoding attention: batched, one query row, B broadcast or per problem.
  const int64_t batch = 6, N = 37, K = 64;
  std::vector<float> A(batch * K), B(batch * K * N), C(batch * N);
  fill(A, rng);
  fill(B, rng);
  for (bool kcontig : {true, false}) {
    for (int64_t b_bs : {int64_t(0), K * N}) {
      GemmArgs g;
      g.M = 1, g.N = N, g.K = K;
      g.A = A.data(), g.a_row_stride = K, g.a_col_stride = 1;
      g.B = B.data();
      g.b_row_stride = kcontig ? 1 : N;
      g.b_col_stride = kcontig ? K : 1;
      g.c_row_stride = N;
      g.C = C.data();
      gemm_batched_f32(g, batch, K, b_bs, N);
      std::vector<float> R(C.size());
      for (int64_t b = 0; b < batch; ++b) {
        GemmArgs gb = g;
        gb.A += b * K;
        gb.B += b * b_bs;
        gb.C = R.data() + b * N;
        gemm_reference_f32(gb);
      }
      INFO("kcontig=" << kcontig << " b_batch_stride=" << b_bs);
      CHECK(same_bits(C, R));
    }
  }
}

TEST_CASE("gemm_f32 equals the reference on shapes spanning several units and threads") {
  Restore restore;
  std::mt19937 rng(99);
  const std::vector<Shape> shapes = {{300, 530, 260, 16}, {517, 97, 513, 16}, {70, 1100, 96, 4}, {90, 70, 2100, 16}};
  for (GemmIsa isa : isas()) {
    gemm_force_isa(isa);
    for (int threads : {1, 2, 3}) {
      set_num_threads(threads);
      for (const Shape& s : shapes) {
        Problem<float> p(s.m, s.n, s.k, Layout::RowMajor, Layout::ColMajor, rng);
        INFO("isa=" << gemm_isa_name(isa) << " threads=" << threads << " M=" << s.m << " N=" << s.n << " K=" << s.k);
        CHECK(same_bits(run_opt(p, true, s.v), run_ref(p, true, s.v)));
      }
    }
  }
}

TEST_CASE("gemm_f32 equals the reference under tiny blockings (chunks split across K blocks, many units)") {
  Restore restore;
  std::mt19937 rng(2024);
  const std::vector<Shape> shapes = {{37, 101, 100, 4}, {50, 200, 333, 16}, {9, 60, 70, 1}, {20, 30, 5, 16}};
  const GemmBlocking blockings[] = {
      {16, 16, 96, 0},       // B packed per block per unit
      {16, 16, 96, -1},      // B packed for all of K per column range
      {7, 8, 48, 0},         // K blocks shorter than most chunks, one tile per unit
      {100, 24, 200, -1},
  };
  for (GemmIsa isa : isas()) {
    gemm_force_isa(isa);
    for (const GemmBlocking& b : blockings) {
      gemm_set_blocking(b);
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        for (const Shape& s : shapes) {
          for (Layout la : kLayouts) {
            Problem<float> p(s.m, s.n, s.k, la, Layout::RowMajor, rng);
            INFO("isa=" << gemm_isa_name(isa) << " kc=" << b.kc << " mc=" << b.mc << " nc=" << b.nc
                        << " whole_k=" << b.whole_k_pack_bytes << " threads=" << threads << " M=" << s.m
                        << " N=" << s.n << " K=" << s.k << " V=" << s.v << " trans=" << name(la) << "n");
            CHECK(same_bits(run_opt(p, true, s.v), run_ref(p, true, s.v)));
          }
          Problem<float> p(s.m, s.n, s.k, Layout::RowMajor, Layout::ColMajor, rng);
          CHECK(same_bits(run_opt(p, false, s.v), run_ref(p, false, s.v)));
          Problem<double> pd(s.m, s.n, s.k, Layout::ColMajor, Layout::RowMajor, rng);
          CHECK(same_bits(run_opt(pd, false, s.v), run_ref(pd, false, s.v)));
        }
      }
    }
  }
}

TEST_CASE("gemm_f32: K = 0 gives +0 (or C_old + 0), M = 0 / N = 0 touch nothing") {
  std::vector<float> C = {-0.0f, 1.5f, -0.0f, -2.0f};
  GemmArgs g;
  g.M = 2, g.N = 2, g.K = 0;
  g.C = C.data(), g.c_row_stride = 2;
  gemm_f32(g);
  for (float x : C) CHECK((x == 0.0f && !std::signbit(x)));
  C = {-0.0f, 1.5f, -0.0f, -2.0f};
  g.accumulate = true;
  gemm_f32(g);
  CHECK(!std::signbit(C[0]));  // -0 + +0 = +0
  CHECK(C[1] == 1.5f);
  CHECK(C[3] == -2.0f);
  g.M = 0;
  g.C = nullptr;
  gemm_f32(g);  // nothing to do, nothing read
}

TEST_CASE("gemm_f32 is position independent: a sub-block of C computed alone has the same bits") {
  Restore restore;
  std::mt19937 rng(5);
  for (GemmIsa isa : isas()) {
    gemm_force_isa(isa);
    for (Layout la : {Layout::RowMajor, Layout::ColMajor}) {
      for (Layout lb : {Layout::RowMajor, Layout::ColMajor}) {
        const int64_t M = 61, N = 150, K = 203;
        Problem<float> p(M, N, K, la, lb, rng);
        auto full = run_opt(p, true, 16);
        std::uniform_int_distribution<int64_t> rm(0, M - 1), rn(0, N - 1);
        for (int trial = 0; trial < 12; ++trial) {
          int64_t r0 = rm(rng), r1 = rm(rng), c0 = rn(rng), c1 = rn(rng);
          if (r0 > r1) std::swap(r0, r1);
          if (c0 > c1) std::swap(c0, c1);
          r1++, c1++;
          std::vector<float> C = p.C0;
          GemmArgs g = p.args(C.data(), true, 16);
          g.M = r1 - r0, g.N = c1 - c0;
          g.A += r0 * p.A.rs;
          g.B += c0 * p.B.cs;
          g.C += r0 * p.ldc + c0;
          gemm_f32(g);
          INFO("isa=" << gemm_isa_name(isa) << " trans=" << name(la) << name(lb) << " rows " << r0 << ".." << r1
                      << " cols " << c0 << ".." << c1);
          bool ok = true;
          for (int64_t i = r0; i < r1; ++i)
            ok &= std::memcmp(&C[i * p.ldc + c0], &full[i * p.ldc + c0], (c1 - c0) * sizeof(float)) == 0;
          CHECK(ok);
        }
      }
    }
  }
}

TEST_CASE("gemm_f32: thread count and ISA never change a bit") {
  Restore restore;
  std::mt19937 rng(11);
  const std::vector<Shape> shapes = {{200, 333, 300, 16}, {1, 700, 129, 16}, {700, 3, 64, 8}, {96, 96, 2600, 16}};
  for (const Shape& s : shapes) {
    Problem<float> p(s.m, s.n, s.k, Layout::RowMajor, Layout::RowMajor, rng);
    std::vector<float> first;
    for (GemmIsa isa : isas()) {
      gemm_force_isa(isa);
      for (int threads : {1, 2, 3}) {
        set_num_threads(threads);
        auto C = run_opt(p, false, s.v);
        if (first.empty()) first = C;
        INFO("isa=" << gemm_isa_name(isa) << " threads=" << threads << " M=" << s.m << " N=" << s.n << " K=" << s.k);
        CHECK(same_bits(C, first));
      }
    }
  }
}

TEST_CASE("gemm_f32 shard property: K split into W pieces of V/W chunks, finished by the tree") {
  Restore restore;
  std::mt19937 rng(21);
  struct Case {
    int64_t m, n, k;
    int v;
  };
  for (GemmIsa isa : isas()) {
    gemm_force_isa(isa);
    for (Case cs : {Case{37, 75, 16 * 23, 16}, Case{20, 49, 1024, 16}, Case{9, 50, 8 * 70, 8}, Case{12, 40, 4 * 600, 4}}) {
      Problem<float> p(cs.m, cs.n, cs.k, Layout::RowMajor, Layout::ColMajor, rng);
      for (bool acc : {false, true}) {
        auto full = run_opt(p, acc, cs.v);
        for (int W = 2; W <= cs.v; W *= 2) {
          const int64_t kw = cs.k / W;
          std::vector<std::vector<float>> part(W, std::vector<float>(p.C0.size()));
          for (int w = 0; w < W; ++w) {
            GemmArgs g = p.args(part[w].data(), false, cs.v / W);
            g.K = kw;
            g.A += w * kw * p.A.cs;
            g.B += w * kw * p.B.rs;
            gemm_f32(g);
          }
          for (int width = 1; width < W; width *= 2)
            for (int w = 0; w + width < W; w += 2 * width)
              for (size_t e = 0; e < part[w].size(); ++e) part[w][e] = part[w][e] + part[w + width][e];
          std::vector<float> C = p.C0;
          bool ok = true;
          for (int64_t i = 0; i < cs.m; ++i)
            for (int64_t j = 0; j < cs.n; ++j) {
              float& c = C[i * p.ldc + j];
              c = acc ? c + part[0][i * p.ldc + j] : part[0][i * p.ldc + j];
            }
          ok = same_bits(C, full);
          INFO("isa=" << gemm_isa_name(isa) << " M=" << cs.m << " N=" << cs.n << " K=" << cs.k << " V=" << cs.v
                      << " W=" << W << " acc=" << acc);
          CHECK(ok);
        }
      }
    }
  }
}

TEST_CASE("gemm_batched_f32 equals per-problem GEMMs, including a broadcast operand") {
  Restore restore;
  std::mt19937 rng(3);
  const int64_t batch = 5, M = 19, N = 37, K = 70;
  std::vector<float> A(batch * M * K), B(K * N), C(batch * M * N);
  fill(A, rng);
  fill(B, rng);
  fill(C, rng);
  const std::vector<float> C0 = C;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    GemmArgs g;
    g.M = M, g.N = N, g.K = K;
    g.A = A.data(), g.a_row_stride = K, g.a_col_stride = 1;
    g.B = B.data(), g.b_row_stride = 1, g.b_col_stride = K;  // B^T of a K x N buffer read as N x K
    g.c_row_stride = N;
    g.accumulate = true;
    C = C0;
    g.C = C.data();
    gemm_batched_f32(g, batch, M * K, 0, M * N);
    std::vector<float> R = C0;
    for (int64_t b = 0; b < batch; ++b) {
      GemmArgs gb = g;
      gb.A += b * M * K;
      gb.C = R.data() + b * M * N;
      gemm_reference_f32(gb);
    }
    CHECK(same_bits(C, R));
  }
}

TEST_CASE("gemm_f64 equals its reference bit for bit and keeps the shard property") {
  Restore restore;
  std::mt19937 rng(77);
  const std::vector<Shape> shapes = {{1, 1, 0, 16}, {7, 9, 3, 16}, {13, 17, 64, 16}, {50, 41, 300, 16},
                                     {29, 61, 600, 2}, {130, 70, 33, 1}};
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (const Shape& s : shapes)
      for (Layout la : kLayouts)
        for (Layout lb : kLayouts) {
          Problem<double> p(s.m, s.n, s.k, la, lb, rng);
          for (bool acc : {false, true}) {
            INFO("M=" << s.m << " N=" << s.n << " K=" << s.k << " trans=" << name(la) << name(lb) << " acc=" << acc);
            CHECK(same_bits(run_opt(p, acc, s.v), run_ref(p, acc, s.v)));
          }
        }
  }
  // The double GEMM uses the same tree: two halves of K with V/2 chunks each.
  Problem<double> p(21, 22, 16 * 12, Layout::RowMajor, Layout::RowMajor, rng);
  auto full = run_opt(p, false, 16);
  std::vector<double> h0(p.C0.size()), h1(p.C0.size());
  GemmArgsF64 g0 = p.args(h0.data(), false, 8), g1 = p.args(h1.data(), false, 8);
  g0.K = g1.K = p.K / 2;
  g1.A += p.K / 2 * p.A.cs;
  g1.B += p.K / 2 * p.B.rs;
  gemm_f64(g0);
  gemm_f64(g1);
  std::vector<double> C = p.C0;
  for (int64_t i = 0; i < p.M; ++i)
    for (int64_t j = 0; j < p.N; ++j) C[i * p.ldc + j] = h0[i * p.ldc + j] + h1[i * p.ldc + j];
  CHECK(same_bits(C, full));
}

TEST_CASE("gemm argument checks name the op") {
  GemmArgs g;
  g.M = 2, g.N = 2, g.K = 2;
  g.chunks = 3;
  float buf[8] = {};
  g.A = g.B = buf;
  g.C = buf + 4;
  g.a_row_stride = g.b_row_stride = g.c_row_stride = 2;
  CHECK_THROWS_WITH(gemm_f32(g), Catch::Contains("gemm_f32") && Catch::Contains("power of two"));
}
