#pragma once
// Placements (docs/design.md §2): how a global tensor lives on one mesh dimension.
//
//   Shard(d)     the tensor is cut along its dim d into ceil-division chunks,
//                one per coordinate of the mesh dimension (last chunks may be
//                short or empty);
//   Replicate    every coordinate holds the whole (current) tensor;
//   Partial(op)  the global value is the reduction (sum, max, min) of the
//                coordinates' local values: a pending all-reduce.
//   ShardOn(d, c) the whole tensor lives on coordinate c; the other
//                coordinates hold empty pieces (dim d of size 0). A Shard(d)
//                whose chunks are [0 ... 0, all, 0 ... 0]: expert parallelism
//                keeps expert e's weights on one coordinate of the "ep" dim
//                this way (docs/parallel.md), and everything that works on
//                shards (gathers, reduce-scatters, norms, optimisers on local
//                pieces) works on it through shard_range().
//
// A tensor has one placement per mesh dimension. Shards along several mesh
// dimensions nest in mesh-dimension order: mesh dim 0 cuts first, mesh dim 1
// cuts the piece that mesh dim 0 left, and so on (the layout PyTorch's DTensor
// uses too). Placements is a small inline vector (no heap).
#include <cstdint>
#include <string>

#include "runtime/reduce_op.h"
#include "runtime/global_block.h"
#include "runtime/shape.h"

namespace tessel {

inline constexpr int kMaxMeshDims = 6;

struct Placement {
  enum class Kind : uint8_t { Replicate, Shard, Partial };
  Kind kind = Kind::Replicate;
  int8_t dim = 0;                         // Shard: the tensor dim
  comm::ReduceOp op = comm::ReduceOp::Sum;  // Partial: the pending reduction
  int8_t owner = -1;                      // Shard: -1 ceil-division chunks; c >= 0 all on coordinate c (ShardOn)

  bool is_replicate() const { return kind == Kind::Replicate; }
  bool is_shard() const { return kind == Kind::Shard; }
  bool is_shard(int d) const { return kind == Kind::Shard && dim == d; }
  bool is_partial() const { return kind == Kind::Partial; }
  bool is_partial_sum() const { return kind == Kind::Partial && op == comm::ReduceOp::Sum; }
  bool is_owned() const { return kind == Kind::Shard && owner >= 0; }  // ShardOn
  std::string str() const;  // "R", "S(0)", "S(0)@1" (ShardOn), "P(sum)"

  friend bool operator==(const Placement& a, const Placement& b) {
    if (a.kind != b.kind) return false;
    if (a.kind == Kind::Shard) return a.dim == b.dim && a.owner == b.owner;
    if (a.kind == Kind::Partial) return a.op == b.op;
    return true;
  }
  friend bool operator!=(const Placement& a, const Placement& b) { return !(a == b); }
};

inline Placement Replicate() { return {}; }
inline Placement Shard(int dim) { return {Placement::Kind::Shard, int8_t(dim), comm::ReduceOp::Sum}; }
inline Placement Partial(comm::ReduceOp op = comm::ReduceOp::Sum) { return {Placement::Kind::Partial, 0, op}; }
// Tensor dim `dim` entirely on coordinate `coord` of the mesh dim (see above).
inline Placement ShardOn(int dim, int coord) {
  return {Placement::Kind::Shard, int8_t(dim), comm::ReduceOp::Sum, int8_t(coord)};
}

class Placements {
 public:
  Placements() = default;
  Placements(std::initializer_list<Placement> v) {
    for (const Placement& p : v) push_back(p);
  }
  static Placements replicated(int n) {
    Placements p;
    for (int i = 0; i < n; ++i) p.push_back(Replicate());
    return p;
  }
  int size() const { return n_; }
  bool empty() const { return n_ == 0; }
  Placement& operator[](int i) { return p_[i]; }
  const Placement& operator[](int i) const { return p_[i]; }
  const Placement* begin() const { return p_; }
  const Placement* end() const { return p_ + n_; }
  void push_back(const Placement& p);

  bool all_replicate() const;
  bool any_partial() const;
  bool any_shard() const;
  // Mesh dims that shard tensor dim d, in mesh order.
  int shards_of(int d) const;  // how many
  std::string str() const;     // "[S(0), R]"

  friend bool operator==(const Placements& a, const Placements& b) {
    if (a.n_ != b.n_) return false;
    for (int i = 0; i < a.n_; ++i)
      if (a.p_[i] != b.p_[i]) return false;
    return true;
  }
  friend bool operator!=(const Placements& a, const Placements& b) { return !(a == b); }

 private:
  Placement p_[kMaxMeshDims];
  int n_ = 0;
};

// Chunk c of n over `size` elements: [begin, end) with ceil-division chunks
// (trailing chunks short or empty).
struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
inline Range chunk_range(int64_t size, int64_t n, int64_t c) {
  const int64_t chunk = n > 0 ? (size + n - 1) / n : size;
  int64_t b = chunk * c;
  if (b > size) b = size;
  int64_t e = b + chunk;
  if (e > size) e = size;
  return {b, e};
}

// The range of coordinate c (of n) under the shard placement p: chunk_range
// for Shard(d); for ShardOn(d, o) everything on o, empty ranges elsewhere
// (before o at 0, after it at the end, so the ranges still tile [0, size) in
// coordinate order — gathers concatenate pieces in that order).
inline Range shard_range(const Placement& p, int64_t size, int64_t n, int64_t c) {
  if (p.owner < 0) return chunk_range(size, n, c);
  if (c == p.owner) return {0, size};
  return c < p.owner ? Range{0, 0} : Range{size, size};
}

// Where the local piece of a global tensor sits, for the coordinates `coords`
// (one per mesh dim) of a mesh with sizes `mesh_shape`: local shape and offset
// per tensor dim (nested shards in mesh-dim order).
struct LocalGeometry {
  Dims shape;
  Dims offset;
  // The block for random ops and initialisers (docs/design.md §4 level 1).
  GlobalBlock block(const Dims& global_shape) const { return {global_shape, offset}; }
};
LocalGeometry local_geometry(const Dims& global_shape, const Dims& mesh_shape, const Placements& placements,
                             const int* coords);
// The size of tensor dim d as seen by mesh dim m, i.e. after mesh dims < m cut it.
int64_t size_at_level(const Dims& global_shape, const Dims& mesh_shape, const Placements& placements,
                      const int* coords, int mesh_dim, int tensor_dim);

}  // namespace tessel

template <>
struct fmt::formatter<tessel::Placements> : fmt::formatter<std::string> {
  template <class Ctx>
  auto format(const tessel::Placements& p, Ctx& ctx) const {
    return fmt::formatter<std::string>::format(p.str(), ctx);
  }
};
