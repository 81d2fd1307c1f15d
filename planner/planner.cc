#include "planner/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "nn/module.h"
#include "nn/parallel/pipeline/partition.h"
#include "nn/parallel/pipeline/schedule.h"
#include "planner/simulate.h"
#include "runtime/error.h"

namespace tessel::planner {
namespace {

constexpr const char* kOp = "plan";
// Share of the backward that data-parallel gradient traffic can hide under
// (DDP buckets and ZeRO reduce while later layers still compute).
constexpr double kDpOverlap = 0.5;
// AdamW per parameter element: reads p, g, m, v and writes p, m, v (float32).
constexpr double kAdamBytesPerElement = 28.0;
constexpr int64_t kBucketBytes = int64_t(25) << 20;  // RunOptions::bucket_mb
// A rank waiting for a message on cores it shares with other ranks polls
// with sched_yield and still takes about this share of a core (fitted on 4
// MPI ranks on 2 cores: pp=2,dp=2 with one micro-batch, GPipe, ran 1.5x
// dp=4's step, whose ranks never wait; docs/plan.md).
constexpr double kWaitingCpu = 0.5;
// Two layouts within this share of each other's step time tie; the one with
// less memory wins.
constexpr double kTie = 0.005;

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

double gib(int64_t b) { return double(b) / double(int64_t(1) << 30); }

std::string human_bytes(int64_t b) {
  if (b >= (int64_t(1) << 30)) return fmt::format(FMT_STRING("{:.2f} GiB"), gib(b));
  return fmt::format(FMT_STRING("{:.1f} MiB"), double(b) / (1 << 20));
}

// Seconds a collective moving `bytes` per rank over `calls` calls takes.
double comm_seconds(int64_t bytes, int64_t calls, bool inter, const Cluster& c) {
  return double(bytes) / (inter ? c.inter_bw : c.intra_bw) + double(calls) * (inter ? c.inter_latency_s : c.intra_latency_s);
}

int64_t sum_calls(const RankCost& r) {
  int64_t n = 0;
  for (const auto& [k, v] : r.comm_calls) n += v;
  return n;
}

struct Search {
  const PlanRequest& req;
  PlanResult result;
  // Per (tp, cp, ep, sp, recompute) and micro-batch size b in {1, 2, 3}:
  // the cost, or why it cannot run.
  std::map<std::string, std::map<int64_t, std::pair<ModelCost, std::string>>> sims;

  const std::pair<ModelCost, std::string>& point(const ShardLayout& l, int64_t b) {
    ShardLayout at = l;
    at.batch = 1;
    auto& by_batch = sims[at.str()];
    auto it = by_batch.find(b);
    if (it == by_batch.end()) {
      at.batch = b;
      std::pair<ModelCost, std::string> v;
      try {
        v.first = simulate_per_block(req.model, at);
        result.simulations += 2;
      } catch (const Error& e) {
        v.second = e.what();
      }
      it = by_batch.emplace(b, std::move(v)).first;
    }
    return it->second;
  }

  // A micro-batch of b >= 2 sequences costs a fixed part (parameters, their
  // gradients, what is gathered whole) plus b times a per-sequence part, in
  // every field: measured at b = 2 and 3 and extended, so each (tp, cp, ep,
  // sp, recompute) is simulated at most three times whatever the batch. One
  // sequence is simulated on its own: some layouts move data in kind
  // differently then (a cp-sharded [1, T, C] flattens to tokens without a
  // gather; [b, T, C] does not).
  std::pair<ModelCost, std::string> cost_of(const ShardLayout& l) {
    if (l.batch <= 3) return point(l, l.batch);
    const auto& [c2, e2] = point(l, 2);
    if (!e2.empty()) return {ModelCost{}, e2};
    const auto& [c3, e3] = point(l, 3);
    if (!e3.empty()) return {ModelCost{}, e3};
    // cost(b) = c3 + (b - 3) (c3 - c2), for the base and the block.
    auto scale = [&](const RankCost& a2, const RankCost& a3) {
      const RankCost per_sequence = ModelCost{a3, a2}.at(-1);  // a3 - a2 (ModelCost::at(k) = base + k block)
      return ModelCost{a3, per_sequence}.at(l.batch - 3);
    };
    ModelCost out;
    out.base = scale(c2.base, c3.base);
    out.block = scale(c2.block, c3.block);
    return {out, ""};
  }

