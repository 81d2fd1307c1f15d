#include "train/trainer/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "autograd/api.h"
#include "checkpoint/manager.h"
#include "autograd/ops/dist.h"
#include "nn/parallel/data_parallel.h"
#include "nn/parallel/parallelize.h"
#include "runtime/allocator.h"
#include "runtime/comm/comm.h"
#include "runtime/mesh.h"
#include "runtime/numerics.h"
#include "runtime/profile.h"
#include "models/config.h"
#include "nn/autocast.h"
#include "nn/clip.h"
#include "nn/context.h"
#include "nn/moe.h"
#include "nn/optim.h"
#include "nn/schedule.h"
#include "train/atomic_file.h"
#include "train/data.h"
#include "train/plot.h"
#include "train/sample.h"
#include "train/dump.h"
#include "train/trainer/checkpointing.h"
#include "train/trainer/pipeline_train.h"

namespace tessel::train {

double unigram_entropy(const int32_t* tokens, int64_t n, int64_t vocab) {
  std::vector<double> count(size_t(vocab), 0.0);
  for (int64_t i = 0; i < n; ++i) count[size_t(tokens[i])] += 1;
  double h = 0;
  for (double c : count)
    if (c > 0) h -= c / double(n) * std::log(c / double(n));
  return h;
}

double evaluate(models::LanguageModel& model, const DataLoader& heldout, int64_t batches, uint64_t seed,
                const BatchLayout& layout, const ForwardFn& forward) {
  NoGradGuard ng;
  const bool was_training = model.is_training();
  model.eval();
  double total = 0;
  for (int64_t i = 0; i < batches; ++i) {
    Batch b = heldout.global_batch(i);
    nn::ForwardScope scope({seed, uint64_t(i), 0, b.size()});
    Tensor ids = layout ? layout(b.inputs) : b.inputs, targets = layout ? layout(b.targets) : b.targets;
    total += model.loss(forward ? forward(ids) : model.forward(ids), targets).item<double>();
  }
  model.train(was_training);
  return total / double(batches);
}

namespace {

std::string decode_ids(const Tokenizer& tok, const std::vector<int64_t>& ids) {
  std::vector<int32_t> v;
  for (int64_t i : ids)
    if (i >= 0 && i < tok.vocab_size()) v.push_back(int32_t(i));
  return tok.decode(v);
}

}  // namespace

namespace {

// Checks that the mesh suits the model: tensor parallelism needs whole heads
// (and whole key/value heads) per rank, expert parallelism whole experts.
void check_model_mesh(const models::ModelConfig& mc, const Mesh& mesh, const std::string& mesh_spec) {
  for (int m = 0; m < mesh.ndim(); ++m) {
    const std::string& n = mesh.name(m);
    const int64_t k = mesh.size(m);
    if (n == "ep" && k > 1) {
      TESSEL_CHECK(mc.arch == models::Arch::Mixtral, "train",
                   "mesh {}: expert parallelism (ep={}) needs a mixture-of-experts model (mixtral), got {}", mesh_spec,
                   k, models::arch_name(mc.arch));
      TESSEL_CHECK(mc.num_experts % k == 0, "train", "mesh {}: ep={} does not divide num_experts={} of {} config '{}'",
                   mesh_spec, k, mc.num_experts, models::arch_name(mc.arch), mc.name);
    }
    if (n == "tp" && k > 1) {
      TESSEL_CHECK(mc.n_head % k == 0, "train", "mesh {}: tp={} does not divide n_head={} of {} config '{}'",
                   mesh_spec, k, mc.n_head, models::arch_name(mc.arch), mc.name);
      TESSEL_CHECK(mc.n_kv_head % k == 0, "train", "mesh {}: tp={} does not divide n_kv_head={} of {} config '{}'",
                   mesh_spec, k, mc.n_kv_head, models::arch_name(mc.arch), mc.name);
    }
  }
}

int64_t mesh_devices(const std::vector<std::pair<std::string, int64_t>>& dims) {
  int64_t n = 1;
  for (const auto& d : dims) n *= d.second;
  return n;
}

std::string mib(int64_t bytes) { return fmt::format(FMT_STRING("{:.2f} MiB"), double(bytes) / (1024.0 * 1024.0)); }

TrainResult run_rank(const TrainConfig& cfg, const TrainHooks& hooks_in);

}  // namespace

TrainResult run_training(const TrainConfig& cfg, const TrainHooks& hooks) {
  cfg.validate();
  const auto dims = parse_mesh(cfg.mesh);
  const int64_t devices = mesh_devices(dims);
  // Already a rank of a running world (a caller's run_local, or mpirun): train here.
  if (comm::has_world()) return run_rank(cfg, hooks);
  if (cfg.backend == "mpi" || (cfg.backend == "auto" && comm::is_mpi_launch())) {
    comm::init_mpi();
    return run_rank(cfg, hooks);
  }
  if (devices <= 1) return run_rank(cfg, hooks);
  // Ranks as threads: every rank trains, rank 0 reports.
  std::vector<TrainResult> results(static_cast<size_t>(devices));
  comm::run_local(int(devices), [&](int rank) { results[size_t(rank)] = run_rank(cfg, hooks); });
  return results[0];
}

namespace {

TrainResult run_rank(const TrainConfig& cfg, const TrainHooks& hooks_in) {
  const int rank = comm::has_world() ? comm::world()->rank() : 0;
  const bool main_rank = rank == 0;
  TrainHooks hooks = hooks_in;
  if (!main_rank) hooks = TrainHooks{nullptr, /*quiet=*/true, hooks_in.keep_params};
  numerics::BitwiseGuard bitwise(cfg.bitwise);
  // ---- validate everything before touching the disk ---------------------------
  cfg.validate();
  auto tokenizer = make_tokenizer(cfg.tokenizer, cfg.vocab, cfg.merges);
  models::ModelConfig mc = models::model_config(cfg.model, cfg.model_config);
  if (cfg.n_layer > 0) mc.n_layer = cfg.n_layer;
  if (cfg.dim > 0) {
    mc.dim = cfg.dim;
    if (cfg.hidden == 0) mc.hidden = 0;  // recomputed from the new width
  }
  if (cfg.n_head > 0) mc.n_head = cfg.n_head;
  if (cfg.n_kv_head > 0) mc.n_kv_head = cfg.n_kv_head;
  if (cfg.hidden > 0) mc.hidden = cfg.hidden;
  if (cfg.dropout >= 0) mc.dropout = cfg.dropout;
  mc = mc.resolved();  // re-validate with the overrides (heads dividing the width, ...)
  TESSEL_CHECK(tokenizer->vocab_size() <= mc.vocab_size, "train",
               "the {} tokenizer has {} tokens but {} config '{}' has vocab_size {}; pick a config with a larger "
               "vocabulary",
               tokenizer->name(), tokenizer->vocab_size(), cfg.model, cfg.model_config, mc.vocab_size);
  TESSEL_CHECK(cfg.seq_len <= mc.max_seq_len, "train", "seq_len {} exceeds the context {} of {} config '{}'",
               cfg.seq_len, mc.max_seq_len, cfg.model, cfg.model_config);
  const DType compute = cfg.param_dtype();
  Corpus corpus = load_corpus(cfg.data, *tokenizer, cfg.heldout_percent);
  DataLoader loader(corpus.split.train, cfg.seq_len, cfg.batch_size, cfg.seed, "data");
  DataLoader heldout(corpus.split.heldout, cfg.seq_len, cfg.batch_size, cfg.seed, "eval");

  // The mesh and the plan; the model is laid out before the optimiser sees it.
  const auto mesh_dims = parse_mesh(cfg.mesh);
  MeshPtr mesh;
  parallel::ParallelPlan plan;
  if (!mesh_dims.empty()) {
    std::vector<Mesh::DimSpec> ds;
    for (const auto& [n, k] : mesh_dims) ds.push_back({n, k});
    const int world = comm::has_world() ? comm::world()->size() : 1;
    TESSEL_CHECK(mesh_devices(mesh_dims) == world, "train", "mesh {} has {} devices but the run has {} ranks",
                 cfg.mesh, mesh_devices(mesh_dims), world);
    mesh = Mesh::world(ds);
    check_model_mesh(mc, *mesh, cfg.mesh);
    plan = parallel::load_plan(cfg.plan == "auto" ? cfg.model : cfg.plan, cfg.sequence_parallel);
  }
  std::unique_ptr<Pipeline> pipe = make_pipeline(cfg, mc, mesh, plan);  // a "pp" mesh dim: this rank's stages
  auto model = pipe ? pipeline_language_model(*pipe) : models::make_language_model(mc, cfg.seed);
  TESSEL_CHECK(cfg.dump.empty() || !pipe, "train",
               "--dump traces every op of the whole model on every rank; with a pp mesh dim each rank runs other "
               "ops (dump the run without pp: in bitwise mode its trace is the pipelined run's)");
  std::unique_ptr<DumpRecorder> dump = cfg.dump.empty() ? nullptr : std::make_unique<DumpRecorder>(cfg.dump, main_rank);
  if (!pipe || cfg.capacity_factor > 0)
    nn::set_capacity_factor(*model, cfg.capacity_factor);  // MoE layers (an error for a model without)
  const bool moe = !pipe && !nn::moe_layers(*model).empty();
  if (mesh && !pipe) parallel::parallelize(*model, mesh, plan);
  // Data parallelism over dp (DDP or a ZeRO stage); FSDP shards the parameters here.
  // (A pipeline reduces its own dp gradients.)
  std::unique_ptr<parallel::DataParallel> dp;
  if (mesh && !pipe && parallel::DataParallel::applies(*mesh)) {
    std::vector<nn::Module*> blocks;
    for (const auto& b : model->blocks()) blocks.push_back(b.get());
    dp = std::make_unique<parallel::DataParallel>(*model, blocks,
                                                  parallel::DataParallelOptions{int(cfg.zero), cfg.ddp_bucket_mb});
  }
  BatchLayout layout;
  if (mesh) layout = [mesh, plan](const Tensor& ids) { return parallel::distribute_batch(ids, mesh, plan); };
  if (pipe) layout = [p = pipe.get()](const Tensor& ids) { return p->layout(ids); };
  ForwardFn forward;
  if (pipe) forward = [p = pipe.get()](const Tensor& ids) { return p->forward(ids); };
  model->train();
  nn::AdamWOptions ao;
  ao.lr = cfg.lr;
  ao.betas = {cfg.betas[0], cfg.betas[1]};
  ao.weight_decay = cfg.weight_decay;
  auto groups = pipe ? pipe->param_groups(cfg.weight_decay) : nn::default_param_groups(*model, cfg.weight_decay);
  nn::AdamW opt(dp ? dp->optimizer_groups(groups) : groups, ao);
  // A run shorter than the warmup warms up over the whole run.
  nn::LrSchedule sched = nn::LrSchedule::cosine(cfg.lr, cfg.min_lr, std::min(cfg.warmup_steps, cfg.steps), cfg.steps);
  std::vector<Tensor> params = pipe ? pipe->stage().parameters()
                               : dp ? dp->parameters()  // what the optimizer updates
                                    : model->parameters();
  // --resume continues from the newest complete checkpoint, whatever mesh saved it.
  TrainCheckpointer ckpt(cfg, *model, opt, main_rank);
  const int64_t first_step = ckpt.resume();

  // ---- outputs (rank 0) ---------------------------------------------------------------
  OutputDir out(cfg.out_dir);
  const std::string metrics_path = cfg.metrics_path();
  std::unique_ptr<MetricsWriter> metrics;
  if (main_rank) {
    out.create();
    out.remove_temporaries();
    out.write("config.json", cfg.to_json() + "\n");
    if (auto parent = std::filesystem::path(metrics_path).parent_path(); !parent.empty())
      std::filesystem::create_directories(parent);
    if (first_step > 0) truncate_metrics(metrics_path, first_step);
    metrics = std::make_unique<MetricsWriter>(metrics_path, /*append=*/first_step > 0);
  }

  if (!hooks.quiet) {
    std::printf("tessel train: %s\n", mc.describe().c_str());
    std::printf("  %lld parameters, %s compute, tokenizer %s (%lld tokens)\n", (long long)model->num_parameters(),
                dtype_name(compute), tokenizer->name().c_str(), (long long)tokenizer->vocab_size());
    std::printf("  corpus %s: %lld train / %lld held-out tokens\n", cfg.data.c_str(),
                (long long)corpus.split.train.size, (long long)corpus.split.heldout.size);
    std::printf("  %lld steps x %lld sequences x %lld tokens (%lld micro-batches), lr %g, seed %llu\n",
                (long long)cfg.steps, (long long)cfg.batch_size, (long long)cfg.seq_len,
                (long long)cfg.micro_batches, cfg.lr, (unsigned long long)cfg.seed);
    if (mesh) {
      parallel::DataParallelMemory mem;
      if (dp) {
        mem = dp->memory(opt);
      } else {
        mem.params = mem.grads = pipe ? pipe->local_parameter_bytes() : parallel::local_parameter_bytes(*model);
        mem.optimizer = opt.state_bytes();
      }
      std::printf("  mesh %s (%s backend), plan %s%s\n", mesh->str().c_str(), comm::world()->backend(),
                  plan.name.c_str(), dp ? (", " + dp->describe()).c_str() : "");
      std::printf("  per rank: parameters %s, gradients %s, optimizer %s, comm buffers %s%s\n",
                  mib(mem.params).c_str(), mib(mem.grads).c_str(), mib(mem.optimizer).c_str(),
                  mib(mem.comm).c_str(),
                  mem.gathered ? (", gathered at once " + mib(mem.gathered)).c_str() : "");
      if (pipe) std::printf("  pipeline %s, %s\n", pipe->schedule().name.c_str(), pipe->stage().describe().c_str());
    }
    std::fflush(stdout);
  }

  cpu_allocator()->reset_peak();  // the training loop's peak, not the setup's (full model before sharding)
  std::unique_ptr<ProgressBar> bar;
  if (!hooks.quiet) bar = std::make_unique<ProgressBar>(cfg.steps);
  TrainResult result;
  const double tokens_per_step = double(cfg.batch_size * cfg.seq_len);
  double train_seconds = 0;
  if (first_step > 0 && !hooks.quiet)
    std::printf("  resumed from %s after step %lld\n", checkpoint::step_dir(ckpt.root(), first_step).c_str(),
                (long long)first_step);
  std::unique_ptr<profile::Profiler> profiler;
  if (cfg.profile || profile::env_enabled()) profiler = std::make_unique<profile::Profiler>();
  for (int64_t step = first_step; step < cfg.steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    const double wait0 = comm::thread_wait_seconds();
    std::optional<profile::Scope> profiling;
    if (profiler) profiling.emplace(profiler.get());
    std::optional<trace::Scope> tracing;  // --dump: this step's forwards and backwards
    if (dump) {
      dump->set_step(step + 1);
      tracing.emplace(dump.get());
    }
    const double lr = sched.lr(step);
    opt.set_lr(lr);
    double loss_sum = 0;
    std::vector<std::pair<std::string, double>> pipe_extras;
    if (pipe) loss_sum = pipeline_forward_backward(*pipe, cfg, loader, step, pipe_extras);
    int64_t dropped = 0;  // MoE token-slots over the capacity, all layers, ranks and micro-batches
    for (int64_t m = 0; !pipe && m < cfg.micro_batches; ++m) {
      if (dp) {
        profile::Timer timer("dp.begin_micro_batch");
        dp->begin_micro_batch(m + 1 == cfg.micro_batches);
      }
      Batch b = loader.micro_batch(step, m, cfg.micro_batches);
      nn::ForwardScope scope({cfg.seed, uint64_t(step), b.first_sample, cfg.batch_size});
      std::optional<nn::AutocastScope> autocast;
      if (compute != DType::Float32) autocast.emplace(compute);
      Tensor ids = layout ? layout(b.inputs) : b.inputs, targets = layout ? layout(b.targets) : b.targets;
      Tensor loss = model->loss(model->forward(ids), targets);
      {
        profile::Timer timer("loss.item");
        loss_sum += loss.item<double>();
      }
      dropped += nn::dropped_tokens(*model);
      (cfg.micro_batches == 1 ? loss : loss / double(cfg.micro_batches)).backward();
    }
    if (dp) {
      profile::Timer timer("dp.finish");
      dp->finish();
    }
    tracing.reset();
    double gnorm = 0;
    {
      profile::Timer timer("clip_grad_norm");
      gnorm = pipe                 ? pipe->clip_grad_norm_(cfg.grad_clip)
              : cfg.grad_clip > 0 ? nn::clip_grad_norm_(params, cfg.grad_clip)
                                  : nn::grad_norm(params);
    }
    {
      profile::Timer timer("optimizer.step");
      opt.step();
      if (dp) dp->after_step();
      opt.zero_grad();
    }
    profiling.reset();  // the profile covers what the step time covers
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    train_seconds += secs;

    StepMetrics sm;
    sm.step = step + 1;
    sm.loss = loss_sum / double(cfg.micro_batches);
    sm.lr = lr;
    sm.grad_norm = gnorm;
    sm.tokens_per_s = tokens_per_step / secs;
    sm.param_hash = pipe ? pipeline_param_hash(*pipe) : param_hash(model->named_parameters());
    sm.extras = pipe_extras;
    // Seconds this rank was blocked in communication during the step (the
    // pipeline reports its transfers' waits itself).
    if (mesh && !pipe) sm.extras.emplace_back("comm_wait_s", comm::thread_wait_seconds() - wait0);
    Tensor aux = pipe ? Tensor() : model->aux_loss();
    if (aux.defined()) sm.extras.emplace_back("aux_loss", aux.item<double>());
    if (moe) sm.extras.emplace_back("moe_dropped_tokens", double(dropped));
    const bool last = step + 1 == cfg.steps;
    if (cfg.eval_every > 0 && ((step + 1) % cfg.eval_every == 0 || last)) {
      sm.extras.emplace_back("eval_loss", evaluate(*model, heldout, cfg.eval_batches, cfg.seed, layout, forward));
    }
    if (metrics) metrics->write(sm);
    if (hooks.on_step) hooks.on_step(sm);
    if (bar) bar->update(step + 1, *sm.loss, *sm.tokens_per_s);
    result.final_loss = *sm.loss;
    result.param_hash = sm.param_hash;
    ckpt.after_step(step + 1);
  }
  ckpt.finish();
  bar.reset();
  result.steps = cfg.steps;
  if (hooks.keep_params) {
    NoGradGuard ng;
    if (pipe) result.final_params = pipe->gather_parameters();  // on rank 0
    else
      for (auto& [name, t] : model->named_parameters()) result.final_params.emplace_back(name, full_tensor(t.detach()));
  }
  if (profiler) {
    result.profile = profiler->table(train_seconds);
    if (main_rank && !hooks.quiet)
      std::printf("profile of rank 0, %lld steps, %.3f s of steps (self times; share of that wall time):\n%s",
                  (long long)(cfg.steps - first_step), train_seconds, result.profile.c_str());
  }
  result.tokens_per_s = train_seconds > 0 ? tokens_per_step * double(cfg.steps - first_step) / train_seconds : 0;
  result.heldout_loss = evaluate(*model, heldout, cfg.eval_batches, cfg.seed, layout, forward);
  result.unigram_entropy =
      unigram_entropy(corpus.split.train.data(), corpus.split.train.size, tokenizer->vocab_size());

  // ---- plot and samples ----------------------------------------------------------------
  if (main_rank) write_loss_curve_svg(out.path("loss.svg"), loss_series(read_metrics(metrics_path)));
  std::string samples;
  if (cfg.sample_length > 0) {
    model->eval();
    NoGradGuard ng;
    auto logits_fn = [&](const Tensor& ids) { return forward ? forward(ids) : model->forward(ids); };
    std::vector<int64_t> prompt{int64_t(tokenizer->encode("\n")[0])};
    SampleOptions so;
    so.max_new_tokens = cfg.sample_length;
    so.max_context = mc.max_seq_len;
    so.seed = cfg.seed;
    so.temperature = 0;
    result.greedy_sample = decode_ids(*tokenizer, generate(logits_fn, prompt, so));
    so.temperature = cfg.temperature;
    so.top_k = cfg.top_k;
    result.sampled_text = decode_ids(*tokenizer, generate(logits_fn, prompt, so));
    samples = "--- greedy ---\n" + result.greedy_sample + "\n--- temperature " + std::to_string(cfg.temperature) +
              ", top-k " + std::to_string(cfg.top_k) + " ---\n" + result.sampled_text + "\n";
    if (main_rank) out.write("sample.txt", samples);
  }
  if (!hooks.quiet) {
    std::printf("  held-out loss %.4f nats/token; unigram entropy of the training tokens %.4f nats/token\n",
                result.heldout_loss, result.unigram_entropy);
    std::printf("  %.0f tokens/s; final param_hash %s\n", result.tokens_per_s, result.param_hash.c_str());
    std::printf("  allocator peak during training %s (this process: %s)\n",
                mib(cpu_allocator()->stats().peak_bytes).c_str(),
                comm::has_world() && comm::world()->size() > 1 && std::string(comm::world()->backend()) == "local"
                    ? "every rank's thread"
                    : "one rank");
    std::printf("  wrote %s, %s/loss.svg%s\n", metrics_path.c_str(), cfg.out_dir.c_str(),
                samples.empty() ? "" : (", " + cfg.out_dir + "/sample.txt").c_str());
    if (!samples.empty()) std::printf("%s", samples.c_str());
  }
  return result;
}

}  // namespace
}  // namespace tessel::train
