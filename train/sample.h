#pragma once
// Text generation from any model: give it a function from token ids [B, t]
// (int64) to logits [B, t, V] (any floating dtype) and it extends prompts
// token by token, greedily or by sampling with temperature, top-k and top-p.
//
// Sampling is deterministic: the n-th generated token (n = 0, 1, ...) of
// prompt p (p = 0, 1, ... in a batch) uses one float64 uniform u in [0, 1)
// from Philox with key {seed, stream_for("sample")} at element
// e = p * 2^32 + n (the float64 layout of runtime/philox.h: block e / 2,
// words 2 (e % 2) and 2 (e % 2) + 1, u = u01_double(lo, hi)); so a prompt's
// tokens do not depend on the other prompts in its batch. With the logits z of
// the last position, the candidates C (all tokens, or the top_k largest by
// (value desc, id asc)) get weights w_j = exp((z_j - max_C z) / temperature)
// in double; top_p < 1 then keeps the fewest candidates, taken by (weight
// desc, id asc), whose weights sum to at least top_p * sum(w) (at least one);
// the token is the first j in C, by increasing id, whose running sum of
// weights exceeds u * sum(w). temperature = 0 means greedy: the argmax
// (lowest id on ties).
//
// With kv_cache (the default), the prompt runs once and each new token
// alone, under an nn::KVCache (nn/kv_cache.h): the logits function must run a
// tessel model whose attention honours the cache (every shipped model does; a
// model of your own built from nn::Attention does too). A function under which
// no layer used the cache is an error, not a wrong answer: pass kv_cache =
// false for it. Without a cache, every step re-runs the whole sequence
// (cropped to max_context).
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "runtime/philox.h"
#include "runtime/tensor.h"

namespace tessel::train {

using LogitsFn = std::function<Tensor(const Tensor& ids)>;

struct SampleOptions {
  int64_t max_new_tokens = 100;
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;         // 0: all tokens
  double top_p = 1.0;        // nucleus sampling: (0, 1]; 1 keeps every candidate
  uint64_t seed = 0;
  int64_t max_context = 0;   // the model's context (block size); 0: unlimited. Without a cache: feed at most
                             // the last max_context tokens; with one: prompt + new tokens - 1 must fit
  int64_t eos_id = -1;       // stop a prompt after it generates this token (kept in its output); -1: never
  bool kv_cache = true;      // decode with an nn::KVCache (see above); false: re-run the whole sequence
};

// The key of the sampling stream for a seed.
PhiloxKey sample_key(uint64_t seed);
// The uniform draw for the n-th generated token of prompt p.
double sample_uniform(uint64_t seed, int64_t n, int64_t prompt = 0);
// Picks a token from one row of logits with the rule above (u in [0, 1)).
int64_t pick_token(const std::vector<double>& logits, double temperature, int64_t top_k, double u,
                   double top_p = 1.0);

// Generates max_new_tokens tokens after `prompt` (at least one token); returns
// only the new tokens (fewer when eos_id ends it). Runs the model under NoGradGuard.
std::vector<int64_t> generate(const LogitsFn& logits_fn, const std::vector<int64_t>& prompt,
                              const SampleOptions& opts);

// The same for a batch of prompts: prompts of one length run together as one
// batch [n, length] (in order of first appearance), each prompt sampling as
// prompt p of the rule above, so every prompt gets the tokens it would get
// alone. Returns each prompt's new tokens, in the prompts' order.
std::vector<std::vector<int64_t>> generate_batch(const LogitsFn& logits_fn,
                                                 const std::vector<std::vector<int64_t>>& prompts,
                                                 const SampleOptions& opts);

// How readable a sample is: the share of its words (lower-cased runs of two
// or more ASCII letters) that occur at least `min_count` times among the
// words of a reference text (the training corpus; a word seen once or twice
// may be a typo). The demo reports it next to its sample. Measured on the
// fortunes corpus: real text 100%, the demo's sample ~74%, an untrained
// model's ~18%.
struct KnownWords {
  int64_t words = 0;  // words in the sample
  int64_t known = 0;  // of which occur in the reference
  double share() const { return words > 0 ? double(known) / double(words) : 0.0; }
};
std::unordered_set<std::string> word_set(std::string_view text, int64_t min_count = 3);
KnownWords known_words(std::string_view sample, const std::unordered_set<std::string>& vocabulary);

}  // namespace tessel::train
