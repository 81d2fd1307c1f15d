#include "train/sample.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <unordered_map>

#include "autograd/api.h"
#include "nn/kv_cache.h"
#include "runtime/error.h"

namespace tessel::train {

PhiloxKey sample_key(uint64_t seed) { return PhiloxKey{seed, stream_for("sample")}; }

double sample_uniform(uint64_t seed, int64_t n, int64_t prompt) {
  TESSEL_CHECK(n >= 0 && n < (int64_t(1) << 32) && prompt >= 0 && prompt < (int64_t(1) << 31), "sample",
               "token {} of prompt {} is outside the sampling stream (n < 2^32, prompt < 2^31)", n, prompt);
  const uint64_t e = (uint64_t(prompt) << 32) | uint64_t(n);
  const Philox4 r = philox::block(sample_key(seed), e >> 1);
  const int w = int(e & 1) * 2;
  return philox::u01_double(r.v[w], r.v[w + 1]);
}

int64_t pick_token(const std::vector<double>& logits, double temperature, int64_t top_k, double u, double top_p) {
  const int64_t V = int64_t(logits.size());
  TESSEL_CHECK(V > 0, "sample", "empty logits");
  for (int64_t j = 0; j < V; ++j) {
    TESSEL_CHECK(!std::isnan(logits[j]), "sample", "logit {} is NaN", j);
  }
  TESSEL_CHECK(temperature >= 0 && std::isfinite(temperature), "sample", "temperature must be >= 0, got {}",
               temperature);
  TESSEL_CHECK(top_k >= 0, "sample", "top_k must be >= 0, got {}", top_k);
  TESSEL_CHECK(top_p > 0 && top_p <= 1, "sample", "top_p must be in (0, 1], got {}", top_p);
  if (temperature == 0) {
    return int64_t(std::max_element(logits.begin(), logits.end()) - logits.begin());  // first maximum
  }
  std::vector<int64_t> cand(static_cast<size_t>(V));
  std::iota(cand.begin(), cand.end(), 0);
  if (top_k > 0 && top_k < V) {
    std::partial_sort(cand.begin(), cand.begin() + top_k, cand.end(), [&](int64_t a, int64_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    cand.resize(size_t(top_k));
    std::sort(cand.begin(), cand.end());
  }
  double m = -INFINITY;
  for (int64_t j : cand) m = std::max(m, logits[j]);
  if (m == -INFINITY) return cand.front();  // every candidate impossible: take the first
  std::vector<double> w(cand.size());
  double total = 0;
  for (size_t i = 0; i < cand.size(); ++i) {
    w[i] = m == INFINITY ? (logits[cand[i]] == INFINITY ? 1.0 : 0.0) : std::exp((logits[cand[i]] - m) / temperature);
    total += w[i];
  }
  if (top_p < 1) {
    // The nucleus: candidates by (weight desc, id asc) until their weights
    // reach top_p of the total; the rest get weight 0.
    std::vector<size_t> order(cand.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); });
    const double keep = top_p * total;
    double kept = 0;
    size_t n_keep = 0;
    while (n_keep < order.size() && (n_keep == 0 || kept < keep)) kept += w[order[n_keep++]];
    for (size_t i = n_keep; i < order.size(); ++i) w[order[i]] = 0;
    total = kept;
  }
  const double target = u * total;
  double run = 0;
  for (size_t i = 0; i < cand.size(); ++i) {
    run += w[i];
    if (run > target && w[i] > 0) return cand[i];
  }
  // Rounding left the target at the very end: the last candidate with weight.
  for (size_t i = cand.size(); i-- > 0;)
    if (w[i] > 0) return cand[i];
  return cand.back();
}

namespace {

// The last position's logits of each row of `logits` [n, t, V], as doubles.
std::vector<std::vector<double>> last_logits(const Tensor& logits, int64_t n, int64_t t) {
  // [n, 1, V] too: under a KV cache a model's head may compute only the last
  // position (nn::KVCache::head_last_position).
  TESSEL_CHECK(logits.defined() && logits.dim() == 3 && logits.size(0) == n &&
                   (logits.size(1) == t || logits.size(1) == 1) && logits.is_floating_point(),
               "sample", "the logits function must return floating logits [{}, {}, V] for ids [{}, {}], got {}", n,
               t, n, t, logits.defined() ? logits.desc() : std::string("an undefined tensor"));
  Tensor last = logits.select(1, logits.size(1) - 1);
  if (!last.device().is_cpu()) last = last.to(kCPU);
  const std::vector<double> flat = last.to_vector<double>();
  const size_t V = size_t(logits.size(2));
  std::vector<std::vector<double>> rows(static_cast<size_t>(n));
  for (size_t r = 0; r < size_t(n); ++r) rows[r].assign(flat.begin() + r * V, flat.begin() + (r + 1) * V);
  return rows;
}

// Generates for prompts of one length (rows of one batch); `index` are their
// positions in the caller's list (their sampling streams).
std::vector<std::vector<int64_t>> generate_group(const LogitsFn& logits_fn,
                                                 const std::vector<std::vector<int64_t>>& prompts,
                                                 const std::vector<int64_t>& index, const SampleOptions& opts) {
  const int64_t n = int64_t(prompts.size()), len = int64_t(prompts[0].size());
  std::vector<std::vector<int64_t>> seq = prompts;
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(n));
  std::vector<bool> done(size_t(n), false);
  std::unique_ptr<nn::KVCache> cache;
  if (opts.kv_cache) {
    // The last new token is never fed back: len + max_new_tokens - 1 positions.
    TESSEL_CHECK(opts.max_context == 0 || len + opts.max_new_tokens - 1 <= opts.max_context, "sample",
                 "a prompt of {} tokens plus {} new tokens exceeds the model's context of {} (the KV cache cannot "
                 "slide): shorten the prompt, generate fewer tokens, or run without the cache (it crops the "
                 "sequence to the context)",
                 len, opts.max_new_tokens, opts.max_context);
    cache = std::make_unique<nn::KVCache>(len + std::max<int64_t>(opts.max_new_tokens, 1));
  }
  for (int64_t step = 0; step < opts.max_new_tokens; ++step) {
    Tensor logits;
    int64_t t = 0;
    if (cache) {
      // The prompt first, then only the last token.
      t = step == 0 ? len : 1;
      std::vector<int64_t> ids;
      ids.reserve(size_t(n * t));
      for (const auto& s : seq) ids.insert(ids.end(), s.end() - t, s.end());
      nn::KVCacheScope scope(*cache);
      logits = logits_fn(tensor(ids, {n, t}));
      TESSEL_CHECK(cache->num_entries() > 0, "sample",
                   "no layer used the KV cache: the logits function does not run tessel attention layers (set "
                   "kv_cache = false to re-run the whole sequence each step)");
      cache->advance(t);
    } else {
      const int64_t cur = int64_t(seq[0].size());
      t = opts.max_context > 0 ? std::min<int64_t>(opts.max_context, cur) : cur;
      std::vector<int64_t> ids;
      ids.reserve(size_t(n * t));
      for (const auto& s : seq) ids.insert(ids.end(), s.end() - t, s.end());
      logits = logits_fn(tensor(ids, {n, t}));
    }
    const auto rows = last_logits(logits, n, t);
    bool all_done = true;
    for (int64_t r = 0; r < n; ++r) {
      const double u = opts.temperature == 0 ? 0.0 : sample_uniform(opts.seed, step, index[size_t(r)]);
      const int64_t tok = pick_token(rows[size_t(r)], opts.temperature, opts.top_k, u, opts.top_p);
      seq[size_t(r)].push_back(tok);
      if (!done[size_t(r)]) {
        out[size_t(r)].push_back(tok);
        if (tok == opts.eos_id) done[size_t(r)] = true;
      }
      all_done = all_done && done[size_t(r)];
    }
    if (all_done) break;
  }
  return out;
}

}  // namespace

