#include "dtensor/redistribute.h"


#include <fmt/format.h>

#include "kernels/elementwise.h"
#include "runtime/comm/comm.h"
#include "runtime/cost.h"
#include "runtime/numerics.h"
#include "runtime/profile.h"

namespace tessel::dtensor {
namespace {

Tensor contiguous_copy(const Tensor& t) {
  Tensor out = raw::empty(t.shape(), t.dtype(), t.device());
  kernels::copy(t.device(), t, out);
  return out;
}

// t with dim d moved to the front, as a new contiguous tensor.
Tensor to_front(const Tensor& t, int d) {
  if (d == 0) return t.is_contiguous() ? t : contiguous_copy(t);
  Dims order;
  order.push_back(d);
  for (int i = 0; i < t.dim(); ++i)
    if (i != d) order.push_back(i);
  return contiguous_copy(raw::permute(t, order));
}

// Inverse of to_front: buf is contiguous [D, rest...] with rest in original order.
Tensor from_front(const Tensor& buf, int d) {
  if (d == 0) return buf;
  Dims order;  // buf dim i -> original position
  for (int i = 1; i <= d; ++i) order.push_back(i);
  order.push_back(0);
  for (int i = d + 1; i < buf.dim(); ++i) order.push_back(i);
  return contiguous_copy(raw::permute(buf, order));
}

int64_t inner_size(const Tensor& t, int d) {
  int64_t n = 1;
  for (int i = 0; i < t.dim(); ++i)
    if (i != d) n *= t.shape()[i];
  return n;
}

const char* collective_of(const Placement& from, const Placement& to) {
  if (from == to) return "none";
  if (from.is_shard() && to.is_replicate()) return "all_gather";
  if (from.is_partial() && to.is_replicate()) return "all_reduce";
  if (from.is_partial() && to.is_shard()) return "reduce_scatter";
  // Two cuts of one dim that differ in layout (ShardOn vs chunks) meet in Replicate.
  if (from.is_shard() && to.is_shard()) return from.dim == to.dim ? nullptr : "all_to_all";
  if (from.is_replicate() && to.is_shard()) return "slice";
  if (from.is_replicate() && to.is_partial()) return "zero";
  return nullptr;  // needs a detour through Replicate
}

// Can mesh dim m change from cur[m] to `to` now? Not while a later mesh dim
// cuts a tensor dim this change touches.
int blocker(const Placements& cur, int m, const Placement& to) {
  int worst = -1;
  for (int j = m + 1; j < cur.size(); ++j) {
    if (!cur[j].is_shard()) continue;
    int d = cur[j].dim;
    if (cur[m].is_shard(d) || to.is_shard(d)) worst = j;
  }
  return worst;
}

// Does a mesh dim before m still have to change a cut of tensor dim d?
bool earlier_pending(const Placements& cur, const Placements& to, int m, int d) {
  for (int i = 0; i < m; ++i)
    if (cur[i] != to[i] && (cur[i].is_shard(d) || to[i].is_shard(d))) return true;
  return false;
}

// The last mesh dim sharding tensor dim d (no later dim cuts d, so it can always be gathered).
int last_shard_of(const Placements& cur, int d) {
  int j = -1;
  for (int i = 0; i < cur.size(); ++i)
    if (cur[i].is_shard(d)) j = i;
  return j;
}

}  // namespace

std::string RedistStep::str() const {
  return fmt::format(FMT_STRING("mesh dim {}: {} -> {} ({})"), mesh_dim, from.str(), to.str(), collective);
}

void check_placements(const char* op, const Mesh& mesh, const Placements& p, int ndim) {
  TESSEL_CHECK(p.size() == mesh.ndim(), op, "placements {} must have one entry per dim of mesh {}", p, mesh.str());
  for (int m = 0; m < p.size(); ++m) {
    if (p[m].is_shard()) {
      TESSEL_CHECK(p[m].dim >= 0 && p[m].dim < ndim, op, "placement {} on mesh dim '{}' names a dim outside a {}-D tensor",
                   p[m].str(), mesh.name(m), ndim);
      TESSEL_CHECK(p[m].owner < mesh.size(m), op, "placement {} on mesh dim '{}' (size {}) names a coordinate outside it",
                   p[m].str(), mesh.name(m), mesh.size(m));
    }
    if (p[m].is_partial()) {
      TESSEL_CHECK(p[m].op != comm::ReduceOp::Avg, op,
                   "Partial(avg) is not supported (mesh dim '{}'); scale and use Partial(sum)", mesh.name(m));
    }
  }
}

std::vector<RedistStep> plan_redistribute(const Mesh& mesh, const Placements& from, const Placements& to) {
  TESSEL_ASSERT(from.size() == mesh.ndim() && to.size() == mesh.ndim());
  std::vector<RedistStep> steps;
  Placements cur = from;
  auto push = [&](int m, const Placement& target) {
    const char* c = collective_of(cur[m], target);
    TESSEL_ASSERT(c != nullptr);
    if (std::string(c) != "none") steps.push_back({m, cur[m], target, c});
    cur[m] = target;
  };
  if (numerics::bitwise()) {
    // Pieces of a pending sum nest in mesh order (outer dim major), and the
    // canonical tree combines the innermost first: with more than one
    // Partial dim being reduced, all-reduce them innermost first (the
    // nesting rules below could otherwise reduce an outer dim first).
    // Reducing an outer Partial dim while an inner one stays Partial (a
    // gradient pending over ep x dp with ep outer, whose dp sum the DDP
    // buckets finish) would sum across the outer dim first: reduce the inner
    // one too, innermost first, and make it Partial again afterwards (the
    // other coordinates hold -0.0, so the later sum gives the same bits).
    int reducing = 0, outermost = -1;
    for (int m = 0; m < mesh.ndim(); ++m) {
      if (!from[m].is_partial() || to[m].is_partial()) continue;
      ++reducing;
      if (outermost < 0) outermost = m;
    }
    bool inner_kept = false;
    for (int m = outermost + 1; outermost >= 0 && m < mesh.ndim(); ++m)
      inner_kept = inner_kept || (from[m].is_partial() && to[m].is_partial());
    if (reducing > 1 || inner_kept)
      for (int m = mesh.ndim() - 1; m >= 0; --m)
        if (cur[m].is_partial() && (!to[m].is_partial() || (inner_kept && m > outermost))) push(m, Replicate());
  }
  for (int guard = 0; cur != to; ++guard) {
    TESSEL_ASSERT(guard < 4 * kMaxMeshDims + 4);
    bool progressed = false;
    for (int m = mesh.ndim() - 1; m >= 0; --m) {
      if (cur[m] == to[m]) continue;
      const bool direct = collective_of(cur[m], to[m]) != nullptr;
      const Placement first = direct ? to[m] : Replicate();  // else a detour through Replicate
      if (blocker(cur, m, first) >= 0) continue;
      // Cutting a dim here must wait while an earlier mesh dim still has to
      // change how it cuts that dim (shards nest in mesh order).
      if (first.is_shard() && earlier_pending(cur, to, m, first.dim)) continue;
      push(m, first);
      if (!direct && blocker(cur, m, to[m]) < 0) push(m, to[m]);
      progressed = true;
    }
    if (progressed) continue;
    // Every pending change is blocked by a later mesh dim cutting the same
    // tensor dim: gather the last such cut (nothing after it can block it).
    bool unblocked = false;
    for (int m = mesh.ndim() - 1; m >= 0 && !unblocked; --m) {
      if (cur[m] == to[m]) continue;
      const Placement first = collective_of(cur[m], to[m]) ? to[m] : Replicate();
      const int j = blocker(cur, m, first);
      if (j < 0) continue;  // waiting for an earlier mesh dim instead
      push(last_shard_of(cur, cur[j].dim), Replicate());
      unblocked = true;
    }
    TESSEL_ASSERT(unblocked);
  }
  return steps;
}

namespace {

struct Exec {
  const Mesh& mesh;
  const Dims& global;
  Placements cur;

