#include "tools/bench/generate_bench.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <ostream>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "autograd/api.h"
#include "checkpoint/hf.h"
#include "checkpoint/safetensors.h"
#include "models/language_model.h"
#include "runtime/profile.h"
#include "runtime/threadpool.h"
#include "tools/bench/machine.h"
#include "tools/bench/reference_process.h"
#include "tools/bench/torch_reference.h"
#include "train/sample.h"

namespace tessel::tools {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

int run_generate_bench(const GenerateBenchOptions& o, std::ostream& out) {
  const char* op = "bench generate";
  const int threads = o.threads > 0 ? o.threads : num_threads();
  set_num_threads(threads);
  models::ModelConfig mc = models::model_config(o.model, o.config);
  mc.dropout = 0.0;
  mc = mc.resolved();
  TESSEL_CHECK(o.batch > 0 && o.prompt_len > 0 && o.new_tokens > 0 && o.rounds > 0, op,
               "need batch, prompt-len, new-tokens and rounds > 0 (got {}, {}, {}, {})", o.batch, o.prompt_len,
               o.new_tokens, o.rounds);
  TESSEL_CHECK(o.prompt_len + o.new_tokens <= mc.max_seq_len, op,
               "prompt-len {} + new-tokens {} exceed the context {} of {} config '{}'", o.prompt_len, o.new_tokens,
               mc.max_seq_len, o.model, o.config);
  auto model = models::make_language_model(mc, o.seed);
  model->eval();
  const Tensor ids = randint(0, mc.vocab_size, {o.batch, o.prompt_len}, PhiloxKey{o.seed, stream_for("bench.generate")});
  std::vector<std::vector<int64_t>> prompts(static_cast<size_t>(o.batch));
  const auto flat = ids.to_vector<int64_t>();
  for (int64_t b = 0; b < o.batch; ++b)
    prompts[size_t(b)].assign(flat.begin() + b * o.prompt_len, flat.begin() + (b + 1) * o.prompt_len);

  struct RemoveDir {
    std::string dir;
    ~RemoveDir() {
      std::error_code ec;
      if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    }
  } cleanup;
  std::unique_ptr<ReferenceProcess> ref;
  std::string ref_name;
  if (o.reference) {
    std::string python = o.python.empty() ? reference_python() : o.python;
    TESSEL_CHECK(!python.empty(), op,
                 "no Python with torch and transformers: run `tools/python_venv.sh --hf` or set TESSEL_PYTHON; "
                 "--no-reference times tessel alone");
    char tmpl[] = "/tmp/tessel-bench-generate.XXXXXX";
    TESSEL_CHECK(mkdtemp(tmpl) != nullptr, op, "cannot create a temporary folder");
    cleanup.dir = tmpl;
    checkpoint::NamedTensors params;
    for (const auto& nt : model->named_parameters()) params.emplace_back(nt.name, nt.tensor.detach());
    checkpoint::save_hf(cleanup.dir + "/hf", mc, checkpoint::to_hf(mc, params));
    checkpoint::save_safetensors(cleanup.dir + "/prompts.safetensors", {{"ids", ids}});
    const std::string script = (std::filesystem::path(repository_root()) / "tools/bench/generate_bench.py").string();
    ref = std::make_unique<ReferenceProcess>(
        op, std::vector<std::string>{python, script, cleanup.dir, "--threads", std::to_string(threads), "--new-tokens",
                                     std::to_string(o.new_tokens)});
    const nlohmann::json hello = ref->ask("");
    TESSEL_CHECK(hello.is_object() && hello.value("ready", false), op,
                 "the transformers side ({} {}) did not start; its errors are above (transformers installed? "
                 "tools/python_venv.sh --hf)",
                 python, script);
    ref_name = fmt::format(FMT_STRING("transformers {} (torch {}, CPU, {} threads, {} attention, {})"),
                           hello["transformers"].get<std::string>(), hello["torch"].get<std::string>(),
                           hello["threads"].get<int>(), hello["attn"].get<std::string>(),
                           hello.value("cpu_capability", std::string("ISA unknown")));
  }

  out << fmt::format(FMT_STRING("bench generate: {}; {} prompts x {} tokens, {} new tokens each (greedy, KV cache), "
                                "{} threads, fp32; 1 warm-up + {} timed rounds\n"),
                     mc.describe(), o.batch, o.prompt_len, o.new_tokens, threads, o.rounds);
  out.flush();
  BenchMachine machine = begin_bench(out);
  train::SampleOptions so;
  so.max_new_tokens = o.new_tokens;
  so.temperature = 0;
  so.max_context = mc.max_seq_len;
  auto logits_fn = [&](const Tensor& x) { return model->forward(x); };
  std::vector<double> ours, theirs;
  std::vector<std::vector<int64_t>> our_tokens;
  nlohmann::json their_tokens;
  auto settle = [] { std::this_thread::sleep_for(std::chrono::milliseconds(100)); };
  profile::Profiler profiler;
  auto our_round = [&](bool timed) {
    settle();
    std::optional<profile::Scope> profiling;
    if (o.profile && timed) profiling.emplace(&profiler);
    const auto t0 = Clock::now();
    our_tokens = train::generate_batch(logits_fn, prompts, so);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (timed) ours.push_back(s);
    return s;
  };
  auto their_round = [&](bool timed, int r) {
    settle();
    const nlohmann::json a = ref->ask("run");
    TESSEL_CHECK(a.is_object() && a.contains("s"), op, "the transformers side failed in round {}: {}", r,
                 a.is_discarded() ? "no answer (its errors are above)" : a.dump());
    their_tokens = a["tokens"];
    if (timed) theirs.push_back(a["s"].get<double>());
    return a["s"].get<double>();
  };
  for (int r = 0; r <= o.rounds; ++r) {
    const bool timed = r > 0;
    double a = 0, b = 0;
    if (r % 2 == 0 || !ref) a = our_round(timed);
    if (ref) b = their_round(timed, r);
    if (r % 2 == 1 && ref) a = our_round(timed);
    out << fmt::format(FMT_STRING("  round {}/{}{}: tessel {:.3f} s"), r, o.rounds, timed ? "" : " (warm-up)", a);
    if (ref) out << fmt::format(FMT_STRING(", transformers {:.3f} s"), b);
    out << "\n";
    out.flush();
  }
  ref.reset();
  end_bench(machine);
  int same = 0;
  if (o.reference) {
    for (size_t b = 0; b < our_tokens.size() && b < their_tokens.size(); ++b)
      if (their_tokens[b].get<std::vector<int64_t>>() == our_tokens[b]) ++same;
  }
  const double ot = median(ours), rt = median(theirs);
  const double new_total = double(o.batch * o.new_tokens);
  out << fmt::format(FMT_STRING("  tessel:       {:.3f} s per batch, {:.1f} new tokens/s\n"), ot, new_total / ot);
  if (o.reference) {
    out << fmt::format(FMT_STRING("  transformers: {:.3f} s per batch, {:.1f} new tokens/s  ({})\n"), rt,
                       new_total / rt, ref_name);
    out << fmt::format(FMT_STRING("  speedup {:.3f}; greedy tokens equal for {} of {} prompts\n"), rt / ot, same,
                       o.batch);
  }
  if (o.profile)
    out << "profile of tessel's timed rounds (self times; share of their wall time):\n"
        << profiler.table(ot * double(ours.size()));
  out << machine_summary(machine);
  nlohmann::ordered_json j = {{"bench", "generate"}, {"model", o.model}, {"config", o.config}, {"ours_s", ot}};
  if (o.reference) {
    j["reference"] = ref_name;
    j["reference_s"] = rt;
    j["speedup"] = rt / ot;
    j["reference_tokens_per_s"] = new_total / rt;
    j["same_tokens"] = same;
  }
  j["tokens_per_s"] = new_total / ot;
  j["batch"] = o.batch;
  j["prompt_len"] = o.prompt_len;
  j["new_tokens"] = o.new_tokens;
  j["threads"] = threads;
  j["rounds"] = o.rounds;
  add_machine(j, machine);
  out << j.dump() << "\n";
  out.flush();
  return 0;
}

}  // namespace tessel::tools
