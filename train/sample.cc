#include "train/sample.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "autograd/api.h"
#include "runtime/error.h"

namespace tessel::train {

PhiloxKey sample_key(uint64_t seed) { return PhiloxKey{seed, stream_for("sample")}; }

double sample_uniform(uint64_t seed, int64_t n) {
  const Philox4 r = philox::block(sample_key(seed), uint64_t(n) >> 1);
  const int w = int(n & 1) * 2;
  return philox::u01_double(r.v[w], r.v[w + 1]);
}

int64_t pick_token(const std::vector<double>& logits, double temperature, int64_t top_k, double u) {
  const int64_t V = int64_t(logits.size());
  TESSEL_CHECK(V > 0, "sample", "empty logits");
  for (int64_t j = 0; j < V; ++j) {
    TESSEL_CHECK(!std::isnan(logits[j]), "sample", "logit {} is NaN", j);
  }
  TESSEL_CHECK(temperature >= 0 && std::isfinite(temperature), "sample", "temperature must be >= 0, got {}",
               temperature);
  TESSEL_CHECK(top_k >= 0, "sample", "top_k must be >= 0, got {}", top_k);
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

std::vector<int64_t> generate(const LogitsFn& logits_fn, const std::vector<int64_t>& prompt,
                              const SampleOptions& opts) {
  TESSEL_CHECK(!prompt.empty(), "sample", "the prompt needs at least one token");
  TESSEL_CHECK(opts.max_new_tokens >= 0, "sample", "max_new_tokens must be >= 0, got {}", opts.max_new_tokens);
  TESSEL_CHECK(opts.max_context >= 0, "sample", "max_context must be >= 0, got {}", opts.max_context);
  NoGradGuard no_grad;
  std::vector<int64_t> seq = prompt;
  std::vector<int64_t> out;
  out.reserve(size_t(opts.max_new_tokens));
  for (int64_t n = 0; n < opts.max_new_tokens; ++n) {
    const int64_t t = opts.max_context > 0 ? std::min<int64_t>(opts.max_context, int64_t(seq.size()))
                                           : int64_t(seq.size());
    std::vector<int64_t> ctx(seq.end() - t, seq.end());
    Tensor ids = tensor(ctx, {1, t});
    Tensor logits = logits_fn(ids);
    TESSEL_CHECK(logits.defined() && logits.dim() == 3 && logits.size(0) == 1 && logits.size(1) == t &&
                     logits.is_floating_point(),
                 "sample", "the logits function must return floating logits [1, {}, V] for ids [1, {}], got {}", t, t,
                 logits.defined() ? logits.desc() : std::string("an undefined tensor"));
    Tensor last = logits.select(0, 0).select(0, t - 1);
    if (!last.device().is_cpu()) last = last.to(kCPU);
    const int64_t tok = pick_token(last.to_vector<double>(), opts.temperature, opts.top_k,
                                   opts.temperature == 0 ? 0.0 : sample_uniform(opts.seed, n));
    out.push_back(tok);
    seq.push_back(tok);
  }
  return out;
}

}  // namespace tessel::train
