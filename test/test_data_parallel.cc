// Data-parallel strategies (nn/parallel/data_parallel.h) on the local
// backend (ranks as threads): per-rank memory of each ZeRO stage against an
// expectation computed from the parameter shapes; DDP's silence before the
// last micro-batch and the overlap of its first bucket with backward, seen
// by a tracing communicator on the dp group; FSDP's prefetch order;
// gradients of every stage against one device, parameters nobody used; and
// released storage under saved tensors. (20-step equivalence of whole
// training runs: test_parallel_train.)
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "autograd/api.h"
#include "dtensor/ops.h"
#include "kernels/elementwise.h"
#include "models/language_model.h"
#include "nn/nn.h"
#include "nn/parallel/data_parallel.h"
#include "nn/parallel/parallelize.h"
#include "test/util/dist.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;
using tessel::parallel::DataParallel;
using tessel::parallel::DataParallelOptions;

namespace {

// Forwards every collective to `inner`, logging "<op> async=<0|1>" first.
class TracingComm final : public comm::Communicator {
 public:
  TracingComm(comm::CommPtr inner, std::vector<std::string>* log) : inner_(std::move(inner)), log_(log) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* backend() const override { return inner_->backend(); }
  std::string name() const override { return inner_->name(); }
  const std::vector<int>& world_ranks() const override { return inner_->world_ranks(); }
  comm::WorkPtr do_all_reduce(const Tensor& t, comm::ReduceOp op, bool async) override {
    note("all_reduce", async);
    return inner_->all_reduce(t, op, async);
  }
  comm::WorkPtr do_all_gather(const Tensor& in, const Tensor& out, bool async) override {
    note("all_gather", async);
    return inner_->all_gather(in, out, async);
  }
  comm::WorkPtr do_all_gather_v(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts,
                             bool async) override {
    note("all_gather_v", async);
    return inner_->all_gather_v(in, out, counts, async);
  }
  comm::WorkPtr do_reduce_scatter(const Tensor& in, const Tensor& out, comm::ReduceOp op, bool async) override {
    note("reduce_scatter", async);
    return inner_->reduce_scatter(in, out, op, async);
  }
  comm::WorkPtr do_reduce_scatter_v(const Tensor& in, const Tensor& out, const std::vector<int64_t>& counts,
                                 comm::ReduceOp op, bool async) override {
    note("reduce_scatter_v", async);
    return inner_->reduce_scatter_v(in, out, counts, op, async);
  }
  comm::WorkPtr do_all_to_all(const Tensor& in, const Tensor& out, bool async) override {
    note("all_to_all", async);
    return inner_->all_to_all(in, out, async);
  }
  comm::WorkPtr do_all_to_all_v(const Tensor& in, const std::vector<int64_t>& sc, const Tensor& out,
                             const std::vector<int64_t>& rc, bool async) override {
    note("all_to_all_v", async);
    return inner_->all_to_all_v(in, sc, out, rc, async);
  }
  comm::WorkPtr do_broadcast(const Tensor& t, int root, bool async) override {
    note("broadcast", async);
    return inner_->broadcast(t, root, async);
  }
  comm::WorkPtr do_send(const Tensor& t, int dst, int tag, bool async) override {
    note("send", async);
    return inner_->send(t, dst, tag, async);
  }
  comm::WorkPtr do_recv(const Tensor& t, int src, int tag, bool async) override {
    note("recv", async);
    return inner_->recv(t, src, tag, async);
  }
  void do_barrier() override {
    note("barrier", false);
    inner_->barrier();
  }
  std::shared_ptr<Communicator> split(int color, int key) override { return inner_->split(color, key); }

