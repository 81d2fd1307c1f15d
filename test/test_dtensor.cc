// Distributed tensors: mesh, placements, redistribution between any two
// layouts, the distributed API (distribute_tensor, from_local, to_local,
// full_tensor), shard-invariant random factories, gradients with the
// placements of their parameters, and the errors.
#include <catch2/catch.hpp>

#include <atomic>
#include <random>

#include "autograd/api.h"
#include "autograd/function.h"
#include "autograd/ops/common.h"
#include "dtensor/ops.h"
#include "dtensor/redistribute.h"
#include "runtime/allocator.h"
#include "test/util/dist.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

TEST_CASE("chunk_range and local_geometry follow ceil division, nested in mesh order", "[dtensor]") {
  CHECK(chunk_range(7, 4, 0).begin == 0);
  CHECK(chunk_range(7, 4, 0).size() == 2);
  CHECK(chunk_range(7, 4, 3).size() == 1);
  CHECK(chunk_range(5, 4, 3).size() == 0);  // ceil(5/4) = 2: 2, 2, 1, 0
  CHECK(chunk_range(5, 4, 3).begin == 5);
  CHECK(chunk_range(0, 3, 1).size() == 0);
  // [10, 6] on (2, 3) with (S(0), S(0)): dim 0 cut in 2 (5 each), then each half in 3 (2, 2, 1).
  int coords[2] = {1, 2};
  LocalGeometry g = local_geometry({10, 6}, {2, 3}, {Shard(0), Shard(0)}, coords);
  CHECK(g.shape == Dims{1, 6});
  CHECK(g.offset == Dims{9, 0});
  g = local_geometry({10, 6}, {2, 3}, {Shard(1), Partial()}, coords);
  CHECK(g.shape == Dims{10, 3});
  CHECK(g.offset == Dims{0, 3});
  CHECK(Placements{Shard(0), Replicate(), Partial()}.str() == "[S(0), R, P(sum)]");
}

TEST_CASE("Mesh::world: ranks, coordinates, sub-meshes and per-dim groups", "[dtensor]") {
  auto reports = on_ranks(8, [](int rank) -> std::string {
    MeshPtr mesh = Mesh::world({{"pp", 2}, {"dp", 2}, {"tp", 2}});
    if (mesh->num_devices() != 8 || mesh->ndim() != 3) return "bad size";
    // Row-major: rank = pp*4 + dp*2 + tp.
    if (mesh->coordinate(0) != rank / 4 || mesh->coordinate(1) != rank / 2 % 2 || mesh->coordinate(2) != rank % 2)
      return "bad coordinates";
    if (mesh->comm(2)->size() != 2 || mesh->comm(2)->world_ranks()[0] != rank / 2 * 2) return "bad tp group";
    if (mesh->comm(0)->world_ranks() != std::vector<int>{rank % 4, rank % 4 + 4}) return "bad pp group";
    MeshPtr sub = mesh->sub({"dp", "tp"});
    if (sub->ndim() != 2 || sub->ranks() != std::vector<int>{rank / 4 * 4, rank / 4 * 4 + 1, rank / 4 * 4 + 2,
                                                              rank / 4 * 4 + 3})
      return "bad sub-mesh ranks";
    if (mesh->dim_index("tp") != 2) return "bad dim_index";
    if (mesh->str() != "(pp=2, dp=2, tp=2)") return "bad str " + mesh->str();
    return "";
  });
  CHECK(first_failure(reports) == "");
}

TEST_CASE("Mesh errors: size mismatch, unknown dim, no backend", "[dtensor]") {
  CHECK_THROWS_WITH(Mesh::world({{"dp", 2}}), Catch::Contains("no collectives backend"));
  auto reports = on_ranks(4, [](int) -> std::string {
    try {
      Mesh::world({{"dp", 3}});
      return "no error for a mesh of 3 on 4 ranks";
    } catch (const Error& e) {
      if (std::string(e.what()).find("has 3 devices but the world has 4 ranks") == std::string::npos)
        return std::string("wrong message: ") + e.what();
    }
    MeshPtr m = Mesh::world({{"dp", 2}, {"tp", 2}});
    try {
      m->dim_index("ep");
      return "no error for an unknown dim";
    } catch (const Error& e) {
      if (std::string(e.what()).find("no dim named 'ep'") == std::string::npos) return e.what();
    }
    return "";
  });
  CHECK(first_failure(reports) == "");
}

