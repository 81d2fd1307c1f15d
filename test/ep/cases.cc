#include "test/ep/cases.h"

#include <cmath>
#include <numeric>

#include "autograd/api.h"
#include "dtensor/ops.h"
#include "nn/nn.h"
#include "nn/parallel/expert_parallel.h"
#include "nn/parallel/parallelize.h"
#include "runtime/comm/comm.h"
#include "runtime/numerics.h"
#include "test/util/util.h"

namespace tessel::testing {

MoEHolder::MoEHolder(const nn::MoEConfig& c) : nn::UnaryModule("MoEHolder") {
  ffn = child("ffn", std::make_shared<nn::MoE>(c));
}

Tensor MoEHolder::forward(const Tensor& x) { return (*ffn)(x); }

nn::MoEConfig moe_test_config(int64_t experts, int64_t top_k, double capacity_factor) {
  nn::MoEConfig c;
  c.dim = 8;
  c.hidden = 12;
  c.num_experts = experts;
  c.top_k = top_k;
  c.capacity_factor = capacity_factor;
  return c;
}

parallel::ParallelPlan ep_test_plan(bool tp) {
  parallel::ParallelPlan p;
  p.name = tp ? "test-ep-tp" : "test-ep";
  p.experts.push_back({"ffn", "ep"});
  if (tp) {
    p.params.push_back({"ffn\\.experts\\.\\d+\\.w[13]\\.weight", {{{"tp", Shard(0)}}}});
    p.params.push_back({"ffn\\.experts\\.\\d+\\.w2\\.weight", {{{"tp", Shard(1)}}}});
  }
  return p;
}

namespace {

EpOutcome run_moe(MoEHolder& m, const Tensor& x, const Tensor& g, const EpNumerics& numerics) {
  numerics::BitwiseGuard bitwise(numerics.bitwise);
  EpOutcome o;
  {
    std::optional<nn::AutocastScope> autocast;
    if (numerics.compute) autocast.emplace(*numerics.compute);
    o.y = m.forward(x);
  }
  add(sum(mul(o.y, g)), m.ffn->last_aux_loss()).backward();
  o.y = full_tensor(o.y.detach());
  o.aux = m.ffn->last_aux_loss().item<double>();
  o.counts = m.ffn->last_expert_counts();
  o.dropped = m.ffn->last_dropped();
  for (auto& p : m.named_parameters())
    o.grads.emplace_back(p.name, p.tensor.grad().defined() ? full_tensor(p.tensor.grad()) : Tensor());
  return o;
}

std::string compare(const EpOutcome& ref, const EpOutcome& got, bool bitwise_forward, bool bitwise_all) {
  std::string bad;
  // Tolerances in fast mode; bit for bit in bitwise mode.
  auto close = [&](const Tensor& a, const Tensor& b) { return bitwise_all ? bitwise_equal(a, b) : allclose(a, b, 1e-5, 1e-6); };
  if (bitwise_forward || bitwise_all ? !bitwise_equal(got.y, ref.y) : !allclose(got.y, ref.y, 1e-5, 1e-6))
    bad += fmt::format(FMT_STRING("output differs by {}; "), max_abs_diff(got.y, ref.y));
  if (!close(got.x_grad, ref.x_grad))
    bad += fmt::format(FMT_STRING("input gradient differs by {}; "), max_abs_diff(got.x_grad, ref.x_grad));
  if (got.counts != ref.counts) bad += "expert counts; ";
  if (got.dropped != ref.dropped) bad += "dropped counts; ";
  if (bitwise_all ? got.aux != ref.aux : std::fabs(got.aux - ref.aux) > 1e-6 * std::max(1.0, std::fabs(ref.aux)))
    bad += fmt::format(FMT_STRING("aux {} vs {}; "), got.aux, ref.aux);
  if (got.grads.size() != ref.grads.size()) return bad + "parameter count";
  for (size_t i = 0; i < ref.grads.size(); ++i) {
    const Tensor &a = ref.grads[i].second, &b = got.grads[i].second;
    if (a.defined() != b.defined()) bad += ref.grads[i].first + " gradient defined differs; ";
    else if (a.defined() && !close(b, a))
      bad += fmt::format(FMT_STRING("{} gradient differs by {}; "), ref.grads[i].first, max_abs_diff(a, b));
  }
  return bad;
}

}  // namespace

EpOutcome ep_reference(const nn::MoEConfig& cfg, const Dims& xshape, const EpNumerics& numerics) {
  auto m = nn::make_model<MoEHolder>(cfg);
  m->reset_parameters(5);
  Tensor x = uniform(xshape, 21).requires_grad_();
  EpOutcome ref = run_moe(*m, x, uniform(xshape, 22), numerics);
  ref.x_grad = x.grad();
  return ref;
}

std::string ep_case(const nn::MoEConfig& cfg, const Dims& xshape, const EpLayout& layout, const EpOutcome& ref) {
  MeshPtr mesh = Mesh::world(layout.mesh);
  auto m = nn::make_model<MoEHolder>(cfg);
  m->reset_parameters(5);
  auto res = parallel::parallelize(*m, mesh, ep_test_plan(layout.tp));
  int ep = -1;
  for (int d = 0; d < mesh->ndim(); ++d)
    if (mesh->name(d) == "ep") ep = d;
  // Without an ep dim every rank holds every expert and routes its own tokens.
  if (res.expert_layers != (ep >= 0 ? 1 : 0) || m->ffn->dispatch() == nullptr) return "no expert dispatch installed";
  // Each expert's weights live only on its owner's ep coordinate.
  for (int64_t e = 0; ep >= 0 && e < cfg.num_experts; ++e) {
    const bool mine = parallel::expert_owner(e, cfg.num_experts, mesh->size(ep)) == mesh->coordinate(ep);
    if ((raw::local_of(m->ffn->expert(e).w2->weight).numel() > 0) != mine) return fmt::format(FMT_STRING("expert {} piece"), e);
  }
  Placements xp = Placements::replicated(mesh->ndim());
  for (int d = 0; d < mesh->ndim(); ++d)
    if (layout.shard_input && mesh->name(d) != "tp") xp[d] = Shard(0);
  Tensor x = uniform(xshape, 21).requires_grad_();
  EpOutcome got = run_moe(*m, distribute_tensor(x, mesh, xp), uniform(xshape, 22), layout.numerics);
  got.x_grad = x.grad();
  return compare(ref, got, /*bitwise_forward=*/!layout.tp, layout.numerics.bitwise);
}

std::string all_to_all_case(int r, int n) {
  comm::CommPtr group = n > 1 ? comm::world() : nullptr;
  std::vector<int64_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) send[size_t(q)] = (r + 2 * q) % 3, recv[size_t(q)] = (q + 2 * r) % 3;
  const int64_t rows = std::accumulate(send.begin(), send.end(), int64_t(0));
  // Row i for rank q holds 1000 r + 100 q + 10 i + column (exact in float64).
  std::vector<double> v;
  for (int q = 0; q < n; ++q)
    for (int64_t i = 0; i < send[size_t(q)]; ++i)
      for (int c = 0; c < 3; ++c) v.push_back(1000.0 * r + 100.0 * q + 10.0 * double(i) + c);
  Tensor x = tensor(v, Dims{rows, 3}, TensorOptions(DType::Float64)).requires_grad_();
  Tensor y = all_to_all_v(x, group, send, recv);
  std::vector<double> want;
  for (int s = 0; s < n; ++s)
    for (int64_t i = 0; i < recv[size_t(s)]; ++i)
      for (int c = 0; c < 3; ++c) want.push_back(1000.0 * s + 100.0 * r + 10.0 * double(i) + c);
  std::string bad;
  if (y.shape() != Dims{int64_t(want.size() / 3), 3} || y.to_vector<double>() != want) bad += "values; ";
  // d/dy (y^2 / 2 + y) = y + 1, so the gradient of each row that left is that row + 1.
  add(mul(sum(square(y)), 0.5), sum(y)).backward();
  if (!bitwise_equal(x.grad(), add(x.detach(), 1.0))) bad += "gradient; ";
  try {
    all_to_all_v(x, group, std::vector<int64_t>(size_t(n) + 1, 0), recv);
    bad += "no error for a wrong count vector; ";
  } catch (const Error& e) {
    if (std::string(e.what()).find("all_to_all_v") == std::string::npos) bad += e.what();
  }
  return bad;
}

}  // namespace tessel::testing
