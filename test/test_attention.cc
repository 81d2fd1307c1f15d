// Scaled dot-product attention: against a per-head reference, GQA, masks, gradients;
// the fused causal kernel against the composite, its scalar reference, threads and slices.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>

#include "autograd/api.h"
#include "kernels/attention.h"
#include "kernels/cpu/attention_ref.h"
#include "kernels/random.h"
#include "runtime/threadpool.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

// Plain double-precision attention for one (batch, head).
static std::vector<double> ref_head(const std::vector<double>& q, const std::vector<double>& k,
                                    const std::vector<double>& v, int64_t T, int64_t D, bool causal) {
  std::vector<double> out(size_t(T * D), 0.0);
  for (int64_t i = 0; i < T; ++i) {
    std::vector<double> s(size_t(T), -INFINITY);
    double m = -INFINITY;
    for (int64_t j = 0; j < T; ++j) {
      if (causal && j > i) continue;
      double d = 0;
      for (int64_t c = 0; c < D; ++c) d += q[size_t(i * D + c)] * k[size_t(j * D + c)];
      s[size_t(j)] = d / std::sqrt(double(D));
      m = std::max(m, s[size_t(j)]);
    }
    double z = 0;
    for (auto& x : s) z += (x = std::exp(x - m));
    for (int64_t j = 0; j < T; ++j)
      for (int64_t c = 0; c < D; ++c) out[size_t(i * D + c)] += s[size_t(j)] / z * v[size_t(j * D + c)];
  }
  return out;
}

TEST_CASE("attention matches a plain reference, with grouped-query heads") {
  const int64_t B = 2, Hq = 4, Hkv = 2, T = 7, D = 8;
  Tensor q = uniform({B, Hq, T, D}, 1, -1, 1, DType::Float64);
  Tensor k = uniform({B, Hkv, T, D}, 2, -1, 1, DType::Float64);
  Tensor v = uniform({B, Hkv, T, D}, 3, -1, 1, DType::Float64);
  for (bool causal : {true, false}) {
    AttentionOptions o;
    o.causal = causal;
    Tensor y = scaled_dot_product_attention(q, k, v, o);
    REQUIRE(y.shape() == Dims{B, Hq, T, D});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hq; ++h) {
        auto r = ref_head(q.select(0, b).select(0, h).to_vector<double>(),
                          k.select(0, b).select(0, h / 2).to_vector<double>(),
                          v.select(0, b).select(0, h / 2).to_vector<double>(), T, D, causal);
        auto got = y.select(0, b).select(0, h).to_vector<double>();
        for (size_t i = 0; i < r.size(); ++i) REQUIRE(got[i] == Approx(r[i]).epsilon(1e-12));
      }
  }
}

TEST_CASE("attention: explicit mask, dropout determinism, errors") {
  Tensor q = uniform({1, 2, 4, 8}, 4), k = uniform({1, 2, 4, 8}, 5), v = uniform({1, 2, 4, 8}, 6);
  AttentionOptions o;
  o.causal = false;
  o.mask = tril(ones({4, 4}, DType::Bool));
  CHECK(allclose(scaled_dot_product_attention(q, k, v, o), scaled_dot_product_attention(q, k, v)));
  AttentionOptions d;
  d.dropout_p = 0.3;
  d.dropout_key = PhiloxKey{7, 9};
  CHECK(bitwise_equal(scaled_dot_product_attention(q, k, v, d), scaled_dot_product_attention(q, k, v, d)));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, uniform({1, 3, 4, 8}, 7), uniform({1, 3, 4, 8}, 8)),
                    Catch::Contains("multiple of key/value heads"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, uniform({1, 2, 5, 8}, 7), uniform({1, 2, 5, 8}, 8)),
                    Catch::Contains("causal"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q.squeeze(0), k, v), Catch::Contains("[B, H, T, D]"));
}

TEST_CASE("gradients of attention (GQA, causal)") {
  CHECK_GRADCHECK(
      [](const std::vector<Tensor>& in) { return scaled_dot_product_attention(in[0], in[1], in[2]); },
      {grad_input({1, 4, 5, 3}, 10), grad_input({1, 2, 5, 3}, 11), grad_input_noncontig({1, 2, 5, 3}, 12)});
}

