#pragma once
// bench generate: greedy generation of a batch of prompts (KV cache) against
// transformers' `generate` on the CPU in the same run: the same weights
// (tessel writes them as a Hugging Face folder), the same prompt ids, the
// same thread count, float32, K new tokens per prompt with no early stop.
//
// tools/bench/generate_bench.py runs transformers' side as a child process
// (tools/bench/reference_process.h); the sides' rounds alternate (who goes
// first alternates too), after a 100 ms pause each. Medians over `rounds`
// after one warm-up round each. Prints a table and ends with one JSON line:
//   {"bench": "generate", "model", "config", "ours_s", "reference": "transformers X (torch Y, CPU, N threads, attn)",
//    "reference_s", "speedup": reference_s / ours_s, "tokens_per_s", "reference_tokens_per_s",
//    "batch", "prompt_len", "new_tokens", "threads", "rounds", "same_tokens": prompts whose tokens agree,
//    "machine": {...}, "loaded"}
#include <cstdint>
#include <iosfwd>
#include <string>

namespace tessel::tools {

struct GenerateBenchOptions {
  std::string model = "llama";
  std::string config = "small";
  int64_t batch = 4;
  int64_t prompt_len = 32;
  int64_t new_tokens = 64;
  int rounds = 5;
  int threads = 0;        // 0: TESSEL_THREADS, else all cores
  uint64_t seed = 1;
  bool reference = true;  // false: time tessel only
  bool profile = false;   // print tessel's per-op self times over the timed rounds
  std::string python;     // "": reference_python() with transformers
};

int run_generate_bench(const GenerateBenchOptions& opts, std::ostream& out);

}  // namespace tessel::tools
