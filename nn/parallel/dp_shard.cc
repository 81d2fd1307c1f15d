#include "nn/parallel/dp_shard.h"

namespace tessel::parallel {

DpShard make_dp_shard(const Tensor& param, int dp, const std::string& path) {
  TESSEL_CHECK(param.is_distributed(), "data parallel", "parameter '{}' ({}) is not distributed", path,
               param.desc());
  const Mesh& mesh = *param.mesh();
  const Placements& p = param.placements();
  TESSEL_CHECK(p[dp].is_replicate(), "data parallel",
               "parameter '{}' has placements {} on mesh {}; data parallelism needs it Replicate on '{}'", path, p,
               mesh.str(), mesh.name(dp));
  DpShard s;
  s.dp = dp;
  s.dp_size = mesh.size(dp);
  s.dp_rank = mesh.coordinate(dp);
  s.global = param.shape();
  s.full_local = raw::local_of(param).shape();
  s.full = p;
  s.pending = p;
  s.pending[dp] = Partial();
  for (int d = 0; d < param.dim() && s.dim < 0; ++d) {
    bool cut = false;
    for (int m = 0; m < p.size(); ++m) cut = cut || (m != dp && p[m].is_shard(d));
    if (!cut) s.dim = d;
  }
  s.sharded = p;
  if (s.dim >= 0) s.sharded[dp] = Shard(s.dim);
  return s;
}

Range DpShard::range(int64_t r) const {
  if (dim < 0) return {0, 0};
  return chunk_range(full_local[dim], dp_size, r);
}

Dims DpShard::chunk_shape(int64_t r) const {
  Dims s = full_local;
  if (dim >= 0) s[dim] = range(r).size();
  return s;
}

int64_t DpShard::numel(int64_t r) const { return numel_of(chunk_shape(r)); }

Tensor DpShard::chunk(const Tensor& full_piece, int64_t r) const {
  if (dim < 0) return full_piece;
  const Range rg = range(r);
  return raw::narrow(full_piece, dim, rg.begin, rg.size());
}

}  // namespace tessel::parallel
