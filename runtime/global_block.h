#pragma once
// Where a local tensor sits inside a larger global tensor: the global shape
// and the local block's offset per dimension. Empty means "the whole tensor".
// Random ops and initialisers use it so that a shard draws exactly its slice
// of the values the whole tensor would get (docs/design.md §4 level 1).
#include "runtime/shape.h"

namespace tessel {

struct GlobalBlock {
  Dims global_shape;
  Dims offset;
  bool is_whole() const { return global_shape.empty() && offset.empty(); }
};

}  // namespace tessel