TEST_CASE("redistribute between any two placements gives the same global tensor, bit for bit", "[dtensor]") {
  for (const auto& dims : test_meshes()) {
    for (const Dims& shape : {Dims{7, 5}, Dims{3, 4, 6}, Dims{2, 9}, Dims{5}}) {
      auto reports = on_ranks(mesh_size(dims), [&](int) -> std::string {
        MeshPtr mesh = Mesh::world(dims);
        std::mt19937_64 gen(numel_of(shape) * 131 + mesh->ndim());
        Tensor full = uniform(shape, 5);
        for (int trial = 0; trial < 12; ++trial) {
          Placements a = random_placements(gen, mesh->ndim(), shape.size(), true);
          Placements b = random_placements(gen, mesh->ndim(), shape.size(), true);
          Tensor x = distribute_tensor(full, mesh, a);
          Tensor y = redistribute(x, b);
          if (y.placements() != b) return "placements not applied";
          LocalGeometry g = local_geometry(shape, mesh->shape(), b, mesh->coords());
          if (to_local(y).shape() != g.shape) return "local shape " + to_local(y).shape().str() + " for " + b.str();
          Tensor back = full_tensor(y);
          // Partial pieces hold the value on coordinate 0 and zeros elsewhere: exact sums.
          if (!bitwise_equal(back, full)) return "redistribute " + a.str() + " -> " + b.str() + " changed values";
        }
        return "";
      });
      INFO("mesh " << mesh_name(dims) << " shape " << shape.str());
      CHECK(first_failure(reports) == "");
    }
  }
}

TEST_CASE("redistribute plans use the standard collectives", "[dtensor]") {
  auto reports = on_ranks(4, [](int) -> std::string {
    MeshPtr m = Mesh::world({{"dp", 2}, {"tp", 2}});
    auto plan = [&](Placements a, Placements b) {
      std::string s;
      for (auto& st : dtensor::plan_redistribute(*m, a, b)) s += std::string(st.collective) + ";";
      return s;
    };
    std::string r;
    auto expect = [&](const std::string& got, const std::string& want) {
      if (got != want && r.empty()) r = "plan " + got + " expected " + want;
    };
    expect(plan({Shard(0), Replicate()}, {Replicate(), Replicate()}), "all_gather;");
    expect(plan({Partial(), Replicate()}, {Replicate(), Replicate()}), "all_reduce;");
    expect(plan({Partial(), Replicate()}, {Shard(1), Replicate()}), "reduce_scatter;");
    expect(plan({Shard(0), Replicate()}, {Shard(1), Replicate()}), "all_to_all;");
    expect(plan({Replicate(), Replicate()}, {Replicate(), Shard(0)}), "slice;");
    expect(plan({Replicate(), Replicate()}, {Partial(), Replicate()}), "zero;");
    expect(plan({Shard(0), Replicate()}, {Partial(), Replicate()}), "all_gather;zero;");
    // Nested shards of dim 0: the inner cut is undone before the outer one changes.
    expect(plan({Shard(0), Shard(0)}, {Replicate(), Shard(0)}), "all_gather;all_gather;slice;");
    return r;
  });
  CHECK(first_failure(reports) == "");
}

