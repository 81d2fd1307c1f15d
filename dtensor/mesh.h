#pragma once
// Mesh: the devices of a job arranged as an nD grid with named dimensions
// (docs/design.md §2), e.g. Mesh::world({{"dp", 2}, {"tp", 2}}) over 4 ranks.
//
// Ranks sit in row-major order over the dims: with (dp=2, tp=2) world ranks
// 0,1 are dp=0 and 2,3 are dp=1. Each mesh dim has a communicator over the
// ranks that differ only in that coordinate (the tp group, the dp group...),
// made once when the mesh is built. A mesh is immutable and shared
// (MeshPtr); tensors on the same mesh point at the same object or at equal
// ones (same names, sizes and ranks).
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/device.h"
#include "runtime/shape.h"

namespace tessel {

namespace comm {
class Communicator;
}

class Mesh;
using MeshPtr = std::shared_ptr<const Mesh>;

class Mesh {
 public:
  struct DimSpec {
    std::string name;
    int64_t size;
  };

  // The whole job as a mesh: the product of the sizes must equal the world
  // size of comm::world() (a size-1 mesh needs no backend). Collective: every
  // rank builds the same mesh in the same order.
  static MeshPtr world(const std::vector<DimSpec>& dims, Device device = kCPU);
  // One device: a 1-D mesh of size 1 named "world" (no backend needed).
  static MeshPtr single(Device device = kCPU);

  int ndim() const { return int(names_.size()); }
  const Dims& shape() const { return shape_; }
  int64_t size(int d) const { return shape_[d]; }
  int64_t num_devices() const { return numel_of(shape_); }
  const std::string& name(int d) const { return names_[size_t(d)]; }
  // Index of the dim called `name`; throws naming the mesh otherwise.
  int dim_index(const std::string& name) const;
  Device device() const { return device_; }

  // This rank's coordinates and world rank.
  const int* coords() const { return coords_.data(); }
  int coordinate(int d) const { return coords_[size_t(d)]; }
  int my_rank() const { return my_rank_; }
  // World ranks in row-major coordinate order.
  const std::vector<int>& ranks() const { return ranks_; }
  std::vector<int> coords_of(int world_rank) const;

  // The communicator along mesh dim d (null for a dim of size 1).
  const std::shared_ptr<comm::Communicator>& comm(int d) const { return comms_[size_t(d)]; }

  // The mesh over a subset of the dims (in the given order of this mesh's
  // dims), with this rank's coordinates fixed on the others. Not collective.
  MeshPtr sub(const std::vector<std::string>& names) const;

  // The same mesh with other communicators: wrap(d, comm(d)) for each dim
  // (comm(d) is null for dims of size 1). For instrumentation, e.g. tests
  // that count or trace the collectives a strategy issues on the dp group.
  // The wrappers must reach the same ranks in the same order. Not collective.
  MeshPtr with_comms(const std::function<std::shared_ptr<comm::Communicator>(
                         int d, const std::shared_ptr<comm::Communicator>& c)>& wrap) const;

  std::string str() const {  // "(dp=2, tp=2)"
    std::string s = "(";
    for (int d = 0; d < ndim(); ++d) {
      if (d) s += ", ";
      s += names_[size_t(d)] + "=" + std::to_string(shape_[d]);
    }
    return s + ")";
  }
  bool same_as(const Mesh& o) const;  // equal names, sizes and ranks

  Mesh() = default;  // use world()/single()/sub()

 private:
  std::vector<std::string> names_;
  Dims shape_;
  Device device_;
  std::vector<int> ranks_;
  std::vector<int> coords_;
  int my_rank_ = 0;
  std::vector<std::shared_ptr<comm::Communicator>> comms_;
};

inline bool same_mesh(const MeshPtr& a, const MeshPtr& b) { return a == b || (a && b && a->same_as(*b)); }

}  // namespace tessel
