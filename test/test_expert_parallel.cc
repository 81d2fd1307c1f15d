// Expert parallelism (nn/parallel/expert_parallel.h): the ShardOn placement
// expert weights live in, the differentiable all_to_all_v, and nn::MoE laid
// out over an "ep" mesh dim (with dp and tp) against the single-device MoE —
// outputs, gradients, counts, the load-balancing loss and capacity drops —
// plus the errors. Ranks are threads (the local backend).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "autograd/api.h"
#include "dtensor/ops.h"
#include "nn/nn.h"
#include "nn/parallel/expert_parallel.h"
#include "nn/parallel/parallelize.h"
#include "runtime/cost.h"
#include "test/ep/cases.h"
#include "test/util/dist.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

// ---- ShardOn ------------------------------------------------------------------------------

TEST_CASE("ShardOn: the owner holds everything, the others empty pieces") {
  const Dims mesh_shape{3};
  for (int owner = 0; owner < 3; ++owner) {
    for (int c = 0; c < 3; ++c) {
      LocalGeometry g = local_geometry(Dims{5, 3}, mesh_shape, Placements{ShardOn(0, owner)}, &c);
      CHECK(g.shape == (c == owner ? Dims{5, 3} : Dims{0, 3}));
    }
  }
  CHECK(ShardOn(1, 2).str() == "S(1)@2");
  CHECK(ShardOn(0, 1) != Shard(0));
  CHECK(ShardOn(0, 1) != ShardOn(0, 0));
  CHECK(ShardOn(0, 1).is_shard(0));
  CHECK(ShardOn(0, 1).is_owned());
  CHECK_FALSE(Shard(0).is_owned());
}

TEST_CASE("ShardOn: redistribution to and from every placement, pointwise ops and sums keep it") {
  for (auto dims : std::vector<std::vector<Mesh::DimSpec>>{{{"x", 3}}, {{"dp", 2}, {"ep", 2}}}) {
    const int n = mesh_size(dims);
    const Tensor full = uniform({5, 4}, 11);
    auto reports = on_ranks(n, [&](int) -> std::string {
      MeshPtr mesh = Mesh::world(dims);
      const int last = mesh->ndim() - 1;
      const int64_t k = mesh->size(last);
      std::string bad;
      auto on_last = [&](Placement p) {
        Placements ps = Placements::replicated(mesh->ndim());
        ps[last] = p;
        if (mesh->ndim() > 1) ps[0] = Shard(1);  // another dim cuts another tensor dim
        return ps;
      };
      for (int owner = 0; owner < k; ++owner) {
        const Placements own = on_last(ShardOn(0, owner));
        Tensor t = distribute_tensor(full, mesh, own);
        const bool mine = mesh->coordinate(last) == owner;
        if (raw::local_of(t).size(0) != (mine ? 5 : 0)) bad += "piece " + raw::local_of(t).desc() + "; ";
        if (!bitwise_equal(full_tensor(t), full)) bad += "gather from " + own.str() + "; ";
        for (Placement p : {Shard(0), Shard(1), Replicate(), ShardOn(0, int((owner + 1) % k)), ShardOn(1, owner)}) {
          Tensor u = redistribute(t, on_last(p));
          Tensor back = redistribute(u, own);
          if (!bitwise_equal(full_tensor(u), full) || !bitwise_equal(raw::local_of(back), raw::local_of(t)))
            bad += own.str() + " <-> " + on_last(p).str() + "; ";
        }
        // Partial -> ShardOn: a reduce-scatter onto the owner.
        const Placements base = on_last(Replicate());
        Placements pp = base;
        pp[last] = Partial();
        Tensor rep = raw::local_of(distribute_tensor(full, mesh, base));
        Tensor part = from_local(mesh->coordinate(last) == 0 ? rep.clone() : zeros(rep.shape()), mesh, pp, Dims{5, 4});
        Tensor scattered = redistribute(part, own);
        if (!bitwise_equal(full_tensor(scattered), full)) bad += "Partial -> " + own.str() + "; ";
        // Pointwise ops and reductions keep the owner: no communication, the same pieces.
        Tensor s = add(t, mul(t, 2.0));
        if (s.placements() != own) bad += "add gives " + s.placements().str() + "; ";
        if (!allclose(full_tensor(s), mul(full, 3.0))) bad += "add values; ";
        Tensor r1 = sum(t, {1});
        if (r1.placements()[last] != ShardOn(0, owner)) bad += "sum(1) gives " + r1.placements().str() + "; ";
        Tensor r0 = sum(t, {0});
        if (!r0.placements()[last].is_partial()) bad += "sum(0) gives " + r0.placements().str() + "; ";
        if (!allclose(full_tensor(r0), sum(full, {0}))) bad += "sum(0) values; ";
        // In-place accumulation (as into a gradient) keeps the placement.
        Tensor acc = t.clone();
        acc.add_(t);
        if (acc.placements() != own || !allclose(full_tensor(acc), mul(full, 2.0))) bad += "add_; ";
      }
      return bad;
    });
    INFO(mesh_name(dims));
    CHECK(first_failure(reports) == "");
  }
}