TEST_CASE("random factories give the same global tensor on every mesh and layout", "[dtensor][rng]") {
  const Dims shape{7, 5, 3};
  const PhiloxKey key{42, stream_for("w")};
  Tensor want_n = randn(shape, key), want_u = rand(shape, key);
  Tensor want_b = bernoulli(shape, 0.3, key), want_i = randint(-5, 9, shape, key);
  Tensor want_drop = dropout(ones(shape), 0.5, key);
  for (const auto& dims : test_meshes()) {
    auto reports = on_ranks(mesh_size(dims), [&](int) -> std::string {
      MeshPtr mesh = Mesh::world(dims);
      std::mt19937_64 gen(mesh->num_devices() * 7 + 3);
      for (int t = 0; t < 8; ++t) {
        Placements p = random_placements(gen, mesh->ndim(), shape.size(), false);
        if (!bitwise_equal(full_tensor(randn(shape, key, mesh, p)), want_n)) return "randn differs for " + p.str();
        if (!bitwise_equal(full_tensor(rand(shape, key, mesh, p)), want_u)) return "rand differs for " + p.str();
        if (!bitwise_equal(full_tensor(bernoulli(shape, 0.3, key, mesh, p)), want_b))
          return "bernoulli differs for " + p.str();
        if (!bitwise_equal(full_tensor(randint(-5, 9, shape, key, mesh, p)), want_i))
          return "randint differs for " + p.str();
        if (!bitwise_equal(full_tensor(dropout(ones(shape, mesh, p), 0.5, key)), want_drop))
          return "dropout mask differs for " + p.str();
        // A parameter initialised in place through its local piece.
        Tensor w = empty(shape, mesh, p);
        normal_(to_local(w), key, 0.0, 1.0, local_random_block(w));
        if (!bitwise_equal(full_tensor(w), want_n)) return "normal_ on the local piece differs for " + p.str();
      }
      return "";
    });
    INFO("mesh " << mesh_name(dims));
    CHECK(first_failure(reports) == "");
  }
}

TEST_CASE("from_local infers uneven global shapes; to_local and from_local are differentiable", "[dtensor]") {
  auto reports = on_ranks(3, [](int rank) -> std::string {
    MeshPtr mesh = Mesh::world({{"x", 3}});
    // Global 7 rows in ceil chunks: 3, 3, 1.
    const int64_t rows = rank < 2 ? 3 : 1;
    Tensor local = full({rows, 2}, double(rank + 1)).requires_grad_(true);
    Tensor d = from_local(local, mesh, {Shard(0)});
    if (d.shape() != Dims{7, 2}) return "global shape " + d.shape().str();
    Tensor loss = sum(d * 2.0);
    loss.backward();
    if (!local.grad().defined() || local.grad().shape() != local.shape()) return "no local gradient";
    if (!bitwise_equal(local.grad(), full({rows, 2}, 2.0))) return "wrong local gradient";
    // to_local: gradient wraps back with the tensor's placements.
    Tensor w = distribute_tensor(ones({6, 2}), mesh, {Shard(0)}).requires_grad_(true);
    Tensor piece = to_local(w);
    sum(piece * 3.0).backward();
    if (!w.grad().defined() || w.grad().placements() != Placements{Shard(0)}) return "to_local gradient layout";
    if (!bitwise_equal(full_tensor(w.grad()), full({6, 2}, 3.0))) return "to_local gradient values";
    return "";
  });
  CHECK(first_failure(reports) == "");
}

TEST_CASE("from_local rejects pieces that do not follow the ceil-division layout", "[dtensor]") {
  auto reports = on_ranks(2, [](int rank) -> std::string {
    MeshPtr mesh = Mesh::world({{"x", 2}});
    Tensor local = zeros({rank == 0 ? 1 : 3, 2});  // 4 rows would be 2 + 2
    try {
      from_local(local, mesh, {Shard(0)});
      return "accepted an uneven layout";
    } catch (const Error& e) {
      if (std::string(e.what()).find("does not match global shape [4, 2]") == std::string::npos) return e.what();
    }
    return "";
  });
  CHECK(first_failure(reports) == "");
}