TEST_CASE("attention dropout with a GlobalBlock: a batch slice gets its slice of the full-batch result") {
  Tensor q = uniform({4, 2, 5, 8}, 21), k = uniform({4, 2, 5, 8}, 22), v = uniform({4, 2, 5, 8}, 23);
  AttentionOptions o;
  o.dropout_p = 0.4;
  o.dropout_key = PhiloxKey{3, 5};
  Tensor full = scaled_dot_product_attention(q, k, v, o);
  for (int64_t off : {0, 1, 3}) {
    AttentionOptions s = o;
    s.dropout_block = GlobalBlock{{4, 2, 5, 5}, {off, 0, 0, 0}};
    Tensor part = scaled_dot_product_attention(q.narrow(0, off, 1), k.narrow(0, off, 1), v.narrow(0, off, 1), s);
    CHECK(bitwise_equal(part, full.narrow(0, off, 1)));
  }
  // Without the block, a slice draws the mask of batch row 0 instead.
  Tensor unplaced = scaled_dot_product_attention(q.narrow(0, 3, 1), k.narrow(0, 3, 1), v.narrow(0, 3, 1), o);
  CHECK_FALSE(bitwise_equal(unplaced, full.narrow(0, 3, 1)));
}

// ---- The fused causal kernel -------------------------------------------------------------

namespace {

AttentionOptions composite_opts(AttentionOptions o = {}) {
  o.fused = false;
  return o;
}

// q [B, T, Hq, D] / k, v [B, T, Hkv, D] as head-transposed views, the layout the Attention module passes.
struct Qkv {
  Tensor q, k, v;
};
Qkv make_qkv(int64_t B, int64_t Hq, int64_t Hkv, int64_t T, int64_t D, uint64_t seed, DType dt = DType::Float32,
             bool transposed = true, double range = 2.0) {
  if (transposed)
    return {uniform({B, T, Hq, D}, seed, -range, range, dt).transpose(1, 2),
            uniform({B, T, Hkv, D}, seed + 1, -range, range, dt).transpose(1, 2),
            uniform({B, T, Hkv, D}, seed + 2, -1, 1, dt).transpose(1, 2)};
  return {uniform({B, Hq, T, D}, seed, -range, range, dt), uniform({B, Hkv, T, D}, seed + 1, -range, range, dt),
          uniform({B, Hkv, T, D}, seed + 2, -1, 1, dt)};
}

// Output and input gradients for a fixed random output gradient.
std::vector<Tensor> run_attention(const Qkv& x, const AttentionOptions& o, uint64_t seed = 77) {
  Tensor q = x.q.detach().requires_grad_(), k = x.k.detach().requires_grad_(), v = x.v.detach().requires_grad_();
  Tensor y = scaled_dot_product_attention(q, k, v, o);
  Tensor w = uniform(y.shape(), seed, -1, 1, y.dtype());
  sum(y * w).backward();
  return {y, q.grad(), k.grad(), v.grad()};
}

template <class C>
std::vector<C> values(const Tensor& t) {
  return t.to(dtype_v<C>).contiguous().template to_vector<C>();
}

}  // namespace

TEST_CASE("fused attention agrees with the composite (values and gradients)") {
  struct Shape {
    int64_t B, Hq, Hkv, T, D;
  };
  for (Shape s : {Shape{2, 4, 4, 1, 8}, Shape{1, 2, 2, 5, 3}, Shape{2, 6, 2, 17, 16}, Shape{1, 3, 1, 50, 64},
                  Shape{2, 2, 2, 100, 1}, Shape{1, 4, 2, 131, 80}}) {
    for (DType dt : {DType::Float32, DType::Float64}) {
      INFO("B " << s.B << " Hq " << s.Hq << " Hkv " << s.Hkv << " T " << s.T << " D " << s.D << " "
                << dtype_name(dt));
      Qkv x = make_qkv(s.B, s.Hq, s.Hkv, s.T, s.D, 10 * s.T + s.D, dt);
      auto fused = run_attention(x, {});
      auto comp = run_attention(x, composite_opts());
      const double tol = dt == DType::Float32 ? 2e-5 : 1e-12;
      for (size_t i = 0; i < fused.size(); ++i) {
        INFO("output " << i << " max |diff| " << max_abs_diff(fused[i].to(DType::Float64), comp[i].to(DType::Float64)));
        CHECK(fused[i].shape() == comp[i].shape());
        CHECK(allclose(fused[i].to(DType::Float64), comp[i].to(DType::Float64), tol, tol));
      }
    }
  }
  // A scale of its own.
  Qkv x = make_qkv(1, 2, 2, 9, 4, 5);
  AttentionOptions o;
  o.scale = 0.3;
  CHECK(allclose(run_attention(x, o)[0], run_attention(x, composite_opts(o))[0], 2e-5, 2e-5));
}

