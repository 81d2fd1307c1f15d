// The timeline (runtime/timeline.h, RunOptions::trace, tessel train --trace;
// docs/trace.md): spans nest, the merged file of a dp=2,tp=2 run parses as a
// Chrome trace with one track per rank and every kind of event, pipelines
// record their instructions, and a Run that ends early still leaves each
// rank's file.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "run/trace.h"
#include "runtime/timeline.h"
#include "test/run/mlp_classifier.h"
#include "test/util/runfiles.h"
#include "test/util/util.h"
#include "train/trainer/trainer.h"

using namespace tessel;
using namespace tessel::testing;
using json = nlohmann::json;

namespace {

json read_json(const std::string& path) {
  std::ifstream f(path);
  REQUIRE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());  // throws on anything a viewer would not load
}

constexpr int64_t kBatch = 8;

std::shared_ptr<StagedMlp> mlp() {
  auto m = nn::make_model<StagedMlp>(MlpConfig{});
  m->reset_parameters(1);
  return m;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

std::string scratch(const std::string& name) {
  return (std::filesystem::path(scratch_dir("trace")) / name).string();
}

// Spans of one track nest: each lies inside the one it starts in (what
// chrome://tracing and Perfetto need to draw a stack).
std::string nesting_problem(const json& events, int pid) {
  std::vector<std::pair<double, double>> spans;
  for (const json& e : events)
    if (e["ph"] == "X" && e["pid"] == pid) spans.push_back({e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()});
  std::sort(spans.begin(), spans.end(), [](auto& a, auto& b) { return a.first != b.first ? a.first < b.first : a.second > b.second; });
  std::vector<double> open;
  for (auto [t0, t1] : spans) {
    // (Times are microseconds with 3 decimals: ts + dur may round a hair past
    // a sibling's start; a span that ends within a nanosecond of t0 is done.)
    while (!open.empty() && open.back() <= t0 + 1e-3) open.pop_back();
    if (!open.empty() && t1 > open.back() + 1e-3)
      return "a span [" + std::to_string(t0) + ", " + std::to_string(t1) + ") crosses the end of its parent " +
             std::to_string(open.back());
    open.push_back(t1);
  }
  return "";
}

}  // namespace

TEST_CASE("timeline: spans nest, args and counters are JSON, a full recorder counts what it left out", "[trace]") {
  timeline::Recorder r(3, /*max_events=*/6);
  CHECK(timeline::current() == nullptr);
  {
    timeline::Scope on(&r);
    CHECK(timeline::current() == &r);
    timeline::Span outer("outer \"quoted\"", "op");
    { timeline::Span inner("inner", "comm", [] { return std::string("\"bytes\":64"); }); }
  }
  CHECK(timeline::current() == nullptr);
  // Inner ends first; the memory sample follows the top-level span only.
  REQUIRE(r.events().size() >= 2);
  CHECK(r.events()[0].name == "inner");
  CHECK(r.events()[0].args == "\"bytes\":64");
  CHECK(r.events()[1].name == "outer \"quoted\"");
  CHECK(r.events()[1].ts_ns <= r.events()[0].ts_ns);
  CHECK(r.events()[1].ts_ns + r.events()[1].dur_ns >= r.events()[0].ts_ns + r.events()[0].dur_ns);
  const json doc = json::parse(timeline::chrome_trace({r.chrome_events()}, "\"tessel\":{\"x\":1}"));
  CHECK(doc["tessel"]["x"] == 1);
  int spans = 0;
  for (const json& e : doc["traceEvents"]) {
    CHECK(e["pid"] == 3);
    if (e["ph"] == "X") ++spans;
    if (e["name"] == "inner") CHECK(e["args"]["bytes"] == 64);
  }
  CHECK(spans == 2);
  CHECK(nesting_problem(doc["traceEvents"], 3) == "");

  const int64_t before = int64_t(r.events().size());
  for (int i = 0; i < 10; ++i) r.span("s", "op", i, i + 1);
  CHECK(int64_t(r.events().size()) == 6);
  CHECK(r.dropped() == 10 - (6 - before));
  CHECK_THAT(r.chrome_events(), Catch::Contains("events left out"));
  CHECK(timeline::json_string("a\"b\\c\n") == "\"a\\\"b\\\\c\\n\"");
}