TEST_CASE("gradients of replicated parameters come back replicated (all-reduced), sharded ones sharded", "[dtensor]") {
  auto reports = on_ranks(4, [](int) -> std::string {
    MeshPtr mesh = Mesh::world({{"dp", 2}, {"tp", 2}});
    Tensor w_full = uniform({6, 4}, 1), b_full = uniform({6}, 2), x_full = uniform({8, 4}, 3);
    // Reference.
    Tensor w0 = w_full.detach().requires_grad_(true), b0 = b_full.detach().requires_grad_(true);
    Tensor l0 = sum(gelu(linear(x_full, w0, b0)));
    l0.backward();
    // Data parallel over dp, column-parallel weight over tp.
    Tensor w = distribute_tensor(w_full, mesh, {Replicate(), Shard(0)}).requires_grad_(true);
    Tensor b = distribute_tensor(b_full, mesh, {Replicate(), Shard(0)}).requires_grad_(true);
    Tensor x = distribute_tensor(x_full, mesh, {Shard(0), Replicate()});
    Tensor y = linear(x, w, b);
    if (y.placements() != Placements{Shard(0), Shard(1)}) return "linear output " + y.placements().str();
    Tensor l = sum(gelu(y));
    if (l.placements() != Placements{Partial(), Partial()}) return "loss " + l.placements().str();
    if (std::abs(l.item<double>() - l0.item<double>()) > 1e-4) return "loss value";
    l.backward();
    if (w.grad().placements() != w.placements()) return "w grad " + w.grad().placements().str();
    if (b.grad().placements() != b.placements()) return "b grad " + b.grad().placements().str();
    if (!allclose(full_tensor(w.grad()), w0.grad())) return "w grad values";
    if (!allclose(full_tensor(b.grad()), b0.grad())) return "b grad values";
    return "";
  });
  CHECK(first_failure(reports) == "");
}

TEST_CASE("in-place ops on distributed tensors keep their layout", "[dtensor]") {
  auto reports = on_ranks(4, [](int) -> std::string {
    MeshPtr mesh = Mesh::world({{"dp", 2}, {"tp", 2}});
    Tensor full_a = uniform({5, 3}, 1), full_b = uniform({5, 3}, 2);
    Tensor a = distribute_tensor(full_a, mesh, {Shard(0), Partial()});
    Tensor b = distribute_tensor(full_b, mesh, {Replicate(), Shard(1)});
    a.add_(b);
    if (a.placements() != Placements{Shard(0), Partial()}) return "add_ changed the layout";
    if (!allclose(full_tensor(a), full_a + full_b)) return "add_ values";
    a.mul_(2.0);
    if (!allclose(full_tensor(a), (full_a + full_b) * 2.0)) return "mul_ scalar on Partial";
    a.add_(1.0);
    if (!allclose(full_tensor(a), (full_a + full_b) * 2.0 + 1.0)) return "add_ scalar on Partial";
    a.mul_(b);
    if (!allclose(full_tensor(a), ((full_a + full_b) * 2.0 + 1.0) * full_b)) return "mul_ tensor on Partial";
    a.fill_(3.0);
    if (!allclose(full_tensor(a), full({5, 3}, 3.0))) return "fill_ on Partial";
    a.copy_(full_b);
    if (!bitwise_equal(full_tensor(a), full_b)) return "copy_ from a plain tensor";
    Tensor z = zeros_like(a);
    if (z.placements() != a.placements() || !bitwise_equal(full_tensor(z), zeros({5, 3}))) return "zeros_like";
    Tensor o = ones_like(a);
    if (o.placements() != Placements{Shard(0), Replicate()} || !bitwise_equal(full_tensor(o), ones({5, 3})))
      return "ones_like of Partial";
    return "";
  });
  CHECK(first_failure(reports) == "");
}

// The batch cut over two mesh dims (dp and ep: [S(0), S(0)]) stays cut when
// [B, T, C] is flattened to [B T, C] (an MoE layer's tokens), as long as the
// pieces are equal; otherwise it is gathered, and the values are right
// either way.
TEST_CASE("reshape keeps a dim cut over two mesh dims when the pieces are equal", "[dtensor]") {
  auto reports = on_ranks(4, [](int) -> std::string {
    MeshPtr mesh = Mesh::world({{"dp", 2}, {"ep", 2}});
    for (int64_t b : {8, 6}) {
      Tensor full = arange(0.0, double(b * 3 * 2), 1.0).reshape({b, 3, 2});
      Tensor x = distribute_tensor(full, mesh, {Shard(0), Shard(0)});
      Tensor y = x.reshape({b * 3, 2});
      const Placements want = b % 4 == 0 ? Placements{Shard(0), Shard(0)} : Placements{Replicate(), Replicate()};
      if (y.placements() != want) return fmt::format(FMT_STRING("B={}: {} (want {})"), b, y.desc(), want);
      if (!bitwise_equal(full_tensor(y), full.reshape({b * 3, 2}))) return fmt::format(FMT_STRING("B={}: values"), b);
    }
    return "";
  });
  CHECK(first_failure(reports) == "");
}