// ---- all_to_all_v -----------------------------------------------------------------------

TEST_CASE("all_to_all_v: rows reach their ranks; the backward is the reverse exchange") {
  for (int n : {1, 2, 3, 4}) {
    auto reports = on_ranks(n, [&](int r) { return all_to_all_case(r, n); });
    INFO(n << " ranks");
    CHECK(first_failure(reports) == "");
  }
}

// ---- the MoE layer ----------------------------------------------------------------------

namespace {

using Holder = MoEHolder;
nn::MoEConfig moe_config(int64_t E, int64_t k, double capacity = 0) { return moe_test_config(E, k, capacity); }
using Layout = EpLayout;

// The single-device outcome, then the same model parallelized on each layout.
void check_layouts(const nn::MoEConfig& cfg, const Dims& xshape, const std::vector<Layout>& layouts,
                   const EpNumerics& numerics = {}) {
  const EpOutcome ref = ep_reference(cfg, xshape, numerics);
  for (Layout l : layouts) {
    l.numerics = numerics;
    auto reports = on_ranks(mesh_size(l.mesh), [&](int) { return ep_case(cfg, xshape, l, ref); });
    INFO(mesh_name(l.mesh) << (l.shard_input ? " tokens sharded" : " tokens replicated") << ", capacity factor "
                           << cfg.capacity_factor << ", top-" << cfg.top_k << (numerics.bitwise ? ", bitwise" : "")
                           << (numerics.compute ? std::string(", autocast ") + dtype_name(*numerics.compute) : ""));
    CHECK(first_failure(reports) == "");
  }
}

}  // namespace

TEST_CASE("Expert-parallel MoE equals the single-device MoE (outputs, gradients, counts, aux loss)") {
  const std::vector<Layout> layouts = {
      {{{"ep", 2}}, false, true},
      {{{"ep", 4}}, false, true},
      {{{"ep", 2}}, false, false},
      {{{"dp", 2}, {"ep", 2}}, false, true},
      {{{"dp", 2}, {"ep", 2}}, false, false},
      {{{"ep", 2}, {"dp", 2}}, false, true},
      {{{"ep", 2}, {"tp", 2}}, true, true},
      {{{"dp", 2}}, false, true},  // no ep dim: every rank runs every expert on its own tokens
      {{{"dp", 4}}, false, true},
      {{{"dp", 2}, {"tp", 2}}, true, true},
  };
  SECTION("top-2 of 4") { check_layouts(moe_config(4, 2), {4, 6, 8}, layouts); }
  SECTION("top-1 of 8, experts idle") { check_layouts(moe_config(8, 1), {2, 3, 8}, layouts); }
  SECTION("fewer tokens than ranks: empty pieces") {
    check_layouts(moe_config(4, 2), {1, 3, 8}, {{{{"ep", 4}}, false, true}, {{{"dp", 2}, {"ep", 2}}, false, true}});
    check_layouts(moe_config(4, 2), {1, 1, 8}, {{{{"ep", 2}}, false, false}, {{{"ep", 2}, {"tp", 2}}, true, false}});
  }
}

namespace {

// Token by token in double: top-k by a stable sort, renormalised weights,
// and the capacity rule written out: expert e keeps its first `cap` slots in
// token order.
std::vector<double> naive_with_drops(nn::MoE& m, const Tensor& x2d, double cf, std::vector<int64_t>& dropped) {
  const int64_t N = x2d.size(0), C = m.config.dim, E = m.config.num_experts, K = m.config.top_k;
  const int64_t cap = int64_t(std::ceil(cf * double(N * K) / double(E)));
  auto xs = x2d.to_vector<double>();
  auto wg = m.gate->weight.to_vector<double>();
  std::vector<double> out(size_t(N * C), 0.0);
  std::vector<int64_t> taken(size_t(E), 0);
  dropped.assign(size_t(E), 0);
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> p(size_t(E), 0.0);
    double mx = -INFINITY, z = 0;
    for (int64_t e = 0; e < E; ++e) {
      double s = 0;
      for (int64_t c = 0; c < C; ++c) s += xs[size_t(n * C + c)] * wg[size_t(e * C + c)];
      p[size_t(e)] = s;
      mx = std::max(mx, s);
    }
    for (auto& v : p) z += (v = std::exp(v - mx));
    std::vector<int64_t> order(static_cast<size_t>(E), 0);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[size_t(a)] > p[size_t(b)]; });
    double wsum = 0;
    for (int64_t j = 0; j < K; ++j) wsum += p[size_t(order[size_t(j)])];
    for (int64_t j = 0; j < K; ++j) {
      const int64_t e = order[size_t(j)];
      if (taken[size_t(e)]++ >= cap) {
        ++dropped[size_t(e)];
        continue;
      }
      auto y = m.expert(e).forward(x2d.narrow(0, n, 1)).to_vector<double>();
      for (int64_t c = 0; c < C; ++c) out[size_t(n * C + c)] += p[size_t(e)] / wsum * y[size_t(c)];
    }
  }
  return out;
}

}  // namespace

