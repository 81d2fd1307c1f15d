// Every op of the foundation on distributed tensors: random placements
// (Replicate, Shard of any dim, Partial) of uneven shapes on 1-D, 2-D and 3-D
// meshes with the local backend. full_tensor() of each output equals the
// single-device result — bit for bit where no cross-shard reduction is
// involved, within float tolerance otherwise — and so do the gradients, which
// come back with the placements of their inputs. The cases are in
// test/dtensor/cases.cc (shared with the MPI run, test_dtensor_mpi).
// The einsum rule (dtensor::einsum, matmul's) is also checked plan by plan.
#include <catch2/catch.hpp>

#include "dtensor/sharding.h"
#include "runtime/numerics.h"
#include "test/dtensor/cases.h"
#include "test/util/dist.h"

using namespace tessel;
using namespace tessel::testing;

namespace {

void check_group(const std::string& title, int trials = 3) {
  for (const OpGroup& g : dtensor_op_groups()) {
    if (g.title != title) continue;
    for (const OpCase& c : g.cases) {
      for (const auto& dims : test_meshes()) {
        for (int t = 0; t < trials; ++t) {
          const uint64_t seed = 1000 + 31 * uint64_t(t) + std::hash<std::string>()(c.name) % 1000;
          std::string failure;
          try {
            failure = first_failure(on_ranks(mesh_size(dims), [&](int) { return run_op_case(c, Mesh::world(dims), seed); }));
          } catch (const std::exception& e) {
            failure = std::string("threw: ") + e.what();
          }
          INFO(c.name << " on mesh " << mesh_name(dims) << ", trial " << t);
          CHECK(failure == "");
        }
      }
    }
    return;
  }
  FAIL("no op group " << title);
}

}  // namespace

TEST_CASE("pointwise ops with broadcasting", "[dtensor]") { check_group("pointwise ops with broadcasting"); }
TEST_CASE("reductions (sum, mean, var, amax, argmax)", "[dtensor]") { check_group("reductions (sum, mean, var, amax, argmax)"); }
TEST_CASE("matmul: batch, rows, columns and the contracted dim sharded", "[dtensor]") { check_group("matmul: batch, rows, columns and the contracted dim sharded"); }
TEST_CASE("softmax, log_softmax and norms, including over sharded dims", "[dtensor]") { check_group("softmax, log_softmax and norms, including over sharded dims"); }
TEST_CASE("views and reshapes of sharded dims", "[dtensor]") { check_group("views and reshapes of sharded dims"); }
TEST_CASE("cat, stack, split, chunk", "[dtensor]") { check_group("cat, stack, split, chunk"); }
TEST_CASE("embedding (vocabulary-parallel too), gather, index ops", "[dtensor]") { check_group("embedding (vocabulary-parallel too), gather, index ops"); }
TEST_CASE("cross-entropy (vocabulary-parallel, token-parallel, ignore_index, smoothing)", "[dtensor]") { check_group("cross-entropy (vocabulary-parallel, token-parallel, ignore_index, smoothing)"); }
TEST_CASE("triangles, rotary embeddings, sort/topk", "[dtensor]") { check_group("triangles, rotary embeddings, sort/topk"); }
TEST_CASE("attention with sharded heads (causal, GQA)", "[dtensor]") { check_group("attention with sharded heads (causal, GQA)"); }
TEST_CASE("random shapes", "[dtensor]") { check_group("random shapes", 6); }

// The einsum rule, plan by plan (the op groups above check that its plans
// compute the right values; these pin which plan it picks).
namespace {

using Catch::Matchers::Contains;

// "A x B -> out", e.g. "[S(0), R] x [R, S(1)] -> [S(0), S(1)]".
std::string plan_str(const ShardingPlan& p) {
  std::string s;
  for (size_t i = 0; i < p.in.size(); ++i) s += (i ? " x " : "") + p.in[i].str();
  return s + " -> " + p.out[0].str();
}

ShardingContext einsum_ctx(const MeshPtr& mesh, const std::vector<Dims>& shapes, const std::vector<Placements>& in,
                           const Dims& out, bool grad = false) {
  ShardingContext ctx;
  ctx.op = "test_einsum";
  ctx.mesh = mesh.get();
  ctx.grad = grad;
  for (size_t i = 0; i < shapes.size(); ++i) {
    TensorSpec t;
    t.defined = t.distributed = true;
    t.shape = shapes[i];
    t.placements = in[i];
    ctx.in.push_back(t);
  }
  TensorSpec o;
  o.defined = true;
  o.shape = out;
  ctx.out.push_back(o);
  return ctx;
}

// The error `f` throws ("" if none).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("einsum specs: parsed per operand; a malformed spec is an error naming it", "[dtensor]") {
  dtensor::EinsumSpec s = dtensor::parse_einsum("mk,kn->mn");
  CHECK(s.in == std::vector<std::string>{"mk", "kn"});
  CHECK(s.out == "mn");
  s = dtensor::parse_einsum("...mk,...kn->...mn");
  CHECK(s.in == std::vector<std::string>{"...mk", "...kn"});
  CHECK(s.out == "...mn");
  CHECK(dtensor::parse_einsum("k,k->").out == "");  // a dot product: everything contracted