// The check: a dp=2,tp=2 run's merged trace opens in a viewer (it
// parses, one track per rank, spans nest) and shows ops, backward nodes,
// collectives with bytes and peers, waits, the optimizer and memory.
TEST_CASE("trace: a dp=2,tp=2 run through the API writes one file per rank and a merged one", "[trace][run]") {
  const std::string path = scratch("dp2tp2/run.json");
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
  auto [x, y] = mlp_batch(MlpConfig{}, kBatch, 0, 0);
  std::vector<std::string> written(4);
  comm::run_local(4, [&](int rank) {
    auto m = mlp();
    RunOptions o;
    o.trace = path;
    o.trace_steps = 2;
    auto run = parallelize(m, Mesh::world({{"dp", 2}, {"tp", 2}}), mlp_plan(), adamw(), o);
    for (int step = 0; step < 3; ++step) {  // the third step is not recorded
      run.forward_backward(x, y);
      run.step_optimizer();
    }
    written[size_t(rank)] = run.write_trace();  // already written after step 2: the same answer
  });
  CHECK(written[0] == path);
  for (int rank = 1; rank < 4; ++rank) CHECK(written[size_t(rank)] == "");

  const json doc = read_json(path);
  CHECK(doc["tessel"]["mesh"] == "(dp=2, tp=2)");
  CHECK(doc["tessel"]["first_step"] == 1);
  CHECK(doc["tessel"]["last_step"] == 2);
  const json& events = doc["traceEvents"];
  std::map<int, std::map<std::string, int>> cats;  // pid -> category -> events
  std::map<int, std::set<std::string>> names;
  std::set<std::string> groups;
  for (const json& e : events) {
    const int pid = e["pid"];
    if (e.contains("cat")) ++cats[pid][e["cat"].get<std::string>()];
    names[pid].insert(e["name"].get<std::string>());
    if (e.value("cat", "") == "comm" && e["name"] != "redistribute" && e["name"] != "barrier") {
      CHECK(e["args"]["bytes"].get<int64_t>() >= 0);
      groups.insert(e["args"]["group"].get<std::string>());
      CHECK((e["args"].contains("ranks") || e["args"].contains("peer")));
    }
    if (e["ph"] == "C") CHECK(e["args"]["allocated MiB"].get<double>() > 0);
  }
  // The mesh's communicators by their dims' names; the input check's on the world.
  CHECK(groups == std::set<std::string>{"dp", "tp", "world"});
  REQUIRE(cats.size() == 4);
  for (int pid = 0; pid < 4; ++pid) {
    INFO("rank " << pid);
    for (const char* c : {"op", "backward", "comm", "wait", "step", "optimizer", "memory"}) CHECK(cats[pid][c] > 0);
    CHECK(names[pid].count("all_reduce") == 1);  // the dp gradients (DDP), the tp partial sums
    CHECK(names[pid].count("step 1") == 1);
    CHECK(names[pid].count("step 2") == 1);
    CHECK(names[pid].count("step 3") == 0);
    CHECK(nesting_problem(events, pid) == "");
    // Each rank's own file holds its track alone.
    const json own = read_json(tessel::detail::trace_rank_path(path, pid));
    std::set<int> pids;
    for (const json& e : own["traceEvents"]) pids.insert(e["pid"].get<int>());
    CHECK(pids == std::set<int>{pid});
  }
}

// Compile mode's replayed steps hold their launches as `kernel` spans,
// inside `compile.replay` (the whole step) or `compile.replay <module>` and
// `compile.replay <module> (backward)` (mixed mode).
TEST_CASE("trace: replayed steps show their kernels, mixed mode per module call", "[trace][run][compile]") {
  auto [x, y] = mlp_batch(MlpConfig{}, kBatch, 0, 0);
  const std::string folder = scratch_dir("trace_compiled");
  for (bool mixed : {false, true}) {
    INFO((mixed ? "mixed mode" : "the whole step"));
    const std::string path = folder + (mixed ? "/mixed.json" : "/compiled.json");
    auto m = mlp();
    RunOptions o;
    o.trace = path;
    o.trace_steps = 5;
    o.compile = !mixed;
    o.compile_modules = mixed ? nn::CompileModules::Blocks : nn::CompileModules::None;
    auto run = parallelize(m, adamw(), o);
    for (int step = 0; step < 5; ++step) {
      run.forward_backward(x, y);
      run.step_optimizer();
    }
    const json doc = read_json(path);
    std::map<std::string, int> cats;
    std::set<std::string> replays;
    for (const json& e : doc["traceEvents"]) {
      if (e.contains("cat")) ++cats[e["cat"].get<std::string>()];
      const std::string name = e["name"];
      if (name.rfind("compile.replay", 0) == 0) replays.insert(name);
    }
    CHECK(cats["kernel"] > 0);
    if (mixed) {
      REQUIRE(!m->blocks().empty());
      const std::string block = m->blocks()[0]->path();
      CHECK(replays.count("compile.replay " + block) == 1);
      CHECK(replays.count("compile.replay " + block + " (backward)") == 1);
    } else {
      CHECK(replays == std::set<std::string>{"compile.replay"});
    }
    CHECK(nesting_problem(doc["traceEvents"], 0) == "");
  }
}

