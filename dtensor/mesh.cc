#include "dtensor/mesh.h"

#include <fmt/format.h>

#include "runtime/comm/comm.h"
#include "runtime/error.h"

namespace tessel {

MeshPtr Mesh::world(const std::vector<DimSpec>& dims, Device device) {
  TESSEL_CHECK(!dims.empty() && int(dims.size()) <= kMaxDims, "Mesh::world", "needs 1 to {} dims, got {}", kMaxDims,
               dims.size());
  auto m = std::make_shared<Mesh>();
  for (const DimSpec& d : dims) {
    TESSEL_CHECK(d.size > 0, "Mesh::world", "dim '{}' has size {}; sizes must be positive", d.name, d.size);
    TESSEL_CHECK(!d.name.empty(), "Mesh::world", "mesh dims need names");
    for (const std::string& n : m->names_)
      TESSEL_CHECK(n != d.name, "Mesh::world", "dim name '{}' appears twice", d.name);
    m->names_.push_back(d.name);
    m->shape_.push_back(d.size);
  }
  m->device_ = device;
  const int64_t n = numel_of(m->shape_);
  int world_size = 1, world_rank = 0;
  std::shared_ptr<comm::Communicator> w;
  if (n > 1 || comm::has_world()) {
    TESSEL_CHECK(comm::has_world(), "Mesh::world",
                 "mesh {} has {} devices but no collectives backend is running (use comm::run_local, "
                 "comm::init_mpi, or launch with mpirun)",
                 m->str(), n);
    w = comm::world();
    world_size = w->size();
    world_rank = w->rank();
  }
  TESSEL_CHECK(n == world_size, "Mesh::world", "mesh {} has {} devices but the world has {} ranks", m->str(), n,
               world_size);
  m->ranks_.resize(size_t(n));
  for (int64_t r = 0; r < n; ++r) m->ranks_[size_t(r)] = int(r);
  m->my_rank_ = world_rank;
  m->coords_ = m->coords_of(world_rank);
  // One communicator per dim: ranks sharing every other coordinate, ordered by
  // their coordinate along the dim. Every rank splits once per dim, in order.
  m->comms_.resize(dims.size());
  for (int d = 0; d < m->ndim(); ++d) {
    if (m->shape_[d] == 1) continue;
    int color = 0;
    for (int e = 0; e < m->ndim(); ++e)
      if (e != d) color = color * int(m->shape_[e]) + m->coords_[size_t(e)];
    m->comms_[size_t(d)] = w->split(color, m->coords_[size_t(d)]);
    m->comms_[size_t(d)]->set_label(m->names_[size_t(d)]);
  }
  return m;
}

MeshPtr Mesh::single(Device device) {
  auto m = std::make_shared<Mesh>();
  m->names_ = {"world"};
  m->shape_ = Dims{1};
  m->device_ = device;
  m->ranks_ = {comm::has_world() ? comm::world()->rank() : 0};
  m->my_rank_ = m->ranks_[0];
  m->coords_ = {0};
  m->comms_.resize(1);
  return m;
}

int Mesh::dim_index(const std::string& name) const {
  for (int d = 0; d < ndim(); ++d)
    if (names_[size_t(d)] == name) return d;
  TESSEL_FAIL("mesh", "mesh {} has no dim named '{}'", str(), name);
}

std::vector<int> Mesh::coords_of(int world_rank) const {
  int idx = -1;
  for (size_t i = 0; i < ranks_.size(); ++i)
    if (ranks_[i] == world_rank) idx = int(i);
  TESSEL_CHECK(idx >= 0, "mesh", "rank {} is not part of mesh {}", world_rank, str());
  std::vector<int> c(static_cast<size_t>(ndim()));
  for (int d = ndim() - 1; d >= 0; --d) {
    c[size_t(d)] = int(idx % shape_[d]);
    idx = int(idx / shape_[d]);
  }
  return c;
}

MeshPtr Mesh::sub(const std::vector<std::string>& names) const {
  TESSEL_CHECK(!names.empty(), "Mesh::sub", "needs at least one dim of mesh {}", str());
  std::vector<int> keep;
  for (const std::string& n : names) {
    int d = dim_index(n);
    for (int k : keep) TESSEL_CHECK(k != d, "Mesh::sub", "dim '{}' named twice", n);
    TESSEL_CHECK(keep.empty() || d > keep.back(), "Mesh::sub", "dims {} must be in the order of mesh {}",
                 fmt::join(names, ", "), str());
    keep.push_back(d);
  }
  auto m = std::make_shared<Mesh>();
  m->device_ = device_;
  m->my_rank_ = my_rank_;
  for (int d : keep) {
    m->names_.push_back(names_[size_t(d)]);
    m->shape_.push_back(shape_[d]);
    m->coords_.push_back(coords_[size_t(d)]);
    m->comms_.push_back(comms_[size_t(d)]);
  }
  // Ranks of the sub-mesh: vary the kept coordinates, fix the others at ours.
  const int64_t n = numel_of(m->shape_);
  Dims strides = contiguous_strides(shape_);
  m->ranks_.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i, idx = 0;
    std::vector<int> c(coords_);
    for (int k = int(keep.size()) - 1; k >= 0; --k) {
      c[size_t(keep[size_t(k)])] = int(rem % m->shape_[k]);
      rem /= m->shape_[k];
    }
    for (int d = 0; d < ndim(); ++d) idx += c[size_t(d)] * strides[d];
    m->ranks_[size_t(i)] = ranks_[size_t(idx)];
  }
  return m;
}

MeshPtr Mesh::with_comms(const std::function<std::shared_ptr<comm::Communicator>(
                             int d, const std::shared_ptr<comm::Communicator>& c)>& wrap) const {
  auto m = std::make_shared<Mesh>(*this);
  for (int d = 0; d < ndim(); ++d) {
    m->comms_[size_t(d)] = wrap(d, comms_[size_t(d)]);
    if (comms_[size_t(d)]) {
      TESSEL_CHECK(m->comms_[size_t(d)] && m->comms_[size_t(d)]->size() == comms_[size_t(d)]->size() &&
                       m->comms_[size_t(d)]->rank() == comms_[size_t(d)]->rank(),
                   "Mesh::with_comms", "the communicator of dim '{}' of mesh {} must keep its size and rank",
                   names_[size_t(d)], str());
    }
  }
  return m;
}

bool Mesh::same_as(const Mesh& o) const {
  return this == &o || (names_ == o.names_ && shape_ == o.shape_ && ranks_ == o.ranks_ && device_ == o.device_);
}

}  // namespace tessel
