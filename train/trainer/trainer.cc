#include "train/trainer/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "autograd/api.h"
#include "models/config.h"
#include "nn/autocast.h"
#include "nn/clip.h"
#include "nn/context.h"
#include "nn/optim.h"
#include "nn/schedule.h"
#include "train/atomic_file.h"
#include "train/data.h"
#include "train/plot.h"
#include "train/sample.h"

namespace tessel::train {

double unigram_entropy(const int32_t* tokens, int64_t n, int64_t vocab) {
  std::vector<double> count(size_t(vocab), 0.0);
  for (int64_t i = 0; i < n; ++i) count[size_t(tokens[i])] += 1;
  double h = 0;
  for (double c : count)
    if (c > 0) h -= c / double(n) * std::log(c / double(n));
  return h;
}

double evaluate(models::LanguageModel& model, const DataLoader& heldout, int64_t batches, uint64_t seed) {
  NoGradGuard ng;
  const bool was_training = model.is_training();
  model.eval();
  double total = 0;
  for (int64_t i = 0; i < batches; ++i) {
    Batch b = heldout.global_batch(i);
    nn::ForwardScope scope({seed, uint64_t(i), 0, b.size()});
    total += model.loss(model.forward(b.inputs), b.targets).item<double>();
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

TrainResult run_training(const TrainConfig& cfg, const TrainHooks& hooks) {
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

  auto model = models::make_language_model(mc, cfg.seed);
  model->train();
  nn::AdamWOptions ao;
  ao.lr = cfg.lr;
  ao.betas = {cfg.betas[0], cfg.betas[1]};
  ao.weight_decay = cfg.weight_decay;
  nn::AdamW opt(nn::default_param_groups(*model, cfg.weight_decay), ao);
  // A run shorter than the warmup warms up over the whole run.
  nn::LrSchedule sched = nn::LrSchedule::cosine(cfg.lr, cfg.min_lr, std::min(cfg.warmup_steps, cfg.steps), cfg.steps);
  std::vector<Tensor> params = model->parameters();

  // ---- outputs ---------------------------------------------------------------------
  OutputDir out(cfg.out_dir);
  out.create();
  out.remove_temporaries();
  out.write("config.json", cfg.to_json() + "\n");
  const std::string metrics_path = cfg.metrics_path();
  if (auto parent = std::filesystem::path(metrics_path).parent_path(); !parent.empty())
    std::filesystem::create_directories(parent);
  MetricsWriter metrics(metrics_path);

  if (!hooks.quiet) {
    std::printf("tessel train: %s\n", mc.describe().c_str());
    std::printf("  %lld parameters, %s compute, tokenizer %s (%lld tokens)\n", (long long)model->num_parameters(),
                dtype_name(compute), tokenizer->name().c_str(), (long long)tokenizer->vocab_size());
    std::printf("  corpus %s: %lld train / %lld held-out tokens\n", cfg.data.c_str(),
                (long long)corpus.split.train.size, (long long)corpus.split.heldout.size);
    std::printf("  %lld steps x %lld sequences x %lld tokens (%lld micro-batches), lr %g, seed %llu\n",
                (long long)cfg.steps, (long long)cfg.batch_size, (long long)cfg.seq_len,
                (long long)cfg.micro_batches, cfg.lr, (unsigned long long)cfg.seed);
    std::fflush(stdout);
  }

  std::unique_ptr<ProgressBar> bar;
  if (!hooks.quiet) bar = std::make_unique<ProgressBar>(cfg.steps);
  TrainResult result;
  const double tokens_per_step = double(cfg.batch_size * cfg.seq_len);
  double train_seconds = 0;
  for (int64_t step = 0; step < cfg.steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    const double lr = sched.lr(step);
    opt.set_lr(lr);
    double loss_sum = 0;
    for (int64_t m = 0; m < cfg.micro_batches; ++m) {
      Batch b = loader.micro_batch(step, m, cfg.micro_batches);
      nn::ForwardScope scope({cfg.seed, uint64_t(step), b.first_sample, cfg.batch_size});
      std::optional<nn::AutocastScope> autocast;
      if (compute != DType::Float32) autocast.emplace(compute);
      Tensor loss = model->loss(model->forward(b.inputs), b.targets);
      loss_sum += loss.item<double>();
      (cfg.micro_batches == 1 ? loss : loss / double(cfg.micro_batches)).backward();
    }
    const double gnorm = cfg.grad_clip > 0 ? nn::clip_grad_norm_(params, cfg.grad_clip) : nn::grad_norm(params);
    opt.step();
    opt.zero_grad();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    train_seconds += secs;

    StepMetrics sm;
    sm.step = step + 1;
    sm.loss = loss_sum / double(cfg.micro_batches);
    sm.lr = lr;
    sm.grad_norm = gnorm;
    sm.tokens_per_s = tokens_per_step / secs;
    sm.param_hash = param_hash(model->named_parameters());
    Tensor aux = model->aux_loss();
    if (aux.defined()) sm.extras.emplace_back("aux_loss", aux.item<double>());
    const bool last = step + 1 == cfg.steps;
    if (cfg.eval_every > 0 && ((step + 1) % cfg.eval_every == 0 || last)) {
      sm.extras.emplace_back("eval_loss", evaluate(*model, heldout, cfg.eval_batches, cfg.seed));
    }
    metrics.write(sm);
    if (hooks.on_step) hooks.on_step(sm);
    if (bar) bar->update(step + 1, *sm.loss, *sm.tokens_per_s);
    result.final_loss = *sm.loss;
    result.param_hash = sm.param_hash;
  }
  bar.reset();
  result.steps = cfg.steps;
  result.tokens_per_s = train_seconds > 0 ? tokens_per_step * double(cfg.steps) / train_seconds : 0;
  result.heldout_loss = evaluate(*model, heldout, cfg.eval_batches, cfg.seed);
  result.unigram_entropy =
      unigram_entropy(corpus.split.train.data(), corpus.split.train.size, tokenizer->vocab_size());

  // ---- plot and samples ----------------------------------------------------------------
  write_loss_curve_svg(out.path("loss.svg"), loss_series(read_metrics(metrics_path)));
  std::string samples;
  if (cfg.sample_length > 0) {
    model->eval();
    NoGradGuard ng;
    auto logits_fn = [&](const Tensor& ids) { return model->forward(ids); };
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
    out.write("sample.txt", samples);
  }
  if (!hooks.quiet) {
    std::printf("  held-out loss %.4f nats/token; unigram entropy of the training tokens %.4f nats/token\n",
                result.heldout_loss, result.unigram_entropy);
    std::printf("  %.0f tokens/s; final param_hash %s\n", result.tokens_per_s, result.param_hash.c_str());
    std::printf("  wrote %s, %s/loss.svg%s\n", metrics_path.c_str(), cfg.out_dir.c_str(),
                samples.empty() ? "" : (", " + cfg.out_dir + "/sample.txt").c_str());
    if (!samples.empty()) std::printf("%s", samples.c_str());
  }
  return result;
}

}  // namespace tessel::train