TEST_CASE("Capacity: slots beyond an expert's capacity are dropped in token order and counted") {
  for (double cf : {0.5, 0.75, 1.0}) {
    auto m = nn::make_model<nn::MoE>(moe_config(4, 2, cf));
    m->reset_parameters(3);
    Tensor x = uniform({3, 8, 8}, 4, -2, 2);
    Tensor y = m->forward(x);
    std::vector<int64_t> want_dropped;
    auto want = naive_with_drops(*m, x.reshape({24, 8}), cf, want_dropped);
    INFO("capacity factor " << cf);
    CHECK(m->last_dropped() == want_dropped);
    CHECK(m->last_dropped_tokens() == std::accumulate(want_dropped.begin(), want_dropped.end(), int64_t(0)));
    auto got = y.to_vector<double>();
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
    CHECK(worst < 2e-6);
    if (cf == 0.5) CHECK(m->last_dropped_tokens() > 0);
  }
  // A capacity of at least every slot drops nothing and changes no bit.
  auto a = nn::make_model<nn::MoE>(moe_config(4, 2));
  auto b = nn::make_model<nn::MoE>(moe_config(4, 2, 2.0));  // capacity = N: all slots fit
  a->reset_parameters(3);
  b->reset_parameters(3);
  Tensor x = uniform({3, 8, 8}, 4, -2, 2);
  CHECK(bitwise_equal(a->forward(x), b->forward(x)));
  CHECK(b->last_dropped_tokens() == 0);
  CHECK(nn::expert_capacity(0, 100, 2, 4) == std::numeric_limits<int64_t>::max());
  CHECK(nn::expert_capacity(1.0, 24, 2, 4) == 12);
  CHECK(nn::expert_capacity(1.1, 24, 2, 4) == 14);  // ceil(13.2)
  CHECK_THROWS_WITH(b->set_capacity_factor(-1), Catch::Contains("capacity_factor must be a finite number >= 0"));
}

TEST_CASE("Capacity under expert parallelism drops the single-device slots (global token order)") {
  const std::vector<Layout> layouts = {
      {{{"ep", 2}}, false, true},
      {{{"dp", 2}, {"ep", 2}}, false, true},
      {{{"ep", 4}}, false, true},
      {{{"dp", 2}}, false, true},
  };
  check_layouts(moe_config(4, 2, 0.5), {4, 6, 8}, layouts);
  check_layouts(moe_config(4, 1, 0.75), {4, 6, 8}, layouts);
}

TEST_CASE("Expert parallelism: errors before any work") {
  // ep must divide the number of experts.
  auto reports = on_ranks(3, [&](int) -> std::string {
    MeshPtr mesh = Mesh::world({{"ep", 3}});
    auto m = nn::make_model<Holder>(moe_config(4, 2));
    m->reset_parameters(1);
    try {
      parallel::parallelize(*m, mesh, ep_test_plan(false));
      return "no error";
    } catch (const Error& e) {
      std::string w = e.what();
      if (w.find("ep=3 does not divide num_experts=4") == std::string::npos || w.find("ffn") == std::string::npos)
        return "message: " + w;
    }
    // Nothing was laid out.
    for (auto& p : m->named_parameters())
      if (p.tensor.is_distributed()) return p.name + " was distributed";
    return "";
  });
  CHECK(first_failure(reports) == "");
  // An experts rule on a module that is not an MoE layer, or on nothing.
  auto mesh = Mesh::single();
  auto m = nn::make_model<Holder>(moe_config(4, 2));
  parallel::ParallelPlan p;
  p.name = "bad";
  p.experts.push_back({"ffn\\.gate", "ep"});
  CHECK_THROWS_WITH(parallel::parallelize(*m, mesh, p), Catch::Contains("experts rule 'ffn\\.gate' matches 'ffn.gate', a Linear (not an MoE layer)"));
  p.experts = {{"attn", "ep"}};
  CHECK_THROWS_WITH(parallel::parallelize(*m, mesh, p), Catch::Contains("experts rule 'attn' matches no module"));
  CHECK_THROWS_WITH(parallel::expert_owner(1, 6, 4), Catch::Contains("ep=4 does not divide num_experts=6"));
  CHECK(parallel::expert_owner(5, 8, 4) == 2);
}