  // Pipeline schedules by (name, pp, micro-batches, virtual stages), with
  // what check_schedule learns of them: the (chunk, micro-batch) pairs each
  // rank holds at once depend on its instruction order, not on the costs.
  struct CheckedSchedule {
    parallel::pipeline::Schedule schedule;
    parallel::pipeline::ScheduleStats unit;
  };
  std::map<std::tuple<std::string, int, int, int>, CheckedSchedule> schedules;
  const CheckedSchedule& schedule(const std::string& name, int pp, int micro_batches, int v) {
    const auto key = std::make_tuple(name, pp, micro_batches, v);
    auto it = schedules.find(key);
    if (it == schedules.end()) {
      CheckedSchedule s{parallel::pipeline::make_schedule(name, pp, micro_batches, v), {}};
      s.unit = parallel::pipeline::check_schedule(s.schedule);
      it = schedules.emplace(key, std::move(s)).first;
    }
    return it->second;
  }

  bool allowed(const char* key, int64_t value) const {
    auto it = req.fixed.find(key);
    return it == req.fixed.end() || it->second == value;
  }

  void evaluate(Candidate c, std::vector<Candidate>* out) {
    const Cluster& cl = req.cluster;
    const PlanModel& m = req.model;
    ++result.candidates;
    const int64_t replicas = c.dp * c.ep;  // the batch is cut over dp and ep
    const int64_t per_replica = req.global_batch / replicas;
    const int64_t b = per_replica / c.micro_batches;
    ShardLayout sl;
    sl.tp = c.tp, sl.cp = c.cp, sl.ep = c.ep, sl.sequence_parallel = c.sp, sl.recompute = c.recompute;
    sl.bitwise = req.bitwise, sl.batch = b, sl.seq_len = req.seq_len, sl.compute = req.compute;
    if (m.n_head > 0 && (m.n_head % c.tp != 0 || m.n_kv_head % c.tp != 0)) {
      c.infeasible = fmt::format(FMT_STRING("tp={} does not divide n_head={} and n_kv_head={} (whole heads per rank)"),
                                 c.tp, m.n_head, m.n_kv_head);
      ++result.infeasible;
      out->push_back(c);
      return;
    }
    const auto [mc, error] = cost_of(sl);
    if (!error.empty()) {
      c.infeasible = error;
      ++result.infeasible;
      out->push_back(c);
      return;
    }
    // Stages: the pipeline's S = pp x V virtual stages cut by layers (the
    // trainer's default); rank r holds stages r, r + pp, ... The last stage
    // also runs the embedding and the head (their costs are not separated:
    // an upper bound for it, docs/plan.md).
    const int V = c.pp > 1 ? c.virtual_stages : 1;
    const int S = int(c.pp) * V;
    const auto part = parallel::pipeline::partition_by_layers(m.n_layer, S);
    const bool inner_inter = c.tp * c.cp * c.ep > cl.devices_per_node;
    const bool dp_inter = c.tp * c.cp * c.ep * c.dp > cl.devices_per_node;
    const bool pp_inter = cl.nodes > 1;
    // A stage's micro-batch: GEMMs and attention at the device's GEMM rate;
    // every op's dispatch; its output written once and read about twice at
    // memory speed; its tp/cp/ep collectives.
    auto stage_seconds = [&](const RankCost& rc) {
      const double f = cl.compute_scale * (double(rc.flops) / cl.flops(req.compute) +
                                           double(rc.ops) * cl.op_overhead_s + 3.0 * double(rc.op_bytes) / cl.memory_bw);
      return std::pair<double, double>{f, comm_seconds(rc.total_comm_bytes(), sum_calls(rc), inner_inter, cl)};
    };
    parallel::pipeline::StageCosts costs;
    double t_flops = 0, t_comm = 0;  // the slowest stage's split, for the report
    for (int vs = 0; vs < S; ++vs) {
      const int64_t blocks = part.end(vs) - part.begin(vs);
      const RankCost rc = vs == S - 1 ? mc.at(blocks) : ModelCost{RankCost{}, mc.block}.at(blocks);
      const auto [f, cm] = stage_seconds(rc);
      if (f + cm > t_flops + t_comm) t_flops = f, t_comm = cm;
      costs.forward_s.push_back((f + cm) / 3.0);  // a backward is about twice its forward
      costs.backward_s.push_back(2.0 * (f + cm) / 3.0);
    }
    int64_t worst_total = -1;
    double dp_s = 0, opt_s = 0, t_backward = 0;
    const CheckedSchedule* sched = c.pp > 1 ? &schedule(c.schedule, int(c.pp), int(c.micro_batches), V) : nullptr;
    const std::vector<int> in_flight = sched ? sched->unit.peak_in_flight : std::vector<int>{1};
    for (int r = 0; r < int(c.pp); ++r) {
      // Rank r's blocks (its V chunks) and, on the last rank, the embedding and head.
      int64_t blocks = 0;
      for (int ch = 0; ch < V; ++ch) blocks += part.end(ch * int(c.pp) + r) - part.begin(ch * int(c.pp) + r);
      const RankCost rc = r == int(c.pp) - 1 ? mc.at(blocks) : ModelCost{RankCost{}, mc.block}.at(blocks);
      t_backward = std::max(t_backward, 2.0 / 3.0 * stage_seconds(rc).first * double(c.micro_batches));
      const int64_t pbytes = rc.param_bytes;
      // Each (chunk, micro-batch) in flight beyond the V of one micro-batch
      // keeps its chunk's saved activations: what a block leaves alive after
      // the forward, less its parameters.
      const int64_t saved_per_chunk =
          std::max<int64_t>(0, blocks * (mc.block.live_after_forward - mc.block.param_bytes) / V);
      const int64_t params = c.zero == 3 ? pbytes / c.dp : pbytes;
      const int64_t opt = 2 * pbytes / (c.zero >= 1 ? c.dp : 1);
      // The simulated peak holds the parameters, the gradients made so far and
      // the micro-batch's activations and transients.
      int64_t act = std::max<int64_t>(0, rc.step_peak() - pbytes) +
                    std::max<int64_t>(0, in_flight[size_t(r)] - V) * saved_per_chunk;
      // ZeRO-2/3 reduce-scatter each unit's full gradients during the
      // backward, so at the peak they may still be there (the simulated peak
      // keeps them); the gradient shards accumulate beside them (measured on
      // LLaMA small, dp=2 ZeRO-3: 253 predicted this way, 271 MiB measured).
      if (c.zero >= 2) act += pbytes / c.dp;
      // DDP and ZeRO-1 keep every gradient in its bucket's flat buffer,
      // zeroed before the first backward (grad_reducer.h): from the start of
      // the backward all of them are there beside the saved activations,
      // where one device has made only the last blocks' (measured, dp=2:
      // LLaMA small 315.6 MiB, Mixtral small 332.5).
      if (c.dp > 1 && c.zero <= 1)
        act = std::max(act, std::max<int64_t>(0, rc.peak_backward_start - pbytes) + pbytes +
                                std::max<int64_t>(0, in_flight[size_t(r)] - V) * saved_per_chunk);
      // Communication buffers: FSDP's gathered units (this one and the
      // prefetched next); ZeRO-2's staging ring of bucket-sized slots. (DDP
      // and ZeRO-1 reduce in the gradients' own flat buffers.)
      const int64_t comm =
          c.dp <= 1 ? 0 : c.zero == 3 ? 2 * mc.block.param_bytes : c.zero == 2 ? std::min(pbytes, kBucketBytes) : 0;
      const int64_t total = params + opt + act + comm;
      if (total > worst_total) {
        worst_total = total;
        // The simulated peak's gradients are inside `act`: shown apart, so
        // the parts add up to the total.
        c.params = params, c.grads = std::min(act, pbytes / (c.zero >= 2 ? c.dp : 1)), c.optimizer = opt;
        c.activations = act - c.grads, c.comm_buffers = comm, c.total = total;
      }
      // Data-parallel gradients of this rank, and the optimizer over its share.
      if (c.dp > 1) {
        const double factor = double(c.dp - 1) / double(c.dp) * (c.zero == 3 ? 3.0 : 2.0);
        const int64_t buckets = std::max<int64_t>(1, pbytes / kBucketBytes);
        dp_s = std::max(dp_s, comm_seconds(int64_t(factor * double(pbytes)), buckets, dp_inter, cl));
      }
      opt_s = std::max(opt_s, double(pbytes) / 4.0 / double(c.zero >= 1 ? c.dp : 1) * kAdamBytesPerElement / cl.memory_bw);
    }
    c.fits = double(c.total) <= double(cl.memory_bytes) * (1.0 - req.headroom);
    if (c.pp == 1) {
      c.compute_s = double(c.micro_batches) * t_flops;
      c.model_comm_s = double(c.micro_batches) * t_comm;
    } else {
      // Activations (and their gradients) cross each stage boundary; on a
      // cluster whose transfers do not overlap compute the sender pays them
      // too.
      const int64_t act_bytes = b * (req.seq_len / c.cp) * m.dim * int64_t(itemsize(req.compute)) / (c.sp ? c.tp : 1);
      const double transfer = comm_seconds(act_bytes, 1, pp_inter, cl);
      double with = 0, without = 0;
      if (c.fits) {
        // The schedule itself, run with these costs: its makespan and bubble.
        parallel::pipeline::StageCosts no_transfer = costs;
        costs.transfer_s = transfer;
        if (!cl.comm_overlaps) {
          for (int vs = 0; vs < S; ++vs) {
            if (vs < S - 1) costs.forward_s[size_t(vs)] += transfer;
            if (vs > 0) costs.backward_s[size_t(vs)] += transfer;
          }
        }
        const auto stats = parallel::pipeline::simulate_schedule(sched->schedule, costs);
        with = stats.makespan;
        without = parallel::pipeline::simulate_schedule(sched->schedule, no_transfer).makespan;
        c.bubble = stats.bubble;
      } else {
        // A layout that does not fit is not run (most of them, at scale):
        // the schedule's closed form, M V + pp - 1 slots of the slowest
        // chunk, and the first micro-batch's crossings.
        double slowest = 0;
        for (int vs = 0; vs < S; ++vs)
          slowest = std::max(slowest, costs.forward_s[size_t(vs)] + costs.backward_s[size_t(vs)]);
        without = double(c.micro_batches * V + c.pp - 1) * slowest;
        with = without + 2.0 * double(S - 1) * transfer;
        c.bubble = sched->unit.bubble;
      }
      c.compute_s = without * t_flops / std::max(1e-30, t_flops + t_comm);
      c.model_comm_s = without - c.compute_s;
      c.pipeline_s = with - without;
    }
    c.dp_comm_s = cl.comm_overlaps ? std::max(0.0, dp_s - kDpOverlap * t_backward) : dp_s;
    c.optimizer_s = opt_s;
    if (cl.core_share < 1.0) {
      // Devices sharing cores: the step takes at least the CPU time its ranks
      // ask for over the cores -- each rank's busy time, and a share of its
      // waits: a waiting rank polls (sched_yield, runtime/comm/mpi_work.cc)
      // and takes about kWaitingCpu of a core -- however short the
      // schedule's critical path. The data-parallel sync and the optimizer
      // run on all ranks at once, so at the shared speed.
      double busy = 0;  // a pipeline rank's compute and collectives, averaged over the ranks
      for (int vs = 0; vs < S; ++vs) busy += double(c.micro_batches) * (costs.forward_s[size_t(vs)] + costs.backward_s[size_t(vs)]);
      busy /= double(c.pp);
      const double critical = c.compute_s + c.model_comm_s + c.pipeline_s;
      const double bound = (busy + kWaitingCpu * std::max(0.0, critical - busy)) / cl.core_share;
      if (bound > critical) {
        c.compute_s *= bound / critical;
        c.model_comm_s *= bound / critical;
        c.pipeline_s *= bound / critical;
      }
      c.dp_comm_s /= cl.core_share;
      c.optimizer_s /= cl.core_share;
    }
    c.step_s = c.compute_s + c.model_comm_s + c.pipeline_s + c.dp_comm_s + c.optimizer_s;
    // Every rank of a tp x cp x ep group runs mc.at(n_layer) per micro-batch
    // (its pieces of the whole model): over the step and the cluster that is
    // the rank's work times m over the pp stages sharing it.
    const RankCost whole = mc.at(m.n_layer);
    c.mfu = double(whole.flops) * double(c.micro_batches) / (c.step_s * double(c.pp) * cl.flops(req.compute));
    for (const auto& [op, calls] : whole.replicated_fallbacks)
      if (calls > 0) c.replicated_fallbacks[op] = calls;
    if (!c.fits) ++result.too_big;
    out->push_back(c);
  }
};

// Why `c` lost to `best`.
std::string why_not(const Candidate& c, const Candidate& best, const PlanRequest& req) {
  if (!c.infeasible.empty()) return "cannot run: " + c.infeasible;
  if (!c.fits)
    return fmt::format(FMT_STRING("does not fit: {} per rank, {} available ({:.0f}% headroom kept)"),
                       human_bytes(c.total), human_bytes(int64_t(double(req.cluster.memory_bytes) * (1 - req.headroom))),
                       req.headroom * 100);
  const std::pair<const char*, double> parts[] = {
      {"compute per rank", c.compute_s - best.compute_s},
      {"tensor/context/expert-parallel communication", c.model_comm_s - best.model_comm_s},
      {"pipeline transfers", c.pipeline_s - best.pipeline_s},
      {"data-parallel gradient sync", c.dp_comm_s - best.dp_comm_s},
      {"optimizer", c.optimizer_s - best.optimizer_s},
  };
  if (c.step_s <= best.step_s * (1 + kTie))
    return fmt::format(FMT_STRING("ties on time ({:+.1f}%), needs {} more per rank"), (c.step_s / best.step_s - 1) * 100,
                       human_bytes(c.total - best.total));
  const auto* worst = std::max_element(std::begin(parts), std::end(parts),
                                       [](const auto& a, const auto& b) { return a.second < b.second; });
  std::string s = fmt::format(FMT_STRING("{:+.1f}% step time; most from {} ({:+.3g} ms)"),
                              (c.step_s / best.step_s - 1) * 100, worst->first, worst->second * 1e3);
  if (c.pp > 1) s += fmt::format(FMT_STRING(", bubble {:.0f}%"), c.bubble * 100);
  return s;
}

}  // namespace

std::string Candidate::mesh() const {
  std::string s;
  for (const Mesh::DimSpec& d : mesh_dims()) s += (s.empty() ? "" : ",") + fmt::format(FMT_STRING("{}={}"), d.name, d.size);
  return s;
}

std::vector<Mesh::DimSpec> Candidate::mesh_dims() const {
  std::vector<Mesh::DimSpec> dims;
  for (const auto& [n, v] : std::vector<std::pair<const char*, int64_t>>{{"pp", pp}, {"dp", dp}, {"cp", cp}, {"ep", ep}, {"tp", tp}})
    if (v > 1) dims.push_back({n, v});
  return dims;
}

std::string Candidate::mesh_dims_cpp() const {
  std::string s;
  for (const Mesh::DimSpec& d : mesh_dims()) s += (s.empty() ? "" : ", ") + fmt::format(FMT_STRING("{{\"{}\", {}}}"), d.name, d.size);
  return s;
}

std::string Candidate::str() const {
  std::string s = mesh().empty() ? "one device" : mesh();
  if (zero > 0) s += fmt::format(FMT_STRING(" zero={}"), zero);
  if (micro_batches > 1) s += fmt::format(FMT_STRING(" micro-batches={}"), micro_batches);
  if (pp > 1) s += " " + schedule;
  if (pp > 1 && virtual_stages > 1) s += fmt::format(FMT_STRING(" v={}"), virtual_stages);
  if (sp) s += " sp";
  if (recompute != nn::Recompute::None) s += std::string(" recompute=") + nn::recompute_name(recompute);
  return s;
}

nlohmann::json Candidate::to_json() const {
  nlohmann::json j = {{"mesh", mesh()},
                      {"dp", dp},
                      {"tp", tp},
                      {"pp", pp},
                      {"cp", cp},
                      {"ep", ep},
                      {"zero", zero},
                      {"micro_batches", micro_batches},
                      {"schedule", pp > 1 ? schedule : ""},
                      {"virtual_stages", pp > 1 ? virtual_stages : 1},
                      {"sequence_parallel", sp},
                      {"recompute", nn::recompute_name(recompute)},
                      {"step_s", step_s},
                      {"time_s",
                       {{"compute", compute_s},
                        {"model_comm", model_comm_s},
                        {"pipeline", pipeline_s},
                        {"dp_comm", dp_comm_s},
                        {"optimizer", optimizer_s}}},
                      {"bubble", bubble},
                      {"hfu", mfu},
                      {"memory_bytes",
                       {{"parameters", params},
                        {"gradients", grads},
                        {"optimizer", optimizer},
                        {"activations", activations},
                        {"comm_buffers", comm_buffers},
                        {"total", total}}},
                      {"fits", fits}};
  if (!replicated_fallbacks.empty()) j["ops_without_sharding_rule"] = replicated_fallbacks;
  if (!infeasible.empty()) j["infeasible"] = infeasible;
  if (!why_not.empty()) j["why_not"] = why_not;
  return j;
}

// The best layout's parallel plan: the model's plan (built at two blocks on
// Meta; the rules cover every depth) for its sequence parallelism.
static parallel::ParallelPlan best_parallel_plan(const PlanRequest& req, const Candidate& b,
                                                 parallel::DeriveReport* report) {
  std::shared_ptr<nn::StagedModel> model;
  {
    nn::ConstructionScope meta(kMeta);
    model = req.model.build(std::min<int64_t>(2, req.model.n_layer));
  }
  return req.model.plan_for(*model, b.sp, report);
}

PlanResult plan(const PlanRequest& req) {
  const auto t0 = std::chrono::steady_clock::now();
  const PlanModel& m = req.model;
  TESSEL_CHECK(m.build != nullptr && m.n_layer >= 1, kOp, "the request names no model to plan");
  const Cluster& cl = req.cluster;
  const int64_t N = cl.devices();
  TESSEL_CHECK(req.global_batch >= 1 && req.seq_len >= 1, kOp, "global batch {} and seq_len {} must be positive",
               req.global_batch, req.seq_len);
  TESSEL_CHECK(m.max_seq_len == 0 || req.seq_len <= m.max_seq_len, kOp, "seq_len {} exceeds the context {} of {}", req.seq_len,
               m.max_seq_len, m.describe());
  TESSEL_CHECK(req.headroom >= 0 && req.headroom < 1, kOp, "headroom must be in [0, 1), got {}", req.headroom);
  static const std::set<std::string> keys = {"dp", "tp", "pp", "cp", "ep", "zero", "micro_batches", "sp",
                                             "virtual_stages"};
  int64_t fixed_product = 1;
  for (const auto& [k, v] : req.fixed) {
    TESSEL_CHECK(keys.count(k), kOp,
                 "unknown constraint '{}' (dp, tp, pp, cp, ep, zero, micro_batches, sp, virtual_stages)", k);
    TESSEL_CHECK(v >= (k == "zero" || k == "sp" ? 0 : 1), kOp, "constraint {}={} is out of range", k, v);
    if (k == "dp" || k == "tp" || k == "pp" || k == "cp" || k == "ep") fixed_product *= v;
  }
  TESSEL_CHECK(N % fixed_product == 0, kOp, "the fixed dims ({}) do not divide the cluster's {} devices",
               fixed_product, N);
  const bool moe = m.num_experts > 0;
  TESSEL_CHECK(moe || !req.fixed.count("ep") || req.fixed.at("ep") == 1, kOp,
               "ep = {} for {}, which has no experts", req.fixed.count("ep") ? req.fixed.at("ep") : 1, m.describe());

  Search search{req, {}, {}};
  std::vector<Candidate> all;
  // Selective recomputation saves little with tessel's fused attention
  // (docs/parallel.md): searched only when asked for.
  std::vector<nn::Recompute> policies = {nn::Recompute::None, nn::Recompute::Full};
  if (req.recompute) policies = {*req.recompute};
  for (int64_t tp : divisors(N)) {
    if (!search.allowed("tp", tp) || tp > cl.devices_per_node) continue;
    for (int64_t cp : divisors(N / tp)) {
      // Unless fixed, cp up to 16 and keeping at least 1024 tokens per rank:
      // shorter pieces exchange more than they compute, and the largest
      // rings cost the most simulation time.
      if (!search.allowed("cp", cp) || (cp > 1 && req.seq_len % (2 * cp) != 0)) continue;
      if (cp > 1 && (cp > 16 || req.seq_len / cp < 1024) && !req.fixed.count("cp")) continue;
      for (int64_t ep : moe ? divisors(N / (tp * cp)) : std::vector<int64_t>{1}) {
        if (!search.allowed("ep", ep) || (moe && m.num_experts % ep != 0)) continue;
        for (int64_t pp : divisors(N / (tp * cp * ep))) {
          const int64_t dp = N / (tp * cp * ep * pp);
          if (!search.allowed("pp", pp) || !search.allowed("dp", dp) || pp > m.n_layer) continue;
          if (req.global_batch % (dp * ep) != 0) continue;
          const int64_t per_replica = req.global_batch / (dp * ep);
          for (int64_t mb : divisors(per_replica)) {
            // Every micro-batch count the replica's batch divides into: a
            // deep pipeline needs many (less in flight, a smaller bubble),
            // and sizes beyond 3 sequences cost no simulation.
            if (!search.allowed("micro_batches", mb)) continue;
            for (int zero = 0; zero <= 3; ++zero) {
              if (!search.allowed("zero", zero) || (zero > 0 && (dp == 1 || pp > 1))) continue;
              for (int sp = 0; sp <= (tp > 1 ? 1 : 0); ++sp) {
                if (!search.allowed("sp", sp)) continue;
                for (nn::Recompute rc : policies) {
                  if (zero == 3 && rc != nn::Recompute::None) continue;
                  // Pipelines: GPipe with fewer micro-batches than stages,
                  // else 1F1B (GPipe's time, less memory), and interleaved
                  // 1F1B with V = 2, 3, 4 chunks per rank where the
                  // micro-batches divide over pp and every chunk has a block.
                  std::vector<std::pair<std::string, int>> schedules = {{"1f1b", 1}};
                  if (pp > 1 && mb < pp) schedules = {{"gpipe", 1}};
                  if (pp > 1 && mb >= pp && mb % pp == 0)
                    for (int v = 2; v <= 4 && pp * v <= m.n_layer; ++v) schedules.push_back({"interleaved", v});
                  for (const auto& [schedule, v] : schedules) {
                    if (!search.allowed("virtual_stages", v)) continue;
                    Candidate c;
                    c.dp = dp, c.tp = tp, c.pp = pp, c.cp = cp, c.ep = ep, c.zero = zero, c.micro_batches = mb;
                    c.sp = sp == 1, c.recompute = rc;
                    c.schedule = schedule;
                    c.virtual_stages = v;
                    search.evaluate(c, &all);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  PlanResult& r = search.result;
  if (all.empty()) {
    std::string fixed;
    for (const auto& [k, v] : req.fixed) fixed += fmt::format(FMT_STRING("{}{}={}"), fixed.empty() ? "" : ",", k, v);
    TESSEL_FAIL(kOp,
                "no layout of {} devices matches the constraints ({}) for {}: the global batch {} must divide over dp x "
                "ep and then into the micro-batches; tp and cp must fit a node; interleaved stages (virtual_stages > "
                "1) need pp > 1, micro-batches a multiple of pp and a block per chunk",
                N, fixed.empty() ? "none" : fixed, m.describe(), req.global_batch);
  }
  std::vector<Candidate> runnable;
  for (const Candidate& c : all)
    if (c.infeasible.empty()) runnable.push_back(c);
  if (runnable.empty()) {
    TESSEL_FAIL(kOp, "no layout of {} can run on {} devices; e.g. {}: {}", m.describe(), N, all.front().str(),
                all.front().infeasible);
  }
  std::sort(runnable.begin(), runnable.end(), [](const Candidate& a, const Candidate& b) {
    return std::tie(a.step_s, a.total) < std::tie(b.step_s, b.total);
  });
  auto best = std::find_if(runnable.begin(), runnable.end(), [](const Candidate& c) { return c.fits; });
  if (best == runnable.end()) {
    const Candidate& smallest = *std::min_element(runnable.begin(), runnable.end(),
                                                  [](const Candidate& a, const Candidate& b) { return a.total < b.total; });
    TESSEL_FAIL(kOp,
                "nothing fits in {} per device ({:.0f}% kept free): the smallest layout, {}, needs {} per rank "
                "(parameters {}, gradients {}, optimizer {}, activations {}, buffers {}); a device with {} would fit it",
                human_bytes(cl.memory_bytes), req.headroom * 100, smallest.str(), human_bytes(smallest.total),
                human_bytes(smallest.params), human_bytes(smallest.grads), human_bytes(smallest.optimizer),
                human_bytes(smallest.activations), human_bytes(smallest.comm_buffers),
                human_bytes(int64_t(std::ceil(double(smallest.total) / (1.0 - req.headroom)))));
  }
  r.best = *best;
  r.best_plan = best_parallel_plan(req, r.best, &r.derived);
  r.ops_without_sharding_rule = ops_without_sharding_rule(req.model, req.seq_len);
  if (m.num_experts > 0 && r.best.dp > 1 && req.bitwise)
    r.warnings.push_back(fmt::format(
        FMT_STRING("bitwise mode: the MoE layers gather their tokens over dp (an expert's weight gradient must sum all "
                   "its tokens in the one-device order): with dp={} each rank runs its experts on the tokens of all {} "
                   "replicas, which the prediction does not count (docs/plan.md)"),
        r.best.dp, r.best.dp));
  for (const Candidate& c : runnable) {
    if (int(r.runners_up.size()) >= req.runners_up) break;
    if (&c == &*best) continue;
    Candidate x = c;
    x.why_not = why_not(x, r.best, req);
    r.runners_up.push_back(x);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::string format_plan(const PlanRequest& req, const PlanResult& r) {
  const Candidate& b = r.best;
  std::string s;
  s += fmt::format(FMT_STRING("tessel plan: {}\n  cluster {}\n  global batch {} x {} tokens, {} compute{}\n"),
                   req.model.describe(), req.cluster.str(), req.global_batch, req.seq_len, dtype_name(req.compute),
                   req.bitwise ? ", bitwise" : "");
  s += fmt::format(FMT_STRING("  {} layouts considered ({} cannot run, {} do not fit), {} Meta steps, {:.2f} s\n\n"),
                   r.candidates, r.infeasible, r.too_big, r.simulations, r.seconds);
  s += fmt::format(FMT_STRING("best: {}\n"), b.str());
  s += fmt::format(FMT_STRING("  step {:.4g} s ({:.0f} tokens/s): compute {:.4g}, model-parallel comm {:.4g}, pipeline "
                              "transfers {:.4g}, exposed dp sync {:.4g}, optimizer {:.4g}; bubble {:.0f}%, {:.0f}% of "
                              "the cluster's FLOP/s\n"),
                   b.step_s, double(req.global_batch * req.seq_len) / b.step_s, b.compute_s, b.model_comm_s,
                   b.pipeline_s, b.dp_comm_s, b.optimizer_s, b.bubble * 100, b.mfu * 100);
  s += fmt::format(FMT_STRING("  per rank: parameters {}, gradients {}, optimizer {}, activations {}, buffers {}; "
                              "total {} of {}\n"),
                   human_bytes(b.params), human_bytes(b.grads), human_bytes(b.optimizer), human_bytes(b.activations),
                   human_bytes(b.comm_buffers), human_bytes(b.total), human_bytes(req.cluster.memory_bytes));
  const std::string options =
      fmt::format(FMT_STRING("{}{}{}{}{}{}{}"), b.mesh().empty() ? "" : " --mesh " + b.mesh(),
                  b.zero ? fmt::format(FMT_STRING(" --zero {}"), b.zero) : "",
                  b.micro_batches > 1 ? fmt::format(FMT_STRING(" --micro-batches {}"), b.micro_batches) : "",
                  b.pp > 1 ? " --pipeline-schedule " + b.schedule : "",
                  b.pp > 1 && b.virtual_stages > 1 ? fmt::format(FMT_STRING(" --virtual-stages {}"), b.virtual_stages)
                                                   : "",
                  b.sp ? " --sequence-parallel" : "",
                  b.recompute != nn::Recompute::None ? std::string(" --recompute ") + nn::recompute_name(b.recompute)
                                                     : "");
  if (!req.model.train_args.empty()) {
    s += fmt::format(FMT_STRING("  run it: tessel train {}{} --batch-size {} --seq-len {}\n"), req.model.train_args,
                     options, req.global_batch, req.seq_len);
  } else {  // a model of one's own: tessel::parallelize's mesh and RunOptions
    const std::string pipeline =
        b.pp > 1 ? fmt::format(FMT_STRING(" pipeline_schedule={} virtual_stages={}"), b.schedule, b.virtual_stages)
                 : "";
    s += fmt::format(FMT_STRING("  run it: Mesh::world({{{}}}), RunOptions zero={} micro_batches={}{} recompute={}, "
                                "plan derive_plan(model{})\n"),
                     b.mesh_dims_cpp(), b.zero, b.micro_batches, pipeline, nn::recompute_name(b.recompute),
                     b.sp ? ", {/*sequence_parallel=*/true}" : "");
  }
  if (b.tp > 1 || b.ep > 1) {  // what tp, sp and ep do to the parameters and modules
    const parallel::ParallelPlan& p = r.best_plan;
    s += "  parallel plan:\n";
    for (const auto& rule : p.params)
      if (b.tp > 1) s += fmt::format(FMT_STRING("    {:<56} {}\n"), rule.match, rule.layout.str());
    for (const auto& rule : p.modules)
      s += fmt::format(FMT_STRING("    {:<56} input {} output {}\n"), rule.match, rule.input.str(), rule.output.str());
    for (const auto& rule : p.experts)
      if (b.ep > 1) s += fmt::format(FMT_STRING("    {:<56} experts over {}\n"), rule.match, rule.dim);
  }
  for (const std::string& w : r.warnings) s += "  warning: " + w + "\n";
  if (!r.derived.replicated.empty()) {
    s += "  left replicated (no tensor-parallel pattern):\n";
    for (const std::string& why : r.derived.replicated) s += "    " + why + "\n";
  }
  if (!r.ops_without_sharding_rule.empty()) {
    std::string ops;
    for (const auto& [op, calls] : r.ops_without_sharding_rule)
      ops += fmt::format(FMT_STRING("{}{} ({} per sequence's step)"), ops.empty() ? "" : ", ", op, calls);
    s += "  ops without a sharding rule: " + ops + "\n";
    s += "    they run on replicated inputs: distributed ones are gathered first";
    s += b.replicated_fallbacks.empty() ? "" : " (the prediction counts it over tp/cp/ep)";
    s += b.dp > 1 ? "; over dp the batch is gathered too and each rank runs the op on the whole batch, which the "
                    "prediction does not count: give them a sharding rule (docs/adding_an_op.md)\n"
                  : "\n";
  }
  s += "\nrunners-up:\n";
  for (const Candidate& c : r.runners_up)
    s += fmt::format(FMT_STRING("  {:<48} {:>9.4g} s  {:>10}  {}\n"), c.str(), c.step_s, human_bytes(c.total), c.why_not);
  return s;
}

nlohmann::json plan_json(const PlanRequest& req, const PlanResult& r) {
  nlohmann::json ru = nlohmann::json::array();
  for (const Candidate& c : r.runners_up) ru.push_back(c.to_json());
  return {{"model", req.model.describe()},
          {"cluster", req.cluster.to_json()},
          {"global_batch", req.global_batch},
          {"seq_len", req.seq_len},
          {"compute", dtype_name(req.compute)},
          {"bitwise", req.bitwise},
          {"best", r.best.to_json()},
          {"parallel_plan", nlohmann::json::parse(r.best_plan.to_json())},
          {"left_replicated", r.derived.replicated},
          {"ops_without_sharding_rule", r.ops_without_sharding_rule},
          {"warnings", r.warnings},
          {"runners_up", ru},
          {"candidates", r.candidates},
          {"infeasible", r.infeasible},
          {"do_not_fit", r.too_big},
          {"simulations", r.simulations},
          {"seconds", r.seconds}};
}

}  // namespace tessel::planner
