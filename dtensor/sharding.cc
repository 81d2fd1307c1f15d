#include "dtensor/sharding.h"

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "runtime/numerics.h"

namespace tessel::dtensor {

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

ShardingPlan pointwise_exact(const ShardingContext& ctx, std::initializer_list<uint32_t> linear_sets, bool exact) {
  if (numerics::bitwise() && !exact) return pointwise(ctx);
  return pointwise(ctx, linear_sets);
}

int local_chunks(const Dims& shape, const Placements& p, const Mesh& mesh, const std::vector<int>& dims, int v) {
  if (dims.empty()) return v;
  const int d0 = dims[0];
  std::vector<int> cuts;  // mesh dims cutting d0, in mesh order
  for (int m = 0; m < p.size(); ++m) {
    if (!p[m].is_shard() || mesh.size(m) == 1) continue;
    for (size_t i = 1; i < dims.size(); ++i)
      if (p[m].dim == dims[i]) return 0;  // an inner reduced dim is cut: pieces are not contiguous runs
    if (p[m].dim == d0) cuts.push_back(m);
  }
  if (cuts.empty()) return v;
  int64_t w = 1;
  for (int m : cuts) w *= mesh.size(m);
  if (w > v || v % w != 0) return 0;
  int64_t unit = 1;
  for (size_t i = 1; i < dims.size(); ++i) unit *= shape[dims[i]];
  const int64_t n = shape[d0] * unit;
  // Every piece, in nested order (outer mesh dim major): [offset, length) along d0.
  struct Piece {
    int64_t off, len;
  };
  std::vector<Piece> pieces{{0, shape[d0]}};
  for (int m : cuts) {
    std::vector<Piece> next;
    for (const Piece& pc : pieces)
      for (int64_t c = 0; c < mesh.size(m); ++c) {
        Range r = chunk_range(pc.len, mesh.size(m), c);
        next.push_back({pc.off + r.begin, r.size()});
      }
    pieces = std::move(next);
  }
  // Piece i must own global chunks [i*k, (i+1)*k) with its own k-chunk
  // geometry. k = V/W is the plain case; a smaller power of two k works when
  // every global chunk from W*k on is empty (a short reduction, n < V...):
  // the pieces then finish the subtree of the first W*k chunks, and the rest
  // of the tree only adds +0 subtrees, which change no value (a canonical sum
  // is never -0: every lane starts at +0).
  for (int k = int(v / w); k >= 1; k /= 2) {
    if (k < v / w && numerics::chunk_begin(n, v, int(w) * k) != n) break;
    bool ok = true;
    for (size_t i = 0; i < pieces.size() && ok; ++i) {
      const int64_t off = pieces[i].off * unit, len = pieces[i].len * unit;
      for (int j = 0; j < k && ok; ++j) {
        const int g = int(i) * k + j;
        ok = off + numerics::chunk_begin(len, k, j) == numerics::chunk_begin(n, v, g) &&
             off + numerics::chunk_end(len, k, j) == numerics::chunk_end(n, v, g);
      }
    }
    if (ok) return k;
  }
  if (std::getenv("TESSEL_DEBUG_CHUNKS")) {
    std::string d;
    for (int x : dims) d += std::to_string(x) + ",";
    std::fprintf(stderr, "local_chunks: not exact: shape %s dims {%s} placements %s V %d\n", fmt::format(FMT_STRING("{}"), shape).c_str(),
                 d.c_str(), p.str().c_str(), v);
  }
  return 0;
}

std::vector<int> pointwise_backward_chunks(const ShardingContext& ctx, ShardingPlan& plan) {
  const int v = numerics::reduction_chunks();
  const Dims& oshape = ctx.out[0].shape;
  const int on = oshape.size(), ni = int(ctx.in.size());
  std::vector<int> chunks(static_cast<size_t>(ni), v);
  for (int guard = 0; guard <= ctx.mesh_ndim(); ++guard) {
    int bad = -1;
    for (int i = 0; i < ni && bad < 0; ++i) {
      const TensorSpec& s = ctx.in[size_t(i)];
      chunks[size_t(i)] = v;
      if (!s.defined || !is_floating(s.dtype)) continue;
      std::vector<int> reduced;
      for (int od = 0; od < on; ++od) {
        const int di = od - (on - s.dim());
        if (di < 0 || (s.shape[di] == 1 && oshape[od] != 1)) reduced.push_back(od);
      }
      const int k = local_chunks(oshape, plan.out[0], *ctx.mesh, reduced, v);
      if (k > 0) {
        chunks[size_t(i)] = k;
        continue;
      }
      for (int m = 0; m < ctx.mesh_ndim() && bad < 0; ++m)
        for (int od : reduced)
          if (plan.out[0][m].is_shard(od)) bad = m;
    }
    if (bad < 0) return chunks;
    for (auto& p : plan.in) p[bad] = Replicate();
    plan.out[0][bad] = Replicate();
  }
  TESSEL_FAIL(ctx.op, "internal error: no exact layout for the backward reductions");
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

}  // namespace tessel::dtensor
