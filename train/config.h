#pragma once
// TrainConfig: every setting of a training run, from (in increasing
// precedence) the defaults below, a TOML file, and command-line flags.
//
// TOML keys are the field names (steps = 1000, lr = 6e-4, betas = [0.9, 0.95]);
// flags are the same names with dashes (--steps 1000, --lr 6e-4,
// --betas 0.9,0.95), plus --config-file FILE for the TOML file; --config NAME
// is the model preset (model_config) and --out DIR the output folder (out_dir). Unknown keys in
// the file, values of the wrong type and non-numeric flags are errors that
// name the key (and the file); validate() names the offending field.
#include <array>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/dtype.h"

namespace CLI {
class App;
}

namespace tessel::train {

struct TrainConfig {
  // model
  std::string model = "nanogpt";      // model family
  std::string model_config = "tiny";  // size preset of that family
  // Fine-tuning: start from the weights in this folder (a Hugging Face model
  // folder, a tessel checkpoint or a run folder; train/trainer/pretrained.h).
  // The model (family and shape) is the folder's; the optimizer and schedule
  // start fresh. A --resume that finds a checkpoint of this run wins.
  std::string init_from;
  // The keys a config file or a flag set (load_toml, add_train_options) --
  // not a setting (to_json leaves it out): it tells "asked for" from "the
  // default", as when --model or --config is given beside --init-from.
  std::set<std::string> given;
  bool was_given(const std::string& key) const { return given.count(key) > 0; }
  // Overrides of the preset's shape (0 / -1: keep the preset's value).
  int64_t n_layer = 0;
  int64_t dim = 0;
  int64_t n_head = 0;
  int64_t n_kv_head = 0;
  int64_t hidden = 0;
  double dropout = -1;
  double capacity_factor = 0;         // MoE: token-slots an expert takes, x (tokens * top_k / experts); 0 = no limit
  std::string dtype = "float32";      // compute dtype: float32 | bfloat16 | float16 (master weights stay float32)
  double loss_scale = 65536;          // float16: the initial dynamic loss scale (nn::GradScaler)
  // schedule and optimiser
  int64_t steps = 1000;
  int64_t batch_size = 32;     // sequences per step (the global batch)
  int64_t seq_len = 64;        // tokens per sequence
  int64_t micro_batches = 1;   // gradient-accumulation steps per step (divides batch_size)
  double lr = 6e-4;            // peak learning rate
  double min_lr = 6e-5;        // floor of the decay
  int64_t warmup_steps = 100;
  double weight_decay = 0.1;
  std::array<double, 2> betas = {0.9, 0.95};
  double grad_clip = 1.0;      // max global grad norm; 0 = off
  uint64_t seed = 1;
  // evaluation and logging
  int64_t eval_every = 100;    // steps between held-out evaluations; 0 = never
  int64_t eval_batches = 10;
  int64_t log_every = 10;
  // data
  std::string data = "/usr/share/games/fortunes";  // a text file or a folder of text files
  double heldout_percent = 10;                     // the last N% of the tokens
  std::string tokenizer = "byte";                  // byte | gpt2 | hf
  std::string vocab;                               // gpt2: vocab.json
  std::string merges;                              // gpt2: merges.txt
  std::string tokenizer_json;                      // hf: a Hugging Face tokenizer.json
  // outputs
  std::string out_dir = "runs/latest";
  std::string metrics;  // JSONL path; empty: <out_dir>/metrics.jsonl
  // sampling after training
  int64_t sample_length = 200;  // tokens; 0 = no sample
  double temperature = 0.8;     // 0 = greedy
  int64_t top_k = 40;           // 0 = no top-k filter
  // parallelism (docs/parallel.md)
  std::string mesh;               // "dp=2,tp=2": named mesh dims, in order; empty: one device; "auto": planned (docs/plan.md)
  int64_t devices = 0;            // --mesh auto: the devices to lay the run out on (0: one per core)
  std::string backend = "auto";   // auto (mpi when launched by mpirun, else local threads) | local | mpi
  std::string plan = "auto";      // parallel plan: auto (derived from the model: parallel::derive_plan), nanogpt | llama | mixtral | none, or a .json file
  bool sequence_parallel = false; // the built-in plans shard the residual stream along the sequence over tp
  bool bitwise = false;           // every layout gives the one-device run's bits (docs/numerics.md)
  bool profile = false;           // per-op self times of rank 0's steps, printed at the end (runtime/profile.h)
  bool detect_anomaly = false;    // stop at the first inf/NaN an op, backward or optimizer update yields (autograd/anomaly.h)
  std::string dump;               // per-op forward/backward tensor hashes to this file (tessel verify)
  std::string trace;              // a Chrome/Perfetto timeline of the first trace_steps steps, all ranks merged (docs/trace.md)
  int64_t trace_steps = 3;        // steps the trace covers (0: every step)
  bool compile = false;           // record the step's kernels at steps 2-3, replay them from step 4 (docs/compile.md)
  bool no_fusion = false;         // compile mode: replay every launch alone, no fused elementwise chains
  std::string pipeline_schedule = "1f1b";  // with a "pp" mesh dim: gpipe | 1f1b | interleaved
  int64_t virtual_stages = 0;              // chunks per pp rank; 0: 1, or 2 for interleaved
  std::string pipeline_split = "layers";   // cut the blocks into stages by: layers | params
  int64_t zero = 0;               // data parallelism over dp: 0 DDP | 1 ZeRO-1 | 2 ZeRO-2 | 3 FSDP
  std::string recompute = "none"; // activation recomputation: none | selective | full (nn/recompute.h)
  std::string compile_modules = "none";  // mixed mode: none | attention | blocks (nn/compiled_module.h)
  double ddp_bucket_mb = 25;      // gradient bucket size (MiB) of DDP and ZeRO-1/2; 0: one per parameter
  // checkpoints (docs/checkpoint.md)
  int64_t ckpt_every = 0;         // steps between checkpoints (0: none); the last step always saves when > 0
  bool final_ckpt = false;        // save the final model (the last step's checkpoint) even with ckpt_every = 0
  int64_t keep_last = 3;          // complete checkpoints kept (0: all)
  bool resume = false;            // continue from the newest complete checkpoint in ckpt_dir (any mesh)
  std::string ckpt_dir;           // empty: <out_dir>/checkpoints
  bool ckpt_sync = false;         // write checkpoints on the training thread (default: a background writer)