TEST_CASE("fused attention: output and gradients keep the head-transposed layout") {
  // As in the Attention module: q, k, v are [B, H, T, D] views of [B, T, H, D] projections.
  Tensor q0 = uniform({2, 7, 4, 8}, 1).requires_grad_(), k0 = uniform({2, 7, 2, 8}, 2).requires_grad_(),
         v0 = uniform({2, 7, 2, 8}, 3).requires_grad_();
  Tensor q = q0 * 1.0f, k = k0 * 1.0f, v = v0 * 1.0f;  // non-leaves, so hooks see the op's own gradients
  std::vector<Tensor> seen(3);
  Tensor qt = q.transpose(1, 2), kt = k.transpose(1, 2), vt = v.transpose(1, 2);
  qt.register_hook([&](const Tensor& g) { seen[0] = g; return Tensor(); });
  kt.register_hook([&](const Tensor& g) { seen[1] = g; return Tensor(); });
  vt.register_hook([&](const Tensor& g) { seen[2] = g; return Tensor(); });
  Tensor y = scaled_dot_product_attention(qt, kt, vt);
  CHECK(y.transpose(1, 2).is_contiguous());  // [B, T, H, D] in memory: the reshape to [B, T, H * D] is a view
  sum(y * uniform(y.shape(), 4)).backward();
  for (const Tensor& g : seen) {
    REQUIRE(g.defined());
    CHECK(g.transpose(1, 2).is_contiguous());
  }
  // Contiguous inputs give contiguous outputs.
  Qkv c = make_qkv(2, 4, 2, 7, 8, 3, DType::Float32, /*transposed=*/false);
  CHECK(run_attention(c, {})[0].is_contiguous());
}

namespace {

// The kernels on (possibly strided, 16-bit) tensors against the scalar reference on float copies.
void check_kernels_against_reference(const Qkv& x, int v, bool dropout) {
  const Tensor &q = x.q, &k = x.k, &vv = x.v;
  const int64_t B = q.size(0), Hq = q.size(1), Hkv = k.size(1), T = q.size(2), D = q.size(3);
  INFO("B " << B << " Hq " << Hq << " Hkv " << Hkv << " T " << T << " D " << D << " V " << v << " dropout "
            << dropout << " " << dtype_name(q.dtype()));
  kernels::AttentionParams p;
  p.scale = 1.0 / std::sqrt(double(std::max<int64_t>(D, 1)));
  p.chunks = v;
  if (dropout) {
    p.dropout = true;
    p.key = PhiloxKey{11, 12};
    p.keep_threshold = kernels::bernoulli_threshold(0.7);
    p.dropout_scale = 1.0 / 0.7;
    p.block = GlobalBlock{{B + 2, Hq, T, T}, {1, 0, 0, 0}};
  }
  Tensor out = raw::empty(q.shape(), q.dtype());
  Tensor stats = raw::empty({B, Hq, T, 2}, DType::Float32);
  kernels::attention_forward(kCPU, q, k, vv, p, out, stats);
  Tensor dout = uniform(q.shape(), 5, -1, 1, q.dtype()).transpose(0, 1).contiguous().transpose(0, 1);  // strided
  Tensor dq = raw::empty(q.shape(), q.dtype()), dk = raw::empty(k.shape(), q.dtype()),
         dv = raw::empty(vv.shape(), q.dtype());
  kernels::attention_backward(kCPU, q, k, vv, dout, stats, p, dq, dk, dv);

  const auto pr = kernels::ref::AttentionProblem<float>::make(B, Hq, Hkv, T, D, p);
  auto qf = values<float>(q), kf = values<float>(k), vf = values<float>(vv), df = values<float>(dout);
  std::vector<float> o(qf.size()), st(size_t(B * Hq * T * 2)), gq(qf.size()), gk(kf.size()), gv(vf.size());
  kernels::ref::attention_forward(pr, qf.data(), kf.data(), vf.data(), o.data(), st.data());
  kernels::ref::attention_backward(pr, qf.data(), kf.data(), vf.data(), df.data(), st.data(), gq.data(), gk.data(),
                                   gv.data());
  auto as_dtype = [&](const std::vector<float>& r, const Tensor& like) {
    return tensor(r, like.shape()).to(like.dtype());
  };
  CHECK(bitwise_equal(stats, tensor(st, stats.shape())));
  CHECK(bitwise_equal(out.contiguous(), as_dtype(o, out)));
  CHECK(bitwise_equal(dq.contiguous(), as_dtype(gq, dq)));
  CHECK(bitwise_equal(dk.contiguous(), as_dtype(gk, dk)));
  CHECK(bitwise_equal(dv.contiguous(), as_dtype(gv, dv)));
}

}  // namespace

