#pragma once
// Reading a recorded autograd graph: what a node did, for analyses that look
// at a forward instead of re-running it (parallel::derive_plan traces one
// forward on Meta and reads its graph). Leaves are AccumulateGrad nodes
// (autograd_meta.h: their `leaf` is the parameter); every layout change is
// one "view" node, described here.
#include <cstdint>
#include <optional>

#include "autograd/node.h"

namespace tessel {

struct ViewInfo {
  enum class Kind { Reshape, Transpose, Permute, Slice, Select, Expand, Unsqueeze, Squeeze };
  Kind kind = Kind::Reshape;
  Dims in_shape;
  Dims shape;       // Reshape, Expand: the output shape; Permute: the order (output dim i is input dim shape[i])
  int64_t dim = 0;  // Transpose: the first swapped dim; Slice, Select, Unsqueeze, Squeeze: the dim
  int64_t dim2 = 0; // Transpose: the second swapped dim
};

// What a "view" node did; nullopt for any other node.
std::optional<ViewInfo> view_info(const Node& node);

}  // namespace tessel