  int64_t level_size(int m, int d) const { return size_at_level(global, mesh.shape(), cur, mesh.coords(), m, d); }
  // Elements each coordinate of mesh dim m holds when `p` cuts tensor dim d.
  std::vector<int64_t> counts(int m, const Placement& p, int64_t inner) const {
    const int64_t n = mesh.size(m), L = level_size(m, p.dim);
    std::vector<int64_t> c(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) c[size_t(i)] = shard_range(p, L, n, i).size() * inner;
    return c;
  }

  Tensor step(const Tensor& t, const RedistStep& s) {
    const int m = s.mesh_dim;
    const int64_t n = mesh.size(m);
    const auto& comm = mesh.comm(m);
    const std::string c = s.collective;
    Tensor out;
    if (c == "all_gather") {
      const int d = s.from.dim;
      const int64_t L = level_size(m, d);
      Tensor in = to_front(t, d);
      Dims fs = in.shape();
      fs[0] = L;
      Tensor buf = raw::empty(fs, t.dtype(), t.device());
      if (n == 1) kernels::copy(t.device(), in, buf);
      else comm->all_gather_v(in, buf, counts(m, s.from, inner_size(t, d)))->wait();
      out = from_front(buf, d);
    } else if (c == "all_reduce") {
      out = contiguous_copy(t);
      if (n > 1) comm->all_reduce(out, s.from.op)->wait();
    } else if (c == "reduce_scatter") {
      const int d = s.to.dim;
      const int64_t L = level_size(m, d);
      Tensor in = to_front(t, d);
      Range r = shard_range(s.to, L, n, mesh.coordinate(m));
      Dims os = in.shape();
      os[0] = r.size();
      Tensor buf = raw::empty(os, t.dtype(), t.device());
      if (n == 1) kernels::copy(t.device(), in, buf);
      else comm->reduce_scatter_v(in, buf, counts(m, s.to, inner_size(t, d)), s.from.op)->wait();
      out = from_front(buf, d);
    } else if (c == "all_to_all") {
      out = all_to_all(t, m, s.from, s.to);
    } else if (c == "slice") {
      const int d = s.to.dim;
      Range r = shard_range(s.to, level_size(m, d), n, mesh.coordinate(m));
      out = contiguous_copy(raw::narrow(t, d, r.begin, r.size()));
    } else if (c == "zero") {
      if (s.to.op == comm::ReduceOp::Sum && mesh.coordinate(m) != 0) {
        // -0.0, the exact additive identity (x + -0 == x for every x, -0
        // included), so the pending sum gives back the value bit for bit.
        out = raw::empty(t.shape(), t.dtype(), t.device());
        kernels::fill(t.device(), out, is_floating(t.dtype()) ? Scalar(-0.0) : Scalar(0));
      } else {
        out = t;
      }
    } else {
      TESSEL_FAIL("redistribute", "internal error: no collective for {}", s.str());
    }
    cur[m] = s.to;
    return out;
  }