// The CPU backward has two schedules (kernels/cpu/attention.cc): whole
// heads per task with scores and dS kept (short sequences), and blocks of
// queries then of keys, recomputing them. Both must give the reference's bits.
namespace {
struct BackwardSchedule {
  explicit BackwardSchedule(const char* s) { setenv("TESSEL_ATTENTION_BACKWARD", s, 1); }
  ~BackwardSchedule() { unsetenv("TESSEL_ATTENTION_BACKWARD"); }
};
}  // namespace

TEST_CASE("fused attention kernels equal the scalar reference bit for bit") {
  struct Shape {
    int64_t B, Hq, Hkv, T, D;
  };
  const char* schedule = GENERATE("blocks", "whole");
  INFO("backward schedule " << schedule);
  BackwardSchedule forced(schedule);
  for (Shape s : {Shape{1, 1, 1, 1, 1}, Shape{2, 2, 1, 7, 5}, Shape{1, 3, 3, 48, 16}, Shape{1, 2, 2, 49, 64},
                  Shape{2, 3, 1, 100, 24}, Shape{1, 2, 1, 130, 70}})
    for (int v : {1, 4, 16, 1024})
      for (bool dropout : {false, true}) {
        Qkv x = make_qkv(s.B, s.Hq, s.Hkv, s.T, s.D, uint64_t(s.T * 7 + v), DType::Float32, (s.T + v) % 2 == 0);
        check_kernels_against_reference(x, v, dropout);
      }
  // 16-bit storage computes in float and rounds once on store.
  check_kernels_against_reference(make_qkv(2, 4, 2, 37, 16, 3, DType::BFloat16), 16, true);
  check_kernels_against_reference(make_qkv(1, 2, 2, 20, 8, 4, DType::Float16, false), 16, false);
  // Large scores (the max subtraction matters) and float64 (which runs the reference itself).
  check_kernels_against_reference(make_qkv(1, 2, 2, 33, 8, 6, DType::Float32, true, 30.0), 16, false);
}

namespace {

struct KernelRun {
  Tensor out, stats, dq, dk, dv;
};
// The fused kernels on q (a piece of the queries when p.q_begin / q's T say
// so), all keys, and the output gradient dout (q's rows).
KernelRun run_kernels(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                      const kernels::AttentionParams& p) {
  KernelRun r;
  r.out = raw::empty(q.shape(), q.dtype());
  r.stats = raw::empty({q.size(0), q.size(1), q.size(2), 2}, DType::Float32);
  kernels::attention_forward(kCPU, q, k, v, p, r.out, r.stats);
  r.dq = raw::empty(q.shape(), q.dtype()), r.dk = raw::empty(k.shape(), q.dtype()),
  r.dv = raw::empty(v.shape(), q.dtype());
  kernels::attention_backward(kCPU, q, k, v, dout, r.stats, p, r.dq, r.dk, r.dv);
  return r;
}

// The balanced tree over W pieces' values, in order (the collectives' rank-order tree).
Tensor tree_sum(std::vector<Tensor> parts) {
  while (parts.size() > 1) {
    std::vector<Tensor> next;
    for (size_t i = 0; i < parts.size(); i += 2) next.push_back(parts[i] + parts[i + 1]);
    parts = std::move(next);
  }
  return parts[0];
}

}  // namespace

