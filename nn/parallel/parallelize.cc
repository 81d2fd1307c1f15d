#include "nn/parallel/parallelize.h"

#include <map>
#include <regex>

#include "autograd/api.h"
#include "dtensor/ops.h"
#include "dtensor/redistribute.h"
#include "nn/moe.h"
#include "nn/parallel/expert_parallel.h"

namespace tessel::parallel {
namespace {

std::vector<std::string> sample(const std::vector<std::string>& names, size_t n) {
  std::vector<std::string> s(names.begin(), names.begin() + std::min(n, names.size()));
  if (names.size() > n) s.push_back("...");
  return s;
}

// MoE layers matched by the plan's expert rules on a mesh that has their dim,
// and the ep placement of each expert weight (checked before any work).
struct ExpertLayers {
  std::vector<std::pair<nn::MoE*, int>> layers;                // layer, ep mesh dim (-1: none)
  std::map<const Tensor*, std::pair<int, Placement>> placement;  // weight -> (ep mesh dim, ShardOn)
};

ExpertLayers find_expert_layers(nn::Module& model, const Mesh& mesh, const ParallelPlan& plan) {
  ExpertLayers out;
  std::vector<std::pair<std::string, nn::Module*>> modules = model.named_modules();
  std::vector<std::string> names;
  for (auto& [path, m] : modules) names.push_back(path);
  for (const ExpertRule& rule : plan.experts) {
    const std::regex re = compile_regex(rule.match);
    int ep = -1;
    for (int m = 0; m < mesh.ndim(); ++m)
      if (mesh.name(m) == rule.dim) ep = m;
    bool hit = false;
    for (auto& [path, m] : modules) {
      if (!std::regex_match(path, re)) continue;
      hit = true;
      auto* moe = dynamic_cast<nn::MoE*>(m);
      TESSEL_CHECK(moe != nullptr, "parallelize", "plan '{}': experts rule '{}' matches '{}', a {} (not an MoE layer)",
                   plan.name, rule.match, path, m->type_name());
      if (ep < 0) {
        // The mesh has no such dim: every rank holds every expert (laid out
        // by the other rules) and runs the ones its own tokens route to, so
        // tokens sharded over dp stay where they are (not gathered).
        out.layers.emplace_back(moe, -1);
        continue;
      }
      const int64_t E = moe->config.num_experts;
      for (int64_t e = 0; e < E; ++e) {
        const int64_t owner = expert_owner(e, E, mesh.size(ep),
                                           fmt::format(FMT_STRING("'{}' on mesh {}"), path.empty() ? moe->type_name() : path,
                                                       mesh.str()));
        nn::SwiGLU& x = moe->expert(e);
        for (const Tensor* w : {&x.w1->weight, &x.w2->weight, &x.w3->weight})
          out.placement[w] = {ep, ShardOn(0, int(owner))};
      }
      out.layers.emplace_back(moe, ep);
    }
    TESSEL_CHECK(hit, "parallelize", "plan '{}': experts rule '{}' matches no module of the model (modules: {})",
                 plan.name, rule.match, fmt::join(sample(names, 6), ", "));
  }
  return out;
}

}  // namespace

ParallelizeResult parallelize(nn::Module& model, const MeshPtr& mesh, const ParallelPlan& plan) {
  TESSEL_CHECK(mesh != nullptr, "parallelize", "needs a mesh");
  ParallelizeResult result;
  const Placements replicated = Placements::replicated(mesh->ndim());

  // ---- check the whole plan before touching the model ------------------------------
  std::vector<std::pair<std::string, const nn::ParameterSlot*>> slots = model.parameter_slots();
  std::vector<std::string> param_names, module_names;
  for (auto& [path, slot] : slots) param_names.push_back(path);
  for (auto& [path, m] : model.named_modules()) module_names.push_back(path);
  std::vector<std::regex> param_re, module_re;
  for (const ParamRule& r : plan.params) param_re.push_back(compile_regex(r.match));
  for (const ModuleRule& r : plan.modules) module_re.push_back(compile_regex(r.match));
  for (size_t i = 0; i < plan.params.size(); ++i) {
    bool hit = false;
    for (const auto& n : param_names) hit = hit || std::regex_match(n, param_re[i]);
    TESSEL_CHECK(hit, "parallelize", "plan '{}': parameter rule '{}' matches no parameter of the model{} (parameters: {})",
                 plan.name, plan.params[i].match, plan.params[i].hint.empty() ? "" : " -- it was " + plan.params[i].hint,
                 fmt::join(sample(param_names, 6), ", "));
  }
  for (size_t i = 0; i < plan.modules.size(); ++i) {
    bool hit = false;
    for (const auto& n : module_names) hit = hit || std::regex_match(n, module_re[i]);
    TESSEL_CHECK(hit, "parallelize", "plan '{}': module rule '{}' matches no module of the model (modules: {})",
                 plan.name, plan.modules[i].match, fmt::join(sample(module_names, 6), ", "));
  }
  // Expert parallelism: the MoE layers and the mesh dim their experts spread over.
  const ExpertLayers expert_layers = find_expert_layers(model, *mesh, plan);
  std::vector<Placements> chosen;
  for (auto& [path, slot] : slots) {
    Placements p = replicated;
    for (size_t i = 0; i < plan.params.size(); ++i) {
      if (!std::regex_match(path, param_re[i])) continue;
      p = plan.params[i].layout.on(*mesh, replicated);
      break;
    }
    if (auto it = expert_layers.placement.find(slot->tensor); it != expert_layers.placement.end())
      p[it->second.first] = it->second.second;
    dtensor::check_placements(("parallelize '" + path + "'").c_str(), *mesh, p, slot->tensor->dim());
    chosen.push_back(p);
  }

  // ---- parameters ---------------------------------------------------------------------------
  NoGradGuard ng;
  for (size_t i = 0; i < slots.size(); ++i) {
    Tensor& t = *slots[i].second->tensor;
    TESSEL_CHECK(!t.is_distributed(), "parallelize", "parameter '{}' is already distributed ({})", slots[i].first,
                 t.desc());
    Tensor d;
    if (t.device().is_meta()) {
      d = empty(t.shape(), mesh, chosen[i], TensorOptions(t.dtype()).with_device(kMeta));
    } else {
      d = distribute_tensor(t.detach(), mesh, chosen[i]);
      // A private copy of the piece: the full parameter is released, and the
      // piece never aliases another parameter's storage.
      d = raw::make_distributed(raw::local_of(d).clone(), mesh, chosen[i], t.shape());
    }
    d.requires_grad_(true);
    t = d;
    result.params.emplace_back(slots[i].first, chosen[i]);
  }

  for (auto& [moe, ep] : expert_layers.layers) {
    moe->set_dispatch(std::make_shared<ExpertParallelDispatch>(mesh, ep));
    if (ep >= 0) ++result.expert_layers;
  }

  // ---- module layouts -----------------------------------------------------------------------
  for (auto& [path, m] : model.named_modules()) {
    for (size_t i = 0; i < plan.modules.size(); ++i) {
      if (!std::regex_match(path, module_re[i])) continue;
      const ModuleRule& r = plan.modules[i];
      if (!r.input.empty()) {
        m->register_forward_pre_hook([layout = r.input](nn::Module&, const Tensor& x) {
          if (!x.is_distributed()) return x;
          return redistribute(x, layout.on(*x.mesh(), x.placements()));
        });
        ++result.module_hooks;
      }
      if (!r.output.empty()) {
        m->register_forward_hook([layout = r.output](nn::Module&, const Tensor&, const Tensor& y) {
          if (!y.is_distributed()) return y;
          return redistribute(y, layout.on(*y.mesh(), y.placements()));
        });
        ++result.module_hooks;
      }
    }
  }
  return result;
}

Tensor distribute_batch(const Tensor& ids, const MeshPtr& mesh, const ParallelPlan& plan) {
  Placements p = plan.data.on(*mesh, Placements::replicated(mesh->ndim()));
  // Context parallelism cuts sequences along time; a tensor without a time
  // dim (per-sample labels [B]) is whole along cp.
  for (int m = 0; m < p.size(); ++m)
    if (mesh->name(m) == "cp" && p[m].is_shard() && p[m].dim >= ids.dim()) p[m] = Replicate();
  return distribute_tensor(ids, mesh, p);
}

int64_t local_parameter_bytes(const nn::Module& model) {
  int64_t n = 0;
  for (const Tensor& t : model.parameters()) n += int64_t(raw::local_of(t).nbytes());
  return n;
}

}  // namespace tessel::parallel
