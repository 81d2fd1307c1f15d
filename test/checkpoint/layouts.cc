#include "test/checkpoint/layouts.h"

#include "autograd/api.h"
#include "dtensor/ops.h"
#include "test/util/dist.h"
#include "test/util/util.h"

namespace tessel::testing {

int CkptLayout::world() const { return mesh.empty() ? 1 : mesh_size(mesh); }

const std::vector<CkptLayout>& ckpt_layouts() {
  static const std::vector<CkptLayout> layouts = {
      {"single", {}, nullptr},
      {"dp2", {{"dp", 2}}, [](size_t, int, DType) { return Placements{Replicate()}; }},
      {"tp2", {{"tp", 2}},
       [](size_t i, int nd, DType) {
         if (nd == 0) return Placements{Replicate()};
         return Placements{Shard(nd >= 2 && i % 2 == 1 ? 1 : 0)};
       }},
      {"dp2xtp2", {{"dp", 2}, {"tp", 2}},
       [](size_t i, int nd, DType) {
         if (nd == 0) return Placements{Replicate(), Replicate()};
         if (nd >= 2 && i % 2 == 1) return Placements{Shard(0), Shard(1)};
         return Placements{Replicate(), Shard(0)};
       }},
      {"uneven3", {{"tp", 3}},
       [](size_t, int nd, DType) { return nd == 0 ? Placements{Replicate()} : Placements{Shard(0)}; }},
      {"nested2x2", {{"a", 2}, {"b", 2}},
       [](size_t, int nd, DType) {
         return nd == 0 ? Placements{Replicate(), Replicate()} : Placements{Shard(0), Shard(0)};
       }},
      {"partial2", {{"tp", 2}},
       [](size_t, int, DType dt) { return is_floating(dt) ? Placements{Partial()} : Placements{Replicate()}; }},
  };
  return layouts;
}

const CkptLayout& ckpt_layout(const std::string& name) {
  for (const auto& l : ckpt_layouts())
    if (l.name == name) return l;
  throw Error("no layout " + name);
}

checkpoint::NamedTensors ckpt_tensors() {
  return {
      {"a.weight", uniform({13, 7}, 1)},
      {"b", uniform({5}, 2, -1, 1, DType::Float64)},
      {"c", uniform({6, 4, 3}, 3, -1, 1, DType::BFloat16)},
      {"d", randint({}, 4, -100, 100, DType::Int64)},
      {"e", uniform({0, 3}, 5)},
      {"f", uniform({2, 9}, 6)},
      {"g", randint({4}, 7, 0, 2, DType::Int32).to(DType::Bool)},
      {"big", uniform({300, 1000}, 8)},  // > 1 MiB: chunks of several CRC blocks
  };
}

checkpoint::NamedTensors lay_out(const CkptLayout& layout, const checkpoint::NamedTensors& globals, bool zero) {
  checkpoint::NamedTensors out;
  MeshPtr mesh;
  if (!layout.mesh.empty()) mesh = Mesh::world(layout.mesh);
  for (size_t i = 0; i < globals.size(); ++i) {
    const auto& [name, g] = globals[i];
    if (!mesh) {
      out.emplace_back(name, zero ? zeros(g.shape(), g.dtype()) : g.clone());
      continue;
    }
    const Placements p = layout.place(i, g.dim(), g.dtype());
    if (zero) {
      out.emplace_back(name, zeros(g.shape(), mesh, p, TensorOptions(g.dtype())));
    } else if (p.any_partial()) {
      // Two halves that sum to the value exactly.
      out.emplace_back(name, from_local(g * 0.5, mesh, p, g.shape()));
    } else {
      out.emplace_back(name, distribute_tensor(g, mesh, p));
    }
  }
  return out;
}

std::string on_layout(const CkptLayout& layout, const std::function<std::string()>& fn) {
  if (layout.mesh.empty()) return fn();
  return first_failure(on_ranks(layout.world(), [&](int) { return fn(); }));
}

}  // namespace tessel::testing