// Context parallelism's kernel contract (kernels/attention.h "A piece of the
// queries"): the kernels on query rows [q0, q0 + Tq) against all keys equal
// the scalar reference on that piece; out, stats and dq are the whole run's
// rows; and with g = 1, the W pieces' dk and dv added by the balanced tree are
// the whole run's dk and dv, bit for bit, when the pieces are whole runs of
// the global chunks.
TEST_CASE("fused attention on pieces of the queries: the reference's bits, the whole run's rows and sums") {
  struct Case {
    int64_t B, Hq, Hkv, T, D;
    int v, w;
  };
  const char* schedule = GENERATE("blocks", "whole");
  INFO("backward schedule " << schedule);
  BackwardSchedule forced(schedule);
  for (Case c : {Case{1, 2, 2, 64, 16, 16, 2}, Case{2, 3, 3, 64, 8, 16, 4}, Case{1, 2, 2, 100, 24, 4, 4},
                 Case{1, 1, 1, 192, 16, 16, 4}, Case{2, 4, 2, 64, 16, 16, 2}, Case{1, 4, 1, 96, 8, 8, 4}})
    for (bool dropout : {false, true}) {
      INFO("B " << c.B << " Hq " << c.Hq << " Hkv " << c.Hkv << " T " << c.T << " D " << c.D << " V " << c.v
                << " pieces " << c.w << " dropout " << dropout);
      Qkv x = make_qkv(c.B, c.Hq, c.Hkv, c.T, c.D, uint64_t(c.T + c.w), DType::Float32, c.w == 2);
      Tensor dout = uniform(x.q.shape(), 5, -1, 1);
      kernels::AttentionParams p;
      p.scale = 1.0 / std::sqrt(double(c.D));
      p.chunks = c.v;
      if (dropout) {
        p.dropout = true;
        p.key = PhiloxKey{11, 12};
        p.keep_threshold = kernels::bernoulli_threshold(0.7);
        p.dropout_scale = 1.0 / 0.7;
        p.block = GlobalBlock{{c.B, c.Hq, c.T, c.T}, {0, 0, 0, 0}};
      }
      const KernelRun whole = run_kernels(x.q, x.k, x.v, dout, p);
      const int64_t Tq = c.T / c.w;
      std::vector<Tensor> dks, dvs;
      for (int64_t i = 0; i < c.w; ++i) {
        INFO("piece " << i);
        kernels::AttentionParams pp = p;
        pp.q_begin = i * Tq;
        if (dropout) pp.block.offset[2] = i * Tq;
        const Tensor q = x.q.narrow(2, i * Tq, Tq), d = dout.narrow(2, i * Tq, Tq);
        const KernelRun piece = run_kernels(q, x.k, x.v, d, pp);
        CHECK(bitwise_equal(piece.out, whole.out.narrow(2, i * Tq, Tq).contiguous()));
        CHECK(bitwise_equal(piece.stats, whole.stats.narrow(2, i * Tq, Tq).contiguous()));
        CHECK(bitwise_equal(piece.dq, whole.dq.narrow(2, i * Tq, Tq).contiguous()));
        // The scalar reference on the piece.
        const auto pr = kernels::ref::AttentionProblem<float>::make(c.B, c.Hq, c.Hkv, c.T, c.D, pp, Tq);
        auto qf = values<float>(q), kf = values<float>(x.k), vf = values<float>(x.v), df = values<float>(d);
        std::vector<float> o(qf.size()), st(size_t(c.B * c.Hq * Tq * 2)), gq(qf.size()), gk(kf.size()),
            gv(vf.size());
        kernels::ref::attention_forward(pr, qf.data(), kf.data(), vf.data(), o.data(), st.data());
        kernels::ref::attention_backward(pr, qf.data(), kf.data(), vf.data(), df.data(), st.data(), gq.data(),
                                         gk.data(), gv.data());
        CHECK(bitwise_equal(piece.out, tensor(o, q.shape())));
        CHECK(bitwise_equal(piece.dq, tensor(gq, q.shape())));
        CHECK(bitwise_equal(piece.dk, tensor(gk, x.k.shape())));
        CHECK(bitwise_equal(piece.dv, tensor(gv, x.v.shape())));
        dks.push_back(piece.dk);
        dvs.push_back(piece.dv);
      }
      if (c.Hq == c.Hkv) {  // g > 1 sums the group first (context parallelism repeats k and v)
        CHECK(bitwise_equal(tree_sum(dks), whole.dk));
        CHECK(bitwise_equal(tree_sum(dvs), whole.dv));
      }
    }
  // A piece outside the keys, and dropout on a piece without its block, are refused.
  Qkv x = make_qkv(1, 1, 1, 8, 4, 3);
  kernels::AttentionParams p;
  p.q_begin = 6;
  CHECK_THROWS_WITH(run_kernels(x.q.narrow(2, 0, 4), x.k, x.v, uniform({1, 1, 4, 4}, 1), p),
                    Catch::Contains("query rows 6..10") && Catch::Contains("outside the 8 keys"));
  p.q_begin = 4;
  p.dropout = true;
  CHECK_THROWS_WITH(run_kernels(x.q.narrow(2, 4, 4), x.k, x.v, uniform({1, 1, 4, 4}, 1), p),
                    Catch::Contains("needs the probabilities' block"));
}