  // Overwrites the fields present in a TOML file. Throws tessel::Error
  // naming the file (and line) on a syntax error, an unknown key, or a value
  // of the wrong type.
  void load_toml(const std::string& path);
  static TrainConfig from_toml(const std::string& path);
  // Throws tessel::Error naming the first invalid field and its value.
  void validate() const;
  // Every field, in declaration order, as a JSON object.
  std::string to_json(int indent = 2) const;
  // What `tessel train` starts from: the demo, which learns readable text
  // in ~3 minutes on 2 CPU cores (the "demo" config of the family, 2000
  // steps at lr 5e-3), and saves its final model (final_ckpt) for `tessel
  // generate`. The struct's own defaults (tiny, 1000 steps, lr 6e-4, no
  // final checkpoint) are the library's.
  static TrainConfig cli_defaults();

  std::string metrics_path() const;  // metrics, or <out_dir>/metrics.jsonl
  std::string checkpoint_root() const;  // ckpt_dir, or <out_dir>/checkpoints
  // Whether the last step saves a checkpoint (ckpt_every > 0, or final_ckpt).
  bool saves_final_checkpoint() const { return ckpt_every > 0 || final_ckpt; }
  DType param_dtype() const;         // dtype as a DType
};

// Adds --config-file FILE and one flag per field to `app`. After app.parse(),
// `cfg` holds defaults < file < flags (the file is loaded first whatever
// its position on the command line). A bad file raises a CLI::ParseError
// carrying the tessel::Error message (so CLI11 reports it like any flag
// error); validation is left to the caller (cfg.validate()), which should
// run before anything is created on disk.
void add_train_options(CLI::App& app, TrainConfig& cfg);

// "dp=2,tp=2" -> {{"dp", 2}, {"tp", 2}} (empty for ""); throws naming the bad part.
std::vector<std::pair<std::string, int64_t>> parse_mesh(const std::string& spec);

}  // namespace tessel::train