TEST_CASE("item, to_vector and printing read the full tensor", "[dtensor]") {
  auto reports = on_ranks(2, [](int) -> std::string {
    MeshPtr mesh = Mesh::world({{"x", 2}});
    Tensor t = distribute_tensor(arange(0.0, 6.0, 1.0).reshape({3, 2}), mesh, {Shard(0)});
    if (sum(t).item<double>() != 15.0) return "item";
    if (t.to_vector<float>() != std::vector<float>{0, 1, 2, 3, 4, 5}) return "to_vector";
    std::string s = t.to_string();
    if (s.find("placements=[S(0)]") == std::string::npos || s.find("[0, 1, 2, 3, 4, 5]") == std::string::npos)
      return "to_string: " + s;
    return "";
  });
  CHECK(first_failure(reports) == "");
}

TEST_CASE("distributed errors name the op, shapes and placements", "[dtensor]") {
  auto reports = on_ranks(2, [](int) -> std::string {
    MeshPtr m1 = Mesh::world({{"x", 2}});
    MeshPtr m2 = Mesh::world({{"y", 2}});
    Tensor a = distribute_tensor(ones({4, 2}), m1, {Shard(0)});
    Tensor b = distribute_tensor(ones({4, 2}), m2, {Shard(0)});
    auto expect = [](const std::function<void()>& f, const std::string& needle) -> std::string {
      try {
        f();
      } catch (const Error& e) {
        return std::string(e.what()).find(needle) == std::string::npos ? std::string("message: ") + e.what() : "";
      }
      return "no error (expected '" + needle + "')";
    };
    std::string r;
    if (r.empty()) r = expect([&] { add(a, b); }, "different meshes");
    if (r.empty()) r = expect([&] { distribute_tensor(ones({2}), m1, {Shard(0), Shard(0)}); }, "one entry per dim");
    if (r.empty()) r = expect([&] { distribute_tensor(ones({2}), m1, {Shard(3)}); }, "outside a 1-D tensor");
    if (r.empty()) r = expect([&] { matmul(a, a); }, "cannot be multiplied");
    if (r.empty()) r = expect([&] { raw::local_of(a).defined() ? (void)a.raw_data() : (void)0; }, "is distributed");
    if (r.empty()) r = expect([&] { redistribute(ones({2}), {Replicate()}); }, "not distributed");
    if (r.empty()) r = expect([&] { ones({4}, m1, {Partial()}); }, "only meaningful for zeros/empty");
    return r;
  });
  CHECK(first_failure(reports) == "");
}

TEST_CASE("a one-device mesh needs no backend and behaves like plain tensors", "[dtensor]") {
  MeshPtr mesh = Mesh::single();
  Tensor x = distribute_tensor(uniform({4, 3}, 1), mesh, {Shard(1)}).requires_grad_(true);
  Tensor y = sum(softmax(x, 1) * 2.0);
  y.backward();
  Tensor x0 = uniform({4, 3}, 1).requires_grad_(true);
  Tensor y0 = sum(softmax(x0, 1) * 2.0);
  y0.backward();
  CHECK(y.item<double>() == Approx(y0.item<double>()).epsilon(1e-6));
  CHECK(allclose(full_tensor(x.grad()), x0.grad()));
}