TEST_CASE("TESSEL_ATTENTION_BACKWARD: the default schedule gives the forced ones' bits; a bad value is an error") {
  // 12 (b, kv head) tasks of 40 keys: the default takes whole heads on up to 6 threads.
  Qkv x = make_qkv(3, 8, 4, 40, 16, 21);
  Tensor dout = uniform(x.q.shape(), 5, -1, 1);
  kernels::AttentionParams p;
  p.scale = 0.25;
  p.chunks = 16;
  const KernelRun deflt = run_kernels(x.q, x.k, x.v, dout, p);
  for (const char* s : {"whole", "blocks"}) {
    INFO(s);
    BackwardSchedule forced(s);
    const KernelRun r = run_kernels(x.q, x.k, x.v, dout, p);
    CHECK(bitwise_equal(r.dq, deflt.dq));
    CHECK(bitwise_equal(r.dk, deflt.dk));
    CHECK(bitwise_equal(r.dv, deflt.dv));
  }
  BackwardSchedule bad("fast");
  CHECK_THROWS_WITH(run_kernels(x.q, x.k, x.v, dout, p),
                    Catch::Contains("attention_backward") && Catch::Contains("TESSEL_ATTENTION_BACKWARD") &&
                        Catch::Contains("'fast'"));
}

TEST_CASE("fused attention: the thread count and batch/head slices never change a bit") {
  Qkv x = make_qkv(3, 6, 2, 77, 32, 9);
  AttentionOptions o;
  o.dropout_p = 0.2;
  o.dropout_key = PhiloxKey{4, 5};
  const int saved = num_threads();
  set_num_threads(1);
  auto one = run_attention(x, o);
  for (int t : {2, 3, 5}) {
    set_num_threads(t);
    auto many = run_attention(x, o);
    for (size_t i = 0; i < one.size(); ++i) CHECK(bitwise_equal(one[i], many[i]));
  }
  set_num_threads(saved);
  // A slice of batch rows or of kv-head groups is computed alone with the same bits.
  AttentionOptions s = o;
  s.dropout_block = GlobalBlock{{3, 6, 77, 77}, {1, 3, 0, 0}};
  Tensor part = scaled_dot_product_attention(x.q.narrow(0, 1, 2).narrow(1, 3, 3), x.k.narrow(0, 1, 2).narrow(1, 1, 1),
                                             x.v.narrow(0, 1, 2).narrow(1, 1, 1), s);
  CHECK(bitwise_equal(part.contiguous(), one[0].narrow(0, 1, 2).narrow(1, 3, 3).contiguous()));
}

TEST_CASE("fused attention draws the composite's dropout mask") {
  // With v = identity rows (D = T), out row i is row i of the dropped probabilities.
  const int64_t B = 2, H = 3, T = 24;
  Tensor q = uniform({B, H, T, T}, 1, -2, 2, DType::Float64), k = uniform({B, H, T, T}, 2, -2, 2, DType::Float64);
  Tensor eye = zeros({T, T}, DType::Float64);
  for (int64_t i = 0; i < T; ++i) eye.select(0, i).select(0, i).fill_(1.0);
  Tensor v = eye.expand({B, H, T, T});
  AttentionOptions o;
  o.dropout_p = 0.4;
  o.dropout_key = PhiloxKey{8, 3};
  o.dropout_block = GlobalBlock{{B + 1, H, T, T}, {1, 0, 0, 0}};
  Tensor fused = scaled_dot_product_attention(q, k, v, o);
  Tensor comp = scaled_dot_product_attention(q, k, v, composite_opts(o));
  CHECK(allclose(fused, comp, 1e-12, 1e-12));
  auto f = fused.contiguous().to_vector<double>(), c = comp.contiguous().to_vector<double>();
  int64_t dropped = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    CHECK((f[i] == 0.0) == (c[i] == 0.0));
    dropped += f[i] == 0.0;
  }
  CHECK(dropped > int64_t(f.size() / 2));  // the upper triangle plus ~40% of the rest
}

