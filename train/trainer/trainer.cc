#include "train/trainer/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>

#include "autograd/api.h"
#include "checkpoint/manager.h"
#include "dtensor/ops.h"
#include "models/config.h"
#include "nn/context.h"
#include "nn/moe.h"
#include "nn/parallel/derive.h"
#include "nn/parallel/pipeline/pipeline.h"
#include "planner/planner.h"
#include "run/checkpoint.h"
#include "run/run.h"
#include "runtime/allocator.h"
#include "runtime/comm/comm.h"
#include "runtime/numerics.h"
#include "runtime/profile.h"
#include "train/atomic_file.h"
#include "train/data.h"
#include "train/dump.h"
#include "train/plot.h"
#include "train/sample.h"
#include "train/trainer/checkpointing.h"
#include "train/trainer/pretrained.h"

namespace tessel::train {

double unigram_entropy(const int32_t* tokens, int64_t n, int64_t vocab) {
  std::vector<double> count(size_t(vocab), 0.0);
  for (int64_t i = 0; i < n; ++i) count[size_t(tokens[i])] += 1;
  double h = 0;
  for (double c : count)
    if (c > 0) h -= c / double(n) * std::log(c / double(n));
  return h;
}

double evaluate(RunBase& run, const DataLoader& heldout, int64_t batches, uint64_t seed) {
  NoGradGuard ng;
  auto& model = static_cast<models::LanguageModel&>(run.module());
  const bool was_training = model.is_training();
  model.eval();
  double total = 0;
  for (int64_t i = 0; i < batches; ++i) {
    Batch b = heldout.global_batch(i);
    nn::ForwardScope scope({seed, uint64_t(i), 0, b.size()});
    total += model.loss(run.forward(b.inputs), run.input(b.targets)).item<double>();
  }
  model.train(was_training);
  return total / double(batches);
}

namespace {

using Clock = std::chrono::steady_clock;

std::string decode_ids(const Tokenizer& tok, const std::vector<int64_t>& ids) {
  std::vector<int32_t> v;
  for (int64_t i : ids)
    if (i >= 0 && i < tok.vocab_size()) v.push_back(int32_t(i));
  return tok.decode(v);
}

std::string mib(int64_t bytes) { return fmt::format(FMT_STRING("{:.2f} MiB"), double(bytes) / (1024.0 * 1024.0)); }

// Everything a run needs that can be wrong, checked before anything is
// built or written: the config, the tokenizer, the model config with the
// command line's overrides, the corpus.
struct Setup {
  std::shared_ptr<Tokenizer> tokenizer;
  models::ModelConfig model;
  Corpus corpus;
  std::vector<Mesh::DimSpec> mesh;  // empty: one device
  std::optional<Pretrained> pretrained;  // --init-from
};

// Context parallelism cuts every sequence into cp pieces of seq_len / cp
// positions, and attention into 2 cp segments (causal load balancing: rank r
// computes segments r and 2cp-1-r). In bitwise mode each segment must also be
// an aligned subtree of the canonical sum over the sequence (its sums over
// queries finish the one-device tree across ranks: docs/parallel.md "Context
// parallelism") -- balanced_segments_fit, which attention itself asks, so
// every trainer run's attention is balanced.
void check_context_parallel(const TrainConfig& cfg, int64_t cp) {
  const int64_t n = cfg.seq_len, segments = 2 * cp;
  TESSEL_CHECK(n % segments == 0, "train",
               "mesh {}: cp={} needs seq_len divisible by 2 x cp = {}, got seq_len={}: every rank holds seq_len / cp "
               "positions of each sequence, and attention balances its causal work over 2 x cp segments",
               cfg.mesh, cp, segments, n);
  if (!cfg.bitwise) return;
  const int v = numerics::reduction_chunks();
  TESSEL_CHECK(v % segments == 0, "train",
               "mesh {}: bitwise mode needs 2 x cp to divide the {} canonical chunks of a sequence (cp = 1, 2, 4, "
               "..., {}), got cp={}",
               cfg.mesh, v, v / 2, cp);
  TESSEL_CHECK(balanced_segments_fit(n, cp, /*bitwise=*/true, v), "train",
               "mesh {}: bitwise mode with cp={} cuts seq_len={} into {} segments of {} positions, but a sum over a "
               "sequence runs in {} canonical chunks of up to {} position(s) combined by a balanced tree, and each "
               "segment must be one aligned subtree of it ({} consecutive chunks): pick a seq_len that is a multiple "
               "of {}, e.g. {}",
               cfg.mesh, cp, n, segments, n / segments, v, numerics::chunk_size(n, v), v / segments, v,
               (n + v - 1) / v * v);
}

// The model the run trains: the folder's (--init-from) or the named
// config, with the shape flags; `pretrained` gets what --init-from found.
models::ModelConfig training_model(const TrainConfig& cfg, std::optional<Pretrained>* pretrained) {
  models::ModelConfig mc;
  if (!cfg.init_from.empty()) {
    // The folder says what the model is; shape flags would describe another one.
    TESSEL_CHECK(cfg.n_layer == 0 && cfg.dim == 0 && cfg.n_head == 0 && cfg.n_kv_head == 0 && cfg.hidden == 0,
                 "train",
                 "--init-from {}: the model's shape comes from the folder; drop --n-layer, --dim, --n-head, "
                 "--n-kv-head and --hidden",
                 cfg.init_from);
    *pretrained = find_pretrained(cfg.init_from);
    mc = (*pretrained)->model;
    // --model and --config name a model too: one that is not the folder's
    // is an error, not silently another model than the one asked for. (A
    // program that sets TrainConfig::model in C++ is held to it the same
    // way unless it leaves the default.)
    const std::string family = models::arch_name(mc.arch);
    const bool model_named = cfg.was_given("model") || cfg.model != TrainConfig{}.model;
    TESSEL_CHECK(!model_named || cfg.model == family, "train",
                 "--init-from {} holds a {} model ({}), but --model {} names another family: drop --model (the "
                 "folder says what the model is)",
                 cfg.init_from, family, mc.describe(), cfg.model);
    TESSEL_CHECK(!cfg.was_given("model_config") || cfg.model_config == mc.name, "train",
                 "--init-from {} holds a {} model '{}' ({}), but --config {} names another preset: drop --config "
                 "(the folder says what the model is)",
                 cfg.init_from, family, mc.name, mc.describe(), cfg.model_config);
  } else {
    mc = models::model_config(cfg.model, cfg.model_config);
  }
  if (cfg.n_layer > 0) mc.n_layer = cfg.n_layer;
  if (cfg.dim > 0) {
    mc.dim = cfg.dim;
    if (cfg.hidden == 0) mc.hidden = 0;  // recomputed from the new width
  }
  if (cfg.n_head > 0) {
    // A preset without grouped key/value heads (NanoGPT) keeps them equal.
    if (cfg.n_kv_head == 0 && mc.n_kv_head == mc.n_head) mc.n_kv_head = cfg.n_head;
    mc.n_head = cfg.n_head;
  }
  if (cfg.n_kv_head > 0) mc.n_kv_head = cfg.n_kv_head;
  if (cfg.hidden > 0) mc.hidden = cfg.hidden;
  if (cfg.dropout >= 0) mc.dropout = cfg.dropout;
  return mc.resolved();  // re-validated with the overrides (heads dividing the width, ...)
}

Setup prepare(const TrainConfig& cfg) {
  cfg.validate();
  Setup s;
  s.tokenizer = make_tokenizer(cfg.tokenizer, cfg.tokenizer == "hf" ? cfg.tokenizer_json : cfg.vocab, cfg.merges);
  s.model = training_model(cfg, &s.pretrained);
  TESSEL_CHECK(s.tokenizer->vocab_size() <= s.model.vocab_size, "train",
               "the {} tokenizer has {} tokens but {} config '{}' has vocab_size {}; pick a config with a larger "
               "vocabulary",
               s.tokenizer->name(), s.tokenizer->vocab_size(), models::arch_name(s.model.arch), s.model.name,
               s.model.vocab_size);
  TESSEL_CHECK(cfg.seq_len <= s.model.max_seq_len, "train", "seq_len {} exceeds the context {} of {} config '{}'",
               cfg.seq_len, s.model.max_seq_len, models::arch_name(s.model.arch), s.model.name);
  for (const auto& [name, size] : parse_mesh(cfg.mesh)) {
    s.mesh.push_back({name, size});
    TESSEL_CHECK(name != "pp" || cfg.dump.empty(), "train",
                 "--dump traces every op of the whole model on every rank; with a pp mesh dim each rank runs other "
                 "ops (dump the run without pp: in bitwise mode its trace is the pipelined run's)");
    // Tensor parallelism needs whole (key/value) heads per rank, expert parallelism whole experts.
    const models::ModelConfig& m = s.model;
    if (name == "ep" && size > 1) {
      TESSEL_CHECK(m.arch == models::Arch::Mixtral, "train",
                   "mesh {}: expert parallelism (ep={}) needs a mixture-of-experts model (mixtral), got {}", cfg.mesh,
                   size, models::arch_name(m.arch));
      TESSEL_CHECK(m.num_experts % size == 0, "train", "mesh {}: ep={} does not divide num_experts={} of {} config '{}'",
                   cfg.mesh, size, m.num_experts, models::arch_name(m.arch), m.name);
    }
    if (name == "cp" && size > 1) check_context_parallel(cfg, size);
    if (name == "tp" && size > 1) {
      TESSEL_CHECK(m.n_head % size == 0, "train", "mesh {}: tp={} does not divide n_head={} of {} config '{}'",
                   cfg.mesh, size, m.n_head, models::arch_name(m.arch), m.name);
      TESSEL_CHECK(m.n_kv_head % size == 0, "train", "mesh {}: tp={} does not divide n_kv_head={} of {} config '{}'",
                   cfg.mesh, size, m.n_kv_head, models::arch_name(m.arch), m.name);
    }
  }
  s.corpus = load_corpus(cfg.data, *s.tokenizer, cfg.heldout_percent);
  // The loss is the mean over target tokens. Gradient accumulation averages
  // the micro-batches' means, which is that mean only when every micro-batch
  // holds as many targets -- not so when prompts are masked out.
  TESSEL_CHECK(!s.corpus.loss_mask || cfg.micro_batches == 1, "train",
               "{} is fine-tuning data whose prompts are not targets: micro_batches = {} would average per-micro-batch "
               "means over different numbers of target tokens (not the batch's mean); use micro_batches = 1 (dp, tp, "
               "ZeRO and pp with one micro-batch give the one-device loss)",
               cfg.data, cfg.micro_batches);
  return s;
}

RunOptions run_options(const TrainConfig& cfg) {
  RunOptions o;
  o.zero = int(cfg.zero);
  o.clip = cfg.grad_clip;
  o.micro_batches = cfg.micro_batches;
  o.seed = cfg.seed;
  // A run shorter than the warmup warms up over the whole run.
  o.lr_schedule = nn::LrSchedule::cosine(cfg.lr, cfg.min_lr, std::min(cfg.warmup_steps, cfg.steps), cfg.steps);
  o.bucket_mb = cfg.ddp_bucket_mb;
  o.compute = cfg.param_dtype();
  if (o.compute == DType::Float16) {
    nn::GradScalerOptions scaling;
    scaling.init_scale = cfg.loss_scale;
    o.loss_scaling = scaling;
  }
  o.pipeline_schedule = cfg.pipeline_schedule;
  o.virtual_stages = int(cfg.virtual_stages);
  o.pipeline_split = cfg.pipeline_split;
  o.detect_anomaly = cfg.detect_anomaly;
  o.trace = cfg.trace;
  o.trace_steps = cfg.trace_steps;
  o.compile = cfg.compile;
  o.compile_fusion = !cfg.no_fusion;
  o.recompute = nn::parse_recompute(cfg.recompute);
  o.compile_modules = nn::parse_compile_modules(cfg.compile_modules);
  return o;
}

OptimizerSpec optimizer(const TrainConfig& cfg) {
  nn::AdamWOptions o;
  o.lr = cfg.lr;
  o.betas = {cfg.betas[0], cfg.betas[1]};
  o.weight_decay = cfg.weight_decay;
  return adamw(o);
}

// The model on Meta: tessel::parallelize creates and initialises (from the
// seed) only this rank's pieces.
std::shared_ptr<models::LanguageModel> build_on_meta(const TrainConfig& cfg, const models::ModelConfig& mc) {
  std::shared_ptr<models::LanguageModel> model;
  {
    nn::ConstructionScope meta(kMeta);
    model = models::build_model(mc);
  }
  if (!nn::moe_layers(*model).empty() || cfg.capacity_factor > 0)
    nn::set_capacity_factor(*model, cfg.capacity_factor);  // MoE layers (an error for a model without)
  return model;
}

// --plan auto: the plan derived from the model's traced forward
// (parallel::derive_plan; for the shipped models it is the built-in plan).
parallel::ParallelPlan derived_plan(models::LanguageModel& model, bool sequence_parallel) {
  parallel::DeriveOptions options;
  options.sequence_parallel = sequence_parallel;
  options.name = sequence_parallel ? "derived-tp-sp" : "derived-tp";
  return parallel::derive_plan(model, options);
}

void print_header(const TrainConfig& cfg, const Setup& s, const Run<models::LanguageModel>& run,
                  const Tokenizer& tok) {
  std::printf("tessel train: %s\n", s.model.describe().c_str());
  std::printf("  %lld parameters, %s compute, tokenizer %s (%lld tokens)\n",
              (long long)run.model().num_parameters(), dtype_name(cfg.param_dtype()),
              tok.name().c_str(), (long long)tok.vocab_size());
  std::printf("  corpus %s: %lld train / %lld held-out tokens\n", cfg.data.c_str(),
              (long long)s.corpus.split.train.size, (long long)s.corpus.split.heldout.size);
  std::printf("  %lld steps x %lld sequences x %lld tokens (%lld micro-batches), lr %g, seed %llu\n",
              (long long)cfg.steps, (long long)cfg.batch_size, (long long)cfg.seq_len, (long long)cfg.micro_batches,
              cfg.lr, (unsigned long long)cfg.seed);
  if (cfg.recompute != "none")
    std::printf("  activation recomputation: %s (%s)\n", cfg.recompute.c_str(),
                cfg.recompute == "full" ? "each block keeps only its input" : "attention cores");
  if (run.mesh()) {
    const parallel::DataParallelMemory mem = run.memory();
    std::printf("  %s\n", run.describe().c_str());
    std::printf("  per rank: parameters %s, gradients %s, optimizer %s, comm buffers %s%s\n", mib(mem.params).c_str(),
                mib(mem.grads).c_str(), mib(mem.optimizer).c_str(), mib(mem.comm).c_str(),
                mem.gathered ? (", gathered at once " + mib(mem.gathered)).c_str() : "");
    if (const auto* pipe = run.pipeline())
      std::printf("  pipeline %s, %s\n", pipe->schedule().name.c_str(), pipe->stage().describe().c_str());
  }
  std::fflush(stdout);
}

// The run's settings as config.json and the checkpoints record them: with
// --init-from, the model family and preset are the folder's, not the
// defaults the flags were left at.
TrainConfig as_trained(const TrainConfig& cfg, const models::ModelConfig& mc) {
  TrainConfig c = cfg;
  if (!cfg.init_from.empty()) {
    c.model = models::arch_name(mc.arch);
    c.model_config = mc.name;
  }
  return c;
}

// Rank 0's outputs: the folder, config.json (`cfg` as trained), and the
// metrics file (a resumed run keeps the records up to its step).
std::unique_ptr<MetricsWriter> open_outputs(const TrainConfig& cfg, OutputDir& out, int64_t first_step) {
  out.create();
  out.remove_temporaries();
  out.write("config.json", cfg.to_json() + "\n");
  const std::string path = cfg.metrics_path();
  if (auto parent = std::filesystem::path(path).parent_path(); !parent.empty())
    std::filesystem::create_directories(parent);
  if (first_step > 0) truncate_metrics(path, first_step);
  return std::make_unique<MetricsWriter>(path, /*append=*/first_step > 0);
}

// One step's record. `comm_wait_s`: seconds this rank was blocked in
// collectives during the step (a pipeline reports its transfers' waits
// itself, bubble included: this rank's and the pp ranks' mean).
StepMetrics step_metrics(const TrainConfig& cfg, Run<models::LanguageModel>& run, const StepReport& report,
                         const StepLoss& loss, double secs, double comm_wait_s) {
  StepMetrics sm;
  sm.step = report.step;
  sm.loss = loss.loss;
  sm.lr = report.lr;
  sm.grad_norm = report.grad_norm;
  sm.tokens_per_s = double(cfg.batch_size * cfg.seq_len) / secs;
  sm.param_hash = run.param_hash();
  if (run.options().loss_scaling) {
    sm.extras.emplace_back("loss_scale", report.loss_scale);
    sm.extras.emplace_back("skipped", report.skipped ? 1.0 : 0.0);
  }
  if (run.pipeline()) {
    if (loss.aux_loss) sm.extras.emplace_back("aux_loss", *loss.aux_loss);
    sm.extras.emplace_back("comm_wait_s", loss.comm_wait_s);
    sm.extras.emplace_back("comm_wait_mean_s", loss.comm_wait_mean_s);
    if (loss.moe_dropped_tokens) sm.extras.emplace_back("moe_dropped_tokens", double(*loss.moe_dropped_tokens));
    return sm;
  }
  if (run.mesh()) sm.extras.emplace_back("comm_wait_s", comm_wait_s);
  if (Tensor aux = run.model().aux_loss(); aux.defined()) sm.extras.emplace_back("aux_loss", aux.item<double>());
  if (loss.moe_dropped_tokens) sm.extras.emplace_back("moe_dropped_tokens", double(*loss.moe_dropped_tokens));
  return sm;
}

// A greedy and a sampled continuation of "\n" (TrainResult and sample.txt).
// Every rank runs the model; only the reporting rank (`report`) measures the
// sample's words against the corpus (it reads the corpus text again).
std::string sample(const TrainConfig& cfg, const Setup& s, Run<models::LanguageModel>& run, TrainResult& result,
                   bool report) {
  run.model().eval();
  auto logits_fn = [&](const Tensor& ids) { return run.forward(ids); };
  std::vector<int64_t> prompt{int64_t(s.tokenizer->encode("\n")[0])};
  SampleOptions so;
  so.max_new_tokens = cfg.sample_length;
  // Positions beyond the trained sequence length were never trained (GPT's
  // learned position embeddings are still random there): sample within them.
  so.max_context = std::min(s.model.max_seq_len, cfg.seq_len);
  so.seed = cfg.seed;
  so.temperature = 0;
  // The KV cache when the sample fits the context; otherwise a sliding window.
  so.kv_cache = int64_t(prompt.size()) + so.max_new_tokens - 1 <= so.max_context;
  result.greedy_sample = decode_ids(*s.tokenizer, generate(logits_fn, prompt, so));
  so.temperature = cfg.temperature;
  so.top_k = cfg.top_k;
  result.sampled_text = decode_ids(*s.tokenizer, generate(logits_fn, prompt, so));
  if (report) result.sample_words = known_words(result.sampled_text, word_set(load_corpus_text(cfg.data)));
  return "--- greedy ---\n" + result.greedy_sample + "\n--- temperature " + std::to_string(cfg.temperature) +
         ", top-k " + std::to_string(cfg.top_k) + " ---\n" + result.sampled_text + "\n";
}

void print_footer(const TrainConfig& cfg, const TrainResult& result, double train_seconds, int64_t steps_run,
                  const std::string& samples) {
  if (!result.profile.empty())
    std::printf("profile of rank 0, %lld steps, %.3f s of steps (self times; share of that wall time):\n%s",
                (long long)steps_run, train_seconds, result.profile.c_str());
  std::printf("  held-out loss %.4f nats/token; unigram entropy of the training tokens %.4f nats/token\n",
              result.heldout_loss, result.unigram_entropy);
  std::printf("  %.0f tokens/s; final param_hash %s\n", result.tokens_per_s, result.param_hash.c_str());
  const bool threads =
      comm::has_world() && comm::world()->size() > 1 && std::string(comm::world()->backend()) == "local";
  const bool processes = comm::has_world() && comm::world()->size() > 1 && !threads;
  std::printf("  allocator peak during training %s (this process: %s%s)\n", mib(result.allocator_peak_bytes).c_str(),
              threads ? "every rank's thread" : "one rank",
              processes ? ("; the largest rank's: " + mib(result.allocator_peak_bytes_max)).c_str() : "");
  std::printf("  wrote %s, %s/loss.svg%s\n", cfg.metrics_path().c_str(), cfg.out_dir.c_str(),
              samples.empty() ? "" : (", " + cfg.out_dir + "/sample.txt").c_str());
  if (!samples.empty()) {
    std::printf("%s", samples.c_str());
    std::printf("  the sampled text: %.0f%% of its %lld words are words of the corpus (seen 3+ times there)\n",
                100.0 * result.sample_words.share(), (long long)result.sample_words.words);
  }
  if (cfg.saves_final_checkpoint())
    std::printf("  more text from this model: ./tessel generate --from %s --prompt \"The \" --temperature %g "
                "--top-k %lld --max-new-tokens 200\n",
                cfg.out_dir.c_str(), cfg.temperature, (long long)cfg.top_k);
}

TrainResult run_rank(const TrainConfig& cfg, const TrainHooks& hooks_in);

// --mesh auto: the planner's layout for this model, batch and machine
// (docs/plan.md), written into the config before any rank trains.
TrainConfig plan_layout_here(const TrainConfig& in, int64_t devices, bool quiet) {
  std::optional<Pretrained> pretrained;
  planner::PlanRequest r;
  r.model = training_model(in, &pretrained);
  r.cluster = planner::cluster_preset("cpu");
  if (devices > 0) r.cluster = planner::with_devices(r.cluster, devices);
  r.global_batch = in.batch_size;
  r.seq_len = in.seq_len;
  r.compute = in.param_dtype();
  r.bitwise = in.bitwise;
  // What the trainer would refuse: several micro-batches of prompt/completion
  // data (uneven target counts), and bitwise cp cuts that do not line up with
  // the canonical chunks; and --recompute when the user fixed it.
  if (in.data.size() >= 6 && in.data.compare(in.data.size() - 6, 6, ".jsonl") == 0) r.fixed["micro_batches"] = 1;
  if (in.bitwise) r.fixed["cp"] = 1;
  if (in.recompute != "none") r.recompute = nn::parse_recompute(in.recompute);
  const planner::PlanResult p = planner::plan(r);
  const planner::Candidate& b = p.best;
  TrainConfig out = in;
  out.mesh = b.mesh();
  out.devices = 0;
  out.zero = b.zero;
  out.micro_batches = b.micro_batches;
  out.sequence_parallel = b.sp;
  out.recompute = nn::recompute_name(b.recompute);
  if (b.pp > 1) out.pipeline_schedule = b.schedule;
  if (b.pp > 1) out.virtual_stages = b.virtual_stages;
  if (!quiet)
    std::printf("--mesh auto: %s on %lld device(s) (predicted %.3g s per step, %s per rank; `tessel plan` explains)\n",
                b.str().c_str(), (long long)r.cluster.devices(), b.step_s, mib(b.total).c_str());
  out.validate();
  return out;
}

// The layout fields --mesh auto chooses, as one line (and back), so rank 0
// of an MPI job can hand its plan to the others; TrainResult::layout.
std::string layout_line(const TrainConfig& c) {
  return fmt::format(FMT_STRING("{}|{}|{}|{}|{}|{}|{}"), c.mesh, c.zero, c.micro_batches, c.sequence_parallel ? 1 : 0,
                     c.recompute, c.pipeline_schedule, c.virtual_stages);
}
TrainConfig with_layout_line(TrainConfig c, const std::string& line) {
  std::vector<std::string> f;
  size_t at = 0;
  for (size_t bar; (bar = line.find('|', at)) != std::string::npos; at = bar + 1) f.push_back(line.substr(at, bar - at));
  f.push_back(line.substr(at));
  TESSEL_CHECK(f.size() == 7, "train", "--mesh auto: rank 0 sent a malformed layout '{}'", line);
  c.mesh = f[0];
  c.devices = 0;
  c.zero = std::stol(f[1]);
  c.micro_batches = std::stol(f[2]);
  c.sequence_parallel = f[3] == "1";
  c.recompute = f[4];
  c.pipeline_schedule = f[5];
  c.virtual_stages = std::stol(f[6]);
  c.validate();
  return c;
}

// --mesh auto. Ranks as threads: planned here, before they start, for
// --devices (default one per core). Under tessel launch / mpirun: rank 0
// plans for the job's size and broadcasts the layout -- every rank must run
// the same one, and a plan on each rank could differ (a calibration measured
// on each) -- or its error, which every rank then raises.
TrainConfig planned(const TrainConfig& in, bool quiet) {
  if (!comm::has_world()) return plan_layout_here(in, in.devices, quiet);
  const comm::CommPtr& world = comm::world();
  TESSEL_CHECK(in.devices == 0 || in.devices == world->size(), "train",
               "--mesh auto --devices {}: this job has {} ranks; the plan is for the ranks there are (drop --devices)",
               in.devices, world->size());
  constexpr int64_t kBytes = 4096;
  Tensor msg = zeros({kBytes / 8}, TensorOptions(DType::Int64));
  if (world->rank() == 0) {
    std::string line;
    try {
      line = "ok:" + layout_line(plan_layout_here(in, world->size(), quiet));
    } catch (const std::exception& e) {
      line = std::string("error:") + e.what();
    }
    line.resize(std::min<size_t>(line.size(), kBytes - 1));
    std::memcpy(msg.raw_data(), line.data(), line.size());
  }
  world->broadcast(msg, /*root=*/0)->wait();
  const std::string line(static_cast<const char*>(msg.raw_data()));
  if (line.rfind("error:", 0) == 0) throw Error(line.substr(6));
  return with_layout_line(in, line.substr(3));
}

}  // namespace

TrainResult run_training(const TrainConfig& cfg_in, const TrainHooks& hooks) {
  cfg_in.validate();
  if (cfg_in.backend == "mpi" || (cfg_in.backend == "auto" && comm::is_mpi_launch())) comm::init_mpi();
  const TrainConfig cfg = cfg_in.mesh == "auto" ? planned(cfg_in, hooks.quiet) : cfg_in;
  numerics::BitwiseGuard bitwise(cfg.bitwise);  // run_local gives every rank thread the caller's mode
  int64_t devices = 1;
  for (const auto& [name, size] : parse_mesh(cfg.mesh)) devices *= size;
  // A rank of a running job (mpirun, a caller's run_local) or one device: train here.
  TrainResult result;
  if (comm::has_world() || devices == 1) {
    result = run_rank(cfg, hooks);
  } else {  // ranks as threads: every rank trains, rank 0 reports
    std::vector<TrainResult> results(static_cast<size_t>(devices));
    comm::run_local(int(devices), [&](int rank) { results[size_t(rank)] = run_rank(cfg, hooks); });
    result = std::move(results[0]);
  }
  result.layout = layout_line(cfg);
  return result;
}

namespace {

TrainResult run_rank(const TrainConfig& cfg, const TrainHooks& hooks_in) {
  const int rank = comm::has_world() ? comm::world()->rank() : 0;
  const bool main_rank = rank == 0;
  const TrainHooks hooks = main_rank ? hooks_in : TrainHooks{nullptr, /*quiet=*/true, hooks_in.keep_params};

  // ---- set up: everything is checked before anything is written ---------------------------
  const Setup s = prepare(cfg);
  const DataLoader loader(s.corpus.split.train, cfg.seq_len, cfg.batch_size, cfg.seed, "data");
  const DataLoader heldout(s.corpus.split.heldout, cfg.seq_len, cfg.batch_size, cfg.seed, "eval");
  const MeshPtr mesh = s.mesh.empty() ? nullptr : Mesh::world(s.mesh);
  std::shared_ptr<models::LanguageModel> model = build_on_meta(cfg, s.model);
  const parallel::ParallelPlan plan = cfg.plan == "auto" ? derived_plan(*model, cfg.sequence_parallel)
                                                         : parallel::load_plan(cfg.plan, cfg.sequence_parallel);
  Run<models::LanguageModel> run = parallelize(std::move(model), mesh, plan, optimizer(cfg), run_options(cfg));
  const models::ModelConfig& mc = run.model().config;
  std::optional<Checkpoints> ckpt;
  const bool save_final = cfg.saves_final_checkpoint();
  if (save_final || cfg.resume)
    ckpt.emplace(cfg.checkpoint_root(), Checkpoints::Options{cfg.ckpt_every, cfg.keep_last, !cfg.ckpt_sync});
  if (cfg.resume) {  // whatever mesh saved it; a checkpoint of another run is an error
    ckpt->resume(run, [&](const nlohmann::json& extra, int64_t step) {
      check_resumed(extra, cfg, mc, ckpt->root(), step);
    });
  }
  const int64_t first_step = run.step();
  std::optional<WeightsLoaded> initialised;
  if (s.pretrained && first_step == 0) initialised = load_pretrained_weights(*s.pretrained, run);
  std::unique_ptr<DumpRecorder> dump = cfg.dump.empty() ? nullptr : std::make_unique<DumpRecorder>(cfg.dump, main_rank);

  // ---- outputs (rank 0) -----------------------------------------------------------------------
  OutputDir out(cfg.out_dir);
  const TrainConfig recorded = as_trained(cfg, s.model);
  std::unique_ptr<MetricsWriter> metrics = main_rank ? open_outputs(recorded, out, first_step) : nullptr;
  if (!hooks.quiet) print_header(cfg, s, run, *s.tokenizer);
  if (!hooks.quiet && initialised)
    std::printf("  initialised from %s %s: %zu tensors, %s read by rank 0; optimizer and schedule fresh\n",
                s.pretrained->kind_name(), s.pretrained->path.c_str(), initialised->tensors,
                mib(int64_t(initialised->bytes_read)).c_str());
  if (!hooks.quiet && first_step > 0)
    std::printf("  resumed from %s after step %lld\n", checkpoint::step_dir(ckpt->root(), first_step).c_str(),
                (long long)first_step);

  // ---- the loop: the same for every layout ------------------------------------------------------
  cpu_allocator()->reset_peak();  // the training loop's peak, not the setup's
  std::unique_ptr<ProgressBar> bar = hooks.quiet ? nullptr : std::make_unique<ProgressBar>(cfg.steps);
  std::unique_ptr<profile::Profiler> profiler;
  if (cfg.profile || profile::env_enabled()) profiler = std::make_unique<profile::Profiler>();
  TrainResult result;
  double train_seconds = 0;
  for (int64_t step = first_step; step < cfg.steps; ++step) {
    const auto t0 = Clock::now();
    const double wait0 = comm::thread_wait_seconds();
    std::optional<profile::Scope> profiling;
    if (profiler) profiling.emplace(profiler.get());
    const Batch batch = loader.global_batch(step);
    StepLoss loss;
    StepReport report;
    try {
      {
        std::optional<trace::Scope> tracing;  // --dump: this step's forwards and backwards
        if (dump) {
          dump->set_step(step + 1);
          tracing.emplace(dump.get());
        }
        loss = run.forward_backward(batch.inputs, batch.targets);
      }
      report = run.step_optimizer();
    } catch (const anomaly::AnomalyError& e) {
      if (dump) dump->anomaly(e.what());  // the trace ends where --detect-anomaly stopped (tessel verify says so)
      throw;
    }
    profiling.reset();  // the profile covers what the step time covers
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    train_seconds += secs;

    StepMetrics sm = step_metrics(cfg, run, report, loss, secs, comm::thread_wait_seconds() - wait0);
    if (report.skipped && bar) {  // the main rank only (the others have no bar)
      bar->finish();
      std::printf("  step %lld skipped: an inf/NaN gradient at loss scale %g (now %g)\n", (long long)report.step,
                  report.loss_scale, run.loss_scale());
    }
    const bool last = report.step == cfg.steps;
    if (cfg.eval_every > 0 && (report.step % cfg.eval_every == 0 || last))
      sm.extras.emplace_back("eval_loss", evaluate(run, heldout, cfg.eval_batches, cfg.seed));
    if (metrics) metrics->write(sm);
    if (hooks.on_step) hooks.on_step(sm);
    if (bar) bar->update(report.step, *sm.loss, *sm.tokens_per_s);
    result.final_loss = *sm.loss;
    result.param_hash = sm.param_hash;
    if (ckpt && save_final) ckpt->after_step(run, last, checkpoint_state(recorded, mc, report.step));
  }
  wait_for_save(run);
  bar.reset();
  // Resumed at its last step (or --steps 0): nothing trained, the parameters are where the run started.
  if (result.param_hash.empty()) result.param_hash = run.param_hash();
  if (first_step >= cfg.steps && main_rank && !hooks.quiet)
    std::printf("  nothing to train: the run is already at step %lld of %lld\n", (long long)first_step,
                (long long)cfg.steps);
  const std::string trace_path = run.write_trace();  // when the run ended inside the trace's steps
  if (!trace_path.empty() && !hooks.quiet) std::printf("  wrote the timeline %s\n", trace_path.c_str());
  result.compile = run.compile_stats();
  if (cfg.compile && result.compile.enabled && main_rank && !hooks.quiet) {
    const CompileStats& c = result.compile;
    if (c.refused.empty())
      std::printf("  compile: %lld step(s) replayed (%lld launches each, %lld of them in %lld fused chain(s); %.1f MiB of "
                  "buffers, %.1f MiB of them held between steps), %lld eager, %lld recording(s)\n",
                  (long long)c.replays, (long long)c.launches, (long long)c.fused_launches, (long long)c.fused_chains,
                  double(c.buffer_bytes) / (1 << 20), double(c.held_bytes) / (1 << 20), (long long)c.eager_steps,
                  (long long)c.captures);
    else
      std::printf("  compile: stopped, every step ran eagerly after it: %s\n", c.refused.c_str());
  }

  if (result.compile.modules.modules > 0 && main_rank && !hooks.quiet) {
    const nn::ModuleCompileStats& m = result.compile.modules;
    std::printf("  compile (mixed mode, %s, %lld modules): %lld of %lld calls replayed (the modules' recordings: %lld "
                "launches and %.1f MiB of buffers in all, %.1f MiB of them held between steps), %lld recorded, %lld "
                "recorded again%s%s\n",
                cfg.compile_modules != "none" ? cfg.compile_modules.c_str() : "attention: MoE model", (long long)m.modules, (long long)m.replayed, (long long)m.calls,
                (long long)m.launches, double(m.buffer_bytes) / (1 << 20), double(m.held_bytes) / (1 << 20),
                (long long)m.recordings,
                (long long)m.recaptures, m.refused.empty() ? "" : "; eager for good: ", m.refused.c_str());
  }

  // ---- after training: parameters, held-out loss, samples, plot --------------------------------
  result.allocator_peak_bytes = result.allocator_peak_bytes_max = cpu_allocator()->stats().peak_bytes;
  if (comm::has_world() && comm::world()->size() > 1 && std::string(comm::world()->backend()) != "local") {
    Tensor peak = tensor(std::vector<int64_t>{result.allocator_peak_bytes}, Dims{1});
    comm::world()->all_reduce(peak, comm::ReduceOp::Max)->wait();
    result.allocator_peak_bytes_max = peak.to_vector<int64_t>()[0];
  }
  result.steps = cfg.steps;
  if (hooks.keep_params) result.final_params = run.full_parameters();
  if (profiler) result.profile = profiler->table(train_seconds);
  result.tokens_per_s =
      train_seconds > 0 ? double(cfg.batch_size * cfg.seq_len) * double(cfg.steps - first_step) / train_seconds : 0;
  result.heldout_loss = evaluate(run, heldout, cfg.eval_batches, cfg.seed);
  result.unigram_entropy =
      unigram_entropy(s.corpus.split.train.data(), s.corpus.split.train.size, s.tokenizer->vocab_size());
  if (main_rank) write_loss_curve_svg(out.path("loss.svg"), loss_series(read_metrics(cfg.metrics_path())));
  const std::string samples = cfg.sample_length > 0 ? sample(cfg, s, run, result, main_rank) : "";
  if (main_rank && !samples.empty()) out.write("sample.txt", samples);
  if (!hooks.quiet) print_footer(cfg, result, train_seconds, cfg.steps - first_step, samples);
  return result;
}

}  // namespace
}  // namespace tessel::train
