#pragma once
// Test tensors and the layouts the checkpoint tests save from and load into:
// one device, data parallel, tensor parallel, 2-D, uneven (empty pieces),
// nested shards, and Partial pieces.
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "dtensor/mesh.h"

namespace tessel::testing {

struct CkptLayout {
  std::string name;
  std::vector<Mesh::DimSpec> mesh;  // empty: plain tensors, no world
  // Placements of test tensor `index` with `ndim` dims and dtype.
  std::function<Placements(size_t index, int ndim, DType dtype)> place;
  int world() const;
};

const std::vector<CkptLayout>& ckpt_layouts();
const CkptLayout& ckpt_layout(const std::string& name);

// The global test tensors (names, values), deterministic.
checkpoint::NamedTensors ckpt_tensors();

// On a rank (or without a world for a mesh-less layout): the tensors laid out.
// zeros = true gives zero-filled targets in the same layout.
checkpoint::NamedTensors lay_out(const CkptLayout& layout, const checkpoint::NamedTensors& globals, bool zeros);

// Runs fn on the layout's ranks (threads) or inline; returns the first failure ("" if none).
std::string on_layout(const CkptLayout& layout, const std::function<std::string()>& fn);

}  // namespace tessel::testing