TEST_CASE("gradients of fused attention (float64, GQA, dropout, strided)") {
  auto fn = [](const AttentionOptions& o) {
    return [o](const std::vector<Tensor>& in) { return scaled_dot_product_attention(in[0], in[1], in[2], o); };
  };
  CHECK_GRADCHECK(fn({}), {grad_input({1, 4, 6, 3}, 30), grad_input({1, 2, 6, 3}, 31),
                           grad_input_noncontig({1, 2, 6, 3}, 32)});
  AttentionOptions d;
  d.dropout_p = 0.3;
  d.dropout_key = PhiloxKey{2, 2};
  d.scale = 0.7;
  CHECK_GRADCHECK(fn(d), {grad_input_noncontig({2, 3, 5, 4}, 33), grad_input({2, 1, 5, 4}, 34),
                          grad_input({2, 1, 5, 4}, 35)});
}

TEST_CASE("fused attention: the composite handles what it does not, errors name the op") {
  Qkv x = make_qkv(1, 2, 2, 4, 8, 40);
  // Mixed dtypes and explicit masks go through the composite.
  AttentionOptions m;
  m.mask = tril(ones({4, 4}, DType::Bool));
  CHECK(allclose(scaled_dot_product_attention(x.q, x.k, x.v, m), run_attention(x, {})[0], 2e-5, 2e-5));
  CHECK(scaled_dot_product_attention(x.q.to(DType::Float64), x.k, x.v).dtype() == DType::Float64);
  AttentionOptions d;
  d.dropout_p = 0.5;
  d.dropout_block = GlobalBlock{{1, 2, 4, 3}, {0, 0, 0, 0}};
  CHECK_THROWS_WITH(scaled_dot_product_attention(x.q, x.k, x.v, d),
                    Catch::Contains("scaled_dot_product_attention") && Catch::Contains("does not fit"));
  d.dropout_p = 1.5;
  CHECK_THROWS_WITH(scaled_dot_product_attention(x.q, x.k, x.v, d), Catch::Contains("dropout_p"));
  // Meta tensors: shapes only.
  Tensor mq = empty({2, 4, 5, 8}, TensorOptions(DType::Float32).with_device(kMeta));
  Tensor mk = empty({2, 2, 5, 8}, TensorOptions(DType::Float32).with_device(kMeta));
  CHECK(scaled_dot_product_attention(mq, mk, mk).shape() == Dims{2, 4, 5, 8});
}

// The op checks its inputs once and the kernels do not re-check them: every
// error here comes from the op, so it comes on Meta tensors too (no kernel
// runs there), as in a Meta model or before a distributed op.
TEST_CASE("attention errors come from the op, on Meta tensors too") {
  const Tensor q = meta({1, 2, 4, 8}), k = meta({1, 2, 4, 8});
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, meta({1, 3, 4, 8}), meta({1, 3, 4, 8})),
                    Catch::Contains("scaled_dot_product_attention") && Catch::Contains("multiple of key/value heads"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, meta({1, 2, 5, 8}), meta({1, 2, 5, 8})),
                    Catch::Contains("scaled_dot_product_attention") && Catch::Contains("causal"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, k, meta({1, 2, 4, 4})),
                    Catch::Contains("scaled_dot_product_attention") && Catch::Contains("inconsistent shapes"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(meta({2, 4, 8}), k, k), Catch::Contains("[B, H, T, D]"));
}

TEST_CASE("balanced_segments_fit: 2 cp equal segments, in bitwise mode aligned runs of the canonical chunks") {
  CHECK(balanced_segments_fit(64, 2, false, 16));
  CHECK(balanced_segments_fit(66, 1, false, 16));      // 2 segments of 33
  CHECK_FALSE(balanced_segments_fit(66, 2, false, 16));  // 66 / 4 is not whole
  CHECK(balanced_segments_fit(64, 4, true, 16));       // 8 segments of 8 = 2 chunks of 4
  CHECK_FALSE(balanced_segments_fit(12, 2, true, 16));   // segments of 3 positions, chunks of 1
  CHECK_FALSE(balanced_segments_fit(48, 3, true, 16));   // 6 segments do not divide 16 chunks
  CHECK(balanced_segments_fit(32, 8, true, 16));       // 16 segments of 2 = one chunk each
  CHECK_FALSE(balanced_segments_fit(32, 0, false, 16));
}
