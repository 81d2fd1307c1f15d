#include "parallel/sharding.h"

namespace tessel::sharding {

ShardingPlan replicate(const ShardingContext& ctx) {
  ShardingPlan p;
  const Placements r = Placements::replicated(ctx.mesh_ndim());
  p.in.assign(ctx.in.size(), r);
  p.out.assign(ctx.out.size(), r);
  return p;
}

ShardingPlan pointwise(const ShardingContext& ctx, std::initializer_list<uint32_t> linear_sets) {
  const Dims& oshape = ctx.out[0].shape;
  const int on = oshape.size();
  const int ni = int(ctx.in.size());
  ShardingPlan plan;
  plan.in.resize(size_t(ni));
  plan.out.resize(1);
  // Output dim of input i's dim di, or -1 when that dim broadcasts.
  auto out_dim = [&](int i, int di) {
    const TensorSpec& s = ctx.in[size_t(i)];
    int od = di + (on - s.dim());
    return (s.shape[di] == oshape[od] || oshape[od] == 1) ? od : -1;
  };
  for (int m = 0; m < ctx.mesh_ndim(); ++m) {
    // 1. A shard to follow: from the largest input sharding a non-broadcast dim.
    // Its placement is copied (dim adjusted), so ShardOn stays ShardOn.
    int od = -1;
    int64_t best = -1;
    Placement follow;
    for (int i = 0; i < ni; ++i) {
      const TensorSpec& s = ctx.in[size_t(i)];
      if (!s.defined || !s.placements[m].is_shard()) continue;
      int o = out_dim(i, s.placements[m].dim);
      if (o < 0) continue;
      int64_t n = numel_of(s.shape);
      if (n > best) best = n, od = o, follow = s.placements[m];
    }
    if (od >= 0) {
      for (int i = 0; i < ni; ++i) {
        const TensorSpec& s = ctx.in[size_t(i)];
        if (!s.defined) {
          plan.in[size_t(i)].push_back(Replicate());
          continue;
        }
        int di = od - (on - s.dim());
        bool has = di >= 0 && s.shape[di] == oshape[od];
        Placement p = follow;
        p.dim = int8_t(di);
        plan.in[size_t(i)].push_back(has ? p : Replicate());
      }
      follow.dim = int8_t(od);
      plan.out[0].push_back(follow);
      continue;
    }
    // 2. Partial inputs of a linear op.
    uint32_t partial = 0;
    for (int i = 0; i < ni; ++i) {
      const TensorSpec& s = ctx.in[size_t(i)];
      if (s.defined && s.placements[m].is_partial_sum()) partial |= 1u << i;
    }
    bool keep = false;
    if (partial) {
      for (uint32_t set : linear_sets) {
        uint32_t defined = 0;
        for (int i = 0; i < ni; ++i)
          if (ctx.in[size_t(i)].defined) defined |= 1u << i;
        if ((set & defined) == partial) keep = true;
      }
    }
    for (int i = 0; i < ni; ++i)
      plan.in[size_t(i)].push_back(keep && (partial >> i & 1u) ? Partial() : Replicate());
    plan.out[0].push_back(keep ? Partial() : Replicate());
  }
  return plan;
}

Placements map_dims(const Placements& in, const int* dim_map, Placement vanished) {
  Placements out;
  for (const Placement& p : in) {
    if (!p.is_shard()) {
      out.push_back(p);
    } else {
      Placement q = p;  // keeps a ShardOn's owner
      q.dim = int8_t(dim_map[p.dim]);
      out.push_back(q.dim >= 0 ? q : vanished);
    }
  }
  return out;
}

Placements unshard(const Placements& p, std::initializer_list<int> dims, bool partial) {
  Placements out = p;
  for (int m = 0; m < out.size(); ++m) {
    if (partial && out[m].is_partial()) out[m] = Replicate();
    for (int d : dims)
      if (out[m].is_shard(d)) out[m] = Replicate();
  }
  return out;
}

Placement dual(const Placement& p, const char* op) {
  if (p.is_shard()) return p;
  if (p.is_replicate()) return Partial();
  TESSEL_CHECK(p.is_partial_sum(), op,
               "cannot differentiate through a {} output (only Partial(sum) has a gradient placement)", p.str());
  return Replicate();
}

}  // namespace tessel::sharding