 private:
  void note(const char* op, bool async) { log_->push_back(std::string(op) + " async=" + (async ? "1" : "0")); }
  comm::CommPtr inner_;
  std::vector<std::string>* log_;
};

bool is_collective(const std::string& e) { return e.find(" async=") != std::string::npos; }

// One rank's model, laid out on `dims` (the dp group traced into `log` when given), under a strategy.
struct Rank {
  std::shared_ptr<models::LanguageModel> model;
  MeshPtr mesh;
  parallel::ParallelPlan plan;
  std::unique_ptr<DataParallel> dp;
  std::unique_ptr<nn::AdamW> opt;
};

Rank make_rank(const std::string& arch, const std::vector<Mesh::DimSpec>& dims, DataParallelOptions o,
               std::vector<std::string>* log = nullptr) {
  Rank r;
  r.mesh = Mesh::world(dims);
  if (log) {
    const int dp = r.mesh->dim_index("dp");
    r.mesh = r.mesh->with_comms([&](int d, const comm::CommPtr& c) -> comm::CommPtr {
      return d == dp ? std::make_shared<TracingComm>(c, log) : c;
    });
  }
  r.model = models::make_language_model(models::model_config(arch, "tiny"), 5);
  r.plan = parallel::load_plan(dims.size() > 1 ? arch : "none");
  parallel::parallelize(*r.model, r.mesh, r.plan);
  std::vector<nn::Module*> blocks;
  for (const auto& b : r.model->blocks()) blocks.push_back(b.get());
  r.dp = std::make_unique<DataParallel>(*r.model, blocks, o);
  nn::AdamWOptions ao;
  ao.lr = 1e-3;
  r.opt = std::make_unique<nn::AdamW>(r.dp->optimizer_groups(nn::default_param_groups(*r.model, 0.1)), ao);
  return r;
}

// One micro-batch's loss: 6 sequences of 16 tokens (global; whole shards for
// dp = 2 and 3), drawn by (step, m).
Tensor micro_loss(Rank& r, int step, int m, int n_micro) {
  const int64_t V = r.model->config.vocab_size;
  Tensor ids = randint(0, V, {6, 16}, PhiloxKey{11, uint64_t(100 * step + m)});
  Tensor tgt = randint(0, V, {6, 16}, PhiloxKey{12, uint64_t(100 * step + m)});
  Tensor loss = r.model->loss(r.model->forward(parallel::distribute_batch(ids, r.mesh, r.plan)),
                              parallel::distribute_batch(tgt, r.mesh, r.plan));
  return n_micro == 1 ? loss : loss / double(n_micro);
}

// Bytes of the distinct storages behind the local pieces of `ts`.
int64_t storage_bytes(const std::vector<Tensor>& ts) {
  std::set<const StorageImpl*> seen;
  int64_t n = 0;
  for (const Tensor& t : ts) {
    if (!t.defined()) continue;
    const Tensor& l = raw::local_of(t);
    if (seen.insert(l.storage().get()).second) n += int64_t(l.storage()->nbytes());
  }
  return n;
}

}  // namespace

TEST_CASE("ZeRO-1 shards optimizer state, ZeRO-2 also gradients, FSDP also parameters", "[data_parallel][memory]") {
  // dp=3: the tiny GPT's dims (64, 256, 192...) split unevenly over 3 ranks.
  const int dp = 3;
  // The expectation from the shapes alone: each parameter cut along dim 0
  // in ceil-division chunks (no other mesh dim cuts anything), one flag per
  // parameter riding in the gradient buckets.
  auto single = models::make_language_model(models::model_config("nanogpt", "tiny"), 5);
  std::vector<int64_t> full(1, 0), chunk(dp, 0);
  int64_t n_params = 0;
  for (const Tensor& t : single->parameters()) {
    ++n_params;
    full[0] += t.numel() * 4;
    const int64_t row = t.numel() / t.size(0);
    for (int r = 0; r < dp; ++r) chunk[size_t(r)] += chunk_range(t.size(0), dp, r).size() * row * 4;
  }
  int64_t chunk_sum = 0;
  for (int64_t c : chunk) chunk_sum += c;
  REQUIRE(chunk_sum == full[0]);  // the shards partition the parameters exactly
  REQUIRE(chunk[0] != chunk[2]);  // and unevenly

  for (int zero = 0; zero <= 3; ++zero) {
    struct Got {
      int64_t params = 0, grads = 0, optimizer = 0;
      parallel::DataParallelMemory report;
    };
    std::vector<Got> got(dp);
    auto reports = on_ranks(dp, [&](int rank) -> std::string {
      Rank r = make_rank("nanogpt", {{"dp", dp}}, DataParallelOptions{zero, 0.05});
      Got& g = got[size_t(rank)];
      r.dp->begin_micro_batch(true);
      micro_loss(r, 0, 0, 1).backward();
      r.dp->finish();
      std::vector<Tensor> grads;
      for (const Tensor& t : r.dp->parameters()) grads.push_back(t.grad());
      for (const Tensor& t : r.model->parameters()) grads.push_back(t.grad());
      g.grads = storage_bytes(grads);
      r.opt->step();
      r.dp->after_step();
      r.opt->zero_grad();
      g.params = storage_bytes(r.model->parameters());
      std::vector<Tensor> state;
      for (const auto& nt : r.opt->state_dict())
        if (nt.tensor.is_floating_point()) state.push_back(nt.tensor);
      g.optimizer = storage_bytes(state);
      g.report = r.dp->memory(*r.opt);
      return "";
    });
    REQUIRE(first_failure(reports) == "");
    for (int r = 0; r < dp; ++r) {
      INFO("zero=" << zero << " rank " << r);
      const int64_t mine = chunk[size_t(r)], whole = full[0];
      const int64_t flags = n_params * 4;
      CHECK(got[size_t(r)].params == (zero >= 3 ? mine : whole));
      CHECK(got[size_t(r)].grads == (zero >= 2 ? mine : whole) + flags);
      CHECK(got[size_t(r)].optimizer == 2 * (zero >= 1 ? mine : whole));
      // What the trainer prints is what is there.
      CHECK(got[size_t(r)].report.params == got[size_t(r)].params);
      CHECK(got[size_t(r)].report.grads + flags == got[size_t(r)].grads);
      CHECK(got[size_t(r)].report.optimizer == got[size_t(r)].optimizer);
      CHECK((got[size_t(r)].report.gathered > 0) == (zero == 3));
    }
  }
}

