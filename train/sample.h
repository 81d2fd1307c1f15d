#pragma once
// Text generation from any model: give it a function from token ids [1, t]
// (int64) to logits [1, t, V] (any floating dtype) and it extends a prompt
// token by token, greedily or by sampling with temperature and top-k.
//
// Sampling is deterministic: the n-th generated token (n = 0, 1, ...) uses
// one float64 uniform u in [0, 1) from Philox with key
// {seed, stream_for("sample")} at element n (the float64 layout of
// runtime/philox.h: block n / 2, words 2 (n % 2) and 2 (n % 2) + 1,
// u = u01_double(lo, hi)). With the logits z of the last position, the
// candidates C (all tokens, or the top_k largest by (value desc, id asc)) get
// weights w_j = exp((z_j - max_C z) / temperature) in double, and the token is
// the first j in C, by increasing id, whose running sum of weights exceeds
// u * sum(w). temperature = 0 means greedy: the argmax (lowest id on ties).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/philox.h"
#include "runtime/tensor.h"

namespace tessel::train {

using LogitsFn = std::function<Tensor(const Tensor& ids)>;

struct SampleOptions {
  int64_t max_new_tokens = 100;
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;         // 0: all tokens
  uint64_t seed = 0;
  int64_t max_context = 0;   // feed at most the last N tokens (the model's block size); 0: all
};

// The key of the sampling stream for a seed.
PhiloxKey sample_key(uint64_t seed);
// The uniform draw for the n-th generated token.
double sample_uniform(uint64_t seed, int64_t n);
// Picks a token from one row of logits with the rule above (u in [0, 1)).
int64_t pick_token(const std::vector<double>& logits, double temperature, int64_t top_k, double u);

// Generates max_new_tokens tokens after `prompt` (at least one token); returns
// only the new tokens. Runs the model under NoGradGuard.
std::vector<int64_t> generate(const LogitsFn& logits_fn, const std::vector<int64_t>& prompt,
                              const SampleOptions& opts);

}  // namespace tessel::train