TEST_CASE("sharding rules keep the Megatron layouts without communication", "[dtensor]") {
  auto reports = on_ranks(2, [](int) -> std::string {
    MeshPtr tp = Mesh::world({{"tp", 2}});
    Tensor x = distribute_tensor(uniform({2, 5, 8}, 1), tp, {Replicate()});
    Tensor w_col = distribute_tensor(uniform({6, 8}, 2), tp, {Shard(0)});  // column parallel [out, in]
    Tensor w_row = distribute_tensor(uniform({8, 6}, 3), tp, {Shard(1)});  // row parallel
    Tensor h = linear(x, w_col);
    if (h.placements() != Placements{Shard(2)}) return "column-parallel output " + h.placements().str();
    Tensor y = linear(gelu(h), w_row);
    if (y.placements() != Placements{Partial()}) return "row-parallel output " + y.placements().str();
    // Sequence parallel: norms keep a sequence shard.
    Tensor s = redistribute(y, {Shard(1)});
    Tensor n = layer_norm(s, {8});
    if (n.placements() != Placements{Shard(1)}) return "layer_norm on S(1): " + n.placements().str();
    // Heads sharded through attention: q/k/v [B, H, T, D] with H sharded stay sharded.
    Tensor q = distribute_tensor(uniform({1, 4, 3, 2}, 4), tp, {Shard(1)});
    AttentionOptions o;
    o.causal = true;
    Tensor a = scaled_dot_product_attention(q, q, q, o);
    if (a.placements() != Placements{Shard(1)}) return "attention output " + a.placements().str();
    // Vocabulary parallel embedding: a pending sum.
    Tensor emb = distribute_tensor(uniform({10, 4}, 5), tp, {Shard(0)});
    Tensor e = embedding(emb, tensor(std::vector<int64_t>{1, 7, 9}));
    if (e.placements() != Placements{Partial()}) return "vocab-parallel embedding " + e.placements().str();
    // Reduction over a sharded dim: pending sum; softmax along an unsharded dim keeps the shard.
    Tensor z = distribute_tensor(uniform({4, 6}, 6), tp, {Shard(0)});
    if (sum(z, {0}).placements() != Placements{Partial()}) return "sum over the shard";
    if (softmax(z, 1).placements() != Placements{Shard(0)}) return "softmax keeps rows sharded";
    return "";
  });
  CHECK(first_failure(reports) == "");
}

namespace {
// An op without a sharding rule: distributed inputs are replicated first.
struct NoRuleOp {
  static constexpr const char* kName = "test_no_rule";
  Tensor forward(const Tensor& x) {
    return detail::contiguous_raw(x);
  }
  std::vector<Tensor> backward(const GradContext&, std::vector<Tensor>& g) { return {g[0]}; }
};
}  // namespace

TEST_CASE("an op without a sharding rule runs on replicated inputs and is still right", "[dtensor]") {
  auto reports = on_ranks(3, [](int) -> std::string {
    MeshPtr mesh = Mesh::world({{"x", 3}});
    Tensor full = uniform({7, 2}, 9);
    Tensor x = distribute_tensor(full, mesh, {Shard(0)}).requires_grad_(true);
    Tensor y = call(NoRuleOp{}, x);
    if (y.placements() != Placements{Replicate()}) return "fallback output " + y.placements().str();
    if (!bitwise_equal(full_tensor(y), full)) return "fallback values";
    sum(y * 2.0).backward();
    if (x.grad().placements() != x.placements()) return "fallback gradient layout";
    if (!bitwise_equal(full_tensor(x.grad()), full_like(full, 2.0))) return "fallback gradient values";
    return "";
  });
  CHECK(first_failure(reports) == "");
}