TEST_CASE("Plans: the experts rules in JSON, and mixtral's") {
  auto p = parallel::ParallelPlan::from_json(
      R"J({"name": "x", "experts": [{"match": "layers\\.\\d+\\.ffn", "dim": "ep"}], "data": {"dp": "S(0)"}})J");
  REQUIRE(p.experts.size() == 1);
  CHECK(p.experts[0].match == "layers\\.\\d+\\.ffn");
  CHECK(p.experts[0].dim == "ep");
  auto q = parallel::ParallelPlan::from_json(p.to_json());
  CHECK(q.experts.size() == 1);
  CHECK(q.experts[0].dim == "ep");
  CHECK_THROWS_WITH(parallel::ParallelPlan::from_json(R"J({"experts": [{"match": "ffn"}]})J"),
                    Catch::Contains("experts[0] needs a string 'match'"));
  auto mix = parallel::builtin_plan("mixtral");
  REQUIRE(mix.experts.size() == 1);
  CHECK(mix.experts[0].dim == "ep");
  CHECK(parallel::builtin_plan("llama").experts.empty());
  CHECK(parallel::ParallelPlan().data.str() == "{dp: S(0), ep: S(0), cp: S(1)}");
}

TEST_CASE("bitwise: expert-parallel MoE gives the single-device bits, float32 and bfloat16, with drops", "[bitwise]") {
  const std::vector<Layout> layouts = {
      {{{"ep", 2}}, false, true},
      {{{"ep", 4}}, false, true},
      {{{"ep", 2}}, false, false},
      {{{"dp", 2}, {"ep", 2}}, false, true},
      {{{"ep", 2}, {"dp", 2}}, false, true},
      {{{"ep", 2}, {"tp", 2}}, true, true},
      {{{"dp", 2}, {"ep", 2}, {"tp", 2}}, true, true},
      {{{"dp", 2}}, false, true},  // bitwise mode gathers the tokens over dp
      {{{"dp", 2}, {"tp", 2}}, true, true},
  };
  for (std::optional<DType> compute : {std::optional<DType>(), std::optional<DType>(DType::BFloat16)}) {
    const EpNumerics numerics{true, compute};
    check_layouts(moe_config(4, 2), {4, 6, 8}, layouts, numerics);
    check_layouts(moe_config(8, 1), {2, 3, 8}, layouts, numerics);
    check_layouts(moe_config(4, 2, 0.5), {4, 6, 8}, layouts, numerics);  // capacity: drops happen
  }
}

// Under dp without an ep dim (fast mode) each rank routes and runs its own
// tokens: the forward gathers only the routed counts (E integers per rank),
// never the tokens. With ep the tokens stay cut over dp too: the batch
// [B, T, C] cut over dp and ep keeps both cuts through the MoE's reshape to
// [B T, C] (the all-to-all moves rows within the ep group only).
TEST_CASE("MoE under dp keeps its tokens local (fast mode): only the counts are gathered") {
  const nn::MoEConfig cfg = moe_config(4, 2);
  for (const std::vector<Mesh::DimSpec>& dims :
       {std::vector<Mesh::DimSpec>{{"dp", 2}}, std::vector<Mesh::DimSpec>{{"dp", 2}, {"ep", 2}}}) {
    auto reports = on_ranks(mesh_size(dims), [&](int) -> std::string {
      MeshPtr mesh = Mesh::world(dims);
      auto m = nn::make_model<MoEHolder>(cfg);
      m->reset_parameters(5);
      parallel::parallelize(*m, mesh, ep_test_plan(false));
      Placements cut = Placements::replicated(mesh->ndim());
      for (int d = 0; d < mesh->ndim(); ++d) cut[d] = Shard(0);
      Tensor x = distribute_tensor(uniform({16, 16, cfg.dim}, 21), mesh, cut);  // 256 tokens: 8 KiB in float32
      cost::CountScope counting;
      NoGradGuard ng;
      Tensor y = (*m)(x);
      const auto& bytes = counting.counts().comm_bytes;
      const int64_t gathered = bytes.count("all_gather") ? bytes.at("all_gather") : 0;
      if (gathered > 1024) return fmt::format(FMT_STRING("{} bytes all-gathered on {}"), gathered, mesh->str());
      if (y.placements() != cut) return fmt::format(FMT_STRING("output {}: the cut over dp was lost"), y.desc());
      return "";
    });
    INFO(mesh_name(dims));
    CHECK(first_failure(reports) == "");
  }
}