TEST_CASE("DDP sends nothing before the last micro-batch; its first bucket starts before backward ends",
          "[data_parallel][ddp]") {
  std::vector<std::vector<std::string>> logs(2);
  int buckets = 0;
  auto reports = on_ranks(2, [&](int rank) -> std::string {
    std::vector<std::string>& log = logs[size_t(rank)];
    Rank r = make_rank("nanogpt", {{"dp", 2}}, DataParallelOptions{0, 0.02}, &log);
    if (rank == 0) buckets = int(r.dp->buckets().size());
    // wte.weight is registered first: its gradient comes last in backward.
    Tensor wte = r.model->named_parameters()[0].tensor;
    wte.register_post_accumulate_grad_hook([&log](const Tensor&) { log.push_back("grad wte"); });
    for (int m = 0; m < 3; ++m) {
      r.dp->begin_micro_batch(m == 2);
      Tensor loss = micro_loss(r, 0, m, 3);
      log.push_back("backward " + std::to_string(m));
      loss.backward();
      log.push_back("end " + std::to_string(m));
    }
    r.dp->finish();
    log.push_back("finished");
    return "";
  });
  REQUIRE(first_failure(reports) == "");
  REQUIRE(buckets >= 3);
  for (const auto& log : logs) {
    auto at = [&](const std::string& e, size_t from = 0) {
      return size_t(std::find(log.begin() + long(from), log.end(), e) - log.begin());
    };
    auto collectives = [&](size_t from, size_t to) {
      std::vector<std::string> c;
      for (size_t i = from; i < to; ++i)
        if (is_collective(log[i])) c.push_back(log[i]);
      return c;
    };
    // Micro-batches 0 and 1: not one collective on the dp group in backward.
    CHECK(collectives(at("backward 0"), at("end 0")).empty());
    CHECK(collectives(at("backward 1"), at("end 1")).empty());
    // The last one: one async all-reduce per bucket, and the first of them
    // before the embedding's gradient (the last one backward produces).
    const auto last = collectives(at("backward 2"), at("finished"));
    CHECK(last == std::vector<std::string>(size_t(buckets), "all_reduce async=1"));
    const size_t first_ar = at("all_reduce async=1", at("backward 2")), wte = at("grad wte", at("backward 2"));
    CHECK(first_ar < wte);
    CHECK(wte < at("end 2"));
  }
}