// Context parallelism (docs/parallel.md): q, k, v cut along time over a
// "cp" mesh dim. The fused attention keeps the queries and the output cut,
// gathers k and v, balances the causal work (rank r computes segments r and
// 2W-1-r of 2W), and in bitwise mode gives the one-device output and
// gradients bit for bit (GQA and dropout included), whether the segments are
// whole runs of the canonical chunks (their dk/dv sums finish the tree) or
// not (time is gathered).
TEST_CASE("context parallel attention: sequence-local queries, the one-device bits", "[dtensor][cp]") {
  struct Case {
    int ranks;
    int64_t T;
    bool local;  // the output stays cut along time (else gathered: pieces not on chunk boundaries)
  };
  // One group of heads (the default for small layers), and one kv head per
  // group (k and v streamed head by head).
  for (int64_t group_bytes : {int64_t(16) << 20, int64_t(1)})
  for (Case c : {Case{2, 64, true}, Case{4, 64, true}, Case{4, 60, false}}) {
    INFO("cp=" << c.ranks << " T=" << c.T << " group bytes " << group_bytes);
    const int64_t previous = set_context_parallel_group_bytes(group_bytes);
    const int64_t B = 2, H = 4, Hkv = 2, D = 8;
    AttentionOptions o;
    o.causal = true;
    o.dropout_p = 0.2;
    o.dropout_key = PhiloxKey{3, 9};
    auto inputs = [&] {
      return std::vector<Tensor>{uniform({B, c.T, H, D}, 1, -2, 2).transpose(1, 2),
                                 uniform({B, c.T, Hkv, D}, 2, -2, 2).transpose(1, 2),
                                 uniform({B, c.T, Hkv, D}, 3).transpose(1, 2), uniform({B, H, c.T, D}, 4)};
    };
    // One device.
    std::vector<Tensor> ref;
    {
      numerics::BitwiseGuard bitwise(true);
      std::vector<Tensor> in = inputs();
      for (int i = 0; i < 3; ++i) in[i] = in[i].detach().requires_grad_();
      Tensor y = scaled_dot_product_attention(in[0], in[1], in[2], o);
      sum(y * in[3]).backward();
      ref = {y, in[0].grad(), in[1].grad(), in[2].grad()};
    }
    auto reports = on_ranks(c.ranks, [&](int) -> std::string {
      numerics::BitwiseGuard bitwise(true);
      MeshPtr mesh = Mesh::world({{"cp", c.ranks}});
      std::vector<Tensor> in = inputs();
      for (int i = 0; i < 4; ++i) in[i] = distribute_tensor(in[i], mesh, {Shard(2)});
      for (int i = 0; i < 3; ++i) in[i] = in[i].detach().requires_grad_();
      const ContextParallelAttentionCount before = context_parallel_attention_count();
      Tensor y = scaled_dot_product_attention(in[0], in[1], in[2], o);
      const ContextParallelAttentionCount after = context_parallel_attention_count();
      if (c.local && after.balanced != before.balanced + 1) return std::string("not load-balanced");
      const Placements want = c.local ? Placements{Shard(2)} : Placements{Replicate()};
      if (y.placements() != want) return "output " + y.placements().str() + ", expected " + want.str();
      sum(y * in[3]).backward();
      const std::vector<Tensor> got = {y, in[0].grad(), in[1].grad(), in[2].grad()};
      const char* names[] = {"output", "dq", "dk", "dv"};
      for (int i = 0; i < 4; ++i)
        if (!bitwise_equal(full_tensor(got[i]).contiguous(), ref[i].contiguous()))
          return std::string(names[i]) + " differs from one device";
      return "";
    });
    set_context_parallel_group_bytes(previous);
    CHECK(first_failure(reports) == "");
  }
  CHECK_THROWS_WITH(set_context_parallel_group_bytes(0), Catch::Contains("positive byte count, got 0"));
}

// Fast mode: the same layouts within float tolerance, load-balanced when the
// sequence splits into 2W segments (T = 64) and one contiguous piece per rank
// otherwise (T = 66 on cp=2: 66 = 2 x 33 but not 4 x 16.5).
TEST_CASE("context parallel attention in fast mode: balanced or contiguous pieces, the one-device values", "[dtensor][cp]") {
  for (int64_t T : {64, 66}) {
    INFO("T=" << T);
    const int64_t B = 2, H = 4, Hkv = 2, D = 8;
    auto inputs = [&] {
      return std::vector<Tensor>{uniform({B, H, T, D}, 1, -2, 2), uniform({B, Hkv, T, D}, 2, -2, 2),
                                 uniform({B, Hkv, T, D}, 3), uniform({B, H, T, D}, 4)};
    };
    std::vector<Tensor> ref;
    {
      std::vector<Tensor> in = inputs();
      for (int i = 0; i < 3; ++i) in[i] = in[i].detach().requires_grad_();
      Tensor y = scaled_dot_product_attention(in[0], in[1], in[2]);
      sum(y * in[3]).backward();
      ref = {y, in[0].grad(), in[1].grad(), in[2].grad()};
    }
    auto reports = on_ranks(2, [&](int) -> std::string {
      MeshPtr mesh = Mesh::world({{"cp", 2}});
      std::vector<Tensor> in = inputs();
      for (int i = 0; i < 4; ++i) in[i] = distribute_tensor(in[i], mesh, {Shard(2)});
      for (int i = 0; i < 3; ++i) in[i] = in[i].detach().requires_grad_();
      const ContextParallelAttentionCount before = context_parallel_attention_count();
      Tensor y = scaled_dot_product_attention(in[0], in[1], in[2]);
      const ContextParallelAttentionCount after = context_parallel_attention_count();
      if (after.local != before.local + 1) return std::string("queries not kept local");
      if ((after.balanced == before.balanced + 1) != (T == 64)) return std::string("balanced when it should not be, or not");
      if (y.placements() != Placements{Shard(2)}) return "output " + y.placements().str();
      sum(y * in[3]).backward();
      const std::vector<Tensor> got = {y, in[0].grad(), in[1].grad(), in[2].grad()};
      for (int i = 0; i < 4; ++i)
        if (!allclose(full_tensor(got[i]), ref[i], 1e-5, 1e-6)) return "value " + std::to_string(i) + " differs";
      return "";
    });
    CHECK(first_failure(reports) == "");
  }
}