  const std::pair<const char*, const char*> bad[] = {
      {"mk,kn", "exactly one \"->\""},
      {"mk,kn->mn->m", "exactly one \"->\""},
      {"m1,kn->mn", "'1' is not a letter"},
      {"mk, kn->mn", "' ' is not a letter"},
      {"mm,mn->mn", "letter 'm' repeats"},
      {"m...k,kn->mn", "may only open an operand"},
      {"mk,kn->mz", "output letter 'z' is in no input"},
      {"...mk,kn->mn", "an input has \"...\" but the output does not"},
      {"mk,kn->...mn", "the output has \"...\" but no input does"},
  };
  for (const auto& [spec, why] : bad) {
    INFO(spec);
    const std::string e = error_of([&] { dtensor::parse_einsum(spec, "matmul"); });
    CHECK_THAT(e, Contains(std::string("matmul: einsum spec \"") + spec + "\"") && Contains(why));
  }
}

TEST_CASE("einsum rule: inputs' shards are followed, contractions pend, the larger input wins", "[dtensor]") {
  const auto reports = on_ranks(4, [](int) -> std::string {
    MeshPtr mesh = Mesh::world({{"x", 2}, {"y", 2}});
    RankReport r;
    auto expect = [&](const char* spec, const std::vector<Dims>& shapes, const std::vector<Placements>& in,
                      const Dims& out, const std::string& want) {
      const std::string got = plan_str(dtensor::einsum(einsum_ctx(mesh, shapes, in, out), spec));
      r.expect(got == want, TESSEL_FORMAT("{} on {}: got {}, want {}", spec, in, got, want));
    };
    const Placements R2{Replicate(), Replicate()};
    // Rows of a on x, columns of b on y: the output is sharded both ways, nothing moves.
    expect("mk,kn->mn", {{8, 6}, {6, 4}}, {{Shard(0), Replicate()}, {Replicate(), Shard(1)}}, {8, 4},
           "[S(0), R] x [R, S(1)] -> [S(0), S(1)]");
    // K sharded in a: b is sliced to match (free) and the output is a pending sum.
    expect("mk,kn->mn", {{8, 6}, {6, 4}}, {{Shard(1), Replicate()}, R2}, {8, 4}, "[S(1), R] x [S(0), R] -> [P(sum), R]");
    // a wants rows, b columns on the same mesh dim: the larger input keeps its layout.
    expect("mk,kn->mn", {{8, 6}, {6, 4}}, {{Shard(0), Replicate()}, {Shard(1), Replicate()}}, {8, 4},
           "[S(0), R] x [R, R] -> [S(0), R]");
    expect("mk,kn->mn", {{2, 6}, {6, 4}}, {{Shard(0), Replicate()}, {Shard(1), Replicate()}}, {2, 4},
           "[R, R] x [S(1), R] -> [S(1), R]");
    // Equal sizes: the earlier candidate (the output's first letter) wins.
    expect("mk,kn->mn", {{4, 6}, {6, 4}}, {{Shard(0), Replicate()}, {Shard(1), Replicate()}}, {4, 4},
           "[S(0), R] x [R, R] -> [S(0), R]");
    // A Partial(sum) input stays pending through the linear op; two cannot both.
    expect("mk,kn->mn", {{8, 6}, {6, 4}}, {{Partial(), Replicate()}, R2}, {8, 4}, "[P(sum), R] x [R, R] -> [P(sum), R]");
    expect("mk,kn->mn", {{8, 6}, {6, 4}}, {{Partial(), Replicate()}, {Partial(), Replicate()}}, {8, 4},
           "[P(sum), R] x [R, R] -> [P(sum), R]");
    // Nothing sharded: nothing is sliced.
    expect("mk,kn->mn", {{8, 6}, {6, 4}}, {R2, R2}, {8, 4}, "[R, R] x [R, R] -> [R, R]");
    // A size-1 dim is never a candidate.
    expect("mk,kn->mn", {{1, 6}, {6, 4}}, {{Shard(0), Replicate()}, R2}, {1, 4}, "[R, R] x [R, R] -> [R, R]");
    // Batch broadcast: a shared 2-D b stays Replicate where a's batch dim is sharded.
    expect("...mk,...kn->...mn", {{3, 5, 6}, {6, 4}}, {{Shard(0), Shard(2)}, R2}, {3, 5, 4},
           "[S(0), S(2)] x [R, S(0)] -> [S(0), P(sum)]");
    // Leading batch dims in both: each batch dim follows whichever input shards it.
    expect("...mk,...kn->...mn", {{2, 3, 5, 4}, {2, 3, 4, 6}}, {{Shard(1), Replicate()}, {Shard(1), Shard(0)}},
           {2, 3, 5, 6}, "[S(1), S(0)] x [S(1), S(0)] -> [S(1), S(0)]");
    expect("bmk,bkn->bmn", {{3, 5, 4}, {3, 4, 6}}, {{Replicate(), Shard(0)}, {Shard(0), Replicate()}}, {3, 5, 6},
           "[S(0), S(0)] x [S(0), S(0)] -> [S(0), S(0)]");
    // A size-1 input dim broadcasts: that input lacks the letter.
    expect("bmk,bkn->bmn", {{3, 5, 4}, {1, 4, 6}}, {{Shard(0), Replicate()}, R2}, {3, 5, 6},
           "[S(0), R] x [R, R] -> [S(0), R]");
    return r.str();
  });
  CHECK(first_failure(reports) == "");
}

