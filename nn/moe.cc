#include "nn/moe.h"

#include <cmath>
#include <limits>

#include "autograd/api.h"
#include "nn/autocast.h"

namespace tessel::nn {

namespace {
const MoEConfig& validate(const MoEConfig& c) {
  TESSEL_CHECK(c.dim > 0 && c.hidden > 0 && c.num_experts > 0, "MoE",
               "dim, hidden and num_experts must be positive, got dim={}, hidden={}, num_experts={}", c.dim, c.hidden,
               c.num_experts);
  TESSEL_CHECK(c.top_k >= 1 && c.top_k <= c.num_experts, "MoE",
               "top_k must be in [1, num_experts], got top_k={} with num_experts={}", c.top_k, c.num_experts);
  return c;
}

Tensor index_tensor(const std::vector<int64_t>& v, Device device) {
  return tensor(v, Dims{int64_t(v.size())}, TensorOptions(DType::Int64).with_device(device));
}

void check_capacity_factor(double f) {
  TESSEL_CHECK(std::isfinite(f) && f >= 0, "MoE", "capacity_factor must be a finite number >= 0 (0: no limit), got {}",
               f);
}
}  // namespace

int64_t expert_capacity(double capacity_factor, int64_t tokens, int64_t top_k, int64_t num_experts) {
  if (capacity_factor <= 0) return std::numeric_limits<int64_t>::max();
  const double c = std::ceil(capacity_factor * double(tokens) * double(top_k) / double(num_experts));
  return c >= 9.0e18 ? std::numeric_limits<int64_t>::max() : int64_t(c);
}

Tensor expert_swiglu(const Tensor& x, const Tensor& w1, const Tensor& w2, const Tensor& w3) {
  // SwiGLU::forward is w2(swiglu(w1(x), w3(x))) with Linear's casts: each
  // Linear casts x itself, so under autocast x's two 16-bit gradients are
  // widened before they are added, as on one device (one shared cast would
  // add them in 16 bits: other bits).
  Tensor h = swiglu(linear(cast_to_compute(x), cast_to_compute(w1)), linear(cast_to_compute(x), cast_to_compute(w3)));
  return linear(cast_to_compute(h), cast_to_compute(w2));
}

MoE::MoE(const MoEConfig& cfg) : UnaryModule("MoE"), config(validate(cfg)) {
  check_capacity_factor(config.capacity_factor);
  capacity_factor_ = config.capacity_factor;
  gate = child("gate", std::make_shared<Linear>(config.dim, config.num_experts, /*bias=*/false));
  experts = child("experts", std::make_shared<ModuleList>());
  for (int64_t e = 0; e < config.num_experts; ++e) {
    expert_list_.push_back(std::make_shared<SwiGLU>(config.dim, config.hidden));
    experts->push_back(expert_list_.back());
  }
}

Tensor MoE::forward(const Tensor& x) {
  const int64_t C = config.dim, E = config.num_experts, K = config.top_k;
  TESSEL_CHECK(x.dim() >= 1 && x.size(-1) == C, "MoE", "'{}' expects input [..., {}] (dim), got {}", path(), C,
               x.desc());
  Tensor xf = x.reshape({-1, C});
  const int64_t N = xf.size(0);
  TESSEL_CHECK(N > 0, "MoE", "'{}': no tokens in input {}", path(), x.desc());
  if (dispatch_) xf = dispatch_->layout(*this, xf);

  // Route in float32 at least, outside autocast: softmax over all experts, top-k, renormalise.
  Tensor logits;
  {
    AutocastScope off(std::nullopt);
    logits = (*gate)(cast_up(xf));  // [N, E]
  }
  Tensor probs = softmax(logits, -1);
  auto [top_p, top_i] = topk(probs, K, -1);  // [N, K]
  Tensor weights = div(top_p, sum(top_p, {-1}, /*keepdim=*/true));

  MoEStats stats;
  Tensor out = dispatch_ ? dispatch_->dispatch(*this, xf, top_i, weights, stats) : dispatch_default(xf, top_i, weights, stats);
  TESSEL_ASSERT(int64_t(stats.counts.size()) == E && int64_t(stats.dropped.size()) == E);
  stats_ = std::move(stats);

  // Load-balancing loss: E * sum_e f_e * P_e (f from the routed counts of all tokens).
  std::vector<double> frac(static_cast<size_t>(E), 0.0);
  for (int64_t e = 0; e < E; ++e) frac[size_t(e)] = double(stats_.counts[size_t(e)]) / double(N * K);
  Tensor f = tensor(frac, Dims{E}, TensorOptions(probs.dtype()).with_device(x.device()));
  aux_loss_ = mul(sum(mul(f, mean(probs, {0}))), double(E));

  return out.reshape(x.shape());
}

Tensor MoE::dispatch_default(const Tensor& xf, const Tensor& top_i, const Tensor& weights_nk, MoEStats& stats) {
  const int64_t C = config.dim, E = config.num_experts, K = config.top_k, N = xf.size(0);
  const int64_t cap = expert_capacity(capacity_factor_, N, K, E);
  Tensor weights = weights_nk.reshape({N * K});

  // Token-slots per expert, in token order; the first `cap` of each are kept.
  const std::vector<int64_t> choice = routing_choice(top_i, E);
  std::vector<std::vector<int64_t>> tokens(static_cast<size_t>(E)), slots(static_cast<size_t>(E));
  for (int64_t s = 0; s < N * K; ++s) {
    tokens[size_t(choice[size_t(s)])].push_back(s / K);
    slots[size_t(choice[size_t(s)])].push_back(s);
  }
  stats.counts.assign(size_t(E), 0);
  stats.dropped.assign(size_t(E), 0);
  for (int64_t e = 0; e < E; ++e) {
    auto& tok = tokens[size_t(e)];
    stats.counts[size_t(e)] = int64_t(tok.size());
    if (int64_t(tok.size()) > cap) {
      stats.dropped[size_t(e)] = int64_t(tok.size()) - cap;
      tok.resize(size_t(cap));
      slots[size_t(e)].resize(size_t(cap));
    }
  }

  // Dispatch to each expert, weight its outputs, combine with one index_add.
  std::vector<Tensor> parts;
  std::vector<int64_t> dest;
  dest.reserve(size_t(N * K));
  for (int64_t e = 0; e < E; ++e) {
    const auto& tok = tokens[size_t(e)];
    if (tok.empty()) continue;
    Tensor y = (*expert_list_[size_t(e)])(index_select(xf, 0, index_tensor(tok, xf.device())));
    Tensor w = index_select(weights, 0, index_tensor(slots[size_t(e)], xf.device())).unsqueeze(1);
    parts.push_back(mul(y, w));  // promotes to the routing dtype (float32 under autocast)
    dest.insert(dest.end(), tok.begin(), tok.end());
  }
  // A positive capacity keeps at least one slot, so some expert always runs.
  TESSEL_ASSERT(!parts.empty());
  Tensor contrib = cat(parts, 0);
  return index_add(zeros({N, C}, TensorOptions(contrib.dtype()).with_device(xf.device())), 0,
                   index_tensor(dest, xf.device()), contrib);
}

std::vector<int64_t> routing_choice(const Tensor& top_i, int64_t num_experts) {
  if (!top_i.device().is_meta()) return top_i.contiguous().to_vector<int64_t>();
  // Planning (no values): every expert gets its share, and a token's k slots
  // go to k different experts while k <= E.
  std::vector<int64_t> choice(static_cast<size_t>(top_i.numel()));
  for (size_t s = 0; s < choice.size(); ++s) choice[s] = int64_t(s) % num_experts;
  return choice;
}

void MoE::forget_last_forward() {
  aux_loss_ = Tensor();
  stats_ = MoEStats{};
}

int64_t MoE::last_dropped_tokens() const {
  int64_t n = 0;
  for (int64_t d : stats_.dropped) n += d;
  return n;
}

void MoE::set_capacity_factor(double f) {
  check_capacity_factor(f);
  capacity_factor_ = f;
}

std::string MoE::extra_repr() const {
  std::string s = fmt::format(FMT_STRING("dim={}, hidden={}, num_experts={}, top_k={}"), config.dim, config.hidden,
                              config.num_experts, config.top_k);
  if (capacity_factor_ > 0) s += fmt::format(FMT_STRING(", capacity_factor={}"), capacity_factor_);
  if (dispatch_) s += ", " + dispatch_->describe();
  return s;
}

std::vector<MoE*> moe_layers(const Module& root) {
  std::vector<MoE*> out;
  for (auto& [path, m] : root.named_modules())
    if (auto* moe = dynamic_cast<MoE*>(m)) out.push_back(moe);
  return out;
}

void set_capacity_factor(const Module& root, double capacity_factor) {
  check_capacity_factor(capacity_factor);
  std::vector<MoE*> layers = moe_layers(root);
  TESSEL_CHECK(capacity_factor == 0 || !layers.empty(), "MoE",
               "capacity_factor {} is set but the model has no mixture-of-experts layers", capacity_factor);
  for (MoE* m : layers) m->set_capacity_factor(capacity_factor);
}

int64_t dropped_tokens(const Module& root) {
  int64_t n = 0;
  for (MoE* m : moe_layers(root)) n += m->last_dropped_tokens();
  return n;
}

}  // namespace tessel::nn