TEST_CASE("trace: tessel train --trace on a pipeline records its instructions per micro-batch", "[trace][train]") {
  train::TrainConfig c;
  c.model = "llama";
  c.model_config = "tiny";
  c.steps = 2;
  c.batch_size = 4;
  c.seq_len = 16;
  c.micro_batches = 2;
  c.eval_every = 0;
  c.sample_length = 0;
  c.mesh = "pp=2";
  c.out_dir = scratch("pp2");
  c.trace = scratch("pp2/trace.json");
  c.trace_steps = 0;  // every step
  train::TrainHooks h;
  h.quiet = true;
  train::run_training(c, h);
  const json doc = read_json(c.trace);
  CHECK(doc["tessel"]["last_step"] == 2);
  std::map<int, std::set<int>> forward_mbs;  // pid -> micro-batches forwarded
  std::set<std::string> p2p;
  for (const json& e : doc["traceEvents"]) {
    if (e["name"] == "pp.forward") forward_mbs[e["pid"].get<int>()].insert(e["args"]["micro_batch"].get<int>());
    if (e["name"] == "send" || e["name"] == "recv") p2p.insert(e["name"].get<std::string>() + std::to_string(e["args"]["peer"].get<int>()));
  }
  CHECK(forward_mbs[0] == std::set<int>{0, 1});
  CHECK(forward_mbs[1] == std::set<int>{0, 1});
  CHECK(p2p == std::set<std::string>{"send1", "recv1", "send0", "recv0"});
}

TEST_CASE("trace: a Run that ends before write_trace leaves each rank's file; bad input is an error", "[trace][run][errors]") {
  const std::string path = scratch("early/run.json");
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
  auto [x, y] = mlp_batch(MlpConfig{}, kBatch, 0, 0);
  comm::run_local(2, [&](int) {
    auto m = mlp();
    RunOptions o;
    o.trace = path;
    o.trace_steps = 0;
    auto run = parallelize(m, Mesh::world({{"dp", 2}}), mlp_plan(), adamw(), o);
    run.forward_backward(x, y);
    run.step_optimizer();
  });  // no write_trace: no collective in a destructor, so no merged file
  CHECK(!std::filesystem::exists(path));
  for (int rank = 0; rank < 2; ++rank) CHECK(read_json(tessel::detail::trace_rank_path(path, rank))["traceEvents"].size() > 10);

  auto m = mlp();
  RunOptions o;
  o.trace = path;
  o.trace_steps = -1;
  CHECK_THAT(error_of([&] { parallelize(m, adamw(), o); }), Catch::Contains("trace_steps must be >= 0"));
  o.trace_steps = 1;
  o.trace = "/proc/no/such/dir/run.json";
  // At parallelize, before any step.
  CHECK_THAT(error_of([&] { parallelize(m, adamw(), o); }), Catch::Contains("timeline '/proc/no/such/dir/run.json'"));
  // A folder given for the file: named, with a file path to give instead.
  o.trace = std::filesystem::path(path).parent_path().string();
  CHECK_THAT(error_of([&] { parallelize(m, adamw(), o); }),
             Catch::Contains("is a folder; give a file, e.g. '" + o.trace + "/trace.json'"));
}

TEST_CASE("trace: after a checkpoint's load the trace counts its steps from the loaded step", "[trace][run][ckpt]") {
  const std::string ckpt = scratch("resume/ckpt"), path = scratch("resume/trace.json");
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
  auto [x, y] = mlp_batch(MlpConfig{}, kBatch, 0, 0);
  {
    auto run = parallelize(mlp(), adamw(), RunOptions{});
    for (int step = 0; step < 2; ++step) {
      run.forward_backward(x, y);
      run.step_optimizer();
    }
    save(ckpt, run);
  }
  RunOptions o;
  o.trace = path;
  o.trace_steps = 1;
  auto run = parallelize(mlp(), adamw(), o);
  load(ckpt, run);
  REQUIRE(run.step() == 2);
  run.forward_backward(x, y);
  run.step_optimizer();  // the one traced step: written now
  const json doc = read_json(path);
  CHECK(doc["tessel"]["first_step"] == 3);
  CHECK(doc["tessel"]["last_step"] == 3);
  std::set<std::string> steps;
  for (const json& e : doc["traceEvents"])
    if (e.value("cat", "") == "step" && e["name"].get<std::string>().rfind("step ", 0) == 0) steps.insert(e["name"]);
  CHECK(steps == std::set<std::string>{"step 3"});
}