TEST_CASE("einsum rule, bitwise mode: no Partial input, no inexact reduction, the pieces' chunk counts",
          "[dtensor][bitwise]") {
  numerics::ChunksGuard v4(4);  // V is global (a guard per rank thread would restore it under the others)
  const auto reports = on_ranks(2, [](int) -> std::string {
    numerics::BitwiseGuard on(true);  // per thread
    MeshPtr mesh = Mesh::world({{"x", 2}});
    RankReport r;
    auto expect = [&](const char* spec, const std::vector<Dims>& shapes, const std::vector<Placements>& in,
                      const Dims& out, bool grad, const std::string& want, const std::vector<int>& want_chunks) {
      std::vector<int> chunks;
      const std::string got = plan_str(dtensor::einsum(einsum_ctx(mesh, shapes, in, out, grad), spec, &chunks));
      r.expect(got == want && chunks == want_chunks,
               TESSEL_FORMAT("{} on {} (grad {}): got {} chunks {}, want {} chunks {}", spec, in, grad, got, chunks,
                             want, want_chunks));
    };
    // K = 8 over 2 pieces, V = 4: each piece owns 2 whole canonical chunks.
    expect("mk,kn->mn", {{4, 8}, {8, 3}}, {{Shard(1)}, {Replicate()}}, {4, 3}, true, "[S(1)] x [S(0)] -> [P(sum)]",
           {2, 4, 4});
    // K = 6: the pieces [0, 3) and [3, 6) are not runs of the chunks [0, 2), [2, 4), ... -- gathered.
    expect("mk,kn->mn", {{4, 6}, {6, 3}}, {{Shard(1)}, {Replicate()}}, {4, 3}, true, "[R] x [R] -> [R]", {4, 4, 4});
    // N = 6 cut: a's gradient (over N) would be inexact -- only when there is a backward.
    expect("mk,kn->mn", {{4, 8}, {8, 6}}, {{Replicate()}, {Shard(1)}}, {4, 6}, true, "[R] x [R] -> [R]", {4, 4, 4});
    expect("mk,kn->mn", {{4, 8}, {8, 6}}, {{Replicate()}, {Shard(1)}}, {4, 6}, false, "[R] x [S(1)] -> [S(1)]",
           {4, 0, 0});
    // A shared b's gradient sums over every row of a (batch dims and M,
    // flattened): 4 x 2 rows split on the batch dim give runs of 2 chunks.
    expect("...mk,...kn->...mn", {{4, 2, 8}, {8, 3}}, {{Shard(0)}, {Replicate()}}, {4, 2, 3}, true,
           "[S(0)] x [R] -> [S(0)]", {4, 4, 2});
    // A Partial input is reduced first (the products do not commute with the pending sum).
    expect("mk,kn->mn", {{4, 8}, {8, 3}}, {{Partial()}, {Replicate()}}, {4, 3}, true, "[R] x [R] -> [R]", {4, 4, 4});
    return r.str();
  });
  CHECK(first_failure(reports) == "");
}

TEST_CASE("einsum rule: a spec that does not fit the operands is an error naming the spec and shapes", "[dtensor]") {
  const auto reports = on_ranks(2, [](int) -> std::string {
    MeshPtr mesh = Mesh::world({{"x", 2}});
    RankReport r;
    auto expect = [&](const char* spec, const std::vector<Dims>& shapes, const Dims& out, const std::string& needle) {
      std::vector<Placements> in(shapes.size(), Placements{Replicate()});
      const std::string e = error_of([&] { dtensor::einsum(einsum_ctx(mesh, shapes, in, out), spec); });
      r.expect(e.find(std::string("test_einsum: einsum spec \"") + spec + "\"") != std::string::npos &&
                   e.find(needle) != std::string::npos,
               TESSEL_FORMAT("{}: error \"{}\", want one containing \"{}\"", spec, e, needle));
    };
    expect("mk,kn->mn", {{2, 4, 6}, {6, 3}}, {2, 4, 3}, "input 0 \"mk\" names 2 dim(s) but has shape [2, 4, 6]");
    expect("mk->mk", {{4, 6}, {6, 3}}, {4, 3}, "has 1 input(s) and one output; the op has 2 and 1");
    expect("mk,kn->mn", {{4, 6}, {5, 3}}, {4, 3}, "letter k has sizes 6 and 5");
    expect("mk,kn->mn", {{4, 6}, {6, 3}}, {4, 2}, "the output has shape [4, 2]");
    return r.str();
  });
  CHECK(first_failure(reports) == "");
}