std::vector<std::vector<int64_t>> generate_batch(const LogitsFn& logits_fn,
                                                 const std::vector<std::vector<int64_t>>& prompts,
                                                 const SampleOptions& opts) {
  TESSEL_CHECK(!prompts.empty(), "sample", "no prompts");
  for (size_t p = 0; p < prompts.size(); ++p) {
    TESSEL_CHECK(!prompts[p].empty(), "sample", "prompt {} is empty: the prompt needs at least one token", p);
  }
  TESSEL_CHECK(opts.max_new_tokens >= 0, "sample", "max_new_tokens must be >= 0, got {}", opts.max_new_tokens);
  TESSEL_CHECK(opts.max_context >= 0, "sample", "max_context must be >= 0, got {}", opts.max_context);
  TESSEL_CHECK(opts.top_p > 0 && opts.top_p <= 1, "sample", "top_p must be in (0, 1], got {}", opts.top_p);
  NoGradGuard no_grad;
  std::vector<std::vector<int64_t>> out(prompts.size());
  std::vector<bool> taken(prompts.size(), false);
  for (size_t first = 0; first < prompts.size(); ++first) {
    if (taken[first]) continue;
    std::vector<std::vector<int64_t>> group;
    std::vector<int64_t> index;
    for (size_t p = first; p < prompts.size(); ++p) {
      if (taken[p] || prompts[p].size() != prompts[first].size()) continue;
      taken[p] = true;
      group.push_back(prompts[p]);
      index.push_back(int64_t(p));
    }
    auto res = generate_group(logits_fn, group, index, opts);
    for (size_t i = 0; i < index.size(); ++i) out[size_t(index[i])] = std::move(res[i]);
  }
  return out;
}

std::vector<int64_t> generate(const LogitsFn& logits_fn, const std::vector<int64_t>& prompt,
                              const SampleOptions& opts) {
  TESSEL_CHECK(!prompt.empty(), "sample", "the prompt needs at least one token");
  return generate_batch(logits_fn, {prompt}, opts)[0];
}

namespace {
template <class F>
void for_each_word(std::string_view text, F&& f) {
  std::string w;
  for (size_t i = 0; i <= text.size(); ++i) {
    const char c = i < text.size() ? text[i] : ' ';
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      w += char(c | 0x20);
    } else if (!w.empty()) {
      if (w.size() >= 2) f(w);
      w.clear();
    }
  }
}
}  // namespace

std::unordered_set<std::string> word_set(std::string_view text, int64_t min_count) {
  std::unordered_map<std::string, int64_t> counts;
  for_each_word(text, [&](const std::string& w) { ++counts[w]; });
  std::unordered_set<std::string> words;
  for (const auto& [w, n] : counts)
    if (n >= min_count) words.insert(w);
  return words;
}

KnownWords known_words(std::string_view sample, const std::unordered_set<std::string>& vocabulary) {
  KnownWords k;
  for_each_word(sample, [&](const std::string& w) {
    ++k.words;
    if (vocabulary.count(w)) ++k.known;
  });
  return k;
}

}  // namespace tessel::train