  // Shard(a) -> Shard(b) along mesh dim m (a != b): block r of my piece (its
  // chunk r along b) goes to rank r; what rank s sends me is its chunk of a.
  Tensor all_to_all(const Tensor& t, int m, const Placement& pa, const Placement& pb) {
    const int a = pa.dim, b = pb.dim;
    const int64_t n = mesh.size(m);
    const int me = mesh.coordinate(m);
    const int64_t La = level_size(m, a), Lb = level_size(m, b);
    int64_t inner = 1;  // dims other than a and b
    for (int i = 0; i < t.dim(); ++i)
      if (i != a && i != b) inner *= t.shape()[i];
    const int64_t my_a = t.shape()[a];
    const Range my_b = shard_range(pb, Lb, n, me);
    std::vector<int64_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) {
      send[size_t(r)] = my_a * shard_range(pb, Lb, n, r).size() * inner;
      recv[size_t(r)] = shard_range(pa, La, n, r).size() * my_b.size() * inner;
    }
    int64_t total_send = 0, total_recv = 0;
    for (int64_t r = 0; r < n; ++r) total_send += send[size_t(r)], total_recv += recv[size_t(r)];
    Tensor sbuf = raw::empty(Dims{total_send}, t.dtype(), t.device());
    int64_t off = 0;
    for (int64_t r = 0; r < n; ++r) {
      Range br = shard_range(pb, Lb, n, r);
      Tensor block = raw::narrow(t, b, br.begin, br.size());
      Tensor dst = raw::as_strided(sbuf, block.shape(), contiguous_strides(block.shape()), off);
      kernels::copy(t.device(), block, dst);
      off += send[size_t(r)];
    }
    Tensor rbuf = raw::empty(Dims{total_recv}, t.dtype(), t.device());
    if (n == 1) kernels::copy(t.device(), sbuf, rbuf);
    else mesh.comm(m)->all_to_all_v(sbuf, send, rbuf, recv)->wait();
    Dims os = t.shape();
    os[a] = La;
    os[b] = my_b.size();
    Tensor out = raw::empty(os, t.dtype(), t.device());
    off = 0;
    for (int64_t s = 0; s < n; ++s) {
      Range ar = shard_range(pa, La, n, s);
      Dims bs = os;
      bs[a] = ar.size();
      Tensor src = raw::as_strided(rbuf, bs, contiguous_strides(bs), off);
      kernels::copy(t.device(), src, raw::narrow(out, a, ar.begin, ar.size()));
      off += recv[size_t(s)];
    }
    return out;
  }
};

}  // namespace