// What a balanced cp layer keeps for its backward is its own piece of k and
// v: the whole k and v are gathered one group of heads at a time, in the
// forward and again in the backward, and dropped. So the bytes alive after
// the forward stay below the gathered k and v alone (they were above it
// while the gathered k and v were saved), in both modes, and the backward
// still gives the one-device gradients.
TEST_CASE("context parallel attention saves its piece of k and v, not the gathered whole", "[dtensor][cp]") {
  for (int64_t group_bytes : {int64_t(16) << 20, int64_t(1)})
  for (bool bitwise : {false, true}) {
    INFO("bitwise=" << bitwise << " group bytes " << group_bytes);
    const int64_t previous = set_context_parallel_group_bytes(group_bytes);
    const int64_t B = 1, H = 4, T = 512, D = 32;
    const int64_t gathered_kv = 2 * B * H * T * D * int64_t(sizeof(float));  // k and v whole, per rank
    auto inputs = [&] {
      return std::vector<Tensor>{uniform({B, H, T, D}, 1, -2, 2), uniform({B, H, T, D}, 2, -2, 2),
                                 uniform({B, H, T, D}, 3), uniform({B, H, T, D}, 4)};
    };
    std::vector<Tensor> ref;
    {
      numerics::BitwiseGuard guard(bitwise);
      std::vector<Tensor> in = inputs();
      for (int i = 0; i < 3; ++i) in[i] = in[i].detach().requires_grad_();
      sum(scaled_dot_product_attention(in[0], in[1], in[2]) * in[3]).backward();
      ref = {in[0].grad(), in[1].grad(), in[2].grad()};
    }
    std::atomic<int64_t> before{0}, after{0};
    auto reports = on_ranks(2, [&](int rank) -> std::string {
      numerics::BitwiseGuard guard(bitwise);
      MeshPtr mesh = Mesh::world({{"cp", 2}});
      std::vector<Tensor> in = inputs();
      for (int i = 0; i < 4; ++i) in[i] = distribute_tensor(in[i], mesh, {Shard(2)});
      for (int i = 0; i < 3; ++i) in[i] = in[i].detach().requires_grad_();
      mesh->comm(0)->barrier();
      if (rank == 0) before = cpu_allocator()->stats().current_bytes;
      mesh->comm(0)->barrier();
      Tensor y = scaled_dot_product_attention(in[0], in[1], in[2]);
      mesh->comm(0)->barrier();
      if (rank == 0) after = cpu_allocator()->stats().current_bytes;
      mesh->comm(0)->barrier();
      sum(y * in[3]).backward();
      for (int i = 0; i < 3; ++i)
        if (bitwise ? !bitwise_equal(full_tensor(in[i].grad()).contiguous(), ref[size_t(i)].contiguous())
                    : !allclose(full_tensor(in[i].grad()), ref[size_t(i)], 1e-5, 1e-6))
          return "gradient " + std::to_string(i) + " differs from one device";
      return "";
    });
    set_context_parallel_group_bytes(previous);
    CHECK(first_failure(reports) == "");
    // Both ranks' forwards: each keeps its output, its query rows and stats.
    CHECK(after - before < 2 * gathered_kv);
  }
}
