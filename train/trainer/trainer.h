#pragma once
// The trainer behind `tessel train`: a language model (models/) on the text
// of a corpus, on any mesh. It is the public training API's first user
// (run/run.h): tessel::parallelize lays the model out, and every step is
//
//   run.forward_backward(batch.inputs, batch.targets);  // micro-batches, pipeline or not
//   run.step_optimizer();                               // reduce, clip, cosine rate, AdamW, zero
//
// with metrics, evaluation, checkpoints (tessel::Checkpoints) and samples
// around it. Each micro-batch m of M (contiguous sample ranges of the
// deterministic loader's global batch) runs under the ForwardScope {seed,
// step, first sample, global batch}, so dropout masks are slices of the
// full-batch masks. Every run is a pure function of the TrainConfig: same
// config, same bits (metrics' param_hash proves it).
#include <functional>
#include <memory>
#include <string>

#include "models/language_model.h"
#include "run/compile_stats.h"
#include "train/config.h"
#include "train/sample.h"
#include "train/metrics.h"
#include "train/tokenizer.h"

namespace tessel {
class RunBase;  // run/run.h
}  // namespace tessel

namespace tessel::train {

struct TrainResult {
  int64_t steps = 0;
  // The layout it ran on (--mesh auto's choice, or the one given):
  // "MESH|ZERO|MICRO_BATCHES|SP|RECOMPUTE|PIPELINE_SCHEDULE|VIRTUAL_STAGES".
  std::string layout;
  double final_loss = 0;       // last step's training loss
  double heldout_loss = 0;     // at the end (eval_batches batches)
  double unigram_entropy = 0;  // of the training tokens, nats/token
  std::string param_hash;
  double tokens_per_s = 0;
  std::string greedy_sample, sampled_text;
  // Of sampled_text's words, those that occur in the training corpus (train/sample.h).
  KnownWords sample_words;
  // With TrainHooks::keep_params: the final parameters, full (gathered) and plain.
  std::vector<std::pair<std::string, Tensor>> final_params;
  // With TrainConfig::profile (or TESSEL_PROFILE=1): this rank's per-op table.
  std::string profile;
  // The CPU allocator's peak during the training steps: this process's, and
  // the largest over the processes when each rank is one (MPI); with ranks as
  // threads of one process both are the process's.
  int64_t allocator_peak_bytes = 0;
  int64_t allocator_peak_bytes_max = 0;
  // With TrainConfig::compile: what compile mode did (this rank's).
  CompileStats compile;
};

struct TrainHooks {
  // Called after every step with its metrics (tests, custom logging).
  std::function<void(const StepMetrics&)> on_step;
  bool quiet = false;  // no progress bar / console report
  bool keep_params = false;  // return the final parameters in TrainResult::final_params
};

// Validates everything (config, tokenizer files, model preset, corpus, mesh)
// before creating anything on disk; then trains, writing <out_dir>/config.json,
// metrics (JSONL), loss.svg and sample.txt (all atomically or line-flushed).
//
// With a mesh (cfg.mesh, e.g. "dp=2,tp=2") the model is laid out by the
// parallel plan and every rank trains its pieces (docs/parallel.md): under
// mpirun each process is a rank; otherwise (or with backend = local) the
// ranks are threads of this process. Rank 0 writes the outputs and runs the
// hooks; the result is rank 0's.
TrainResult run_training(const TrainConfig& cfg, const TrainHooks& hooks = {});

// Mean cross-entropy over `batches` held-out batches (no grad, eval mode) of
// the language model `run` trains, on whatever layout it has.
double evaluate(RunBase& run, const class DataLoader& heldout, int64_t batches, uint64_t seed);

// Entropy of the unigram token distribution of `tokens` (nats).
double unigram_entropy(const int32_t* tokens, int64_t n, int64_t vocab);

}  // namespace tessel::train