TEST_CASE("ZeRO-2 reduce-scatters every micro-batch; FSDP prefetches the next unit", "[data_parallel][fsdp]") {
  std::vector<std::vector<std::string>> logs(2);
  auto reports = on_ranks(2, [&](int rank) -> std::string {
    std::vector<std::string>& log = logs[size_t(rank)];
    Rank r = make_rank("llama", {{"dp", 2}}, DataParallelOptions{3, 25}, &log);
    // Registered after FSDP's hooks, so they run after its gathers.
    const auto& blocks = r.model->blocks();
    for (size_t b = 0; b < blocks.size(); ++b)
      blocks[b]->register_forward_pre_hook([&log, b](nn::Module&, const Tensor& x) {
        log.push_back("block " + std::to_string(b));
        return x;
      });
    r.dp->begin_micro_batch(true);
    Tensor loss = micro_loss(r, 0, 0, 1);
    log.push_back("backward");
    loss.backward();
    log.push_back("end");
    r.dp->finish();
    return "";
  });
  REQUIRE(first_failure(reports) == "");
  for (const auto& log : logs) {
    auto count_before = [&](const std::string& e, const std::string& what) {
      size_t n = 0;
      for (size_t i = 0; i < log.size() && log[i] != e; ++i) n += log[i] == what;
      return n;
    };
    // Forward: the root, then block 0 prefetched before block 0 runs; block 1
    // prefetched before block 0 has finished (it runs next).
    CHECK(count_before("block 0", "all_gather_v async=1") == 3);
    CHECK(count_before("block 1", "all_gather_v async=1") == 3);
    // Backward: each block gathered again, one reduce-scatter per unit (root + 2 blocks).
    CHECK(count_before("end", "all_gather_v async=1") == 5);
    CHECK(count_before("end", "reduce_scatter_v async=1") == 3);
  }

  std::vector<std::string> log2;
  auto z2 = on_ranks(2, [&](int rank) -> std::string {
    std::vector<std::string> mine;
    Rank r = make_rank("nanogpt", {{"dp", 2}}, DataParallelOptions{2, 0.02}, &mine);
    for (int m = 0; m < 2; ++m) {
      r.dp->begin_micro_batch(m == 1);
      Tensor loss = micro_loss(r, 0, m, 2);
      mine.push_back("backward " + std::to_string(m));
      loss.backward();
      mine.push_back("end " + std::to_string(m));
    }
    r.dp->finish();
    const size_t n = r.dp->buckets().size();
    size_t in_first = 0;
    for (size_t i = size_t(std::find(mine.begin(), mine.end(), "backward 0") - mine.begin());
         i < mine.size() && mine[i] != "end 0"; ++i)
      in_first += mine[i] == "reduce_scatter_v async=1";
    if (rank == 0) log2 = mine;
    return in_first == n ? "" : "expected " + std::to_string(n) + " reduce-scatters in micro-batch 0, got " +
                                    std::to_string(in_first);
  });
  CHECK(first_failure(z2) == "");
}

namespace {

// w is used, `unused` never is.
struct Toy : nn::UnaryModule {
  Tensor w, unused;
  Toy() : nn::UnaryModule("Toy") {
    param("w", w, {6, 5}, nn::init::normal(0, 1));
    param("unused", unused, {3}, nn::init::zeros());
  }
  Tensor forward(const Tensor& x) override { return linear(x, w); }
};

}  // namespace

TEST_CASE("every stage gives one device's gradient on its shard; a parameter nobody used has none",
          "[data_parallel]") {
  auto single = nn::make_model<Toy>();
  single->reset_parameters(3);
  const Tensor x = randn({8, 5}, PhiloxKey{4, 1});
  mean(square((*single)(x))).backward();
  const Tensor want = single->w.grad();

  for (int zero = 0; zero <= 3; ++zero) {
    auto reports = on_ranks(2, [&](int) -> std::string {
      auto toy = nn::make_model<Toy>();
      toy->reset_parameters(3);
      MeshPtr mesh = Mesh::world({{"dp", 2}});
      parallel::parallelize(*toy, mesh, parallel::load_plan("none"));
      DataParallel dp(*toy, {}, DataParallelOptions{zero, 0});
      std::vector<Tensor> ps = dp.parameters();
      dp.begin_micro_batch(true);
      mean(square((*toy)(distribute_tensor(x, mesh, {Shard(0)})))).backward();
      dp.finish();
      if (ps[1].grad().defined()) return "'unused' got a gradient";
      const Tensor g = ps[0].grad();
      if (!g.defined()) return "'w' has no gradient";
      const Placements expect = zero == 0 ? Placements{Replicate()} : Placements{Shard(0)};
      if (g.placements() != expect) return "gradient placements " + g.placements().str();
      if (!allclose(full_tensor(g), want, 1e-6, 1e-7)) return "gradient differs from one device's";
      return "";
    });
    INFO("zero=" << zero);
    CHECK(first_failure(reports) == "");
  }
}

TEST_CASE("released storage: saved tensors refuse it, refilled in place they work", "[data_parallel][fsdp]") {
  Tensor w = randn({4}, PhiloxKey{1, 2}).requires_grad_();
  const Tensor values = w.detach().clone();
  Tensor y = sum(mul(w, w));  // saves w
  w.storage()->release();
  CHECK_THROWS_WITH(y.backward(), Catch::Contains("released"));
  w.storage()->reallocate();
  kernels::copy(kCPU, values, w.detach());  // a raw kernel: no version bump
  Tensor y3 = sum(mul(w, w));
  w.storage()->release();  // what FSDP does after a unit's forward...
  w.storage()->reallocate();  // ...and before its backward
  kernels::copy(kCPU, values, w.detach());
  y3.backward();
  CHECK(allclose(w.grad(), mul(values, 2.0)));
}
