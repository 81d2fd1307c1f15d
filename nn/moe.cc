#include "nn/moe.h"

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
}  // namespace

MoE::MoE(const MoEConfig& cfg) : UnaryModule("MoE"), config(validate(cfg)) {
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
  TESSEL_CHECK(!x.device().is_meta(), "MoE", "'{}': routing needs concrete values; got a meta tensor {}", path(),
               x.desc());
  Tensor xf = x.reshape({-1, C});
  const int64_t N = xf.size(0);
  TESSEL_CHECK(N > 0, "MoE", "'{}': no tokens in input {}", path(), x.desc());

  // Route in float32 at least, outside autocast: softmax over all experts, top-k, renormalise.
  Tensor logits;
  {
    AutocastScope off(std::nullopt);
    logits = (*gate)(cast_up(xf));  // [N, E]
  }
  Tensor probs = softmax(logits, -1);
  auto [top_p, top_i] = topk(probs, K, -1);  // [N, K]
  Tensor weights = div(top_p, sum(top_p, {-1}, /*keepdim=*/true)).reshape({N * K});

  // Token-slots per expert, in token order.
  const std::vector<int64_t> choice = top_i.contiguous().to_vector<int64_t>();
  std::vector<std::vector<int64_t>> tokens(static_cast<size_t>(E)), slots(static_cast<size_t>(E));
  for (int64_t s = 0; s < N * K; ++s) {
    tokens[size_t(choice[size_t(s)])].push_back(s / K);
    slots[size_t(choice[size_t(s)])].push_back(s);
  }

  // Dispatch to each expert, weight its outputs, combine with one index_add.
  std::vector<Tensor> parts;
  std::vector<int64_t> dest;
  dest.reserve(size_t(N * K));
  counts_.assign(size_t(E), 0);
  for (int64_t e = 0; e < E; ++e) {
    const auto& tok = tokens[size_t(e)];
    counts_[size_t(e)] = int64_t(tok.size());
    if (tok.empty()) continue;
    Tensor y = (*expert_list_[size_t(e)])(index_select(xf, 0, index_tensor(tok, x.device())));
    Tensor w = index_select(weights, 0, index_tensor(slots[size_t(e)], x.device())).unsqueeze(1);
    parts.push_back(mul(y, w));  // promotes to the routing dtype (float32 under autocast)
    dest.insert(dest.end(), tok.begin(), tok.end());
  }
  Tensor contrib = cat(parts, 0);
  Tensor out = index_add(zeros({N, C}, TensorOptions(contrib.dtype()).with_device(x.device())), 0,
                         index_tensor(dest, x.device()), contrib);

  // Load-balancing loss: E * sum_e f_e * P_e.
  std::vector<double> frac(static_cast<size_t>(E), 0.0);
  for (int64_t e = 0; e < E; ++e) frac[size_t(e)] = double(counts_[size_t(e)]) / double(N * K);
  Tensor f = tensor(frac, Dims{E}, TensorOptions(probs.dtype()).with_device(x.device()));
  aux_loss_ = mul(sum(mul(f, mean(probs, {0}))), double(E));

  return out.reshape(x.shape());
}

std::string MoE::extra_repr() const {
  return fmt::format("dim={}, hidden={}, num_experts={}, top_k={}", config.dim, config.hidden, config.num_experts,
                     config.top_k);
}

}  // namespace tessel::nn