namespace {

// The bytes of this rank's piece entering each step's collective, for the
// planner's counts (runtime/cost.h): all_gather the gathered piece; the
// others their input piece. The same on Meta as for real data.
void count_steps(const Tensor& local, const Dims& global_shape, const Mesh& mesh, const Placements& from,
                 const std::vector<RedistStep>& steps) {
  const int64_t item = int64_t(itemsize(local.dtype()));
  Placements cur = from;
  for (const RedistStep& s : steps) {
    Placements next = cur;
    next[s.mesh_dim] = s.to;
    const std::string kind = s.collective;
    if (kind == "all_gather" || kind == "reduce_scatter" || kind == "all_reduce" || kind == "all_to_all") {
      const Placements& side = kind == "all_gather" ? next : cur;
      cost::add_comm(s.collective,
                     numel_of(local_geometry(global_shape, mesh.shape(), side, mesh.coords()).shape) * item);
    }
    cur = next;
  }
}

}  // namespace

Tensor redistribute_local(const Tensor& local, const Dims& global_shape, const Mesh& mesh, const Placements& from,
                          const Placements& to) {
  check_placements("redistribute", mesh, from, global_shape.size());
  check_placements("redistribute", mesh, to, global_shape.size());
  if (from == to) return local;
  profile::Timer timer("redistribute", nullptr, "comm");  // actual layout changes only
  if (cost::active()) count_steps(local, global_shape, mesh, from, plan_redistribute(mesh, from, to));
  if (local.device().is_meta()) {
    return raw::empty(local_geometry(global_shape, mesh.shape(), to, mesh.coords()).shape, local.dtype(),
                      local.device());
  }
  Exec ex{mesh, global_shape, from};
  Tensor t = local;
  for (const RedistStep& s : plan_redistribute(mesh, from, to)) t = ex.step(t, s);
  return t;
}

}  // namespace tessel::dtensor
