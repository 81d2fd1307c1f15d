#pragma once
// Helpers for distributed tests on the local backend (ranks as threads).
//
// Catch2 assertions are not thread-safe, so code running on a rank never
// asserts: it returns a report (empty = fine) and the test checks the
// reports after every rank has finished. Per-rank results go in
// std::vector<char> (or any type with one element per object), never
// std::vector<bool>: it packs neighbouring ranks' flags into one word, and
// ranks writing them at once race (ThreadSanitizer reports it).
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "dtensor/mesh.h"
#include "dtensor/placement.h"
#include "runtime/comm/comm.h"

namespace tessel::testing {

// Runs fn(rank) on n ranks; returns each rank's report.
inline std::vector<std::string> on_ranks(int n, const std::function<std::string(int)>& fn) {
  std::vector<std::string> out(static_cast<size_t>(n));
  comm::run_local(n, [&](int r) { out[size_t(r)] = fn(r); });
  return out;
}

// "" when every report is empty, else the first non-empty one with its rank.
inline std::string first_failure(const std::vector<std::string>& reports) {
  for (size_t r = 0; r < reports.size(); ++r)
    if (!reports[r].empty()) return "rank " + std::to_string(r) + ": " + reports[r];
  return "";
}

// What one rank found wrong, for on_ranks: expect(ok, what) records `what`
// when !ok (a rank's stand-in for CHECK, which must not run on a rank).
class RankReport {
 public:
  void expect(bool ok, const std::string& what) {
    if (!ok) failures_ += (failures_.empty() ? "" : "; ") + what;
  }
  const std::string& str() const { return failures_; }

 private:
  std::string failures_;
};

// Mesh shapes the op tests sweep: 1-D, 2-D and 3-D, even and odd sizes.
inline std::vector<std::vector<Mesh::DimSpec>> test_meshes() {
  return {
      {{"x", 1}},
      {{"x", 2}},
      {{"x", 3}},
      {{"x", 4}},
      {{"dp", 2}, {"tp", 2}},
      {{"dp", 3}, {"tp", 2}},
      {{"pp", 2}, {"dp", 2}, {"tp", 2}},
  };
}

inline int mesh_size(const std::vector<Mesh::DimSpec>& dims) {
  int n = 1;
  for (const auto& d : dims) n *= int(d.size);
  return n;
}

inline std::string mesh_name(const std::vector<Mesh::DimSpec>& dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + dims[i].name + "=" + std::to_string(dims[i].size);
  return s + ")";
}

// Random placements for a tensor of `ndim` dims on `mesh_ndim` mesh dims:
// Replicate, Shard of a random dim, or (if allow_partial) Partial(sum). The
// generator must be seeded alike on every rank.
inline Placements random_placements(std::mt19937_64& gen, int mesh_ndim, int ndim, bool allow_partial) {
  Placements p;
  for (int m = 0; m < mesh_ndim; ++m) {
    int k = int(gen() % (allow_partial ? 4 : 3));
    if (k == 0 || ndim == 0) p.push_back(Replicate());
    else if (k == 3) p.push_back(Partial());
    else p.push_back(Shard(int(gen() % uint64_t(ndim))));
  }
  return p;
}

}  // namespace tessel::testing
