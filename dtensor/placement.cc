#include "dtensor/placement.h"

#include <fmt/format.h>

#include "runtime/error.h"

namespace tessel {

namespace comm {
const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}
}  // namespace comm

std::string Placement::str() const {
  switch (kind) {
    case Kind::Replicate: return "R";
    case Kind::Shard: return owner >= 0 ? fmt::format(FMT_STRING("S({})@{}"), int(dim), int(owner)) : fmt::format(FMT_STRING("S({})"), int(dim));
    case Kind::Partial: return fmt::format(FMT_STRING("P({})"), comm::reduce_op_name(op));
  }
  return "?";
}

void Placements::push_back(const Placement& p) {
  TESSEL_CHECK(n_ < kMaxMeshDims, "placements", "at most {} mesh dims are supported", kMaxMeshDims);
  p_[n_++] = p;
}

bool Placements::all_replicate() const {
  for (int i = 0; i < n_; ++i)
    if (!p_[i].is_replicate()) return false;
  return true;
}
bool Placements::any_partial() const {
  for (int i = 0; i < n_; ++i)
    if (p_[i].is_partial()) return true;
  return false;
}
bool Placements::any_shard() const {
  for (int i = 0; i < n_; ++i)
    if (p_[i].is_shard()) return true;
  return false;
}
int Placements::shards_of(int d) const {
  int k = 0;
  for (int i = 0; i < n_; ++i) k += p_[i].is_shard(d);
  return k;
}

std::string Placements::str() const {
  std::string s = "[";
  for (int i = 0; i < n_; ++i) {
    if (i) s += ", ";
    s += p_[i].str();
  }
  return s + "]";
}

LocalGeometry local_geometry(const Dims& global_shape, const Dims& mesh_shape, const Placements& placements,
                             const int* coords) {
  LocalGeometry b;
  b.offset = Dims::filled(global_shape.size(), 0);
  Dims size = global_shape;
  for (int m = 0; m < placements.size(); ++m) {
    const Placement& p = placements[m];
    if (!p.is_shard()) continue;
    Range r = shard_range(p, size[p.dim], mesh_shape[m], coords[m]);
    b.offset[p.dim] += r.begin;
    size[p.dim] = r.size();
  }
  b.shape = size;
  return b;
}

int64_t size_at_level(const Dims& global_shape, const Dims& mesh_shape, const Placements& placements,
                      const int* coords, int mesh_dim, int tensor_dim) {
  int64_t size = global_shape[tensor_dim];
  for (int m = 0; m < mesh_dim; ++m)
    if (placements[m].is_shard(tensor_dim)) size = shard_range(placements[m], size, mesh_shape[m], coords[m]).size();
  return size;
}

}  // namespace tessel
